"""GPU sharing on the real pool (issue 13, item 3): node6 of the default inventory is a GPU node
with two fake Tesla T4s (the pool's fake nvidia-smi answers from the node config, and a test
job declares the GPU memory its processes use in the fake's apps dir).

Jobs are pinned by hand, as the sidecar would pin them (CoSchedPinGPUs, CoSchedPinGPUMemory,
CoSchedPinGPUCompute, then CoSchedPinSlot last): the schedd transform turns the pin into the
claim's RequestCoSchedGPU<k>Memory / Compute, and the startd carves them from the GPU node's
partitionable slot. Shown here: two sharing jobs of one user on GPU 0 at once with their
CUDA / MPS environment and the p-slot's GPU 0 reduced by both; a whole-GPU job
(request_GPUs = 1) on GPU 1; another user's job on the shared GPU 0 sent back to Idle; a job
using more GPU memory than it requested stopped by the node agent."""
from __future__ import annotations

import json
import time
from pathlib import Path

import htcondor2
import pytest
from waiting import wait_until

from condor_sched.settings import DEFAULT_GPU_POLICY

pytestmark = pytest.mark.pool

NODE = "node6"
U0 = "GPU-5f1c0d1e-7a2b-4c3d-8e9f-0a1b2c3d4e50"
U1 = "GPU-5f1c0d1e-7a2b-4c3d-8e9f-0a1b2c3d4e51"
PIPE = f"/var/run/condor_sched/mps/{NODE}/pipe"
APPS = f"/var/lib/condor_sched/fake-gpu/{NODE}"
ATTRS = ["JobStatus", "RemoteHost", "LastRemoteHost", "VacateReason", "VacateReasonCode", "HoldReason",
         "CoSchedPinOriginalRequirements", "ExitBySignal", "ExitSignal"]
#: The job prints its environment, declares ``$1`` MB on its first visible GPU (0: none) as a
#: CUDA program would take it, and sleeps ``$2`` seconds.
SCRIPT = f"""#!/bin/sh
env | sort
trap 'rm -f {APPS}/$$' EXIT
if [ "$1" != 0 ]; then echo "${{CUDA_VISIBLE_DEVICES%%,*}} $1" > {APPS}/$$; fi
sleep "$2"
"""


def submit_gpu_job(pool, declare_mb: int, seconds: int, user: str = "alice", count: int = 1,
                   **requests: str) -> tuple[int, Path]:
    d = pool.job_dir(user)
    script = d / "gpu_job.sh"
    script.write_text(SCRIPT)
    script.chmod(0o755)
    desc = {"executable": str(script), "arguments": f"{declare_mb} {seconds}", "initialdir": str(d),
            "should_transfer_files": "YES", "output": "out", "error": "err", "log": "log", **requests}
    if user == pool.settings.user:
        return pool.schedd().submit(htcondor2.Submit(desc), count=count).cluster(), d
    return pool.submit_as(user, desc, [{}]), d


def pin(pool, cluster: int, gpus: str, memory_mb: int, compute: int) -> None:
    """The sidecar's pin, written as it writes it: the slot last."""
    job = f"{cluster}.0"
    for attr, value in (("CoSchedPinGPUs", f'"{gpus}"'), ("CoSchedPinGPUMemory", str(memory_mb)),
                        ("CoSchedPinGPUCompute", str(compute)), ("CoSchedPinTime", str(int(time.time()))),
                        ("CoSchedPinSlot", f'"{pool.slot(1, NODE)}"')):
        assert pool.admin_edit(job, attr, value) == 1, (job, attr)
    pool.schedd().reschedule()


def node_slots(pool) -> dict[str, dict]:
    ads = htcondor2.Collector().query(htcondor2.AdTypes.Startd, f'Machine == "{NODE}.{pool.domain}"')
    return {ad["Name"]: dict(ad) for ad in ads}


def environment_of(out: Path) -> dict[str, str]:
    return dict(line.split("=", 1) for line in out.read_text().splitlines() if "=" in line)


def test_two_sharing_jobs_share_gpu0_a_whole_gpu_job_takes_gpu1_and_another_owner_waits(pool):
    first, first_dir = submit_gpu_job(pool, 0, 40, request_GPUMemory="4000", request_GPUCompute="250")
    second, second_dir = submit_gpu_job(pool, 0, 40, request_GPUMemory="4000", request_GPUCompute="250")
    whole, whole_dir = submit_gpu_job(pool, 0, 40, request_GPUs="1")
    stranger, _ = submit_gpu_job(pool, 0, 5, user=pool.settings.second_user, request_GPUMemory="2000",
                                 request_GPUCompute="100")
    try:
        # condor_submit's own clauses, which the GPU node's slot satisfies (config.d/20)
        submitted = pool.job(first, ATTRS)["CoSchedPinOriginalRequirements"]
        assert "TARGET.GPUMemory >= RequestGPUMemory" in str(submitted), submitted
        assert "TARGET.GPUCompute >= RequestGPUCompute" in str(submitted), submitted
        assert "TARGET.GPUs >= RequestGPUs" in str(pool.job(whole, ATTRS)["CoSchedPinOriginalRequirements"])
        time.sleep(3)
        assert all(pool.job(c, ATTRS)["JobStatus"] == 1 for c in (first, second, whole))   # unpinned: they wait

        pin(pool, first, "0", 4000, 250)
        pin(pool, second, "0", 4000, 250)
        pin(pool, whole, "1", 15360, 1000)
        for cluster in (first, second, whole):
            running = pool.wait_for(cluster, lambda a: a["JobStatus"] == 2, ATTRS, timeout_s=90)
            assert f"@{NODE}@" in running["RemoteHost"], running
        p_slot = wait_until(lambda: (s := node_slots(pool)[pool.slot(1, NODE)]) and s["CoSchedGPU0Memory"] == 7360
                            and s["CoSchedGPU1Compute"] == 0 and s, "the p-slot to show all three claims")
        assert p_slot["CoSchedGPU0Compute"] == 500 and p_slot["CoSchedGPU1Memory"] == 0
        assert p_slot["TotalSlotCoSchedGPU0Memory"] == 15360 and p_slot["TotalSlotCoSchedGPU0Compute"] == 1000
        # the dynamic slots' ads reach the collector on their own updates, after the p-slot's may

        def claims() -> list[tuple[int, int, int, int]]:
            return sorted((s["CoSchedGPU0Memory"], s["CoSchedGPU0Compute"], s["CoSchedGPU1Memory"],
                           s["CoSchedGPU1Compute"]) for n, s in node_slots(pool).items() if n.startswith("slot1_"))
        expected = [(0, 0, 15360, 1000), (4000, 250, 0, 0), (4000, 250, 0, 0)]
        wait_until(lambda: claims() == expected, "the three claims' dynamic slots in the collector", 30)

        # bob's job pinned to alice's shared GPU 0: the node refuses it (MPS: one user per GPU)
        pin(pool, stranger, "0", 2000, 100)
        # (the shadow writes the reason ~10 s before the job is back to Idle)
        refused = pool.wait_for(stranger, lambda a: a.get("VacateReasonCode") == 1007 and a["JobStatus"] == 1,
                                ATTRS, timeout_s=90)
        assert "one user per GPU" in refused["VacateReason"], refused
        time.sleep(5)
        assert pool.job(stranger, ATTRS)["JobStatus"] == 1            # not started again on that pin

        for cluster in (first, second, whole):
            pool.wait_for(cluster, lambda a: a["JobStatus"] == 4, ATTRS, timeout_s=120)
        for job_dir in (first_dir, second_dir):
            env = environment_of(job_dir / "out")
            assert env["CUDA_VISIBLE_DEVICES"] == U0 and env["CUDA_MPS_PIPE_DIRECTORY"] == PIPE, env
            assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "25"
            assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=4000M"
        env = environment_of(whole_dir / "out")
        assert env["CUDA_VISIBLE_DEVICES"] == U1 and env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "100", env
        # HTCondor's own "no GPU assigned" value went to its own variable (config.d/20), not CUDA's
        assert env.get("COSCHED_HTCONDOR_ASSIGNED_GPUS") == "10000", env
    finally:
        pool.admin_remove(f"ClusterId >= {first}")


def test_a_job_using_more_gpu_memory_than_it_requested_is_stopped_by_the_node_agent_and_held(pool):
    cluster, _ = submit_gpu_job(pool, 6000, 120, request_GPUMemory="4000", request_GPUCompute="250")
    try:
        pin(pool, cluster, "0", 4000, 250)
        pool.wait_for(cluster, lambda a: a["JobStatus"] == 2, ATTRS, timeout_s=90)
        started = time.monotonic()
        ad = pool.wait_for(cluster, lambda a: a["JobStatus"] in (3, 4, 5), [*ATTRS, "HoldReason"], timeout_s=120)
        assert time.monotonic() - started < 100, ad          # long before its 120 s sleep would end
        # stopped at once by the agent, then held by the startd with the limit and the use
        assert ad["JobStatus"] == 5 and ad["HoldReason"].endswith(
            f"condor_sched: stopped on the execute node: GPU memory use 6000 MB on GPU 0 {U0} exceeds its "
            "allocation of 4000 MB"), ad
        killed = pool.info.root / f"var/lib/condor_sched/{NODE}/killed/{cluster}.0.json"
        record = json.loads(wait_until(lambda: killed.exists() and killed.read_text(), "the stop record", 30))
        assert record["reason"] == f"GPU memory use 6000 MB on GPU 0 ({U0}) exceeds its allocation of 4000 MB"
        assert record["device"] == "gpu" and record["pids"], record
    finally:
        pool.admin_remove(f"ClusterId == {cluster}")


HISTORY = ["ClusterId", "ProcId", "Owner", "JobStatus", "LastRemoteHost", "JobCurrentStartDate", "CompletionDate",
           "CoSchedPinGPUs", "CoSchedPinGPUCompute", "CoSchedPinGPUMemory"]


@pytest.mark.parametrize("gpu_policy", [DEFAULT_GPU_POLICY, "knapsack"])
def test_the_sidecar_packs_one_owners_shares_on_a_gpu_and_never_mixes_owners(pool, gpu_policy):
    """From submit files to completion with the sidecar's own pins (COSCHED_GPU_POLICY's
    default, and paper 002's knapsack on the gpu kind's device view): more of alice's shares
    than one GPU holds, a whole-GPU job and one of bob's shares. Every job ends on node6; per
    GPU, running shares never exceed its compute or memory, two of alice's shares ran there
    together, and bob's never ran beside hers."""
    from test_device_cosched import start_sidecar, stop

    shares, _ = submit_gpu_job(pool, 0, 20, request_GPUMemory="3000", request_GPUCompute="300", count=4)
    whole, _ = submit_gpu_job(pool, 0, 20, request_GPUs="1")
    stranger, _ = submit_gpu_job(pool, 0, 20, user=pool.settings.second_user, request_GPUMemory="2000",
                                 request_GPUCompute="100")
    clusters = (shares, whole, stranger)
    sidecar = start_sidecar(pool, "lp-pack", COSCHED_GPU_POLICY=gpu_policy)
    try:
        wait_until(lambda: not pool.schedd().query(" || ".join(f"ClusterId == {c}" for c in clusters),
                                                   projection=["JobStatus"]), "every GPU job to finish", 300)
    finally:
        log = stop(sidecar)
        pool.admin_remove(" || ".join(f"ClusterId == {c}" for c in clusters))
    ran = [dict(a) for c in clusters for a in pool.schedd().history(f"ClusterId == {c}", projection=HISTORY)]
    assert len(ran) == 6 and all(a["JobStatus"] == 4 for a in ran), (ran, log[-3000:])
    assert all(f"@{NODE}@" in a["LastRemoteHost"] for a in ran), ran
    per_gpu: dict[str, list[dict]] = {}
    for a in ran:
        for g in str(a["CoSchedPinGPUs"]).split(","):
            per_gpu.setdefault(g, []).append(a)
    together = False
    for jobs in per_gpu.values():
        for t in sorted({j["JobCurrentStartDate"] for j in jobs}):
            running = [j for j in jobs if j["JobCurrentStartDate"] <= t < j["CompletionDate"]]
            assert sum(j["CoSchedPinGPUCompute"] for j in running) <= 1000, running
            assert sum(j["CoSchedPinGPUMemory"] for j in running) <= 15360, running
            assert len({j["Owner"] for j in running if j["CoSchedPinGPUCompute"] < 1000}) <= 1, running
            together |= sum(1 for j in running if j["ClusterId"] == shares) >= 2
    assert together, per_gpu


def test_a_model_constraint_that_is_not_an_expression_is_refused_at_submit(pool):
    """My.CoSchedRequireGPUs carries a share's model constraint (condor_submit drops require_gpus
    without request_GPUs): the schedd refuses one that does not parse, naming it."""
    import htcondor2

    with pytest.raises(htcondor2.HTCondorException) as refused:
        pool.submit(request_GPUMemory="4000", request_GPUCompute="250", **{"My.CoSchedRequireGPUs": '"Capability >="'})
    assert "CoSchedRequireGPUs must be a string holding a ClassAd expression" in str(refused.value)
