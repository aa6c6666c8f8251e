"""The openb time replay (issue 13): stock HTCondor layouts and GPU policies, hand-computed."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from condor_sched.modes.gpus.fleet import GpuFleet, GpuTask
from condor_sched.modes.gpus.fleet_policy import GpuPlanContext
from condor_sched.modes.registry import gpu_policy
from condor_sched.simulate.openb import OpenbTask
from condor_sched.simulate.openb_replay import ReplayError, fleet_subset, run_replay

GPU_MB = 16000


class Counting:
    """A GPU policy that records the size of every batch it is offered."""

    def __init__(self, name):
        self.policy = gpu_policy(name)
        self.name = name
        self.offered = []

    def place(self, fleet, tasks, context):
        self.offered.append(len(tasks))
        return self.policy.place(fleet, tasks, context)


def fleet(nodes=1, gpus=1, gpu_mb=GPU_MB, models=None):
    return GpuFleet([f"n{i}" for i in range(nodes)], models or ["V100M16"] * nodes, [64000] * nodes,
                    [262144] * nodes, [[gpu_mb] * gpus for _ in range(nodes)])


def share(name, milli, memory_mb=None, gpus=1):
    return GpuTask(name, 1000, 1024, gpus, milli, memory_mb)


def timed(task, arrival_s, run_s):
    return OpenbTask(task, arrival_s, arrival_s + 3, arrival_s + 3 + run_s)


def replay(tasks, layout, the_fleet=None, cycle_s=60):
    """``policy``: best-fit, a sharing policy of issue 13."""
    return run_replay(the_fleet or fleet(), tasks, "best-fit" if layout == "policy" else layout, cycle_s, 0)


HALVES = [timed(share("a", 500), 0, 100), timed(share("b", 500), 10, 100)]


def test_native_whole_serialises_two_half_gpu_tasks_on_one_gpu():
    # a starts at cycle 0 and ends at 100; b (arrived at 10) waits for cycle 120.
    result = replay(HALVES, "native-whole")
    assert (result.mean_wait_s, result.max_wait_s, result.makespan_s) == (55, 110, 220)
    assert result.gpu_utilization == pytest.approx(2 * 1000 * 100 / (1000 * 220))
    assert result.gpu_requested_utilization == pytest.approx(2 * 500 * 100 / (1000 * 220))
    assert result.memory_oversubscriptions == 0


@pytest.mark.parametrize("layout", ["policy", "native-divide-2", "native-divide-4"])
def test_sharing_and_divide_run_two_half_gpu_tasks_together(layout):
    # b starts at the first cycle after its arrival (60), beside a.
    result = replay(HALVES, layout)
    assert (result.mean_wait_s, result.makespan_s) == (25, 160)
    assert result.memory_oversubscriptions == 0
    assert result.gpu_utilization == pytest.approx(2 * 500 * 100 / (1000 * 160))


def test_divide_hands_out_whole_parts_and_counts_them_allocated():
    # 0.3 GPU asks one of two parts (half a GPU) under -divide 2, two of four under -divide 4.
    tasks = [timed(share("a", 300), 0, 100)]
    assert replay(tasks, "native-divide-2").gpu_utilization == pytest.approx(0.5)
    assert replay(tasks, "native-divide-4").gpu_utilization == pytest.approx(0.5)
    assert replay(tasks, "policy").gpu_utilization == pytest.approx(0.3)


def test_a_task_needing_more_than_its_part_oversubscribes_under_divide_but_waits_under_sharing():
    # 12000 MB on a part of 8000: the next task on the same GPU puts it at 18000 > 16000.
    tasks = [timed(share("big", 500, 12000), 0, 100), timed(share("small", 500, 6000), 0, 100)]
    divided = replay(tasks, "native-divide-2")
    assert (divided.memory_oversubscriptions, divided.part_memory_overruns, divided.makespan_s) == (1, 1, 100)
    shared = replay(tasks, "policy")
    assert (shared.memory_oversubscriptions, shared.makespan_s, shared.mean_wait_s) == (0, 220, 60)


def test_divide_scatters_parts_over_gpus_and_oversubscribes_the_first():
    # Two GPUs, -divide 2 lists G0 G1 G0 G1: a (0.3) takes entry 0 (G0); b (0.7) entries 1, 2
    # and runs on G1 (its first) with 11200 MB; c (0.5) takes entry 3, G1: 19200 > 16000.
    # With -packed (G0 G0 G1 G1) b runs on G0 beside a (16000, full) and c alone on G1.
    tasks = [timed(share("a", 300), 0, 100), timed(share("b", 700), 0, 100), timed(share("c", 500), 0, 100)]
    scattered = replay(tasks, "native-divide-2", fleet(gpus=2))
    assert (scattered.memory_oversubscriptions, scattered.compute_oversubscriptions) == (1, 1)
    assert scattered.part_memory_overruns == 1
    packed = replay(tasks, "native-divide-2-packed", fleet(gpus=2))
    assert (packed.memory_oversubscriptions, packed.part_memory_overruns) == (0, 1)
    assert replay(tasks, "policy", fleet(gpus=2)).memory_oversubscriptions == 0


def test_whole_gpu_tasks_release_their_gpu_at_their_end():
    whole = [timed(GpuTask(f"w{i}", 1000, 1024, 1, 1000), 0, 100) for i in range(3)]
    for layout in ("policy", "native-whole", "native-divide-4"):
        result = replay(whole, layout)
        assert (result.mean_wait_s, result.makespan_s) == ((0 + 120 + 240) / 3, 340), layout


def test_whole_prefix_gives_a_policy_whole_gpus_only():
    result = replay(HALVES, "whole:best-fit")
    assert (result.layout, result.mean_wait_s, result.makespan_s) == ("whole:best-fit", 55, 220)
    assert result.mean_wait_sharing_s == 55
    assert result.gpu_utilization == pytest.approx(2 * 1000 * 100 / (1000 * 220))
    assert result.gpu_requested_utilization == pytest.approx(2 * 500 * 100 / (1000 * 220))


def test_never_scheduled_tasks_are_left_out_and_counted():
    tasks = [*HALVES, OpenbTask(share("pending", 500), 5, None, 50)]
    result = replay(tasks, "policy")
    assert (result.tasks, result.tasks_never_scheduled, result.tasks_started) == (2, 1, 2)


def test_a_list_without_time_columns_is_refused():
    with pytest.raises(ReplayError, match="inflation"):
        replay([OpenbTask(share("m", 500))], "native-whole")


@pytest.mark.parametrize("layout", ["policy", "native-whole", "native-divide-2"])
def test_the_run_ends_on_a_task_larger_than_any_node(layout):
    tasks = [timed(GpuTask("huge", 1000, 1024, 2, 1000), 0, 100), timed(share("ok", 500), 30, 100)]
    result = replay(tasks, layout)
    assert (result.tasks_unplaceable, result.tasks_started, result.tasks_never_started) == (1, 1, 0)
    assert (result.mean_wait_s, result.makespan_s) == (30, 130)


def test_a_task_of_a_model_the_fleet_lacks_is_unplaceable():
    task = GpuTask("a10", 1000, 1024, 1, 500, models=frozenset({"A10"}))
    assert replay([timed(task, 0, 10)], "native-divide-4").tasks_unplaceable == 1


@pytest.mark.parametrize("policy", ["fgd", "best-fit", "random-fit", "dot-product", "gpu-packing", "gpu-clustering"])
def test_every_gpu_policy_runs_two_half_gpu_tasks_together(policy):
    result = replay(HALVES, policy)
    assert (result.layout, result.mean_wait_s, result.makespan_s) == (policy, 25, 160)
    assert result.memory_oversubscriptions == 0


def test_an_unknown_policy_is_refused():
    with pytest.raises(ValueError, match="unknown GPU policy"):
        replay(HALVES, "no-such-policy")


def test_cycles_are_planned_only_when_something_changed():
    tasks = [timed(share("a", 500), 0, 100), timed(share("b", 500), 1_000_000, 100)]
    assert replay(tasks, "policy").planning_cycles == 2


def test_a_policy_is_offered_no_more_copies_of_a_request_than_fit():
    policy = Counting("fgd")
    tasks = [timed(share(f"t{i}", 400), 0, 100) for i in range(10)]
    result = run_replay(fleet(), tasks, policy, 60, 0, context=GpuPlanContext(np.random.default_rng(0)))
    # Two copies of 0.4 fit a GPU at a time: five rounds of two, every 120 s.
    assert policy.offered == [2] * 5
    assert result.makespan_s == 4 * 120 + 100


def test_fleet_subset_takes_every_kth_node():
    small = fleet_subset(fleet(nodes=10, models=[f"M{i % 2}" for i in range(10)]), 0.25)
    assert small.names == ["n0", "n4", "n8"]
    assert small.model_names == ["M0"]
    assert int(small.gpu_count.sum()) == 3
    assert fleet_subset(fleet(nodes=10), 0.25, offset=5).names == ["n1", "n5", "n9"]


request = st.builds(lambda g, milli, mb: (g, milli, mb), st.sampled_from([0, 1, 1, 1, 2]),
                    st.sampled_from([100, 250, 300, 500, 700, 1000]), st.sampled_from([None, 2000, 9000, 15000]))


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(request, st.integers(0, 600), st.integers(1, 400)), min_size=1, max_size=25))
def test_sharing_never_oversubscribes_a_gpu_and_no_layout_loses_a_task(trace):
    tasks = []
    for i, ((gpus, milli, mb), arrival, run) in enumerate(trace):
        if gpus == 0:
            task = GpuTask(f"t{i}", 2000, 4096)
        elif gpus == 2 or milli == 1000:
            task = GpuTask(f"t{i}", 2000, 4096, gpus, 1000)
        else:
            task = share(f"t{i}", milli, mb)
        tasks.append(timed(task, arrival, run))
    the_fleet = fleet(nodes=2, gpus=2)
    for layout in ("fgd", "best-fit", "random-fit", "whole:fgd", "native-whole", "native-divide-2", "native-divide-4"):
        result = replay(tasks, layout, the_fleet)
        if not layout.startswith("native-divide"):
            assert result.memory_oversubscriptions == 0, layout
        assert result.tasks_started + result.tasks_unplaceable == len(tasks)
        assert result.tasks_never_started == 0
