"""The GPU-sharing baselines of Weng et al. (ATC '23) on small hand-made fleets (issue 13)."""
from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from condor_sched.modes.planning import PolicyError
from condor_sched.modes.gpus.fgd import TargetWorkload, fgd_scores, fragmentation
from condor_sched.modes.gpus.fleet import GpuFleet, GpuPlacement, GpuTask
from condor_sched.modes.gpus.fleet_policy import GpuPlanContext, typical_tasks
from condor_sched.modes.registry import gpu_policy, gpu_policy_names

PUBLISHED = ["best-fit", "dot-product", "fgd", "gpu-clustering", "gpu-packing", "random-fit"]
#: The published six and ours (``fgd-pack``, ``fgd-mem``, ``fgd-mem-batch``).
ALL = sorted([*PUBLISHED, "fgd-pack", "fgd-mem", "fgd-mem-batch"])


def fleet_of(*nodes: tuple[str, str, int, int, int]) -> GpuFleet:
    """Nodes as (name, model, cpu milli, memory MiB, GPUs of 16000 MB)."""
    return GpuFleet([n[0] for n in nodes], [n[1] for n in nodes], [n[2] for n in nodes], [n[3] for n in nodes],
                    [[16000] * n[4] for n in nodes])


def share(name: str, milli: int, cpu: int = 1000, **kw) -> GpuTask:
    return GpuTask(name, cpu_milli=cpu, memory_mib=1024, gpus=1, gpu_milli=milli, **kw)


def whole(name: str, gpus: int, cpu: int = 1000, **kw) -> GpuTask:
    return GpuTask(name, cpu_milli=cpu, memory_mib=1024, gpus=gpus, gpu_milli=1000, **kw)


def cpu_only(name: str, cpu: int) -> GpuTask:
    return GpuTask(name, cpu_milli=cpu, memory_mib=1024)


def context(typical=()) -> GpuPlanContext:
    return GpuPlanContext(rng=np.random.default_rng(0), typical_tasks=typical)


def test_the_six_published_policies_are_registered_and_unknown_names_are_refused():
    assert set(ALL) <= set(gpu_policy_names(device_policies=False))
    assert {"knapsack", "global"} <= set(gpu_policy_names()) - set(gpu_policy_names(device_policies=False))
    for name in gpu_policy_names():
        assert gpu_policy(name).name == name
    with pytest.raises(PolicyError, match="best-fit"):
        gpu_policy("worst-fit")


def test_typical_tasks_keep_the_most_popular_classes_up_to_95_percent_renormalised():
    tasks = ([share(f"a{i}", 500) for i in range(60)] + [whole(f"b{i}", 1) for i in range(30)]
             + [cpu_only(f"c{i}", 2000) for i in range(6)] + [whole(f"d{i}", 2) for i in range(4)])
    typical = typical_tasks(tasks)
    # 60 + 30 = 90% < 95%, + 6 = 96% >= 95%: three classes, popularity over the 96 tasks kept.
    assert [(t.gpus, t.gpu_milli, t.cpu_milli) for t, _ in typical] == [(1, 500, 1000), (1, 1000, 1000), (0, 0, 2000)]
    assert [p for _, p in typical] == pytest.approx([60 / 96, 30 / 96, 6 / 96])
    assert math.isclose(sum(p for _, p in typical), 1.0)


def test_best_fit_picks_the_tightest_node():
    fleet = fleet_of(("n-a", "T4", 8000, 65536, 2), ("n-c", "T4", 8000, 65536, 1))
    # 100 * (1 - (7000/128000 * .5 + 1700/8000 * .5)) = 86 on n-a; 1 GPU (700/8000): 92 on n-c.
    [p] = gpu_policy("best-fit").place(fleet, [share("t", 300)], context())
    assert p == GpuPlacement(1, (0,))


@pytest.mark.parametrize("name", ["best-fit", "dot-product", "gpu-packing", "gpu-clustering", "fgd"])
def test_equal_scores_go_to_the_smallest_node_name(name):
    fleet = fleet_of(("n-b", "T4", 8000, 65536, 2), ("n-a", "T4", 8000, 65536, 2))
    tasks = [share("t", 300)]
    [p] = gpu_policy(name).place(fleet, tasks, context(typical_tasks(tasks)))
    assert p.node == 1  # n-a before n-b, though n-b comes first in the fleet


def test_best_fit_shares_the_tightest_gpu_of_the_node():
    fleet = fleet_of(("n", "T4", 8000, 65536, 3))
    fleet.commit(share("x", 400, cpu=0), GpuPlacement(0, (0,)))   # GPU 0: 600 free
    fleet.commit(share("y", 700, cpu=0), GpuPlacement(0, (2,)))   # GPU 2: 300 free
    [p] = gpu_policy("best-fit").place(fleet, [share("t", 250)], context())
    assert p == GpuPlacement(0, (2,))


def test_gpu_packing_prefers_a_partly_used_gpu_to_an_idle_node():
    fleet = fleet_of(("a", "T4", 8000, 65536, 2), ("b", "T4", 8000, 65536, 2))
    fleet.commit(share("x", 400, cpu=0), GpuPlacement(1, (1,)))
    # a is idle: max(33 - 2, 2) = 31; b's GPU 1 has 600 free: 100 - 60 // 10 = 94.
    [p] = gpu_policy("gpu-packing").place(fleet, [share("t", 300)], context())
    assert p == GpuPlacement(1, (1,))
    # A whole GPU: b (used node, 50 - 1 = 49) beats idle a (31).
    [p] = gpu_policy("gpu-packing").place(fleet, [whole("w", 1)], context())
    assert p == GpuPlacement(1, (0,))


def test_gpu_clustering_groups_tasks_of_one_gpu_kind():
    fleet = fleet_of(("a", "T4", 16000, 65536, 4), ("b", "T4", 16000, 65536, 4), ("c", "T4", 16000, 65536, 4))
    fleet.commit(share("s", 500), GpuPlacement(1, (0,)))
    fleet.commit(whole("w", 1), GpuPlacement(2, (0,)))
    policy = gpu_policy("gpu-clustering")
    [p] = policy.place(fleet, [share("t", 200)], context())
    assert p.node == 1      # only sharing tasks there: 75 + 25 * 4500 // 8000 = 89 (a: 25 + 12, c: 0 + 15)
    [p] = policy.place(fleet, [whole("u", 1)], context())
    assert p.node == 2      # only 1-GPU tasks there: 75 + 15 = 90 (a: 37, b: 0 + 14)
    [p] = policy.place(fleet, [whole("v", 2)], context())
    assert p.node == 0      # nobody holds 2-GPU tasks: the empty node (37) beats the others (14, 18)


def test_dot_product_prefers_the_node_whose_free_resources_align_least():
    fleet = fleet_of(("big", "T4", 64000, 65536, 8), ("small", "T4", 8000, 65536, 1))
    # big: (0.5, 1.0) . (0.03125, 0.125) / 2 = 0.0703 -> 92; small: (0.0625, 0.125) -> 99.
    [p] = gpu_policy("dot-product").place(fleet, [whole("t", 1, cpu=4000)], context())
    assert p.node == 1


def test_random_fit_spreads_over_feasible_nodes_only():
    fleet = fleet_of(("a", "T4", 64000, 65536, 8), ("b", "T4", 64000, 65536, 8), ("c", "T4", 500, 65536, 8))
    placements = gpu_policy("random-fit").place(fleet, [share(f"t{i}", 100) for i in range(40)], context())
    nodes = {p.node for p in placements}
    assert nodes == {0, 1}


def test_fgd_fragmentation_of_a_node_against_a_two_class_workload():
    # GPUs with 1000, 500, 200 and 0 free; workload: half 1 GPU x 600 (1 CPU), half CPU-only.
    fleet = fleet_of(("n", "T4", 8000, 65536, 4))
    typical = ((share("A", 600), 0.5), (cpu_only("B", 2000), 0.5))
    target = TargetWorkload.of(fleet, typical)
    free = np.array([[1000, 500, 200, 0]])
    ok = target.model_ok[[0]]
    # A fits (the idle GPU): its unusable part is 500 + 200; B uses no GPU: all 1700 count.
    assert fragmentation(np.array([8000]), free, ok, target)[0] == pytest.approx(0.5 * 700 + 0.5 * 1700)
    # Without the CPU A needs, all of the free GPU is unusable for A as well.
    assert fragmentation(np.array([500]), free, ok, target)[0] == pytest.approx(1700)


def test_fgd_takes_the_gpu_whose_use_grows_fragmentation_least_first_among_equal_scores():
    fleet = fleet_of(("n", "T4", 8000, 65536, 4))
    fleet.commit(share("x", 500, cpu=0), GpuPlacement(0, (1,)))
    fleet.commit(share("y", 800, cpu=0), GpuPlacement(0, (2,)))
    fleet.commit(whole("z", 1, cpu=0), GpuPlacement(0, (3,)))
    typical = ((share("A", 600), 0.5), (cpu_only("B", 2000), 0.5))
    # frag before 1200; a 200 share on GPU 0 -> 1100 (score 52), on GPU 1 or 2 -> 1000 (54).
    assert list(fgd_scores(np.array([100.0, 200.0]))) == [52, 54]
    [p] = gpu_policy("fgd").place(fleet, [share("t", 200, cpu=0)], context(typical))
    assert p == GpuPlacement(0, (1,))


def test_fgd_keeps_idle_nodes_for_whole_gpu_tasks():
    fleet = fleet_of(("a", "T4", 16000, 65536, 2), ("b", "T4", 16000, 65536, 2))
    fleet.commit(share("x", 500, cpu=0), GpuPlacement(1, (0,)))
    typical = ((whole("W", 1), 0.5), (share("S", 500), 0.5))
    # A 500 share on b's used GPU leaves b with one idle GPU; on a it would split an idle GPU.
    [p] = gpu_policy("fgd").place(fleet, [share("t", 500, cpu=0)], context(typical))
    assert p == GpuPlacement(1, (0,))


@pytest.mark.parametrize("name", ALL)
def test_gpu_model_constraints_are_hard(name):
    fleet = fleet_of(("a", "V100M16", 64000, 65536, 8), ("b", "T4", 2000, 65536, 1))
    tasks = [share(f"t{i}", 600, models=frozenset({"T4"})) for i in range(3)]
    placements = gpu_policy(name).place(fleet, tasks, context(typical_tasks(tasks)))
    assert placements[0] is not None and placements[0].node == 1
    assert placements[1:] == [None, None]   # GPU of b has 400 left: nowhere else may take them


@st.composite
def fleets_and_tasks(draw):
    n = draw(st.integers(1, 4))
    models = ["T4", "A10"]
    nodes = []
    for i in range(n):
        gpus = draw(st.integers(1, 4))
        nodes.append((f"n{i}", draw(st.sampled_from(models)), draw(st.integers(0, 16)) * 1000,
                      draw(st.integers(0, 32)) * 1024, [draw(st.sampled_from([8000, 16000, 24000]))] * gpus))
    fleet = GpuFleet([x[0] for x in nodes], [x[1] for x in nodes], [x[2] for x in nodes], [x[3] for x in nodes],
                     [x[4] for x in nodes])
    tasks = []
    for i in range(draw(st.integers(1, 24))):
        kind = draw(st.sampled_from(["cpu", "share", "whole"]))
        cpu, mem = draw(st.integers(0, 8)) * 500, draw(st.integers(0, 8)) * 1024
        models = draw(st.sampled_from([None, frozenset({"T4"}), frozenset({"A10", "T4"})]))
        if kind == "cpu":
            tasks.append(GpuTask(f"t{i}", cpu, mem))
        elif kind == "share":
            tasks.append(GpuTask(f"t{i}", cpu, mem, 1, draw(st.integers(1, 999)),
                                 gpu_memory_mb=draw(st.sampled_from([None, 2000, 9000])), models=models,
                                 owner=draw(st.integers(0, 1))))
        else:
            tasks.append(GpuTask(f"t{i}", cpu, mem, draw(st.integers(1, 3)), 1000, models=models))
    return fleet, tasks


@pytest.mark.parametrize("name", ALL)
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=fleets_and_tasks())
def test_placements_never_exceed_any_gpu_or_node_and_tasks_fail_only_when_they_fit_nowhere(name, case):
    fleet, tasks = case
    replay = fleet.copy()
    placements = gpu_policy(name).place(fleet, tasks, context(typical_tasks(tasks)))
    assert len(placements) == len(tasks)
    in_order = name != "fgd-mem-batch"  # replans a batch in other orders when tasks are left unplaced
    for task, placement in zip(tasks, placements):
        if placement is None:
            assert not (in_order and replay.node_fits(task).any())
            assert not fleet.node_fits(task).any()  # left unplaced: fits nowhere after the batch's plan
        else:
            replay.commit(task, placement)   # raises when it does not fit there
            if task.models is not None:
                assert replay.model_names[replay.model_of_node[placement.node]] in task.models
    for array in ("cpu_free_milli", "memory_free_mib", "gpu_free_milli", "gpu_memory_free_mb"):
        assert np.array_equal(getattr(fleet, array), getattr(replay, array))
    assert (fleet.cpu_free_milli >= 0).all() and (fleet.memory_free_mib >= 0).all()
    present = fleet.gpu_present
    assert (fleet.gpu_free_milli[present] >= 0).all() and (fleet.gpu_memory_free_mb[present] >= 0).all()


def test_fgd_memo_sees_changes_made_to_the_fleet_between_calls():
    fleet = fleet_of(("a", "T4", 16000, 65536, 2), ("b", "T4", 16000, 65536, 2))
    typical = ((whole("W", 1), 0.5), (share("S", 500), 0.5))
    policy = gpu_policy("fgd")
    [first] = policy.place(fleet, [share("t", 500, cpu=0)], context(typical))
    assert first.node == 0
    fleet.release(share("t", 500, cpu=0), first)
    fleet.commit(share("x", 500, cpu=0), GpuPlacement(1, (1,)))
    [second] = policy.place(fleet, [share("u", 500, cpu=0)], context(typical))
    assert second == GpuPlacement(1, (1,))


def go_fragmentation(cpu_left: int, gpu_left: list[int], model: str, typical) -> float:
    """``NodeGpuShareFragAmountScore`` of ``pkg/utils/frag.go``, transcribed line by line."""
    data = [0.0] * 7  # q1, q2, q3, q4, xl, xr, no_access
    for task, freq in typical:
        left_total = sum(gpu_left)
        if task.gpus == 0:
            kind = 4 if cpu_left >= task.cpu_milli else 5
        elif task.models is not None and model not in task.models:
            kind = 6
        else:
            fits_gpus = sum(1 for g in gpu_left if g >= task.gpu_milli) >= task.gpus
            kind = (2 if cpu_left >= task.cpu_milli else 3) if fits_gpus else (1 if cpu_left >= task.cpu_milli else 0)
        if kind == 2:
            frag = sum(g for g in gpu_left if g < task.gpu_milli)
            data[1] += freq * frag
            data[2] += freq * (left_total - frag)
        else:
            data[kind] += freq * left_total
    return sum(v for i, v in enumerate(data) if i != 2)


@settings(max_examples=60, deadline=None)
@given(cpu=st.integers(0, 16).map(lambda c: c * 1000), gpus=st.lists(st.integers(0, 10).map(lambda g: g * 100),
                                                                        min_size=1, max_size=8),
       model=st.sampled_from(["T4", "A10"]), case=fleets_and_tasks())
def test_vectorised_fragmentation_equals_the_simulators_loop(cpu, gpus, model, case):
    _, tasks = case
    typical = typical_tasks(tasks)
    fleet = GpuFleet(["n"], [model], [cpu], [1], [[16000] * len(gpus)])
    target = TargetWorkload.of(fleet, typical)
    ours = fragmentation(np.array([cpu]), np.array([gpus]), target.model_ok[[0]], target)[0]
    assert ours == pytest.approx(go_fragmentation(cpu, gpus, model, typical), abs=1e-6)
