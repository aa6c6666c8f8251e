"""The FGD family's shortcuts at scale (issue 31) give the answers of the plain computation:
per-GPU fragmentation after a share from per-node counts, nodes in one state scored once, shapes
that found no room refused without a scan, a bounded number of replans, a fleet adopting a
planned copy, and the GPU mode's limits read once per cycle."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from condor_sched.modes.gpus import fgd
from condor_sched.modes.gpus.fgd import GpuClassCounts, TargetWorkload, node_scores, unusable_milli
from condor_sched.modes.gpus.fgd_mem_batch import FgdMemBatchPolicy
from condor_sched.modes.gpus.fleet import GpuFleet, GpuPlacement, GpuTask
from condor_sched.modes.gpus.fleet_policy import GpuPlanContext, NoRoom, typical_tasks
from condor_sched.modes.registry import gpu_policy

TASKS = [GpuTask("a", 2000, 4096, 1, 300), GpuTask("b", 8000, 8192, 1, 700), GpuTask("c", 4000, 4096, 2, 1000),
         GpuTask("d", 1000, 2048, 1, 1000), GpuTask("e", 16000, 1024), GpuTask("f", 1000, 1024, 1, 500)]


def fleet_of(nodes: int, gpus: int = 4) -> GpuFleet:
    return GpuFleet([f"n{i:03d}" for i in range(nodes)], ["T4", "A10"] * (nodes // 2) + ["T4"] * (nodes % 2),
                    [32000] * nodes, [65536] * nodes, [[16000] * gpus for _ in range(nodes)])


@settings(max_examples=80, deadline=None)
@given(free=st.lists(st.lists(st.integers(0, 10).map(lambda g: g * 100), min_size=4, max_size=4), min_size=1,
                     max_size=6),
       share=st.integers(1, 999), fits=st.lists(st.booleans(), min_size=6, max_size=6))
def test_fragmentation_after_a_share_on_each_gpu_equals_the_plain_measure_of_each_state_it_leaves(free, share, fits):
    fleet = fleet_of(1)
    target = TargetWorkload.of(fleet, typical_tasks(TASKS))
    classes = len(target.popularity)
    free_array = np.array(free)
    node_fits_class = np.array([fits[:classes]] * len(free)) & (target.gpus > 0)
    counts = GpuClassCounts.of(free_array, target)
    got = counts.unusable_after_share(free_array, share, node_fits_class, target)
    for k, row in enumerate(free):
        for g in range(4):
            after = np.array(row)
            after[g] -= share
            # unusable_milli's CPU test passes for every class (CPU is folded into node_fits_class)
            assert np.array_equal(got[k, g], unusable_milli(np.array(10**9), after, node_fits_class[k], target))
    assert np.allclose(counts.after_share(free_array, share, node_fits_class, target), got @ target.popularity)


def test_nodes_in_one_state_are_scored_once_and_score_as_each_would():
    fleet = fleet_of(200)
    for task, node in ((TASKS[0], 3), (TASKS[2], 50), (TASKS[1], 120)):
        fleet.commit(task, GpuPlacement(node, tuple(range(task.gpus))))
    nodes = np.arange(len(fleet))
    scored, inverse = fgd.distinct_nodes(fleet, nodes)
    assert len(scored) == 5   # two models of empty nodes, and the three nodes used
    target = TargetWorkload.of(fleet, typical_tasks(TASKS))
    for task in TASKS:
        every = node_scores(fleet, task, nodes, target)
        assert np.array_equal(node_scores(fleet, task, scored, target)[inverse], every)
    few = np.arange(fgd.DISTINCT_FROM - 1)
    assert np.array_equal(fgd.distinct_nodes(fleet, few)[0], few)   # too few to look for twins


def test_a_shape_that_found_no_room_refuses_only_tasks_asking_at_least_as_much_under_its_rule():
    no_room = NoRoom()
    no_room.add(GpuTask("x", 4000, 8192, 1, 500, gpu_memory_mb=4000, owner=1))
    assert no_room.covers(GpuTask("y", 4000, 8192, 1, 600, gpu_memory_mb=4000, owner=1))
    assert not no_room.covers(GpuTask("y", 2000, 8192, 1, 600, gpu_memory_mb=4000, owner=1))   # fewer cores
    assert not no_room.covers(GpuTask("y", 4000, 8192, 1, 600, gpu_memory_mb=4000, owner=2))   # another owner's GPUs
    assert not no_room.covers(GpuTask("y", 4000, 8192, 1, 600, owner=1))                      # memory by share
    assert not no_room.covers(GpuTask("y", 4000, 8192, 1, 600, gpu_memory_mb=4000, owner=1,
                                      models=frozenset({"T4"})))
    assert not no_room.covers(GpuTask("y", 4000, 8192, 1, 1000))                                 # a whole GPU
    no_room.add(GpuTask("w", 1000, 1024, 2, 1000))
    assert no_room.covers(GpuTask("w", 1000, 1024, 4, 1000, owner=7))   # whole GPUs: any owner
    assert not no_room.covers(GpuTask("w", 1000, 1024, 1, 1000))


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(range(len(TASKS))), st.integers(0, 3), st.integers(0, 7)), min_size=1,
                max_size=60))
def test_a_task_no_room_refuses_fits_no_node_as_the_fleet_fills(picks):
    fleet, no_room = fleet_of(3), NoRoom()
    for index, owner, node in picks:
        base = TASKS[index]
        task = GpuTask(base.name, base.cpu_milli, base.memory_mib, base.gpus, base.gpu_milli, owner=owner)
        fits = fleet.node_fits(task)
        if no_room.covers(task):
            assert not fits.any()
        elif not fits.any():
            no_room.add(task)
        elif fits[node % 3]:
            gpus = tuple(int(g) for g in np.flatnonzero(fleet.gpu_fits(task, node % 3))[:task.gpus])
            fleet.commit(task, GpuPlacement(node % 3, gpus))


def test_a_batch_past_the_replan_budget_is_planned_once_in_arrival_order():
    # Shares of 600 first, then whole GPUs: arrival order strands the whole-GPU tasks; a replan
    # with them first places more GPU compute, but only within the budget.
    tasks = [GpuTask(f"s{i}", 1000, 1024, 1, 600) for i in range(4)] + [GpuTask(f"w{i}", 1000, 1024, 1, 1000)
                                                                       for i in range(4)]
    context = GpuPlanContext(rng=np.random.default_rng(0), typical_tasks=typical_tasks(tasks))
    arrival = gpu_policy("fgd-mem").place(fleet_of(1), tasks, context)
    replanned = FgdMemBatchPolicy().place(fleet_of(1), tasks, context)
    once = FgdMemBatchPolicy(replan_budget=len(tasks) - 1).place(fleet_of(1), tasks, context)
    assert replanned != arrival and once == arrival
    assert FgdMemBatchPolicy(replan_budget=len(tasks) * 6).place(fleet_of(1), tasks, context) == replanned


def test_a_fleet_adopts_the_state_of_its_planned_copy_and_refuses_another_fleet():
    fleet = fleet_of(2)
    planned = fleet.copy()
    planned.commit(TASKS[0], GpuPlacement(1, (2,)))
    fleet.adopt(planned)
    assert fleet.gpu_free_milli[1, 2] == 700 and fleet.cpu_free_milli[1] == 30000
    with pytest.raises(ValueError, match="not a copy"):
        fleet.adopt(fleet_of(3))
    for task in TASKS:
        assert np.array_equal(fleet.gpu_fits(task, 1), fleet.gpu_fits(task)[1])
        nodes, gpus = fleet.fits(task)
        assert np.array_equal(nodes, fleet.node_fits(task)) and (gpus is None) == (task.gpus == 0)
