"""The mechanics every sharing mode shares, written once (``modes/interface.py`` names the
hooks a mode gives them), in two phases over the modes: which pins stay (stale, then crowded,
in the mode's order: :func:`keep_pins`, every mode first), then which idle jobs are held
because no slot could ever hold them, which are enrolled (the pin clause), and what the
mode's plan tells each job (:func:`decide_mode`)."""
from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass, replace
from itertools import compress, repeat
from operator import attrgetter, is_not, not_

from condor_sched.model import Job, JobKey
from condor_sched.modes.interface import (
    Enroll, Hold, ModeContext, ModeDecision, ModeJobs, ModeView, SharingMode, Unpin,
)


_key_of, _has_pin_clause = attrgetter("key"), attrgetter("has_pin_clause")


def stale_reason(mode: SharingMode, view: ModeView, job: Job, context: ModeContext) -> str | None:
    """Why ``job``'s pin no longer stands: its slot vanished (or is not of the mode's kinds),
    the node refused the start, the slot takes no new job, the mode's own reason, or the pin
    was not matched within ``unpin_age_cycles`` negotiation cycles
    (``ModeContext.negotiations_since``)."""
    slot = view.slot(job.pinned_slot)
    if slot is None or (mode.slot_kinds and slot.kind not in mode.slot_kinds):
        return f"{mode.slot_words} {job.pinned_slot} vanished"
    if job.start_refused is not None:
        return mode.refusal(slot, job.start_refused)
    if slot.unavailable is not None:
        return f"{mode.slot_words} {slot.name} {slot.unavailable}"
    problem = view.pin_problem(job, slot)
    if problem is not None:
        return problem
    age = context.unpin_age_cycles
    if job.pinned_cycle is None or context.negotiations_since(job.pinned_cycle) >= age:
        return f"{mode.pin_words} to {slot.name} not matched within {age} cycles"
    return None


@dataclass(slots=True)
class KeptPins:
    """A mode's pins after the first phase of a cycle: its view, the pins kept and those
    taken back, and the slot whose node just refused each refused job's start."""

    mode: SharingMode
    jobs: ModeJobs
    view: ModeView
    kept: list[Job]
    unpins: list[Unpin]
    refused: dict[JobKey, str]


def keep_pins(mode: SharingMode, jobs: ModeJobs, context: ModeContext) -> KeptPins:
    """The first phase, every mode before any plans: stale pins are taken back, the rest kept
    in the mode's order as long as the view can hold them (so no mode plans on what another
    mode's kept pin holds)."""
    view = mode.view(jobs, context)
    stale: dict[JobKey, str] = {}
    for job in jobs.pinned:
        if job.pinned_slot is not None and (why := stale_reason(mode, view, job, context)) is not None:
            stale[job.key] = why
    kept: list[Job] = []
    crowded: list[Unpin] = []
    for job in sorted((j for j in jobs.pinned if j.pinned_slot is not None and j.key not in stale),
                      key=view.keep_order):
        why = view.keep(job)
        (crowded.append(Unpin(job.key, why)) if why is not None else kept.append(job))
    refused = {j.key: j.pinned_slot for j in jobs.pinned if j.key in stale and j.start_refused is not None}
    return KeptPins(mode, jobs, view, kept, [Unpin(key, why) for key, why in stale.items()] + crowded,
                    refused)  # type: ignore[arg-type]


def decide_mode(pins: KeptPins, planner: object) -> ModeDecision:
    """The second phase, one mode's part of the cycle: hold what can never be placed, enroll
    and plan the rest, and tell each planned job why it waits or where it is pinned. A mode
    turned off (no ``planner``) only lets go of its stale pins."""
    mode, jobs, view, kept, unpins, refused = pins.mode, pins.jobs, pins.view, pins.kept, pins.unpins, pins.refused
    idle = jobs.idle
    waiting = list(idle)
    if jobs.pinned:  # idle is in key order: find each pinned job, drop the kept, unpin the rest
        kept_keys = {j.key for j in kept}
        for job in jobs.pinned:
            at = bisect_left(idle, job.key, key=_key_of)
            while idle[at] is not job:
                at += 1
            waiting[at] = None if job.key in kept_keys else replace(job, pinned_slot=None, pinned_cycle=None)
        waiting = list(compress(waiting, map(is_not, waiting, repeat(None))))
    if planner is None:
        return ModeDecision(mode.name, tuple(sorted(kept, key=_key_of)), tuple(unpins))
    holds: list[Hold] = []
    to_plan = waiting
    if view.never_fits is not None:
        to_plan = []
        for job in waiting:
            why = view.never_fits(job)
            (holds.append(Hold(job.key, why)) if why is not None else to_plan.append(job))
    enrolls = [Enroll(j.key, j.attributes.get("Requirements"), j.gpu is not None)
               for j in compress(to_plan, map(not_, map(_has_pin_clause, to_plan)))] \
        if mode.enrolls and jobs.may_lack_pin_clause else []
    planned = view.plan(planner, to_plan, refused)
    reasons = planned.reasons
    if mode.tells_refusal and refused:  # a refused start stays in the user's view until pinned again
        reasons = dict(reasons)
        for u in unpins:
            if u.job in refused and u.job in reasons:
                reasons[u.job] = f"{u.reason}; now {reasons[u.job]}"
    return ModeDecision(mode.name, tuple(sorted(kept, key=_key_of)), tuple(unpins), tuple(enrolls), tuple(holds),
                        planned.pins, planned.plans, reasons, planned.before_pins, planned.after_unpins)
