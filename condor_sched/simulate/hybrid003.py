"""Paper 003's cluster experiments (Section IV-B, Tables I and II) in a time-stepped simulator.

Policies (Section IV-B's three scenarios, then the field's estimators on the same spare mode):

- ``vanilla``: Slurm's default queue: every job on whole nodes of its own, EASY backfill (the
  registered ``backfill`` planner, the one paper 001's rows use).
- ``collocated``: Slurm with a core-level DI queue, at most two jobs per node and never two HPC
  jobs on one node, no control (the kernel shares the cores fairly). Its planner
  (:func:`collocated_starts`): first come, first served, least-loaded eligible nodes first; the
  first job that cannot start gets a reservation at the time the running jobs' requested ends
  make room for it, and a later job starts only if it ends (by its requested time) before.
- ``hybrid``: HPC jobs as vanilla; DI jobs run in spare capacity (the spare mode): a DI job of
  N cores is ceil(N / 32) tasks (a data-parallel framework's executors, one node's width each),
  each a spare-capacity job requesting the paper's 5% minimum share (2 of 32 cores) and its
  application's memory, placed by the spare mode's default planner (``spare-spread``) on SPARE
  slots capped by ``modes.spare.mode.capped`` at each node's spare capacity C - (Q + xi), the
  Insight Engine's estimate (``cosched_node.insight``) over the node's primaries' use. A
  running task then uses up to its width, all of a node's spare tasks together confined to the
  node agent's cap max(5% C, C - max(Q + xi, live use)), in the idle class; the cap is
  recomputed every 5 s step from the use sampled in the step before (tightened within one
  interval). A DI job progresses at the CPU its tasks get over the CPU it would use alone.
- ``koordinator`` and ``autopilot``: the same, the estimate from Koordinator's formula or
  Autopilot's decaying histogram (``spare_estimators``).

Samples and estimates: as the live node agent (``cosched_node.spare_duty``), one behaviour for
the live system and the simulator. Every 5 s step (the agent's ``SPARE_INTERVAL_S``) each node
takes one sample, its primaries' CPU-seconds over the step over the step's length (a primary
counted from its second interval on the node, as the agent counts a claim first seen). All
three estimators read these same samples; each treats a change of the node's primaries (a
primary job starting or ending there) as its own field does:

- ``hybrid`` keeps them in an ``insight.UsageStream`` of the agent's settings
  (``InsightSettings()``: a sliding window of 1,800 s, 360 samples) and takes Q + xi as the
  agent does (``estimate()`` with its fresh ``random.Random(0)``). The stream describes the
  primaries running now, as the agent's (``SpareDuty.sample_primaries``): when the set of the
  node's primaries changes it starts anew and the step of the change adds no sample (a new
  primary's CPU is known from the next one), so for ``insight.MIN_SAMPLES`` samples (a minute)
  the node has no estimate. A window kept across the change described jobs no longer there:
  a finished busy job's samples kept a node it had left from offering its cores for up to
  30 minutes, and an idle node's zeros under a new busy job gave its spare neighbours almost
  none of the protection its use calls for. An idle node keeps one stream of zeros.
- ``koordinator`` reads the node's samples as a 300 s mean that slides across a change (its
  node metric is a window over time, not restarted when pods come or go): a finished
  primary's samples weigh in for up to 5 minutes, a new one's from its second interval.
- ``autopilot`` keeps a decaying histogram per primary of that primary's part of each sample
  (Autopilot's histograms and limits are per job; one histogram of the node's samples, with
  its 12 h half-life, would hold every past primary's busy level for hours), the node's
  estimate the running primaries' limits summed: a primary that ends takes its histogram
  with it, one not sampled yet counts at its cores (Autopilot's first limit is the request).

With no estimate (under ``insight.MIN_SAMPLES`` samples: the run's first minute on every node,
and under ``hybrid`` the minute after each change of a node's primaries) the agent publishes
the node not usable (``publish_spare``), so the spare mode admits nothing there, and the cap of
spare tasks is the 5% floor (``spare_duty.node_limits``, which :func:`spare_estimators.spare_cap`
calls). The estimates are refreshed once a minute, just before the spare mode plans (its
negotiation cycle, the only reader of the published offer), where the agent estimates every
5 s: a BLB over 360 samples costs about 5 ms in pure Python, and every 5 s on every node would
make a 16-node run take minutes rather than seconds. Two moments are taken as the agent takes
them, not at the minute: a restarted stream's estimate is dropped at the change, and the
estimate is made again at the sample that brings the stream back to ``insight.MIN_SAMPLES``
(so the cap is the floor for exactly those samples). The cap's live term is each 5 s sample,
as the agent's, so a rise in use still tightens the cap within one interval; a minute's
staleness of an estimate otherwise moves it little.

Deadlines. A Slurm job (every job under vanilla and collocated, HPC jobs under the spare
policies) is killed at its requested time (Section IV); spare-capacity tasks, as the paper's
Mesos tasks, have none. ``ModelSettings`` (``hybrid003_model``) holds what the text leaves
open, its defaults the reported rows: what the idle class removes of the interference, how
busy the parallel stages are, and whether a job past its requested time is killed or runs on
(then counted missed). Time advances in 5 s steps; a job's end is interpolated within its
step, and what it frees is planned at the next step.
"""
from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, field
from typing import Optional, Sequence

from cosched_node import insight, spare_duty
from condor_sched.model import Job, JobKey, JobStatus, Resources, Slot, SlotKind, SpareCapacity
from condor_sched.modes.mates.cpu_nodes import NodeCluster, RunningNodeJob, WaitingJob
from condor_sched.modes.planning import PlanRequest, PlanSettings
from condor_sched.modes.registry import get_policy
from condor_sched.modes.spare.mode import SPARE, capped
from condor_sched.simulate.hybrid003_model import ModelSettings, calibrate, fair_shares, interference
from condor_sched.simulate.hybrid003_workload import CORES_PER_NODE, NODE_MEMORY_GB, HybridJob, generate
from condor_sched.simulate.spare_estimators import (
    KOORD_MEMORY_THRESHOLD_PCT,
    AutopilotEstimator,
    BlbEstimator,
    KoordinatorEstimator,
    UseEstimator,
    koordinator_batch,
    spare_cap,
    spare_offer,
)

POLICIES = ("vanilla", "collocated", "hybrid", "koordinator", "autopilot")
SPARE_POLICIES = ("hybrid", "koordinator", "autopilot")
#: The node agent's interval on a node with a spare slot: a time step, a sample.
STEP_S = spare_duty.SPARE_INTERVAL_S
#: The spare mode's planning interval (a negotiation cycle), when the estimates are refreshed.
PLAN_S = 60.0
#: Section IV-B: at least 5% of every resource goes to the DI jobs (the agent's floor); a task's request.
FLOOR_SHARE = spare_duty.FLOOR_SHARE
TASK_CPUS = math.ceil(FLOOR_SHARE * CORES_PER_NODE)
SCHEDD = "hybrid-003"
KEYS = ("makespan_s", "mean_wait_s", "cpu_utilization", "missed_deadlines", "guest_core_hours", "primary_slowdown")


@dataclass(slots=True)
class _Run:
    """A started job's mutable state: ``done_s`` of its run time alone, ``seg`` its stage."""

    job: HybridJob
    started_s: float
    nodes: tuple[int, ...] = ()
    done_s: float = 0.0
    seg: int = 0
    tasks: dict[int, int] = field(default_factory=dict)
    cpu_s: float = 0.0
    reclaimed_s: float = 0.0

    def share(self, first: bool) -> float:
        seg = self.job.segments[self.seg]
        return seg.first_share if first else seg.rest_share


@dataclass(frozen=True, slots=True)
class JobOutcome:
    """One job's start and end (s), whether it was killed at its requested time (or ran past
    it, ``overran``), CPU-seconds (``reclaimed_s``: a spare task's on nodes that held a primary
    job)."""

    started_s: float
    ended_s: float
    killed: bool
    cpu_s: float
    reclaimed_s: float = 0.0
    overran: bool = False

    @property
    def missed(self) -> bool:
        """Killed at its requested time, or (``deadlines="overrun"``) ended past it."""
        return self.killed or self.overran


@dataclass(frozen=True, slots=True)
class RunResult:
    jobs: tuple[HybridJob, ...]
    outcomes: dict[int, JobOutcome]
    nodes: int
    policy: str

    @property
    def makespan_s(self) -> float:
        return max(o.ended_s for o in self.outcomes.values()) - min(j.arrival_s for j in self.jobs)


def _estimator(policy: str) -> UseEstimator:
    """A node's estimator (autopilot: a primary's on one node, module docstring)."""
    if policy == "hybrid":
        return BlbEstimator(insight.InsightSettings())
    if policy == "koordinator":
        return KoordinatorEstimator(float(CORES_PER_NODE))
    return AutopilotEstimator(bucket=CORES_PER_NODE / 64, min_samples=1)


def collocated_starts(now: float, queue: Sequence[HybridJob], placed: Sequence[list[int]],
                      running: dict[int, _Run], jobs: dict[int, HybridJob]) -> list[tuple[int, tuple[int, ...]]]:
    """Collocated Slurm's starts (module docstring): ``placed[n]`` the jobs on node ``n``."""
    state = [list(p) for p in placed]
    starts: list[tuple[int, tuple[int, ...]]] = []
    shadow_s: Optional[float] = None
    for job in queue:
        nodes = _colloc_fit(job, state, jobs)
        if nodes is not None and (shadow_s is None or now + job.requested_s <= shadow_s):
            for n in nodes:
                state[n].append(job.index)
            starts.append((job.index, nodes))
        elif nodes is None and shadow_s is None:
            shadow_s = _colloc_shadow(job, state, running, jobs, now)
    return starts


def _colloc_fit(job: HybridJob, state: Sequence[list[int]], jobs: dict[int, HybridJob]) -> Optional[tuple[int, ...]]:
    ok = [n for n, on in enumerate(state)
          if not on or (len(on) == 1 and not (job.hpc and jobs[on[0]].hpc))]
    if len(ok) < job.nodes:
        return None
    ok.sort(key=lambda n: (len(state[n]), n))
    return tuple(ok[:job.nodes])


def _colloc_shadow(job: HybridJob, state: Sequence[list[int]], running: dict[int, _Run],
                   jobs: dict[int, HybridJob], now: float) -> float:
    """When the running jobs' requested ends first make room for ``job``."""
    trial = [list(s) for s in state]
    ends = sorted((r.started_s + r.job.requested_s, i) for i, r in running.items() if r.nodes)
    for end_s, i in ends:
        for s in trial:
            if i in s:
                s.remove(i)
        if _colloc_fit(job, trial, jobs) is not None:
            return max(end_s, now)
    return math.inf


class Hybrid003Simulation:
    """One run of a workload under one policy on ``nodes`` nodes of 32 cores (module docstring);
    ``jobs`` generated with ``model.parallel_idle``."""

    def __init__(self, jobs: Sequence[HybridJob], nodes: int, policy: str, seed: int = 0,
                 model: ModelSettings = ModelSettings()) -> None:
        if policy not in POLICIES:
            raise ValueError(f"unknown hybrid-003 policy {policy!r}; one of {', '.join(POLICIES)}")
        self.jobs = {j.index: j for j in jobs}
        self.order = sorted(jobs, key=lambda j: (j.arrival_s, j.index))
        self.n = nodes
        self.policy = policy
        self.spare = policy in SPARE_POLICIES
        self.model = model
        self.k = calibrate(model.parallel_idle)
        self.k_beside_spare = self.k if model.spare_interference else {app: 0.0 for app in self.k}
        self.placed: list[list[int]] = [[] for _ in range(nodes)]
        self.tasks_on: list[list[tuple[int, int]]] = [[] for _ in range(nodes)]
        self.queue: list[HybridJob] = []
        self.spare_queue: list[tuple[int, int]] = []
        self.running: dict[int, _Run] = {}
        self.out: dict[int, JobOutcome] = {}
        self.first_start: dict[int, float] = {}
        self.seed = seed
        self.estimators: list[UseEstimator] = ([_estimator(policy) for _ in range(nodes)]
                                               if self.spare and policy != "autopilot" else [])
        self.per_primary: dict[tuple[int, int], UseEstimator] = {}     # autopilot: (node, job)
        self.samples = [0] * nodes            # hybrid: in the node's stream since it (re)started
        self.primaries: list[frozenset[int]] = [frozenset()] * nodes   # at the last sample
        self.estimate: list[Optional[float]] = [None] * nodes
        self.live = [0.0] * nodes
        self.reclaimed: dict[int, float] = {}
        self.slurm = get_policy("backfill")
        self.planner = get_policy(SPARE.default_planner)

    # --- planning ---------------------------------------------------------------------

    def _slurm_plan(self, now: float) -> None:
        if not self.queue:
            return
        if self.policy == "collocated":
            starts = collocated_starts(now, self.queue, self.placed, self.running, self.jobs)
        else:
            free = tuple(n for n in range(self.n - 1, -1, -1) if not self.placed[n])
            views = tuple(RunningNodeJob(JobKey(SCHEDD, 1, r.job.index), r.nodes, r.job.arrival_s, r.started_s,
                                         r.job.requested_s, r.started_s + r.job.requested_s, CORES_PER_NODE)
                          for r in self.running.values() if r.nodes)
            waiting = tuple(WaitingJob(JobKey(SCHEDD, 1, j.index), j.nodes, j.requested_s, j.arrival_s)
                            for j in self.queue)
            cluster = NodeCluster(now, CORES_PER_NODE, self.n, free, views, waiting)
            starts = [(s.job.proc, tuple(int(x) for x in s.nodes)) for s in self.slurm.starts(cluster, PlanSettings())]
        started = {i for i, _ in starts}
        for index, nodes in starts:
            for node in nodes:
                self.placed[node].append(index)
            self.running[index] = _Run(self.jobs[index], now, nodes)
            self.first_start[index] = now
        self.queue = [j for j in self.queue if j.index not in started]

    def _spare_slots(self) -> tuple[Slot, ...]:
        slots = []
        total = Resources(cpus=CORES_PER_NODE, memory_mb=NODE_MEMORY_GB * 1024)
        for n in range(self.n):
            held = Resources(cpus=TASK_CPUS * len(self.tasks_on[n]),
                             memory_mb=sum(int(self.jobs[j].memory_gb * 1024) for j, _ in self.tasks_on[n]))
            used = self.estimate[n]
            primary_mb = sum(int(self.jobs[j].memory_gb * 1024) for j in self.placed[n])
            if self.policy == "koordinator":
                spare_mb = int(koordinator_batch(total.memory_mb, primary_mb, KOORD_MEMORY_THRESHOLD_PCT))
            else:
                spare_mb = total.memory_mb - int(primary_mb * (1.1 if self.policy == "autopilot" else 1.0))
            spare = (SpareCapacity(0.0, 0, problem=f"no estimate yet: {self.samples[n]} of "
                                                   f"{insight.MIN_SAMPLES} samples") if used is None else
                     SpareCapacity(spare_offer(CORES_PER_NODE, used), max(0, spare_mb)))
            slot = Slot(f"slot2@node{n}", f"node{n}", SlotKind.SPARE, total, total - held, spare=spare)
            if spare.problem is None:
                slots.append(capped(slot, spare))
        return tuple(slots)

    def _spare_plan(self, now: float) -> None:
        if not self.spare_queue:
            return
        idle = tuple(Job(JobKey(SCHEDD, 2 + j, t), "di", JobStatus.IDLE,
                         Resources(cpus=TASK_CPUS, memory_mb=int(self.jobs[j].memory_gb * 1024)),
                         submitted_at_s=int(self.jobs[j].arrival_s), spare=True) for j, t in self.spare_queue)
        slots = self._spare_slots()
        if not slots:
            return
        plan = self.planner.plan(PlanRequest.of(idle, slots, now_s=now), PlanSettings())
        node_of = {s.name: int(s.machine[4:]) for s in slots}
        placed = set()
        for a in plan.assignments:
            j, t = a.job.cluster - 2, a.job.proc
            node = node_of[a.slot]
            run = self.running.get(j)
            if run is None:
                run = self.running[j] = _Run(self.jobs[j], now)
                self.first_start[j] = now
            run.tasks[t] = node
            self.tasks_on[node].append((j, t))
            placed.add((j, t))
        self.spare_queue = [jt for jt in self.spare_queue if jt not in placed]

    # --- one step ---------------------------------------------------------------------

    def _rates(self) -> tuple[dict[int, float], dict[int, float], dict[tuple[int, int], float]]:
        """Each running job's progress rate and CPU (cores) this step, and each primary's use
        per node ((node, job) -> cores)."""
        C = float(CORES_PER_NODE)
        self.reclaimed = {}
        node_rate: dict[int, list[float]] = {}
        cpu: dict[int, float] = {i: 0.0 for i in self.running}
        primary_use = [0.0] * self.n
        use: dict[tuple[int, int], float] = {}
        di_got: dict[int, float] = {}
        for n in range(self.n):
            on = self.placed[n]
            demand = [self.running[i].share(self.running[i].nodes[0] == n) * C for i in on]
            if self.policy == "collocated" and len(on) == 2:
                got = fair_shares(demand, C)
                for x, (i, d, g) in enumerate(zip(on, demand, got)):
                    other = got[1 - x]
                    rate = (g / d if d > 0 else 1.0) / interference(self.k[self.jobs[i].app], d / C, other / C)
                    node_rate.setdefault(i, []).append(rate)
                    cpu[i] += g
                continue
            got = [min(d, C) for d in demand]
            primary_use[n] = sum(got)
            use.update(((n, i), g) for i, g in zip(on, got))
            guest = 0.0
            if self.spare and self.tasks_on[n]:
                want = []
                for j, t in self.tasks_on[n]:
                    run = self.running[j]
                    width = run.job.cores / run.job.nodes
                    want.append(run.share(t == 0) * width)
                cap = spare_cap(C, self.estimate[n], self.live[n])
                guest = min(sum(want), cap, max(0.0, C - primary_use[n]))
                for (j, _), w in zip(self.tasks_on[n], want):
                    share = guest * w / sum(want) if sum(want) > 0 else 0.0
                    di_got[j] = di_got.get(j, 0.0) + share
                    cpu[j] += share
                    if on:
                        self.reclaimed[j] = self.reclaimed.get(j, 0.0) + share
            for i, d, g in zip(on, demand, got):
                node_rate.setdefault(i, []).append(1.0 / interference(self.k_beside_spare[self.jobs[i].app], d / C, guest / C))
                cpu[i] += g
        rates: dict[int, float] = {}
        for i, run in self.running.items():
            if run.nodes:
                r = node_rate.get(i, [1.0])
                rates[i] = min(r) if run.job.hpc else sum(r) / len(r)
            else:
                width = run.job.cores / run.job.nodes
                need = sum(run.share(t == 0) * width for t in range(run.job.nodes))
                rates[i] = min(1.0, di_got.get(i, 0.0) / need) if need > 0 else 1.0
        return rates, cpu, use

    def _end(self, index: int, ended_s: float, killed: bool) -> None:
        run = self.running.pop(index)
        overran = bool(run.nodes) and ended_s > run.started_s + run.job.requested_s + 1e-6
        self.out[index] = JobOutcome(self.first_start[index], ended_s, killed, run.cpu_s, run.reclaimed_s, overran)
        for node in run.nodes:
            self.placed[node].remove(index)
        for t, node in run.tasks.items():
            self.tasks_on[node].remove((index, t))

    def run(self) -> RunResult:
        arrivals = [(j.arrival_s, j.index) for j in self.order]
        heapq.heapify(arrivals)
        now, changed = 0.0, True
        step = 0
        while arrivals or self.queue or self.spare_queue or self.running:
            while arrivals and arrivals[0][0] <= now + 1e-9:
                _, i = heapq.heappop(arrivals)
                job = self.jobs[i]
                if self.spare and not job.hpc:
                    self.spare_queue += [(i, t) for t in range(job.nodes)]
                else:
                    self.queue.append(job)
                changed = True
            if changed:
                self._slurm_plan(now)
                changed = False
            minute = step % round(PLAN_S / STEP_S) == 0
            if self.spare and minute:
                self._refresh()
                self._spare_plan(now)
            rates, cpu, use = self._rates()
            sample: dict[tuple[int, int], float] = {}   # each primary's CPU-seconds this step, per node
            for i, run in list(self.running.items()):
                rate = rates[i]
                left = run.job.runtime_s - run.done_s
                dt = STEP_S if rate <= 0 or left > rate * STEP_S else left / rate
                limit = (run.started_s + run.job.requested_s if run.nodes and self.model.deadlines == "kill"
                         else math.inf)
                if now + dt > limit:
                    dt = max(0.0, limit - now)
                run.done_s += rate * dt
                if run.nodes and run.started_s < now:   # the agent counts a claim from its second interval
                    for n in run.nodes:
                        sample[(n, i)] = use.get((n, i), 0.0) * dt
                run.cpu_s += cpu[i] * dt
                run.reclaimed_s += self.reclaimed.get(i, 0.0) * dt
                run.seg = run.job.segment_at(run.done_s, run.seg)
                if run.done_s >= run.job.runtime_s - 1e-6:
                    self._end(i, now + dt, False)
                    changed = True
                elif now + dt >= limit:
                    self._end(i, limit, True)
                    changed = True
            step += 1
            now = step * STEP_S
            if self.spare:
                self._sample(now, sample)
        return RunResult(tuple(self.order), self.out, self.n, self.policy)

    def _sample(self, now: float, cpu_s: dict[tuple[int, int], float]) -> None:
        """The node agent's sample at the end of a step: each node's primaries' CPU-seconds over
        the step, as cores; the cap's live term and the node's estimator (module docstring).
        ``hybrid``: the node's stream starts anew when its primaries change, the step adding no
        sample. Autopilot's histograms take each primary's part of it apart."""
        node = [0.0] * self.n
        for (n, _), x in cpu_s.items():
            node[n] += x
        for n in range(self.n):
            cores = max(0.0, node[n] / STEP_S)
            self.live[n] = cores
            if self.policy == "hybrid":
                self._sample_hybrid(n, now, cores)
                continue
            self.samples[n] += 1
            if self.policy != "autopilot":
                self.estimators[n].observe(now, cores)
        if self.policy == "autopilot":
            on = {(n, i) for n in range(self.n) for i in self.placed[n]}
            self.per_primary = {k: e for k, e in self.per_primary.items() if k in on}
            for key, x in cpu_s.items():
                if key in on:
                    est = self.per_primary.get(key)
                    if est is None:
                        est = self.per_primary[key] = _estimator(self.policy)
                    est.observe(now, max(0.0, x / STEP_S))

    def _sample_hybrid(self, n: int, now: float, cores: float) -> None:
        """``SpareDuty.sample_primaries`` on node ``n``: a change of its primaries restarts the
        stream, adds no sample and leaves the node without an estimate (the agent's next one is
        None); the sample that brings the stream back to ``insight.MIN_SAMPLES`` is estimated
        at once, as the agent estimates every interval."""
        on = frozenset(self.placed[n])
        if on != self.primaries[n]:
            self.primaries[n] = on
            self.estimators[n] = _estimator(self.policy)
            self.samples[n] = 0
            self.estimate[n] = None
            return
        self.estimators[n].observe(now, cores)
        self.samples[n] += 1
        if self.samples[n] == insight.MIN_SAMPLES:
            self.estimate[n] = self._used(n)

    def _used(self, n: int) -> Optional[float]:
        """Node ``n``'s estimated use; None under ``insight.MIN_SAMPLES`` samples. Autopilot:
        the sum of its primaries' limits, a primary not sampled yet at its cores on the node
        (Autopilot's first limit is the job's request)."""
        if self.policy != "autopilot":
            return self.estimators[n].used()
        if self.samples[n] < insight.MIN_SAMPLES:
            return None
        total = 0.0
        for i in self.placed[n]:
            est = self.per_primary.get((n, i))
            limit = est.used() if est is not None else None
            total += float(CORES_PER_NODE) if limit is None else limit
        return total

    def _refresh(self) -> None:
        """Each node's estimate, once a minute before planning. Only where it is read before the
        next refresh: every node when spare tasks wait (the planner reads them all), else the
        nodes running spare tasks (their cap); tasks are placed only when they wait, so the
        others' stale estimates are never read. Each estimate is a function of its node's
        stream alone, so this changes no result."""
        for n in range(self.n):
            if self.spare_queue or self.tasks_on[n]:
                self.estimate[n] = self._used(n)


def run_policy(nodes: int, policy: str, seed: int, model: ModelSettings = ModelSettings()) -> RunResult:
    """One run of the hybrid-003 workload (``nodes`` 4, 8 or 16) under ``policy`` and ``model``."""
    return Hybrid003Simulation(generate(nodes, seed, model.parallel_idle), nodes, policy, seed, model).run()


def walltime(result: RunResult, index: int) -> float:
    o = result.outcomes[index]
    return o.ended_s - o.started_s


def metrics(result: RunResult, vanilla: RunResult) -> dict[str, float]:
    """The ``--json`` keys (paper 003's Table II and the issue's definitions)."""
    jobs, out = result.jobs, result.outcomes
    makespan = result.makespan_s
    cpu_s = sum(o.cpu_s for o in out.values())
    hpc = [j.index for j in jobs if j.hpc]
    return {
        "makespan_s": round(makespan, 3),
        "mean_wait_s": round(sum(out[j.index].started_s - j.arrival_s for j in jobs) / len(jobs), 3),
        "cpu_utilization": round(cpu_s / (result.nodes * CORES_PER_NODE * makespan), 6),
        "missed_deadlines": round(sum(o.missed for o in out.values()) / len(jobs), 6),
        "guest_core_hours": round(sum(out[j.index].cpu_s for j in jobs if not j.hpc) / 3600, 3),
        "primary_slowdown": round(sum(walltime(result, i) / walltime(vanilla, i) for i in hpc) / len(hpc) - 1, 6),
    }


def simulate_hybrid003(nodes: int, policy: str, seed: int, model: ModelSettings = ModelSettings()) -> dict[str, float]:
    """``simulate --workload hybrid-003``: the six keys of ``policy``'s run, against vanilla's
    run of the same seed and ``model`` for ``primary_slowdown``."""
    result = run_policy(nodes, policy, seed, model)
    vanilla = result if policy == "vanilla" else run_policy(nodes, "vanilla", seed, model)
    return metrics(result, vanilla)
