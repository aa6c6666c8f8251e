"""The phase-blind limit of issue 12: steady resident sets under COSMIC's FIFO."""
from __future__ import annotations

from collections import defaultdict

from condor_sched.simulate.steady_state import phase_blind_limit, resident_rates
from condor_sched.simulate.workloads import load_workload


def by_threads(jobs):
    out = defaultdict(list)
    for job in jobs:
        out[job.device_threads].append(job)
    return out


def test_two_full_device_jobs_keep_the_device_busy_and_a_lone_one_does_not() -> None:
    jobs = by_threads(load_workload("phi-uniform", 400, 1).jobs)
    two = resident_rates([240, 240], jobs, 240, seed=1, horizon_s=3000)
    one = resident_rates([240], jobs, 240, seed=1, horizon_s=3000)
    assert 0.97 * 240 <= two[240] <= 240.0
    # alone, its host phases leave the device idle (the offload fraction)
    assert 0.80 * 240 <= one[240] <= 0.90 * 240


def test_the_same_resident_set_runs_differently_under_other_phase_lengths() -> None:
    # {60, 60, 180, 180} tiles the device on uniform (equal phase structure) but not on
    # Table I, whose programs' offloads differ in length: the rates depend on phases
    def busy(workload: str, n: int) -> float:
        return sum(resident_rates([60, 60, 180, 180], by_threads(load_workload(workload, n, 1).jobs), 240,
                                  seed=1, horizon_s=3000).values()) / 240
    assert busy("phi-uniform", 400) > busy("phi-table1", 1000) + 0.1


def test_a_mix_chosen_without_phase_lengths_costs_table_i_time() -> None:
    # the sets chosen as if every job had the same phases are a restriction of the LP, and on
    # Table I (offloads of 5 to 40 per program) they cost more than 4% of the best mix
    limit = phase_blind_limit(load_workload("phi-table1", 300, 2).jobs, 4, 240, 2, seed=2)
    assert limit["blind_s"] > 1.04 * limit["oracle_s"]
    assert [60, 60, 180, 180] in limit["blind_sets"]
