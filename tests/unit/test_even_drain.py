"""even-drain: thread-fill's packing on the front of the queue's proportional interleave."""
from __future__ import annotations

from collections import Counter

from condor_sched.modes.devices.even_drain import BEHIND_REASON, MIN_WINDOW, drain_order
from condor_sched.modes.planning import PlanRequest, PlanSettings
from condor_sched.modes.registry import get_policy

from test_bounds_and_packing import device, job

NO_AGING = PlanSettings(age_limit_cycles=10**9)


def test_shapes_are_interleaved_in_proportion_to_their_counts_oldest_first() -> None:
    # six of one shape, two of another, one of a third: at (i + 1/2) / n, ties by job key
    jobs = [job(i, 500, 60) for i in range(6)] + [job(10 + i, 1000, 60) for i in range(2)] + [job(20, 2000, 60)]
    order = [j.key.cluster for j in drain_order(list(reversed(jobs)), NO_AGING)]
    assert order == [0, 1, 10, 2, 20, 3, 4, 11, 5]


def test_the_window_holds_the_queue_mix_and_every_job_behind_it_says_why() -> None:
    # 30 older jobs of one shape, 10 newer of another; one device holds 4 of the mean job, so
    # the window is the smallest one: 12 of the first shape and 4 of the second
    jobs = [job(i, 500, 60) for i in range(30)] + [job(30 + i, 1000, 60) for i in range(10)]
    plan = get_policy("even-drain").plan(PlanRequest.of(jobs, [device(0, 8192, 240)]), NO_AGING)
    behind = {u.job.cluster for u in plan.unplaced if u.reason == BEHIND_REASON}
    planned = {a.job.cluster for a in plan.assignments} | {u.job.cluster for u in plan.unplaced} - behind
    assert len(planned) == MIN_WINDOW
    assert Counter(c >= 30 for c in planned) == {False: 12, True: 4}
    assert len(plan.assignments) == 4 and plan.policy == "even-drain"
    assert len(plan.unplaced) == len(jobs) - 4 and len(behind) == len(jobs) - MIN_WINDOW


def test_an_aged_job_is_planned_whatever_its_place() -> None:
    jobs = [job(i, 500, 60) for i in range(40)] + [job(99, 1000, 240)]
    aged = PlanSettings(age_limit_cycles=5)
    request = PlanRequest.of(jobs, [device(0, 8192, 240)], cycle=20, first_seen_cycle={jobs[-1].key: 1})
    plan = get_policy("even-drain").plan(request, aged)
    assert [a.job.cluster for a in plan.assignments] == [99]
    assert all(u.reason == BEHIND_REASON for u in plan.unplaced if u.job.cluster >= 16)


def test_a_queue_the_free_devices_hold_at_once_is_thread_fill_s_plan() -> None:
    jobs = [job(i, 300 + 100 * (i % 7), (60, 180, 240, 120)[i % 4]) for i in range(10)]
    slots = [device(d, 8192, 240) for d in range(4)]
    ours = get_policy("even-drain").plan(PlanRequest.of(jobs, slots), NO_AGING)
    theirs = get_policy("thread-fill").plan(PlanRequest.of(jobs, slots), NO_AGING)
    assert ours.assignments == theirs.assignments and ours.unplaced == theirs.unplaced
