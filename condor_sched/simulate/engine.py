"""The discrete-event simulator: arrivals, negotiation cycles, placements, completions.

Nodes and slots come from the same inventory records as the local pool
(:func:`condor_sched.inventory.node_slots`). Each negotiation cycle builds the pool state
(idle jobs with their pins, running jobs, slots with their current free resources) and runs
the sidecar's own cycle on it (:func:`condor_sched.cycle.decide_cycle`, with the memory of
earlier cycles the engine keeps as the sidecar does): stale pins are unpinned, kept pins
hold their resources, the rest is planned by the very policy objects the sidecar uses. The
decision is applied as the live pool would: unpins clear pins, pins are written, and the
simulated negotiator then starts every pinned idle job that fits its slot now (a refused
one stays pinned, is tried again next cycle and unpinned after ``unpin_age_cycles``); the
runtime model then runs the job on its device.

Checks the engine makes at every start, as a startd would: a job may start only once,
only on a device slot, and never beyond the slot's free device memory (a pin that would
exceed it is counted in ``memory_oversubscriptions`` and that start refused) or host
cores/memory (counted in ``refused_starts``). Device threads may be oversubscribed by a
plan (the random policy ignores them); the runtime model serialises offloads, and the
time during which a device's resident jobs ask for more threads than it has is summed in
``thread_oversubscribed_s``.

Parallel CPU jobs (paper 000) start whole or not at all: every proc of the job must be
pinned to a SOCKET slot (else its pins count as ``invalid_assignments``), and each proc's dynamic slot (1 cpu, its memory, the
``llc_ways`` and ``mem_bw_gbs`` of the assignment's details) must fit the slot's free
resources with the job's other procs (else the start is refused, ``refused_starts``).
The pool-wide runtime of the model (``profile_model.py``) then runs the job.

Cycles in which nothing changed since the previous one (no arrival, completion or start,
no pin waiting) are not decided again: a deterministic policy would return the same plan.
The exception is aging (``PlanSettings.age_limit_cycles`` for device jobs,
``PlanSettings.spread_age_limit()`` for parallel jobs, over the first-seen cycles of the
cycle memory): a cycle at which some idle job turns starving is decided again.

The pool state is built from structures kept up to date as events happen, never from a
pass over every job: the idle procs with their pins in arrival order (``idle_procs``), the
running procs and slots (rebuilt only after a start or an end), and the idle jobs by the
cycle they were first seen (the starving check looks at one cycle's jobs). The engine hands
the cycle memory's ``PlanCache`` from decision to decision, as the sidecar does.

Cycle numbers are negotiation ticks (time / ``cycle_s``), so ages count simulated cycles
even where the engine skips unchanged ones.

A run always ends. When nothing runs, nothing is left to arrive and idle jobs remain, the
policy has its aging limit (for the jobs to turn starving), ``unpin_age_cycles`` (for
unmatched pins to be taken back) and ``STALL_GRACE_CYCLES`` more cycles to start one; if
none starts, no job ever will, and the run stops with a :class:`SimulationError` that
names the jobs and why each waits (the cycle's own reason, e.g. "needs 16 cpus, the
largest slot has 8").
"""
from __future__ import annotations

import heapq
import itertools
import math
from collections import defaultdict
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Callable, Mapping, Sequence

from condor_sched.cycle import CycleConfig, CycleDecision, CycleMemory, PlanCache, decide_cycle
from condor_sched.inventory import Device, Inventory, Node, Socket, node_slots
from condor_sched.model import Job, JobKey, JobStatus, PoolState, Resources, Slot, SlotKind, partitionable_slot_of
from condor_sched.modes.planning import PlanSettings, Policy, PolicyKind, assigned_request
from condor_sched.modes.registry import get_policy
from condor_sched.simulate.offload import DeviceRuntime, OffloadModel, RuntimeModel
from condor_sched.simulate.profile_model import SocketShare
from condor_sched.simulate.workloads import SimJob

if TYPE_CHECKING:
    from condor_sched.profiles import ProfileStore

#: Domain of simulated slot names (slotN@node@node.DOMAIN), as in the local pool.
SIM_DOMAIN = "sim"
#: HTCondor's NEGOTIATOR_INTERVAL default, and the shortest and longest a simulation takes.
DEFAULT_CYCLE_S = 60.0
MIN_CYCLE_S, MAX_CYCLE_S = 0.1, 86400.0
#: Cycles an empty pool with idle jobs and no arrivals may go on, beyond aging and unpinning,
#: without a start before the run stops (module docstring).
STALL_GRACE_CYCLES = 3
#: Idle jobs an unplaceable-jobs error names (it says how many more there are).
NAMED_JOBS = 5
#: Bandwidth (GB/s) a socket may appear over-committed by float rounding of the plans.
BW_TOLERANCE_GBS = 1e-6

# Event order at equal times: device events (offload ends, completions) first, then
# arrivals, then the negotiation cycle, so a cycle sees everything that happened at its time.
_DEVICE, _ARRIVAL, _CYCLE = 0, 1, 2


class SimulationError(RuntimeError):
    """A simulation that cannot finish (e.g. a job no device can ever take)."""


def phi_inventory(nodes: int) -> Inventory:
    """Paper 002's cluster (Section V): ``nodes`` servers with one 8 GB, 240-thread Phi.

    Each has two 8-core Xeons (16 host cores); the device slot holds 14 of them for the
    jobs' host phases (one core per job), leaving one per socket slot as our slot layout
    requires.
    """
    if nodes < 1:
        raise ValueError("at least one node")
    return Inventory(tuple(
        Node(name=f"phi{i + 1}", cores=16, memory_mb=65536,
             sockets=(Socket(0, 20, 51.2), Socket(1, 20, 51.2)),
             devices=(Device("mic0", 8192, 240, host_cores=14, host_memory_mb=32768),))
        for i in range(nodes)))


def xeon_inventory(nodes: int) -> Inventory:
    """Paper 000's cluster (Section 6.1): ``nodes`` dual Xeon E5-2680 v4 servers.

    Two sockets of 14 cores and 20 LLC ways each, 128 GB, and 118 GB/s of memory
    bandwidth per node (the STREAM peak, Section 2) split as 59 GB/s per socket.
    """
    if nodes < 1:
        raise ValueError("at least one node")
    return Inventory(tuple(
        Node(name=f"xeon{i + 1}", cores=28, memory_mb=131072,
             sockets=(Socket(0, 20, 59.0), Socket(1, 20, 59.0)))
        for i in range(nodes)))


def first_nodes(inventory: Inventory, nodes: int | None) -> Inventory:
    """The first ``nodes`` nodes of an inventory (all when None): footprint searches shrink it."""
    if nodes is None:
        return inventory
    if not 1 <= nodes <= len(inventory.nodes):
        raise ValueError(f"--nodes must be 1..{len(inventory.nodes)} for this inventory, got {nodes}")
    return Inventory(inventory.nodes[:nodes])


@dataclass(slots=True)
class JobRecord:
    """What happened to one job. ``slot`` is a device job's slot; a parallel job has
    ``allocations`` (socket slot, one proc's dynamic-slot request) per proc, the
    ``nodes`` it ran on, its ``scale`` and its exclusive run time there."""

    job: SimJob
    start_s: float | None = None
    end_s: float | None = None
    slot: str | None = None
    allocations: tuple[tuple[str, Resources], ...] = ()
    nodes: int = 0
    scale: float | None = None
    exclusive_at_scale_s: float | None = None


@dataclass(slots=True)
class DeviceState:
    slot: Slot
    runtime: DeviceRuntime
    used: Resources = field(default_factory=Resources)
    resident: dict[int, SimJob] = field(default_factory=dict)
    last_change_s: float = 0.0
    concurrency_s: dict[int, float] = field(default_factory=lambda: defaultdict(float))
    thread_oversubscribed_s: float = 0.0

    @property
    def free(self) -> Resources:
        return self.slot.total - self.used

    def account(self, now: float) -> None:
        """Integrate concurrency and thread oversubscription up to ``now``."""
        dt = now - self.last_change_s
        if dt > 0:
            self.concurrency_s[len(self.resident)] += dt
            if self.used.device_threads > self.slot.total.device_threads:
                self.thread_oversubscribed_s += dt
        self.last_change_s = now


@dataclass(slots=True)
class SocketState:
    """A SOCKET slot's resources held by running parallel jobs' procs."""

    slot: Slot
    used: Resources = field(default_factory=Resources)

    @property
    def free(self) -> Resources:
        """What is left; bandwidth a float sum brought a rounding error below zero is zero."""
        free = self.slot.total - self.used
        if -BW_TOLERANCE_GBS < free.mem_bw_gbs < 0:
            return replace(free, mem_bw_gbs=0.0)
        return free


@dataclass(slots=True)
class RunResult:
    """Everything a simulation produced; ``metrics.py`` turns it into the JSON object."""

    policy: str
    jobs: list[JobRecord]
    devices: list[DeviceState]
    nodes: int
    cycle_s: float
    makespan_s: float
    cycles: int
    plans: int
    memory_oversubscriptions: int
    refused_starts: int
    invalid_assignments: int
    #: Over all cycles: pins kept waiting for a match, and pins taken back (the live rules).
    pins_kept: int = 0
    unpins: int = 0
    sockets: list[SocketState] = field(default_factory=list)
    #: The profile model's pool runtime (parallel jobs), else None.
    pool: object = None


def _config_for(policy: Policy, settings: PlanSettings, profiles: ProfileStore | None,
                unpin_age_cycles: int) -> CycleConfig:
    """The sidecar's cycle config with ``policy`` in the place of its kind (device or spread);
    the other kind keeps the sidecar's default (knapsack, sns)."""
    config = CycleConfig(get_policy("knapsack"), get_policy("sns"), settings, unpin_age_cycles, profiles)
    if getattr(policy, "kind", PolicyKind.DEVICE) is PolicyKind.SPREAD:
        return replace(config, spread_policy=policy)
    return replace(config, device_policy=policy)


class Simulation:
    """One run: a workload on an inventory under one policy."""

    def __init__(self, jobs: Sequence[SimJob], inventory: Inventory, policy: Policy, *,
                 seed: int = 0, cycle_s: float = DEFAULT_CYCLE_S, model: RuntimeModel | None = None,
                 settings: PlanSettings | None = None, profiles: ProfileStore | None = None,
                 unpin_age_cycles: int = 3, record: bool = False,
                 progress: Callable[[int], None] | None = None, bounded: bool = True) -> None:
        if not MIN_CYCLE_S <= cycle_s <= MAX_CYCLE_S:
            raise ValueError(f"the cycle interval must be {MIN_CYCLE_S} to {MAX_CYCLE_S:g} s, got {cycle_s!r}")
        self.policy = policy
        self.cycle_s = cycle_s
        self.seed = seed
        self.base_settings = replace(settings or PlanSettings(), seed=seed, deterministic=True)
        self.config = replace(_config_for(policy, self.base_settings, profiles, unpin_age_cycles), bounded=bounded)
        self.progress = progress
        self.nodes = len(inventory.nodes)
        model = model or OffloadModel()
        self.records = {j.index: JobRecord(j) for j in jobs}
        if len(self.records) != len(jobs):
            raise ValueError("job indexes repeat")
        self.by_key: dict[JobKey, SimJob] = {k: j for j in jobs for k in j.proc_keys()}
        has_device_jobs = any(not j.is_parallel for j in jobs)
        has_parallel_jobs = any(j.is_parallel for j in jobs)
        self.slots: dict[str, Slot] = {}
        self.devices: dict[str, DeviceState] = {}
        self.sockets: dict[str, SocketState] = {}
        for node in inventory.nodes:
            for slot in node_slots(node, SIM_DOMAIN):
                self.slots[slot.name] = slot
                if slot.kind is SlotKind.DEVICE and has_device_jobs:
                    self.devices[slot.name] = DeviceState(
                        slot, model.device(slot.total.device_threads, self, record))
                elif slot.kind is SlotKind.SOCKET:
                    self.sockets[slot.name] = SocketState(slot)
        if has_device_jobs and not self.devices:
            raise SimulationError("the inventory has no device")
        self.pool = None
        if has_parallel_jobs:
            if not hasattr(model, "pool"):
                raise SimulationError(f"runtime model {model.name!r} cannot run parallel CPU jobs")
            self.pool = model.pool([s.slot for s in self.sockets.values()],
                                   max(n.cores for n in inventory.nodes), self, record)
        self._heap: list = []
        #: The running procs and the slots as the cycle sees them, until a start or an end.
        self._running_pool: tuple[tuple[Job, ...], tuple[Slot, ...]] | None = None
        self._started = False
        self._seq = itertools.count()
        self.now = 0.0
        self.idle: dict[int, SimJob] = {}
        self.future_arrivals = 0
        self._arrivals: list[float] = []
        self.running = 0
        self.finished = 0
        self.dirty = True
        #: The cycle each idle job was first seen (the cycle memory's first-seen map).
        self.first_seen_cycle: Mapping[JobKey, int] = {}
        #: What earlier cycles derived from the jobs (``CycleMemory.cache``).
        self._cache: PlanCache | None = None
        #: Idle procs' pins: slot, cycle of the pin and what the proc's dynamic slot will take.
        self.pins: dict[JobKey, tuple[str, int, Resources]] = {}
        #: Each arrived job's proc records (idle), per job index.
        self.proc_records: dict[int, tuple[Job, ...]] = {}
        #: Running jobs' records as the cycle sees them, per job index.
        self.running_records: dict[int, tuple[Job, ...]] = {}
        #: The idle procs as the cycle sees them (with their pins), oldest job first: arrivals
        #: come in (arrival, index) order, so insertion order is the order of the pool state.
        self.idle_procs: dict[JobKey, Job] = {}
        #: Jobs that arrived since the last decided cycle, and the idle jobs by the cycle
        #: they were first seen (the starving check looks at one bucket, not every idle job).
        self._unseen: list[int] = []
        self._seen_at: dict[int, list[int]] = {}
        self.cycles = 0
        self.plans = 0
        self.memory_oversubscriptions = 0
        self.refused_starts = 0
        self.invalid_assignments = 0
        self.pins_kept = 0
        self.unpins = 0
        self.unpin_age_cycles = unpin_age_cycles
        #: Why each idle proc waits, as the last decided cycle said.
        self.reasons: Mapping[JobKey, str] = {}
        #: The first cycle of the current stretch with idle jobs, nothing running, nothing to
        #: arrive and no start, and the number of jobs started when it began.
        self._stalled_since: tuple[int, int] | None = None

    # --- the Clock a runtime model sees ----------------------------------------------------

    def schedule(self, time_s: float, action: Callable[[float], None], order: int = _DEVICE) -> None:
        heapq.heappush(self._heap, (time_s, order, next(self._seq), action))

    def job_finished(self, job: SimJob, time_s: float) -> None:
        rec = self.records[job.index]
        if rec.start_s is None or rec.end_s is not None:
            raise SimulationError(f"job {job.key} finished without running (or twice)")
        rec.end_s = time_s
        if job.is_parallel:
            for slot, request in rec.allocations:
                self.sockets[slot].used = self.sockets[slot].used - request
        else:
            device = self.devices[rec.slot]
            device.account(time_s)
            device.used = device.used - job.request
            del device.resident[job.index]
        del self.running_records[job.index]
        self._running_pool = None
        self.running -= 1
        self.finished += 1
        self.dirty = True
        if self.progress:
            self.progress(1)

    # --- the loop --------------------------------------------------------------------------

    def _arrive(self, job: SimJob, now: float) -> None:
        self.future_arrivals -= 1
        self.idle[job.index] = job
        self.proc_records[job.index] = procs = job.to_jobs()
        for proc in procs:
            self.idle_procs[proc.key] = proc
        self._unseen.append(job.index)
        self.dirty = True

    def pool_state(self) -> PoolState:
        """The pool as the cycle sees it: idle procs (oldest first) with their pins, running
        jobs on their dynamic slots, and slots with their free amounts and children."""
        if self._running_pool is None:
            running = tuple(job for jobs in self.running_records.values() for job in jobs)
            children: dict[str, list[str]] = {}
            for job in running:
                children.setdefault(partitionable_slot_of(job.remote_slot), []).append(job.remote_slot)  # type: ignore[arg-type]
            slots = []
            for name, slot in self.slots.items():
                state = self.devices.get(name) or self.sockets.get(name)
                slots.append(replace(slot, free=state.free if state else slot.free,
                                     children=tuple(children.get(name, ()))))
            self._running_pool = running, tuple(slots)
        running, slots = self._running_pool
        return PoolState(tuple(self.idle_procs.values()) + running, slots)

    def _cycle(self, tick: int, now: float) -> None:
        self.cycles += 1
        next_tick = tick + 1
        self._check_stall(tick)
        if self.idle and (self.dirty or self.pins or self._someone_turns_starving(tick)):
            self._decide(tick, now)
        elif self.idle and not self.running and not self.future_arrivals:
            # Nothing will change but aging: jump to the next cycle at which a job turns
            # starving, or give up when none will.
            later = [self._first_seen(j, tick) + self._age_limit(j) + 1 for j in self.idle.values()]
            later = [t for t in later if t > tick]
            if not later:
                raise self._unplaceable()
            next_tick = min(later)
        if not self.idle:
            # Nothing to place until the next arrival: skip the empty cycles up to it.
            if not self.future_arrivals:
                return
            next_tick = max(next_tick, math.ceil(self._arrivals[-self.future_arrivals] / self.cycle_s))
        self.schedule(next_tick * self.cycle_s, lambda t, n=next_tick: self._cycle(n, t), _CYCLE)

    def _first_seen(self, job: SimJob, tick: int) -> int:
        """The cycle the first of ``job``'s procs was seen (the cycle memory keys procs)."""
        return min(self.first_seen_cycle.get(k, tick) for k in job.proc_keys())

    def _age_limit(self, job: SimJob) -> int:
        """The aging limit (cycles) of ``job``'s kind of policy."""
        s = self.base_settings
        return s.spread_age_limit() if job.is_parallel else s.age_limit_cycles

    def _someone_turns_starving(self, tick: int) -> bool:
        """Some idle job was first seen its aging limit + 1 cycles ago (one bucket per limit)."""
        s = self.base_settings
        for limit in {s.age_limit_cycles, s.spread_age_limit()}:
            bucket = self._seen_at.get(tick - limit - 1, ())
            if any(index in self.idle and self._age_limit(self.idle[index]) == limit for index in bucket):
                return True
        return False

    def _note_first_seen(self, tick: int) -> None:
        """File the jobs the last decision saw for the first time under their first-seen cycle."""
        unseen = []
        for index in self._unseen:
            job = self.idle.get(index)
            if job is None:
                continue
            if not any(k in self.first_seen_cycle for k in job.proc_keys()):
                unseen.append(index)
                continue
            self._seen_at.setdefault(self._first_seen(job, tick), []).append(index)
        self._unseen = unseen

    def _check_stall(self, tick: int) -> None:
        """Raise :meth:`_unplaceable` once an empty pool with idle jobs and no arrivals has
        gone without a start for longer than aging and unpinning take (module docstring)."""
        started = self.running + self.finished
        if not self.idle or self.running or self.future_arrivals:
            self._stalled_since = None
            return
        if self._stalled_since is None or self._stalled_since[1] != started:
            self._stalled_since = (tick, started)
        s = self.base_settings
        patience = max(s.age_limit_cycles, s.spread_age_limit()) + self.unpin_age_cycles + STALL_GRACE_CYCLES
        if tick - self._stalled_since[0] > patience:
            raise self._unplaceable()

    def _unplaceable(self) -> SimulationError:
        """The error that ends a run whose idle jobs no cycle will ever start, naming them."""
        waiting = sorted(self.idle.values(), key=lambda j: j.index)
        described = []
        for job in waiting[:NAMED_JOBS]:
            what = (f"{job.procs} procs of {job.program}" if job.is_parallel
                    else f"{job.device_memory_mb} MB, {job.device_threads} threads of {job.device_kind}")
            key = job.proc_keys()[0]
            reason = self.reasons.get(key) or "no cycle placed it"
            if key in self.pins:
                reason = f"{reason}; its pins never fit ({self.refused_starts + self.memory_oversubscriptions} " \
                         "starts refused)"
            described.append(f"{key} ({what}): {reason}")
        more = f"; and {len(waiting) - NAMED_JOBS} more" if len(waiting) > NAMED_JOBS else ""
        return SimulationError(f"policy {self.policy.name!r} can place none of the {len(waiting)} idle jobs on an "
                               f"empty pool with no job to come: {'; '.join(described)}{more}")

    def decide(self, memory: CycleMemory) -> CycleDecision:
        """The sidecar's cycle on the simulated pool as it is now (nothing applied)."""
        return decide_cycle(self.pool_state(), memory, self.config)

    def _decide(self, tick: int, now: float) -> None:
        """One cycle: decide on the pool state, write unpins and pins, then start what is
        pinned and fits (the simulated negotiator and startd)."""
        self.plans += 1
        decision = self.decide(CycleMemory(tick, self.first_seen_cycle, self._cache))
        self.first_seen_cycle = decision.first_seen
        self._cache = decision.cache
        self.reasons = decision.reasons
        self.pins_kept += len(decision.kept)
        self.unpins += len(decision.unpins)
        for unpin in decision.unpins:
            self._unpin(unpin.job)
        for plan in decision.plans:
            for a in plan.assignments:
                job = self.by_key.get(a.job)
                if job is None or job.index not in self.idle or a.slot not in self.slots:
                    self.invalid_assignments += 1
                    continue
                proc = self._proc(job, a.job)
                self.pins[a.job] = pin = (a.slot, tick, assigned_request(proc, a))
                self.idle_procs[a.job] = replace(proc, pinned_slot=pin[0], pinned_cycle=pin[1], request=pin[2])
        self.dirty = self._start_pinned(now)
        self._note_first_seen(tick)

    def _unpin(self, key: JobKey) -> None:
        """Clear an idle proc's pin (if any): the cycle sees its own record again."""
        if self.pins.pop(key, None) is not None and key in self.idle_procs:
            self.idle_procs[key] = self._proc(self.by_key[key], key)

    def _leave_idle(self, job: SimJob) -> None:
        del self.idle[job.index]
        for key in job.proc_keys():
            del self.idle_procs[key]

    def _proc(self, job: SimJob, key: JobKey) -> Job:
        return self.proc_records[job.index][key.proc if job.is_parallel else 0]

    def _start_pinned(self, now: float) -> bool:
        """Start every pinned idle job whose pins fit now; True when one started."""
        started = False
        pinned: dict[int, list[tuple[JobKey, str, Resources]]] = {}
        for key, (slot, _, request) in self.pins.items():
            pinned.setdefault(self.by_key[key].index, []).append((key, slot, request))
        for index, pins in sorted(pinned.items()):
            job = self.records[index].job
            if job.is_parallel:
                started = self._start_parallel(job, pins, now) or started
                continue
            key, slot, _ = pins[0]
            device = self.devices.get(slot)
            if device is None:
                self.invalid_assignments += 1
                self._unpin(key)
                continue
            free = device.free
            if job.device_memory_mb > free.device_memory_mb:
                self.memory_oversubscriptions += 1
                continue
            if job.request.cpus > free.cpus or job.request.memory_mb > free.memory_mb:
                self.refused_starts += 1
                continue
            del self.pins[key]
            self._start(job, device, slot, now)
            started = True
        return started

    def _start_parallel(self, job: SimJob, pins: list[tuple[JobKey, str, Resources]], now: float) -> bool:
        """Start a parallel job whose every proc is pinned, if all fit (module docstring)."""
        if sorted(key for key, _, _ in pins) != list(job.proc_keys()) or any(s not in self.sockets for _, s, _ in pins):
            self.invalid_assignments += len(pins)
            for key, _, _ in pins:
                self._unpin(key)
            return False
        free = {name: s.free for name, s in self.sockets.items()}
        for _, slot, request in pins:
            left = free[slot] - request
            if (left.cpus < 0 or left.memory_mb < 0 or left.llc_ways < 0
                    or left.mem_bw_gbs < -BW_TOLERANCE_GBS or request.llc_ways < 0 or request.mem_bw_gbs < 0):
                self.refused_starts += 1
                return False
            free[slot] = left
        self._leave_idle(job)
        shares: dict[str, list[int]] = {}
        for key, slot, request in pins:
            del self.pins[key]
            self.sockets[slot].used = self.sockets[slot].used + request
            procs_ways = shares.setdefault(slot, [0, 0])
            procs_ways[0] += 1
            procs_ways[1] += request.llc_ways
        nodes = len({self.slots[s].machine for s in shares})
        rec = self.records[job.index]
        rec.start_s, rec.allocations, rec.nodes = now, tuple((slot, request) for _, slot, request in pins), nodes
        self.running_records[job.index] = tuple(
            self._running_record(key, slot, request, now) for key, slot, request in pins)
        self._running_pool = None
        self.running += 1
        rec.scale, rec.exclusive_at_scale_s = self.pool.admit(
            job, [SocketShare(s, p, w) for s, (p, w) in sorted(shares.items())], nodes, now)
        return True

    def _running_record(self, key: JobKey, slot: str, request: Resources, now: float) -> Job:
        """A started proc as the cycle sees it: running in its own dynamic slot of ``slot``."""
        head, at, rest = slot.partition("@")
        job = self.by_key[key]
        return replace(self._proc(job, key), status=JobStatus.RUNNING, request=request,
                       remote_slot=f"{head}_{key.cluster}_{key.proc}{at}{rest}", started_at_s=int(now))

    def _start(self, job: SimJob, device: DeviceState, slot: str, now: float) -> None:
        self._leave_idle(job)
        rec = self.records[job.index]
        rec.start_s, rec.slot = now, slot
        device.account(now)
        device.used = device.used + job.request
        device.resident[job.index] = job
        self.running += 1
        self.running_records[job.index] = (self._running_record(job.key, slot, job.request, now),)
        self._running_pool = None
        device.runtime.admit(job, now)

    def advance(self, until_s: float = math.inf) -> None:
        """Process every event up to ``until_s`` (the first call schedules the arrivals)."""
        if not self._started:
            self._started = True
            for job in sorted(self.records.values(), key=lambda r: (r.job.arrival_s, r.job.index)):
                self.future_arrivals += 1
                self._arrivals.append(job.job.arrival_s)
                self.schedule(job.job.arrival_s, lambda t, j=job.job: self._arrive(j, t), _ARRIVAL)
            self.schedule(0.0, lambda t: self._cycle(0, t), _CYCLE)
        while self._heap and self.finished < len(self.records) and self._heap[0][0] <= until_s:
            time_s, _, _, action = heapq.heappop(self._heap)
            self.now = time_s
            action(time_s)

    def run(self) -> RunResult:
        self.advance()
        makespan = max((r.end_s for r in self.records.values()), default=0.0)
        for device in self.devices.values():
            device.account(makespan)
        return RunResult(
            policy=self.policy.name, jobs=[self.records[i] for i in sorted(self.records)],
            devices=list(self.devices.values()), nodes=self.nodes, cycle_s=self.cycle_s,
            makespan_s=makespan, cycles=self.cycles, plans=self.plans,
            memory_oversubscriptions=self.memory_oversubscriptions, refused_starts=self.refused_starts,
            invalid_assignments=self.invalid_assignments, sockets=list(self.sockets.values()), pool=self.pool,
            pins_kept=self.pins_kept, unpins=self.unpins)


def simulate(jobs: Sequence[SimJob], inventory: Inventory, policy: Policy, **options) -> RunResult:
    """Run ``jobs`` on ``inventory`` under ``policy`` (options: see :class:`Simulation`)."""
    return Simulation(jobs, inventory, policy, **options).run()
