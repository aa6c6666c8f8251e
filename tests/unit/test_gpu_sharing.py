"""GPU sharing on a live pool (``condor_sched.modes.gpus.live``, issue 13): from ClassAds as a pool
shows them, through ``decide_cycle``, to the edits the sidecar writes (a recording editor)."""
from __future__ import annotations

from dataclasses import replace

import classad2
import pytest

from condor_sched.classads import state_from_ads
from condor_sched.cycle import CycleConfig, CycleMemory, decide_cycle
from condor_sched.model import JobKey
from condor_sched.settings import DEFAULT_GPU_POLICY, SettingsError, settings_from_knobs
from condor_sched.sidecar import apply_cycle
from test_sidecar import RecordingEditor

SCHEDD = "schedd@test"
NOW = 1_000_000


def gpu_node_ad(node: str, *, gpus: int = 2, model: str = "Tesla T4", memory: int = 15360, cpus: int = 16,
                free_cpus: int | None = None, used: dict[int, tuple[int, int]] | None = None,
                children: list[str] | None = None, **extra) -> classad2.ClassAd:
    """A GPU node's partitionable slot as discover.py configures it; ``used`` maps a GPU index
    to the (compute, memory) its claims hold."""
    machine = f"{node}.test"
    ad = classad2.ClassAd({"Name": f"slot1@{machine}", "Machine": machine, "PartitionableSlot": True,
                           "Arch": "X86_64", "LastHeardFrom": NOW, "TotalSlotCpus": cpus,
                           "Cpus": cpus if free_cpus is None else free_cpus, "TotalSlotMemory": 65536,
                           "Memory": 65536, "State": "Unclaimed", "CoSchedGPUNode": True, "CoSchedGPUCount": gpus})
    for k in range(gpus):
        compute, mem = (used or {}).get(k, (0, 0))
        ad.update({f"CoSchedGPU{k}Uuid": f"GPU-{node}-{k}", f"CoSchedGPU{k}DeviceName": model,
                   f"CoSchedGPU{k}Capability": 7.5, f"TotalSlotCoSchedGPU{k}Memory": memory,
                   f"CoSchedGPU{k}Memory": memory - mem, f"TotalSlotCoSchedGPU{k}Compute": 1000,
                   f"CoSchedGPU{k}Compute": 1000 - compute})
    if children is not None:
        ad["ChildName"] = children
    ad.update(extra)
    return ad


def gpu_job(proc: int, *, compute: int | None = 250, memory: int | None = 4000, gpus: int | None = None,
            owner: str = "alice", status: int = 1, qdate: int | None = None, **extra) -> classad2.ClassAd:
    ad = classad2.ClassAd({"ClusterId": 1, "ProcId": proc, "Owner": owner, "JobStatus": status,
                           "QDate": NOW - 10_000 + proc if qdate is None else qdate, "GlobalJobId": f"{SCHEDD}#1.{proc}#1",
                           "Cmd": "/bin/train", "RequestCpus": 2, "RequestMemory": 4096,
                           "Requirements": classad2.ExprTree("TARGET.Cpus >= RequestCpus")})
    for attr, value in (("RequestGPUCompute", compute), ("RequestGPUMemory", memory), ("RequestGPUs", gpus)):
        if value is not None:
            ad[attr] = value
    ad.update(extra)
    return ad


def decide(jobs, slots, cycle=5, knobs=None):
    state = replace(state_from_ads({SCHEDD: jobs}, slots), observed_at_s=NOW)
    config = CycleConfig.from_settings(settings_from_knobs({"COSCHED_GPU_POLICY": "best-fit", **(knobs or {})}))
    return decide_cycle(state, CycleMemory(cycle), config)


def key(proc: int) -> JobKey:
    return JobKey(SCHEDD, 1, proc)


def pins_of(decision):
    return {p.job.proc: (p.slot, p.gpus) for p in decision.gpu_sharing.pins}


def test_shares_of_one_owner_pack_one_gpu_and_the_pin_writes_the_slot_last():
    d = decide([gpu_job(0), gpu_job(1), gpu_job(2, compute=500, memory=6000)], [gpu_node_ad("node1")])
    pins = pins_of(d)
    assert pins == {0: ("slot1@node1.test", (0,)), 1: ("slot1@node1.test", (0,)), 2: ("slot1@node1.test", (0,))}
    assert {p.job.proc: (p.memory_mb, p.compute) for p in d.gpu_sharing.pins} == {0: (4000, 250), 1: (4000, 250),
                                                                                 2: (6000, 500)}
    assert {k.proc for k, _ in d.gpu_sharing.enrolls} == {0, 1, 2}
    assert "pinned to GPU 0 of slot1@node1.test" in d.reasons[key(0)]
    editor = RecordingEditor()
    apply_cycle(d, editor, now=NOW)
    writes = [e.attr for e in editor.edits if key(2) in e.jobs and e.attr != "CoSchedPinReason"]
    assert writes.index("Requirements") < writes.index("CoSchedPinGPUs") < writes.index("CoSchedPinSlot")
    assert writes[-1] == "CoSchedPinSlot"
    assert editor.attrs[key(2)]["CoSchedPinGPUs"] == "0"
    assert editor.attrs[key(2)]["CoSchedPinGPUMemory"] == 6000
    assert editor.attrs[key(2)]["CoSchedPinGPUCompute"] == 500


def test_a_gpu_never_holds_shares_of_two_owners():
    d = decide([gpu_job(0, owner="alice"), gpu_job(1, owner="bob")], [gpu_node_ad("node1")])
    gpus = {proc: g for proc, (_, g) in pins_of(d).items()}
    assert gpus[0] != gpus[1]
    # bob's share runs on GPU 0: alice's new share goes to the other GPU, bob's joins it
    running = gpu_job(2, owner="bob", status=2, RemoteHost="slot1_1@node1.test", JobCurrentStartDate=NOW - 60,
                      CoSchedPinGPUs="0", CoSchedPinSlot="slot1@node1.test")
    d = decide([running, gpu_job(3, owner="alice"), gpu_job(4, owner="bob")],
               [gpu_node_ad("node1", used={0: (250, 4000)}, children=["slot1_1@node1.test"])])
    assert pins_of(d) == {3: ("slot1@node1.test", (1,)), 4: ("slot1@node1.test", (0,))}


def test_compute_and_memory_of_every_gpu_are_never_oversubscribed():
    jobs = [gpu_job(i, compute=400, memory=3000) for i in range(6)] + [gpu_job(9, compute=100, memory=14000)]
    d = decide(jobs, [gpu_node_ad("node1", gpus=2)])
    per_gpu: dict[int, list[int]] = {}
    for p in d.gpu_sharing.pins:
        per_gpu.setdefault(p.gpus[0], []).append(p.job.proc)
    for gpu, procs in per_gpu.items():
        compute = sum(400 if p != 9 else 100 for p in procs)
        memory = sum(3000 if p != 9 else 14000 for p in procs)
        assert compute <= 1000 and memory <= 15360, (gpu, procs)
    placed = {p.job.proc for p in d.gpu_sharing.pins}
    assert len(placed) < 7
    for proc in (set(range(6)) | {9}) - placed:
        assert d.reasons[key(proc)].startswith("waiting: no GPU node has")


def test_whole_gpu_jobs_take_idle_gpus_of_one_node():
    d = decide([gpu_job(0, compute=None, memory=None, gpus=2), gpu_job(1, compute=None, memory=None, gpus=1)],
               [gpu_node_ad("node1", gpus=2, used={1: (250, 4000)}), gpu_node_ad("node2", gpus=4)])
    pins = pins_of(d)
    assert pins[0][0] == "slot1@node2.test" and len(pins[0][1]) == 2
    (whole,) = [p for p in d.gpu_sharing.pins if p.job == key(0)]
    assert whole.compute == 1000 and whole.memory_mb == 15360  # the whole GPU's memory
    assert pins[1] == ("slot1@node1.test", (0,))  # the idle GPU; GPU 1 holds a share


def test_a_kept_pin_holds_its_share_and_a_stale_one_is_unpinned_with_the_reason():
    kept = gpu_job(0, compute=800, memory=4000, CoSchedPinSlot="slot1@node1.test", CoSchedPinGPUs="0",
                   CoSchedPinCycle=4, Requirements=classad2.ExprTree("TARGET.Name =?= MY.CoSchedPinSlot"))
    stale = gpu_job(1, CoSchedPinSlot="slot1@node1.test", CoSchedPinGPUs="0", CoSchedPinCycle=1)
    elsewhere = gpu_job(4, CoSchedPinSlot="slot1@node1.test", CoSchedPinGPUs="1", CoSchedPinCycle=4)
    gone = gpu_job(2, CoSchedPinSlot="slot1@node9.test", CoSchedPinGPUs="0", CoSchedPinCycle=4)
    d = decide([kept, stale, gone, elsewhere, gpu_job(3, compute=500)], [gpu_node_ad("node1", gpus=1)])
    assert d.gpu_sharing.kept == (key(0),)
    unpins = dict(d.gpu_sharing.unpins)
    assert "not matched within 3 cycles" in unpins[key(1)] and "vanished" in unpins[key(2)]
    assert "names GPUs (1,)" in unpins[key(4)]
    assert 3 not in pins_of(d)  # 800 + 500 > 1000 on the one GPU
    editor = RecordingEditor()
    apply_cycle(d, editor, now=NOW)
    assert editor.attrs[key(1)]["CoSchedPinSlot"] is None and editor.attrs[key(1)]["CoSchedPinCycle"] is None
    assert "CoSchedPinGPUs" not in editor.attrs[key(1)]  # kept: see the next test


def test_a_job_matched_as_it_was_unpinned_still_owns_its_gpu():
    """An unpin can land on a job the negotiator matched in the same instant (local pool,
    after a startd restart): it runs on its claim with its pin's slot cleared. Its GPUs and
    shares stay, so another Owner's share is not put beside it."""
    raced = gpu_job(0, compute=300, memory=3000, status=2, RemoteHost="slot1_1@node1.test",
                    JobCurrentStartDate=NOW - 30, CoSchedPinGPUs="0", CoSchedPinGPUCompute=300,
                    CoSchedPinGPUMemory=3000)
    bob = gpu_job(1, compute=300, memory=3000, owner="bob")
    node = gpu_node_ad("node1", gpus=1, used={0: (300, 3000)}, children=["slot1_1@node1.test"])
    d = decide([raced, bob], [node])
    assert pins_of(d) == {} and "waiting" in d.reasons[key(1)]
    alice = gpu_job(2, compute=300, memory=3000)
    assert pins_of(decide([raced, alice], [node])) == {2: ("slot1@node1.test", (0,))}


def test_kept_pins_beyond_a_gpus_totals_are_unpinned_newest_first():
    a = gpu_job(0, compute=700, CoSchedPinSlot="slot1@node1.test", CoSchedPinGPUs="0", CoSchedPinCycle=3)
    b = gpu_job(1, compute=700, CoSchedPinSlot="slot1@node1.test", CoSchedPinGPUs="0", CoSchedPinCycle=4)
    d = decide([a, b], [gpu_node_ad("node1", gpus=1)])
    assert d.gpu_sharing.kept == (key(0),)
    assert "cannot hold it with the pins kept before it" in dict(d.gpu_sharing.unpins)[key(1)]


def claimed_node(owner: str = "alice", claimed_at: int = NOW - 2, state: str = "Claimed", activity: str = "Idle",
                 **extra) -> classad2.ClassAd:
    """node1 (one GPU) whose GPU 0 holds a running 700/1000 share of alice's (slot1_1) and a
    claim of ``owner`` for a 300/1000, 3000 MB share made at ``claimed_at``, not started yet
    (slot1_2): the ad's Child* lists as a startd advertises them."""
    lists = {"ChildName": ["slot1_1@node1.test", "slot1_2@node1.test"], "ChildState": ["Claimed", state],
             "ChildActivity": ["Busy", activity], "ChildRemoteOwner": ["alice@test", f"{owner}@test"],
             "ChildEnteredCurrentState": [NOW - 60, claimed_at], "ChildCoSchedGPU0Compute": [700, 300],
             "ChildCoSchedGPU0Memory": [4000, 3000]}
    return gpu_node_ad("node1", gpus=1, used={0: (1000, 7000)}, **{**lists, **extra})


def test_a_pin_whose_claim_the_ad_already_shows_is_kept_on_its_full_gpu_and_not_counted_twice():
    """The negotiator matched the pin and the schedd claimed it (the job still shows Idle): its
    share is out of the ad's free amounts already. Counted again, the full GPU would crowd it
    out and a new pin would describe GPUs its claim does not hold."""
    running = gpu_job(0, compute=700, status=2, RemoteHost="slot1_1@node1.test", JobCurrentStartDate=NOW - 60,
                      CoSchedPinGPUs="0", CoSchedPinSlot="slot1@node1.test")
    matched = gpu_job(1, compute=300, memory=3000, CoSchedPinSlot="slot1@node1.test", CoSchedPinGPUs="0",
                      CoSchedPinCycle=4, CoSchedPinTime=NOW - 3)
    slot = state_from_ads({SCHEDD: []}, [claimed_node()]).slots[0]
    assert [(c.name, c.owner, c.shares) for c in slot.waiting_gpu_claims] == [("slot1_2@node1.test", "alice",
                                                                              ((0, 3000, 300),))]
    d = decide([running, matched], [claimed_node()])
    assert d.gpu_sharing.kept == (key(1),) and d.gpu_sharing.unpins == ()
    for other in (claimed_node(owner="bob"), claimed_node(claimed_at=NOW - 10), claimed_node(activity="Busy"),
                  claimed_node(ChildCoSchedGPU0Memory=[4000, 2000]), claimed_node(ChildState=["Claimed"]),
                  claimed_node(ChildActivity=classad2.ExprTree("error"))):
        d = decide([running, matched], [other])   # not its claim, or lists that do not read: counted afresh
        assert "cannot hold it with the pins kept before it" in dict(d.gpu_sharing.unpins)[key(1)]
    twin = gpu_job(2, compute=300, memory=3000, CoSchedPinSlot="slot1@node1.test", CoSchedPinGPUs="0",
                   CoSchedPinCycle=4, CoSchedPinTime=NOW - 3)
    d = decide([running, matched, twin], [claimed_node()])    # one claim vouches for one job
    assert d.gpu_sharing.kept == (key(1),) and list(dict(d.gpu_sharing.unpins)) == [key(2)]
    # its GPU is alice's while the claim waits for its job: bob's share goes to the other GPU
    two = gpu_node_ad("node1", gpus=2, used={0: (300, 3000)}, ChildName=["slot1_2@node1.test"],
                      ChildState=["Claimed"], ChildActivity=["Idle"], ChildRemoteOwner=["alice@test"],
                      ChildEnteredCurrentState=[NOW - 2], ChildCoSchedGPU0Compute=[300], ChildCoSchedGPU0Memory=[3000],
                      ChildCoSchedGPU1Compute=[0], ChildCoSchedGPU1Memory=[0])
    d = decide([matched, gpu_job(3, compute=300, memory=3000, owner="bob")], [two])
    assert d.gpu_sharing.kept == (key(1),) and pins_of(d) == {3: ("slot1@node1.test", (1,))}


def test_a_claim_the_ad_does_not_show_yet_is_not_given_away():
    running = gpu_job(0, compute=900, status=2, RemoteHost="slot1_1@node1.test", JobCurrentStartDate=NOW - 5,
                      CoSchedPinGPUs="0", CoSchedPinSlot="slot1@node1.test")
    d = decide([running, gpu_job(1, compute=500)], [gpu_node_ad("node1", gpus=1, children=[])])
    assert pins_of(d) == {}
    d = decide([running, gpu_job(1, compute=100, memory=1000)], [gpu_node_ad("node1", gpus=1, children=[])])
    assert pins_of(d) == {1: ("slot1@node1.test", (0,))}


def test_require_gpus_limits_the_models():
    jobs = [gpu_job(0, RequireGPUs=classad2.ExprTree('DeviceName == "NVIDIA A100"')),
            gpu_job(1, RequireGPUs=classad2.ExprTree("Capability >= 8.0")), gpu_job(2)]
    d = decide(jobs, [gpu_node_ad("node1", model="Tesla T4"),
                      gpu_node_ad("node2", model="NVIDIA A100", **{"CoSchedGPU0Capability": 8.0,
                                                                  "CoSchedGPU1Capability": 8.0})])
    pins = pins_of(d)
    assert pins[0][0] == "slot1@node2.test" and pins[1][0] == "slot1@node2.test"


def test_a_job_no_gpu_node_can_hold_is_held_with_the_reason_and_bad_requests_are_named():
    d = decide([gpu_job(0, compute=None, memory=None, gpus=4), gpu_job(1, memory=40000),
                gpu_job(2, compute=300, gpus=1), gpu_job(3, compute="lots")], [gpu_node_ad("node1", gpus=2)])
    holds = dict(d.gpu_sharing.holds)
    assert "no GPU node has more than 2 GPUs" in holds[key(0)]
    assert "the largest GPU has 15360 MB" in holds[key(1)]
    skipped = {s.job: s.reason for s in d.skipped}
    assert "RequestGPUCompute" in skipped[key(2)] and "without request_GPUs" in skipped[key(2)]
    assert "RequestGPUCompute" in skipped[key(3)]
    assert {h.job for h in d.holds} == {key(2), key(3)}
    assert pins_of(d) == {}


def test_no_gpu_node_in_the_pool_leaves_gpu_jobs_waiting_not_held():
    d = decide([gpu_job(0)], [])
    assert d.gpu_sharing.holds == () and "no GPU node slot" in d.reasons[key(0)]


def test_a_gpu_node_of_several_models_is_not_planned_and_the_waiting_job_is_told_why():
    mixed = gpu_node_ad("node1", CoSchedGPU1DeviceName="NVIDIA H100")
    d = decide([gpu_job(0)], [mixed])
    assert pins_of(d) == {} and "slot1@node1.test hold GPUs of several models" in d.reasons[key(0)]
    assert pins_of(decide([gpu_job(0)], [mixed, gpu_node_ad("node2")])) == {0: ("slot1@node2.test", (0,))}


def test_gpu_policy_none_leaves_gpu_jobs_alone_and_an_unknown_one_is_refused():
    d = decide([gpu_job(0)], [gpu_node_ad("node1")], knobs={"COSCHED_GPU_POLICY": "none"})
    assert d.gpu_sharing.pins == () and key(0) not in d.reasons
    with pytest.raises(SettingsError, match="COSCHED_GPU_POLICY"):
        settings_from_knobs({"COSCHED_GPU_POLICY": "sns"})  # a spread policy plans no GPU
    assert settings_from_knobs({"COSCHED_GPU_POLICY": "knapsack"}).gpu_policy == "knapsack"


def test_device_and_cpu_jobs_are_untouched_by_gpu_sharing():
    cpu = classad2.ClassAd({"ClusterId": 2, "ProcId": 0, "Owner": "alice", "JobStatus": 1, "QDate": NOW,
                            "RequestCpus": 1, "RequestMemory": 100, "Cmd": "/bin/x"})
    d = decide([cpu, gpu_job(0)], [gpu_node_ad("node1")])
    assert {p.job for p in d.gpu_sharing.pins} == {key(0)}
    assert JobKey(SCHEDD, 2, 0) not in d.reasons


def test_explain_tells_a_gpu_job_what_this_cycle_does_and_what_each_gpu_has_free():
    from condor_sched.explain import explain

    jobs = [gpu_job(0), gpu_job(1, compute=None, memory=None, gpus=4)]
    slots = [gpu_node_ad("node1", used={1: (300, 2000)})]
    state = replace(state_from_ads({SCHEDD: jobs}, slots), observed_at_s=NOW)
    config = CycleConfig.from_settings(settings_from_knobs({}))
    decision = decide_cycle(state, CycleMemory(5), config)
    by_key = {j.key: j for j in state.jobs}
    pinned = "\n".join(explain(state, decision, by_key[key(0)]))
    assert "requests 250/1000 of one GPU, 4000 MB of each" in pinned and "pinned to GPU" in pinned
    assert "GPU 1 Tesla T4 700/1000 compute 13360/15360 MB" in pinned
    held = "\n".join(explain(state, decision, by_key[key(1)]))
    assert "held: GPU sharing can never place it: request_GPUs = 4" in held


def test_plan_prints_the_gpu_pins_as_text_and_json(tmp_path):
    import json

    from click.testing import CliRunner

    from condor_sched.classads import ads_to_json
    from condor_sched.cli import main

    (tmp_path / "q.json").write_text(ads_to_json([gpu_job(0), gpu_job(1, compute=None, memory=None, gpus=9)]))
    (tmp_path / "m.json").write_text(ads_to_json([gpu_node_ad("node1")]))
    args = ["plan", "--queue", str(tmp_path / "q.json"), "--machines", str(tmp_path / "m.json")]
    text = CliRunner().invoke(main, args, catch_exceptions=False).output
    assert f"GPU sharing ({DEFAULT_GPU_POLICY}): 1 pinned" in text and "slot1@node1.test GPU 0: 250/1000 and 4000 MB" in text
    assert "hold: GPU sharing can never place it: request_GPUs = 9" in text
    report = json.loads(CliRunner().invoke(main, [*args, "--policy", "best-fit", "--json"]).output)
    assert report["gpu_policy"] == "best-fit"
    assert report["gpu_pins"] == [{"job": "1.0", "schedd": SCHEDD, "slot": "slot1@node1.test", "gpus": [0],
                                   "gpu_memory_mb": 4000, "gpu_compute": 250}]


@pytest.mark.parametrize("policy", ["best-fit", "fgd-mem-batch", "fgd", "random-fit", "gpu-packing", "knapsack"])
def test_a_share_carries_its_model_constraint_in_cosched_require_gpus_under_every_policy(policy):
    """condor_submit drops require_gpus without request_GPUs, so a share says
    ``My.CoSchedRequireGPUs = "Capability >= 8.0"``: every GPU policy places it only on GPUs whose
    properties satisfy it, and a share no usable GPU satisfies waits naming the constraint."""
    old, new = gpu_node_ad("node1", model="Tesla T4"), gpu_node_ad(
        "node2", model="NVIDIA A100", **{"CoSchedGPU0Capability": 8.0, "CoSchedGPU1Capability": 8.0})
    jobs = [gpu_job(p, CoSchedRequireGPUs="Capability >= 8.0") for p in range(3)]
    d = decide(jobs, [old, new], knobs={"COSCHED_GPU_POLICY": policy})
    assert {slot for slot, _ in pins_of(d).values()} == {"slot1@node2.test"} and len(pins_of(d)) == 3
    both = gpu_job(0, RequireGPUs=classad2.ExprTree("Capability >= 7.0"), CoSchedRequireGPUs='DeviceName == "Tesla T4"')
    assert [slot for slot, _ in pins_of(decide([both], [old, new], knobs={"COSCHED_GPU_POLICY": policy})).values()] \
        == ["slot1@node1.test"]
    waiting = decide([gpu_job(0, CoSchedRequireGPUs="Capability >= 9.0")], [old, new],
                     knobs={"COSCHED_GPU_POLICY": policy})
    assert pins_of(waiting) == {} and "model constraint" in waiting.reasons[key(0)]
    assert "CoSchedRequireGPUs: Capability >= 9.0" in waiting.reasons[key(0)]


@pytest.mark.parametrize("value, why", [
    ("Capability >= ", "is not a ClassAd expression"),
    ("Capability >= 8.0 && TARGET.Memory > 10", "may name only GPU properties"),
    ("MY.RequestCpus > 1", "not RequestCpus"),
    (8, "must be a string")])
def test_a_model_constraint_that_is_not_an_expression_over_gpu_properties_is_refused_naming_it(value, why):
    d = decide([gpu_job(0, CoSchedRequireGPUs=value)], [gpu_node_ad("node1")])
    skipped = {s.job: s.reason for s in d.skipped}
    assert "CoSchedRequireGPUs" in skipped[key(0)] and why in skipped[key(0)]
    assert {h.job for h in d.holds} == {key(0)} and pins_of(d) == {}


def test_a_share_kept_off_a_gpu_by_another_owner_is_told_the_rule():
    """One GPU holds alice's share with room left: bob's share waits, told that MPS shares a GPU
    among one Owner's jobs only, not that no GPU has room."""
    running = gpu_job(0, compute=500, memory=4000, status=2, RemoteHost="slot1_1@node1.test",
                      JobCurrentStartDate=NOW - 60, CoSchedPinSlot="slot1@node1.test", CoSchedPinGPUs="0")
    node = gpu_node_ad("node1", gpus=1, used={0: (500, 4000)}, children=["slot1_1@node1.test"])
    d = decide([running, gpu_job(1, compute=300, owner="bob")], [node])
    assert pins_of(d) == {}
    assert "holds another Owner's jobs" in d.reasons[key(1)] and "one Owner's jobs only" in d.reasons[key(1)]
    alone = decide([running, gpu_job(1, compute=600, owner="bob")], [node])
    assert "no GPU node has 600/1000 of a GPU" in alone.reasons[key(1)]


def _submit_requirement() -> tuple[classad2.ExprTree, classad2.ExprTree]:
    """SUBMIT_REQUIREMENT_CoSchedRequireGPUs and its _REASON from config.d/10, as the schedd reads them."""
    from pathlib import Path

    text = (Path(__file__).resolve().parents[2] / "config.d" / "10-cosched-schedd.conf").read_text()
    knobs = dict(line.split(" = ", 1) for line in text.splitlines() if line.startswith("SUBMIT_REQUIREMENT_CoSched"))
    return (classad2.ExprTree(knobs["SUBMIT_REQUIREMENT_CoSchedRequireGPUs"]),
            classad2.ExprTree(knobs["SUBMIT_REQUIREMENT_CoSchedRequireGPUs_REASON"]))


@pytest.mark.parametrize("value, accepted", [
    (None, True), ("Capability >= 9.0", True), ('DeviceName == "NVIDIA H200" && GlobalMemoryMb > 80000', True),
    ("Capability >= ", False), ("((", False), (9, False)])
def test_the_schedd_refuses_a_model_constraint_that_is_not_an_expression_at_submit(value, accepted):
    """The schedd evaluates the requirement with MY = its own ad and TARGET = the job: a
    constraint that does not parse, or is not a string, is refused with the reason naming it."""
    requirement, reason = _submit_requirement()
    job = classad2.ClassAd({"Owner": "alice"})
    if value is not None:
        job["CoSchedRequireGPUs"] = value
    schedd = classad2.ClassAd({"MyType": "Scheduler", "Name": "schedd@test"})
    assert (requirement.eval(scope=schedd, target=job) is True) is accepted
    if not accepted:
        said = reason.eval(scope=schedd, target=job)
        assert said.startswith("CoSchedRequireGPUs must be a string holding a ClassAd expression") and said.endswith(f"; got {value}")


def test_a_pinned_job_that_runs_is_told_where_and_the_reason_is_written_once():
    """A running job's CoSchedPinReason says where it runs, never still that it waits; the
    sidecar writes it only when it changed."""
    running = gpu_job(0, status=2, RemoteHost="slot1_1@node1.test", JobCurrentStartDate=NOW - 60,
                      CoSchedPinSlot="slot1@node1.test", CoSchedPinGPUs="0",
                      CoSchedPinReason="pinned to GPU 0 of slot1@node1.test in cycle 4 (250/1000 of each, 4000 MB)")
    node = gpu_node_ad("node1", used={0: (250, 4000)}, children=["slot1_1@node1.test"])
    d = decide([running], [node])
    assert d.reasons[key(0)] == "running on slot1_1@node1.test (pinned there by condor_sched)"
    editor = RecordingEditor()
    apply_cycle(d, editor, {key(0): running["CoSchedPinReason"]}, now=NOW)
    assert [e.value for e in editor.edits if e.attr == "CoSchedPinReason"] == [
        '"running on slot1_1@node1.test (pinned there by condor_sched)"']
    editor = RecordingEditor()
    apply_cycle(d, editor, {key(0): d.reasons[key(0)]}, now=NOW)
    assert [e for e in editor.edits if e.attr == "CoSchedPinReason"] == []
    unpinned = decide([gpu_job(1, status=2, RemoteHost="slot1_2@node1.test")], [node])
    assert key(1) not in unpinned.reasons       # a job the sidecar never pinned is not ours to tell
