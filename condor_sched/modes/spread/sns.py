"""``sns``: Spread-n-Share (paper 000), scaling out and co-locating CPU jobs by LLC ways and
memory bandwidth.

Jobs. A job is an HTCondor cluster of P procs (idle, no device memory, grouped by
(schedd, cluster)); each proc is one process of the parallel job and P counts cores, so a
proc asking r cpus counts r times. Its slowdown threshold alpha is
``job.slowdown_threshold`` (+CoSchedAlpha, default 0.9, Section 4.3).

Demand (Section 4.3, Fig. 10). With T the cores of the largest node in the pool and a
scale factor k, the job spreads to n = k * ceil(P/T) nodes (at most P) with c = ceil(P/n)
cores each; w = the fewest ways whose IPC reaches alpha * F-IPC on the profile's IPC-LLC
curve at k (F-IPC: IPC with all ways of the pool's largest socket), b = the BW-LLC curve at
w (GB/s per process). On a socket, a job needs w ways (one resctrl group per job and cache
id, Section 4.4) and m * b GB/s for m processes there.

Node choice (Section 4.4). For each node, over its SOCKET slots (this cycle's placements
included):

* Co = occupied cores / cores, Bo = occupied bandwidth / bandwidth, Wo = occupied LLC ways
  / LLC ways ("its occupied percentage of cores Co, LLC ways Wo, and memory bandwidth Bo",
  Section 4.4, as fractions), and the metric is Co + Bo + BETA * Wo with BETA = 2 ("2 in our
  prototype").

Nodes that can host the job's largest per-node share are grouped by idle cores; the job
goes to the n lowest-metric nodes of a single group when some group has n of them (the
group whose n best sum lowest), else to the n lowest-metric nodes of the pool. For one job
this choice is an assignment problem with a separable objective, which sorting solves
exactly (so no solver is needed here; ``sns-global`` uses CP-SAT across several jobs).

Scale order (Fig. 11, :func:`scale_order`). The fastest profiled scale first, then the
others in order of profiled exclusive run time; neutral programs smallest footprint first
(Section 6.1: spread "passively ... to utilize residual cores"); a job fitting none is
delayed. Priority is age (cycles since
its procs were first seen, ``PlanRequest.age_of``),
oldest first. A job whose age reaches ``settings.spread_age_limit()`` is no longer delayed:
if no scale fits its (c, w, b) it is placed at the fastest scale whose cores fit, taking
min(w, free) ways and min(b, free) bandwidth per socket (``details["relaxed"] = True``);
if even its cores fit nowhere, it holds the lower-priority jobs back this cycle so that
nodes drain for it (``PlanSettings.sns_block_on_aged``, default True).

Unknown programs (no profile in ``PlanRequest.profiles``) run CE:
k = 1 on ceil(P/T) whole idle nodes, claiming all ways and bandwidth of every socket they
use, flagged ``details["profile"] = "missing"`` so that piggyback profiling (Section 4.1)
can start. Its later runs stay exclusive but try the scale factor
``PlanRequest.exploration_scales[program]`` (k * ceil(P/T) whole nodes; from the node
agents' run records, condor_sched.piggyback) until spreading stops paying.

Accounting for HTCondor (custom resources LLCWays and MemBW per SOCKET slot): each proc
is assigned to one socket slot. ``details["llc_ways"]`` and ``details["mem_bw_gbs"]`` are
what that proc's dynamic slot requests: the job's w ways on a socket are split evenly over
its procs there (so they sum to w), and a proc of r cpus requests r * b. Also in
``details``: ``scale_factor`` k, ``nodes`` n, ``cores_per_node`` c, ``group_llc_ways`` w
(the resctrl mask width per cache id), ``mem_bw_gbs_per_process`` b, ``program``.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field, replace
from typing import Any, Iterable, Mapping, Sequence

from condor_sched.model import Assignment, Job, Plan, Resources, Slot, SlotKind, Unplaced
from condor_sched.modes.planning import PlanRequest, PlanSettings, PolicyKind, too_large_reason
from condor_sched.profiles import Profile, ProfileStore, ProgramClass

BETA = 2.0
#: Bandwidth is accounted in steps of this many GB/s (rounded up per proc).
BW_STEP_GBS = 1e-4
_EPS = 1e-6


# ---------------------------------------------------------------------------------------
# Jobs


@dataclass(frozen=True, slots=True)
class ClusterJob:
    """One parallel job: the idle procs of one (schedd, cluster)."""

    schedd: str
    cluster: int
    procs: tuple[Job, ...]
    program: str
    alpha: float
    age: int
    submitted_at_s: int

    @property
    def cores(self) -> int:
        return sum(p.request.cpus for p in self.procs)

    @property
    def name(self) -> str:
        return f"{self.schedd}#{self.cluster}"


def group_clusters(request: PlanRequest) -> tuple[list[ClusterJob], list[Unplaced]]:
    """Idle CPU jobs grouped by (schedd, cluster), highest priority first (oldest, then
    earliest submitted); procs with an unusable request are reported, not planned."""
    groups: dict[tuple[str, int], list[Job]] = {}
    bad: list[Unplaced] = []
    sockets = [s for s in request.slots if s.kind is SlotKind.SOCKET]
    for job in request.idle:
        if not job.is_idle or job.uses_device:
            continue
        if job.request.cpus < 1:
            bad.append(Unplaced(job.key, f"request_cpus must be >= 1, got {job.request.cpus}"))
            continue
        groups.setdefault((job.key.schedd, job.key.cluster), []).append(job)
    clusters = []
    for (schedd, cluster), procs in groups.items():
        procs.sort(key=lambda j: j.key)
        too_large = next(filter(None, (_too_large_for_sockets(p, sockets) for p in procs)), None)
        if too_large is not None:  # a job runs all its procs or none
            bad.extend(Unplaced(p.key, too_large) for p in procs)
            continue
        alpha = procs[0].slowdown_threshold
        if not (0.0 < alpha <= 1.0):
            bad.extend(Unplaced(p.key, f"slowdown threshold (CoSchedAlpha) must be in (0, 1], got {alpha}") for p in procs)
            continue
        age = max(request.age_of(p.key) for p in procs)
        clusters.append(ClusterJob(schedd, cluster, tuple(procs), procs[0].program, alpha,
                                   max(0, age), min(p.submitted_at_s for p in procs)))
    clusters.sort(key=lambda c: (-c.age, c.submitted_at_s, c.schedd, c.cluster))
    return clusters, bad


def _too_large_for_sockets(proc: Job, sockets: Sequence[Slot]) -> str | None:
    """Why no socket slot could hold ``proc`` even empty: its cpus or memory (the amounts a
    spread plan does not set itself) above every socket's total; None when some could."""
    reason = too_large_reason(replace(proc, request=Resources(cpus=proc.request.cpus, memory_mb=proc.request.memory_mb)),
                              sockets)
    return None if reason is None or not sockets else f"proc {proc.key.job_id} {reason}"


# ---------------------------------------------------------------------------------------
# Nodes


@dataclass(slots=True)
class SocketState:
    slot: Slot
    cpus: int
    ways: int
    bw_gbs: float
    memory_mb: int


@dataclass(slots=True)
class NodeState:
    """The free resources of one node's SOCKET slots, updated as a plan is built."""

    machine: str
    sockets: list[SocketState]
    total_cpus: int = field(init=False)
    total_ways: int = field(init=False)
    total_bw_gbs: float = field(init=False)

    def __post_init__(self) -> None:
        self.total_cpus = sum(s.slot.total.cpus for s in self.sockets)
        self.total_ways = sum(s.slot.total.llc_ways for s in self.sockets)
        self.total_bw_gbs = sum(s.slot.total.mem_bw_gbs for s in self.sockets)

    @property
    def free_cpus(self) -> int:
        return sum(s.cpus for s in self.sockets)

    def occupancy(self) -> tuple[float, float, float]:
        """(Co, Bo, Wo) of Section 4.4: occupied fractions of cores, bandwidth and ways."""

        def frac(free: float, total: float) -> float:
            return 0.0 if total <= 0 else min(1.0, max(0.0, 1.0 - free / total))

        return (frac(self.free_cpus, self.total_cpus),
                frac(sum(s.bw_gbs for s in self.sockets), self.total_bw_gbs),
                frac(sum(s.ways for s in self.sockets), self.total_ways))

    def metric(self, beta: float = BETA) -> float:
        """Co + Bo + beta * Wo (Section 4.4); lower is idler."""
        co, bo, wo = self.occupancy()
        return co + bo + beta * wo

    def is_idle(self) -> bool:
        return all(s.cpus == s.slot.total.cpus and s.ways >= s.slot.total.llc_ways
                   and s.bw_gbs >= s.slot.total.mem_bw_gbs - _EPS for s in self.sockets)


def node_states(slots: Sequence[Slot]) -> list[NodeState]:
    """SOCKET slots grouped by machine, in machine order (device slots are ignored)."""
    by_machine: dict[str, list[SocketState]] = {}
    for s in sorted(slots, key=lambda s: (s.machine, s.cache_id if s.cache_id is not None else -1, s.name)):
        if s.kind is SlotKind.SOCKET and s.total.cpus > 0:
            by_machine.setdefault(s.machine, []).append(
                SocketState(s, max(0, s.free.cpus), max(0, s.free.llc_ways), max(0.0, s.free.mem_bw_gbs),
                            max(0, s.free.memory_mb)))
    return [NodeState(m, socks) for m, socks in sorted(by_machine.items())]


def bw_units(gbs: float) -> float:
    """Bandwidth rounded UP to the accounting step."""
    return math.ceil(gbs / BW_STEP_GBS - 1e-9) * BW_STEP_GBS


@dataclass(frozen=True, slots=True)
class Demand:
    """What a job needs on every socket it uses: ``ways`` (w) and ``bw_per_core`` (b)."""

    ways: int
    bw_per_core: float
    relaxed: bool = False
    exclusive: bool = False
    #: Each proc to the socket with the most free cores (ties: lowest index), so a job's
    #: procs split evenly over a node's sockets as in the profiled runs ("8 cores per
    #: socket", Section 6.1) and as MPI's default by-socket mapping does: CE and CS.
    balanced: bool = False
    #: Cores per node of the profiled layout (P / n), split evenly over a node's sockets.
    #: The curves' w holds for that many procs per socket: a socket given m of the job's
    #: procs needs ceil(w * m / reference) ways, the same LLC per process, and at least
    #: min(w, 2) ("most programs need at least 2 ways", Section 5.1). 0: w per socket.
    reference_cores_per_node: float = 0.0

    def ways_for(self, cores_here: int, sockets_per_node: int) -> int:
        """Ways a socket hosting ``cores_here`` of the job's cores must give it (may exceed
        what a socket has: then that socket cannot host so many)."""
        if self.reference_cores_per_node <= 0:
            return self.ways
        reference = self.reference_cores_per_node / max(1, sockets_per_node)
        return max(min(self.ways, 2), math.ceil(self.ways * cores_here / reference - 1e-9))


@dataclass(slots=True)
class NodePlacement:
    """Procs of one job on one node: (proc, socket index, bandwidth GB/s) and the ways the
    job takes on each socket it uses."""

    node: NodeState
    procs: list[tuple[Job, int, float]]
    ways: dict[int, int]


def fit_on_node(node: NodeState, procs: Sequence[Job], demand: Demand) -> NodePlacement | None:
    """Procs onto the node's sockets, first-fit decreasing: sockets the job already uses
    first, then new ones with most free cores; a socket needs ``demand.ways_for`` its procs
    free ways (w, more when it hosts more of the job's procs than the profiled layout;
    relaxed: whatever is free) and each proc r * b free bandwidth (relaxed: what is left).
    Exclusive (CE): only wholly free sockets, whose ways and bandwidth the job takes all.
    Balanced: each proc to the socket with most free cores left (``Demand.balanced``)."""
    cpus = [s.cpus for s in node.sockets]
    bw = [s.bw_gbs for s in node.sockets]
    memory = [s.memory_mb for s in node.sockets]
    used: dict[int, int] = {}
    cores_here = [0] * len(node.sockets)
    out: list[tuple[Job, int, float]] = []
    order = sorted(range(len(node.sockets)), key=lambda i: (-node.sockets[i].cpus, i))
    for proc in sorted(procs, key=lambda p: (-p.request.cpus, p.key)):
        r = proc.request.cpus
        need_bw = bw_units(r * demand.bw_per_core)
        tries = (sorted(order, key=lambda i: (-cpus[i], i)) if demand.balanced
                 else sorted(order, key=lambda i: i not in used))
        for i in tries:
            sock = node.sockets[i]
            if cpus[i] < r or memory[i] < proc.request.memory_mb:
                continue
            if demand.exclusive:
                if sock.cpus != sock.slot.total.cpus:
                    continue
                ways, take = sock.ways, 0.0
            else:
                need_ways = demand.ways_for(cores_here[i] + r, len(node.sockets))
                if demand.relaxed:
                    ways, take = min(need_ways, sock.ways), min(need_bw, max(0.0, bw[i]))
                else:
                    if sock.ways < need_ways or need_bw > bw[i] + _EPS:
                        continue
                    ways, take = need_ways, need_bw
            cpus[i] -= r
            memory[i] -= proc.request.memory_mb
            bw[i] -= take
            cores_here[i] += r
            used[i] = max(used.get(i, 0), ways)
            out.append((proc, i, take))
            break
        else:
            return None
    if demand.exclusive:
        share = {i: sum(p.request.cpus for p, s, _ in out if s == i) for i in used}
        out = [(p, i, node.sockets[i].bw_gbs * p.request.cpus / share[i]) for p, i, _ in out]
    return NodePlacement(node, out, used)


def commit(placement: NodePlacement) -> None:
    for i, ways in placement.ways.items():
        placement.node.sockets[i].ways -= ways
    for proc, i, bw in placement.procs:
        sock = placement.node.sockets[i]
        sock.cpus -= proc.request.cpus
        sock.memory_mb -= proc.request.memory_mb
        sock.bw_gbs = max(0.0, sock.bw_gbs - bw)


def bundles(procs: Sequence[Job], n: int) -> list[list[Job]]:
    """Procs split over n nodes as evenly as their cores allow, largest bundle first."""
    out: list[list[Job]] = [[] for _ in range(n)]
    load = [0] * n
    for p in sorted(procs, key=lambda p: (-p.request.cpus, p.key)):
        i = min(range(n), key=lambda i: (load[i], i))
        out[i].append(p)
        load[i] += p.request.cpus
    return sorted(out, key=lambda b: -sum(p.request.cpus for p in b))


def per_proc_details(placements: Sequence[NodePlacement], base: Mapping[str, Any]) -> list[Assignment]:
    """One Assignment per proc; a socket's ways split evenly over the job's procs there."""
    out = []
    for pl in placements:
        for i, ways in sorted(pl.ways.items()):
            here = [(p, bw) for p, s, bw in pl.procs if s == i]
            slot = pl.node.sockets[i].slot
            for j, (proc, bw) in enumerate(here):
                share_ways = ways // len(here) + (1 if j < ways % len(here) else 0)
                out.append(Assignment(proc.key, slot.name, {
                    **base, "llc_ways": share_ways, "mem_bw_gbs": bw,
                    "group_llc_ways": ways, "cache_id": slot.cache_id, "machine": pl.node.machine}))
    return out


def choose_nodes(nodes: Sequence[NodeState], job_bundles: Sequence[list[Job]], demand: Demand,
                 beta: float = BETA) -> list[NodePlacement] | None:
    """Section 4.4's choice: the n lowest-metric nodes of one idle-core group, else of the
    pool; each node must host its bundle. None when fewer than n nodes can."""
    n = len(job_bundles)
    fitting = [nd for nd in nodes if fit_on_node(nd, job_bundles[0], demand) is not None]
    if len(fitting) < n:
        return None
    ranked = sorted(fitting, key=lambda nd: (nd.metric(beta), nd.machine))
    groups: dict[int, list[NodeState]] = {}
    for nd in ranked:
        groups.setdefault(nd.free_cpus, []).append(nd)
    options = [(sum(x.metric(beta) for x in g[:n]), idle, g[:n]) for idle, g in groups.items() if len(g) >= n]
    chosen = min(options, key=lambda o: (o[0], o[1]))[2] if options else ranked[:n]
    out = []
    for nd, bundle in zip(chosen, job_bundles):
        pl = fit_on_node(nd, bundle, demand)
        if pl is None:
            return None
        out.append(pl)
    return out


# ---------------------------------------------------------------------------------------
# The planner


@dataclass(frozen=True, slots=True)
class Option:
    """One way to run a job: scale k on n nodes with demand (w, b)."""

    k: int
    n: int
    demand: Demand


def scale_order(profile: Profile) -> list[int]:
    """The order in which a job's profiled scales are tried (Fig. 11).

    Scaling and compact programs: fastest exclusive run first, then the others by run time
    ("in descending order of profiled exclusive run overall performance", Section 4.4).
    Neutral programs (run times within 5%): smallest footprint first, k = 1, 2, 4, 8, since
    "SNS scales such programs passively, not for improving their performance but to utilize
    residual cores distributed on multiple nodes" (Section 6.1); their fastest scale wins by
    under 5%, an advantage that "only appear[s] with exclusive mode"."""
    if profile.program_class is ProgramClass.NEUTRAL:
        return sorted(k for k in profile.runtime_s if k <= profile.max_scale)
    return profile.scales()


def scale_options(job: ClusterJob, profile: Profile, cores_per_node: int, full_ways: int) -> list[Option]:
    """(k, n, w, b) for every profiled scale in :func:`scale_order` (Section 4.3, Fig. 11);
    the scales after the first only where they meet the degradation constraint alpha
    (Section 5.1: predicted run time at most t(1) / alpha, ``Profile.predicted_slowdown``)."""
    base = math.ceil(job.cores / cores_per_node)
    out = []
    for i, k in enumerate(scale_order(profile)):
        if i > 0 and profile.predicted_slowdown(job.alpha, k, full_ways) > 1.0 / job.alpha + 1e-9:
            continue
        n = min(k * base, len(job.procs))
        w, b = profile.demand(job.alpha, k, full_ways)
        out.append(Option(k, n, Demand(w, b, reference_cores_per_node=job.cores / n)))
    return out


def pool_shape(nodes: Sequence[NodeState]) -> tuple[int, int]:
    """(T, full ways): cores of the largest node, ways of the largest socket."""
    t = max((nd.total_cpus for nd in nodes), default=0)
    w = max((s.slot.total.llc_ways for nd in nodes for s in nd.sockets), default=0)
    return t, w


def place_ce(job: ClusterJob, nodes: Sequence[NodeState], cores_per_node: int,
             scale_factor: int = 1) -> list[NodePlacement] | None:
    """Compact-exclusive: k * ceil(P/T) whole idle nodes (in machine order), procs evenly
    over the nodes and over each node's sockets, as in the profiled runs (k = 1 is CE
    proper; k > 1 is a piggyback-profiling run at a wider scale)."""
    n = min(scale_factor * math.ceil(job.cores / cores_per_node), len(job.procs))
    idle = [nd for nd in nodes if nd.is_idle()]
    job_bundles = bundles(job.procs, n)
    out = []
    for bundle in job_bundles:
        for nd in idle:
            pl = fit_on_node(nd, bundle, Demand(0, 0.0, exclusive=True, balanced=True))
            if pl is not None:
                idle.remove(nd)
                out.append(pl)
                break
        else:
            return None
    return out


class SnsPlanner:
    """The greedy SNS scheduling loop of Fig. 11 over a mutable view of the pool."""

    def __init__(self, request: PlanRequest, settings: PlanSettings, beta: float = BETA) -> None:
        self.nodes = node_states(request.slots)
        self.settings = settings
        self.beta = beta
        self.store = request.profiles or ProfileStore()
        self.exploration_scales = request.exploration_scales
        self.cores_per_node, self.full_ways = pool_shape(self.nodes)
        self.assignments: list[Assignment] = []
        self.unplaced: list[Unplaced] = []
        self.scales_used: dict[int, int] = {}

    def options(self, job: ClusterJob) -> list[Option] | None:
        profile = self.store.get(job.program)
        if profile is None or self.cores_per_node <= 0:
            return None
        return scale_options(job, profile, self.cores_per_node, self.full_ways)

    def place(self, job: ClusterJob, option: Option, placements: Sequence[NodePlacement], **extra: Any) -> None:
        for pl in placements:
            commit(pl)
        c = max(sum(p.request.cpus for p, _, _ in pl.procs) for pl in placements)
        base = {"scale_factor": option.k, "nodes": len(placements), "cores_per_node": c,
                "program": job.program, "mem_bw_gbs_per_process": round(option.demand.bw_per_core, 6), **extra}
        self.assignments.extend(per_proc_details(placements, base))
        self.scales_used[option.k] = self.scales_used.get(option.k, 0) + 1

    def try_option(self, job: ClusterJob, option: Option) -> list[NodePlacement] | None:
        return choose_nodes(self.nodes, bundles(job.procs, option.n), option.demand, self.beta)

    def delay(self, job: ClusterJob, reason: str) -> None:
        self.unplaced.extend(Unplaced(p.key, reason) for p in job.procs)

    def plan_job(self, job: ClusterJob) -> bool:
        """Place one job (Fig. 11); False when it stays queued."""
        aged = job.age >= self.settings.spread_age_limit()
        options = self.options(job)
        if options is None:
            k = int(self.exploration_scales.get(job.program.lower(), 1))
            pls = place_ce(job, self.nodes, self.cores_per_node, k) if self.cores_per_node else None
            if pls is None and k > 1:  # the wider profiling run does not fit now: plain CE
                k = 1
                pls = place_ce(job, self.nodes, self.cores_per_node) if self.cores_per_node else None
            if pls is not None:
                self.place(job, Option(k, len(pls), Demand(0, 0.0, exclusive=True)), pls, profile="missing", mode="CE")
                return True
            if aged:
                return self._place_relaxed(job, [Option(1, min(math.ceil(job.cores / max(1, self.cores_per_node)),
                                                              len(job.procs)), Demand(0, 0.0))], profile="missing")
            self.delay(job, f"delayed: no profile for program {job.program!r}, needs "
                            f"{math.ceil(job.cores / max(1, self.cores_per_node))} idle whole node(s)")
            return False
        for option in options:
            pls = self.try_option(job, option)
            if pls is not None:
                self.place(job, option, pls, relaxed=False)
                return True
        if aged and self._place_relaxed(job, options):
            return True
        tried = ", ".join(f"k={o.k} (n={o.n}, w={o.demand.ways}, b={o.demand.bw_per_core:.3g})" for o in options)
        self.delay(job, f"delayed (age {job.age}/{self.settings.spread_age_limit()} cycles): no scale fits; tried {tried}")
        return False

    def _place_relaxed(self, job: ClusterJob, options: Sequence[Option], **extra: Any) -> bool:
        for option in options:
            relaxed = replace(option.demand, relaxed=True)
            pls = self.try_option(job, Option(option.k, option.n, relaxed))
            if pls is not None:
                self.place(job, Option(option.k, option.n, relaxed), pls, relaxed=True, **extra)
                return True
        return False

    def run(self, clusters: Iterable[ClusterJob]) -> None:
        block = self.settings.sns_block_on_aged
        blocker: ClusterJob | None = None
        for job in clusters:
            if blocker is not None:
                self.delay(job, f"waiting: aged job {blocker.name} holds back lower-priority jobs")
                continue
            if not self.plan_job(job) and block and job.age >= self.settings.spread_age_limit():
                blocker = job


class SnsPolicy:
    """Spread-n-Share's greedy scheduler (paper 000, Sections 4.3-4.4, Fig. 11)."""

    name = "sns"
    kind = PolicyKind.SPREAD

    def plan(self, request: PlanRequest, settings: PlanSettings) -> Plan:
        t0 = time.perf_counter()
        clusters, bad = group_clusters(request)
        planner = SnsPlanner(request, settings)
        planner.run(clusters)
        stats = {"solve_time_s": round(time.perf_counter() - t0, 6), "jobs": len(clusters),
                 "placed_jobs": len({(a.job.schedd, a.job.cluster) for a in planner.assignments}),
                 "scale_factors": dict(sorted(planner.scales_used.items()))}
        return Plan(self.name, tuple(planner.assignments), tuple(bad + planner.unplaced), stats)
