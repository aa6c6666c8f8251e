"""How jobs sharing a node slow each other (paper 003's cluster experiments, Section IV-C), with
the interference calibrated to Table I's vanilla and collocated walltimes only.

Two effects, per node and per 5 s step:

- CPU. Without control (collocated Slurm: two jobs on a node, each believing it has all its
  cores) the kernel shares the cores fairly: each job gets its demand if the sum fits, else an
  equal share, a job wanting less than it leaving the rest to the other (water-filling). Under
  the spare mode the spare-capacity jobs run in the idle class (``cpu.idle = 1``) under a CFS
  cap: the primaries get all they demand, the spare jobs at most what is left and the cap.
- Shared caches, memory bandwidth and network. A job using share ``d`` of a node's cores while
  its co-runner uses share ``g`` progresses 1 / (1 + k_app x d x g) as fast as its CPU allows:
  contention grows with both jobs' activity, and none is felt in a phase where either idles.
  ``k_app`` is per application, calibrated below. A multi-node HPC job (bulk synchronous)
  progresses at its slowest node's rate, a DI job at the rate its CPU allows, summed over its
  nodes.

Calibration (:func:`calibrate`). Table I gives each application's mean walltime alone (vanilla)
and collocated without control. For each application we find ``k_app`` by bisection such that a
job of its nominal stages (each stage's mean share of time), sharing its node all along with a
co-runner at the reference mean use, takes collocated / vanilla times as long as alone. The
co-runner: for an HPC job a DI job (collocated Slurm never pairs two HPC jobs), the DI
applications' mean use; for a DI job any job, the applications' mean use weighted by their
expected counts. Where the fair CPU share alone already slows the job more than Table I says,
``k_app`` is 0 and the model overstates its collocated walltime (the simulated ratio is
reported beside Table I's). Table I's hybrid column is never used.

Settings (:class:`ModelSettings`): what the text leaves open and moves the results, each with
its default the reported rows use, the others reported beside them (docs/results.md):

- ``interference``: what the idle class removes of the slowdown ``k_app`` measures. ``shared``
  (default): nothing; ``k_app`` is shared caches, bandwidth and network, felt beside a spare
  task as beside a collocated job. ``time-slicing``: all of it; ``k_app`` is what a bulk
  synchronous job loses when the kernel time-slices its ranks with a co-runner's (a rank
  descheduled holds every other at the next barrier), which a co-runner in the idle class
  (``cpu.idle``), preempted the moment a primary's thread wakes, does not cause. Table I's
  vanilla and collocated columns cannot tell the two apart; its hybrid column lies between
  them for Montage and NEK5000 (BLAST's, whose ``k_app`` is 0, above both).
- ``parallel_idle``: the idle share of every parallel stage, as a multiple of the stand-in's
  (1: :data:`~condor_sched.simulate.hybrid003_workload.APPS` as written; 0: every parallel
  stage uses all its cores, "all available cores are used", Section IV-A, at full capacity).
- ``deadlines``: ``kill`` (default) stops a Slurm job at its requested time (Section IV);
  ``overrun`` lets it run on and counts it missed (Table I's collocated walltimes, e.g.
  NEK5000's 13005 s, exceed any requested time Section IV's rounding gives).
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Mapping, Sequence

from condor_sched.simulate.hybrid003_workload import DI_APPS, HPC_APPS, App, scaled_apps

K_MAX = 100.0
INTERFERENCE_READINGS = ("shared", "time-slicing")
DEADLINE_RULES = ("kill", "overrun")


@dataclass(frozen=True, slots=True)
class ModelSettings:
    """What the text leaves open (module docstring); the defaults give the reported rows."""

    interference: str = "shared"
    parallel_idle: float = 1.0
    deadlines: str = "kill"

    def __post_init__(self) -> None:
        if self.interference not in INTERFERENCE_READINGS:
            raise ValueError(f"interference must be {' or '.join(INTERFERENCE_READINGS)}, not {self.interference!r}")
        if not 0.0 <= self.parallel_idle <= 1.0:
            raise ValueError(f"parallel_idle must be in [0, 1], not {self.parallel_idle!r}")
        if self.deadlines not in DEADLINE_RULES:
            raise ValueError(f"deadlines must be {' or '.join(DEADLINE_RULES)}, not {self.deadlines!r}")

    @property
    def spare_interference(self) -> bool:
        """Whether a spare task in the idle class slows the primaries beside it (``shared``)."""
        return self.interference == "shared"

    def label(self) -> str:
        """The settings that differ from the defaults, for tables ("defaults" when none)."""
        default = ModelSettings()
        parts = [f"{name} {getattr(self, name):g}" if isinstance(getattr(self, name), float)
                 else f"{name} {getattr(self, name)}"
                 for name in ("interference", "parallel_idle", "deadlines") if getattr(self, name) != getattr(default, name)]
        return ", ".join(parts) or "defaults"


def fair_shares(demands: Sequence[float], capacity: float) -> list[float]:
    """Water-filling: what each demand gets of ``capacity`` under a fair scheduler."""
    got = [0.0] * len(demands)
    left = capacity
    todo = sorted(range(len(demands)), key=lambda i: demands[i])
    for pos, i in enumerate(todo):
        share = left / (len(todo) - pos)
        got[i] = min(demands[i], share)
        left -= got[i]
    return got


def interference(k: float, own_share: float, other_share: float) -> float:
    """The factor a job's progress is divided by for shared caches, bandwidth and network."""
    return 1.0 + k * own_share * other_share


def stage_mix(app: App) -> list[tuple[float, float]]:
    """(share of time, share of cores used) of an application's nominal stages, first node."""
    head = [(share, stage.first_share) for stage, share in app.head]
    tail = [(share, stage.first_share) for stage, share in app.tail]
    body = 1.0 - sum(s for s, _ in head) - sum(s for s, _ in tail)
    cycle_s = sum(st.mean_s for st in app.cycle)
    mid = [(body * st.mean_s / cycle_s, st.first_share) for st in app.cycle]
    return head + mid + tail


def mean_use(app: App) -> float:
    return sum(t * u for t, u in stage_mix(app))


def reference_use(app: App, apps: Mapping[str, App]) -> float:
    """The co-runner's mean use a job of ``app`` is calibrated against, among ``apps`` (module
    docstring)."""
    if app.hpc:
        return sum(mean_use(apps[a]) for a in DI_APPS) / len(DI_APPS)
    weights = {a: 52 / len(HPC_APPS) for a in HPC_APPS} | {a: 33 / len(DI_APPS) for a in DI_APPS}
    return sum(w * mean_use(apps[a]) for a, w in weights.items()) / sum(weights.values())


def collocated_ratio(app: App, k: float, other: float) -> float:
    """Walltime sharing a node all along with a co-runner at ``other``, over walltime alone."""
    total = 0.0
    for t, d in stage_mix(app):
        if t <= 0:
            continue
        got = fair_shares([d, other], 1.0)[0]
        cpu = got / d if d > 0 else 1.0
        total += t * interference(k, d, other) / cpu
    return total


@lru_cache(maxsize=None)
def calibrate(parallel_idle: float = 1.0) -> dict[str, float]:
    """``k_app`` per application, its stages' idle scaled by ``parallel_idle`` (module docstring)."""
    out = {}
    apps = scaled_apps(parallel_idle)
    for name, app in apps.items():
        target = app.collocated_s / app.vanilla_s
        other = reference_use(app, apps)
        lo, hi = 0.0, K_MAX
        if collocated_ratio(app, lo, other) >= target:
            out[name] = 0.0
            continue
        for _ in range(60):
            mid = (lo + hi) / 2
            if collocated_ratio(app, mid, other) < target:
                lo = mid
            else:
                hi = mid
        out[name] = round((lo + hi) / 2, 6)
    return out
