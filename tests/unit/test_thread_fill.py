"""``thread-fill`` (issue 12): each device filled to its threads, the larger jobs first."""
from __future__ import annotations

import random
from collections import Counter
from dataclasses import replace

from condor_sched.model import JobStatus, RunningJob, Slot
from condor_sched.modes.planning import PlanRequest, PlanSettings
from condor_sched.modes.registry import get_policy
from condor_sched.modes.devices.knapsack import greedy_plan
from condor_sched.modes.devices.thread_fill import thread_profit

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


def test_fractionally_overcommitted_devices_prefer_jobs_that_tile_the_hardware_threads() -> None:
    # 360 plannable threads: {180, 180} and {120 x 3} fill them alike; COSMIC runs two 120s
    # at once but never a 180 beside a 180, so the 120s win (plain t^2 would take the 180s)
    jobs = [job(0, 500, 180), job(1, 500, 180)] + [job(2 + i, 500, 120) for i in range(3)]
    settings = PlanSettings(age_limit_cycles=10**9, thread_overcommit=1.5)
    assert threads_placed("thread-fill", jobs, [device(0, 8192, 240)], settings) == {120: 3}
    # with threads hard every resident job's offloads fit at once: the larger job first
    jobs = [job(0, 500, 240), job(1, 500, 120), job(2, 500, 120)]
    assert threads_placed("thread-fill", jobs, [device(0, 8192, 240)]) == {240: 1}


TWICE = PlanSettings(age_limit_cycles=10**9, thread_overcommit=2.0)


def running_on(slot: Slot, threads: list[int]) -> tuple[RunningJob, ...]:
    return tuple(RunningJob(replace(job(100 + i, 500, t), status=JobStatus.RUNNING), slot.name, "n", 0)
                 for i, t in enumerate(threads))


def test_overcommitted_the_small_jobs_are_kept_for_the_large_ones() -> None:
    # two 180s run; 120 of the 480 plannable threads are free. The greedy fill takes a 120
    # (more t^2), whose offloads can never run beside a 180's; the configuration LP pairs
    # each 180 with a 60 ({180, 60} twice, {120, 120}), so the two 60s join the 180s
    total = device(0, 8192, 240)
    slot = replace(total, free=replace(total.total, device_threads=240 - 360, device_memory_mb=8192 - 1000))
    jobs = [job(0, 500, 120), job(1, 500, 120), job(2, 500, 60), job(3, 500, 60)]
    request = PlanRequest.of(jobs, [slot], running=running_on(slot, [180, 180]))
    plan = get_policy("thread-fill").plan(request, TWICE)
    assert sorted(a.job.cluster for a in plan.assignments) == [2, 3]
    greedy = greedy_plan("thread-fill", request, TWICE, thread_profit(TWICE))
    assert [a.job.cluster for a in greedy.assignments] == [0]


def test_overcommitted_a_device_is_filled_with_the_largest_configurations_first() -> None:
    # the LP runs the 240s alone and pairs 180s with 60s; an empty device takes two 240s
    # (the jobs that share worst start first), the next one the two pairs
    jobs = [job(i, 500, 240) for i in range(2)] + [job(2 + i, 500, 180) for i in range(2)] \
        + [job(4 + i, 500, 60) for i in range(2)]
    slots = [device(0, 8192, 240), device(1, 8192, 240)]
    plan = get_policy("thread-fill").plan(PlanRequest.of(jobs, slots), TWICE)
    threads = {j.key: j.request.device_threads for j in jobs}
    on = {s.name: sorted(threads[a.job] for a in plan.assignments if a.slot == s.name) for s in slots}
    assert on == {"d000": [240, 240], "d001": [60, 60, 180, 180]}


def test_overcommitted_plans_never_exceed_memory_or_the_overcommitted_threads() -> None:
    rng = random.Random(5)
    jobs = [job(i, rng.randrange(300, 3401, 50), rng.choice((60, 120, 180, 240))) for i in range(300)]
    slots = [device(i, 8192, 240) for i in range(6)]
    running = running_on(slots[0], [180, 60]) + running_on(slots[1], [240])
    busy = {slots[0].name: 240, slots[1].name: 240}
    plan = get_policy("thread-fill").plan(PlanRequest.of(jobs, slots, running=running), TWICE)
    assert plan.assignments
    by_key = {j.key: j for j in jobs}
    for s in slots:
        mine = [by_key[a.job].request for a in plan.assignments if a.slot == s.name]
        assert sum(r.device_memory_mb for r in mine) <= 8192
        assert busy.get(s.name, 0) + sum(r.device_threads for r in mine) <= 480
