"""What a sharing mode is: a few declarations (the jobs it covers, its paper, its planners by
name, how its pins are worded and written) and a per-cycle view of the pool with its hooks
(what makes a pin stale or crowded, what no slot could ever hold, how it plans). The shared
mechanics that use the hooks (keeping and unpinning pins, holds, enrollment, reasons) are
written once, in ``condor_sched/mode_cycle.py``; STYLE.md: a mode reads like a
dask-jobqueue backend. The registry (``modes/registry.py``) lists the modes.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Mapping, Protocol, Sequence

from condor_sched.edits import JobChange, unpin_change
from condor_sched.model import Job, JobKey, Plan, PoolState, RunningJob, Slot, SlotKind
from condor_sched.modes.planning import PlanSettings, PolicyKind

if TYPE_CHECKING:
    from condor_sched.profiles import ProfileStore


@dataclass(frozen=True, slots=True)
class Unpin:
    job: JobKey
    reason: str


@dataclass(frozen=True, slots=True)
class Enroll:
    job: JobKey
    requirements: str | None
    #: A GPU job's enrolment adds the GPU pin clause (whole GPUs may match native GPU nodes).
    gpu: bool = False


@dataclass(frozen=True, slots=True)
class Hold:
    """An idle covered job the sidecar can never place as its ad stands; ``reason`` names the
    attribute (it becomes the job's HoldReason; the user fixes it and releases the job)."""

    job: JobKey
    reason: str


@dataclass(frozen=True, slots=True)
class ModeContext:
    """What every mode's view of one cycle may read: the consistent state, the cycle number,
    each aged job's first-seen cycle, the knobs, the jobs holding a slot (``busy``: every job
    not idle) and the cycle's cache (None: plan afresh)."""

    state: PoolState
    cycle: int
    first_seen: Mapping[JobKey, int]
    settings: PlanSettings
    unpin_age_cycles: int
    busy: Sequence[Job]
    running: tuple[RunningJob, ...]
    profiles: ProfileStore | None = None
    #: The cycle's ``cycle_cache.PlanCache`` (None: plan afresh); only the device mode reads it.
    cache: Any = None
    #: What the modes that pin to partitionable slots hold on them this cycle, shared among
    #: them (``slot_mode.SlotLedger``), so that no two of them book the same room.
    slot_ledger: Any = None
    #: ``CycleMemory.negotiated``: the latest cycles that followed a negotiation cycle (None: all).
    negotiated: tuple[int, ...] | None = None
    #: The cycle's interference guard (``interference.guard.CycleGuard``; None: off): the slot
    #: modes narrow each job's slots by it and check their plans with it; the GPU and mates
    #: modes ask it pin by pin (``claim``).
    interference: Any = None

    def negotiations_since(self, cycle: int) -> int:
        """How many negotiation cycles had the chance to match a pin made in ``cycle``: the
        cycles after it up to this one that followed a new negotiation cycle (at most
        ``len(negotiated)`` when those are kept; every cycle when ``negotiated`` is None)."""
        if self.negotiated is None:
            return self.cycle - cycle
        return sum(1 for c in self.negotiated if cycle < c <= self.cycle)


@dataclass(frozen=True, slots=True)
class ModeJobs:
    """A mode's jobs this cycle: every job it covers (``all``, any status) and the idle ones in
    key order (``idle``), with those that carry a pin or a pin cycle (``pinned``, key order)."""

    all: Sequence[Job]
    idle: Sequence[Job]
    pinned: Sequence[Job]
    #: False when the caller knows every idle job has the pin clause (no enrollment pass).
    may_lack_pin_clause: bool = True
    #: True when the caller knows these idle jobs have one submitter and one JobPrio (fair
    #: order is key order); False: the mode finds out from the jobs.
    key_ordered: bool = False


@dataclass(frozen=True, slots=True)
class ModePlan:
    """What a mode's planning gives the cycle: new pins (each has ``job``, ``slot`` and
    ``change(cycle, now)``), its plans (their ``assignments`` are the pins of a mode that
    pins to slots), what each idle job it planned is told, and changes to other jobs: written
    before its pins (a mate's longer limit, which the pin ``needs``) and after its unpins (a
    mate's limit given back)."""

    pins: tuple[Any, ...] = ()
    plans: tuple[Plan, ...] = ()
    reasons: Mapping[JobKey, str] = field(default_factory=dict)
    before_pins: tuple[Any, ...] = ()
    after_unpins: tuple[Any, ...] = ()


@dataclass(frozen=True, slots=True)
class ModeDecision:
    """What one cycle decided for one mode's jobs (``plan --json`` shows each mode's part)."""

    mode: str
    kept: tuple[Job, ...] = ()
    unpins: tuple[Unpin, ...] = ()
    enrolls: tuple[Enroll, ...] = ()
    holds: tuple[Hold, ...] = ()
    pins: tuple[Any, ...] = ()
    plans: tuple[Plan, ...] = ()
    reasons: Mapping[JobKey, str] = field(default_factory=dict)
    before_pins: tuple[Any, ...] = ()
    after_unpins: tuple[Any, ...] = ()


class ModeView(Protocol):
    """One mode's view of one cycle's pool: its slots with what is free, and its hooks."""

    def slot(self, name: str | None) -> Slot | None:
        """The slot a pin names, when it is one this mode pins to."""
        ...

    def pin_problem(self, job: Job, slot: Slot) -> str | None:
        """Why a pin to a live, available slot no longer stands (its GPUs, its mate), or None."""
        ...

    def keep_order(self, job: Job) -> tuple:
        """The order kept pins claim their slots in (older pins first)."""
        ...

    def keep(self, job: Job) -> str | None:
        """Take a kept pin's share out of what is free, or say why its slot cannot hold it with
        the pins kept before it."""
        ...

    #: Why no slot of the mode could hold a job even empty (it is held), or None; a mode whose
    #: jobs always wait instead leaves the hook None.
    never_fits: Callable[[Job], str | None] | None

    def plan(self, planner: Any, jobs: list[Job], refused: Mapping[JobKey, str]) -> ModePlan:
        """Plan ``jobs`` (idle, unpinned, not held) with ``planner``; ``refused``: the slot whose
        node just refused each job's start."""
        ...


class SharingMode:
    """One way of sharing: class attributes declare it, :meth:`view` plans a cycle.

    ``name`` is the ``Job.sharing_mode`` of the jobs it covers (:meth:`covers`; the registry
    gives a job to the first mode that covers it); ``planners`` makes each planner by name and
    ``default_planner`` is the one a cycle uses when nothing else is configured (None: the mode
    is off unless configured). Planners of ``policy_kind`` follow the planner interface
    (``planning.Policy``) and are found by ``registry.get_policy``. ``adopts``: another mode
    whose planners this mode runs too, each wrapped by the adapter (called with the planner's
    name and a maker of it). The stale-pin wording: ``slot_words`` names the slot a pin names,
    ``pin_words`` the pin, ``slot_kinds`` the kinds of slot its pins may name (empty: any);
    ``enrolls``: its planned jobs get the pin clause; ``ages``: its jobs' first-seen cycles
    are remembered (aging)."""

    name: str = ""
    paper: str = ""
    planners: Mapping[str, Callable[[], Any]] = {}
    default_planner: str | None = None
    policy_kind: PolicyKind | None = None
    knob: str = ""
    adopts: tuple[str, Callable[[str, Callable[[], Any]], Any]] | None = None
    slot_words: str = "pinned slot"
    pin_words: str = "pin"
    slot_kinds: frozenset[SlotKind] = frozenset()
    enrolls: bool = True
    ages: bool = False
    #: An unpin after the node refused the start stays in the job's reason until it is pinned again.
    tells_refusal: bool = False
    #: Turned off (no planner), the mode still lets go of its stale pins (slot modes: a spread
    #: job pinned to a vanished socket would wait for ever).
    keeps_pins_when_off: bool = False

    def covers(self, job: Job) -> bool:
        return job.sharing_mode == self.name

    def refusal(self, slot: Slot, reason: str) -> str:
        """What an unpin says when the execute node refused the pinned start."""
        return f"the execute node refused to start it on {slot.name}: {reason}"

    def view(self, jobs: ModeJobs, context: ModeContext) -> ModeView:
        raise NotImplementedError

    def unpin_change(self, job: JobKey) -> JobChange:
        """What unpinning one of its jobs writes."""
        return unpin_change(job)

    def __repr__(self) -> str:
        return f"<sharing mode {self.name}>"
