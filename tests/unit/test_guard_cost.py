"""What the interference guard costs the device mode in the simulator (simulate/guard_cost.py):
the guard runs on simulated jobs as it does live, a pair it refuses never shares a node, a job
with nowhere else to go waits and says why, and the measured slowdowns stretch co-runners."""
from types import SimpleNamespace

import pytest

from condor_sched.interference.report import default_dataset
from condor_sched.modes.registry import get_policy
from condor_sched.simulate.engine import phi_inventory
from condor_sched.simulate.guard_cost import (
    GuardedSimulation, InterferingModel, MeasuredVerdicts, SubmittedJob, guard_cost, ill_matched_share,
    guard_inputs, kernels_for, measured_setting,
)

#: P runs a kernel the shipped model judges ill-matched with Q's and with itself.
KERNELS = {"P": "copy", "Q": "fma"}


@pytest.fixture(scope="module")
def inputs():
    return guard_inputs(str(default_dataset()))


def scenario():
    """A P job runs (so P is known), a Q job joins it, then a second P job comes."""
    return [SubmittedJob(0, "P", 1000, 60, 600.0, 0.0), SubmittedJob(1, "Q", 1000, 60, 600.0, 10.0),
            SubmittedJob(2, "P", 1000, 60, 600.0, 20.0)]


def run(nodes, setting, signals):
    sim = GuardedSimulation(scenario(), phi_inventory(nodes), get_policy("lp-pack"), setting=setting,
                            kernel_of=KERNELS, signals=signals, seed=0, cycle_s=5)
    return sim, {rec.job.index: rec for rec in sim.run().jobs}


def test_the_guard_keeps_a_refused_pair_off_the_node_the_packer_would_choose(inputs):
    setting, (_, signals) = inputs
    model = setting.model.with_profiles(signals)
    assert model.judge("copy", "fma").ill_matched and model.judge("copy", "copy").ill_matched
    _, off = run(2, None, signals)
    assert off[2].slot == off[0].slot == off[1].slot           # packed together without the guard
    _, on = run(2, setting, signals)
    assert on[0].slot == on[1].slot and on[2].slot != on[0].slot   # the second P goes to the other node
    assert on[2].start_s == off[2].start_s                          # at no cost: that node was free


def test_with_no_other_node_the_job_waits_for_the_pair_to_end_and_says_why(inputs):
    setting, (_, signals) = inputs
    sim, on = run(1, setting, signals)
    assert on[2].start_s >= max(on[0].end_s, on[1].end_s)
    assert {key.cluster for key in sim.made_to_wait} == {SubmittedJob(2, "P", 1, 1, 1.0).key.cluster}
    _, off = run(1, None, signals)
    assert off[2].start_s < off[0].end_s


def test_each_program_runs_one_kernel_drawn_per_seed():
    kernels = ["a", "b", "c", "d", "e"]
    first = kernels_for(["x", "y", "x", "z"], kernels, 1)
    assert set(first) == {"x", "y", "z"} and set(first.values()) <= set(kernels)
    assert kernels_for(["z", "x", "y"], kernels, 1) == first
    assert any(kernels_for(["x", "y", "z"], kernels, s) != first for s in range(2, 6))


def test_the_ill_matched_share_weighs_each_pair_by_its_overlap_on_one_node():
    def rec(index, program, slot, start, end):
        return SimpleNamespace(job=SimpleNamespace(index=index, program=program), slot=slot, allocations=(),
                               start_s=start, end_s=end)
    result = SimpleNamespace(jobs=[rec(0, "A", "s1", 0, 100), rec(1, "B", "s1", 50, 200), rec(2, "C", "s1", 150, 300),
                                   rec(3, "A", "s2", 0, 1000), rec(4, "never", "s2", None, None)])
    slots = {"s1": "n1", "s2": "n2"}
    kernel_of = {"A": "a", "B": "b", "C": "c"}
    # A-B overlap 50 s (ill-matched), B-C 50 s (safe); node 2 has one job
    assert ill_matched_share(result, slots, kernel_of, {("a", "b"): True, ("b", "c"): False}) == pytest.approx(0.5)
    assert ill_matched_share(result, slots, kernel_of, {}) == 0.0


def test_measured_slowdowns_stretch_jobs_that_share_a_device_and_only_them():
    class Table:
        def speed(self, placement, victim, opponent):
            return {("a", "b"): 0.5, ("b", "a"): 0.25}.get((victim, opponent))
    model = InterferingModel(Table(), {"A": "a", "B": "b"})
    jobs = [SubmittedJob(0, "A", 100, 10, 100.0, 0.0), SubmittedJob(1, "B", 100, 10, 100.0, 0.0),
            SubmittedJob(2, "A", 100, 10, 100.0, 1000.0)]
    sim = GuardedSimulation(jobs, phi_inventory(1), get_policy("lp-pack"), setting=None, kernel_of={"A": "a", "B": "b"},
                            signals={}, seed=0, cycle_s=5, model=model)
    ends = {rec.job.index: rec.end_s - rec.start_s for rec in sim.run().jobs}
    # speeds are taken as each phase starts (phases of 10 s alone): A at 0.5 all along but its
    # first phase, started before B came; B at 0.25 while A runs (about 50 s of its work),
    # then alone at full speed
    assert 190.0 < ends[0] <= 200.0
    assert 240.0 < ends[1] < 260.0
    assert ends[2] == pytest.approx(100.0)                                       # alone later: full speed


def test_measured_labels_judge_by_the_guards_program_names():
    setting = measured_setting({("copy", "fma"): True, ("fma", "fma"): False}, KERNELS)
    assert isinstance(setting.model, MeasuredVerdicts)
    names = sorted(setting.model.labels)
    assert len(names) == 2 and all(a.startswith("sim/") for a, _ in names)
    (bad,) = [pair for pair, ill in setting.model.labels.items() if ill]
    assert setting.model.judge(*reversed(bad)).ill_matched and not setting.model.judge(bad[0], bad[0]).ill_matched


def test_one_seed_reports_both_runs_the_measured_labels_and_the_slowed_runtime(inputs):
    setting, measured = inputs
    jobs = [SubmittedJob(i, "PQ"[i % 2], 1000, 60, 300.0, 20.0 * i) for i in range(8)]
    out = guard_cost(jobs, phi_inventory(2), get_policy("lp-pack"), setting, measured, seed=3, cycle_s=5)
    assert out["makespan_loss"] == pytest.approx(out["makespan_on_s"] / out["makespan_off_s"] - 1)
    assert out["oracle_makespan_loss"] == pytest.approx(out["makespan_oracle_s"] / out["makespan_off_s"] - 1)
    assert {"measured_makespan_off_s", "measured_makespan_on_s", "measured_makespan_loss"} <= set(out)
    assert out["jobs_made_to_wait_off"] == 0
    assert set(out["kernels"]) == {"P", "Q"}
