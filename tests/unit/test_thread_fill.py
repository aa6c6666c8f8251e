"""``thread-fill`` (issue 12): each device filled to its threads, the larger jobs first."""
from __future__ import annotations

from collections import Counter

from condor_sched.policies import PlanRequest, PlanSettings, get_policy

from test_bounds_and_packing import device, job

NO_AGING = PlanSettings(age_limit_cycles=10**9)


def threads_placed(policy: str, jobs, slots, settings: PlanSettings = NO_AGING) -> Counter:
    by_key = {j.key: j for j in jobs}
    plan = get_policy(policy).plan(PlanRequest.of(jobs, slots), settings)
    return Counter(by_key[a.job].request.device_threads for a in plan.assignments)


def test_a_large_job_takes_the_device_with_a_small_one_where_eq1_packs_the_small_ones() -> None:
    # Eq. 1 counts first: four 60-thread jobs, and the 180-thread job waits to run alone
    # later (the tail); thread-fill starts the 180 now with one 60 beside it
    jobs = [job(i, 500, 60) for i in range(4)] + [job(4, 500, 180)]
    slots = [device(0, 8192, 240)]
    assert threads_placed("knapsack", jobs, slots) == {60: 4}
    assert threads_placed("thread-fill", jobs, slots) == {180: 1, 60: 1}


def test_among_equal_threads_the_largest_job_goes_first() -> None:
    jobs = [job(i, 500, 60) for i in range(4)] + [job(4, 500, 240)]
    assert threads_placed("thread-fill", jobs, [device(0, 8192, 240)]) == {240: 1}


def test_overcommitted_threads_are_filled_too() -> None:
    jobs = [job(i, 500, 60) for i in range(4)] + [job(4, 500, 240), job(5, 500, 240)]
    settings = PlanSettings(age_limit_cycles=10**9, thread_overcommit=2.0)
    assert threads_placed("thread-fill", jobs, [device(0, 8192, 240)], settings) == {240: 2}


def test_device_memory_still_binds() -> None:
    # the 180 fits no device's memory beside anything: the 60s fill the threads they can
    jobs = [job(0, 7900, 180)] + [job(i, 3000, 60) for i in range(1, 4)]
    assert threads_placed("thread-fill", jobs, [device(0, 8192, 240)]) == {180: 1}
    assert threads_placed("thread-fill", jobs[1:], [device(0, 8192, 240)]) == {60: 2}


def test_overcommitted_devices_prefer_jobs_that_tile_the_hardware_threads() -> None:
    # 480 plannable threads: {180, 180, 120} and {120 x 4} fill them alike; COSMIC runs two
    # 120s at once but never a 180 beside a 180 or a 120, so the 120s win (plain t^2 would
    # take the 180s)
    jobs = [job(0, 500, 180), job(1, 500, 180)] + [job(2 + i, 500, 120) for i in range(4)]
    settings = PlanSettings(age_limit_cycles=10**9, thread_overcommit=2.0)
    assert threads_placed("thread-fill", jobs, [device(0, 8192, 240)], settings) == {120: 4}
    # with threads hard every resident job's offloads fit at once: the larger job first
    jobs = [job(0, 500, 240), job(1, 500, 120), job(2, 500, 120)]
    assert threads_placed("thread-fill", jobs, [device(0, 8192, 240)]) == {240: 1}
