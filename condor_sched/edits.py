"""A cycle's queue edits as batches: what to write, in which order, and how a failure or a
stop is contained (pure: the writing itself is the caller's, e.g. ``pool.JobEditor``).

A job's change is an ordered list of attribute writes (:class:`JobChange`). Its state flips at
one write, the one the pin clause reads: ``CoSchedPinSlot`` set last pins a job, cleared
first unpins it; enrolment's Requirements write comes after the original is saved. Jobs
whose changes are alike share writes: :func:`apply_changes` sends the i-th writes of a chunk
of jobs as one :class:`Edit` per (schedd, attribute, value), i.e. one ``Schedd.edit`` call
with a list of job ids, which the schedd commits as one transaction (all of its jobs or
none). The i+1-th writes go only to the jobs whose i-th succeeded, so every job passes
through exactly the states its own sequence passes through, whatever call a crash
interrupts. A failing call (e.g. one job left the queue: the schedd then refuses the whole
transaction) is split in halves until the jobs at fault are found; the others go on.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Iterable, Mapping, Sequence

import classad2

from condor_sched.model import (
    PIN_CLAUSE,
    GPU_PIN_CLAUSE,
    PIN_CYCLE_ATTR,
    PIN_EXCLUSIVE_ATTR,
    PIN_GPU_COMPUTE_ATTR,
    PIN_GPU_MEMORY_ATTR,
    PIN_GPUS_ATTR,
    PIN_LLC_WAYS_ATTR,
    PIN_MEM_BW_ATTR,
    PIN_ORIGINAL_ATTR,
    PIN_REASON_ATTR,
    PIN_SCALE_ATTR,
    PIN_SLOT_ATTR,
    PIN_TIME_ATTR,
    JobKey,
)

#: Jobs per chunk: a stop request is honoured between chunks (a chunk's jobs finish their
#: whole change), and one call never names more jobs than this.
CHUNK_JOBS = 2000
#: Largest chunk an admin may set (COSCHED_EDIT_CHUNK_JOBS): a transaction the schedd holds
#: open while its jobs' writes arrive.
MAX_CHUNK_JOBS = 20000

UNDEFINED = "undefined"


@dataclass(frozen=True, slots=True)
class Edit:
    """One attribute write to jobs of one schedd: one ``Schedd.edit`` call, one transaction."""

    schedd: str
    attr: str
    value: str  # ClassAd expression text
    jobs: tuple[JobKey, ...]


@dataclass(frozen=True, slots=True)
class JobChange:
    """One job's writes, in the order they must reach the queue."""

    job: JobKey
    writes: tuple[tuple[str, str], ...]


@dataclass
class Applied:
    """What :func:`apply_changes` did: jobs whose whole change landed, jobs that failed
    (with why), jobs not started because of a stop, and the calls made."""

    done: list[JobKey] = field(default_factory=list)
    failed: dict[JobKey, str] = field(default_factory=dict)
    left_on_stop: int = 0
    calls: int = 0


def pin_change(job: JobKey, slot: str, cycle: int, now: int, details: Mapping[str, int]) -> JobChange:
    """Cycle, time and details first (alone they change nothing about matching), the slot last."""
    return JobChange(job, ((PIN_CYCLE_ATTR, str(cycle)), (PIN_TIME_ATTR, str(int(now))),
                           *((attr, str(int(v))) for attr, v in sorted(details.items())),
                           (PIN_SLOT_ATTR, classad2.quote(slot))))


#: Everything a pin writes, cleared by an unpin (the slot first: that write unpins).
PIN_ATTRS = (PIN_SLOT_ATTR, PIN_CYCLE_ATTR, PIN_TIME_ATTR, PIN_LLC_WAYS_ATTR, PIN_MEM_BW_ATTR, PIN_SCALE_ATTR,
             PIN_EXCLUSIVE_ATTR, PIN_GPUS_ATTR, PIN_GPU_MEMORY_ATTR, PIN_GPU_COMPUTE_ATTR)


#: What an unpin leaves: a GPU job's last GPUs and shares. An unpin can land on a job the
#: negotiator matched in the same instant (seen on the local pool after a startd restart); the
#: claim holds exactly those shares, and the sidecar reads a running job's GPUs from them
#: (a GPU holds one Owner's shares). They match nothing without the slot, and a new pin writes
#: them all again before its slot.
UNPIN_KEEPS = (PIN_GPUS_ATTR, PIN_GPU_MEMORY_ATTR, PIN_GPU_COMPUTE_ATTR)


def unpin_change(job: JobKey) -> JobChange:
    """Clear a pin (the slot first), all but what ``UNPIN_KEEPS``."""
    return JobChange(job, tuple((attr, UNDEFINED) for attr in PIN_ATTRS if attr not in UNPIN_KEEPS))


def enroll_change(job: JobKey, requirements: str | None, gpu: bool = False) -> JobChange:
    """Save the original Requirements first, then add the pin clause (unmatchable until pinned;
    a GPU job's clause, as config.d/10 adds it, also lets whole GPUs match native GPU nodes)."""
    original = requirements or "true"
    clause = GPU_PIN_CLAUSE if gpu else PIN_CLAUSE
    return JobChange(job, ((PIN_ORIGINAL_ATTR, original), ("Requirements", f"({original}) && {clause}")))


def release_change(job: JobKey, original: str | None) -> JobChange:
    """Undo enrolment: unpin, restore the saved Requirements, drop the reason."""
    restore = (("Requirements", original),) if original else ()
    return JobChange(job, (*((attr, UNDEFINED) for attr in PIN_ATTRS), *restore, (PIN_REASON_ATTR, UNDEFINED)))


def reason_change(job: JobKey, reason: str) -> JobChange:
    return JobChange(job, ((PIN_REASON_ATTR, classad2.quote(reason)),))


def _chunks(changes: Sequence[JobChange], size: int) -> Iterable[Sequence[JobChange]]:
    for start in range(0, len(changes), size):
        yield changes[start:start + size]


def apply_changes(changes: Iterable[JobChange], write: Callable[[Edit], None], *,
                  should_stop: Callable[[], bool] | None = None, chunk_jobs: int = CHUNK_JOBS) -> Applied:
    """Send ``changes`` through ``write`` (all of an Edit's jobs or none; raises otherwise),
    batched as the module says. Changes are sorted so that alike jobs share chunks (fewer
    calls); once ``should_stop()`` is true no further chunk starts."""
    ordered = sorted(changes, key=lambda c: (c.writes, c.job))
    applied = Applied()
    for chunk in _chunks(ordered, max(1, chunk_jobs)):
        if should_stop is not None and should_stop():
            applied.left_on_stop += len(chunk)
            continue
        alive = {c.job: c for c in chunk}
        for step in range(max(len(c.writes) for c in chunk)):
            groups: dict[tuple[str, str, str], list[JobKey]] = {}
            for change in alive.values():
                if step < len(change.writes):
                    attr, value = change.writes[step]
                    groups.setdefault((change.job.schedd, attr, value), []).append(change.job)
            for (schedd, attr, value), jobs in groups.items():
                for job, why in _write_isolating(Edit(schedd, attr, value, tuple(jobs)), write, applied).items():
                    applied.failed[job] = why
                    del alive[job]
        applied.done += [c.job for c in chunk if c.job in alive]
    return applied


def _write_isolating(edit: Edit, write: Callable[[Edit], None], applied: Applied) -> dict[JobKey, str]:
    """Write ``edit``; on failure split it in halves until the failing jobs are found. The
    failing jobs, with the error of their own one-job call."""
    applied.calls += 1
    try:
        write(edit)
        return {}
    except Exception as e:  # noqa: BLE001 - the schedd's refusal of a job, reported per job
        if len(edit.jobs) == 1:
            return {edit.jobs[0]: f"{edit.attr}: {e}"}
    half = len(edit.jobs) // 2
    failed = {}
    for part in (edit.jobs[:half], edit.jobs[half:]):
        failed.update(_write_isolating(Edit(edit.schedd, edit.attr, edit.value, part), write, applied))
    return failed
