"""No job is pinned twice in one cycle, whatever mix of device, GPU, spread and node-sharing
requests its ad carries: each job belongs to one sharing mode (``Job.sharing_mode``), and
only that mode pins, keeps or unpins it."""
from __future__ import annotations

import json
from dataclasses import replace

import classad2
from hypothesis import HealthCheck, given, settings, strategies as st

from condor_sched.classads import read_ads, state_from_ads
from condor_sched.cycle import CycleConfig, CycleMemory, decide_cycle
from condor_sched.model import Job, JobStatus, Resources, GpuRequest
from condor_sched.settings import settings_from_knobs
from test_gpu_sharing import gpu_node_ad
from test_node_sharing import CORES, NOW, SCHEDD, node_slot_ads

DEVICE_SLOTS = read_ads("examples/snapshots/default/machines.json")[:4]
SLOTS = [*DEVICE_SLOTS, *node_slot_ads("node1", busy_cpus=CORES), *node_slot_ads("node2"), gpu_node_ad("g1")]
PIN_TARGETS = ["slot2@node1.test", "slot1@g1.test", str(DEVICE_SLOTS[0]["Name"]), "slot1@gone.test"]


@st.composite
def job_ads(draw, proc: int) -> classad2.ClassAd:
    """A job asking for any mix of the four ways of sharing, idle or running, pinned or not."""
    status = draw(st.sampled_from([1, 1, 1, 2]))
    ad = classad2.ClassAd({"ClusterId": 1, "ProcId": proc, "Owner": draw(st.sampled_from(["alice", "bob"])),
                           "JobStatus": status, "QDate": NOW - 10_000 + proc, "GlobalJobId": f"{SCHEDD}#1.{proc}#1",
                           "Cmd": "/bin/app", "RequestCpus": draw(st.sampled_from([1, 2, CORES])),
                           "RequestMemory": 1000,
                           "Requirements": classad2.ExprTree("TARGET.Cpus >= RequestCpus")})
    if draw(st.booleans()):
        ad.update({"RequestPhiMemory": draw(st.sampled_from([500, 3000])), "RequestPhiThreads": 60})
    if draw(st.booleans()):
        ad.update({"RequestGPUCompute": draw(st.sampled_from([250, 1000])), "RequestGPUMemory": 4000})
    if draw(st.booleans()):
        ad["CoSchedProgram"] = draw(st.sampled_from(["MG", "CG"]))
    if draw(st.booleans()):
        ad.update({"CoSchedMalleable": True, "AllowedExecuteDuration": draw(st.sampled_from([700, 3600]))})
    if status == 1 and draw(st.booleans()):
        ad.update({"CoSchedPinSlot": draw(st.sampled_from(PIN_TARGETS)), "CoSchedPinCycle": 4,
                   "CoSchedPinMate": "1.0", "CoSchedPinGPUs": "0"})
    if status == 2:
        ad.update({"RemoteHost": draw(st.sampled_from(["slot1_1@node1.test", "slot1_1@g1.test"])),
                   "JobCurrentStartDate": NOW - 600})
    return ad


@st.composite
def queues(draw) -> list[classad2.ClassAd]:
    return [draw(job_ads(proc)) for proc in range(draw(st.integers(1, 10)))]


@given(queue=queues())
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_each_job_is_pinned_kept_or_unpinned_by_one_mode_at_most(queue):
    state = replace(state_from_ads({SCHEDD: queue}, SLOTS), observed_at_s=NOW)
    config = CycleConfig.from_settings(settings_from_knobs({"COSCHED_GPU_POLICY": "best-fit"}))
    decision = decide_cycle(state, CycleMemory(5), config)
    touched = {
        "devices and spread": [p.job for p in decision.pins] + [a.job for a in decision.kept]
        + [u.job for u in decision.unpins],
        "gpus": [p.job for p in decision.gpu_sharing.pins] + list(decision.gpu_sharing.kept)
        + [k for k, _ in decision.gpu_sharing.unpins],
        "mates": [p.job for p in decision.node_sharing.pins] + list(decision.node_sharing.kept)
        + [k for k, _ in decision.node_sharing.unpins],
    }
    pinned = [p.job for p in decision.pins] + [a.job for a in decision.kept] + \
        [p.job for p in decision.gpu_sharing.pins] + list(decision.gpu_sharing.kept) + \
        [p.job for p in decision.node_sharing.pins] + list(decision.node_sharing.kept)
    assert len(pinned) == len(set(pinned)), "a job is pinned twice in one cycle"
    owner = {}
    for mode, keys in touched.items():
        for key in keys:
            assert owner.setdefault(key, mode) == mode, f"{key} is handled by {owner[key]} and {mode}"
    modes = {j.key: j.sharing_mode for j in state.jobs}
    expected = {"devices and spread": {"devices", "spread"}, "gpus": {"gpus"}, "mates": {"mates"}}
    for key, mode in owner.items():
        assert modes[key] in expected[mode], f"{key} ({modes[key]}) was handled by {mode}"


def test_the_sharing_mode_follows_one_order_whatever_else_the_job_asks():
    base = Job(None, "alice", JobStatus.IDLE, Resources(cpus=8))  # type: ignore[arg-type]
    device = Resources(cpus=8, device_memory_mb=500, device_threads=60)
    share = GpuRequest(count=1, compute=250, memory_mb=4000)
    assert replace(base, request=device, gpu=share, spread=True, malleable=True).sharing_mode == "devices"
    assert replace(base, gpu=share, spread=True, malleable=True).sharing_mode == "gpus"
    assert replace(base, spread=True, malleable=True).sharing_mode == "spread"
    assert replace(base, malleable=True).sharing_mode == "mates"
    assert base.sharing_mode is None
    assert not replace(base, gpu=share, spread=True).wants_spread


def test_the_issues_job_is_a_gpu_share_and_never_also_a_guest():
    # malleable, whole-node, with a limit, and a GPU share: before, node sharing pinned it as
    # a guest (lengthening its mate) while GPU sharing pinned it to a GPU
    mate = classad2.ClassAd({"ClusterId": 1, "ProcId": 0, "Owner": "alice", "JobStatus": 2, "QDate": NOW - 20_000,
                             "GlobalJobId": f"{SCHEDD}#1.0#1", "Cmd": "/bin/app", "RequestCpus": CORES,
                             "RequestMemory": 1000, "Requirements": classad2.ExprTree("true"),
                             "CoSchedMalleable": True, "AllowedExecuteDuration": 3600,
                             "RemoteHost": "slot1_1@node1.test", "JobCurrentStartDate": NOW - 600})
    job = classad2.ClassAd(json.loads(mate.printJson()))
    job.update({"ProcId": 1, "JobStatus": 1, "GlobalJobId": f"{SCHEDD}#1.1#1", "AllowedExecuteDuration": 2000,
                "RequestGPUCompute": 250, "RequestGPUMemory": 4000})
    del job["RemoteHost"]
    busy_pool = [*node_slot_ads("node1", busy_cpus=CORES), gpu_node_ad("g1")]  # no free node to start it on
    state = replace(state_from_ads({SCHEDD: [mate, job]}, busy_pool), observed_at_s=NOW)
    config = CycleConfig.from_settings(settings_from_knobs({"COSCHED_GPU_POLICY": "best-fit"}))
    decision = decide_cycle(state, CycleMemory(5), config)
    assert [p.job.proc for p in decision.gpu_sharing.pins] == [1]
    assert decision.node_sharing.pins == () and decision.node_sharing.lengthen == ()
