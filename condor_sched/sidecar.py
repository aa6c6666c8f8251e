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

from dataclasses import dataclass, field, replace
from typing import Callable, Mapping, Protocol

from condor_sched.cycle import CycleConfig, CycleDecision, CycleMemory, covered, decide_cycle
from condor_sched.edits import CHUNK_JOBS, Edit, JobChange, apply_changes, enroll_change, reason_change, unpin_change
from condor_sched.interference.live_profiles import ProfileReader
from condor_sched.model import JobKey, PoolState
from condor_sched.modes.registry import get_mode
from condor_sched.piggyback import exploration_scales
from condor_sched.settings import SidecarSettings
from condor_sched.watch import Notices

log = logging.getLogger("condor_sched.sidecar")


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

    parts = decision.parts
    reasons = {u.job: u.reason for p in parts for u in p.unpins} | {u.job: u.reason for u in decision.bad_ad_unpins}
    unpins = [get_mode(p.mode).unpin_change(u.job) for p in parts for u in p.unpins]
    for job in run("unpin", unpins + [unpin_change(u.job) for u in decision.bad_ad_unpins]):
        outcome.unpinned += 1
        log.info("unpinned %s: %s", job, reasons[job])
    for h in (*decision.bad_ad_holds, *(h for p in parts for h in p.holds)):
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
    enrolls = [e for p in parts for e in p.enrolls]
    enrolled = set(run("enroll", [enroll_change(e.job, e.requirements, e.gpu) for e in enrolls]))
    outcome.enrolled = len(enrolled)
    not_enrolled = {e.job for e in enrolls} - enrolled  # failed or left: never pinned
    # What a pin needs is written first (a mate's longer limit: a guest never runs beside a
    # mate whose limit did not grow); a mate is given its limit back only after the unpins.
    pinned: set[JobKey] = set()
    for part in parts:
        done = set(run("lengthen mate", [c.change() for c in part.before_pins]))
        for c in part.before_pins:
            if c.job in done:
                log.info("mate %s %s", c.job, c.why)
        pins = {p.job: p for p in part.pins if p.job not in not_enrolled}
        needing = {k for k, p in pins.items() if getattr(p, "needs", None) is not None and p.needs not in done}
        failed_jobs |= needing
        ready = {k: p for k, p in pins.items() if k not in needing}
        for job in run("pin", [p.change(decision.cycle, now) for p in ready.values()]):
            outcome.pinned += 1
            pinned.add(job)
            log.info("pinned %s to %s", job, ready[job].describe())
        failed_jobs |= set(ready) - pinned
    after = {c.job: c for p in parts for c in p.after_unpins}
    for job in run("restore mate", [c.change() for c in after.values()]):
        log.info("mate %s restored: %s", job, after[job].why)
    slots = {p.job for part in parts for p in part.pins}
    not_pinned = slots - pinned | failed_jobs  # failed or left on a stop: no pin to tell of
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
                 should_stop: Callable[[], bool] | None = None,
                 cycle_end: Callable[[], int | None] | None = None) -> None:
        self.settings = settings
        self.config = config
        self.read_state = read_state
        self.editor = editor  # None: dry run
        self.memory: CycleMemory | None = None  # None until the first cycle reads the pool
        self.notices = notices or Notices(log)  # a skipped job is warned once, not every cycle
        self.should_stop = should_stop
        #: The negotiator's last cycle end (``LastNegotiationCycleEnd0``, as the daemon's wait
        #: read it): pins age only by cycles after a new one (``CycleMemory.negotiated``).
        #: None: every cycle ages them.
        self.cycle_end = cycle_end
        self.last_negotiation_end: int | None = None
        self.profile_reader: ProfileReader | None = None

    def _negotiated(self, memory: CycleMemory) -> tuple[int, ...] | None:
        """``memory.negotiated`` with this cycle added when the negotiator ended a cycle since
        the last one (none while no negotiator ad is in the collector), keeping the latest
        ``unpin_age_cycles``: all that decides whether a pin aged out."""
        if self.cycle_end is None:
            return None
        end = self.cycle_end()
        new = end is not None and end != self.last_negotiation_end
        self.last_negotiation_end = end if end is not None else self.last_negotiation_end
        latest = (memory.negotiated or ()) + ((memory.cycle,) if new else ())
        return latest[-max(1, self.config.unpin_age_cycles):]

    def _with_exploration(self, state: PoolState) -> PoolState:
        """The state with the piggyback-profiling scale of each spread job's program that has
        no profile yet (from the node agents' run records)."""
        if not self.settings.profile_runs_dir or self.config.spread_policy is None:
            return state
        store = self.config.profiles
        unknown = {j.program for j in state.jobs
                   if covered(j) and j.wants_spread and (store is None or j.program not in store)}
        return replace(state, exploration_scales=exploration_scales(unknown, self.settings.profile_runs_dir))

    def _with_program_profiles(self, state: PoolState) -> PoolState:
        """The state with the interference profiles the node agents recorded (paper 004), when
        COSCHED_INTERFERENCE is on; a record that does not read is warned once and left out."""
        if self.config.interference is None or not self.settings.profile_runs_dir:
            return state
        if self.profile_reader is None:
            self.profile_reader = ProfileReader(self.settings.profile_runs_dir)
        profiles = self.profile_reader.read()
        self.notices.settle("interference", {path: f"interference profile left out: {why}"
                                             for path, why in self.profile_reader.problems.items()},
                            ended=lambda path: f"interference profile {path} reads again, or is gone")
        return replace(state, program_profiles=profiles)

    def run_cycle(self) -> SidecarCycle:
        started = time.perf_counter()
        state = self._with_program_profiles(self._with_exploration(self.read_state()))
        memory = self.memory or CycleMemory.fresh(state)
        negotiated = self._negotiated(memory)
        memory = replace(memory, negotiated=negotiated)
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
        memory = replace(decision.next_memory(), negotiated=negotiated)
        if unreachable and self.memory is not None:  # their jobs keep their ages for when they are back
            unseen = {k: c for k, c in self.memory.first_seen.items() if k.schedd in unreachable}
            memory = replace(memory, first_seen={**unseen, **memory.first_seen})
        self.memory = memory
        return SidecarCycle(decision, outcome, seconds, unreachable)
