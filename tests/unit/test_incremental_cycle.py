"""The cycle's bounded planning (``cycle.bounded_run``, ``CycleMemory.cache``) decides exactly
what planning the whole queue decides, and the simulator's results do not move with it."""
from __future__ import annotations

import json
from dataclasses import replace

import pytest

from condor_sched.cycle import BOUNDED_POLICIES, CycleConfig, CycleMemory, PlanCache, decide_cycle
from condor_sched.model import Job, JobKey, JobStatus, PoolState, Resources, Slot, SlotKind
from condor_sched.modes.planning import PlanSettings
from condor_sched.modes.registry import get_policy
from condor_sched.simulate.engine import Simulation, phi_inventory
from condor_sched.simulate.metrics import run_metrics, to_json
from condor_sched.simulate.workloads import distribution_jobs, table1_jobs


class Spy:
    """A bounded policy that records how many jobs each plan call was given."""

    def __init__(self, name: str) -> None:
        self.inner = get_policy(name)
        self.name, self.kind = self.inner.name, self.inner.kind
        self.sizes: list[int] = []

    def plan(self, request, settings):
        self.sizes.append(len(request.idle))
        return self.inner.plan(request, settings)


def _timeless(decision):
    """``decision`` without wall-clock stats (``sns`` reports its solve time even when deterministic)."""
    plans = tuple(replace(p, stats={k: v for k, v in p.stats.items() if k != "solve_time_s"}) for p in decision.plans)
    return replace(decision, plans=plans)


def _checked_run(policy_name: str, jobs, nodes: int, settings: PlanSettings):
    """Run a simulation whose every cycle is also decided on the whole queue; both must agree."""
    spy = Spy(policy_name)
    sim = Simulation(jobs, phi_inventory(nodes), spy, seed=1, cycle_s=5.0, settings=settings)
    full_config = replace(sim.config, bounded=False)
    decided = []

    def decide(memory: CycleMemory):
        state = sim.pool_state()
        bounded = decide_cycle(state, memory, sim.config)
        whole = decide_cycle(state, replace(memory, cache=None), full_config)
        assert _timeless(bounded) == _timeless(whole)
        assert _timeless(bounded).to_json() == _timeless(whole).to_json()
        decided.append(len(state.jobs))
        return bounded

    sim.decide = decide
    result = sim.run()
    return result, spy, decided


@pytest.mark.parametrize("policy,age,overcommit", [
    ("knapsack", 10**6, 1.0), ("knapsack", 2, 1.0), ("knapsack", 4, 2.0), ("knapsack", 0, 1.0),
    ("exclusive", 10**6, 1.0), ("exclusive", 2, 1.0),
])
def test_bounded_cycle_decides_what_the_whole_queue_decides(policy, age, overcommit):
    settings = PlanSettings(age_limit_cycles=age, thread_overcommit=overcommit)
    result, spy, decided = _checked_run(policy, table1_jobs(500, 3), 2, settings)
    assert all(r.end_s is not None for r in result.jobs)
    # The bound did cut: some plan call saw fewer jobs than the queue held.
    assert min(spy.sizes) < max(decided)
    assert any(size < queue - 100 for size, queue in zip(spy.sizes, decided))


def test_bounded_cycle_agrees_on_skewed_queue_with_too_big_jobs():
    jobs = distribution_jobs("high-skew", 300, 5)
    # Jobs no 8 GB device holds, queued last: unplaced for ever, and listed first, as the policy lists them.
    big = tuple(replace(jobs[0], index=10_000 + i, device_memory_mb=9000) for i in range(60))
    slots = Simulation(jobs, phi_inventory(1), get_policy("knapsack"), seed=1).pool_state().slots
    state = PoolState(tuple(p for j in jobs + big for p in j.to_jobs()), slots)
    config = CycleConfig(get_policy("knapsack"), None, PlanSettings(age_limit_cycles=10**6))
    bounded = decide_cycle(state, CycleMemory(1), config)
    whole = decide_cycle(state, CycleMemory(1), replace(config, bounded=False))
    assert _timeless(bounded) == _timeless(whole)
    assert [u.job for u in bounded.plans[0].unplaced[:60]] == [b.key for b in big]
    assert bounded.pins and len(bounded.plans[0].unplaced) == 360 - len(bounded.pins)


def _table(policy: str, bounded: bool, age: int) -> str:
    sim = Simulation(table1_jobs(400, 7), phi_inventory(3), get_policy(policy), seed=7, cycle_s=5.0,
                     settings=PlanSettings(age_limit_cycles=age), bounded=bounded)
    result = sim.run()
    starts = [(r.job.index, r.start_s, r.end_s, r.slot) for r in result.jobs]
    return to_json(run_metrics(result)) + json.dumps(starts) + json.dumps([result.plans, result.cycles])


@pytest.mark.parametrize("policy,age", [("knapsack", 10**6), ("knapsack", 3), ("exclusive", 10), ("random", 10)])
def test_simulator_results_are_byte_identical_with_bounded_planning_on_and_off(policy, age):
    assert _table(policy, True, age) == _table(policy, False, age)


def test_plan_cache_entries_follow_the_job_record():
    cache = PlanCache()
    settings = PlanSettings()
    job = Job(JobKey("s", 1, 0), "u", JobStatus.IDLE, Resources(cpus=1, device_memory_mb=120, device_threads=60))
    assert cache.row(job, settings)[3].device_memory_granules == 3
    grown = replace(job, request=replace(job.request, device_memory_mb=400))
    assert cache.row(grown, settings)[3].device_memory_granules == 8  # a new record is never served a stale row
    assert cache.row(grown, replace(settings, memory_granularity_mb=100))[3].device_memory_granules == 4


def test_a_cache_handed_between_unrelated_states_never_changes_a_decision():
    total = Resources(cpus=4, memory_mb=4096, device_memory_mb=8192, device_threads=240)
    slots = tuple(Slot(f"slot1@n{i}", f"n{i}", SlotKind.DEVICE, total, total) for i in range(2))

    def queue(n: int, memory_mb: int) -> tuple[Job, ...]:
        return tuple(Job(JobKey("s", 1, i), "u", JobStatus.IDLE,
                         Resources(cpus=1, memory_mb=10, device_memory_mb=memory_mb, device_threads=60))
                     for i in range(n))

    config = CycleConfig(get_policy("knapsack"), None, PlanSettings(age_limit_cycles=10**6))
    first = decide_cycle(PoolState(queue(300, 500), slots), CycleMemory(1), config)
    state = PoolState(queue(200, 2000), slots)  # the same keys, other requests
    reused = decide_cycle(state, first.next_memory(), config)
    whole = decide_cycle(state, first.next_memory(), replace(config, bounded=False))
    assert _timeless(reused) == _timeless(whole)
    assert len(reused.pins) == 8 and len(reused.plans[0].unplaced) == 192


def test_bounded_policies_are_the_registered_greedy_ones():
    assert BOUNDED_POLICIES == {"knapsack", "exclusive"}
    assert {get_policy(name).name for name in BOUNDED_POLICIES} == BOUNDED_POLICIES


def test_the_next_memory_carries_the_cache_and_plan_starts_without_one():
    total = Resources(cpus=4, memory_mb=4096, device_memory_mb=8192, device_threads=240)
    slots = (Slot("slot1@n0", "n0", SlotKind.DEVICE, total, total),)
    jobs = tuple(Job(JobKey("s", 1, i), "u", JobStatus.IDLE,
                     Resources(cpus=1, memory_mb=10, device_memory_mb=300, device_threads=60)) for i in range(50))
    state = PoolState(jobs, slots)
    config = CycleConfig(get_policy("knapsack"), None)
    assert CycleMemory.fresh(state).cache is None
    first = decide_cycle(state, CycleMemory.fresh(state), config)
    assert first.cache is not None and first.next_memory().cache is first.cache
    assert len(first.pins) == 4 and len(first.plans[0].unplaced) == 46


@pytest.mark.parametrize("age", [10**6, 3])
def test_a_large_queue_is_followed_by_its_changes_and_decides_the_same(monkeypatch, age):
    """Past ``_PATCH_MIN_JOBS`` the cycle patches its covered jobs and each shape's rows (and,
    with aging, their starving order) with what came and went (``CoveredJobs``,
    ``ShapeQueues``) rather than rebuild them."""
    from condor_sched import cycle_cache as cycle

    rebuilds = {"covered": 0, "shapes": 0}  # of a long queue
    covered_rebuild, shapes_rebuild = cycle.CoveredJobs._rebuild, cycle.ShapeQueues._rebuild

    def count(name, inner):
        def wrapped(self, jobs, *args):
            rebuilds[name] += len(jobs) >= 4 * cycle._PATCH_MIN_JOBS
            return inner(self, jobs, *args)
        return wrapped

    monkeypatch.setattr(cycle.CoveredJobs, "_rebuild", count("covered", covered_rebuild))
    monkeypatch.setattr(cycle.ShapeQueues, "_rebuild", count("shapes", shapes_rebuild))
    settings = PlanSettings(age_limit_cycles=age)
    result, spy, decided = _checked_run("knapsack", table1_jobs(1500, 2), 8, settings)
    assert all(r.end_s is not None for r in result.jobs)
    long_queue_cycles = sum(1 for n in decided if n >= 4 * cycle._PATCH_MIN_JOBS)
    assert long_queue_cycles > 20
    assert rebuilds["covered"] + rebuilds["shapes"] < long_queue_cycles // 4


def test_pins_kept_between_cycles_with_a_cache_decide_what_the_whole_queue_decides():
    total = Resources(cpus=16, memory_mb=65536, device_memory_mb=8192, device_threads=240)
    slots = tuple(Slot(f"slot1@n{i}", f"n{i}", SlotKind.DEVICE, total, total) for i in range(4))
    jobs = [Job(JobKey("s", 1, i), "u", JobStatus.IDLE,
                Resources(cpus=1, memory_mb=10, device_memory_mb=300 + 100 * (i % 7), device_threads=60),
                has_pin_clause=i % 5 != 0) for i in range(600)]
    config = CycleConfig(get_policy("knapsack"), None, PlanSettings(age_limit_cycles=10**6))
    first = decide_cycle(PoolState(tuple(jobs), slots), CycleMemory(1), config)
    # The pins were written: the pinned jobs are new records; some other jobs left the queue.
    pinned = {p.job: p.slot for p in first.pins}
    later = [replace(j, pinned_slot=pinned[j.key], pinned_cycle=1) if j.key in pinned else j
             for j in jobs if j.key.proc % 50 != 7]
    for memory_cycle, state in ((2, PoolState(tuple(later), slots)), (5, PoolState(tuple(later[3:]), slots))):
        memory = first.next_memory(memory_cycle)
        bounded = decide_cycle(state, memory, config)
        whole = decide_cycle(state, replace(memory, cache=None), replace(config, bounded=False))
        assert _timeless(bounded) == _timeless(whole)
        assert _timeless(bounded).to_json() == _timeless(whole).to_json()
        first = bounded
    assert bounded.unpins  # the pins of cycle 1 are stale by cycle 5
