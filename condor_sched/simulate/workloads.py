"""Simulated workloads: Table I of paper 002, the four Section V-B distributions, SWF and YAML.

Every workload is a tuple of :class:`SimJob` records. A job carries what the planners see
(device memory and threads, or a parallel job's processes and program, as in a submit
file) and what only the runtime model sees (exclusive run time, offload fraction and
offload count, see ``offload.py``; a parallel job's profile, see ``profile_model.py``).

Built-in names (``load_workload``): ``phi-table1``, ``phi-uniform``, ``phi-normal``,
``phi-low-skew``, ``phi-high-skew`` (device jobs of paper 002), ``phi-diverse`` (device
jobs of many shapes, ``diverse_jobs``); ``sns-random`` (paper
000's Section 6.2 sequences of parallel CPU jobs, :func:`sns_random_jobs`); any other name
is a path to a ``.swf`` or ``.yaml`` file (device jobs).

YAML workload format (one mapping with a ``jobs`` list; units in the key names)::

    jobs:
      - program: KM              # optional label, default "yaml"
        device_memory_mb: 800    # required, 1 .. any (the policy decides if it fits)
        device_threads: 60       # required, >= 1
        runtime_s: 30.0          # required, exclusive run time (> 0)
        arrival_s: 0             # optional, default 0 (submit time)
        offload_fraction: 0.8    # optional, default offload.OFFLOAD_FRACTION
        offloads: 10             # optional, default offloads_for_runtime(runtime_s)
        count: 5                 # optional, default 1: this many identical jobs

Bounds (named constants below): a workload holds at most ``MAX_WORKLOAD_JOBS`` jobs (a
``count`` too; ``--jobs`` applies while ``count`` is expanded); ``runtime_s`` and
``arrival_s`` at most ``MAX_RUNTIME_S`` (a year) and ``MAX_ARRIVAL_S`` (ten), ``offloads``
at most ``MAX_OFFLOADS``. A key not listed above is an error naming it. SWF files are at
most ``MAX_SWF_BYTES``, their lines ``MAX_SWF_LINE_BYTES``, and hold the same run time
and arrival bounds; every SWF field is a number from -1 (missing) to its bound in
``SWF_BOUNDS``.
"""
from __future__ import annotations

import functools
import math
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

from condor_sched.device_kinds import DEFAULT_KIND
from condor_sched.model import Job, JobKey, JobStatus, Resources, Skipped
from condor_sched.profiles import ProfileStore, default_profiles_dir
from condor_sched.simulate import offload
from condor_sched.simulate.text_lines import LineRefused, bounded_lines
from condor_sched.yamlio import check_keys, checked_number, load_yaml, shown

#: The schedd name of every simulated job (JobKey.schedd).
SIM_SCHEDD = "sim"
#: Host resources each simulated job requests besides the device: one host core runs its
#: host phases (the paper's Condor slots are host cores, Section IV-D1).
HOST_CPUS = 1
HOST_MEMORY_MB = 512
#: Device memory requests are rounded up to this step (the knapsack's 50 MB, Section IV-C).
MEMORY_STEP_MB = 50
#: Section V-B: one resource level r in [0, 1] sets memory and threads together.
MIN_MEMORY_MB, MAX_MEMORY_MB = 300, 3400
MIN_THREADS, MAX_THREADS, THREAD_STEP = 60, 240, 60
#: Host memory each process of a parallel job requests (well within a socket slot's share).
PROC_MEMORY_MB = 1024
#: Device jobs are the procs of cluster 1; parallel job i is cluster i + PARALLEL_CLUSTER_OFFSET.
PARALLEL_CLUSTER_OFFSET = 2
#: The most jobs a workload (built-in, SWF or YAML, ``count`` expanded) may hold.
MAX_WORKLOAD_JOBS = 100_000
#: The longest exclusive run time of a simulated job (a year), and its latest arrival (ten).
MAX_RUNTIME_S = 365 * 86400.0
MAX_ARRIVAL_S = 10 * MAX_RUNTIME_S
#: The most offloads of one simulated job (each is a few simulator events).
MAX_OFFLOADS = 10_000
#: The longest line, and the most bytes, of an SWF file.
MAX_SWF_LINE_BYTES = 4096
MAX_SWF_BYTES = 1024**3
YAML_JOB_KEYS = ("program", "device_memory_mb", "device_threads", "runtime_s", "arrival_s", "offload_fraction",
                 "offloads", "count")


class WorkloadError(ValueError):
    """A workload that cannot be read; the message names the file, line and field."""


@dataclass(frozen=True, slots=True)
class SimJob:
    """One simulated job: its request (what a policy sees) and its runtime parameters.

    A device job (``procs == 0``, paper 002) is one proc asking for device memory and
    threads. A parallel CPU job (``procs >= 1``, paper 000) is an HTCondor cluster of
    ``procs`` one-core procs running ``program`` with slowdown threshold ``alpha``; its
    ``exclusive_runtime_s`` is the profile's compact-exclusive (k = 1) run time.
    """

    index: int
    program: str
    device_memory_mb: int
    device_threads: int
    exclusive_runtime_s: float
    arrival_s: float = 0.0
    offload_fraction: float = offload.OFFLOAD_FRACTION
    offloads: int = 10
    procs: int = 0
    alpha: float = 0.9
    device_kind: str = DEFAULT_KIND

    @property
    def is_parallel(self) -> bool:
        return self.procs > 0

    @property
    def key(self) -> JobKey:
        """A device job's key; a parallel job's procs are :meth:`proc_keys`."""
        return JobKey(SIM_SCHEDD, 1, self.index)

    def proc_keys(self) -> tuple[JobKey, ...]:
        if not self.is_parallel:
            return (self.key,)
        cluster = self.index + PARALLEL_CLUSTER_OFFSET
        return tuple(JobKey(SIM_SCHEDD, cluster, p) for p in range(self.procs))

    @property
    def request(self) -> Resources:
        """What one proc asks of its slot before the policy adds ways and bandwidth."""
        if self.is_parallel:
            return Resources(cpus=1, memory_mb=PROC_MEMORY_MB)
        return Resources(cpus=HOST_CPUS, memory_mb=HOST_MEMORY_MB,
                         device_memory_mb=self.device_memory_mb, device_threads=self.device_threads)

    @property
    def device_thread_s(self) -> float:
        """Busy device-thread-seconds this job needs under the offload model."""
        return self.exclusive_runtime_s * self.offload_fraction * self.device_threads

    def to_jobs(self) -> tuple[Job, ...]:
        """The idle proc records the policies see (the same records the sidecar builds)."""
        return tuple(Job(key=k, owner="sim", status=JobStatus.IDLE, request=self.request,
                         submitted_at_s=int(self.arrival_s), program=self.program, spread=self.is_parallel,
                         slowdown_threshold=self.alpha, has_pin_clause=True,
                         device_kind=None if self.is_parallel else self.device_kind,
                         expected_runtime_s=self.exclusive_runtime_s) for k in self.proc_keys())


@dataclass(frozen=True, slots=True)
class Workload:
    name: str
    jobs: tuple[SimJob, ...]
    skipped: tuple[Skipped, ...] = ()


@dataclass(frozen=True, slots=True)
class Program:
    """One row of Table I of paper 002, plus the offload count we assume for it."""

    name: str
    threads: int
    min_memory_mb: int
    max_memory_mb: int
    offloads: int


#: Table I of paper 002. Offload counts follow the problem sizes where Table I names an
#: iteration count (MD 5 time steps, SG 10 iterations; the NAS solvers' 200/400/250
#: iterations in offloads of 10 iterations each); KM and MC give none: 20 and 10 assumed.
TABLE_I: tuple[Program, ...] = (
    Program("KM", 60, 300, 1250, 20),
    Program("MC", 180, 400, 650, 10),
    Program("MD", 180, 300, 750, 5),
    Program("SG", 60, 500, 3400, 10),
    Program("BT", 240, 300, 1250, 20),
    Program("SP", 180, 300, 1850, 40),
    Program("LU", 180, 400, 1250, 25),
)
#: Offloads of a synthetic Section V-B job (the paper does not describe their profile).
SYNTHETIC_OFFLOADS = 10
#: Length of one host+offload iteration assumed for SWF and YAML jobs without a count.
ITERATION_S = 1.5


def runtime_for_size(size: float) -> float:
    """Exclusive run time of a job whose size position within its range is ``size`` in [0, 1].

    Bigger instances (more memory in Table I's range, or a higher Section V-B level) run
    longer: 0.75x to 1.25x the calibrated mean, which keeps the mean at the calibration.
    """
    return offload.MEAN_EXCLUSIVE_RUNTIME_S * (0.75 + 0.5 * size)


def offloads_for_runtime(runtime_s: float) -> int:
    return max(1, min(100, round(runtime_s / ITERATION_S)))


def _round_memory(memory_mb: float) -> int:
    return int(math.ceil(memory_mb / MEMORY_STEP_MB - 1e-9) * MEMORY_STEP_MB)


def table1_jobs(n: int, seed: int) -> tuple[SimJob, ...]:
    """``n`` instances of Table I: program uniform over the 7 rows, memory uniform in its range."""
    rng = random.Random(seed)
    jobs = []
    for i in range(n):
        p = TABLE_I[rng.randrange(len(TABLE_I))]
        size = rng.random()
        memory = _round_memory(p.min_memory_mb + size * (p.max_memory_mb - p.min_memory_mb))
        memory = min(memory, p.max_memory_mb)
        jobs.append(SimJob(i, p.name, memory, p.threads, runtime_for_size(size), offloads=p.offloads))
    return tuple(jobs)


def level_request(r: float) -> tuple[int, int]:
    """(device_memory_mb, device_threads) of resource level ``r`` (Section V-B, Fig. 7).

    Memory is linear from 300 to 3400 MB (rounded up to 50 MB); threads take 60, 120,
    180 or 240 on four equal quarters of [0, 1].
    """
    r = min(1.0, max(0.0, r))
    memory = min(MAX_MEMORY_MB, _round_memory(MIN_MEMORY_MB + r * (MAX_MEMORY_MB - MIN_MEMORY_MB)))
    threads = MIN_THREADS + THREAD_STEP * min(3, int(r * 4))
    return memory, threads


#: Section V-B distributions of the resource level. Fig. 7 is lost: the normal one has
#: mean 0.5 and sd 0.2; the skews move the mean one sd down (0.3) or up (0.7). Draws
#: outside [0, 1] are redrawn (a truncated normal), so no mass piles up at the ends.
LEVEL_SD = 0.2
DISTRIBUTIONS: dict[str, float | None] = {"uniform": None, "normal": 0.5, "low-skew": 0.3, "high-skew": 0.7}


def _draw_level(rng: random.Random, mean: float | None) -> float:
    if mean is None:
        return rng.random()
    while True:
        r = rng.gauss(mean, LEVEL_SD)
        if 0.0 <= r <= 1.0:
            return r


def distribution_jobs(distribution: str, n: int, seed: int) -> tuple[SimJob, ...]:
    """``n`` synthetic offload jobs of a Section V-B distribution; run time grows with r."""
    if distribution not in DISTRIBUTIONS:
        raise WorkloadError(f"unknown distribution {distribution!r}; known: {', '.join(DISTRIBUTIONS)}")
    rng = random.Random(seed)
    jobs = []
    for i in range(n):
        r = _draw_level(rng, DISTRIBUTIONS[distribution])
        memory, threads = level_request(r)
        jobs.append(SimJob(i, f"synthetic-{distribution}", memory, threads, runtime_for_size(r),
                           offloads=SYNTHETIC_OFFLOADS))
    return tuple(jobs)


#: Thread requests of the shape-diverse queue (``scripts/bench_plan``'s ``diverse``): small
#: offloads that fill a device's gaps beside the Phi-wide ones of Table I.
DIVERSE_THREADS = (4, 8, 16, 30, 60, 90, 120, 180, 240)
DIVERSE_MIN_MEMORY_MB, DIVERSE_MAX_MEMORY_MB = 200, 3400


def diverse_jobs(n: int, seed: int) -> tuple[SimJob, ...]:
    """``n`` jobs of the shape-diverse queue: threads uniform over ``DIVERSE_THREADS``, device
    memory uniform over 200..3400 MB in 50 MB steps (the two drawn apart, as ``bench_plan``
    draws them), run time growing with the memory's place in its range (``runtime_for_size``)."""
    rng = random.Random(seed)
    steps = (DIVERSE_MAX_MEMORY_MB - DIVERSE_MIN_MEMORY_MB) // MEMORY_STEP_MB
    jobs = []
    for i in range(n):
        step = rng.randrange(steps + 1)
        threads = DIVERSE_THREADS[rng.randrange(len(DIVERSE_THREADS))]
        jobs.append(SimJob(i, "synthetic-diverse", DIVERSE_MIN_MEMORY_MB + step * MEMORY_STEP_MB, threads,
                           runtime_for_size(step / steps), offloads=SYNTHETIC_OFFLOADS))
    return tuple(jobs)


# --- Standard Workload Format -------------------------------------------------------------

SWF_FIELDS = ("job_number", "submit_time", "wait_time", "run_time", "allocated_processors",
              "average_cpu_time", "used_memory_kb", "requested_processors", "requested_time",
              "requested_memory_kb", "status", "user", "group", "executable", "queue",
              "partition", "preceding_job", "think_time")
#: The largest value of each SWF field (-1, the format's "missing", is the smallest): times
#: in seconds (about 317 years), processors, memory in KB (1 PiB), status (the format's
#: codes 0-5) and numbers that identify (job, user, group, queue...). The RICC log is far
#: inside (times below 1.3e7 s, 576 processors, 3e6 KB).
MAX_SWF_SECONDS = 10**10
MAX_SWF_PROCESSORS = 10**8
MAX_SWF_MEMORY_KB = 2**40
MAX_SWF_STATUS = 5
MAX_SWF_ID = 10**12
SWF_BOUNDS = {
    "job_number": MAX_SWF_ID, "submit_time": MAX_SWF_SECONDS, "wait_time": MAX_SWF_SECONDS,
    "run_time": MAX_SWF_SECONDS, "allocated_processors": MAX_SWF_PROCESSORS, "average_cpu_time": MAX_SWF_SECONDS,
    "used_memory_kb": MAX_SWF_MEMORY_KB, "requested_processors": MAX_SWF_PROCESSORS,
    "requested_time": MAX_SWF_SECONDS, "requested_memory_kb": MAX_SWF_MEMORY_KB, "status": MAX_SWF_STATUS,
    "user": MAX_SWF_ID, "group": MAX_SWF_ID, "executable": MAX_SWF_ID, "queue": MAX_SWF_ID, "partition": MAX_SWF_ID,
    "preceding_job": MAX_SWF_ID, "think_time": MAX_SWF_SECONDS,
}


def swf_request(processors: float, memory_kb: float) -> tuple[int, int]:
    """(device_memory_mb, device_threads) of one SWF job (the documented mapping).

    Threads: a Phi core runs 4 hardware threads, so ``processors`` cores ask for
    4 x processors threads, rounded up to a multiple of 60 and clipped to 60..240.
    Memory: the per-processor memory (KB) in MB, rounded up to 50 MB and clipped to
    300..3400; when the trace has no memory, the level r of the threads sets it as in
    Section V-B (low threads go with low memory).
    """
    threads = min(MAX_THREADS, max(MIN_THREADS, THREAD_STEP * math.ceil(4 * processors / THREAD_STEP)))
    if memory_kb < 0:
        r = (threads - MIN_THREADS) / (MAX_THREADS - MIN_THREADS)
        return level_request(r)[0], threads
    memory = min(MAX_MEMORY_MB, max(MIN_MEMORY_MB, _round_memory(memory_kb / 1024)))
    return memory, threads


def _swf_lines(path: Path) -> Iterator[tuple[int, str]]:
    """(line number, text) of each line of an SWF file, read as it is consumed; a line that is
    longer than ``MAX_SWF_LINE_BYTES`` or not UTF-8 raises :class:`WorkloadError`."""
    try:
        yield from bounded_lines(path, MAX_SWF_LINE_BYTES, MAX_SWF_BYTES)
    except LineRefused as e:
        raise WorkloadError(f"{path}:{e.line}: {e.problem}") from None
    except OSError as e:
        raise WorkloadError(f"{path}: cannot read: {e.strerror}") from None


def swf_jobs(path: Path, skipped: list[Skipped]) -> Iterator[tuple[str, dict[str, float], float, float, float]]:
    """(what, fields, run time, processors, arrival) of each usable job of an SWF log, in
    order; unusable jobs are appended to ``skipped`` with the reason (:func:`read_swf`)."""
    first_submit: float | None = None
    for lineno, line in _swf_lines(path):
        stripped = line.strip()
        if not stripped or stripped.startswith(";"):
            continue
        parts = stripped.split()
        if len(parts) == len(SWF_FIELDS) - 1:  # logs that leave out field 18, the think time
            parts.append("-1")
        if len(parts) != len(SWF_FIELDS):
            raise WorkloadError(f"{path}:{lineno}: expected {len(SWF_FIELDS)} fields, got {len(parts)}")
        values: dict[str, float] = {}
        for number, (name, raw) in enumerate(zip(SWF_FIELDS, parts), 1):
            try:
                value = float(raw)
            except ValueError:
                value = math.nan
            if not -1 <= value <= SWF_BOUNDS[name]:  # also NaN and infinities
                raise WorkloadError(f"{path}:{lineno}: field '{name}' is not a number in -1..{SWF_BOUNDS[name]} "
                                    f"(field {number}): {shown(raw)}")
            values[name] = value
        what = f"{path}:{lineno} (job {parts[0]})"
        runtime = values["run_time"] if values["run_time"] > 0 else values["requested_time"]
        if runtime <= 0:
            skipped.append(Skipped(what, "no run time (fields 4 and 9 missing or 0)"))
            continue
        processors = values["requested_processors"]
        if processors <= 0:
            processors = values["allocated_processors"]
        if processors <= 0:
            skipped.append(Skipped(what, "no processor count (fields 8 and 5 missing)"))
            continue
        if values["submit_time"] < 0:
            skipped.append(Skipped(what, "no submit time (field 2 missing)"))
            continue
        if first_submit is None:
            first_submit = values["submit_time"]
        arrival = max(0.0, values["submit_time"] - first_submit)
        if runtime > MAX_RUNTIME_S or arrival > MAX_ARRIVAL_S:
            raise WorkloadError(f"{what}: run time above {MAX_RUNTIME_S:g} s or arrival above {MAX_ARRIVAL_S:g} s")
        yield what, values, runtime, processors, arrival


def read_swf(path: str | Path, limit: int | None = None) -> Workload:
    """Read a Standard Workload Format log (18 fields; ``;`` comments; -1 = missing).

    A line with another field count or a non-number raises :class:`WorkloadError` naming
    the file and line. A well-formed job without a run time (fields 4 and 9 both -1 or 0)
    or without processors (fields 8 and 5 both -1) is skipped, and the reason recorded.
    Mapping: arrival = submit time minus the first job's; run time = field 4, else
    the requested time (field 9); device request by :func:`swf_request` from the requested
    processors (else allocated) and requested memory (else used memory).
    """
    path = Path(path)
    wanted = MAX_WORKLOAD_JOBS if limit is None else min(limit, MAX_WORKLOAD_JOBS)
    jobs: list[SimJob] = []
    skipped: list[Skipped] = []
    for _, values, runtime, processors, arrival in swf_jobs(path, skipped):
        memory_kb = values["requested_memory_kb"]
        if memory_kb < 0:
            memory_kb = values["used_memory_kb"]
        memory, threads = swf_request(processors, memory_kb)
        jobs.append(SimJob(len(jobs), "swf", memory, threads, runtime, arrival_s=arrival,
                           offloads=offloads_for_runtime(runtime)))
        if len(jobs) >= wanted:
            break
    if not jobs:
        raise WorkloadError(f"{path}: no usable job")
    return Workload(str(path), tuple(jobs), tuple(skipped))


# --- YAML ---------------------------------------------------------------------------------

def _yaml_number(where: str, raw: dict[str, Any], key: str, kind: type, minimum: float,
                 default: Any = None, strict_minimum: bool = False, maximum: float | None = None) -> Any:
    bound = {} if maximum is None else {"maximum": maximum}
    return checked_number(where, raw, key, kind, minimum, WorkloadError, default, strict_minimum, **bound)


def read_yaml(path: str | Path, limit: int | None = None) -> Workload:
    """Read the YAML workload format of this module's docstring: the first ``limit`` jobs
    (``count`` expanded), at most ``MAX_WORKLOAD_JOBS``."""
    path = Path(path)
    data = load_yaml(path, WorkloadError)
    if not isinstance(data, dict) or not isinstance(data.get("jobs"), list) or not data["jobs"]:
        raise WorkloadError(f"{path}: top level must be a mapping with a non-empty 'jobs' list")
    check_keys(str(path), data, ("jobs",), WorkloadError)
    wanted = MAX_WORKLOAD_JOBS if limit is None else min(limit, MAX_WORKLOAD_JOBS)
    jobs: list[SimJob] = []
    for i, raw in enumerate(data["jobs"]):
        where = f"{path}: jobs[{i}]"
        if not isinstance(raw, dict):
            raise WorkloadError(f"{where}: must be a mapping")
        check_keys(where, raw, YAML_JOB_KEYS, WorkloadError)
        program = raw.get("program", "yaml")
        if not isinstance(program, str) or len(program) > 64:
            raise WorkloadError(f"{where}: 'program' must be a string of at most 64 characters, got {shown(program)}")
        runtime = _yaml_number(where, raw, "runtime_s", float, 0, strict_minimum=True, maximum=MAX_RUNTIME_S)
        fraction = _yaml_number(where, raw, "offload_fraction", float, 0, default=offload.OFFLOAD_FRACTION,
                                maximum=1)
        template = dict(
            program=program,
            device_memory_mb=_yaml_number(where, raw, "device_memory_mb", int, 1),
            device_threads=_yaml_number(where, raw, "device_threads", int, 1),
            exclusive_runtime_s=runtime,
            arrival_s=_yaml_number(where, raw, "arrival_s", float, 0, default=0.0, maximum=MAX_ARRIVAL_S),
            offload_fraction=fraction,
            offloads=_yaml_number(where, raw, "offloads", int, 1, default=offloads_for_runtime(runtime),
                                  maximum=MAX_OFFLOADS),
        )
        count = _yaml_number(where, raw, "count", int, 1, default=1, maximum=MAX_WORKLOAD_JOBS)
        if limit is None and len(jobs) + count > MAX_WORKLOAD_JOBS:
            raise WorkloadError(f"{where}: the workload expands to more than {MAX_WORKLOAD_JOBS} jobs")
        for _ in range(min(count, wanted - len(jobs))):
            jobs.append(SimJob(len(jobs), **template))
    return Workload(str(path), tuple(jobs))


# --- Spread-n-Share (paper 000) -----------------------------------------------------------

#: Section 6.2 of paper 000: 20 jobs per sequence, 16 or 28 processes each.
SNS_JOBS = 20
SNS_PROCS = (16, 28)
SNS_ALPHA = 0.9


@functools.lru_cache(maxsize=1)
def default_profiles() -> ProfileStore:
    """The 12 programs of paper 000 (examples/profiles), loaded once per process."""
    store = ProfileStore.load_dir(default_profiles_dir())
    if not len(store):
        raise WorkloadError(f"{default_profiles_dir()}: no usable profile ({store.skipped})")
    return store


def sns_random_jobs(n: int, seed: int, store: ProfileStore | None = None) -> tuple[SimJob, ...]:
    """Section 6.2's random sequence: ``n`` jobs, program uniform over the store's programs
    (sorted by name), 16 or 28 processes with equal odds, all submitted at 0, alpha 0.9."""
    store = store or default_profiles()
    programs = sorted(p.program for p in store.profiles.values())
    rng = random.Random(seed)
    jobs = []
    for i in range(n):
        profile = store.get(programs[rng.randrange(len(programs))])
        procs = SNS_PROCS[rng.randrange(len(SNS_PROCS))]
        jobs.append(SimJob(i, profile.program, 0, 0, profile.runtime_s[1], procs=procs, alpha=SNS_ALPHA))
    return tuple(jobs)


# --- names --------------------------------------------------------------------------------

BUILTIN: dict[str, Callable[[int, int], tuple[SimJob, ...]]] = {
    "phi-table1": table1_jobs,
    **{f"phi-{d}": (lambda n, seed, d=d: distribution_jobs(d, n, seed)) for d in DISTRIBUTIONS},
    "phi-diverse": diverse_jobs,
    "sns-random": sns_random_jobs,
}
#: Built-in workloads of parallel CPU jobs (run with the profile model on Xeon nodes).
PARALLEL_WORKLOADS = ("sns-random",)
#: Jobs of a built-in workload when ``--jobs`` is not given (Table II's 1000; paper 000's 20).
DEFAULT_JOBS = 1000


def default_jobs(name: str) -> int:
    return SNS_JOBS if name in PARALLEL_WORKLOADS else DEFAULT_JOBS


def is_builtin(name: str) -> bool:
    return name in BUILTIN


def is_parallel_workload(name: str) -> bool:
    return name in PARALLEL_WORKLOADS


def load_workload(name: str, jobs: int | None, seed: int) -> Workload:
    """A built-in workload of ``jobs`` jobs, or the first ``jobs`` of a .swf/.yaml file."""
    if name in BUILTIN:
        return Workload(name, BUILTIN[name](default_jobs(name) if jobs is None else jobs, seed))
    suffix = Path(name).suffix.lower()
    if suffix == ".swf":
        return read_swf(name, jobs)
    if suffix in (".yaml", ".yml"):
        return read_yaml(name, jobs)
    raise WorkloadError(f"{name}: not a built-in workload ({', '.join(BUILTIN)}) nor a .swf or .yaml file")


def total_device_thread_s(jobs: Sequence[SimJob]) -> float:
    return sum(j.device_thread_s for j in jobs)
