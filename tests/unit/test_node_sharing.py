"""Paper 001's live mapping (``condor_sched.modes.mates.live``): from ClassAds as a live pool shows
them, through ``decide_cycle``, to the edits the sidecar writes (a recording editor)."""
from __future__ import annotations

import classad2
import pytest

from condor_sched.classads import state_from_ads
from condor_sched.cycle import CycleConfig, CycleMemory, decide_cycle
from condor_sched.model import JobKey
from condor_sched.modes.registry import get_policy
from condor_sched.settings import SettingsError, settings_from_knobs
from condor_sched.sidecar import apply_cycle
from test_sidecar import RecordingEditor

SCHEDD = "schedd@test"
NOW = 1_000_000
CORES = 8


def node_slot_ads(node: str, *, busy_cpus: int = 0, sharing: bool | None = True, guest_busy: bool = False,
                  cores: int = CORES) -> list[classad2.ClassAd]:
    """A node-sharing node's NODE and GUEST partitionable slots (as discover.py configures them)."""
    machine = f"{node}.test"
    ads = []
    for i, (attr, busy) in enumerate((("CoSchedNodeSlot", busy_cpus), ("CoSchedGuestSlot", cores if guest_busy else 0)),
                                     1):
        ad = classad2.ClassAd({"Name": f"slot{i}@{machine}", "Machine": machine, "PartitionableSlot": True,
                               "Arch": "X86_64", "LastHeardFrom": NOW, "TotalSlotCpus": cores, "Cpus": cores - busy,
                               "TotalSlotMemory": 8000, "Memory": 8000, attr: True, "State": "Unclaimed"})
        if sharing is not None:
            ad["CoSchedNodeSharing"] = sharing
        ads.append(ad)
    return ads


def job_ad(proc: int, *, status: int = 1, cpus: int = CORES, requested: int | None = 3600, malleable=True,
           slot: str | None = None, started: int | None = None, qdate: int = NOW - 10_000, **extra) -> classad2.ClassAd:
    ad = classad2.ClassAd({"ClusterId": 1, "ProcId": proc, "Owner": "alice", "JobStatus": status, "QDate": qdate,
                           "GlobalJobId": f"{SCHEDD}#1.{proc}#1", "Cmd": "/bin/sleep", "RequestCpus": cpus,
                           "RequestMemory": 1000, "Requirements": classad2.ExprTree("TARGET.Cpus >= RequestCpus")})
    if malleable is not None:
        ad["CoSchedMalleable"] = malleable
    if requested is not None:
        ad["AllowedExecuteDuration"] = requested
    if slot is not None:
        ad["RemoteHost"] = slot
        ad["JobCurrentStartDate"] = started if started is not None else NOW - 600
    for k, v in extra.items():
        ad[k] = v
    return ad


def running_mate(proc: int, node: str = "node1", **kw) -> classad2.ClassAd:
    return job_ad(proc, status=2, slot=f"slot1_1@{node}.test", **kw)


def decide(jobs, slots, cycle=5, knobs=None):
    state = state_from_ads({SCHEDD: jobs}, slots)
    from dataclasses import replace
    state = replace(state, observed_at_s=NOW)
    config = CycleConfig.from_settings(settings_from_knobs(knobs or {}))
    return decide_cycle(state, CycleMemory(cycle), config)


def key(proc: int) -> JobKey:
    return JobKey(SCHEDD, 1, proc)


def test_a_waiting_whole_node_job_becomes_the_guest_of_a_running_mate_whose_limit_grows():
    # The mate (1.0) started 600 s ago for 3600 s: the node frees in 3000 s, more than the
    # guest's 3600 s at half speed would add (Listing 1: wait + req > req + increase).
    mate = running_mate(0, requested=3600)
    guest = job_ad(1, requested=2000)
    d = decide([mate, guest], node_slot_ads("node1", busy_cpus=CORES))
    (pin,) = d.node_sharing.pins
    assert pin.job == key(1) and pin.slot == "slot2@node1.test" and pin.mate == key(0)
    # worst case, 4 of 8 cores: the guest runs 4000 s; the mate loses 4000 x 4/8 = 2000 s.
    assert pin.increase_s == 2000 and pin.predicted_end_s == NOW + 4000
    (change,) = d.node_sharing.lengthen
    assert change.job == key(0)
    assert change.writes == (("CoSchedPinMateBaseDuration", "3600"), ("CoSchedPinGuest", f'"{SCHEDD}#1.1"'),
                             ("AllowedExecuteDuration", "5600"))
    assert "guest of 1.0" in d.reasons[key(1)]

    editor = RecordingEditor()
    apply_cycle(d, editor, now=NOW)
    order = [(e.attr, e.jobs) for e in editor.edits]
    # the mate's limit is written before the guest's pin, and the pin's slot is its last write
    assert order.index(("AllowedExecuteDuration", (key(0),))) < order.index(("CoSchedPinSlot", (key(1),)))
    guest_writes = [a for a, jobs in order if jobs == (key(1),) and a != "CoSchedPinReason"]
    assert guest_writes[-1] == "CoSchedPinSlot" and "CoSchedPinMate" in guest_writes
    assert editor.attrs[key(1)]["CoSchedPinMate"] == "1.0"
    assert editor.attrs[key(0)]["AllowedExecuteDuration"] == 5600


def test_no_guest_when_waiting_ends_it_sooner():
    # The mate ends in 100 s: waiting (100 + 2000) beats running at half speed (4000).
    mate = running_mate(0, requested=700)
    d = decide([mate, job_ad(1, requested=2000)], node_slot_ads("node1", busy_cpus=CORES))
    assert d.node_sharing.pins == () and d.node_sharing.lengthen == ()
    assert "no running mate" in d.reasons[key(1)]


@pytest.mark.parametrize("case", ["not malleable", "no limit", "already a mate", "agent cannot set cpusets",
                                  "agent silent", "guest slot taken", "other jobs on the node"])
def test_only_a_malleable_whole_node_job_alone_on_a_usable_node_is_a_mate(case):
    mate_kw, slot_kw = {}, {}
    if case == "not malleable":
        mate_kw["malleable"] = None
    elif case == "no limit":
        mate_kw["requested"] = None
    elif case == "already a mate":
        mate_kw["CoSchedPinGuest"] = f"{SCHEDD}#9.0"
    elif case == "agent cannot set cpusets":
        slot_kw["sharing"] = False
    elif case == "agent silent":
        slot_kw["sharing"] = None
    elif case == "guest slot taken":
        slot_kw["guest_busy"] = True
    elif case == "other jobs on the node":
        mate_kw["cpus"] = 6  # a 6-core malleable job and 2 cores of jobs the sidecar does not read
    mate = running_mate(0, **{"requested": 3600, **mate_kw})
    d = decide([mate, job_ad(1, requested=2000)], node_slot_ads("node1", busy_cpus=CORES, **slot_kw))
    assert d.node_sharing.pins == () and d.node_sharing.lengthen == ()
    if case.startswith("agent"):
        assert "no node can host a guest now" in d.reasons[key(1)] and "cpusets" in d.reasons[key(1)]
    else:
        assert "no running mate" in d.reasons[key(1)]


def test_jobs_that_cannot_take_part_are_told_why_and_never_pinned():
    jobs = [running_mate(0), job_ad(1, requested=None), job_ad(2, cpus=4),
            job_ad(3, VacateReasonCode=1007, LastVacateTime=NOW - 5,
                   VacateReason="Error from slot2_1@node1.test: PREPARE_JOB (prepare_job) failed (reported status 303): "
                                "condor_sched: node1 cannot set cpusets")]
    d = decide(jobs, node_slot_ads("node1", busy_cpus=CORES))
    assert d.node_sharing.pins == ()
    assert "allowed_execute_duration" in d.reasons[key(1)]
    assert "whole-node jobs: request_cpus = 4" in d.reasons[key(2)]
    assert "refused it as a guest" in d.reasons[key(3)] and "static start" in d.reasons[key(3)]


def test_a_refused_guest_is_unpinned_and_its_mate_gets_its_limit_back():
    mate = running_mate(0, requested=5600, CoSchedPinMateBaseDuration=3600, CoSchedPinGuest=f"{SCHEDD}#1.1")
    guest = job_ad(1, requested=2000, CoSchedPinSlot="slot2@node1.test", CoSchedPinCycle=4, CoSchedPinTime=NOW - 30,
                   CoSchedPinMate="1.0", CoSchedPinMateIncrease=2000, VacateReasonCode=1007, LastVacateTime=NOW - 5,
                   VacateReason="Error from slot2_1@node1.test: PREPARE_JOB (prepare_job) failed (reported status 303): "
                                "condor_sched: no cpusets")
    d = decide([mate, guest], node_slot_ads("node1", busy_cpus=CORES))
    (unpin,) = d.node_sharing.unpins
    assert unpin[0] == key(1) and "refused it as a guest" in unpin[1]
    (restore,) = d.node_sharing.restore
    assert restore.writes[0] == ("AllowedExecuteDuration", "3600")
    editor = RecordingEditor()
    apply_cycle(d, editor, now=NOW)
    order = [(e.attr, e.jobs) for e in editor.edits]
    assert order.index(("CoSchedPinSlot", (key(1),))) < order.index(("AllowedExecuteDuration", (key(0),)))
    assert editor.attrs[key(1)]["CoSchedPinSlot"] is None and editor.attrs[key(0)]["AllowedExecuteDuration"] == 3600
    assert editor.attrs[key(0)]["CoSchedPinGuest"] is None


def test_a_running_guest_keeps_its_mate_lengthened_and_a_kept_pin_is_not_planned_again():
    mate = running_mate(0, requested=5600, CoSchedPinMateBaseDuration=3600, CoSchedPinGuest=f"{SCHEDD}#1.1")
    running_guest = job_ad(1, status=2, slot="slot2_1@node1.test", requested=2000, CoSchedPinMate="1.0",
                           CoSchedPinSlot="slot2@node1.test")
    d = decide([mate, running_guest], node_slot_ads("node1", busy_cpus=CORES, guest_busy=True))
    assert d.node_sharing.restore == () and d.node_sharing.unpins == ()
    pinned_guest = job_ad(1, requested=2000, CoSchedPinMate="1.0", CoSchedPinSlot="slot2@node1.test",
                          CoSchedPinCycle=4, CoSchedPinTime=NOW - 3)
    d = decide([mate, pinned_guest, job_ad(2, requested=2000)], node_slot_ads("node1", busy_cpus=CORES))
    assert d.node_sharing.kept == (key(1),) and d.node_sharing.restore == () and d.node_sharing.pins == ()


def test_a_guest_that_left_the_queue_leaves_its_mate_lengthened_and_a_stale_one_is_unpinned():
    mate = running_mate(0, requested=5600, CoSchedPinMateBaseDuration=3600, CoSchedPinGuest=f"{SCHEDD}#1.1")
    d = decide([mate], node_slot_ads("node1", busy_cpus=CORES))
    assert d.node_sharing.restore == ()
    stale = job_ad(1, requested=2000, CoSchedPinMate="1.0", CoSchedPinSlot="slot2@node1.test", CoSchedPinCycle=1)
    d = decide([mate, stale], node_slot_ads("node1", busy_cpus=CORES), cycle=5)
    assert d.node_sharing.unpins[0][0] == key(1) and "not matched within 3 cycles" in d.node_sharing.unpins[0][1]
    assert d.node_sharing.restore[0].job == key(0)


def test_a_crash_between_a_mates_writes_is_repaired_by_the_next_cycle():
    # The sidecar stopped after writing the mate's base and guest, before the guest's pin:
    # the guest is idle and unpinned, so the next cycle restores the mate.
    mate = running_mate(0, requested=3600, CoSchedPinMateBaseDuration=3600, CoSchedPinGuest=f"{SCHEDD}#1.1")
    d = decide([mate, job_ad(1, requested=2000)], node_slot_ads("node1", busy_cpus=CORES))
    assert [m.job for m in d.node_sharing.restore] == [key(0)]
    assert d.node_sharing.pins == ()  # it served once: never a mate again this cycle


def test_node_policy_none_leaves_malleable_jobs_alone_and_backfill_is_refused_live():
    d = decide([running_mate(0), job_ad(1, requested=2000)], node_slot_ads("node1", busy_cpus=CORES),
               knobs={"COSCHED_NODE_POLICY": "none"})
    assert d.node_sharing.pins == () and d.node_sharing.reasons == {}
    with pytest.raises(SettingsError, match="COSCHED_NODE_POLICY"):
        settings_from_knobs({"COSCHED_NODE_POLICY": "backfill"})
    assert get_policy("sd").name == "sd"


def test_device_and_ordinary_jobs_are_untouched_by_node_sharing():
    ordinary = job_ad(1, malleable=None, requested=2000)
    d = decide([running_mate(0), ordinary], node_slot_ads("node1", busy_cpus=CORES))
    assert key(1) not in d.reasons and d.node_sharing.pins == ()
    assert d.to_json()["guests"] == []


def test_a_malleable_device_job_pinned_to_its_device_is_left_to_the_device_policy():
    device = job_ad(1, requested=2000, cpus=1, RequestPhiMemory=1000, RequestPhiThreads=60,
                    CoSchedPinSlot="slot3@node1.test", CoSchedPinCycle=4)
    d = decide([running_mate(0), device], node_slot_ads("node1", busy_cpus=CORES))
    assert d.node_sharing.unpins == () and d.node_sharing.pins == () and key(1) not in d.node_sharing.reasons
