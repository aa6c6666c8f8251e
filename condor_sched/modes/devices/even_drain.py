"""``even-drain``: ``thread-fill``'s packing on a window that drains the queue's mix evenly.

Not in paper 002. ``thread-fill`` runs the jobs that share worst first (largest threads), which
wins on queues of a few thread sizes whose small jobs complete the large ones (Table I), but
on a queue of many shapes it leaves a tail of small-thread jobs that memory, not threads,
packs (``phi-diverse``: no better than ``lp-pack`` and 8% behind ``random``,
``scripts/bench_device_default``). ``random`` has no tail because every cycle takes a sample
of the queue's mix. This policy takes the mix without the dice: the idle jobs are interleaved
by demand shape in proportion to their counts (job i of a shape of n jobs at (i + 1/2) / n,
oldest first within a shape), the first K of that order form the window, K being
``WINDOW_ROUNDS`` times what the free devices could hold of the queue's mean job (the least
over the dimensions), and ``thread-fill`` packs the window. Jobs past their aging limit are
always in the window. A job left out waits with a reason that says so.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Sequence

from condor_sched.model import Job, Plan, Unplaced
from condor_sched.modes.devices import capacity as dv
from condor_sched.modes.devices.thread_fill import ThreadFillPolicy
from condor_sched.modes.planning import PlanRequest, PlanSettings, PolicyKind

#: The window in rounds of the free devices. 2 finished every queue of
#: ``scripts/bench_device_default`` (its seeds 1-3, which the results' seeds are not) as early as
#: 1 or earlier: up to 5% earlier where the queue is under four rounds of the pool deep.
WINDOW_ROUNDS = 2.0
#: The smallest window (a few free devices still see a choice of partners).
MIN_WINDOW = 16
#: What a job outside the window is told.
BEHIND_REASON = "its turn has not come: even-drain plans the queue's job shapes in proportion, others first"


def drain_order(jobs: Sequence[Job], settings: PlanSettings) -> list[Job]:
    """``jobs`` interleaved by demand shape in proportion to the shapes' counts, oldest first
    within a shape (module docstring); ties by job key."""
    by_shape: dict[dv.Capacity, list[Job]] = {}
    for job in sorted(jobs, key=dv.job_order):
        by_shape.setdefault(dv.demand(job, settings), []).append(job)
    keyed = [((i + 0.5) / len(members), job.key, job) for members in by_shape.values()
             for i, job in enumerate(members)]
    keyed.sort(key=lambda k: (k[0], k[1]))
    return [job for _, _, job in keyed]


def window_size(jobs: Sequence[Job], free: Sequence[dv.Capacity], settings: PlanSettings) -> int:
    """``WINDOW_ROUNDS`` times how many of the queue's mean job the free capacity holds, the
    least over the dimensions the jobs ask for; at least ``MIN_WINDOW``."""
    fits: list[float] = []
    needs = [dv.demand(j, settings) for j in jobs]
    for d in range(dv.N_DIMENSIONS):
        mean = sum(n[d] for n in needs) / len(needs)
        if mean > 0:
            fits.append(sum(c[d] for c in free) / mean)
    return max(MIN_WINDOW, int(WINDOW_ROUNDS * min(fits, default=len(jobs))))


class EvenDrainPolicy:
    """``thread-fill`` on the front of the queue's proportional interleave."""

    name = "even-drain"
    kind = PolicyKind.DEVICE

    def plan(self, request: PlanRequest, settings: PlanSettings) -> Plan:
        jobs = dv.device_jobs(request.idle)
        slots = dv.device_slots(request.slots)
        if not jobs or not slots:
            return replace(ThreadFillPolicy().plan(request, settings), policy=self.name)
        order = drain_order(jobs, settings)
        size = window_size(order, [dv.free_capacity(s, settings) for s in slots], settings)
        limit = settings.age_limit_cycles
        window = order[:size] + [j for j in order[size:] if request.age_of(j.key) > limit]
        plan = ThreadFillPolicy().plan(replace(request, idle=tuple(window)), settings)
        if len(window) == len(order):
            return replace(plan, policy=self.name)
        inside = {j.key for j in window}
        behind = tuple(Unplaced(j.key, BEHIND_REASON) for j in order if j.key not in inside)
        return replace(plan, policy=self.name, unplaced=plan.unplaced + behind,
                       stats={**plan.stats, "window": len(window)})
