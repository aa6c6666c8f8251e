"""The device-group LP bound, ``lp-pack`` and ``global``'s wall-clock limit (issue 11)."""
from __future__ import annotations

import random
import time
from collections import Counter

from hypothesis import given, settings as hsettings, strategies as st
from ortools.sat.python import cp_model

from condor_sched.model import Job, JobKey, JobStatus, Resources, Slot, SlotKind
from condor_sched.modes.planning import PlanRequest, PlanSettings
from condor_sched.modes.registry import get_policy
from condor_sched.modes.devices import capacity as dv
from condor_sched.modes.devices.bounds import aggregate_upper_bound, device_groups, group_lp, placed_upper_bound


def job(i: int, mem: int, threads: int, cpus: int = 1) -> Job:
    return Job(key=JobKey("s", i, 0), owner="u", status=JobStatus.IDLE,
               request=Resources(cpus=cpus, memory_mb=100, device_memory_mb=mem, device_threads=threads),
               submitted_at_s=i)


def device(i: int, mem: int, threads: int, cpus: int = 16) -> Slot:
    total = Resources(cpus=cpus, memory_mb=65536, device_memory_mb=mem, device_threads=threads)
    return Slot(name=f"d{i:03d}", machine="n", kind=SlotKind.DEVICE, total=total, free=total)


def diverse(n_jobs: int, n_devices: int, seed: int) -> tuple[list[Job], list[Slot]]:
    """The shape-diverse queue of issue 11 (as scripts/bench_plan builds it)."""
    rng = random.Random(seed)
    jobs = [job(i, rng.randrange(200, 3401, 50), rng.choice((4, 8, 16, 30, 60, 90, 120, 180, 240)))
            for i in range(n_jobs)]
    types = ((8192, 240), (16384, 244), (6144, 228))
    return jobs, [device(i, *types[rng.randrange(3)]) for i in range(n_devices)]


def exact_optimum(jobs: list[Job], slots: list[Slot], settings: PlanSettings) -> int:
    """Most jobs any plan places: a flat CP-SAT model x[job, device], solved to optimality."""
    model = cp_model.CpModel()
    x = {}
    for j in jobs:
        need = dv.demand(j, settings)
        for s in slots:
            if need.device_threads <= s.total.device_threads and dv.fits(need, dv.free_capacity(s, settings)):
                x[j.key, s.name] = model.new_bool_var("")
    for j in jobs:
        model.add_at_most_one(v for (k, _), v in x.items() if k == j.key)
    for s in slots:
        cap = dv.free_capacity(s, settings)
        for d in range(dv.N_DIMENSIONS):
            model.add(sum(dv.demand(j, settings)[d] * x[j.key, s.name] for j in jobs if (j.key, s.name) in x)
                      <= cap[d])
    model.maximize(sum(x.values()))
    solver = cp_model.CpSolver()
    solver.parameters.num_workers = 1
    assert solver.solve(model) == cp_model.OPTIMAL
    return round(solver.objective_value)


small_jobs = st.lists(st.tuples(st.integers(1, 70).map(lambda g: 50 * g), st.sampled_from([4, 30, 60, 120, 240]),
                                st.integers(1, 3)), min_size=1, max_size=9)
small_devices = st.lists(st.tuples(st.sampled_from([2048, 4096, 8192]), st.sampled_from([120, 228, 240]),
                                   st.integers(1, 4), st.integers(0, 2)), min_size=1, max_size=3)


@hsettings(max_examples=60, deadline=None)
@given(small_jobs, small_devices)
def test_lp_bound_is_never_below_the_exact_optimum(js, ds) -> None:
    jobs = [job(i, m, t, c) for i, (m, t, c) in enumerate(js)]
    slots = [device(i, m, t, c) for i, (m, t, c, _) in enumerate(ds)]
    slots = [s.with_free(Resources(cpus=s.total.cpus, memory_mb=s.total.memory_mb,
                                   device_memory_mb=s.total.device_memory_mb // (used + 1),
                                   device_threads=s.total.device_threads - 30 * used))
             for s, (_, _, _, used) in zip(slots, ds)]  # some devices partly used
    settings = PlanSettings()
    optimum = exact_optimum(jobs, slots, settings)
    bound = placed_upper_bound(jobs, slots, settings)
    assert optimum <= bound <= aggregate_upper_bound(jobs, slots, settings)
    # devices grouped by type (a live pool's partly used devices): looser, still a bound
    caps = {s.name: list(dv.free_capacity(s, settings)) for s in slots}
    supply = Counter(dv.demand(j, settings) for j in jobs)
    assert group_lp(supply, device_groups(slots, caps, max_groups=0)).bound >= optimum
    for name in ("knapsack", "lp-pack", "global"):
        assert len(get_policy(name).plan(PlanRequest.of(jobs, slots), settings).assignments) <= optimum


def test_lp_bound_counts_a_shape_only_against_devices_it_fits() -> None:
    # Two 240-thread jobs; one device has 240 threads, the other only 228: one job fits at
    # most, though the summed threads (468) would hold both.
    jobs = [job(0, 500, 240), job(1, 500, 240)]
    slots = [device(0, 8192, 240), device(1, 8192, 228)]
    assert aggregate_upper_bound(jobs, slots, PlanSettings()) == 1
    assert placed_upper_bound(jobs, slots, PlanSettings()) == 1
    jobs = [job(0, 5000, 60), job(1, 5000, 60), job(2, 5000, 60)]
    slots = [device(0, 8192, 240), device(1, 8192, 240)]  # memory: one such job per device
    assert placed_upper_bound(jobs, slots, PlanSettings()) == 2


def test_lp_pack_places_at_least_97_percent_of_the_bound_on_a_diverse_queue() -> None:
    jobs, slots = diverse(3000, 600, seed=5)
    settings = PlanSettings()
    plan = get_policy("lp-pack").plan(PlanRequest.of(jobs, slots), settings)
    assert len(plan.assignments) >= 0.97 * placed_upper_bound(jobs, slots, settings)


def test_lp_pack_plan_is_deterministic() -> None:
    jobs, slots = diverse(400, 40, seed=3)
    a = get_policy("lp-pack").plan(PlanRequest.of(jobs, slots), PlanSettings())
    b = get_policy("lp-pack").plan(PlanRequest.of(list(reversed(jobs)), list(reversed(slots))), PlanSettings())
    assert sorted(a.assignments, key=lambda x: x.job) == sorted(b.assignments, key=lambda x: x.job)


def test_global_stays_within_its_limit_on_a_hard_diverse_queue() -> None:
    from condor_sched.modes.devices import lp_pack as packed

    jobs, slots = diverse(4000, 800, seed=7)
    limit = 0.6
    settings = PlanSettings(solver_time_limit_s=limit)
    t0 = time.perf_counter()
    plan = get_policy("global").plan(PlanRequest.of(jobs, slots), settings)
    elapsed = time.perf_counter() - t0
    # the limit bounds the whole call; the margin covers selecting jobs and building the Plan
    assert elapsed <= limit + 0.25, elapsed
    # lp-pack's first candidate always completes, and nothing worse replaces it
    caps = {s.name: list(dv.free_capacity(s, settings)) for s in slots}
    fill, packing = packed.CANDIDATES[0]
    first = packed._candidate(fill, packing, dv.device_jobs(jobs), dv.device_slots(slots), caps, settings)
    assert len(plan.assignments) >= len(first)


diverse_queues = st.tuples(st.integers(1, 60), st.integers(1, 8), st.integers(0, 10_000))


@hsettings(max_examples=40, deadline=None)
@given(diverse_queues)
def test_knapsack_reusing_answers_gives_the_plain_mcck_plan(queue) -> None:
    """The exact speed-up (the last answer on an equal device taken again while it still
    fits) gives the same plan as solving every device's knapsack afresh."""
    from condor_sched.modes.devices.knapsack import JobPool, greedy_fill

    n_jobs, n_devices, seed = queue
    jobs, slots = diverse(n_jobs, n_devices, seed)
    rng = random.Random(seed)
    jobs = [Job(key=j.key, owner=j.owner, status=j.status, submitted_at_s=j.submitted_at_s,
                request=Resources(cpus=rng.choice((1, 1, 2)), memory_mb=100,
                                  device_memory_mb=j.request.device_memory_mb,
                                  device_threads=j.request.device_threads)) for j in jobs]
    settings = PlanSettings()
    plans = []
    for reuse in (True, False):
        state = dv.DeviceState.start(dv.device_slots(slots), settings)
        greedy_fill(JobPool.build(dv.device_jobs(jobs), settings), state, settings, reuse=reuse)
        plans.append(state.assignments)
    assert plans[0] == plans[1]
    policy_plan = get_policy("knapsack").plan(PlanRequest.of(jobs, slots), settings)
    assert list(policy_plan.assignments) == plans[1]


def test_knapsack_reuses_answers_on_a_diverse_queue() -> None:
    jobs, slots = diverse(2000, 300, seed=1)
    stats = get_policy("knapsack").plan(PlanRequest.of(jobs, slots), PlanSettings()).stats
    assert stats["knapsack_reuses"] > 0
    assert stats["knapsack_solves"] + stats["knapsack_reuses"] + stats["knapsack_cache_hits"] <= len(slots)
    assert stats["knapsack_solves"] < 0.75 * len(slots)


@hsettings(max_examples=30, deadline=None)
@given(diverse_queues)
def test_lp_pack_never_places_fewer_jobs_than_knapsack_on_small_pools(queue) -> None:
    n_jobs, n_devices, seed = queue
    jobs, slots = diverse(n_jobs, n_devices, seed)
    settings = PlanSettings()
    packed = get_policy("lp-pack").plan(PlanRequest.of(jobs, slots), settings)
    mcck = get_policy("knapsack").plan(PlanRequest.of(jobs, slots), settings)
    assert len(packed.assignments) >= len(mcck.assignments)


def test_the_sidecar_default_is_a_registered_device_policy() -> None:
    from condor_sched.modes.planning import PolicyKind
    from condor_sched.modes.registry import policy_names
    from condor_sched.settings import SidecarSettings, settings_from_knobs

    assert SidecarSettings().policy in policy_names(PolicyKind.DEVICE)
    assert settings_from_knobs({}).policy == SidecarSettings().policy
