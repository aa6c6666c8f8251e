"""``lp-pack``'s per-group dealing and its repair pass (issue 11)."""
from __future__ import annotations

from collections import Counter

from hypothesis import given, settings as hsettings, strategies as st

from condor_sched.model import Resources
from condor_sched.modes.planning import PlanRequest, PlanSettings
from condor_sched.modes.registry import get_policy
from condor_sched.modes.devices import capacity as dv
from condor_sched.modes.devices import lp_pack as packed
from condor_sched.modes.devices.bounds import placed_upper_bound
from test_bounds_and_packing import device, diverse, job


def plan_on(placements: dict[str, list[int]], jobs, slots, settings):
    by_name = {s.name: s for s in slots}
    return [(jobs[i], by_name[name], dv.demand(jobs[i], settings)) for name, idx in placements.items() for i in idx]


def check_valid(plan, jobs, slots, settings) -> None:
    """No job twice, no device beyond its free capacity or hardware threads."""
    keys = [j.key for j, _, _ in plan]
    assert len(keys) == len(set(keys))
    assert set(keys) <= {j.key for j in jobs}
    used: dict[str, list[int]] = {}
    for j, s, need in plan:
        assert need == dv.demand(j, settings)
        assert need.device_threads <= s.total.device_threads
        used[s.name] = [a + b for a, b in zip(used.get(s.name, [0] * dv.N_DIMENSIONS), need)]
    for s in slots:
        assert all(u <= c for u, c in zip(used.get(s.name, [0] * dv.N_DIMENSIONS), dv.free_capacity(s, settings)))


def test_repair_moves_a_job_to_make_room_for_an_unplaced_one() -> None:
    # d0 holds 3000 + 3000 MB (2192 left), d1 4000 MB (4192 left); the 5000 MB job fits
    # neither until the first 3000 MB job moves to d1.
    settings = PlanSettings()
    jobs = [job(0, 3000, 60), job(1, 3000, 60), job(2, 4000, 60), job(3, 5000, 60)]
    slots = [device(0, 8192, 240), device(1, 8192, 240)]
    caps = {s.name: list(dv.free_capacity(s, settings)) for s in slots}
    start = plan_on({"d000": [0, 1], "d001": [2]}, jobs, slots, settings)
    repaired = packed._repair(start, jobs, slots, caps, settings)
    assert len(repaired) == 4
    check_valid(repaired, jobs, slots, settings)


def test_repair_swaps_one_placed_job_for_two_unplaced_ones() -> None:
    settings = PlanSettings()
    jobs = [job(0, 6000, 60), job(1, 3000, 60), job(2, 3000, 60)]
    slots = [device(0, 8192, 240)]
    caps = {s.name: list(dv.free_capacity(s, settings)) for s in slots}
    repaired = packed._repair(plan_on({"d000": [0]}, jobs, slots, settings), jobs, slots, caps, settings)
    assert Counter(j.key.cluster for j, _, _ in repaired) == Counter([1, 2])


queues = st.tuples(st.integers(1, 120), st.integers(1, 12), st.integers(0, 10_000))


@hsettings(max_examples=30, deadline=None)
@given(queues)
def test_every_candidate_and_its_repair_stay_within_every_device(queue) -> None:
    n_jobs, n_devices, seed = queue
    jobs, slots = diverse(n_jobs, n_devices, seed)
    slots = [s.with_free(Resources(cpus=s.total.cpus - (i % 3), memory_mb=s.total.memory_mb,
                                   device_memory_mb=s.total.device_memory_mb // (1 + i % 2),
                                   device_threads=s.total.device_threads - 30 * (i % 2)))
             for i, s in enumerate(slots)]  # some devices partly used
    settings = PlanSettings()
    caps = {s.name: list(dv.free_capacity(s, settings)) for s in slots}
    rest = dv.device_jobs(jobs)
    for fill, packing in packed.CANDIDATES:
        plan = packed._candidate(fill, packing, rest, slots, caps, settings)
        check_valid(plan, jobs, slots, settings)
        repaired = packed._repair(plan, rest, slots, caps, settings)
        check_valid(repaired, jobs, slots, settings)
        assert len(repaired) >= len(plan)


def test_lp_pack_places_at_least_97_percent_of_the_bound_on_diverse_900_jobs_60_devices() -> None:
    jobs, slots = diverse(900, 60, seed=1)
    settings = PlanSettings()
    plan = get_policy("lp-pack").plan(PlanRequest.of(jobs, slots), settings)
    assert len(plan.assignments) >= 0.97 * placed_upper_bound(jobs, slots, settings)
