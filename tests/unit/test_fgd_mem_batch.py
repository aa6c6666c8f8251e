"""``fgd-mem-batch`` (ours): a batch replanned in other orders when tasks are left unplaced."""
from __future__ import annotations

import numpy as np
from hypothesis import given, settings, strategies as st

from condor_sched.modes.gpus.fleet import GpuFleet, GpuTask
from condor_sched.modes.gpus.fleet_policy import GpuPlanContext, typical_tasks
from condor_sched.modes.registry import gpu_policy


def fleet_of(nodes: int, gpus: int = 2, cpu: int = 32000) -> GpuFleet:
    return GpuFleet([f"n{i:02d}" for i in range(nodes)], ["T4"] * nodes, [cpu] * nodes, [131072] * nodes,
                    [[16000] * gpus for _ in range(nodes)])


def unplaced_milli(tasks, plan) -> int:
    return sum(t.gpu_milli_total for t, p in zip(tasks, plan) if p is None)


def test_the_unplaced_go_first_until_the_least_gpu_is_left_unplaced():
    # One node of two GPUs. In arrival order the shares take both GPUs and the whole-GPU task
    # fails (1000 unplaced); with it first, the 600 share fails (600); with that first, the
    # 500 one (500), the least any order leaves.
    tasks = [GpuTask("s500", 1000, 1024, 1, 500), GpuTask("s600", 1000, 1024, 1, 600), GpuTask("w", 1000, 1024, 1, 1000)]
    context = GpuPlanContext(rng=np.random.default_rng(0), typical_tasks=typical_tasks(tasks))
    online = gpu_policy("fgd-mem").place(fleet_of(1), tasks, context)
    fleet = fleet_of(1)
    plan = gpu_policy("fgd-mem-batch").place(fleet, tasks, context)
    assert unplaced_milli(tasks, online) == 1000
    assert [p is None for p in plan] == [True, False, False]
    assert fleet.allocated_gpu_milli() == 1600


batch_strategy = st.lists(st.one_of(
    st.builds(lambda m, c: GpuTask("s", c, 8192, 1, m), st.sampled_from((230, 470, 650, 810)), st.sampled_from((2000, 12000))),
    st.builds(lambda n, c: GpuTask("w", c, 16384, n, 1000), st.sampled_from((1, 1, 2, 4)), st.sampled_from((4000, 16000))),
    st.builds(lambda c: GpuTask("c", c, 32768), st.sampled_from((4000, 16000)))), min_size=1, max_size=24)


@settings(max_examples=40, deadline=None)
@given(batch_strategy, batch_strategy)
def test_never_leaves_more_unplaced_than_arrival_order_and_equals_it_when_all_fit(earlier, batch):
    context = GpuPlanContext(rng=np.random.default_rng(0), typical_tasks=typical_tasks(earlier + batch))
    fleet = fleet_of(3, gpus=4)
    gpu_policy("fgd-mem").place(fleet, earlier, context)
    online_fleet, batch_fleet = fleet.copy(), fleet.copy()
    online = gpu_policy("fgd-mem").place(online_fleet, batch, context)
    planned = gpu_policy("fgd-mem-batch").place(batch_fleet, batch, context)
    assert unplaced_milli(batch, planned) <= unplaced_milli(batch, online)
    if all(p is not None for p in online):
        assert planned == online
    assert batch_fleet.allocated_gpu_milli() == fleet.allocated_gpu_milli() + sum(
        t.gpu_milli_total for t, p in zip(batch, planned) if p is not None)
    for f in (batch_fleet,):
        assert (f.cpu_free_milli >= 0).all() and (f.memory_free_mib >= 0).all()
