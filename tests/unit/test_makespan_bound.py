"""The makespan lower bound of the device workloads (issue 12): exact on small cases, and
never above what a simulated policy reaches."""
from __future__ import annotations

import pytest

from condor_sched.modes.planning import PlanSettings
from condor_sched.simulate.makespan_bound import makespan_lower_bound
from condor_sched.simulate.study import run, spec_for
from condor_sched.simulate.workloads import SimJob, load_workload


def sim_job(i: int, threads: int, runtime_s: float, fraction: float = 0.5) -> SimJob:
    return SimJob(index=i, program="t", device_memory_mb=500, device_threads=threads,
                  exclusive_runtime_s=runtime_s, offload_fraction=fraction)


@pytest.mark.parametrize("threads, expected", [
    ((240, 240), 20.0),        # nothing shares: one after the other
    ((120, 120), 10.0),        # side by side
    ((180, 120), 20.0),        # 300 threads: one after the other
    ((120,), 10.0),            # one job never runs beside itself
    # preemptive: 180 + one 60 for 5 s, 180 + the other for 5 s, the two 60s together 5 s
    ((180, 60, 60), 15.0),
    ((60, 60, 60, 60, 60), 12.5),  # 50 s of 60-thread work, four at a time
])
def test_the_bound_tiles_thread_requests_on_one_device(threads, expected) -> None:
    jobs = [sim_job(i, t, 10.0) for i, t in enumerate(threads)]
    assert makespan_lower_bound(jobs, 1, 240) == pytest.approx(expected)


def test_overcommitted_threads_leave_only_the_offloads_to_tile() -> None:
    # two 240-thread jobs offloading half their 10 s: the offloads alternate (Fig. 2)
    jobs = [sim_job(0, 240, 10.0), sim_job(1, 240, 10.0)]
    assert makespan_lower_bound(jobs, 1, 240, thread_overcommit=2.0) == pytest.approx(10.0)
    assert makespan_lower_bound(jobs, 2, 240) == pytest.approx(10.0)  # the longest job


def test_too_many_distinct_requests_give_no_bound() -> None:
    jobs = [sim_job(i, 10 + i, 5.0) for i in range(20)]
    assert makespan_lower_bound(jobs, 2, 240) is None


@pytest.mark.parametrize("policy, overcommit", [("random", 1.0), ("thread-fill", 1.0), ("knapsack", 2.0)])
def test_no_simulated_policy_beats_the_bound(policy, overcommit) -> None:
    w = load_workload("phi-table1", 60, 3)
    settings = PlanSettings(age_limit_cycles=10**9, thread_overcommit=overcommit)
    metrics, _ = run(w.jobs, spec_for("phi-table1", policy, 5.0, settings, nodes=2), 2, 3)
    bound = makespan_lower_bound(w.jobs, 2, 240, overcommit)
    assert 0 < bound <= metrics["makespan_s"]
