"""``lp-pack``'s upgrade pass: plans placing as many jobs, larger ones, so moves place more."""
from __future__ import annotations

from condor_sched.modes.planning import PlanRequest, PlanSettings
from condor_sched.modes.registry import get_policy
from condor_sched.modes.devices import capacity as dv
from condor_sched.modes.devices import lp_pack as packed
from test_bounds_and_packing import device, diverse, job
from test_lp_pack_repair import check_valid, plan_on


def test_an_upgrade_frees_a_smaller_job_that_the_moves_then_place() -> None:
    # d0 (400 MB) holds the 150 MB job, d1 (650 MB) the 400 MB one; the 450 MB job is
    # unplaced. Placing all three needs a cycle (450 to d1, 400 to d0, 150 to d1), which no
    # single move or two-for-one swap makes. The upgrade swaps 400 for 450 on d1; the moves
    # then put 400 on d0 by moving 150 to d1.
    settings = PlanSettings()
    jobs = [job(0, 400, 4), job(1, 450, 4), job(2, 150, 4)]
    slots = [device(0, 400, 240), device(1, 650, 240)]
    caps = {s.name: list(dv.free_capacity(s, settings)) for s in slots}
    start = plan_on({"d000": [2], "d001": [0]}, jobs, slots, settings)
    assert len(packed._repair(start, jobs, slots, caps, settings)) == 2
    upgraded = packed._repair(start, jobs, slots, caps, settings, upgrade_rounds=1)
    assert len(upgraded) == 3
    check_valid(upgraded, jobs, slots, settings)


def test_an_upgrade_takes_the_largest_unplaced_job_containing_the_smallest_placed_one() -> None:
    settings = PlanSettings()
    jobs = [job(0, 1000, 30), job(1, 2000, 30), job(2, 1500, 30), job(3, 1800, 60), job(4, 1200, 30)]
    slots = [device(0, 4000, 240)]
    caps = {s.name: list(dv.free_capacity(s, settings)) for s in slots}
    search = packed._LocalSearch(plan_on({"d000": [0, 1]}, jobs, slots, settings), jobs, slots, caps, settings)
    search.upgrade_pass()
    # 1000 MB / 30 threads goes; 1800 MB / 60 threads is the largest that contains it and fits.
    assert sorted(search.on[0]) == sorted([dv.demand(jobs[1], settings), dv.demand(jobs[3], settings)])
    assert search.gained == 0


def test_lp_pack_plans_the_same_twice() -> None:
    jobs, slots = diverse(600, 40, seed=5)
    settings = PlanSettings()
    plans = [get_policy("lp-pack").plan(PlanRequest.of(jobs, slots), settings) for _ in range(2)]
    assert [(a.job, a.slot) for a in plans[0].assignments] == [(a.job, a.slot) for a in plans[1].assignments]
