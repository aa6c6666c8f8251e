"""Paper 002's device policies on GPUs through the ``gpu`` kind's device view
(``condor_sched.modes.gpus.on_devices``, issue 13), the ``gpu`` kind record, and GPU nodes
whose jobs run under one execute account."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from condor_sched.device_kinds import GPU, NODE_LAYOUT, DeviceKindError, device_kind, device_kinds
from condor_sched.model import MAX_GPU_COMPUTE_OVERCOMMIT
from condor_sched.modes.registry import device_policy_names
from condor_sched.modes.gpus.fleet import NO_OWNER, GpuFleet, GpuPlacement, GpuTask
from condor_sched.modes.gpus.fleet_policy import GpuPlanContext
from condor_sched.modes.registry import gpu_policy
from test_gpu_sharing import decide, gpu_job, gpu_node_ad, pins_of

ROOT = Path(__file__).resolve().parents[2]


def share(name: str, milli: int, owner: int = 0, cpu: int = 1000, memory_mb: int | None = None,
          models: frozenset[str] | None = None) -> GpuTask:
    return GpuTask(name, cpu_milli=cpu, memory_mib=1024, gpus=1, gpu_milli=milli, gpu_memory_mb=memory_mb,
                   models=models, owner=owner)


def fleet(*gpus_per_node: int, cpu: int = 32000, memory_mb: int = 15360, models=None) -> GpuFleet:
    n = len(gpus_per_node)
    return GpuFleet([f"n{i}" for i in range(n)], list(models or ["T4"] * n), [cpu] * n, [262144] * n,
                    [[memory_mb] * g for g in gpus_per_node])


def place(name: str, f: GpuFleet, tasks) -> list[GpuPlacement | None]:
    return gpu_policy(name).place(f, tasks, GpuPlanContext(rng=np.random.default_rng(0)))


def replay_is_feasible(f: GpuFleet, tasks, placements) -> bool:
    """Committing the placements, in task order, to a fresh copy of the fleet never fails."""
    for task, where in zip(tasks, placements):
        if where is not None:
            f.commit(task, where)
    return True


MIXED = [share("a0", 250), share("b0", 500, owner=1), share("a1", 300, memory_mb=9000), share("b1", 250, owner=1),
         GpuTask("w2", 2000, 1024, gpus=2, gpu_milli=1000), GpuTask("cpu", 4000, 2048),
         share("a2", 1000), share("c0", 100, owner=2, models=frozenset({"A100"})), share("a3", 600)]


@pytest.mark.parametrize("name", device_policy_names())
def test_every_device_policy_places_gpu_tasks_that_fit_and_never_mixes_owners(name):
    f = fleet(2, 4, models=["T4", "A100"])
    before = f.copy()
    placements = place(name, f, MIXED)
    assert any(p is not None for p in placements)
    assert replay_is_feasible(before, MIXED, placements)
    owners: dict[tuple[int, int], set[int]] = {}
    for task, where in zip(MIXED, placements):
        if where is not None and task.shares_gpu:
            owners.setdefault((where.node, where.gpus[0]), set()).add(task.owner)
        if where is not None and task.models is not None:
            assert f.model_names[f.model_of_node[where.node]] in task.models
    assert all(len(o) == 1 for o in owners.values())
    assert (f.gpu_free_milli[f.gpu_present] >= 0).all() and (f.gpu_memory_free_mb[f.gpu_present] >= 0).all()
    assert placements[4] is not None and len(placements[4].gpus) == 2  # whole GPUs of one node: best-fit
    assert placements[5] is not None and placements[5].gpus == ()       # a CPU-only task: best-fit


def test_knapsack_fills_a_gpu_with_the_most_jobs_where_first_come_would_not():
    tasks = [share("big", 600), share("s1", 500), share("s2", 500)]
    placed = place("knapsack", fleet(1), tasks)
    assert placed[0] is None and placed[1] == placed[2] == GpuPlacement(0, (0,))
    assert place("exclusive", fleet(1), tasks)[0] == GpuPlacement(0, (0,))  # paper 002's FIFO baseline


def test_a_nodes_cpus_are_counted_once_for_all_its_gpus():
    tasks = [share(f"t{i}", 250, cpu=1000) for i in range(4)]
    for name in ("knapsack", "global"):
        placed = place(name, fleet(2, cpu=2000), tasks)
        assert sum(p is not None for p in placed) == 2


def test_a_share_without_gpu_memory_takes_its_share_of_the_gpu_it_lands_on():
    f = GpuFleet(["big", "small"], ["V100", "V100"], [32000, 32000], [262144] * 2, [[32768], [16384]])
    tasks = [share(f"t{i}", 500) for i in range(4)]
    placed = place("knapsack", f, tasks)
    assert all(p is not None for p in placed)
    assert f.gpu_memory_free_mb[0, 0] == 0 and f.gpu_memory_free_mb[1, 0] == 0
    whole = [share("w", 1000)]
    assert place("knapsack", fleet(1), whole)[0] == GpuPlacement(0, (0,))  # a whole GPU's memory fits exactly


def test_a_single_account_node_lets_owners_share_a_gpu():
    tasks = [share("a", 300, owner=0), share("b", 300, owner=1)]
    for single in (False, True):
        f = fleet(1)
        f.single_account[0] = single
        placed = place("fgd", f, tasks)
        assert (placed[1] is not None) is single
        f = fleet(1)
        f.single_account[0] = single
        assert (place("knapsack", f, tasks)[1] is not None) is single
    f = fleet(1)
    f.commit(tasks[0], GpuPlacement(0, (0,)))
    assert f.gpu_owner[0, 0] == 0 and NO_OWNER != 0


def test_the_sidecar_plans_gpu_jobs_with_the_knapsack_and_reads_single_account_nodes():
    jobs = [gpu_job(0, compute=600, memory=2000), gpu_job(1, compute=500, memory=2000),
            gpu_job(2, compute=500, memory=2000)]
    d = decide(jobs, [gpu_node_ad("node1", gpus=1)], knobs={"COSCHED_GPU_POLICY": "knapsack"})
    assert d.gpu_sharing.plan.policy == "knapsack"
    assert pins_of(d) == {1: ("slot1@node1.test", (0,)), 2: ("slot1@node1.test", (0,))}
    two_owners = [gpu_job(0, compute=300, memory=2000), gpu_job(1, compute=300, memory=2000, owner="bob")]
    for single in (False, True):
        node = gpu_node_ad("node1", gpus=1, CoSchedGPUSingleAccount=single)
        assert len(pins_of(decide(two_owners, [node]))) == (2 if single else 1)


def test_the_gpu_kind_record_names_what_the_readers_the_transform_and_the_node_use():
    assert device_kind("gpu") is GPU and GPU.slot_layout == NODE_LAYOUT
    assert GPU not in device_kinds() and GPU in device_kinds(None)
    assert (GPU.request_memory_attr, GPU.request_compute_attr, GPU.count_request_attr) == \
        ("RequestGPUMemory", "RequestGPUCompute", "RequestGPUs")
    transform = (ROOT / "config.d" / "10-cosched-schedd.conf").read_text()
    for k in range(GPU.max_per_node):
        assert f"SET Request{GPU.resource_attr(k, 'Memory')} " in transform
        assert f"SET Request{GPU.resource_attr(k, 'Compute')} " in transform
    assert f"Request{GPU.resource_attr(GPU.max_per_node, 'Memory')}" not in transform
    node_gpus = (ROOT / "node_hooks" / "cosched_node" / "gpus.py").read_text()
    discover = (ROOT / "node_hooks" / "cosched_node" / "discover.py").read_text()
    assert f"MAX_GPUS_PER_NODE = {GPU.max_per_node}" in node_gpus
    assert f"MAX_GPU_COMPUTE_OVERCOMMIT = {MAX_GPU_COMPUTE_OVERCOMMIT}" in node_gpus
    for name in (GPU.node_attr, GPU.count_attr, GPU.resource_prefix):
        assert name in discover
    with pytest.raises(DeviceKindError, match="slot_layout"):
        type(GPU)("bad", "BadMemory", "BadCompute", "BadName", "units", slot_layout="socket")


def test_an_inventory_device_of_the_gpu_kind_is_refused_with_where_gpus_go():
    from condor_sched.inventory import InventoryError, parse_inventory

    node = {"name": "n1", "cores": 8, "memory_mb": 8192, "sockets": [{"llc_ways": 11, "mem_bw_gbs": 50.0}],
            "devices": [{"name": "gpu0", "memory_mb": 15360, "hardware_threads": 1000, "kind": "gpu"}]}
    with pytest.raises(InventoryError, match="under 'gpus'"):
        parse_inventory({"nodes": [node]})


def test_an_overcommitted_gpu_takes_shares_up_to_its_advertised_compute_and_whole_jobs_only_idle():
    node = gpu_node_ad("node1", gpus=1, TotalSlotCoSchedGPU0Compute=1500, CoSchedGPU0Compute=1500)
    shares = [gpu_job(p, compute=250, memory=2000) for p in range(7)]
    for policy in ("best-fit", "fgd-pack", "knapsack"):
        pins = pins_of(decide(shares, [node], knobs={"COSCHED_GPU_POLICY": policy}))
        assert len(pins) == 6, policy  # 6 x 250 = 1500; memory 6 x 2000 < 15360
    whole = [gpu_job(0, compute=None, memory=None, gpus=1)]
    busy = gpu_node_ad("node1", gpus=1, TotalSlotCoSchedGPU0Compute=1500, CoSchedGPU0Compute=1250,
                       CoSchedGPU0Memory=13000)
    assert pins_of(decide(whole, [node])) == {0: ("slot1@node1.test", (0,))}
    assert pins_of(decide(whole, [busy])) == {}
