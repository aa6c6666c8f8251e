"""Each job only on the slots its own Requirements accept: evaluated by the ClassAd adapter,
honoured for every policy by the one cycle."""
from __future__ import annotations

import json

import classad2
import pytest
from click.testing import CliRunner

from condor_sched.classads import eligible_slots, job_from_ad
from condor_sched.cli import DEFAULT_SNAPSHOT, main
from condor_sched.model import Job, JobKey, JobStatus, Resources, Slot, SlotKind
from condor_sched.modes.planning import PlanRequest, PlanSettings, PolicyKind, run_policy
from condor_sched.modes.registry import get_policy, policy_names

NODE3_ONLY = '(TARGET.Machine == "node3.cosched.test")'


def slot_ad(name: str, machine: str, phi_memory: int, free_phi_memory: int) -> classad2.ClassAd:
    return classad2.ClassAd({"Name": name, "Machine": machine, "PartitionableSlot": True, "Cpus": 1,
                             "TotalSlotCpus": 4, "PhiMemory": free_phi_memory, "TotalSlotPhiMemory": phi_memory})


def job_ad(proc: int, requirements: str, phi_memory: int = 1000) -> classad2.ClassAd:
    ad = classad2.ClassAd({"ClusterId": 1, "ProcId": proc, "JobStatus": 1, "RequestCpus": 2, "RequestMemory": 64,
                           "RequestPhiMemory": phi_memory, "RequestPhiThreads": 60})
    ad["Requirements"] = classad2.ExprTree(requirements)
    return ad


SLOTS = [slot_ad("slot2@node1@h", "node1.cosched.test", 8192, 0), slot_ad("slot2@node3@h", "node3.cosched.test", 8192, 8192),
         slot_ad("slot2@node4@h", "node4.cosched.test", 4096, 4096)]


def eligible(*ads: classad2.ClassAd) -> dict[JobKey, frozenset[str]]:
    return eligible_slots([(job_from_ad(ad, "s"), ad) for ad in ads], SLOTS)


def test_requirements_are_evaluated_against_what_a_slot_has_in_all_not_what_is_free_now():
    # slot2@node1 has no free PhiMemory now and 2 of 4 cpus are needed: still eligible (the
    # planners account free amounts); slot2@node4 has 4096 MB in all: never for 6000 MB.
    fits = "(TARGET.PhiMemory >= RequestPhiMemory) && (TARGET.Cpus >= RequestCpus)"
    out = eligible(job_ad(0, fits, 1000), job_ad(1, fits, 6000))
    assert JobKey("s", 1, 0) not in out  # every slot: the mapping's default
    assert out[JobKey("s", 1, 1)] == {"slot2@node1@h", "slot2@node3@h"}


def test_the_users_requirements_count_not_the_pin_clause():
    ad = job_ad(0, f"{NODE3_ONLY} && (TARGET.Name =?= MY.CoSchedPinSlot)")
    ad["CoSchedPinOriginalRequirements"] = classad2.ExprTree(NODE3_ONLY)
    ad["CoSchedPinSlot"] = "slot2@node1@h"  # a pin elsewhere does not change where the job may run
    assert eligible(ad)[JobKey("s", 1, 0)] == {"slot2@node3@h"}
    # A job submitted before the transform (no saved original) is judged on its Requirements.
    assert eligible(job_ad(1, NODE3_ONLY))[JobKey("s", 1, 1)] == {"slot2@node3@h"}


def test_requirements_that_do_not_evaluate_to_true_match_no_slot():
    out = eligible(job_ad(0, 'TARGET.Machine == undefined_thing'), job_ad(1, '"a" + 1'), job_ad(2, "error"))
    assert all(out[JobKey("s", 1, p)] == frozenset() for p in range(3))


def device(name: str, machine: str) -> Slot:
    total = Resources(cpus=8, memory_mb=4096, device_memory_mb=8192, device_threads=240)
    return Slot(name, machine, SlotKind.DEVICE, total, total, device_name="mic0")


def job(proc: int, memory_mb: int = 2000) -> Job:
    return Job(JobKey("s", 1, proc), "alice", JobStatus.IDLE,
               Resources(cpus=1, memory_mb=64, device_memory_mb=memory_mb, device_threads=60), submitted_at_s=proc)


@pytest.mark.parametrize("name", policy_names(PolicyKind.DEVICE))
def test_no_device_policy_places_a_job_outside_its_eligible_slots(name):
    slots = (device("a", "n1"), device("b", "n2"))
    jobs = tuple(job(p) for p in range(6))
    only_b = {j.key: frozenset({"b"}) for j in jobs[:4]}
    plan = run_policy(get_policy(name), PlanRequest(jobs, slots, eligible=only_b),
                      PlanSettings(deterministic=True, solver_time_limit_s=0.5))
    placed = {a.job: a.slot for a in plan.assignments}
    assert all(placed[k] == "b" for k in only_b if k in placed)
    # b holds four 2000 MB jobs at most, whatever the groups: never oversubscribed.
    assert sum(1 for s in placed.values() if s == "b") <= 4
    assert len(placed) + len(plan.unplaced) == 6


def test_a_job_no_slot_accepts_is_unplaced_with_the_reason():
    plan = run_policy(get_policy("knapsack"), PlanRequest((job(0),), (device("a", "n1"),),
                                                          eligible={JobKey("s", 1, 0): frozenset()}), PlanSettings())
    assert plan.assignments == () and "Requirements" in plan.unplaced[0].reason


def test_plan_honours_requirements_in_a_snapshot(tmp_path):
    jobs = json.loads((DEFAULT_SNAPSHOT / "queue.json").read_text())
    for ad in jobs[:20]:
        original = ad["CoSchedPinOriginalRequirements"]
        assert original.startswith("/Expr(") and original.endswith(")/")
        ad["CoSchedPinOriginalRequirements"] = f"/Expr(({original[6:-2]}) && {NODE3_ONLY})/"
    queue = tmp_path / "queue.json"
    queue.write_text(json.dumps(jobs).replace("/", "\\/"))
    out = json.loads(CliRunner().invoke(main, ["plan", "--json", "--queue", str(queue), "--machines",
                                               str(DEFAULT_SNAPSHOT / "machines.json")]).output)
    restricted = {f"{ad['ClusterId']}.{ad['ProcId']}" for ad in jobs[:20]}
    placed = {a["job"]: a["slot"] for a in out["assignments"]}
    assert any(j in placed for j in restricted) and any(j not in restricted for j in placed)
    assert all("@node3@" in placed[j] for j in restricted if j in placed)


def test_jobs_with_the_same_requirements_text_are_judged_on_their_own_attributes():
    # The first job lacks NeedCpus (undefined: no slot); the second has it: every slot (4 cpus each).
    lacking, having = job_ad(0, "TARGET.Cpus >= NeedCpus"), job_ad(1, "TARGET.Cpus >= NeedCpus")
    having["NeedCpus"] = 2
    out = eligible(lacking, having)
    assert out[JobKey("s", 1, 0)] == frozenset() and JobKey("s", 1, 1) not in out


def test_every_job_of_the_bundled_snapshot_may_use_every_device_and_no_socket():
    # The snapshot's Requirements are condor_submit's (Arch, OpSys, Disk, Memory, PhiMemory,
    # PhiThreads, HasFileTransfer); each job fits every device's totals and no socket has devices.
    from condor_sched.snapshot import load_snapshot

    state = load_snapshot(DEFAULT_SNAPSHOT / "queue.json", DEFAULT_SNAPSHOT / "machines.json")
    devices = frozenset(s.name for s in state.slots if s.kind is SlotKind.DEVICE)
    assert len(devices) == 6 and len(state.idle_jobs()) == 40
    assert all(state.eligible[j.key] == devices for j in state.idle_jobs())
