"""The discrete-event simulator: arrivals, negotiation cycles, placements, completions.

Nodes and slots come from the same inventory records as the local pool
(:func:`condor_sched.inventory.node_slots`); each negotiation cycle hands the idle jobs and
the slots, with their current free resources, to the very policy object the sidecar uses
(``get_policy(name).plan``). A placement starts at once (the simulated schedd never
refuses a match); the runtime model then runs the job on its device.

Checks the engine makes on every plan, as a startd would: a job may start only once,
only on a device slot, and never beyond the slot's free device memory (a plan that would
exceed it is counted in ``memory_oversubscriptions`` and that start refused) or host
cores/memory (counted in ``refused_starts``). Device threads may be oversubscribed by a
plan (the random policy ignores them); the runtime model serialises offloads, and the
time during which a device's resident jobs ask for more threads than it has is summed in
``thread_oversubscribed_s``.

Parallel CPU jobs (paper 000) start whole or not at all: every proc of the job must be
assigned in the same plan to a SOCKET slot (else its assignments count as
``invalid_assignments``), and each proc's dynamic slot (1 cpu, its memory, the
``llc_ways`` and ``mem_bw_gbs`` of the assignment's details) must fit the slot's free
resources with the job's other procs (else the start is refused, ``refused_starts``).
The pool-wide runtime of the model (``profile_model.py``) then runs the job.

Cycles in which nothing changed since the previous plan (no arrival, completion or start)
are not re-planned: a deterministic policy would return the same plan. The exception is
aging (``PlanSettings.age_limit_cycles``, ``extra["first_seen_cycle"]``, which the engine
keeps as the sidecar does): a cycle at which some idle job turns starving is re-planned.
"""
from __future__ import annotations

import heapq
import itertools
import math
from collections import defaultdict
from dataclasses import dataclass, field, replace
from typing import Callable, Sequence

from condor_sched.inventory import Device, Inventory, Node, Socket, node_slots
from condor_sched.model import Assignment, JobKey, Resources, Slot, SlotKind
from condor_sched.policies.base import PlanSettings, Policy
from condor_sched.simulate.offload import DeviceRuntime, OffloadModel, RuntimeModel
from condor_sched.simulate.profile_model import SocketShare
from condor_sched.simulate.workloads import SimJob

#: Domain of simulated slot names (slotN@node@node.DOMAIN), as in the local pool.
SIM_DOMAIN = "sim"
#: HTCondor's NEGOTIATOR_INTERVAL default.
DEFAULT_CYCLE_S = 60.0
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
        return self.slot.total - self.used


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
    sockets: list[SocketState] = field(default_factory=list)
    #: The profile model's pool runtime (parallel jobs), else None.
    pool: object = None


class Simulation:
    """One run: a workload on an inventory under one policy."""

    def __init__(self, jobs: Sequence[SimJob], inventory: Inventory, policy: Policy, *,
                 seed: int = 0, cycle_s: float = DEFAULT_CYCLE_S, model: RuntimeModel | None = None,
                 settings: PlanSettings | None = None, record: bool = False,
                 progress: Callable[[int], None] | None = None) -> None:
        if cycle_s <= 0:
            raise ValueError("the cycle interval must be > 0 s")
        self.policy = policy
        self.cycle_s = cycle_s
        self.seed = seed
        self.base_settings = settings or PlanSettings()
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
        self._seq = itertools.count()
        self.now = 0.0
        self.idle: dict[int, SimJob] = {}
        self.future_arrivals = 0
        self._arrivals: list[float] = []
        self.running = 0
        self.finished = 0
        self.dirty = True
        #: The cycle each job was first offered to the policy (its aging rule reads it,
        #: as the sidecar's does).
        self.first_seen_cycle: dict[JobKey, int] = {}
        self.cycles = 0
        self.plans = 0
        self.memory_oversubscriptions = 0
        self.refused_starts = 0
        self.invalid_assignments = 0

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
        self.running -= 1
        self.finished += 1
        self.dirty = True
        if self.progress:
            self.progress(1)

    # --- the loop --------------------------------------------------------------------------

    def _arrive(self, job: SimJob, now: float) -> None:
        self.future_arrivals -= 1
        self.idle[job.index] = job
        self.dirty = True

    def _free_slots(self) -> list[Slot]:
        slots = []
        for name, slot in self.slots.items():
            state = self.devices.get(name) or self.sockets.get(name)
            slots.append(slot.with_free(state.free) if state else slot)
        return slots

    def _cycle(self, tick: int, now: float) -> None:
        self.cycles += 1
        next_tick = tick + 1
        if self.idle and (self.dirty or self._someone_turns_starving(tick)):
            self._plan(tick, now)
        elif self.idle and not self.running and not self.future_arrivals:
            # Nothing will change but aging: jump to the next cycle at which a job turns
            # starving, or give up when none will.
            limit = self.base_settings.age_limit_cycles
            later = [self.first_seen_cycle.get(j.key, tick) + limit + 1 for j in self.idle.values()]
            later = [t for t in later if t > tick]
            if not later:
                stuck = ", ".join(str(j.key) for j in list(self.idle.values())[:5])
                raise SimulationError(f"policy {self.policy.name!r} can place none of the {len(self.idle)} "
                                      f"idle jobs on an empty pool (e.g. {stuck})")
            next_tick = min(later)
        if not self.idle:
            # Nothing to place until the next arrival: skip the empty cycles up to it.
            if not self.future_arrivals:
                return
            next_tick = max(next_tick, math.ceil(self._arrivals[-self.future_arrivals] / self.cycle_s))
        self.schedule(next_tick * self.cycle_s, lambda t, n=next_tick: self._cycle(n, t), _CYCLE)

    def _someone_turns_starving(self, tick: int) -> bool:
        limit = self.base_settings.age_limit_cycles
        return any(tick - self.first_seen_cycle.get(j.key, tick) == limit + 1 for j in self.idle.values())

    def _plan(self, tick: int, now: float) -> None:
        self.plans += 1
        idle_jobs = [p for j in sorted(self.idle.values(), key=lambda j: (j.arrival_s, j.index)) for p in j.to_jobs()]
        for job in idle_jobs:
            self.first_seen_cycle.setdefault(job.key, tick)
        settings = replace(self.base_settings, cycle=tick, seed=self.seed, deterministic=True,
                           extra={**self.base_settings.extra, "first_seen_cycle": self.first_seen_cycle})
        plan = self.policy.plan(idle_jobs, self._free_slots(), settings)
        started = False
        parallel: dict[int, list[Assignment]] = {}
        for a in plan.assignments:
            job = self.by_key.get(a.job)
            if job is not None and job.is_parallel:
                parallel.setdefault(job.index, []).append(a)
                continue
            device = self.devices.get(a.slot)
            if job is None or job.index not in self.idle or device is None:
                self.invalid_assignments += 1
                continue
            free = device.free
            if job.device_memory_mb > free.device_memory_mb:
                self.memory_oversubscriptions += 1
                continue
            if job.request.cpus > free.cpus or job.request.memory_mb > free.memory_mb:
                self.refused_starts += 1
                continue
            self._start(job, device, a.slot, now)
            started = True
        for index, assignments in parallel.items():
            started = self._start_parallel(self.records[index].job, assignments, now) or started
        self.dirty = started

    def _start_parallel(self, job: SimJob, assignments: list[Assignment], now: float) -> bool:
        """Start a parallel job whose every proc the plan assigned, if all fit (see above)."""
        keys = [a.job for a in assignments]
        if (job.index not in self.idle or sorted(keys) != list(job.proc_keys())
                or any(a.slot not in self.sockets for a in assignments)):
            self.invalid_assignments += len(assignments)
            return False
        free = {name: s.free for name, s in self.sockets.items()}
        allocations = []
        for a in assignments:
            request = job.request + Resources(llc_ways=int(a.details.get("llc_ways", 0)),
                                              mem_bw_gbs=float(a.details.get("mem_bw_gbs", 0.0)))
            left = free[a.slot] - request
            if (left.cpus < 0 or left.memory_mb < 0 or left.llc_ways < 0
                    or left.mem_bw_gbs < -BW_TOLERANCE_GBS or request.llc_ways < 0 or request.mem_bw_gbs < 0):
                self.refused_starts += 1
                return False
            free[a.slot] = left
            allocations.append((a.slot, request))
        del self.idle[job.index]
        for slot, request in allocations:
            self.sockets[slot].used = self.sockets[slot].used + request
        shares: dict[str, list[int]] = {}
        for a in assignments:
            procs_ways = shares.setdefault(a.slot, [0, 0])
            procs_ways[0] += 1
            procs_ways[1] = max(procs_ways[1], int(a.details.get("group_llc_ways", a.details.get("llc_ways", 0))))
        nodes = len({self.slots[s].machine for s in shares})
        rec = self.records[job.index]
        rec.start_s, rec.allocations, rec.nodes = now, tuple(allocations), nodes
        self.running += 1
        rec.scale, rec.exclusive_at_scale_s = self.pool.admit(
            job, [SocketShare(s, p, w) for s, (p, w) in sorted(shares.items())], nodes, now)
        return True

    def _start(self, job: SimJob, device: DeviceState, slot: str, now: float) -> None:
        del self.idle[job.index]
        rec = self.records[job.index]
        rec.start_s, rec.slot = now, slot
        device.account(now)
        device.used = device.used + job.request
        device.resident[job.index] = job
        self.running += 1
        device.runtime.admit(job, now)

    def run(self) -> RunResult:
        for job in sorted(self.records.values(), key=lambda r: (r.job.arrival_s, r.job.index)):
            self.future_arrivals += 1
            self._arrivals.append(job.job.arrival_s)
            self.schedule(job.job.arrival_s, lambda t, j=job.job: self._arrive(j, t), _ARRIVAL)
        self.schedule(0.0, lambda t: self._cycle(0, t), _CYCLE)
        while self._heap and self.finished < len(self.records):
            time_s, _, _, action = heapq.heappop(self._heap)
            self.now = time_s
            action(time_s)
        makespan = max((r.end_s for r in self.records.values()), default=0.0)
        for device in self.devices.values():
            device.account(makespan)
        return RunResult(
            policy=self.policy.name, jobs=[self.records[i] for i in sorted(self.records)],
            devices=list(self.devices.values()), nodes=self.nodes, cycle_s=self.cycle_s,
            makespan_s=makespan, cycles=self.cycles, plans=self.plans,
            memory_oversubscriptions=self.memory_oversubscriptions, refused_starts=self.refused_starts,
            invalid_assignments=self.invalid_assignments, sockets=list(self.sockets.values()), pool=self.pool)


def simulate(jobs: Sequence[SimJob], inventory: Inventory, policy: Policy, **options) -> RunResult:
    """Run ``jobs`` on ``inventory`` under ``policy`` (options: see :class:`Simulation`)."""
    return Simulation(jobs, inventory, policy, **options).run()
