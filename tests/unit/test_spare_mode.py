"""The spare-capacity mode (paper 003) on the sidecar's side: spare slots read from their ads,
capped at what each node's agent publishes, jobs pinned within it or told why they wait."""
from __future__ import annotations

import json
from dataclasses import replace

import classad2
import pytest
from click.testing import CliRunner

from condor_sched.classads import state_from_ads
from condor_sched.cli import main
from condor_sched.cycle import CycleConfig, CycleMemory, decide_cycle
from condor_sched.model import JobKey, SlotKind
from condor_sched.modes.registry import get_mode, get_policy
from condor_sched.settings import SettingsError, settings_from_knobs
from condor_sched.sidecar import apply_cycle
from test_sidecar import RecordingEditor

SCHEDD = "schedd@test"
NOW = 1_000_000
CORES = 16


def node_ads(node: str, *, spare: dict | None, primary_busy: int = 0, spare_busy: int = 0,
             spare_memory_busy: int = 0) -> list[classad2.ClassAd]:
    """A socket node's primary slot and its overlapping spare slot (as discover.py configures
    them), the spare slot with what the startd cron publishes (``spare``; None: nothing)."""
    machine = f"{node}.test"
    primary = classad2.ClassAd({"Name": f"slot1@{machine}", "Machine": machine, "PartitionableSlot": True,
                                "Arch": "X86_64", "LastHeardFrom": NOW, "TotalSlotCpus": CORES,
                                "Cpus": CORES - primary_busy, "TotalSlotMemory": 32000,
                                "Memory": 32000 - 2000 * primary_busy, "State": "Unclaimed"})
    spare_slot = classad2.ClassAd({"Name": f"slot2@{machine}", "Machine": machine, "PartitionableSlot": True,
                                   "Arch": "X86_64", "LastHeardFrom": NOW, "TotalSlotCpus": CORES,
                                   "Cpus": CORES - spare_busy, "TotalSlotMemory": 32000,
                                   "Memory": 32000 - spare_memory_busy, "CoSchedSpareSlot": True,
                                   "State": "Unclaimed"})
    for attr, value in (spare or {}).items():
        spare_slot[attr] = value
    return [primary, spare_slot]


def published(cpus: float, memory: int, **more) -> dict:
    return {"CoSchedSpareUsable": True, "CoSchedSpareCpus": cpus, "CoSchedSpareMemory": memory,
            "CoSchedSpareConfidence": 0.8, "CoSchedSpareSamples": 360, "CoSchedSpareUpdated": NOW - 5, **more}


def job_ad(proc: int, *, cpus: int = 4, memory: int = 4000, status: int = 1, slot: str | None = None,
           spare: bool | None = True, **extra) -> classad2.ClassAd:
    ad = classad2.ClassAd({"ClusterId": 1, "ProcId": proc, "Owner": "alice", "JobStatus": status,
                           "QDate": NOW - 1000 + proc, "GlobalJobId": f"{SCHEDD}#1.{proc}#1", "Cmd": "/bin/stats",
                           "RequestCpus": cpus, "RequestMemory": memory,
                           "Requirements": classad2.ExprTree("(TARGET.Cpus >= RequestCpus) && "
                                                             "(TARGET.Name =?= MY.CoSchedPinSlot)"),
                           "CoSchedPinOriginalRequirements": classad2.ExprTree("TARGET.Cpus >= RequestCpus")})
    if spare is not None:
        ad["CoSchedSpare"] = spare
    if slot is not None:
        ad["RemoteHost"] = slot
        ad["JobCurrentStartDate"] = NOW - 600
    for k, v in extra.items():
        ad[k] = v
    return ad


def decide(jobs, slots, knobs=None, settings=None, config=None):
    state = replace(state_from_ads({SCHEDD: jobs}, slots), observed_at_s=NOW)
    config = config or CycleConfig.from_settings(settings_from_knobs(knobs or {}))
    if settings is not None:
        config = replace(config, plan=settings)
    return decide_cycle(state, CycleMemory(5), config)


def key(proc: int) -> JobKey:
    return JobKey(SCHEDD, 1, proc)


def pinned(decision) -> dict[int, str]:
    return {p.job.proc: p.slot for p in decision.pins}


def test_spare_slots_read_as_spare_with_what_the_agent_publishes():
    state = state_from_ads({SCHEDD: []}, node_ads("n1", spare=published(9.5, 12000)) +
                           node_ads("n2", spare={"CoSchedSpareUsable": False,
                                                 "CoSchedSpareProblem": "no writable cgroup under /sys/fs/cgroup"}) +
                           node_ads("n3", spare=None) + node_ads("n4", spare=published(99.0, 12000)))
    by_name = {s.name: s for s in state.slots}
    one = by_name["slot2@n1.test"]
    assert one.kind is SlotKind.SPARE and by_name["slot1@n1.test"].kind is SlotKind.SOCKET
    assert (one.spare.cpus, one.spare.memory_mb, one.spare.confidence, one.spare.samples) == (9.5, 12000, 0.8, 360)
    assert one.spare.problem is None
    assert "no writable cgroup" in by_name["slot2@n2.test"].spare.problem
    assert by_name["slot2@n3.test"].spare is None
    # more spare cores than the node has reads as a bad estimate, named, never as room
    assert "CoSchedSpareCpus" in by_name["slot2@n4.test"].spare.problem


def test_spare_jobs_are_pinned_within_the_published_spare_cores_and_memory():
    jobs = [job_ad(p) for p in range(4)]
    decision = decide(jobs, node_ads("n1", spare=published(9.5, 30000)))
    assert pinned(decision) == {0: "slot2@n1.test", 1: "slot2@n1.test"}   # 2 x 4 of floor(9.5) cores
    why = decision.reasons[key(2)]
    assert "no node has 4 spare cores" in why and "the most: 1 cores" in why
    # memory binds too
    decision = decide(jobs, node_ads("n1", spare=published(16.0, 9000)))
    assert pinned(decision) == {0: "slot2@n1.test", 1: "slot2@n1.test"}
    assert "4000 MB spare memory" in decision.reasons[key(2)]


def test_running_spare_claims_count_against_the_spare_capacity():
    running = job_ad(9, status=2, slot="slot2_1@n1.test", CoSchedPinSlot="slot2@n1.test")
    decision = decide([running, job_ad(0), job_ad(1)],
                      node_ads("n1", spare=published(9.0, 30000), spare_busy=4, spare_memory_busy=4000))
    assert pinned(decision) == {0: "slot2@n1.test"}   # 9 spare cores, 4 held: room for one more


def test_spread_goes_to_the_most_spare_node_and_pack_to_the_tightest():
    slots = node_ads("n1", spare=published(12.0, 30000)) + node_ads("n2", spare=published(5.0, 30000))
    assert pinned(decide([job_ad(0)], slots)) == {0: "slot2@n1.test"}
    assert pinned(decide([job_ad(0)], slots, knobs={"COSCHED_SPARE_POLICY": "spare-pack"})) == {0: "slot2@n2.test"}


def test_a_node_without_a_usable_estimate_takes_no_spare_job_and_the_job_is_told():
    slots = (node_ads("n1", spare={"CoSchedSpareUsable": False, "CoSchedSpareProblem": "fewer than 12 samples"})
             + node_ads("n2", spare=None))
    decision = decide([job_ad(0)], slots)
    assert pinned(decision) == {}
    why = decision.reasons[key(0)]
    assert why.startswith("waiting: no node offers spare capacity now")
    assert "n1.test: its node agent takes no spare-capacity job now: fewer than 12 samples" in why
    assert "n2.test: its node agent publishes no spare capacity" in why


def test_only_opted_in_jobs_are_covered_and_other_slots_never_take_a_spare_pin():
    jobs = [job_ad(0, spare=None), job_ad(1, spare=False), job_ad(2)]
    decision = decide(jobs, node_ads("n1", spare=published(16.0, 30000)))
    assert pinned(decision) == {2: "slot2@n1.test"}
    assert key(0) not in decision.reasons and key(1) not in decision.reasons
    assert get_mode("spare").covers(replace(decision_job := state_from_ads({SCHEDD: [job_ad(3)]}, []).jobs[0]))
    assert decision_job.sharing_mode == "spare"
    # a malleable job that also says CoSchedSpare belongs to node sharing (first mode that covers it)
    both = state_from_ads({SCHEDD: [job_ad(4, CoSchedMalleable=True)]}, []).jobs[0]
    assert both.sharing_mode == "mates"


def test_the_sidecar_writes_the_pin_and_the_reason():
    editor = RecordingEditor()
    decision = decide([job_ad(0), job_ad(1, cpus=12)], node_ads("n1", spare=published(8.0, 30000)))
    apply_cycle(decision, editor, now=NOW)
    assert editor.attrs[key(0)]["CoSchedPinSlot"] == "slot2@n1.test"
    assert "no node has 12 spare cores" in editor.attrs[key(1)]["CoSchedPinReason"]


def test_policy_none_leaves_spare_jobs_and_an_unknown_policy_is_named():
    assert pinned(decide([job_ad(0)], node_ads("n1", spare=published(16.0, 30000)),
                         knobs={"COSCHED_SPARE_POLICY": "none"})) == {}
    with pytest.raises(SettingsError, match="COSCHED_SPARE_POLICY"):
        settings_from_knobs({"COSCHED_SPARE_POLICY": "sd"})
    assert get_policy("spare-spread").name == "spare-spread"


def test_plan_on_a_snapshot_without_estimates_takes_the_primaries_own_usage(tmp_path):
    """``plan`` only: a running primary's CpusUsage / MemoryUsage stand in for the agent."""
    primary = job_ad(8, cpus=12, memory=20000, status=2, slot="slot1_1@n1.test", spare=None,
                     CpusUsage=3.2, MemoryUsage=6000)
    jobs = [primary, job_ad(0), job_ad(1), job_ad(2, cpus=8)]
    slots = node_ads("n1", spare=None, primary_busy=12)
    from condor_sched.modes.planning import PlanSettings
    live = decide(jobs, slots)
    assert pinned(live) == {}      # the live sidecar never trusts the job's own numbers
    offline = decide(jobs, slots, settings=PlanSettings(spare_from_job_usage=True))
    # 16 - 3.2 = 12.8 spare cores, 32000 - 6000 MB: 4 + 4 fit, then 8 does not
    assert pinned(offline) == {0: "slot2@n1.test", 1: "slot2@n1.test"}
    queue, machines = tmp_path / "queue.json", tmp_path / "machines.json"
    queue.write_text(json.dumps([json.loads(a.printJson()) for a in jobs]))
    machines.write_text(json.dumps([json.loads(a.printJson()) for a in slots]))
    out = CliRunner().invoke(main, ["plan", "--queue", str(queue), "--machines", str(machines), "--json"],
                             catch_exceptions=False)
    assert out.exit_code == 0, out.output
    placed = {a["job"]: a["slot"] for a in json.loads(out.output)["assignments"]}
    assert sorted(placed.values()) == ["slot2@n1.test", "slot2@n1.test"]


def test_explain_says_what_each_spare_slot_offers():
    from condor_sched.explain import explain, find_job

    jobs = [job_ad(0), job_ad(1, cpus=12)]
    slots = node_ads("n1", spare=published(8.0, 30000)) + node_ads(
        "n2", spare={"CoSchedSpareUsable": False, "CoSchedSpareProblem": "no writable cgroup"})
    state = replace(state_from_ads({SCHEDD: jobs}, slots), observed_at_s=NOW)
    decision = decide_cycle(state, CycleMemory(5), CycleConfig.from_settings(settings_from_knobs({})))
    lines = explain(state, decision, find_job(state, "1.1"))
    assert lines[1] == "requests 12 cpus, 4000 MB"
    assert "  slot2@n1.test: no room now: cpus 12 > 4 free" in lines    # 8 published, 4 pinned to 1.0
    assert any(line.startswith("  slot2@n2.test: takes no new job") and "no writable cgroup" in line for line in lines)
    assert "  slot2@n1.test: pinned here" in explain(state, decision, find_job(state, "1.0"))


@pytest.mark.parametrize("as_json", [False, True])
def test_a_job_its_node_vacated_is_unpinned_and_told_why_until_it_runs_again(tmp_path, as_json):
    why = "memory must shrink to 2000 MB: the primaries use 30000 MB"
    slots = node_ads("n1", spare=published(8.0, 30000, CoSchedSpareEvict_slot2_1=f"1.0 {why}",
                                            CoSchedSpareEvict_slot2_2="garbage")) + \
        node_ads("n2", spare=published(8.0, 30000))
    jobs = [job_ad(0, CoSchedPinSlot="slot2@n1.test", CoSchedPinCycle=4, LastVacateTime=NOW - 30),
            job_ad(1, CoSchedPinSlot="slot2@n1.test", CoSchedPinCycle=4)]
    if as_json:   # the same ads read as the snapshot path reads them
        from condor_sched.snapshot import load_snapshot
        queue, machines = tmp_path / "q.json", tmp_path / "m.json"
        queue.write_text(json.dumps([json.loads(a.printJson()) for a in jobs]))
        machines.write_text(json.dumps([json.loads(a.printJson()) for a in slots]))
        state = load_snapshot(queue, machines)
        assert dict(next(s for s in state.slots if s.name == "slot2@n1.test").spare.evictions) == {"1.0": why}
        return
    decision = decide(jobs, slots)
    unpinned = {u.job.proc: u.reason for u in decision.unpins}
    assert unpinned == {0: f"vacated from n1.test: {why}"}
    assert key(1) in {a.job for a in decision.kept}
    assert pinned(decision) == {0: "slot2@n2.test"}     # n1's room is held by 1.1's kept pin
    assert decision.reasons[key(0)].startswith(f"vacated from n1.test: {why}; now pinned to slot2@n2.test")


def test_two_users_share_a_spare_slot_in_fair_share_order_with_no_device_job_in_the_queue():
    """The device queue's one-submitter shortcut never stands for the spare jobs' order (the
    live scale test found every pin going to the first user's cluster in queue order)."""
    slots = node_ads("n1", spare=published(2.0, 4000))
    slots[1]["TotalSlotCpus"] = slots[1]["Cpus"] = 2
    jobs = [job_ad(i, cpus=1, memory=128, User=f"{'alice' if i < 4 else 'bob'}@test") for i in range(8)]
    assert pinned(decide(jobs, slots)) == {0: "slot2@n1.test", 4: "slot2@n1.test"}
