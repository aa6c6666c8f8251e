"""Alibaba's openb GPU-sharing trace (cluster-trace-gpu-v2023, the data of Weng et al.,
USENIX ATC '23) as a fleet and tasks, and the paper's inflation protocol.

The protocol follows the paper's simulator (hkust-adsl/kubernetes-scheduler-simulator):

* the tasks are shuffled (``SortClusterPods`` with ``shufflePod``: sorted by name, then
  shuffled; here with numpy's generator seeded by ``seed``, Go's ``math/rand`` stream is not
  reproduced);
* clones are appended (``tuneUpPods`` in ``pkg/simulator/simulator.go``): a task of the
  original list drawn uniformly with replacement is appended while the requested GPU compute
  plus the drawn task's PER-GPU compute stays within ``inflation_pct`` of the capacity; the
  first draw that would pass it stops the inflation (the simulator compares the per-GPU
  ``MilliGpu`` and then adds the task's total, so a multi-GPU clone may pass the limit; kept);
* tasks arrive in order and never finish; a task that fits nowhere fails and is not retried
  (``SchedulePods``). With ``batch`` B > 1 the tasks arrive B at a time and the policy plans
  each batch in one call; a task left unplaced after its batch's plan fails;
* after every task the simulator logs the allocated GPU compute and the arrived GPU requests
  (``ClusterGpuFragReport``; a CPU-only task adds no request but still logs a row). Its
  analysis (``experiments/analysis/merge_alloc_discrete.py``) rounds each row's arrived
  requests to an integer percentage of the capacity and averages the allocation of the rows
  at each percentage (if none, of the rows within one point). The curve here is that, as
  unallocated GPU % = 100 - allocated / capacity x 100; the paper's figure is its value at
  100 (median over seeds in ``experiments/plot/plot_openb_alloc.py``). In a batch, the row of
  a task counts the batch's placements up to that task (the policy commits in order).

Hostile input ends by rule: every number of a node or task list has a range (``MAX_*``
below; the real lists are far inside), as do a file's bytes, lines and rows, and each refusal
(:class:`OpenbError`) names the file, the line, the column and the range. The clones stop
only on a GPU request, so a list whose tasks request no GPU, or so little that the clones
would pass ``MAX_INFLATED_TASKS`` tasks, is refused before any clone is drawn; so are a
fleet without a GPU and a run whose arrived requests never reach 100% of the capacity (the
figure is read there), rather than reported as NaN.

GPU memory: the trace gives none; a task's is its compute share of its GPU's memory
(``gpu_memory_mb=None`` on :class:`GpuTask`), so with the table below, in whole thousands of
MB, memory never binds before compute; it only matters for memory-specific tests.
"""
from __future__ import annotations

import csv
import math
import re
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from condor_sched.modes.gpus.fleet import WHOLE_GPU_MILLI, GpuFleet, GpuTask
from condor_sched.modes.gpus.fleet_policy import GpuPlanContext, GpuPolicy, typical_tasks
from condor_sched.simulate.text_lines import LineRefused, bounded_lines
from condor_sched.yamlio import shown

#: GPU memory (MB) of each model of the trace: vendor figures (T4 16 GB, P100 16 GB, V100
#: 16/32 GB, A10 24 GB). G1-G3 are undisclosed models; 32000 MB is our choice (a V100M32-class
#: card in 8-GPU nodes), documented as such and only relevant to memory-specific behaviour.
MODEL_GPU_MEMORY_MB = {
    "T4": 16000,
    "P100": 16000,
    "V100M16": 16000,
    "V100M32": 32000,
    "A10": 24000,
    "G1": 32000,
    "G2": 32000,
    "G3": 32000,
}

NODE_COLUMNS = ("sn", "cpu_milli", "memory_mib", "gpu", "model")
TASK_COLUMNS = ("name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli")
TIME_COLUMNS = ("creation_time", "deletion_time", "scheduled_time")

#: Bounds on what an openb file may hold, so that no file can exhaust memory, overflow the
#: fleet's int64 arrays or make the inflation run for ever. The real lists are far inside
#: (1213 nodes of at most 8 GPUs, 128000 milli-CPUs and 1048576 MiB; at most 8324 tasks of
#: at most 120200 milli-CPUs, 737280 MiB and 8 GPUs; times below 1.3e7 s; lines under 100
#: bytes).
MAX_OPENB_BYTES = 64 * 2**20
MAX_OPENB_LINE_BYTES = 4096
MAX_OPENB_ROWS = 100_000
MAX_NAME_CHARS = 253
#: A node's or a task's CPU (10,000 cores), host memory (1 PiB) and GPUs.
MAX_CPU_MILLI = 10**7
MAX_MEMORY_MIB = 2**30
MAX_GPUS = 64
#: The latest creation, scheduled or deletion time (about 317 years).
MAX_TIME_S = 10**10
#: The most tasks the inflation protocol may hold once its clones are appended (the real
#: lists reach about 11,000).
MAX_INFLATED_TASKS = 200_000
_INTEGER = re.compile(r"[-+]?[0-9]{1,20}")


class OpenbError(ValueError):
    """A bad openb file; the message names the file, line and column."""


@dataclass(frozen=True, slots=True)
class OpenbTask:
    """A task of a pod list with its times (s; None when absent or empty)."""

    task: GpuTask
    creation_s: int | None = None
    scheduled_s: int | None = None
    deletion_s: int | None = None


def _lines(path: Path) -> Iterator[str]:
    """The file's lines as text, read as they are consumed, within the byte bounds; a leading
    UTF-8 byte order mark is dropped. A line that is too long or not UTF-8 raises
    :class:`OpenbError` naming the file and the line."""
    try:
        for number, text in bounded_lines(path, MAX_OPENB_LINE_BYTES, MAX_OPENB_BYTES):
            yield text.removeprefix("\ufeff") if number == 1 else text
    except LineRefused as e:
        raise OpenbError(f"{path}: {e}") from None


def _rows(path: Path, required: Sequence[str]) -> Iterator[tuple[int, dict[str, str]]]:
    """(line number, row by column) of each non-blank row after the header, at most
    ``MAX_OPENB_ROWS``; a row of another width than the header raises :class:`OpenbError`."""
    try:
        reader = csv.reader(_lines(path))
        header = [c.strip() for c in next(reader, [])]
        for column in required:
            if column not in header:
                raise OpenbError(f"{path}: line 1: column {column!r} missing (header: {shown(','.join(header))})")
        twice = [c for c, n in Counter(header).items() if n > 1]
        if twice:
            raise OpenbError(f"{path}: line 1: column {shown(twice[0])} appears more than once")
        count = 0
        for values in reader:
            if len(values) <= 1 and not "".join(values).strip():
                continue  # a blank line
            count += 1
            if count > MAX_OPENB_ROWS:
                raise OpenbError(f"{path}: line {reader.line_num}: more than {MAX_OPENB_ROWS} rows")
            if len(values) != len(header):
                raise OpenbError(f"{path}: line {reader.line_num}: {len(values)} columns, the header has "
                                 f"{len(header)}")
            yield reader.line_num, dict(zip(header, values))
        if count == 0:
            raise OpenbError(f"{path}: line 1: no rows after the header")
    except csv.Error as err:
        raise OpenbError(f"{path}: line {reader.line_num}: not CSV: {err}") from None
    except OSError as err:
        raise OpenbError(f"{path}: cannot read: {err.strerror}") from None


def _int(path: Path, line: int, row: dict[str, str], column: str, high: int, optional: bool = False) -> int | None:
    """The column's value, an integer in 0..``high`` (None for an empty optional one)."""
    text = row[column].strip()
    if optional and text == "":
        return None
    value = int(text) if _INTEGER.fullmatch(text) else None
    if value is None or not 0 <= value <= high:
        raise OpenbError(f"{path}: line {line}: column {column}: {shown(text)} is not an integer in 0..{high}")
    return value


def _name(path: Path, line: int, row: dict[str, str], column: str) -> str:
    name = row[column].strip()
    if not 1 <= len(name) <= MAX_NAME_CHARS:
        raise OpenbError(f"{path}: line {line}: column {column}: {shown(name)} must be 1 to {MAX_NAME_CHARS} "
                         "characters")
    return name


def read_openb_nodes(path: str | Path) -> GpuFleet:
    """The node list (``sn,cpu_milli,memory_mib,gpu,model``) as a fleet, one GPU slot per
    ``gpu``, each with its model's memory from :data:`MODEL_GPU_MEMORY_MB`. Every number is
    bounded (``MAX_*`` above); a list without any GPU is refused, as both protocols measure
    GPU allocation."""
    path = Path(path)
    names, models, cpus, mems, gpu_mems = [], [], [], [], []
    line = 1
    for line, row in _rows(path, NODE_COLUMNS):
        model = row["model"].strip()
        gpus = _int(path, line, row, "gpu", MAX_GPUS)
        if gpus and model not in MODEL_GPU_MEMORY_MB:
            raise OpenbError(f"{path}: line {line}: column model: unknown GPU model {shown(model)} "
                             f"(known: {', '.join(sorted(MODEL_GPU_MEMORY_MB))})")
        names.append(_name(path, line, row, "sn"))
        models.append(model[:MAX_NAME_CHARS])
        cpus.append(_int(path, line, row, "cpu_milli", MAX_CPU_MILLI))
        mems.append(_int(path, line, row, "memory_mib", MAX_MEMORY_MIB))
        gpu_mems.append([MODEL_GPU_MEMORY_MB.get(model, 0)] * (gpus or 0))
    if len(set(names)) != len(names):
        raise OpenbError(f"{path}: duplicate node names in column sn")
    if not any(gpu_mems):
        raise OpenbError(f"{path}: line {line}: column gpu: no node has a GPU (the openb protocols measure GPU "
                         f"allocation; gpu must be 1..{MAX_GPUS} on some node)")
    return GpuFleet(names, models, cpus, mems, gpu_mems)


def read_openb_tasks(path: str | Path) -> list[OpenbTask]:
    """A pod list as tasks: ``num_gpu`` GPUs (0..``MAX_GPUS``) of ``gpu_milli`` each (1..1000;
    below 1000 only for one GPU), ``gpu_spec`` the accepted models (``|``-separated, empty =
    any; each must be a model of :data:`MODEL_GPU_MEMORY_MB`). The multigpu lists have the
    first five columns only: no models, no times. Every number is bounded (``MAX_*`` above)."""
    path = Path(path)
    tasks = []
    for line, row in _rows(path, TASK_COLUMNS):
        gpus = _int(path, line, row, "num_gpu", MAX_GPUS)
        milli = _int(path, line, row, "gpu_milli", WHOLE_GPU_MILLI)
        if gpus == 0 and milli:
            raise OpenbError(f"{path}: line {line}: column gpu_milli: {milli} without a GPU (num_gpu 0)")
        if gpus and not milli:
            raise OpenbError(f"{path}: line {line}: column gpu_milli: 0 for {gpus} GPUs (must be 1..1000)")
        if gpus and gpus > 1 and milli != WHOLE_GPU_MILLI:
            raise OpenbError(f"{path}: line {line}: column gpu_milli: {milli} on {gpus} GPUs (must be 1000)")
        spec = (row.get("gpu_spec") or "").strip()
        models = frozenset(m for m in spec.split("|") if m) or None
        for model in models or ():
            if model not in MODEL_GPU_MEMORY_MB:
                raise OpenbError(f"{path}: line {line}: column gpu_spec: unknown GPU model {shown(model)} "
                                 f"(known: {', '.join(sorted(MODEL_GPU_MEMORY_MB))})")
        task = GpuTask(name=_name(path, line, row, "name"), cpu_milli=_int(path, line, row, "cpu_milli", MAX_CPU_MILLI),
                       memory_mib=_int(path, line, row, "memory_mib", MAX_MEMORY_MIB), gpus=gpus, gpu_milli=milli,
                       models=models if gpus else None)
        times = {c: _int(path, line, row, c, MAX_TIME_S, optional=True) if c in row else None for c in TIME_COLUMNS}
        tasks.append(OpenbTask(task, creation_s=times["creation_time"], scheduled_s=times["scheduled_time"],
                               deletion_s=times["deletion_time"]))
    return tasks


@dataclass(frozen=True, slots=True)
class InflationResult:
    """One run of the inflation protocol (module docstring)."""

    policy: str
    seed: int
    batch: int
    unallocated_gpu_pct_at_100: float
    curve: list[list[float]]
    failed_tasks: int
    failed_tasks_at_100: int
    tasks: int
    clones: int
    capacity_gpu_milli: int
    extra: dict = field(default_factory=dict)

    def to_json(self) -> dict:
        return {"policy": self.policy, "seed": self.seed, "batch": self.batch,
                "unallocated_gpu_pct_at_100": self.unallocated_gpu_pct_at_100, "curve": self.curve,
                "failed_tasks": self.failed_tasks, "failed_tasks_at_100": self.failed_tasks_at_100,
                "tasks": self.tasks, "clones": self.clones, "capacity_gpu_milli": self.capacity_gpu_milli,
                **self.extra}


def inflate(tasks: Sequence[GpuTask], capacity_gpu_milli: int, rng: np.random.Generator,
            inflation_pct: float = 130) -> list[GpuTask]:
    """The tasks shuffled (by name first), then clones drawn with replacement appended up to
    ``inflation_pct`` of the capacity (``tuneUpPods``; module docstring).

    The clones stop only on a GPU request, so a list whose mean GPU request per task is zero
    (CPU-only tasks) would clone for ever, and a tiny one for millions of tasks: a list whose
    expected inflated length passes ``MAX_INFLATED_TASKS`` is refused (:class:`OpenbError`)
    before any clone is drawn, and the loop stops there in any case."""
    if not tasks:
        raise OpenbError("no tasks to inflate")
    if capacity_gpu_milli <= 0:
        raise OpenbError(f"the fleet has no GPU (capacity {capacity_gpu_milli} GPU-milli): the inflation protocol "
                         "fills GPU capacity")
    ordered = sorted(tasks, key=lambda t: t.name)
    shuffled = [ordered[i] for i in rng.permutation(len(ordered))]
    limit = inflation_pct / 100 * capacity_gpu_milli
    requested = sum(t.gpu_milli_total for t in tasks)
    out = list(shuffled)
    if requested >= limit:
        # The simulator prunes instead (tuneDownPods): random tasks removed until within the limit.
        while requested > limit and out:
            gone = out.pop(int(rng.integers(len(out))))
            requested -= gone.gpu_milli_total
        return out
    _check_inflation_length(tasks, requested, limit, inflation_pct)
    clone = 0
    while len(out) < MAX_INFLATED_TASKS:
        source = tasks[int(rng.integers(len(tasks)))]
        if requested + (source.gpu_milli if source.gpus else 0) > limit:
            return out
        requested += source.gpu_milli_total
        out.append(_renamed(source, f"{source.name}-tuned-{clone}"))
        clone += 1
    raise OpenbError(f"inflating the task list to {inflation_pct:g}% of the GPU capacity passed "
                     f"{MAX_INFLATED_TASKS} tasks (the most the protocol runs)")


def _check_inflation_length(tasks: Sequence[GpuTask], requested: int, limit: float, inflation_pct: float) -> None:
    """Refuse a list whose clones (each adding the list's mean GPU request) would take more
    than ``MAX_INFLATED_TASKS`` tasks to reach ``limit``, or never reach it."""
    mean = requested / len(tasks)
    if mean == 0:
        raise OpenbError(f"no task of the list requests a GPU (num_gpu 0 on all {len(tasks)}): clones can never "
                         f"bring the requests to {inflation_pct:g}% of the GPU capacity")
    expected = len(tasks) + (limit - requested) / mean
    if expected > MAX_INFLATED_TASKS:
        raise OpenbError(f"the tasks request {mean:.1f} GPU-milli each on average: inflating them to "
                         f"{inflation_pct:g}% of the GPU capacity ({limit:.0f} GPU-milli) would take about "
                         f"{expected:.0f} tasks, more than {MAX_INFLATED_TASKS} (the most the protocol runs)")


def _renamed(task: GpuTask, name: str) -> GpuTask:
    return GpuTask(name=name, cpu_milli=task.cpu_milli, memory_mib=task.memory_mib, gpus=task.gpus,
                   gpu_milli=task.gpu_milli, gpu_memory_mb=task.gpu_memory_mb, models=task.models, owner=task.owner)


def allocation_curve(arrived_milli: np.ndarray, allocated_milli: np.ndarray, capacity_gpu_milli: int,
                     top_pct: int = 130) -> list[list[float]]:
    """[arrived %, unallocated GPU %] per integer percentage 0..top_pct from per-task rows, as
    ``merge_alloc_discrete.py``: rows with round(arrived %) == p, else within p +- 1, averaged
    (each row's allocated % rounded to 2 places first, as there). Where no row is that close
    (traces of a few large tasks; the analysis skips the point) the curve takes the row at
    which the requests first passed p, so that every percentage up to the last arrival has a
    point."""
    total_gpus = capacity_gpu_milli / WHOLE_GPU_MILLI
    arrive = np.round(arrived_milli / total_gpus / 10, 0)  # numpy rounds half to even, as Python's round
    alloc = np.round(allocated_milli / total_gpus / 10, 2)
    curve = []
    for pct in range(0, top_pct + 1):
        rows = arrive == pct
        if not rows.any():
            rows = (arrive >= pct - 1) & (arrive <= pct + 1)
        if not rows.any():  # a few large tasks (small traces): the state when the requests passed pct
            passed = np.flatnonzero(arrive >= pct)
            if passed.size == 0:
                break
            rows = np.arange(len(arrive)) == passed[0]
        curve.append([float(pct), round(100.0 - round(float(alloc[rows].mean()), 2), 2)])
    return curve


def run_inflation(fleet: GpuFleet, tasks: Sequence[OpenbTask | GpuTask], policy: GpuPolicy, seed: int,
                  batch: int = 1, inflation_pct: float = 130) -> InflationResult:
    """The paper's inflation protocol (module docstring) on a copy of ``fleet``; FGD's target
    workload is :func:`typical_tasks` of the original task list (``SetTypicalPods`` runs on
    the workload before it is inflated)."""
    if batch < 1:
        raise ValueError(f"batch {batch} < 1")
    originals = [t.task if isinstance(t, OpenbTask) else t for t in tasks]
    if not originals:
        raise ValueError("no tasks")
    fleet = fleet.copy()
    capacity = fleet.total_gpu_milli
    rng = np.random.default_rng(seed)
    arrivals = inflate(originals, capacity, rng, inflation_pct)
    context = GpuPlanContext(rng=rng, typical_tasks=typical_tasks(originals))
    requests = np.array([t.gpu_milli_total for t in arrivals], dtype=np.int64)
    placed_milli = np.zeros(len(arrivals), dtype=np.int64)
    failed = np.zeros(len(arrivals), dtype=bool)
    for start in range(0, len(arrivals), batch):
        chunk = arrivals[start:start + batch]
        placements = policy.place(fleet, chunk, context)
        if len(placements) != len(chunk):
            raise ValueError(f"policy {policy.name} returned {len(placements)} placements for {len(chunk)} tasks")
        for offset, placement in enumerate(placements):
            if placement is None:
                failed[start + offset] = True
            else:
                placed_milli[start + offset] = requests[start + offset]
    arrived = np.concatenate([[0], np.cumsum(requests)])
    allocated = np.concatenate([[0], np.cumsum(placed_milli)])
    curve = allocation_curve(arrived, allocated, capacity, top_pct=int(math.ceil(inflation_pct)))
    at_100 = next((u for p, u in curve if p == 100), None)
    if at_100 is None:  # the figure is read at 100%: a fleet too small for the tasks never gets there
        raise OpenbError(f"the arrived GPU requests reach only {arrived[-1] / capacity * 100:.1f}% of the fleet's "
                         f"{capacity} GPU-milli, never the 100% the protocol reads its figure at (a fleet too "
                         "small for the tasks, or tasks too large for it)")
    reached = np.flatnonzero(arrived[1:] >= capacity)
    first = int(reached[0]) if reached.size else len(arrivals) - 1
    if fleet.allocated_gpu_milli() != int(placed_milli.sum()):
        raise AssertionError("fleet allocation differs from the placements' sum")
    return InflationResult(policy=policy.name, seed=seed, batch=batch, unallocated_gpu_pct_at_100=at_100,
                           curve=curve, failed_tasks=int(failed.sum()),
                           failed_tasks_at_100=int(failed[:first + 1].sum()), tasks=len(arrivals),
                           clones=len(arrivals) - len(originals), capacity_gpu_milli=capacity,
                           extra={"unallocated_gpu_pct_at_first_100": float(round(
                               100.0 - allocated[first + 1] / capacity * 100, 4))})
