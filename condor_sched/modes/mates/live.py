"""Paper 001's live mapping: SD-Policy guests on single nodes of an HTCondor pool (pure).

Only jobs that opt in take part: ``+CoSchedMalleable = true`` with an
``AllowedExecuteDuration`` (the requested time the policy reads), requesting a whole node
(``RequestCpus`` = a node slot's cores: paper 001's jobs are whole-node). HTCondor starts
them statically on a node's NODE slot as any job; this module's view (``MatesView``, under
the shared mechanics of ``mode_cycle.py``) decides only the malleable starts, each cycle:

* a **guest** is an idle malleable job the ``sd`` planner starts on part of the cores of a
  running malleable **mate**: the sidecar pins it to the mate's node's GUEST slot (an
  overlapping slot whose START opens only to pinned guests, config.d/20) and names the mate
  (``CoSchedPinMate``) for the node agent, which moves the cores with cgroup-v2 cpusets;
* the mate's ``AllowedExecuteDuration`` (which the shadow enforces) grows by its predicted
  increase (Eq. 5/6 worst case, ``sd.py``), written with SetDirty so its shadow picks it up;
  its old value is kept in ``CoSchedPinMateBaseDuration`` and its guest in ``CoSchedPinGuest``.

Rules of the live mapping (ours; docs/sd-policy.md):

* A node is planned as the paper's node when its NODE slot runs one malleable whole-node job
  (a possible mate) or nothing; other jobs on it only make it busy until their requested
  ends (never, without an ``AllowedExecuteDuration``). Node slots of one size are planned
  together; each size apart.
* Mates need a usable GUEST slot on their node (its agent advertises ``CoSchedNodeSharing =
  True``: it can set cpusets) with no guest on it, and serve once (a job with
  ``CoSchedPinGuest`` is never a mate again).
* A mate is lengthened before its guest is pinned; its limit goes back to its base when its
  guest's pin is dropped before the guest ran on its node (unpinned, refused, started
  elsewhere). A guest that left the queue may have run: its mate keeps the longer limit.
* A job a node refused as a guest (the agent could not give it cores) is not pinned as a guest
  again: it waits for a static start, and its reason says so.
* With ``COSCHED_INTERFERENCE``, a guest whose program the model finds ill-matched with one on
  the mate's node is not pinned (``guard.CycleGuard.claim``): the mate keeps its limit and the
  job waits for a whole node, its reason naming the pair.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Mapping, Sequence

import classad2

from condor_sched.edits import PIN_ATTRS, UNDEFINED, JobChange
from condor_sched.model import (
    EXECUTE_DURATION_ATTR, HOLDS_A_SLOT, MAX_EXECUTE_DURATION_S, PIN_CYCLE_ATTR, PIN_GUEST_ATTR, PIN_MATE_ATTR,
    PIN_MATE_BASE_ATTR, PIN_SLOT_ATTR, PIN_TIME_ATTR,
    PIN_MATE_INCREASE_ATTR,
    Job, JobKey, Plan, PoolState, Slot, SlotKind, Unplaced, duration_s, partitionable_slot_of,
)
from condor_sched.modes.interface import ModeContext, ModeJobs, ModePlan
from condor_sched.modes.planning import PlanSettings, Policy
from condor_sched.modes.mates.cpu_nodes import (
    NodeCluster,
    Role,
    RunningNodeJob,
    RuntimeModel,
    WaitingJob,
    stretched_s,
)
from condor_sched.modes.mates.sd import guest_cores



@dataclass(frozen=True, slots=True)
class GuestPin:
    """Pin ``job`` to ``slot`` (its mate's node's GUEST slot) as ``mate``'s guest; the mate's
    limit grows by ``increase_s``."""

    job: JobKey
    slot: str
    mate: JobKey
    increase_s: int
    predicted_end_s: float

    @property
    def needs(self) -> JobKey:
        """The mate whose longer limit must be written before this pin."""
        return self.mate

    def change(self, cycle: int, now_s: float) -> JobChange:
        """Cycle, time, mate and increase first, the slot last (that write pins)."""
        return JobChange(self.job, ((PIN_CYCLE_ATTR, str(cycle)), (PIN_TIME_ATTR, str(int(now_s))),
                                    (PIN_MATE_ATTR, classad2.quote(self.mate.job_id)),
                                    (PIN_MATE_INCREASE_ATTR, str(self.increase_s)),
                                    (PIN_SLOT_ATTR, classad2.quote(self.slot))))

    def describe(self) -> str:
        return f"{self.slot} as guest of {self.mate}"


@dataclass(frozen=True, slots=True)
class MateChange:
    """Attribute writes to a mate, in order (``AllowedExecuteDuration`` is forwarded to the
    shadow), and why."""

    job: JobKey
    writes: tuple[tuple[str, str], ...]
    why: str

    def change(self) -> JobChange:
        return JobChange(self.job, self.writes)


@dataclass(frozen=True, slots=True)
class NodeSharingDecision:
    """What a cycle decides for malleable jobs: guest pins kept, guests unpinned (key,
    reason), changes to mates (lengthen before the pins, restore after the unpins), new guest
    pins, and each idle malleable job's reason."""

    kept: tuple[JobKey, ...] = ()
    unpins: tuple[tuple[JobKey, str], ...] = ()
    lengthen: tuple[MateChange, ...] = ()
    restore: tuple[MateChange, ...] = ()
    pins: tuple[GuestPin, ...] = ()
    reasons: Mapping[JobKey, str] = field(default_factory=dict)
    plans: tuple[Plan, ...] = ()


def guest_unpin_writes() -> tuple[tuple[str, str], ...]:
    """Everything a guest pin writes, cleared; the slot first (that write unpins)."""
    return tuple((a, UNDEFINED) for a in (*PIN_ATTRS, PIN_MATE_ATTR, PIN_MATE_INCREASE_ATTR))


def _runtime(job: Job) -> int | None:
    return duration_s(job.requested_runtime_s)


def _node_of(job: Job, slots: Mapping[str, Slot]) -> str | None:
    """The machine whose slot ``job`` runs on (None: not running on a known slot)."""
    if job.status not in HOLDS_A_SLOT or not job.remote_slot:
        return None
    slot = slots.get(partitionable_slot_of(job.remote_slot))
    return slot.machine if slot is not None else None


def state_time(state: PoolState) -> float:
    """The time of an observation: when it was read, else the newest time it holds."""
    if state.observed_at_s is not None:
        return float(state.observed_at_s)
    times = [s.updated_at_s for s in state.slots] + [j.started_at_s or 0 for j in state.jobs]
    return float(max(times, default=0))


class _Live:
    """The pool as node sharing sees it: node and guest slots, malleable jobs, who hosts whom."""

    def __init__(self, state: PoolState) -> None:
        self.slots = {s.name: s for s in state.slots}
        self.node_slots = [s for s in state.slots if s.kind is SlotKind.NODE]
        self.guest_slot = {s.machine: s for s in state.slots if s.kind is SlotKind.GUEST}
        self.by_text = {str(j.key): j for j in state.jobs}
        self.on_node: dict[str, list[Job]] = {}
        self.guest_on: dict[str, Job] = {}  # machine -> guest running on its guest slot
        for job in state.jobs:
            slot = self.slots.get(partitionable_slot_of(job.remote_slot)) if job.remote_slot else None
            if job.status not in HOLDS_A_SLOT or slot is None:
                continue
            if slot.kind is SlotKind.NODE:
                self.on_node.setdefault(slot.machine, []).append(job)
            elif slot.kind is SlotKind.GUEST:
                self.guest_on[slot.machine] = job

    def mate_of(self, guest: Job, machine: str) -> Job | None:
        """The malleable job ``guest`` names (``CoSchedPinMate``) running on ``machine``'s node slot."""
        name = guest.attributes.get(PIN_MATE_ATTR)
        for job in self.on_node.get(machine, ()):
            if job.key.job_id == name and job.malleable:
                return job
        return None


def _named_by_mate(guest: Job, live: _Live) -> bool:
    """Whether the mate ``guest`` names names it back (``CoSchedPinGuest``): its guest of record."""
    slot = live.slots.get(guest.pinned_slot or "")
    mate = live.mate_of(guest, slot.machine) if slot is not None else None
    return mate is not None and mate.attributes.get(PIN_GUEST_ATTR) == str(guest.key)


def _slot_taken(guest: Job, live: _Live, kept: Sequence[Job]) -> str | None:
    """Why a pinned guest cannot keep its pin because its guest slot is another's: a mate
    hosts one guest (paper 001), so one guest runs or is kept pinned per guest slot."""
    slot = live.slots[guest.pinned_slot]  # type: ignore[index]
    running = live.guest_on.get(slot.machine)
    if running is not None and running.key != guest.key:
        return f"guest slot {slot.name} already runs guest {running.key}"
    for other in kept:
        if other.pinned_slot == guest.pinned_slot:
            return f"its mate already hosts guest {other.key} on {slot.name}"
    return None


def _restore(mate: Job, why: str) -> MateChange:
    """Give the mate back its base limit; a base that is no limit (``duration_s``: the reader
    refuses it too) is not written back, and the mate keeps the limit it has."""
    base = duration_s(mate.attributes.get(PIN_MATE_BASE_ATTR))
    writes = ((EXECUTE_DURATION_ATTR, str(base)),) if base is not None else ()
    return MateChange(mate.key, (*writes, (PIN_GUEST_ATTR, UNDEFINED), (PIN_MATE_BASE_ATTR, UNDEFINED)), why)


def lengthen_change(mate: Job, guest: JobKey, increase_s: int) -> MateChange:
    """Base first (alone it changes nothing), the guest, then the longer limit (at most
    ``MAX_EXECUTE_DURATION_S``)."""
    base = duration_s(mate.attributes.get(PIN_MATE_BASE_ATTR)) or _runtime(mate) or 0
    longer = min(base + max(0, increase_s), MAX_EXECUTE_DURATION_S)
    return MateChange(mate.key, ((PIN_MATE_BASE_ATTR, str(base)), (PIN_GUEST_ATTR, classad2.quote(str(guest))),
                                 (EXECUTE_DURATION_ATTR, str(longer))),
                      f"hosts guest {guest}: limit {base} s + {increase_s} s")


def _hosted(mate: Job, guest: Job, live: _Live, kept: set[JobKey]) -> bool:
    """Whether ``guest`` runs on, or is pinned (and kept) to, ``mate``'s node's guest slot."""
    machine = _node_of(mate, live.slots)
    if machine is None or guest.attributes.get(PIN_MATE_ATTR) != mate.key.job_id:
        return False
    if live.guest_on.get(machine) is guest:
        return True
    slot = live.guest_slot.get(machine)
    return guest.key in kept and slot is not None and guest.pinned_slot == slot.name


def _whole_node_sizes(live: _Live) -> list[int]:
    return sorted({s.total.cpus for s in live.node_slots})


def _participation(job: Job, sizes: Sequence[int], guest_slots: Mapping[str, Slot]) -> str | None:
    """Why an idle malleable job cannot be a guest, or None."""
    if _runtime(job) is None:
        return "node sharing needs the job's requested run time (allowed_execute_duration)"
    if job.request.cpus not in sizes:
        shown = ", ".join(map(str, sizes)) or "none"
        return (f"node sharing takes whole-node jobs: request_cpus = {job.request.cpus} is no node slot's "
                f"cores ({shown})")
    refused_on = _refused_on(job)
    if refused_on is not None and refused_on in guest_slots:
        return f"{refused_on} refused it as a guest ({job.hook_refusal}); it waits for a static start"
    return None


def _refused_on(job: Job) -> str | None:
    """The partitionable slot whose PREPARE_JOB hook last refused ``job`` (HTCondor's
    ``VacateReason`` starts "Error from <dynamic slot>: PREPARE_JOB ...")."""
    found = _ERROR_FROM.match(job.hook_refusal or "")
    return partitionable_slot_of(found.group(1)) if found else None


_ERROR_FROM = re.compile(r"^Error from (\S+?):")


class MatesView:
    """The mates mode's view of one cycle (module docstring): node and guest slots, who runs
    where, and the guests kept pinned so far."""

    never_fits = None  # a job that cannot be a guest waits for a static start, with the reason

    def __init__(self, jobs: ModeJobs, context: ModeContext) -> None:
        self.context = context
        self.live = _Live(context.state)
        self.malleable = jobs.all
        self.kept: list[Job] = []

    def slot(self, name: str | None) -> Slot | None:
        return self.live.slots.get(name) if name is not None else None

    def pin_problem(self, job: Job, slot: Slot) -> str | None:
        if self.live.mate_of(job, slot.machine) is None:
            return f"its mate {job.attributes.get(PIN_MATE_ATTR)} no longer runs on {slot.machine}"
        return None

    def keep_order(self, job: Job) -> tuple:
        """The guest its mate names first, then older pins."""
        return (not _named_by_mate(job, self.live), job.pinned_cycle or 0, job.key)

    def keep(self, job: Job) -> str | None:
        why = _slot_taken(job, self.live, self.kept)
        if why is None:
            self.kept.append(job)
        return why

    def plan(self, policy: Policy, jobs: list[Job], refused: Mapping[JobKey, str]) -> ModePlan:
        """Mates whose guest did not run get their limit back; the waiting malleable jobs are
        planned by size of node, each start on a mate's cores a guest pin."""
        live, kept, cycle, settings = self.live, self.kept, self.context.cycle, self.context.settings
        now_s = state_time(self.context.state)
        kept_keys = {j.key for j in kept}
        restore = []
        for mate in self.malleable:
            guest_name = mate.attributes.get(PIN_GUEST_ATTR)
            if guest_name is None and PIN_MATE_BASE_ATTR not in mate.attributes:
                continue
            guest = live.by_text.get(str(guest_name)) if guest_name is not None else None
            if guest_name is not None and guest is None:
                continue  # the guest left the queue: it may have run on the mate's cores
            if guest is None or not _hosted(mate, guest, live, kept_keys):
                restore.append(_restore(mate, f"guest {guest_name} did not run on its node"))
        reasons: dict[JobKey, str] = {}
        sizes = _whole_node_sizes(live)
        guest_slots = {s.name: s for s in live.guest_slot.values()}
        queue_by_size: dict[int, list[Job]] = {}
        for job in sorted(jobs, key=lambda j: (j.submitted_at_s, j.key)):
            why = _participation(job, sizes, guest_slots)
            if why is not None:
                reasons[job.key] = f"waiting: {why}"
            else:
                queue_by_size.setdefault(int(job.request.cpus), []).append(job)
        pins: list[GuestPin] = []
        lengthen: list[MateChange] = []
        plans: list[Plan] = []
        guard, by_key = self.context.interference, {job.key: job for job in jobs}
        for size, queue in sorted(queue_by_size.items()):
            cluster, mates = _cluster(live, size, queue, kept, now_s, settings)
            starts = policy.starts(cluster, settings)  # type: ignore[attr-defined]
            started, kept_apart = set(), {}
            for start in starts:
                if not start.malleable:
                    started.add(start.job)
                    reasons[start.job] = f"waiting: {start.nodes[0]} has {size} free cores for it (HTCondor starts it)"
                    continue
                mate = mates[start.mates[0]]
                machine = start.nodes[0]
                if guard is not None and (why := guard.claim(by_key[start.job], live.guest_slot[machine].name)):
                    kept_apart[start.job] = why   # COSCHED_INTERFERENCE: not beside this mate
                    continue
                started.add(start.job)
                increase = int(math.ceil(start.mate_increase_s))
                pins.append(GuestPin(start.job, live.guest_slot[machine].name, mate.key, increase,
                                     start.predicted_end_s))
                lengthen.append(lengthen_change(mate, start.job, increase))
                reasons[start.job] = (f"pinned to {live.guest_slot[machine].name} in cycle {cycle}: guest of "
                                      f"{mate.key.job_id} on {start.cores_per_node} of its cores")
            hosts = [live.guest_slot[s.machine] for s in live.node_slots
                     if s.total.cpus == size and s.machine in live.guest_slot]
            usable = [g for g in hosts if g.unavailable is None]
            if usable:
                why = "no running mate ends it sooner as a guest (SD-Policy, MAX_SLOWDOWN)"
            elif hosts:
                why = f"no node can host a guest now ({hosts[0].name} {hosts[0].unavailable})"
            else:
                why = f"no node of {size} cores has a guest slot"
            for job in queue:
                if job.key not in started:
                    reasons[job.key] = f"waiting: for a whole node; {kept_apart.get(job.key, why)}"
            plans.append(Plan("sd-live", (), tuple(Unplaced(j.key, reasons[j.key]) for j in queue
                                                   if j.key not in started), {"guests": len(pins)}))
        return ModePlan(tuple(pins), tuple(plans), reasons, tuple(lengthen), tuple(restore))


def _cluster(live: _Live, size: int, queue: Sequence[Job], kept: Sequence[Job], now_s: float,
             settings: PlanSettings) -> tuple[NodeCluster, dict[JobKey, Job]]:
    """The node slots of ``size`` cores as paper 001's nodes, with the mates the planner may take."""
    free: list[str] = []
    running: list[RunningNodeJob] = []
    mates: dict[JobKey, Job] = {}
    kept_guest_on = {live.slots[j.pinned_slot].machine: j for j in kept if j.pinned_slot in live.slots}
    for slot in live.node_slots:
        if slot.total.cpus != size:
            continue
        machine = slot.machine
        jobs = live.on_node.get(machine, [])
        # Jobs the sidecar does not read (not malleable) show only in the slot's free cores.
        others = slot.free.cpus + sum(j.request.cpus for j in jobs) < slot.total.cpus
        if not jobs and not others:
            if slot.unavailable is None:
                free.append(machine)
            continue
        if not jobs:
            running.append(RunningNodeJob(JobKey(f"others@{machine}", 0, 0), (machine,), now_s, now_s, math.inf,
                                          math.inf, size, Role.MATE))
            continue
        guest = live.guest_on.get(machine) or kept_guest_on.get(machine)
        first = min(jobs, key=lambda j: j.key)
        requested = [_runtime(j) for j in jobs]
        started = [float(j.started_at_s if j.started_at_s is not None else now_s) for j in jobs]
        ends = [s + r if r is not None else math.inf for s, r in zip(started, requested)]
        if others:
            ends.append(math.inf)
        base = first.attributes.get(PIN_MATE_BASE_ATTR)
        gslot = live.guest_slot.get(machine)
        shareable = (len(jobs) == 1 and not others and first.malleable and requested[0] is not None and first.request.cpus == size
                     and PIN_GUEST_ATTR not in first.attributes and base is None and guest is None
                     and gslot is not None and gslot.unavailable is None and gslot.free.cpus >= gslot.total.cpus)
        # A job that may not lend cores is seen as lending them already (Role.MATE): the
        # planner takes only STATIC jobs as mates.
        role = Role.STATIC if shareable else Role.MATE
        requested_s = float(requested[0]) if len(jobs) == 1 and requested[0] is not None else math.inf
        guest_end = None
        if guest is not None and _runtime(guest) is not None:  # the policy's worst-case prediction
            k = guest_cores(size, settings.sd_sharing_factor)
            guest_end = float(guest.started_at_s or now_s) + stretched_s(float(_runtime(guest) or 0), [(k, 1)], size,
                                                                         RuntimeModel.WORST)
        running.append(RunningNodeJob(first.key, (machine,), float(first.submitted_at_s), min(started), requested_s,
                                      max(ends), size, role, guest_end))
        if shareable:
            mates[first.key] = first
    waiting = tuple(WaitingJob(j.key, 1, float(_runtime(j) or 0), float(j.submitted_at_s)) for j in queue)
    return NodeCluster(now_s, size, len([s for s in live.node_slots if s.total.cpus == size]), tuple(free),
                       tuple(running), waiting), mates
