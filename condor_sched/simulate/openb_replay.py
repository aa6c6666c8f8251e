"""Time replay of the openb GPU trace: stock HTCondor layouts beside condor_sched's GPU
policies (issue 13, item 4, second experiment).

Workload: every task of an openb pod list that has time columns arrives at its
``creation_time`` and, once started, runs ``deletion_time - scheduled_time`` seconds (its
run in Alibaba's cluster; the trace cuts the runs still alive at its end). A task with no
``scheduled_time`` (``Pending`` in the trace) is left out and counted
(``tasks_never_scheduled``); a list without time columns (the ``multigpu`` files) is refused
with :class:`ReplayError`: those serve the inflation protocol only. Run times are taken as
they are in every layout: slowdown from GPUs shared without MPS, or a job dying on an
oversubscribed GPU's memory, is not modelled (this favours the native ``-divide`` layouts,
whose oversubscriptions are counted instead).

Negotiation: a cycle every ``cycle_s`` seconds (cycle k at k x ``cycle_s``) offers the whole
idle queue, in arrival (FIFO) order, to the placement as one batch; placed tasks start at the
cycle and end ``run time`` later, releasing what they held at that instant (seen by the next
cycle); unplaced tasks stay queued, and a task left unplaced does not block the ones behind
it (HTCondor's negotiator goes on down the queue). Event-driven: the trace spans ~150 days,
so only cycles after an arrival or an end are planned (a cycle with nothing changed would
place nothing more). A task that does not fit the empty fleet (a request larger than any
node, or no node of its ``gpu_spec`` model) would wait for ever: it fails on arrival and is
counted (``tasks_unplaceable``), so the run always ends; ``tasks_never_started`` counts any
task still queued when no event is left (none unless a policy refuses a task that fits).

Layouts of stock HTCondor 25 (no condor_sched), placed first-fit in node order (the
negotiator takes the first matching slot; the seed plays no part):

- ``native-whole``: a GPU task takes whole GPUs: ``request_GPUs = num_gpu``, and a sharing
  task (``gpu_milli < 1000``) takes one whole GPU, as HTCondor has nothing smaller.
- ``native-divide-N`` (N = 2, 4): ``condor_gpu_discovery -divide N`` lists every GPU of a
  node N times and advertises 1/N of its memory per entry (FACTS.md). Without ``-packed``
  the whole list repeats (``CUDA0, CUDA1, CUDA0, CUDA1``: entry p of a G-GPU node is GPU
  p mod G); ``native-divide-N-packed`` models ``-packed`` (``CUDA0, CUDA0, CUDA1, CUDA1``:
  GPU p div N). What a user submits: a sharing task of ``gpu_milli`` m asks the smallest k
  parts with k / N >= m / 1000 (``request_GPUs = k``; the trace gives compute shares only,
  and a per-entry memory filter cannot ask for a sum), a task of g whole GPUs k = N x g.
  What HTCondor does: the startd hands out the first k free entries of the node's list
  (``MachAttributes::AllocateDevId`` in ``src/condor_startd.V6/ResAttributes.cpp`` takes the
  first unassigned id in list order); nothing ties them to one physical GPU and nothing is
  enforced (GPU memory is only a match filter). What the job does: ``CUDA_VISIBLE_DEVICES``
  lists its entries' GPUs; a one-GPU task runs on the GPU of its first entry (CUDA's device
  0), a task of g GPUs on the first g distinct GPUs of its entries, whole. Its GPU memory
  lands there: ``gpu_memory_mb``, or (openb) its ``gpu_milli`` share of the GPU's memory.
  A start that puts a GPU's resident tasks' memory over the GPU's memory counts one memory
  oversubscription (``compute_oversubscriptions`` likewise for compute over a whole GPU,
  which time-slicing absorbs at a slowdown); ``part_memory_overruns`` counts tasks whose
  memory exceeds what their entries on their GPU advertise (1/N of the GPU's memory each).

Any other name is a GPU policy (``condor_sched.modes.gpus.fleet_policy``): the batch goes to
its ``place`` on a copy of the fleet, which holds per-GPU compute and memory as hard limits
(compute overcommit 1.0 in these experiments), so a policy cannot oversubscribe; the
simulator checks that independently from what each start puts on its GPUs.
``whole:POLICY`` is that policy's node choice with every sharing task given a whole GPU: stock HTCondor's whole-GPU allocation under a negotiator
rank that places as the policy does (an admin's ``NEGOTIATOR_PRE_JOB_RANK``), the control
that tells the gain of sharing from the gain of choosing nodes well.

Measures (:class:`ReplayResult`): mean wait (start - arrival) of the started tasks (also
of the GPU tasks and of the sharing tasks alone, and its median, 95th percentile and
maximum: on a small cluster a few long waits of 8-GPU tasks can make the mean), makespan
(last end - first arrival of a started task), GPU utilisation (GPU-milli-seconds the layout
hands out over GPUs x 1000 x makespan: a sharing task's whole GPU under ``native-whole``,
its k / N parts under ``-divide``, its share under a policy) and the requested utilisation
(the tasks' own ``gpu_milli``).

Why its own event loop (as :mod:`condor_sched.simulate.cpu_jobs`): the cycle engine's
device and socket models know no GPU fleet, and the replay needs only arrivals, ends and
cycles. Performance: a batch offered to a policy holds, of each distinct request, at most
as many tasks as copies of it fit the fleet at the cycle's start (one numpy pass per
request); the others could not be placed in this cycle whatever the policy does (resources
only shrink within a cycle), so leaving them out changes no placement of a policy that
places tasks one at a time, as the published baselines do.
"""
from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, replace
from typing import Any, Protocol, Sequence

import numpy as np

from condor_sched.modes.gpus.fleet import WHOLE_GPU_MILLI, GpuFleet, GpuPlacement, GpuTask

#: The stock HTCondor layouts :func:`run_replay` models itself (module docstring).
NATIVE_LAYOUTS = ("native-whole", "native-divide-2", "native-divide-4")
#: Layouts also accepted: ``-divide N -packed``.
PACKED_LAYOUTS = ("native-divide-2-packed", "native-divide-4-packed")
#: Prefix of a GPU policy name: that policy's node choice with whole GPUs only (no sharing).
WHOLE_PREFIX = "whole:"
#: A request that asks nothing of a node fits it this many times (no real limit).
_UNBOUNDED = 1 << 40


class ReplayError(ValueError):
    """A task list the replay cannot run (no time columns, a negative run time) or an
    unknown layout; the message names the task."""


class TimedTask(Protocol):
    """What the replay reads of a task (``condor_sched.simulate.openb.OpenbTask``)."""

    task: GpuTask
    creation_s: int | None
    scheduled_s: int | None
    deletion_s: int | None


@dataclass(frozen=True, slots=True)
class ReplayResult:
    """One replay's outcome (module docstring); :meth:`to_json` is the report."""

    layout: str
    cycle_s: float
    tasks: int
    tasks_never_scheduled: int
    tasks_unplaceable: int
    tasks_never_started: int
    tasks_started: int
    mean_wait_s: float
    median_wait_s: float
    p95_wait_s: float
    max_wait_s: float
    mean_wait_gpu_s: float
    mean_wait_sharing_s: float
    makespan_s: float
    gpu_utilization: float
    gpu_requested_utilization: float
    memory_oversubscriptions: int
    compute_oversubscriptions: int
    part_memory_overruns: int
    planning_cycles: int
    nodes: int
    gpus: int

    def to_json(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self.__slots__}


def run_replay(fleet: GpuFleet, tasks: Sequence[TimedTask], layout_or_policy: Any, cycle_s: float, seed: int,
               *, context: Any = None) -> ReplayResult:
    """Replay ``tasks`` on ``fleet`` (left unchanged) under a native layout or a GPU policy.

    ``layout_or_policy``: a name of :data:`NATIVE_LAYOUTS` (or :data:`PACKED_LAYOUTS`), a
    GPU policy name, ``whole:`` and a GPU policy name (the policy's node choice, every
    sharing task given a whole GPU: the control that tells sharing's effect from the node
    choice's), or a GpuPolicy object (``name`` and ``place``). ``context``: the
    policy's GpuPlanContext; by default one seeded with ``seed`` whose typical tasks (FGD's
    target workload) are the replayed tasks'. Raises :class:`ReplayError` for a list
    without time columns and ``condor_sched.modes.planning.PolicyError`` for an unknown
    policy name."""
    if not cycle_s > 0 or math.isinf(cycle_s):
        raise ReplayError(f"cycle length must be a positive number of seconds, got {cycle_s}")
    replayed, never_scheduled = _timed_tasks(tasks)
    if isinstance(layout_or_policy, str) and (layout_or_policy in NATIVE_LAYOUTS
                                               or layout_or_policy in PACKED_LAYOUTS):
        name = layout_or_policy
        layout: _Layout = _NativeLayout(fleet, _divide_of(name), packed=name.endswith("-packed"))
    else:
        policy = layout_or_policy
        whole = isinstance(policy, str) and policy.startswith(WHOLE_PREFIX)
        if whole:
            policy = policy.removeprefix(WHOLE_PREFIX)
            replayed = [_whole_gpu(r) for r in replayed]
        if isinstance(policy, str):
            from condor_sched.modes.registry import gpu_policy
            policy = gpu_policy(policy)
        if context is None:
            from condor_sched.modes.gpus.fleet_policy import GpuPlanContext, typical_tasks
            context = GpuPlanContext(rng=np.random.default_rng(seed),
                                     typical_tasks=typical_tasks([r.task for r in replayed]))
        name = WHOLE_PREFIX + policy.name if whole else policy.name
        layout = _PolicyLayout(fleet, policy, context)
    return _Replay(replayed, layout, cycle_s).run(name, never_scheduled, len(fleet), int(fleet.gpu_count.sum()))


def fleet_subset(fleet: GpuFleet, node_fraction: float, offset: int = 0) -> GpuFleet:
    """Every k-th node of ``fleet`` (k = round(1 / node_fraction)), from node ``offset`` mod k,
    as a fresh fleet: a proportionally smaller cluster with about the same mix of models, for
    the regime where the trace's load exceeds the cluster (the trace itself is never
    changed); the k offsets give k disjoint such clusters."""
    if not 0 < node_fraction <= 1:
        raise ReplayError(f"node fraction must be in (0, 1], got {node_fraction}")
    step = max(1, round(1 / node_fraction))
    rows = range(offset % step, len(fleet), step)
    return GpuFleet([fleet.names[r] for r in rows],
                    [fleet.model_names[fleet.model_of_node[r]] for r in rows],
                    [int(fleet.cpu_total_milli[r]) for r in rows],
                    [int(fleet.memory_total_mib[r]) for r in rows],
                    [[int(m) for m in fleet.gpu_memory_total_mb[r, :fleet.gpu_count[r]]] for r in rows],
                    fleet.compute_capacity)


# --- the workload ---------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class _Timed:
    index: int
    task: GpuTask
    arrival_s: float
    run_s: float
    request: tuple
    requested_milli: int
    shares: bool


def _timed_tasks(tasks: Sequence[TimedTask]) -> tuple[list[_Timed], int]:
    """The replayed tasks in FIFO order (arrival, then list order), and how many were never
    scheduled."""
    replayed: list[_Timed] = []
    never = 0
    for index, timed in enumerate(tasks):
        name = timed.task.name
        if timed.creation_s is None:
            raise ReplayError(f"task {name} has no creation_time: a list without time columns (such as the"
                              " multigpu ones) serves the inflation protocol only, not the replay")
        if timed.scheduled_s is None:
            never += 1
            continue
        if timed.deletion_s is None:
            raise ReplayError(f"task {name} was scheduled but has no deletion_time: its run time is unknown")
        run_s = timed.deletion_s - timed.scheduled_s
        if run_s < 0:
            raise ReplayError(f"task {name}: deletion_time {timed.deletion_s} before scheduled_time"
                              f" {timed.scheduled_s}")
        t = timed.task
        replayed.append(_Timed(index, t, float(timed.creation_s), float(run_s), _request(t), t.gpu_milli_total,
                               t.shares_gpu))
    replayed.sort(key=lambda r: (r.arrival_s, r.index))
    return replayed, never


def _request(t: GpuTask) -> tuple:
    """What tells two tasks' requests apart (tasks of equal requests fit alike)."""
    return (t.cpu_milli, t.memory_mib, t.gpus, t.gpu_milli, t.gpu_memory_mb, t.models, t.owner)


def _whole_gpu(timed: _Timed) -> _Timed:
    """A sharing task given a whole GPU (and so all of its memory), as stock HTCondor does."""
    if not timed.shares:
        return timed
    task = replace(timed.task, gpu_milli=WHOLE_GPU_MILLI, gpu_memory_mb=None)
    return replace(timed, task=task, request=_request(task))


def _divide_of(name: str) -> int:
    if name == "native-whole":
        return 1
    return int(name.split("-")[2])


# --- layouts ------------------------------------------------------------------------------

@dataclass(slots=True)
class _Start:
    """What a started task holds: its placement (layout-specific), the GPU-milli it was
    handed and where its GPU compute and memory reside."""

    placement: GpuPlacement | tuple[int, np.ndarray]  # a policy's, or a native node and its entries
    allocated_milli: int
    resident: list[tuple[int, int, int, int]]  # (node, gpu, compute milli, memory MB)


class _Layout(Protocol):
    fleet: GpuFleet

    def fits_empty(self, task: GpuTask) -> bool: ...
    def place(self, batch: list[_Timed]) -> list[_Start | None]: ...
    def release(self, task: GpuTask, start: _Start) -> None: ...


def _memory_of(fleet: GpuFleet, task: GpuTask, node: int, gpu: int, milli: int) -> int:
    """MB a task puts on a GPU where it runs ``milli`` of compute."""
    if task.gpu_memory_mb is not None:
        return task.gpu_memory_mb
    return -(-int(fleet.gpu_memory_total_mb[node, gpu]) * milli // WHOLE_GPU_MILLI)


class _PolicyLayout:
    """A GpuPolicy placing on its own copy of the fleet (per-GPU hard limits)."""

    def __init__(self, fleet: GpuFleet, policy: Any, context: Any) -> None:
        self.pristine = fleet.copy()
        self.fleet = fleet.copy()
        self.policy = policy
        self.context = context

    def fits_empty(self, task: GpuTask) -> bool:
        return bool(self.pristine.node_fits(task).any())

    def place(self, batch: list[_Timed]) -> list[_Start | None]:
        offered: list[_Timed] = []
        room: dict[tuple, int] = {}
        for timed in batch:
            left = room.get(timed.request)
            if left is None:
                left = _copies_that_fit(self.fleet, timed.task)
            if left > 0:
                offered.append(timed)
            room[timed.request] = left - 1
        if not offered:
            return [None] * len(batch)
        placements = self.policy.place(self.fleet, [t.task for t in offered], self.context)
        if len(placements) != len(offered):
            raise RuntimeError(f"policy {self.policy.name} returned {len(placements)} placements for"
                               f" {len(offered)} tasks")
        by_index: dict[int, _Start] = {}
        for timed, placement in zip(offered, placements):
            if placement is None:
                continue
            task = timed.task
            resident = [(placement.node, g, task.gpu_milli,
                         _memory_of(self.fleet, task, placement.node, g, task.gpu_milli)) for g in placement.gpus]
            by_index[timed.index] = _Start(placement, task.gpu_milli_total, resident)
        return [by_index.get(t.index) for t in batch]

    def release(self, task: GpuTask, start: _Start) -> None:
        self.fleet.release(task, start.placement)


def _copies_that_fit(fleet: GpuFleet, task: GpuTask) -> int:
    """How many copies of ``task`` fit ``fleet`` now, all at once (an exact count: per
    node, the least of its CPU, host memory and GPU room)."""
    per_node = np.full(len(fleet), _UNBOUNDED, dtype=np.int64)
    if task.cpu_milli:
        per_node = np.minimum(per_node, fleet.cpu_free_milli // task.cpu_milli)
    if task.memory_mib:
        per_node = np.minimum(per_node, fleet.memory_free_mib // task.memory_mib)
    if task.gpus:
        if task.shares_gpu:
            need = fleet.gpu_memory_needed(task)
            per_gpu = fleet.gpu_free_milli // task.gpu_milli
            per_gpu = np.minimum(per_gpu, np.where(need > 0, fleet.gpu_memory_free_mb // np.maximum(need, 1),
                                                   _UNBOUNDED))
            usable = fleet.gpu_fits(task)
            gpu_room = np.where(usable, np.maximum(per_gpu, 0), 0).sum(axis=1)
        else:
            gpu_room = fleet.gpu_fits(task).sum(axis=1) // task.gpus
        per_node = np.minimum(per_node, gpu_room)
    per_node = np.where(fleet.model_mask(task), np.maximum(per_node, 0), 0)
    return int(min(per_node.sum(), _UNBOUNDED))


class _NativeLayout:
    """Stock HTCondor: whole GPUs (``divide`` 1) or ``-divide N`` entries, first fit
    (module docstring)."""

    def __init__(self, fleet: GpuFleet, divide: int, packed: bool = False) -> None:
        self.fleet = fleet
        self.divide = divide
        n, width = len(fleet), fleet.width
        self.cpu_free = fleet.cpu_total_milli.copy()
        self.memory_free = fleet.memory_total_mib.copy()
        parts = np.arange(width * divide)
        counts = fleet.gpu_count[:, None]
        #: GPU (column) of each entry of each node's list; entries past N x GPUs are absent.
        self.gpu_of_part = (parts[None, :] // divide if packed else parts[None, :] % np.maximum(counts, 1)) \
            * np.ones((n, 1), dtype=np.int64)
        self.part_present = parts[None, :] < counts * divide
        self.part_free = self.part_present.copy()
        self.free_parts = self.part_free.sum(axis=1)
        self.total_parts = self.free_parts.copy()

    def parts_asked(self, task: GpuTask) -> int:
        if task.gpus == 0:
            return 0
        if task.shares_gpu:
            return -(-task.gpu_milli * self.divide // WHOLE_GPU_MILLI)
        return task.gpus * self.divide

    def _fits(self, task: GpuTask, cpu: np.ndarray, memory: np.ndarray, parts: np.ndarray) -> np.ndarray:
        return ((cpu >= task.cpu_milli) & (memory >= task.memory_mib) & self.fleet.model_mask(task)
                & (parts >= self.parts_asked(task)))

    def fits_empty(self, task: GpuTask) -> bool:
        return bool(self._fits(task, self.fleet.cpu_total_milli, self.fleet.memory_total_mib,
                               self.total_parts).any())

    def place(self, batch: list[_Timed]) -> list[_Start | None]:
        starts: list[_Start | None] = []
        failed: set[tuple] = set()
        for timed in batch:
            if timed.request in failed:
                starts.append(None)
                continue
            start = self._place_one(timed.task)
            if start is None:
                failed.add(timed.request)
            starts.append(start)
        return starts

    def _place_one(self, task: GpuTask) -> _Start | None:
        nodes = np.flatnonzero(self._fits(task, self.cpu_free, self.memory_free, self.free_parts))
        if nodes.size == 0:
            return None
        node = int(nodes[0])
        k = self.parts_asked(task)
        parts = np.flatnonzero(self.part_free[node])[:k]
        self.cpu_free[node] -= task.cpu_milli
        self.memory_free[node] -= task.memory_mib
        self.part_free[node, parts] = False
        self.free_parts[node] -= k
        resident: list[tuple[int, int, int, int]] = []
        if task.gpus:
            gpus = list(dict.fromkeys(int(g) for g in self.gpu_of_part[node, parts]))[:task.gpus]
            for g in gpus:
                resident.append((node, g, task.gpu_milli, _memory_of(self.fleet, task, node, g, task.gpu_milli)))
        return _Start((node, parts), k * WHOLE_GPU_MILLI // self.divide, resident)

    def part_memory_of(self, start: _Start, node: int, gpu: int) -> int:
        """MB the task's entries on ``gpu`` advertise (1/N of the GPU's memory each)."""
        _, parts = start.placement
        on_gpu = int((self.gpu_of_part[node, parts] == gpu).sum())
        return on_gpu * int(self.fleet.gpu_memory_total_mb[node, gpu]) // self.divide

    def release(self, task: GpuTask, start: _Start) -> None:
        node, parts = start.placement
        self.cpu_free[node] += task.cpu_milli
        self.memory_free[node] += task.memory_mib
        self.part_free[node, parts] = True
        self.free_parts[node] += len(parts)


# --- the event loop ---------------------------------------------------------------------

class _Replay:
    """Arrivals, ends and negotiation cycles (module docstring)."""

    def __init__(self, tasks: list[_Timed], layout: _Layout, cycle_s: float) -> None:
        self.tasks = tasks
        self.layout = layout
        self.cycle_s = cycle_s
        fleet = layout.fleet
        self.resident_milli = np.zeros((len(fleet), fleet.width), dtype=np.int64)
        self.resident_mb = np.zeros((len(fleet), fleet.width), dtype=np.int64)
        self.memory_oversubscriptions = 0
        self.compute_oversubscriptions = 0
        self.part_memory_overruns = 0

    def run(self, name: str, never_scheduled: int, nodes: int, gpus: int) -> ReplayResult:
        tasks, layout, cycle_s = self.tasks, self.layout, self.cycle_s
        ends: list[tuple[float, int, _Timed, _Start]] = []
        queue: list[_Timed] = []
        waits: list[float] = []
        first_arrival = math.inf
        gpu_waits: list[float] = []
        share_waits: list[float] = []
        fits_empty: dict[tuple, bool] = {}
        unplaceable = 0
        allocated_milli_s = requested_milli_s = 0.0
        last_end = -math.inf
        next_arrival = 0
        cycles = 0
        last_cycle = -math.inf
        while next_arrival < len(tasks) or ends:
            event_s = min(tasks[next_arrival].arrival_s if next_arrival < len(tasks) else math.inf,
                          ends[0][0] if ends else math.inf)
            now = math.ceil(event_s / cycle_s) * cycle_s
            if now <= last_cycle:
                now = last_cycle + cycle_s
            while ends and ends[0][0] <= now:
                _, _, timed, start = heapq.heappop(ends)
                layout.release(timed.task, start)
                for node, gpu, milli, mb in start.resident:
                    self.resident_milli[node, gpu] -= milli
                    self.resident_mb[node, gpu] -= mb
            while next_arrival < len(tasks) and tasks[next_arrival].arrival_s <= now:
                timed = tasks[next_arrival]
                next_arrival += 1
                fits = fits_empty.get(timed.request)
                if fits is None:
                    fits = fits_empty[timed.request] = layout.fits_empty(timed.task)
                if fits:
                    queue.append(timed)
                else:
                    unplaceable += 1
            last_cycle = now
            if not queue:
                continue
            cycles += 1
            starts = layout.place(queue)
            waiting: list[_Timed] = []
            for timed, start in zip(queue, starts):
                if start is None:
                    waiting.append(timed)
                    continue
                self._account(timed.task, start)
                end_s = now + timed.run_s
                heapq.heappush(ends, (end_s, timed.index, timed, start))
                last_end = max(last_end, end_s)
                waits.append(now - timed.arrival_s)
                first_arrival = min(first_arrival, timed.arrival_s)
                if timed.task.gpus:
                    gpu_waits.append(now - timed.arrival_s)
                if timed.shares:
                    share_waits.append(now - timed.arrival_s)
                allocated_milli_s += start.allocated_milli * timed.run_s
                requested_milli_s += timed.requested_milli * timed.run_s
            queue = waiting
        makespan = max(0.0, last_end - first_arrival) if waits else 0.0
        capacity = gpus * WHOLE_GPU_MILLI * makespan
        ordered = np.sort(np.array(waits)) if waits else np.zeros(1)
        return ReplayResult(
            layout=name, cycle_s=cycle_s, tasks=len(tasks), tasks_never_scheduled=never_scheduled,
            tasks_unplaceable=unplaceable, tasks_never_started=len(queue), tasks_started=len(waits),
            mean_wait_s=float(ordered.mean()), median_wait_s=float(np.median(ordered)),
            p95_wait_s=float(np.percentile(ordered, 95)), max_wait_s=float(ordered[-1]),
            mean_wait_gpu_s=float(np.mean(gpu_waits)) if gpu_waits else 0.0,
            mean_wait_sharing_s=float(np.mean(share_waits)) if share_waits else 0.0, makespan_s=makespan,
            gpu_utilization=allocated_milli_s / capacity if capacity else 0.0,
            gpu_requested_utilization=requested_milli_s / capacity if capacity else 0.0,
            memory_oversubscriptions=self.memory_oversubscriptions,
            compute_oversubscriptions=self.compute_oversubscriptions,
            part_memory_overruns=self.part_memory_overruns, planning_cycles=cycles, nodes=nodes, gpus=gpus)

    def _account(self, task: GpuTask, start: _Start) -> None:
        """Put a start's compute and memory on its GPUs; count what goes over."""
        total_mb = self.layout.fleet.gpu_memory_total_mb
        memory_over = compute_over = overrun = False
        for node, gpu, milli, mb in start.resident:
            self.resident_milli[node, gpu] += milli
            self.resident_mb[node, gpu] += mb
            memory_over |= bool(self.resident_mb[node, gpu] > total_mb[node, gpu])
            compute_over |= bool(self.resident_milli[node, gpu] > WHOLE_GPU_MILLI)
            if isinstance(self.layout, _NativeLayout):
                overrun |= mb > self.layout.part_memory_of(start, node, gpu)
        self.memory_oversubscriptions += memory_over
        self.compute_oversubscriptions += compute_over
        self.part_memory_overruns += overrun
