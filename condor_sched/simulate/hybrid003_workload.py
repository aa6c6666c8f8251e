"""Paper 003's cluster workload (Section IV-A, Tables I and II), rebuilt as far as the text allows.

What the paper gives and we keep: clusters of 128, 256 and 512 cores (4, 8, 16 nodes of 32
cores), 16, 28 and 41 arrivals; 52 HPC jobs (Montage and NEK5000 at 32, 64 or 128 cores, BLAST
at 32 to 512) and 33 data-intensive (DI) jobs (Statistics at 32 to 128 cores, Synthetic at 32
to 512) over the three sizes; run times from Table I's vanilla (node-exclusive) walltimes;
requested times rounded up to the hour or half-hour ("if an HPC job takes 39 minutes to
complete, the job is submitted as if the user requested 1 hour", Section IV); parallel and
sequential stages ("in sequential stages, only one of available cores are used", IV-A).

Stand-ins, each ours (the text gives no number):

- HPC/DI split per size: 52 and 33 shared out in proportion to the arrivals (10/6, 17/11,
  25/16); applications equally likely within a class; a job's cores a power of two in the
  application's range (at most the cluster's cores), with weight 1 / cores (the Cirne model,
  as the workloads it was fitted to, favours small jobs; uniform choices would give a mean job
  of about 120 cores, while Table II's vanilla row, 41 jobs of 1861 s mean walltime in 12972 s
  on 512 cores at 69% utilisation, implies about 60: weight 1 / cores gives about 65).
- Run time alone: the application's Table I vanilla walltime x U(0.95, 1.05), so Table I's
  means are kept. Every run of an application used the same input ("all experimental runs of
  Montage construct the image for survey M17", NEK5000's "standard examples", Section IV-A),
  so its run time varies little from run to run; +-5% stands for run-to-run noise (Table I
  gives one mean per application over 32 to 512 cores, nothing on how run time scales with
  cores). Requested time = ceil(run time / 1800 s) x 1800 s (the paper's rule above), which
  leaves an application its own slack: Montage 35%, NEK5000 25%, BLAST 27%, Statistics 17%,
  Synthetic 149%. (With +-25% instead, some jobs fall just under a half-hour and any slowdown
  kills them: ``RUNTIME_SPREAD``.)
- Arrivals: the Cirne-Berman model with Argonne's pattern (the paper's [49], from the Parallel
  Workloads Archive) is not reproducible from the text; we draw Poisson arrivals at
  ``OFFERED_LOAD`` times the rate the cluster serves the drawn jobs' core-seconds, so a queue
  builds, as Table I's vanilla waits (3522 s, about twice the 1861 s mean walltime) show. This
  load and the size weighting above are the only stand-ins tied to the vanilla figures, each
  set from a ratio the paper prints, not fitted by simulation.
- CPU phases (the share of its cores a job uses alone, by stage), per application: see
  :data:`APPS`. Phase lengths are exponential around the stated means, drawn per job. How
  idle the parallel stages are is a setting (:func:`scaled_apps`, ``ModelSettings.parallel_idle``).
- Memory per node (GB) per application, on nodes of 144 GB (Section IV).
"""
from __future__ import annotations

import math
import random
from dataclasses import dataclass, replace
from functools import lru_cache

CORES_PER_NODE = 32
NODE_MEMORY_GB = 144
#: Section IV-A: arrivals per cluster size (nodes), and the HPC jobs among them (ours: 52 of 85
#: shared out in proportion).
ARRIVALS = {4: 16, 8: 28, 16: 41}
HPC_JOBS = {4: 10, 8: 17, 16: 25}
SIZES = tuple(ARRIVALS)
#: Seconds granted per requested-time unit (the hour or half-hour, Section IV).
REQUEST_UNIT_S = 1800.0
#: Run time alone = Table I vanilla walltime x U(1 - spread, 1 + spread).
RUNTIME_SPREAD = 0.05
#: Arrival rate over the cluster's service rate (a stand-in for the Cirne model).
OFFERED_LOAD = 2.0


@dataclass(frozen=True, slots=True)
class Stage:
    """A kind of stage: what share of its cores a job uses alone on its first node and on its
    other nodes (a sequential stage: one core on the first, the others idle), and its mean
    length (s of run time alone)."""

    first_share: float
    rest_share: float
    mean_s: float


@dataclass(frozen=True, slots=True)
class App:
    """One of Section IV-A's applications: HPC or DI, its core choices, Table I's walltimes
    (vanilla, collocated, hybrid: the last only reported beside ours, never used), its stages
    (``head``: once at the start, as a share of the run; ``cycle``: alternated after it) and
    memory per node (GB)."""

    name: str
    hpc: bool
    cores: tuple[int, ...]
    vanilla_s: float
    collocated_s: float
    hybrid_s: float
    head: tuple[tuple[Stage, float], ...]
    cycle: tuple[Stage, ...]
    tail: tuple[tuple[Stage, float], ...]
    memory_gb: float


SEQUENTIAL_SHARE = 1.0 / CORES_PER_NODE
#: Section IV-A's five applications. Stages (ours, from the text): Montage, I/O intensive, nine
#: stages parallel and sequential; NEK5000, CPU- and network-intensive (compute and exchange
#: phases); BLAST, database load, one parallel stage, a sequential merge; Statistics, I/O
#: intensive, a small sequential stage then a big parallel one; Synthetic, a sequential memory
#: allocation then a CPU-bound parallel stage.
APPS: dict[str, App] = {
    "montage": App("montage", True, (32, 64, 128), 1331, 3783, 1560,
                   head=(), cycle=(Stage(0.70, 0.70, 150), Stage(SEQUENTIAL_SHARE, 0.01, 80)), tail=(),
                   memory_gb=6),
    "nek5000": App("nek5000", True, (32, 64, 128), 2877, 13005, 3061,
                   head=(), cycle=(Stage(0.90, 0.90, 200), Stage(0.40, 0.40, 50)), tail=(), memory_gb=24),
    "blast": App("blast", True, (32, 64, 128, 256, 512), 2833, 3683, 3400,
                 head=((Stage(0.30, 0.30, 0), 0.05),), cycle=(Stage(0.90, 0.90, 300),),
                 tail=((Stage(SEQUENTIAL_SHARE, 0.01, 0), 0.10),), memory_gb=10),
    "statistics": App("statistics", False, (32, 64, 128), 1539, 1711, 1623,
                      head=((Stage(SEQUENTIAL_SHARE, 0.01, 0), 0.10),), cycle=(Stage(0.60, 0.60, 300),), tail=(),
                      memory_gb=12),
    "synthetic": App("synthetic", False, (32, 64, 128, 256, 512), 723, 955, 893,
                     head=((Stage(SEQUENTIAL_SHARE, 0.01, 0), 0.25),), cycle=(Stage(0.90, 0.90, 300),), tail=(),
                     memory_gb=32),
}
HPC_APPS = tuple(a for a in APPS if APPS[a].hpc)
DI_APPS = tuple(a for a in APPS if not APPS[a].hpc)


@lru_cache(maxsize=None)
def scaled_apps(parallel_idle: float = 1.0) -> dict[str, App]:
    """:data:`APPS` with each parallel stage's idle share times ``parallel_idle`` (a stage using
    share u of its cores uses 1 - (1 - u) x parallel_idle); sequential stages are kept
    (``hybrid003_model.ModelSettings``)."""
    if parallel_idle == 1.0:
        return APPS

    def busier(stage: Stage) -> Stage:
        if stage.first_share <= SEQUENTIAL_SHARE:
            return stage
        return replace(stage, first_share=1 - (1 - stage.first_share) * parallel_idle,
                       rest_share=1 - (1 - stage.rest_share) * parallel_idle)

    return {name: replace(app, head=tuple((busier(st), x) for st, x in app.head), cycle=tuple(map(busier, app.cycle)),
                          tail=tuple((busier(st), x) for st, x in app.tail))
            for name, app in APPS.items()}


@dataclass(frozen=True, slots=True)
class Segment:
    """A stretch of a job's run time alone, up to ``end_s``, at one stage's shares."""

    end_s: float
    first_share: float
    rest_share: float


@dataclass(frozen=True, slots=True)
class HybridJob:
    """One arrival: its application, cores (whole nodes of 32: ``nodes``), run time alone,
    requested time, arrival and CPU phases (``segments``, in run time alone)."""

    index: int
    app: str
    cores: int
    runtime_s: float
    requested_s: float
    arrival_s: float
    memory_gb: float
    segments: tuple[Segment, ...]

    @property
    def hpc(self) -> bool:
        return APPS[self.app].hpc

    @property
    def nodes(self) -> int:
        return math.ceil(self.cores / CORES_PER_NODE)

    def segment_at(self, done_s: float, hint: int = 0) -> int:
        """The index of the segment that holds run time ``done_s`` (from ``hint`` on)."""
        i = hint
        while i < len(self.segments) - 1 and self.segments[i].end_s <= done_s:
            i += 1
        return i

    def mean_share(self) -> float:
        """The job's mean use alone, as a share of its cores (all nodes)."""
        n, start, total = self.nodes, 0.0, 0.0
        for seg in self.segments:
            total += (seg.end_s - start) * (seg.first_share + (n - 1) * seg.rest_share) / n
            start = seg.end_s
        return total / self.runtime_s


def requested_time(runtime_s: float) -> float:
    """Section IV: the run time alone rounded up to the next half-hour."""
    return math.ceil(runtime_s / REQUEST_UNIT_S) * REQUEST_UNIT_S


def phases(app: App, runtime_s: float, rng: random.Random) -> tuple[Segment, ...]:
    """A job's stages over its run time alone: the head stages, the cycle alternated with
    exponential lengths around each stage's mean, the tail stages."""
    out: list[Segment] = []
    at = 0.0
    for stage, share in app.head:
        at += share * runtime_s
        out.append(Segment(at, stage.first_share, stage.rest_share))
    tail_s = sum(share for _, share in app.tail) * runtime_s
    body_end = runtime_s - tail_s
    k = rng.randrange(len(app.cycle))
    while at < body_end - 1e-9:
        stage = app.cycle[k % len(app.cycle)]
        at = min(body_end, at + rng.expovariate(1.0 / stage.mean_s))
        out.append(Segment(at, stage.first_share, stage.rest_share))
        k += 1
    for stage, share in app.tail:
        at += share * runtime_s
        out.append(Segment(min(at, runtime_s), stage.first_share, stage.rest_share))
    return tuple(out)


def generate(nodes: int, seed: int, parallel_idle: float = 1.0) -> tuple[HybridJob, ...]:
    """The arrivals of one cluster size (4, 8 or 16 nodes), in arrival order (module docstring);
    ``parallel_idle`` scales the parallel stages' idle (:func:`scaled_apps`) and changes nothing
    else: the same seed gives the same jobs, arrivals and stage lengths."""
    apps = scaled_apps(parallel_idle)
    if nodes not in ARRIVALS:
        raise ValueError(f"hybrid-003 runs on {', '.join(map(str, SIZES))} nodes (Section IV-A), not {nodes}")
    rng = random.Random(f"hybrid-003/{nodes}/{seed}")
    total, hpc = ARRIVALS[nodes], HPC_JOBS[nodes]
    kinds = [True] * hpc + [False] * (total - hpc)
    rng.shuffle(kinds)
    cluster_cores = nodes * CORES_PER_NODE
    drafts = []
    for is_hpc in kinds:
        app = apps[rng.choice(HPC_APPS if is_hpc else DI_APPS)]
        choices = [c for c in app.cores if c <= cluster_cores]
        cores = rng.choices(choices, weights=[1.0 / c for c in choices])[0]
        runtime = app.vanilla_s * rng.uniform(1 - RUNTIME_SPREAD, 1 + RUNTIME_SPREAD)
        drafts.append((app, cores, runtime))
    core_s = sum(c * r for _, c, r in drafts)
    mean_gap = core_s / cluster_cores / total / OFFERED_LOAD
    jobs, at = [], 0.0
    for i, (app, cores, runtime) in enumerate(drafts):
        if i:
            at += rng.expovariate(1.0 / mean_gap)
        jobs.append(HybridJob(i, app.name, cores, runtime, requested_time(runtime), at, app.memory_gb,
                              phases(app, runtime, rng)))
    return tuple(jobs)
