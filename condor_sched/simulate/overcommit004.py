"""Paper 004's overcommitting scheduler (Section 3.3) on a simulated pool, driven by a measured dataset.

The pool: ``nodes`` nodes of the measured node type (two vCPUs each; the committed dataset's
``kvm-epyc-2vcpu``). The mix (Section 3: "long batch jobs plus short interactive jobs"):

* batch jobs: ``BATCH_PER_CORE`` per vCPU, each a batch program of the dataset drawn at random,
  a dedicated run time log-uniform in ``BATCH_RUN_S``; half queued at the start, the rest
  arriving at uniform random times over ``BATCH_ARRIVALS_S``;
* interactive sessions: ``INTERACTIVE_PER_CORE`` per vCPU, each an interactive program of the
  dataset (execution periods and thinking periods), a dedicated length log-uniform in
  ``INTERACTIVE_RUN_S``, arriving at uniform random times over ``INTERACTIVE_ARRIVALS_S``.

Every job asks for one vCPU. Jobs are placed first come, first served (a job that cannot be
placed does not block later ones) by :func:`condor_sched.modes.overcommit.placement.place`:
``exclusive`` (one job per vCPU), ``naive`` (up to M = 2 per vCPU, blind) or ``overcommit``
(up to M = 2, the model's verdicts). The ``overcommit`` policy consults, for each pair, the
verdict of a model fitted without that pair (``pair_table.out_of_fold_verdicts``, 3 folds):
the measured labels it is scored on were never its training data. ``overcommit-measured`` is a
yardstick, not a policy a pool could run: ``overcommit`` judging by the measured labels
themselves (a perfect model), so what is left of its ill-matched time and makespan is the
placement's and the node's, not the model's.

Speeds: a job alone on its node runs at 1 (its dedicated speed). Beside exactly one other job
it runs at the measured speed of that pair in that placement (``pair_table``: work per wall
second in the overlap window; for an interactive program this includes its thinking periods,
which do not slow down). Beside more than one, measured pairs are not enough and a stand-in
composes them: the product of the pair speeds, a neighbour on another vCPU weighing by its
share of that vCPU (its speed factor to the power 1/k where k jobs share its vCPU). Time run
under the stand-in is reported apart (``composed_share``), as are the pairs' labels, which are
always measured. Every change on a node re-times its jobs.

``ill_matched_pair_share``: co-running time of pairs of jobs on one node whose measured label
is ill-matched (time-shared vCPU: E >= 1 with a batch victim; separate vCPUs: Ev > 0.1), over
all co-running pair time.
"""
from __future__ import annotations

import functools
import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from condor_sched.interference.dataset import load_dataset
from condor_sched.interference.model import DEFAULT_EV_THRESHOLD, DEFAULT_PROB_CUTOFF, Verdict
from condor_sched.interference.pair_table import PairKey, PairTable, out_of_fold_verdicts, pair_table
from condor_sched.modes.overcommit.placement import DEFAULT_MULTIPLICITY, POLICIES, Core, place

WORKLOAD = "overcommit-004"
CORES_PER_NODE = 2
BATCH_PER_CORE = 4
BATCH_RUN_S = (3600.0, 4 * 3600.0)
BATCH_ARRIVALS_S = 4 * 3600.0
INTERACTIVE_PER_CORE = 8
INTERACTIVE_RUN_S = (600.0, 3600.0)
INTERACTIVE_ARRIVALS_S = 8 * 3600.0
FOLDS = 3
#: The mix's size grows with the pool (jobs per vCPU); each placement scans every core.
MAX_MIX_NODES = 64
KEYS = ("makespan_s", "ill_matched_pair_share", "ill_matched_shared_share", "ill_matched_separate_share",
        "shared_pair_s", "separate_pair_s", "composed_share", "mean_batch_wait_s", "mean_interactive_wait_s",
        "mean_interactive_stretch", "model_refusals")
SAFE = Verdict(False, "", 0.0, 0.0)
#: ``overcommit`` judging by the measured labels (module docstring); simulator only.
MEASURED = "overcommit-measured"
SIMULATED_POLICIES = (*POLICIES, MEASURED)


@dataclass(frozen=True)
class MixJob:
    index: int
    program: str
    interactive: bool
    arrival_s: float
    work_s: float


def _log_uniform(rng: random.Random, bounds: tuple[float, float]) -> float:
    low, high = bounds
    return math.exp(rng.uniform(math.log(low), math.log(high)))


def overcommit_mix(programs: Sequence[str], interactive: frozenset[str], nodes: int, seed: int) -> list[MixJob]:
    """The mix of the module docstring, in arrival order."""
    rng = random.Random(seed)
    batch_programs = sorted(p for p in programs if p not in interactive)
    session_programs = sorted(p for p in programs if p in interactive)
    if not batch_programs or not session_programs:
        raise ValueError("the mix needs batch and interactive programs in the dataset")
    cores = nodes * CORES_PER_NODE
    drawn: list[tuple[float, str, bool, float]] = []
    batch = BATCH_PER_CORE * cores
    for i in range(batch):
        arrival = 0.0 if i < batch // 2 else rng.uniform(0.0, BATCH_ARRIVALS_S)
        drawn.append((arrival, rng.choice(batch_programs), False, _log_uniform(rng, BATCH_RUN_S)))
    for _ in range(INTERACTIVE_PER_CORE * cores):
        drawn.append((rng.uniform(0.0, INTERACTIVE_ARRIVALS_S), rng.choice(session_programs), True,
                      _log_uniform(rng, INTERACTIVE_RUN_S)))
    drawn.sort(key=lambda d: d[0])
    return [MixJob(i, program, inter, arrival, work) for i, (arrival, program, inter, work) in enumerate(drawn)]


@dataclass
class _Running:
    job: MixJob
    core: tuple[str, int]
    left_s: float
    speed: float = 1.0
    composed: bool = False


@dataclass
class _Totals:
    pair_s: dict[str, float] = field(default_factory=lambda: {"shared": 0.0, "separate": 0.0})
    ill_s: dict[str, float] = field(default_factory=lambda: {"shared": 0.0, "separate": 0.0})
    job_s: float = 0.0
    composed_s: float = 0.0


class OvercommitSimulation:
    """The event loop of the module docstring for one policy."""

    def __init__(self, jobs: Sequence[MixJob], nodes: int, policy: str, table: PairTable,
                 verdicts: Mapping[PairKey, Verdict], multiplicity: int = DEFAULT_MULTIPLICITY) -> None:
        if policy not in POLICIES:
            raise ValueError(f"--workload {WORKLOAD} takes --policy {'|'.join(POLICIES)}, not {policy!r}")
        self.jobs, self.policy, self.table = list(jobs), policy, table
        self.verdicts, self.multiplicity = verdicts, multiplicity
        self.cores: dict[tuple[str, int], list[int]] = {(f"node{n:02d}", i): [] for n in range(nodes)
                                                         for i in range(CORES_PER_NODE)}
        self.running: dict[int, _Running] = {}
        self.started: dict[int, float] = {}
        self.finished: dict[int, float] = {}
        self.totals = _Totals()
        self.refusals = 0

    def judge(self, a: str, b: str, placement: str) -> Verdict:
        verdict = self.verdicts.get((placement, *sorted((a, b))), SAFE)
        if a > b:   # the stored verdict reads the sorted pair; probabilities follow a, b
            return Verdict(verdict.ill_matched, verdict.reason, verdict.probability_ba, verdict.probability_ab)
        return verdict

    def _core_views(self) -> list[Core]:
        return [Core(node, index, tuple(self.running[j].job.program for j in held))
                for (node, index), held in self.cores.items()]

    def _speed(self, run: _Running) -> tuple[float, bool]:
        node, index = run.core
        pairs: list[tuple[str, str, float]] = []
        for other_index in range(CORES_PER_NODE):
            held = self.cores[(node, other_index)]
            placement = "shared" if other_index == index else "separate"
            for j in held:
                if j != run.job.index:
                    pairs.append((placement, self.running[j].job.program, 1.0 if placement == "shared" else 1.0 / len(held)))
        if not pairs:
            return 1.0, False
        speed, stand_in = 1.0, len(pairs) > 1
        for placement, opponent, weight in pairs:
            measured = self.table.speed(placement, run.job.program, opponent)
            if measured is None:   # never measured: a fair time slice, no cache effect (stand-in)
                measured, stand_in = (0.5 if placement == "shared" else 1.0), True
            speed *= max(measured, 1e-3) ** weight
        return speed, stand_in

    def _retime(self, node: str) -> None:
        for run in self.running.values():
            if run.core[0] == node:
                run.speed, run.composed = self._speed(run)

    def _advance(self, dt: float) -> None:
        if dt <= 0:
            return
        for run in self.running.values():
            run.left_s -= dt * run.speed
            self.totals.job_s += dt
            if run.composed:
                self.totals.composed_s += dt
        by_node: dict[str, list[tuple[int, _Running]]] = {}
        for run in self.running.values():
            by_node.setdefault(run.core[0], []).append((run.core[1], run))
        for members in by_node.values():
            for i, (core_a, a) in enumerate(members):
                for core_b, b in members[i + 1:]:
                    placement = "shared" if core_a == core_b else "separate"
                    self.totals.pair_s[placement] += dt
                    if self.table.ill_matched(placement, a.job.program, b.job.program):
                        self.totals.ill_s[placement] += dt

    def _plan(self, now: float, queue: list[MixJob]) -> list[MixJob]:
        waiting: list[MixJob] = []
        views = self._core_views()
        for job in queue:
            choice = place(self.policy, job.program, views, self.judge, self.multiplicity)
            if choice.core is None:
                self.refusals += "interference model" in choice.reason
                waiting.append(job)
                continue
            key = (choice.core.node, choice.core.index)
            self.cores[key].append(job.index)
            self.running[job.index] = _Running(job, key, job.work_s)
            self.started[job.index] = now
            self._retime(choice.core.node)
            views = self._core_views()
        return waiting

    def run(self) -> dict[str, float]:
        arrivals = sorted(self.jobs, key=lambda j: (j.arrival_s, j.index))
        queue: list[MixJob] = []
        now, next_arrival = 0.0, 0
        while next_arrival < len(arrivals) or self.running or queue:
            finish_at = min((now + r.left_s / r.speed for r in self.running.values()), default=math.inf)
            arrive_at = arrivals[next_arrival].arrival_s if next_arrival < len(arrivals) else math.inf
            at = min(finish_at, arrive_at)
            if at == math.inf:
                raise RuntimeError(f"{len(queue)} jobs can never start")
            self._advance(at - now)
            now = at
            for index in [j for j, r in self.running.items() if r.left_s <= 1e-6 * r.job.work_s]:
                run = self.running.pop(index)
                self.cores[run.core].remove(index)
                self.finished[index] = now
                self._retime(run.core[0])
            while next_arrival < len(arrivals) and arrivals[next_arrival].arrival_s <= now:
                queue.append(arrivals[next_arrival])
                next_arrival += 1
            queue = self._plan(now, queue)
        return self.metrics()

    def metrics(self) -> dict[str, float]:
        t = self.totals
        pairs = sum(t.pair_s.values())
        waits = {kind: [self.started[j.index] - j.arrival_s for j in self.jobs if j.interactive == kind]
                 for kind in (False, True)}
        stretch = [(self.finished[j.index] - self.started[j.index]) / j.work_s for j in self.jobs if j.interactive]
        return {
            "makespan_s": max(self.finished.values(), default=0.0),
            "ill_matched_pair_share": sum(t.ill_s.values()) / pairs if pairs else 0.0,
            "ill_matched_shared_share": t.ill_s["shared"] / t.pair_s["shared"] if t.pair_s["shared"] else 0.0,
            "ill_matched_separate_share": t.ill_s["separate"] / t.pair_s["separate"] if t.pair_s["separate"] else 0.0,
            "shared_pair_s": t.pair_s["shared"],
            "separate_pair_s": t.pair_s["separate"],
            "composed_share": t.composed_s / t.job_s if t.job_s else 0.0,
            "mean_batch_wait_s": sum(waits[False]) / len(waits[False]) if waits[False] else 0.0,
            "mean_interactive_wait_s": sum(waits[True]) / len(waits[True]) if waits[True] else 0.0,
            "mean_interactive_stretch": sum(stretch) / len(stretch) if stretch else 0.0,
            "model_refusals": float(self.refusals),
        }


@functools.lru_cache(maxsize=4)
def measured_inputs(dataset: str) -> tuple[PairTable, dict[PairKey, Verdict], tuple[str, ...]]:
    """The pair table and the out-of-fold verdicts of a dataset (computed once per process)."""
    data = load_dataset(Path(dataset))
    table = pair_table(data, DEFAULT_EV_THRESHOLD)
    verdicts = out_of_fold_verdicts(data, DEFAULT_EV_THRESHOLD, DEFAULT_PROB_CUTOFF, FOLDS)
    return table, verdicts, data.programs


def measured_verdicts(table: PairTable) -> dict[PairKey, Verdict]:
    """Each measured pair's own label as a verdict: a model that is never wrong."""
    return {key: Verdict(ill, f"measured ill-matched ({key[0]})" if ill else "", float(ill), float(ill))
            for key, ill in table.labels.items()}


def simulate_overcommit004(nodes: int, policy: str, seed: int, dataset: str | None = None) -> dict[str, float]:
    """``simulate --workload overcommit-004``: one policy's figures on the seeded mix."""
    from condor_sched.interference.report import default_dataset

    table, verdicts, programs = measured_inputs(str(dataset or default_dataset()))
    jobs = overcommit_mix(programs, table.interactive, nodes, seed)
    if policy == MEASURED:
        policy, verdicts = "overcommit", measured_verdicts(table)
    return OvercommitSimulation(jobs, nodes, policy, table, verdicts).run()
