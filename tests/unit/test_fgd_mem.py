"""``fgd-mem`` (ours): FGD's fragmentation with host memory in the fit of a typical class."""
from __future__ import annotations

import numpy as np
from hypothesis import given, settings, strategies as st

from condor_sched.modes.gpus.fgd import TargetWorkload
from condor_sched.modes.gpus.fgd import fragmentation as fgd_fragmentation
from condor_sched.modes.gpus.fgd_mem import MemoryTarget, fragmentation
from condor_sched.modes.gpus.fleet import GpuFleet, GpuPlacement, GpuTask
from condor_sched.modes.gpus.fleet_policy import GpuPlanContext, free_gpu_milli, typical_tasks
from condor_sched.modes.registry import gpu_policy


def fleet_of(nodes: int, memory_mib: int = 131072, gpus: int = 2) -> GpuFleet:
    return GpuFleet([f"n{i:02d}" for i in range(nodes)], ["T4"] * nodes, [64000] * nodes, [memory_mib] * nodes,
                    [[16000] * gpus for _ in range(nodes)])


def test_typical_classes_carry_the_median_memory_of_their_tasks():
    tasks = [GpuTask("a", 1000, m, 1, 1000) for m in (100, 300, 200)] + [GpuTask("c", 2000, 50)]
    typical = dict((t.gpus, t.memory_mib) for t, _ in typical_tasks(tasks))
    assert typical == {1: 200, 0: 50}


def test_a_node_whose_memory_a_class_cannot_get_counts_all_its_free_gpu_as_fragmented():
    fleet = fleet_of(1, memory_mib=40000)
    typical = ((GpuTask("t", 1000, 48000, 1, 1000), 1.0),)
    free = free_gpu_milli(fleet)
    model_ok = MemoryTarget.of(fleet, typical).model_ok[fleet.model_of_node]
    # FGD sees two idle GPUs a one-GPU class can use; with memory, none of the 2000 is usable.
    assert fgd_fragmentation(fleet.cpu_free_milli, free, model_ok, TargetWorkload.of(fleet, typical))[0] == 0
    assert fragmentation(fleet.cpu_free_milli, fleet.memory_free_mib, free, model_ok,
                         MemoryTarget.of(fleet, typical))[0] == 2000


def test_a_memory_heavy_cpu_task_goes_where_it_strands_no_gpu():
    # n00 (128 GiB) runs a one-GPU task, n01 (512 GiB) is idle. A CPU-only task of about 98 GiB
    # leaves n00 too little memory for the typical one-GPU task (48 GiB), stranding its idle
    # GPU: fgd-mem takes n01. FGD sees no fragmentation either way, so fgd-pack takes the
    # fuller n00 (and FGD n00 by name).
    fleet = GpuFleet(["n00", "n01"], ["T4", "T4"], [64000, 64000], [131072, 524288], [[16000] * 2] * 2)
    fleet.commit(GpuTask("busy", 1000, 1024, 1, 1000), GpuPlacement(0, (0,)))
    typical = ((GpuTask("t", 1000, 48000, 1, 1000), 1.0),)
    context = GpuPlanContext(rng=np.random.default_rng(0), typical_tasks=typical)
    heavy = GpuTask("cpu", 2000, 100000)
    chosen = {name: gpu_policy(name).place(fleet.copy(), [heavy], context)[0].node for name in ("fgd", "fgd-pack", "fgd-mem")}
    assert chosen == {"fgd": 0, "fgd-pack": 0, "fgd-mem": 1}


@settings(max_examples=30, deadline=None)
@given(st.lists(st.one_of(
    st.builds(lambda m, mem: GpuTask("s", 2000, mem, 1, m), st.sampled_from((230, 460, 500, 810)),
              st.sampled_from((8000, 30000, 60000))),
    st.builds(lambda n, mem: GpuTask("w", 4000, mem, n, 1000), st.sampled_from((1, 1, 2)), st.sampled_from((30000, 60000))),
    st.builds(lambda mem: GpuTask("c", 8000, mem), st.sampled_from((20000, 90000)))), min_size=1, max_size=30))
def test_fgd_mem_never_oversubscribes_and_places_whatever_fits_somewhere(tasks):
    fleet = fleet_of(3, memory_mib=131072, gpus=4)
    context = GpuPlanContext(rng=np.random.default_rng(0), typical_tasks=typical_tasks(tasks))
    policy = gpu_policy("fgd-mem")
    for task in tasks:
        fits = fleet.node_fits(task).any()
        (placement,) = policy.place(fleet, [task], context)
        assert (placement is not None) == fits
        assert (fleet.memory_free_mib >= 0).all() and (fleet.cpu_free_milli >= 0).all()
        assert (free_gpu_milli(fleet) >= 0).all()
