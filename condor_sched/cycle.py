"""The one cycle: a pool state and the memory of earlier cycles in, a decision out (pure).

Three sources obtain the state and apply the decision their own way (STYLE.md: one cycle,
three sources): the sidecar reads the live pool and edits jobs (``sidecar.py``), ``plan``
reads a snapshot and prints the decision (``cli.py``), the simulator builds the state from
its simulated pool and starts what is pinned (``simulate/engine.py``). Whatever a policy
decides, it decides here, so the three agree on the same state.

What a cycle does (``docs/architecture.md``): make the state consistent, give each job to
the one mode that covers it (``modes/registry.py``), and run every active mode's part
(``mode_cycle.decide_mode``): unpin stale pins (slot vanished or taking no new job, the node
refused the start, not matched within ``unpin_age_cycles``, the mode's own reason), keep the
rest within what their slots hold, hold idle jobs no slot could ever hold, enroll jobs lacking
the pin clause, plan the rest in fair-share order on what is free and pin what was placed;
every idle job planned gets a reason (``CoSchedPinReason``). A job whose ad does not read is
unpinned or, idle, held with the attribute named.

With a cache (``CycleMemory.cache``, ``CycleConfig.bounded``), a cycle follows only the job
records that came and went since the last one (``cycle_cache``) and plans ``BOUNDED_POLICIES``
on the jobs that can matter (``modes/devices/bounded.py``); the decision is the one planning
the whole queue afresh gives (``tests/unit/test_incremental_cycle.py``).
"""
from __future__ import annotations

from dataclasses import replace
from itertools import compress, repeat
from operator import attrgetter, is_not
from typing import Iterable, Sequence

from condor_sched.consistency import consistent_state
from condor_sched.cycle_cache import PlanCache, _where, covered, follow_jobs
from condor_sched.cycle_records import (
    CycleConfig, CycleDecision, CycleMemory, Enroll, Hold, Pin, Unpin, pin_reason, waiting_reason,
)
from condor_sched.interference.guard import CycleGuard
from condor_sched.mode_cycle import KeptPins, decide_mode, keep_pins
from condor_sched.model import HOLDS_A_SLOT, Job, JobKey, JobStatus, PoolState, RunningJob, Skipped, partitionable_slot_of
from condor_sched.modes.devices.bounded import BOUNDED_POLICIES
from condor_sched.modes.interface import ModeContext
from condor_sched.modes.registry import mode_of_job
from condor_sched.modes.slot_mode import SlotLedger, free_after_pins

__all__ = ["BOUNDED_POLICIES", "CycleConfig", "CycleDecision", "CycleMemory", "Enroll", "Hold", "Pin", "PlanCache",
           "Unpin", "covered", "decide_cycle", "free_after_pins", "pin_reason", "running_jobs", "waiting_reason"]

_status = attrgetter("status")


def running_jobs(state: PoolState, busy: Sequence[Job] | None = None) -> tuple[RunningJob, ...]:
    """The jobs holding a dynamic slot, with their partitionable slot, node and measurements
    (``busy``: the state's jobs that are not idle, when the caller has them)."""
    slots = {s.name: s for s in state.slots}
    out = []
    for job in _where(state.jobs, _status, is_not, JobStatus.IDLE) if busy is None else busy:
        if job.status not in HOLDS_A_SLOT:
            continue
        slot = partitionable_slot_of(job.remote_slot) if job.remote_slot else job.pinned_slot
        if slot is None:
            continue
        node = slots[slot].machine if slot in slots else slot.split("@")[-1]
        measured = state.nodes[node].jobs.get(job.key) if node in state.nodes else None
        out.append(RunningJob(job, slot, node, job.started_at_s, job.requested_runtime_s,
                              job.expected_runtime_s, measured))
    return tuple(out)


def _hold_reason(skipped: Skipped) -> str:
    return (f"condor_sched cannot plan this job: {skipped.reason}. Correct it (condor_qedit), "
            "then condor_release the job")


def decide_cycle(state: PoolState, memory: CycleMemory, config: CycleConfig) -> CycleDecision:
    """What one cycle does (module docstring), from ``state`` and ``memory`` alone: a pipeline
    over the active modes. With a cache (``config.bounded``), what it derives from the jobs
    follows only the records that changed since the last cycle; the decision is the same."""
    state = consistent_state(state)
    cache = (memory.cache or PlanCache()) if config.bounded else None
    active = config.active()
    jobs = follow_jobs(state.jobs, [mode for mode, _ in active], memory.first_seen, memory.cycle, cache,
                       mode_of_job())
    busy = list(compress(state.jobs, map(is_not, map(_status, state.jobs), repeat(JobStatus.IDLE))))
    running = running_jobs(state, busy)
    guard = None if config.interference is None else CycleGuard(config.interference, state, running, memory.exes)
    context = ModeContext(state, memory.cycle, jobs.first_seen, config.plan, config.unpin_age_cycles, busy,
                          running, config.profiles, cache, slot_ledger=SlotLedger(),
                          negotiated=memory.negotiated, interference=guard)
    kept = [keep_pins(mode, jobs.by_mode[mode.name], context) for mode, _ in active]
    if guard is not None:
        keep_apart(guard, kept)
    parts = tuple(decide_mode(pins, planner) for pins, (_, planner) in zip(kept, active))
    # A pinned job whose ad went bad cannot be planned: its pin is taken away so it is never
    # left pinned to a slot that cannot run it; an idle one is held with the attribute named,
    # or it would wait for ever.
    bad_unpins = tuple(Unpin(s.job, f"malformed ad: {s.reason}") for s in state.skipped
                       if s.job is not None and s.pinned_slot is not None)
    bad_holds = tuple(Hold(s.job, _hold_reason(s)) for s in state.skipped if s.job is not None and s.idle)
    decision = CycleDecision.of(memory.cycle, jobs.seen, parts, state.skipped, jobs.first_seen, bad_unpins, bad_holds,
                                cache)
    requeued = requeued_reasons(job for pins in kept for job in pins.kept)
    return replace(decision, reasons={**running_reasons(busy), **requeued, **decision.reasons},
                   exes=memory.exes if guard is None else guard.exes)


def keep_apart(guard: CycleGuard, kept: list[KeptPins]) -> None:
    """An idle job's kept pin whose node now runs a job it is ill-matched with is taken back
    (the job is planned again this cycle); the rest hold their nodes before anything is planned."""
    for pins in kept:
        standing = []
        for job in pins.kept:
            why = guard.displaced(job) if job.is_idle else None
            (pins.unpins.append(Unpin(job.key, why)) if why is not None else standing.append(job))
        pins.kept[:] = standing
    for pins in kept:
        for job in pins.kept:
            if job.is_idle and job.pinned_slot is not None:
                guard.note_pin(job, job.pinned_slot)


RUNNING_WORDS = "running on "


def requeued_reasons(kept: Iterable[Job]) -> dict[JobKey, str]:
    """A job back to idle from a run (vacated, its node restarted) whose pin stands is told
    so, and no longer reads "running on"."""
    return {job.key: f"idle again after running; still pinned to {job.pinned_slot} (pinned in cycle "
                     f"{job.pinned_cycle}); waiting for the negotiator to match it there"
            for job in kept if job.is_idle and (job.pin_reason or "").startswith(RUNNING_WORDS)}


def running_reasons(busy: list[Job]) -> dict[JobKey, str]:
    """A pinned job that runs is told where, so its CoSchedPinReason never still says it waits
    (written once: the sidecar writes only reasons that changed)."""
    return {job.key: f"{RUNNING_WORDS}{job.remote_slot or job.pinned_slot} (pinned there by condor_sched)"
            for job in busy if job.status == JobStatus.RUNNING and job.pinned_slot is not None}
