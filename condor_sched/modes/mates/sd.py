"""``sd``: paper 001's Slowdown-Driven policy (SD-Policy), EASY backfill that shares nodes
with running mates (Listing 1, Section 3.2); ``slurm-sd``: the same malleable try inside
SLURM's backfill pass (:func:`~condor_sched.modes.mates.backfill.slurm_backfill_pass`), the
paper's own setting.

For each queued job in order, the static try comes first (:func:`~condor_sched.modes.mates.
backfill.easy_backfill`). When it fails, Listing 1 compares

* ``static_end = wait + req_time``: the job's start in SLURM's backfill map (running jobs'
  predicted ends and the reservations of the queued jobs ahead of it,
  :class:`~condor_sched.modes.mates.backfill.ReservationMap`), and
* ``mall_end = req_time + increase``: starting now on ``k`` cores of each node.

Decisions where the text is ambiguous (ours, not the paper's):

* "increase" is the extra time over the requested time, the stretched total (Eq. 5/6 summed
  as time x req_cpus / used_cpus) minus the static time. Read as the stretched total it
  would count the requested time twice in Eq. 4 and in ``mall_end``.
* The guest gets ``k = floor(C x SharingFactor)`` cores per node (at most C - 1: each mate
  keeps one core for its one rank, Section 3.2.3), so with C = 8 and SharingFactor 0.5 it
  runs at half speed: increase = req_time, and the malleable start wins when the static wait
  exceeds the requested time. The policy predicts with the worst-case model (Eq. 6,
  Section 3.4); a guest spread evenly over whole mates is balanced, so Eq. 5 gives the same.
* A mate shrinks on all its nodes for the guest's predicted run D: its increase is
  D x k / C (it runs at (C - k) / C), and Eq. 4's penalty is
  p = (wait + increases so far + increase + req_time) / req_time with requested times only.
* Mates are running jobs alone on their nodes with all their cores (not already a mate,
  not a guest). In ``slurm-sd`` a job the same backfill pass started statically is a mate
  too (the paper's mates are "the already running jobs", Section 3, and SLURM's backfill
  marks a job running as it starts it); ``sd`` keeps its call's starts out. Constraint 3
  (Section 3.2.3): the mates' node counts sum to the guest's, so the guest runs on exactly
  its mates' nodes.
* "The new job must finish inside its mates' allocation" (Section 3.2.4): the guest's
  predicted end is at most each mate's predicted end after its increase.
* DynAVGSD: MAX_SLOWDOWN is the mean predicted slowdown (requested times) of the running
  jobs, computed at the start of each planning call (the paper updates it "when the
  controller is not busy").
* The heuristic (Section 3.2.4) is exact here: among the candidates with p < MAX_SLOWDOWN
  (Eq. 2) it picks the set of at most m mates whose node counts sum to the guest's
  (Eq. 3) with the least sum of penalties (Eq. 1); ties go to the earliest-started mates.
* Every job is malleable (the paper's simulations), and a malleable start is not checked
  against the reserved job's start: Listing 1 has no such check, though the mates' longer
  predicted ends can move the reservation later.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from condor_sched.model import Plan
from condor_sched.modes.mates.backfill import (
    SLURM_DEFAULTS,
    SlurmBackfillConfig,
    easy_backfill,
    plan_nodes,
    slurm_backfill_pass,
    slurm_main_schedule,
)
from condor_sched.modes.planning import PlanRequest, PlanSettings, PolicyError, PolicyKind
from condor_sched.modes.mates.cpu_nodes import (
    NodeCluster,
    Role,
    RunningNodeJob,
    RuntimeModel,
    Start,
    WaitingJob,
    stretched_s,
)

#: Paper 001's defaults: m = 2 mates (Section 3.2.4), SharingFactor 0.5 (Section 3.2.3).
PAPER_MAX_MATES = 2
PAPER_SHARING_FACTOR = 0.5
#: Our default MAX_SLOWDOWN (the paper gives none): 10. On RICC (README, "SD-Policy (paper
#: 001)") 5, 10, 50 and unbounded tie as the best rows and DynAVGSD is worse; 10 is also the
#: paper's best on its largest workload (CEA-Curie, Section 4.2). ``PlanSettings`` holds the same.
DEFAULT_MAX_SLOWDOWN: float | None = 10.0
DEFAULT_MAX_SLOWDOWN_LABEL = "10"


@dataclass(frozen=True, slots=True)
class SdSettings:
    """MAX_SLOWDOWN (``math.inf``: unbounded; None: DynAVGSD), m and SharingFactor."""

    max_slowdown: float | None = DEFAULT_MAX_SLOWDOWN
    max_mates: int = PAPER_MAX_MATES
    sharing_factor: float = PAPER_SHARING_FACTOR

    def __post_init__(self) -> None:
        if self.max_slowdown is not None and not self.max_slowdown > 0:
            raise PolicyError(f"MAX_SLOWDOWN must be positive, got {self.max_slowdown}")
        if self.max_mates < 1:
            raise PolicyError(f"at least one mate (m), got {self.max_mates}")
        if not 0 < self.sharing_factor < 1:
            raise PolicyError(f"SharingFactor must be in (0, 1), got {self.sharing_factor}")

    @classmethod
    def of(cls, settings: PlanSettings) -> SdSettings:
        return cls(settings.sd_max_slowdown, settings.sd_max_mates, settings.sd_sharing_factor)


def guest_cores(cores_per_node: int, sharing_factor: float) -> int:
    """Cores per node a mate gives up: SharingFactor of its cores, leaving its rank one."""
    return min(math.floor(cores_per_node * sharing_factor), cores_per_node - 1)


def dynamic_max_slowdown(running: tuple[RunningNodeJob, ...], now_s: float) -> float:
    """DynAVGSD: the running jobs' mean predicted slowdown (unbounded when none runs)."""
    if not running:
        return math.inf
    return sum(r.predicted_slowdown(now_s) for r in running) / len(running)


class MateSearch:
    """Listing 1's malleable try for one planning call (Section 3.2's resource selection)."""

    def __init__(self, cluster: NodeCluster, settings: SdSettings, *, mates_started_now: bool = False) -> None:
        """``mates_started_now``: jobs that start statically earlier in the same call may be
        mates of later jobs (``slurm-sd``: SLURM's backfill marks a job it starts running at
        once, and the paper's mates are "the already running jobs", Section 3)."""
        self.now_s = cluster.now_s
        self.mates_started_now = mates_started_now
        self.seen = {r.key for r in cluster.running}
        self.cores_per_node = cluster.cores_per_node
        self.k = guest_cores(cluster.cores_per_node, settings.sharing_factor)
        self.max_mates = settings.max_mates
        self.max_slowdown = (dynamic_max_slowdown(cluster.running, cluster.now_s)
                             if settings.max_slowdown is None else settings.max_slowdown)
        self.by_nodes: dict[int, list[RunningNodeJob]] = {}
        for r in cluster.running:
            if r.role is Role.STATIC and r.cores_per_node == cluster.cores_per_node:
                self.by_nodes.setdefault(len(r.nodes), []).append(r)
        # A search that failed for (nodes, requested) fails for any longer request until a
        # mate is taken: larger requests only raise penalties and push the guest's end later.
        self.failed_from_s: dict[int, float] = {}
        self._run_s: dict[tuple[int, float], float] = {}

    def may_start(self, job: WaitingJob) -> bool:
        """False when this call's try surely fails for ``job`` whatever its wait (no mate
        left, or a search for as many nodes and no longer a request failed)."""
        return self.k >= 1 and bool(self.by_nodes) and job.requested_s < self.failed_from_s.get(job.nodes, math.inf)

    def guest_run_s(self, job: WaitingJob) -> float:
        """The guest's predicted run on ``k`` cores of each node (worst-case model, Eq. 6)."""
        found = self._run_s.get((job.nodes, job.requested_s))
        if found is None:
            found = self._run_s[job.nodes, job.requested_s] = stretched_s(
                job.requested_s, [(self.k, job.nodes)], self.cores_per_node, RuntimeModel.WORST)
        return found

    def take_new_starts(self, running: dict) -> None:
        """With ``mates_started_now``: the static starts of this call so far become candidate
        mates (a guest started in this call never does)."""
        if not self.mates_started_now or len(running) == len(self.seen):
            return
        for key, r in running.items():
            if key in self.seen:
                continue
            self.seen.add(key)
            if r.role is Role.STATIC and r.cores_per_node == self.cores_per_node:
                self.by_nodes.setdefault(len(r.nodes), []).append(r)
                self.failed_from_s.clear()

    def __call__(self, job: WaitingJob, wait_s: float, running: dict) -> Start | None:
        self.take_new_starts(running)
        if not self.may_start(job):
            return None
        run_s = self.guest_run_s(job)
        increase_s = run_s - job.requested_s
        if not wait_s + job.requested_s > job.requested_s + increase_s:  # static_end > mall_end
            return None
        mate_increase_s = run_s * self.k / self.cores_per_node
        chosen = self._best_mates(job.nodes, run_s, mate_increase_s)
        if chosen is None:
            self.failed_from_s[job.nodes] = min(job.requested_s, self.failed_from_s.get(job.nodes, math.inf))
            return None
        for mate in chosen:
            self.by_nodes[len(mate.nodes)].remove(mate)
        self.seen.add(job.key)
        self.failed_from_s.clear()
        nodes = tuple(n for mate in chosen for n in mate.nodes)
        return Start(job.key, nodes, self.now_s + run_s, tuple(m.key for m in chosen), self.k, mate_increase_s)

    def penalty(self, mate: RunningNodeJob, increase_s: float) -> float:
        """Eq. 4: (wait + increase + req_time) / req_time, with the increases it already had."""
        return mate.predicted_slowdown(self.now_s) + increase_s / mate.requested_s

    def _best_mates(self, nodes: int, run_s: float, mate_increase_s: float) -> tuple[RunningNodeJob, ...] | None:
        guest_end_s = self.now_s + run_s
        cheapest: dict[int, list[tuple[float, float, RunningNodeJob]]] = {}
        for size, group in self.by_nodes.items():
            if size > nodes:
                continue
            eligible = []
            for mate in group:
                p = self.penalty(mate, mate_increase_s)
                if p < self.max_slowdown and guest_end_s <= max(mate.predicted_end_s, self.now_s) + mate_increase_s:
                    eligible.append((p, mate.started_s, mate))
            if eligible:
                eligible.sort(key=lambda e: (e[0], e[1]))
                cheapest[size] = eligible[:self.max_mates]
        best = _cheapest_sum(sorted(cheapest), cheapest, nodes, self.max_mates)
        return None if best is None else tuple(m for _, _, m in best[1])


def _cheapest_sum(sizes: list[int], cheapest: dict, nodes: int, slots: int,
                  at: int = 0) -> tuple[float, list] | None:
    """Eq. 1-3: the least-penalty set of at most ``slots`` mates (sizes from ``sizes[at:]``,
    each size's cheapest first) whose node counts sum to ``nodes``."""
    best: tuple[float, list] | None = None
    for i in range(at, len(sizes)):
        size = sizes[i]
        if size > nodes:
            break
        group = cheapest[size]
        for count in range(1, min(slots, len(group)) + 1):
            used = size * count
            if used > nodes:
                break
            taken = group[:count]
            cost = sum(e[0] for e in taken)
            if used == nodes:
                found: tuple[float, list] | None = (cost, list(taken))
            elif slots > count:
                rest = _cheapest_sum(sizes, cheapest, nodes - used, slots - count, i + 1)
                found = None if rest is None else (cost + rest[0], list(taken) + rest[1])
            else:
                found = None
            if found is not None and (best is None or found[0] < best[0]):
                best = found
    return best


def sd_starts(cluster: NodeCluster, settings: SdSettings) -> list[Start]:
    """One planning call of SD-Policy (Listing 1 for every queued job, in order)."""
    return easy_backfill(cluster, MateSearch(cluster, settings))


def slurm_sd_starts(cluster: NodeCluster, settings: SdSettings,
                    config: SlurmBackfillConfig = SLURM_DEFAULTS) -> list[Start]:
    """One SLURM backfill pass with Listing 1's malleable try after each failed static try
    (paper 001 Section 3.1: SD-Policy is an edit of SLURM's sched/backfill plugin)."""
    return slurm_backfill_pass(cluster, config, MateSearch(cluster, settings, mates_started_now=True))


class SlowdownDrivenPolicy:
    """Paper 001's SD-Policy (module docstring); settings from ``PlanSettings.sd_*``."""

    name = "sd"
    kind = PolicyKind.NODE

    def starts(self, cluster: NodeCluster, settings: PlanSettings) -> list[Start]:
        """The planner on a node view (what ``plan`` and the CPU-job simulator call)."""
        return sd_starts(cluster, SdSettings.of(settings))

    def plan(self, request: PlanRequest, settings: PlanSettings) -> Plan:
        return plan_nodes(self.name, request, lambda cluster: self.starts(cluster, settings))


class SlurmSlowdownDrivenPolicy:
    """SD-Policy on the ``slurm-backfill`` baseline: the main scheduler (static, at every
    submit and finish) unchanged, each backfill pass (every ``bf_interval``) with Listing 1's
    malleable try; settings from ``PlanSettings.sd_*``."""

    name = "slurm-sd"
    kind = PolicyKind.NODE
    config = SLURM_DEFAULTS
    backfill_interval_s = SLURM_DEFAULTS.interval_s

    def starts(self, cluster: NodeCluster, settings: PlanSettings) -> list[Start]:
        """A backfill pass with malleable tries."""
        return slurm_sd_starts(cluster, SdSettings.of(settings), self.config)

    def event_starts(self, cluster: NodeCluster, settings: PlanSettings) -> list[Start]:
        """The main scheduler (at a submit or finish)."""
        return slurm_main_schedule(cluster)

    def plan(self, request: PlanRequest, settings: PlanSettings) -> Plan:
        return plan_nodes(self.name, request, lambda cluster: self.starts(cluster, settings))


#: The policies that share nodes (read ``PlanSettings.sd_*``).
SD_POLICIES = ("sd", "slurm-sd")

__all__ = ["MateSearch", "SD_POLICIES", "SdSettings", "SlowdownDrivenPolicy", "SlurmSlowdownDrivenPolicy",
           "dynamic_max_slowdown", "guest_cores", "sd_starts", "slurm_sd_starts"]
