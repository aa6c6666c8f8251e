"""The START expression of config.d/20-cosched-startd.conf, evaluated with classad2 as the
startd does (MY = the slot, TARGET = the job): pins, exclusive pins, and the guard that keeps
a job off a pin the PREPARE_JOB hook refused it on (issue 9)."""
from __future__ import annotations

import re
from pathlib import Path

import classad2
import pytest

SNIPPET = Path(__file__).resolve().parents[2] / "config.d" / "20-cosched-startd.conf"
DEVICE_SLOT = "slot2@node1@node1.cosched.test"
SOCKET_SLOT = "slot1@node1@node1.cosched.test"


def start_expression() -> classad2.ExprTree:
    """START with every $(MACRO) of the snippet expanded in order (the pool's own START: true)."""
    macros = {"START": "true", "STARTD_ATTRS": "", "STARTD_JOB_ATTRS": ""}
    for line in SNIPPET.read_text().splitlines():
        match = re.match(r"^([A-Za-z_][A-Za-z0-9_.]*)\s*=\s*(.*)$", line)
        if match:
            macros[match.group(1)] = re.sub(r"\$\((\w+)\)", lambda m: macros[m.group(1)], match.group(2))
    # Config expressions are old ClassAd syntax, where a backslash is literal (regexps' "\1");
    # classad2 parses the new syntax, where it escapes.
    return classad2.ExprTree(macros["START"].replace("\\", "\\\\"))


START = start_expression()


def slot(name: str, **attrs) -> classad2.ClassAd:
    ad = {"Name": name, "PartitionableSlot": True}
    if name == DEVICE_SLOT:
        ad.update(PhiDeviceName="mic0", PhiMemory=8192, TotalSlotPhiMemory=8192, PhiThreads=240,
                  TotalSlotPhiThreads=240)
    return classad2.ClassAd({**ad, **attrs})


def device_job(**attrs) -> classad2.ClassAd:
    return classad2.ClassAd({"RequestPhiMemory": 1000, "RequestPhiThreads": 60, "CoSchedPinSlot": DEVICE_SLOT,
                             **attrs})


def spread_job(**attrs) -> classad2.ClassAd:
    return classad2.ClassAd({"CoSchedProgram": "MG", "CoSchedPinSlot": SOCKET_SLOT, **attrs})


def vacated(status: int, code: int = 1007, message: str = "condor_sched: device node1/mic0 (slot2_1) is full: "
            "device memory 8000+1000 MB > 8192 MB on mic0 (running jobs + this one); back to idle for a new plan"
            ) -> dict:
    """What HTCondor 25.14 wrote in the job ad when the hook sent it back to Idle (seen on the pool)."""
    return {"VacateReasonCode": code, "VacateReasonSubCode": 0, "LastVacateTime": 1000,
            "VacateReason": f"Error from slot2_1@node1@node1.cosched.test: PREPARE_JOB (prepare_job) failed "
                            f"(reported status {status}): {message}"}


REFUSED = vacated(303)


def starts(slot_ad: classad2.ClassAd, job_ad: classad2.ClassAd) -> bool:
    return START.eval(scope=slot_ad, target=job_ad) is True


def test_pinned_jobs_start_only_where_pinned():
    assert starts(slot(DEVICE_SLOT), device_job())
    assert not starts(slot(DEVICE_SLOT), device_job(CoSchedPinSlot=SOCKET_SLOT))
    assert not starts(slot(DEVICE_SLOT), spread_job())
    assert starts(slot(SOCKET_SLOT), spread_job())
    assert not starts(slot(SOCKET_SLOT), device_job())
    assert starts(slot(SOCKET_SLOT), classad2.ClassAd({"RequestCpus": 1}))   # other jobs as before


@pytest.mark.parametrize("make, slot_name", [(device_job, DEVICE_SLOT), (spread_job, SOCKET_SLOT)])
def test_a_job_the_hook_refused_waits_for_a_newer_pin(make, slot_name):
    here = slot(slot_name)
    assert not starts(here, make(**REFUSED))                                # no CoSchedPinTime: the old pin
    assert not starts(here, make(**REFUSED, CoSchedPinTime=1000))           # refused on this very pin
    assert not starts(here, make(**REFUSED, CoSchedPinTime=999))
    assert starts(here, make(**REFUSED, CoSchedPinTime=1001))              # pinned again after the refusal
    assert starts(here, make(**vacated(305), CoSchedPinTime=1001))
    assert not starts(here, make(**vacated(305)))
    # other vacates (another hook's or the starter's error, a preemption) do not count
    assert starts(here, make(**vacated(390, message="site hook: try elsewhere")))
    assert starts(here, make(**vacated(303, message="site hook: condor_sched: no")))
    assert starts(here, make(**vacated(303, code=1011)))
    assert starts(here, make(**{**REFUSED, "VacateReason": "Error from slot1: starter failed"}))
    assert starts(here, make(**{k: v for k, v in REFUSED.items() if k != "LastVacateTime"}, CoSchedPinTime=5)) is False


def test_other_jobs_are_not_affected_by_a_past_refusal():
    assert starts(slot(SOCKET_SLOT), classad2.ClassAd({"RequestCpus": 1, **REFUSED}))


NODE_SLOT = "slot1@node5@node5.cosched.test"
GUEST_SLOT = "slot2@node5@node5.cosched.test"


def malleable(**attrs) -> classad2.ClassAd:
    return classad2.ClassAd({"RequestCpus": 8, "CoSchedMalleable": True, "AllowedExecuteDuration": 600,
                             "CoSchedPinSlot": GUEST_SLOT, **attrs})


def test_a_guest_slot_takes_only_a_malleable_cpu_job_pinned_to_it():
    guest = slot(GUEST_SLOT, CoSchedGuestSlot=True, Cpus=8)
    assert starts(guest, malleable())
    assert not starts(guest, malleable(CoSchedPinSlot=None))                       # not pinned
    assert not starts(guest, malleable(CoSchedPinSlot="slot2@node4@node4.cosched.test"))
    assert not starts(guest, malleable(CoSchedMalleable=None))                     # not malleable
    assert not starts(guest, malleable(AllowedExecuteDuration=None))               # no limit to lengthen
    assert not starts(guest, malleable(CoSchedProgram="MG"))                       # a spread job
    assert not starts(guest, classad2.ClassAd({"RequestCpus": 1}))                 # an ordinary job
    refused = vacated(303, message="condor_sched: node5 cannot set cpusets")
    assert not starts(guest, malleable(**refused, CoSchedPinTime=1000))
    assert starts(guest, malleable(**refused, CoSchedPinTime=1001))
    # the dynamic slot the startd carves for the claim keeps the pin check
    assert starts(slot("slot2_1@node5@node5.cosched.test", CoSchedGuestSlot=True, PartitionableSlot=False), malleable())


def test_a_node_slot_takes_cpu_jobs_but_not_the_cores_a_guest_holds_after_its_mate_ended():
    node = slot(NODE_SLOT, CoSchedNodeSlot=True, Cpus=8)
    assert starts(node, classad2.ClassAd({"RequestCpus": 8}))
    assert starts(node, malleable(CoSchedPinSlot=None))
    assert not starts(node, device_job()) and not starts(node, spread_job())
    lent = slot(NODE_SLOT, CoSchedNodeSlot=True, Cpus=8, CoSchedLentCpus=4)
    assert starts(lent, classad2.ClassAd({"RequestCpus": 4}))
    assert not starts(lent, classad2.ClassAd({"RequestCpus": 5}))
    assert starts(slot("slot1_1@node5@node5.cosched.test", CoSchedNodeSlot=True, PartitionableSlot=False, Cpus=8,
                       CoSchedLentCpus=4), classad2.ClassAd({"RequestCpus": 8}))


GPU_SLOT = "slot1@node6@node6.cosched.test"


def gpu_slot(**attrs) -> classad2.ClassAd:
    return slot(GPU_SLOT, CoSchedGPUNode=True, CoSchedGPUCount=2, CoSchedGPU0Memory=15360, CoSchedGPU0Compute=1000,
                **attrs)


def gpu_job(**attrs) -> classad2.ClassAd:
    return classad2.ClassAd({"RequestGPUMemory": 4000, "RequestGPUCompute": 250, "CoSchedPinGPUs": "0",
                             "CoSchedPinGPUMemory": 4000, "CoSchedPinGPUCompute": 250, "CoSchedPinSlot": GPU_SLOT,
                             **attrs})


def test_a_gpu_node_takes_a_gpu_job_only_pinned_to_it_and_cpu_jobs_freely():
    assert starts(gpu_slot(), gpu_job())
    assert starts(gpu_slot(Name="slot1_3@node6@node6.cosched.test", PartitionableSlot=False), gpu_job())
    assert not starts(gpu_slot(), gpu_job(CoSchedPinSlot=DEVICE_SLOT))
    assert not starts(gpu_slot(), gpu_job(CoSchedPinSlot=classad2.Value.Undefined))
    whole = {"RequestGPUs": 2, "RequestGPUMemory": classad2.Value.Undefined,
             "RequestGPUCompute": classad2.Value.Undefined}
    assert starts(gpu_slot(), gpu_job(**whole)) and not starts(gpu_slot(), gpu_job(**whole, CoSchedPinSlot="x"))
    # a job carrying a GPU pin but no GPU request (the transform clears those) is still a GPU job
    assert not starts(gpu_slot(), classad2.ClassAd({"RequestCpus": 1, "CoSchedPinGPUs": "0"}))
    assert starts(gpu_slot(), classad2.ClassAd({"RequestCpus": 1}))
    assert not starts(gpu_slot(), device_job(CoSchedPinSlot=GPU_SLOT))
    assert not starts(gpu_slot(), spread_job(CoSchedPinSlot=GPU_SLOT))


def test_gpu_jobs_run_nowhere_but_a_gpu_node():
    assert not starts(slot(SOCKET_SLOT), gpu_job(CoSchedPinSlot=SOCKET_SLOT))
    assert not starts(slot(SOCKET_SLOT), classad2.ClassAd({"RequestGPUs": 1}))
    assert not starts(slot(DEVICE_SLOT), device_job(RequestGPUMemory=1000))


def test_a_gpu_job_the_hook_refused_waits_for_a_newer_pin():
    refused = vacated(303, message="condor_sched: GPU node node6 (slot1_2): GPU 0 runs jobs of bob, not alice")
    assert not starts(gpu_slot(), gpu_job(**refused, CoSchedPinTime=1000))
    assert starts(gpu_slot(), gpu_job(**refused, CoSchedPinTime=1001))


def _policy(name: str) -> classad2.ExprTree:
    """Knob ``name`` of the snippet with $(MACRO) and $(MACRO:default) expanded in order, over a
    pool that sets none of the policy knobs itself (their defaults apply)."""
    macros: dict[str, str] = {}

    def expand(text: str) -> str:
        return re.sub(r"\$\((\w+)(?::([^)]*))?\)",
                      lambda m: macros.get(m.group(1), m.group(2) if m.group(2) is not None else ""), text)

    for line in SNIPPET.read_text().splitlines():
        match = re.match(r"^([A-Za-z_][A-Za-z0-9_.]*)\s*=\s*(.*)$", line)
        if match:
            macros[match.group(1)] = expand(match.group(2))
    return classad2.ExprTree(macros[name].replace("\\", "\\\\"))


def test_a_job_the_agent_stopped_over_its_memory_is_held_with_the_reason_only_on_its_own_slot():
    """The startd holds the job its slot's CoSchedOverLimit_<slot> names (root's record, from the
    startd cron), with that reason; the same slot running another job, another slot, or a slot
    with no record is left alone."""
    record = {"CoSchedOverLimit_slot2_1": "30.0 device memory use 1500 MB on mic0 exceeds its allocation of 1024 MB"}
    claimed = slot("slot2_1@node1@node1.cosched.test", JobId="30.0", **record)
    job = device_job()
    values = {knob: _policy(knob).eval(scope=claimed, target=job)
              for knob in ("PREEMPT", "WANT_HOLD", "WANT_HOLD_REASON", "WANT_HOLD_SUBCODE", "MAXJOBRETIREMENTTIME")}
    assert values == {"PREEMPT": True, "WANT_HOLD": True, "WANT_HOLD_SUBCODE": 103, "MAXJOBRETIREMENTTIME": -1,
                      "WANT_HOLD_REASON": "condor_sched: stopped on the execute node: device memory use 1500 MB on "
                                          "mic0 exceeds its allocation of 1024 MB"}
    for other in (slot("slot2_1@node1@node1.cosched.test", JobId="300.0", **record),   # the slot's next job
                  slot("slot2_1@node1@node1.cosched.test", JobId="30.01", **record),
                  slot("slot2_2@node1@node1.cosched.test", JobId="30.0", **record),
                  slot("slot2_1@node1@node1.cosched.test", JobId="30.0"),
                  slot("slot2@node1@node1.cosched.test", **record)):                  # the partitionable slot
        assert _policy("WANT_HOLD").eval(scope=other, target=job) is False
        assert _policy("PREEMPT").eval(scope=other, target=job) is False
        assert _policy("MAXJOBRETIREMENTTIME").eval(scope=other, target=job) == 0


def test_the_sidecar_can_evaluate_start_well_within_its_cost_bound():
    """The sidecar evaluates each slot's START (eligibility) only within ``expression_cost``'s
    bound; a START past it leaves every slot of the pool unplanned (one pin test per kind of
    slot, with its two regular expressions, passed it). Half the bound: the slot's own
    Requirements adds HTCondor's terms, and the pool's START its own."""
    from condor_sched.expression_cost import MAX_EXPRESSION_COST, expression_cost_problem

    assert expression_cost_problem([("START", str(START))], limit=MAX_EXPRESSION_COST // 2, dynamic=True) is None


OVERCOMMIT_SLOT = "slot1@node7@node7.cosched.test"


def test_an_overcommitting_slot_takes_only_an_opted_in_cpu_job_pinned_to_it():
    node = slot(OVERCOMMIT_SLOT, CoSchedMultiplicity=2, Cpus=4)
    job = classad2.ClassAd({"RequestCpus": 1, "CoSchedOvercommit": True, "CoSchedPinSlot": OVERCOMMIT_SLOT})
    assert starts(node, job)
    assert starts(slot("slot1_2@node7@node7.cosched.test", CoSchedMultiplicity=2, PartitionableSlot=False), job)
    assert not starts(node, classad2.ClassAd({"RequestCpus": 1}))                   # an ordinary job
    assert not starts(node, classad2.ClassAd({"RequestCpus": 1, "CoSchedOvercommit": True}))   # not pinned
    assert not starts(node, classad2.ClassAd({"RequestCpus": 1, "CoSchedOvercommit": True,
                                              "CoSchedPinSlot": SOCKET_SLOT}))
    assert not starts(node, device_job(CoSchedOvercommit=True, CoSchedPinSlot=OVERCOMMIT_SLOT))
    assert not starts(node, spread_job(CoSchedOvercommit=True, CoSchedPinSlot=OVERCOMMIT_SLOT))
    # an opted-in job is not pinned to other slots by this: a socket slot runs it as before
    assert starts(slot(SOCKET_SLOT), classad2.ClassAd({"RequestCpus": 1, "CoSchedOvercommit": True}))
