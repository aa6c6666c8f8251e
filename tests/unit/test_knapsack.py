"""The per-device knapsack of paper 002 (Eq. 1, Section IV-C) and its two exact solvers."""
from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings as hsettings, strategies as st

from condor_sched.modes.planning import PlanRequest
from condor_sched.model import Job, JobKey, JobStatus, Resources, Slot, SlotKind
from condor_sched.modes.planning import PlanSettings
from condor_sched.modes.registry import get_policy
from condor_sched.modes.devices.capacity import count_weight, eq1_value, scaled_value
from condor_sched.modes.devices.knapsack import dp_bounded, solve_knapsack


def job(i: int, mem: int, threads: int, cpus: int = 1, host_mb: int = 0, submitted: int | None = None) -> Job:
    return Job(
        key=JobKey("s", i, 0),
        owner="u",
        status=JobStatus.IDLE,
        request=Resources(cpus=cpus, memory_mb=host_mb, device_memory_mb=mem, device_threads=threads),
        submitted_at_s=i if submitted is None else submitted,
    )


def device(name: str, mem: int = 8192, threads: int = 240, cpus: int = 4, host_mb: int = 1024, free: Resources | None = None) -> Slot:
    total = Resources(cpus=cpus, memory_mb=host_mb, device_memory_mb=mem, device_threads=threads)
    return Slot(name=name, machine="n", kind=SlotKind.DEVICE, total=total, free=free or total)


@pytest.mark.parametrize("threads, value", [(60, 0.9375), (240, 0.0), (180, 0.4375), (120, 0.75), (0, 1.0)])
def test_eq1_value_matches_the_paper(threads: int, value: float) -> None:
    # v = 1 - (t/240)^2: 60 -> 1 - 1/16, 180 -> 1 - 9/16, 120 -> 1 - 1/4.
    assert eq1_value(threads, 240) == pytest.approx(value)
    assert scaled_value(threads, 240) == round(value * 10_000)


def test_eq1_value_uses_the_device_hardware_threads() -> None:
    assert eq1_value(60, 120) == pytest.approx(0.75)


def brute_force(profits, weights_by_dim, caps) -> int:
    best = 0
    n = len(profits)
    for mask in itertools.product((0, 1), repeat=n):
        if all(sum(w[i] * mask[i] for i in range(n)) <= c for w, c in zip(weights_by_dim, caps)):
            best = max(best, sum(p * m for p, m in zip(profits, mask)))
    return best


def test_knapsack_picks_more_small_jobs_over_one_big_hand_checked() -> None:
    # Device 8192 MB / 240 threads, 50 MB granules -> 163 granules.
    # Jobs: A 4000 MB/240 t (80 granules, v=0), B,C,D 2000 MB/60 t (40 granules, v=.9375 each),
    # E 3000 MB/180 t (60 granules, v=.4375).
    # Threads: B+C+D = 180 <= 240, memory 120 <= 163: 3 jobs, value 2.8125. Adding E: 360 threads,
    # no. A with anything: 240 + 60 > 240. E + B: 2 jobs. So the best is {B, C, D}.
    jobs = [job(1, 4000, 240), job(2, 2000, 60), job(3, 2000, 60), job(4, 2000, 60), job(5, 3000, 180)]
    plan = get_policy("knapsack").plan(PlanRequest.of(jobs, [device("d0")]), PlanSettings())
    assert sorted(a.job.cluster for a in plan.assignments) == [2, 3, 4]
    assert plan.stats["eq1_value_sum"] == pytest.approx(3 * 0.9375)


def test_knapsack_respects_memory_hand_checked() -> None:
    # 8192 MB -> 163 granules. Four 60-thread jobs of 2100 MB = 42 granules each: 4 x 42 = 168 > 163,
    # so only 3 fit; a 180-thread job of 300 MB (6 granules) cannot join (180 + 3 x 60 > 240) but
    # 2 x 60 + ... no: 3 x 60 = 180, 60 left, so the best is 3 jobs of 60 threads.
    jobs = [job(i, 2100, 60) for i in range(4)] + [job(9, 300, 180)]
    plan = get_policy("knapsack").plan(PlanRequest.of(jobs, [device("d0")]), PlanSettings())
    assert sorted(a.job.cluster for a in plan.assignments) == [0, 1, 2]  # the three oldest


def test_memory_rounds_up_and_capacity_down() -> None:
    # 1000 MB free = 20 granules; two 510 MB jobs round up to 11 granules each: 22 > 20, only one.
    free = Resources(cpus=4, memory_mb=1024, device_memory_mb=1000, device_threads=240)
    plan = get_policy("knapsack").plan(PlanRequest.of([job(1, 510, 60), job(2, 510, 60)], [device("d0", free=free)]), PlanSettings())
    assert len(plan.assignments) == 1


def test_count_beats_eq1_value_sum() -> None:
    # Count first: two 180... not possible (360 > 240). One 240-t job (v=0) vs nothing -> placed.
    plan = get_policy("knapsack").plan(PlanRequest.of([job(1, 500, 240)], [device("d0")]), PlanSettings())
    assert len(plan.assignments) == 1


def test_host_cpus_are_a_constraint() -> None:
    # 4 cpus on the device slot, jobs take 2 each: only 2 of the four 60-thread jobs.
    jobs = [job(i, 300, 60, cpus=2) for i in range(4)]
    plan = get_policy("knapsack").plan(PlanRequest.of(jobs, [device("d0")]), PlanSettings())
    assert len(plan.assignments) == 2


def test_thread_overcommit_allows_more_threads() -> None:
    jobs = [job(i, 300, 240) for i in range(3)]
    plan = get_policy("knapsack").plan(PlanRequest.of(jobs, [device("d0")]), PlanSettings(thread_overcommit=2.0))
    assert len(plan.assignments) == 2


def test_ortools_solver_policy_matches_dp_hand_checked() -> None:
    jobs = [job(1, 4000, 240), job(2, 2000, 60), job(3, 2000, 60), job(4, 2000, 60), job(5, 3000, 180)]
    p_dp = get_policy("knapsack").plan(PlanRequest.of(jobs, [device("d0")]), PlanSettings(knapsack_solver="dp"))
    p_or = get_policy("knapsack").plan(PlanRequest.of(jobs, [device("d0")]), PlanSettings(knapsack_solver="ortools"))
    assert p_dp.assignments == p_or.assignments


items = st.lists(
    st.tuples(st.integers(1, 40), st.integers(0, 12), st.integers(0, 6), st.integers(0, 3)), min_size=0, max_size=11
)


@hsettings(max_examples=60, deadline=None)
@given(items=items, caps=st.tuples(st.integers(0, 60), st.integers(0, 24), st.integers(0, 8)))
def test_dp_and_ortools_agree_on_the_optimum(items, caps) -> None:
    profits = [p for p, *_ in items]
    weights = [[it[d + 1] for it in items] for d in range(3)]
    value = {}
    for solver in ("dp", "ortools"):
        chosen = solve_knapsack(profits, weights, list(caps), solver=solver)
        for d in range(3):
            assert sum(weights[d][i] for i in chosen) <= caps[d]
        value[solver] = sum(profits[i] for i in chosen)
    assert value["dp"] == value["ortools"] == brute_force(profits, weights, caps)


@hsettings(max_examples=40, deadline=None)
@given(
    shapes=st.lists(st.tuples(st.integers(1, 30), st.integers(1, 9), st.integers(1, 4)), min_size=1, max_size=6),
    caps=st.tuples(st.integers(0, 80), st.integers(0, 20)),
)
def test_bounded_dp_matches_the_expanded_0_1_problem(shapes, caps) -> None:
    profits = [count_weight(20) + s[0] for s in shapes]
    weights = [(s[1], s[2]) for s in shapes]
    counts = [3] * len(shapes)
    taken, exact = dp_bounded(profits, weights, counts, caps)
    assert exact
    flat = [i for i in range(len(shapes)) for _ in range(3)]
    best = solve_knapsack([profits[i] for i in flat], [[weights[i][d] for i in flat] for d in range(2)], list(caps), "ortools")
    assert sum(profits[i] * t for i, t in enumerate(taken)) == sum(profits[flat[j]] for j in best)


@hsettings(max_examples=25, deadline=None)
@given(
    specs=st.lists(st.tuples(st.sampled_from([60, 120, 180, 240]), st.integers(6, 70)), min_size=1, max_size=12),
    n_dev=st.integers(1, 3),
)
def test_knapsack_policy_dp_and_ortools_reach_the_same_value(specs, n_dev) -> None:
    jobs = [job(i, m * 50, t) for i, (t, m) in enumerate(specs)]
    slots = [device(f"d{i}") for i in range(n_dev)]
    a = get_policy("knapsack").plan(PlanRequest.of(jobs, slots), PlanSettings(knapsack_solver="dp"))
    b = get_policy("knapsack").plan(PlanRequest.of(jobs, slots), PlanSettings(knapsack_solver="ortools"))
    assert len(a.assignments) == len(b.assignments)
    assert a.stats["eq1_value_sum"] == pytest.approx(b.stats["eq1_value_sum"])
