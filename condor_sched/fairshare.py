"""Fair share between submitters, as HTCondor's negotiator would give it (pure).

The negotiator gives each submitter a slice of the pool in inverse proportion to its
effective user priority (lower is better; HTCondor's default for a new submitter is 0.5)
and matches the submitter's own jobs in ``JobPrio`` order. condor_sched decides which idle
co-scheduled jobs get a device, so it orders them the same way before a policy packs them:

* weight w(u) = 1 / priority(u);
* each submitter's jobs in its own order (higher ``JobPrio`` first, then queue order);
* weighted fair queueing over the dominant share d(j) = max over the accounted dimensions
  of request / the pool's total (as DRF): a job's virtual finish is
  (what u holds now + the d of u's jobs up to and including it) / w(u); jobs are taken in
  that order. What u already runs counts, so a submitter with more running gets fewer new
  starts until the others catch up.

With several submitters the cycle gives the policy turns (``modes/slot_mode.plan_in_turns``, as the
negotiator's pie spins): each offers the fair-order prefix whose demand is at most ``WINDOW``
times the capacity still free (plus every job past the aging limit, which the policies place
first anyway), so no submitter's better-shaped jobs can take the whole pool. With one
submitter nothing is cut: a single user's queue is packed exactly as paper 002 packs it.
"""
from __future__ import annotations

from typing import Callable, Iterable, Mapping, Sequence

from condor_sched.model import Job, Resources, RunningJob, Slot

#: HTCondor's effective priority of a submitter the accountant does not know yet.
DEFAULT_PRIORITY = 0.5
#: Free capacity one turn's fair-order prefix may ask for, as a multiple (ours: 1, what could
#: fit; the turns that follow fill what packing left, so shares hold in every cycle).
WINDOW = 1.0

#: The request dimensions a policy accounts, by kind of job.
_DEVICE_DIMENSIONS = ("device_memory_mb", "device_threads")
_SPREAD_DIMENSIONS = ("cpus",)


def dominant_share(request: Resources, totals: Resources, dimensions: Sequence[str]) -> float:
    """max over ``dimensions`` of request / total (0 for a dimension the pool lacks)."""
    return max((getattr(request, d) / getattr(totals, d) for d in dimensions if getattr(totals, d) > 0), default=0.0)


def _totals(slots: Iterable[Slot]) -> Resources:
    out = Resources()
    for slot in slots:
        out = out + slot.total
    return out


def fair_order(jobs: Sequence[Job], running: Iterable[RunningJob], slots: Sequence[Slot],
               priorities: Mapping[str, float]) -> list[Job]:
    """``jobs`` in the order the negotiator's shares would serve them (module docstring)."""
    dimensions = _DEVICE_DIMENSIONS if any(j.uses_device for j in jobs) else _SPREAD_DIMENSIONS
    totals = _totals(slots)
    weight = {u: 1.0 / max(1e-9, priorities.get(u, DEFAULT_PRIORITY)) for u in {j.submitter for j in jobs}}
    held: dict[str, float] = {u: 0.0 for u in weight}
    for r in running:
        if r.job.submitter in held:
            held[r.job.submitter] += dominant_share(r.job.request, totals, dimensions)
    keyed = []
    for job in sorted(jobs, key=lambda j: (j.submitter, -j.job_prio, j.key)):
        held[job.submitter] += dominant_share(job.request, totals, dimensions)
        keyed.append((held[job.submitter] / weight[job.submitter], job.key, job))
    return [job for *_, job in sorted(keyed, key=lambda t: (t[0], t[1]))]


def fair_window(ordered: Sequence[Job], free_slots: Sequence[Slot], is_aged: Callable[[Job], bool],
                factor: float = WINDOW) -> list[Job]:
    """The prefix of ``ordered`` a cycle offers the policy (module docstring); all of it when
    one submitter has idle jobs."""
    if len({j.submitter for j in ordered}) <= 1:
        return list(ordered)
    dimensions = _DEVICE_DIMENSIONS if any(j.uses_device for j in ordered) else _SPREAD_DIMENSIONS
    free = Resources()
    for slot in free_slots:
        free = free + Resources(**{d: max(0, getattr(slot.free, d)) for d in dimensions})
    taken, used, full = [], 0.0, not any(getattr(free, d) > 0 for d in dimensions)
    for job in ordered:
        if not full:
            used += dominant_share(job.request, free, dimensions)
            full = used > factor and bool(taken)
        if not full or is_aged(job):
            taken.append(job)
    # A spread job is all the procs of its cluster (Spread-n-Share places them together): a
    # window never cuts one.
    clusters = {(j.key.schedd, j.key.cluster) for j in taken if j.wants_spread}
    chosen = {j.key for j in taken}
    return [j for j in ordered if j.key in chosen or (j.wants_spread and (j.key.schedd, j.key.cluster) in clusters)]
