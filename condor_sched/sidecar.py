"""The negotiation-cycle sidecar: read -> decide -> apply -> log, once per cycle.

The decision is :func:`condor_sched.cycle.decide_cycle` (pure, shared with ``plan`` and the
simulator), so tests and ``--dry-run`` see exactly what a cycle would do. ``apply_cycle``
sends the edits in batches (``condor_sched.edits``: one call per attribute and value for a
chunk of alike jobs); each job's writes keep it either pinned (original Requirements saved)
or unpinned, so a crash at any point leaves the queue consistent; asked to stop, it finishes
the chunk it is editing and leaves the rest for the next sidecar.
"""
from __future__ import annotations

import logging
import time

import classad2
from dataclasses import dataclass, field, replace
from typing import Callable, Mapping, Protocol

from condor_sched.cycle import CycleConfig, CycleDecision, CycleMemory, Hold, Pin, covered, decide_cycle
from condor_sched.modes.mates.live import GuestPin, guest_unpin_writes
from condor_sched.edits import (
    CHUNK_JOBS,
    Edit,
    JobChange,
    apply_changes,
    enroll_change,
    pin_change,
    reason_change,
    unpin_change,
)
from condor_sched.model import (
    PIN_CYCLE_ATTR,
    PIN_EXCLUSIVE_ATTR,
    PIN_LLC_WAYS_ATTR,
    PIN_MATE_ATTR,
    PIN_MATE_INCREASE_ATTR,
    PIN_MEM_BW_ATTR,
    PIN_SCALE_ATTR,
    PIN_SLOT_ATTR,
    PIN_TIME_ATTR,
    JobKey,
    PoolState,
)
from condor_sched.piggyback import exploration_scales
from condor_sched.settings import SidecarSettings
from condor_sched.watch import Notices

log = logging.getLogger("condor_sched.sidecar")


def pin_details(pin: Pin) -> dict[str, int]:
    """The sidecar-owned attributes a pin carries besides its slot: a device job whether it
    needs the whole device, a spread proc its ways, bandwidth and scale factor."""
    if pin.llc_ways is None:
        return {PIN_EXCLUSIVE_ATTR: int(pin.whole_device)}
    return {PIN_LLC_WAYS_ATTR: pin.llc_ways, PIN_MEM_BW_ATTR: pin.mem_bw_gbs or 0,
            PIN_SCALE_ATTR: pin.scale_factor or 1}


class Editor(Protocol):
    """Where a cycle's edits go: ``write`` sends one batched attribute write (all of its jobs or
    none, raising otherwise), ``hold`` holds one idle job with a reason."""

    def write(self, edit: Edit) -> None: ...
    def hold(self, job: JobKey, reason: str) -> None: ...


@dataclass
class CycleOutcome:
    pinned: int = 0
    unpinned: int = 0
    enrolled: int = 0
    held: int = 0
    told: int = 0
    failed: list[str] = field(default_factory=list)
    #: Job edits (unpin, hold, enroll, pin, reason) not started because the sidecar was asked to stop.
    left_on_stop: int = 0
    #: Schedd.edit calls made (each a batch of jobs).
    calls: int = 0


def reasons_to_write(decision: CycleDecision, current: Mapping[JobKey, str | None]) -> dict[tuple[str, str], list[JobKey]]:
    """The ``CoSchedPinReason`` edits a cycle needs: jobs whose reason changed, grouped by
    schedd and text (one edit each)."""
    out: dict[tuple[str, str], list[JobKey]] = {}
    for job, reason in sorted(decision.reasons.items()):
        if current.get(job) != reason:
            out.setdefault((job.schedd, reason), []).append(job)
    return out


def guest_pin_change(pin: GuestPin, cycle: int, now: int) -> JobChange:
    """A guest's pin: cycle, time, mate and increase first, the slot last (that write pins)."""
    return JobChange(pin.job, ((PIN_CYCLE_ATTR, str(cycle)), (PIN_TIME_ATTR, str(int(now))),
                               (PIN_MATE_ATTR, classad2.quote(pin.mate.job_id)),
                               (PIN_MATE_INCREASE_ATTR, str(pin.increase_s)),
                               (PIN_SLOT_ATTR, classad2.quote(pin.slot))))


def apply_cycle(decision: CycleDecision, editor: Editor,
                current_reasons: Mapping[JobKey, str | None] | None = None,
                should_stop: Callable[[], bool] | None = None, *, now: float | None = None,
                chunk_jobs: int = CHUNK_JOBS) -> CycleOutcome:
    """Unpin, hold, enroll, pin, then tell the changed reasons, each phase in batched edits
    (``condor_sched.edits``); a failing job is logged and the rest go on. Once
    ``should_stop()`` is true no further chunk of jobs is edited (the one under way finishes)."""
    outcome = CycleOutcome()
    failed_jobs: set[JobKey] = set()
    now = time.time() if now is None else now

    def run(what: str, changes: list[JobChange]) -> list[JobKey]:
        applied = apply_changes(changes, editor.write, should_stop=should_stop, chunk_jobs=chunk_jobs)
        outcome.left_on_stop += applied.left_on_stop
        outcome.calls += applied.calls
        for job, why in sorted(applied.failed.items()):
            failed_jobs.add(job)
            outcome.failed.append(f"{what} {job}: {why}")
            log.warning("could not %s job %s: %s", what, job, why)
        return applied.done

    gpu = decision.gpu_sharing
    reasons = {u.job: u.reason for u in decision.unpins} | dict(gpu.unpins)
    for job in run("unpin", [unpin_change(u.job) for u in decision.unpins] + [unpin_change(k) for k, _ in gpu.unpins]):
        outcome.unpinned += 1
        log.info("unpinned %s: %s", job, reasons[job])
    for h in (*decision.holds, *(Hold(k, r) for k, r in gpu.holds)):
        if should_stop is not None and should_stop():
            outcome.left_on_stop += 1
            continue
        try:
            editor.hold(h.job, h.reason)
            outcome.held += 1
            log.info("held %s: %s", h.job, h.reason)
        except Exception as e:  # one job's failure must not stop the cycle
            failed_jobs.add(h.job)
            outcome.failed.append(f"hold {h.job}: {e}")
            log.warning("could not hold job %s: %s", h.job, e)
    sharing = decision.node_sharing
    guest_unpin_reasons = dict(sharing.unpins)
    for job in run("unpin guest", [JobChange(k, guest_unpin_writes()) for k, _ in sharing.unpins]):
        outcome.unpinned += 1
        log.info("unpinned guest %s: %s", job, guest_unpin_reasons[job])
    enrolls = [*((e.job, e.requirements) for e in decision.enrolls), *gpu.enrolls]
    enrolled = set(run("enroll", [enroll_change(k, requirements) for k, requirements in enrolls]))
    outcome.enrolled = len(enrolled)
    not_enrolled = {k for k, _ in enrolls} - enrolled  # failed or left: never pinned
    slots = {p.job: p.slot for p in decision.pins}
    pinned = run("pin", [pin_change(p.job, p.slot, decision.cycle, int(now), pin_details(p))
                         for p in decision.pins if p.job not in not_enrolled])
    for job in pinned:
        outcome.pinned += 1
        log.info("pinned %s to %s", job, slots[job])
    gpu_pins = {p.job: p for p in gpu.pins if p.job not in not_enrolled}
    gpu_pinned = run("pin", [p.change(decision.cycle, now) for p in gpu_pins.values()])
    for job in gpu_pinned:
        outcome.pinned += 1
        log.info("pinned %s to GPUs %s of %s", job, ",".join(map(str, gpu_pins[job].gpus)), gpu_pins[job].slot)
    failed_jobs |= {p.job for p in gpu.pins} - set(gpu_pinned)
    # A mate is lengthened before its guest is pinned: a guest never runs beside a mate whose
    # limit did not grow. A mate is restored only after its guest's pin is gone.
    lengthened = set(run("lengthen mate", [JobChange(m.job, m.writes) for m in sharing.lengthen]))
    for m in sharing.lengthen:
        if m.job in lengthened:
            log.info("mate %s %s", m.job, m.why)
    guests = [g for g in sharing.pins if g.mate in lengthened]
    for g in sharing.pins:
        if g.mate not in lengthened:
            failed_jobs.add(g.job)
    guest_slots = {g.job: g.slot for g in guests}
    guest_pinned = run("pin guest", [guest_pin_change(g, decision.cycle, int(now)) for g in guests])
    for job in guest_pinned:
        outcome.pinned += 1
        log.info("pinned guest %s to %s", job, guest_slots[job])
    failed_jobs |= {g.job for g in guests} - set(guest_pinned)
    restored_why = {m.job: m.why for m in sharing.restore}
    for job in run("restore mate", [JobChange(m.job, m.writes) for m in sharing.restore]):
        log.info("mate %s restored: %s", job, restored_why[job])
    not_pinned = set(slots) - set(pinned) | failed_jobs  # failed or left on a stop: no pin to tell of
    tells = [reason_change(job, reason) for (_, reason), jobs in reasons_to_write(decision, current_reasons or {}).items()
             for job in jobs if job not in not_pinned]
    outcome.told += len(run("tell", tells))
    return outcome


@dataclass(frozen=True, slots=True)
class SidecarCycle:
    """What one live cycle decided and what its edits did."""

    decision: CycleDecision
    outcome: CycleOutcome
    seconds: float

    unreachable_schedds: tuple[str, ...] = ()

    def numbers(self) -> dict[str, int | str]:
        """The cycle's numbers for the sidecar's daemon ad (``CoSched<key>``): pins counted
        as edits that succeeded (a dry run edits nothing); the schedds not read, comma-separated."""
        d = self.decision
        return {"Cycle": d.cycle, "IdleJobs": d.seen, "PinsKept": len(d.kept), "Pinned": self.outcome.pinned,
                "Unpinned": self.outcome.unpinned, "Unplaced": len(d.unplaced), "Skipped": len(d.skipped),
                "Held": self.outcome.held,
                "FailedEdits": len(self.outcome.failed), "UnreachableSchedds": ", ".join(self.unreachable_schedds)}


class Sidecar:
    """read -> decide -> apply -> log, one cycle per call; it keeps the cycles' memory (the
    daemon loop around it is ``condor_sched.daemon``)."""

    def __init__(self, settings: SidecarSettings, config: CycleConfig, read_state: Callable[[], PoolState],
                 editor: Editor | None, *, notices: Notices | None = None,
                 should_stop: Callable[[], bool] | None = None) -> None:
        self.settings = settings
        self.config = config
        self.read_state = read_state
        self.editor = editor  # None: dry run
        self.memory: CycleMemory | None = None  # None until the first cycle reads the pool
        self.notices = notices or Notices(log)  # a skipped job is warned once, not every cycle
        self.should_stop = should_stop

    def _with_exploration(self, state: PoolState) -> PoolState:
        """The state with the piggyback-profiling scale of each spread job's program that has
        no profile yet (from the node agents' run records)."""
        if not self.settings.profile_runs_dir or self.config.spread_policy is None:
            return state
        store = self.config.profiles
        unknown = {j.program for j in state.jobs
                   if covered(j) and j.wants_spread and (store is None or j.program not in store)}
        return replace(state, exploration_scales=exploration_scales(unknown, self.settings.profile_runs_dir))

    def run_cycle(self) -> SidecarCycle:
        started = time.perf_counter()
        state = self._with_exploration(self.read_state())
        memory = self.memory or CycleMemory.fresh(state)
        decision = decide_cycle(state, memory, self.config)
        self.notices.settle("skipped", {s.what: f"skipped {s}" for s in decision.skipped},
                            ended=lambda what: f"{what} is no longer skipped (its ad reads again, or it left)")
        if self.editor is None:
            for p in decision.pins:
                log.info("dry run: would pin %s to %s", p.job, p.slot)
            for u in decision.unpins:
                log.info("dry run: would unpin %s (%s)", u.job, u.reason)
            outcome = CycleOutcome()
        else:
            outcome = apply_cycle(decision, self.editor, {j.key: j.pin_reason for j in state.jobs}, self.should_stop,
                                  chunk_jobs=self.settings.edit_chunk_jobs)
        seconds = time.perf_counter() - started
        unreachable = state.unreachable_schedds
        log.info("cycle %d: %d idle co-scheduled jobs seen, %d pins kept, %d pinned, %d unpinned, "
                 "%d enrolled, %d held, %d unplaced, %d skipped, %d reasons told, %d failed edits, %.3f s%s%s",
                 decision.cycle, decision.seen, len(decision.kept), outcome.pinned, outcome.unpinned,
                 outcome.enrolled, outcome.held, len(decision.unplaced), len(decision.skipped), outcome.told,
                 len(outcome.failed), seconds,
                 f"; schedds not read: {', '.join(unreachable)}" if unreachable else "",
                 f"; stopped: {outcome.left_on_stop} job edits left for the next run" if outcome.left_on_stop else "")
        memory = decision.next_memory()
        if unreachable and self.memory is not None:  # their jobs keep their ages for when they are back
            unseen = {k: c for k, c in self.memory.first_seen.items() if k.schedd in unreachable}
            memory = replace(memory, first_seen={**unseen, **memory.first_seen})
        self.memory = memory
        return SidecarCycle(decision, outcome, seconds, unreachable)
