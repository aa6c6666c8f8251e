"""The large-neighbourhood search that ends ``global`` on pools of many devices (issue 11)."""
from __future__ import annotations

import time
from collections import Counter

from hypothesis import given, settings as hsettings, strategies as st

from condor_sched.modes.planning import PlanRequest, PlanSettings
from condor_sched.modes.registry import get_policy
from condor_sched.modes.devices import capacity as dv
from condor_sched.modes.devices import neighbourhood as nb
from condor_sched.modes.devices.bounds import placed_upper_bound

from test_bounds_and_packing import device, diverse, job

SETTINGS = PlanSettings(deterministic=True, solver_time_limit_s=1.0)


def _inputs(jobs, slots, settings=SETTINGS):
    caps = {s.name: list(dv.free_capacity(s, settings)) for s in slots}
    return Counter(dv.demand(j, settings) for j in jobs), caps


def _check_valid(result: nb.SearchResult, supply: Counter, caps: dict) -> int:
    used = Counter()
    for name, counts in result.on_device.items():
        for d in range(dv.N_DIMENSIONS):
            assert sum(n * need[d] for need, n in counts.items()) <= caps[name][d]
        used.update(counts)
    assert all(used[need] <= supply[need] for need in used)
    return sum(used.values())


def test_a_step_keeps_the_count_and_takes_the_larger_jobs() -> None:
    # one device holds one of the two jobs; the step keeps one job but swaps in the larger,
    # leaving the small one unplaced (where another device's freed room can take it)
    jobs, slots = [job(1, 300, 60), job(2, 600, 60)], [device(0, 700, 240)]
    supply, caps = _inputs(jobs, slots)
    small, large = (dv.demand(j, SETTINGS) for j in jobs)
    answer, _ = nb._repack(["d000"], {"d000": {small: 1}}, {large: 1}, caps, {"d000": 240}, SETTINGS, 1.0)
    assert answer == {"d000": {large: 1}}


def test_sideways_moves_find_the_plan_count_only_moves_miss() -> None:
    # d0 (700 MB) holds the 300 MB job, d1 (400 MB) nothing: the 600 MB job is unplaced and
    # fits only d0. A step over d0 alone moves sideways (600 in, 300 out), then d1 takes
    # the 300: two jobs. Steps of one device (k = 1) cannot move a job between devices.
    jobs, slots = [job(1, 300, 60), job(2, 600, 60)], [device(0, 700, 240), device(1, 400, 240)]
    supply, caps = _inputs(jobs, slots)
    small, large = (dv.demand(j, SETTINGS) for j in jobs)
    old = nb.NEIGHBOURHOOD_DEVICES
    nb.NEIGHBOURHOOD_DEVICES = 1
    try:
        result = nb.improve({"d000": {small: 1}, "d001": {}}, {large: 1}, slots, caps, SETTINGS, 0.0, 2)
    finally:
        nb.NEIGHBOURHOOD_DEVICES = old
    assert result.on_device == {"d000": {large: 1}, "d001": {small: 1}}
    assert result.gained == 1


def test_the_search_climbs_from_nothing_to_the_bound_on_a_small_diverse_queue() -> None:
    jobs, slots = diverse(80, 8, seed=5)
    supply, caps = _inputs(jobs, slots)
    bound = placed_upper_bound(jobs, slots, SETTINGS)
    greedy = len(get_policy("knapsack").plan(PlanRequest.of(jobs, slots), SETTINGS).assignments)
    result = nb.improve({s.name: {} for s in slots}, supply, slots, caps, SETTINGS, 0.0, bound)
    placed = _check_valid(result, supply, caps)
    assert placed == result.gained and placed >= greedy, (placed, greedy, bound)
    assert result.steps > 0


def test_no_step_is_taken_when_the_plan_reaches_the_target() -> None:
    jobs, slots = diverse(40, 4, seed=2)
    supply, caps = _inputs(jobs, slots)
    result = nb.improve({s.name: {} for s in slots}, supply, slots, caps, SETTINGS, 0.0, 0)
    assert result.steps == 0 and result.gained == 0


@hsettings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10_000), n_devices=st.integers(2, 6), n_jobs=st.integers(0, 40),
       keep=st.floats(0.0, 1.0))
def test_the_plan_returned_is_valid_never_worse_and_repeatable(seed, n_devices, n_jobs, keep) -> None:
    jobs, slots = diverse(n_jobs, n_devices, seed)
    supply, caps = _inputs(jobs, slots)
    start = get_policy("knapsack").plan(PlanRequest.of(jobs, slots), SETTINGS)
    by_key = {j.key: j for j in jobs}
    on_device = {s.name: Counter() for s in slots}
    kept = start.assignments[: int(len(start.assignments) * keep)]  # a partial start too
    for a in kept:
        on_device[a.slot][dv.demand(by_key[a.job], SETTINGS)] += 1
    unplaced = supply - sum(on_device.values(), Counter())
    settings = PlanSettings(deterministic=True, solver_time_limit_s=0.2, seed=seed)
    result = nb.improve({k: dict(v) for k, v in on_device.items()}, unplaced, slots, caps, settings, 0.0, n_jobs)
    again = nb.improve({k: dict(v) for k, v in on_device.items()}, unplaced, slots, caps, settings, 0.0, n_jobs)
    assert result.on_device == again.on_device
    assert _check_valid(result, supply, caps) == len(kept) + result.gained >= len(kept)


def test_steps_side_by_side_never_take_an_unplaced_job_twice() -> None:
    # wall-clock mode: up to MAX_PARALLEL_STEPS steps are solved at once from the same
    # unplaced jobs; a step whose jobs another one took first is dropped
    jobs, slots = diverse(120, 12, seed=11)
    supply, caps = _inputs(jobs, slots)
    old = nb.MAX_PARALLEL_STEPS
    nb.MAX_PARALLEL_STEPS = 4
    try:
        result = nb.improve({s.name: {} for s in slots}, supply, slots, caps, PlanSettings(), time.perf_counter() + 1.0,
                            placed_upper_bound(jobs, slots, SETTINGS))
    finally:
        nb.MAX_PARALLEL_STEPS = old
    assert _check_valid(result, supply, caps) == result.gained > 0
