"""Issue 9: pins only where a job can start, a reason for every waiting or refused job, holds
for ads no cycle can plan, fair share between submitters, and the enrollment check."""
from __future__ import annotations

from collections import Counter
from dataclasses import replace

import classad2
import pytest
from click.testing import CliRunner
from test_sidecar import DEV, FirstFit, RecordingEditor, decide, device_job, slot

from condor_sched.classads import eligible_slots, has_pin_clause, job_from_ad, jobs_from_ads, slot_from_ad, slot_ranks
from condor_sched.cli import main
from condor_sched.cycle import CycleConfig, CycleMemory, decide_cycle
from condor_sched.explain import explain, find_job
from condor_sched.fairshare import dominant_share, fair_order, fair_window
from condor_sched.model import JobKey, JobStatus, PoolState, Resources, RunningJob, SlotKind
from condor_sched.modes.registry import get_policy
from condor_sched.sidecar import apply_cycle, reasons_to_write

PIN = "(TARGET.Name =?= MY.CoSchedPinSlot)"


@pytest.mark.parametrize("requirements, enrolled", [
    (f"(TARGET.Arch == \"X86_64\") && {PIN}", True),
    ("((TARGET.Arch == \"X86_64\") && (TARGET.Name is MY.CoSchedPinSlot))", True),  # as the schedd prints it
    (f"(a) && (\"x)&&(\" == b) && {PIN} && (c)", True),
    (f"(a || b) && {PIN}", True),
    (f"true || {PIN}", False),  # mentions the clause, but matches without a pin
    (f"(a) || (b) && {PIN}", False),  # && binds tighter: (a) alone matches
    (f"a ? {PIN} : true", False),
    ("x && CoSchedPinSlot =!= undefined", False),
    (f"!({PIN})", False),
])
def test_enrollment_needs_the_pin_clause_as_a_conjunct_not_a_substring(requirements, enrolled):
    assert has_pin_clause(requirements) is enrolled


def _slot_ad(**extra):
    ad = {"Name": "slot2@node1@h", "Machine": "node1.h", "PartitionableSlot": True, "Cpus": 4, "TotalSlotCpus": 4,
          "Memory": 1024, "TotalSlotMemory": 1024, "PhiMemory": 8192, "TotalSlotPhiMemory": 8192, "PhiThreads": 240,
          "TotalSlotPhiThreads": 240, "PhiDeviceName": "mic0", **extra}
    return classad2.ClassAd(ad)


@pytest.mark.parametrize("extra, why", [
    ({"Draining": True}, "is draining"), ({"State": "Owner"}, "Owner state"), ({"Offline": True}, "is offline"),
    ({"State": "Drained"}, "is drained"), ({"State": "Unclaimed", "Activity": "Idle"}, None)])
def test_a_slot_that_takes_no_new_job_says_why(extra, why):
    unavailable = slot_from_ad(_slot_ad(**extra)).unavailable
    assert (unavailable is None) if why is None else why in unavailable


def test_no_pin_on_a_slot_taking_no_job_and_a_kept_pin_there_is_taken_back():
    draining = replace(slot("slotA"), unavailable="is draining")
    kept = device_job(1, pinned_slot="slotA", pinned_cycle=9)
    d = decide(PoolState((kept, device_job(2)), (draining, slot("slotB"))), 10, FirstFit())
    assert [(u.job.proc, "draining" in u.reason) for u in d.unpins] == [(1, True)]
    assert {p.slot for p in d.pins} == {"slotB"}


def test_a_slot_whose_start_refuses_the_job_is_not_eligible():
    start = classad2.ExprTree('TARGET.Owner != "mallory" && TARGET.CoSchedPinSlot =?= MY.Name')
    slots = [_slot_ad(Start=start), _slot_ad(Name="slot3@node1@h", Start=classad2.ExprTree("false"))]
    jobs = []
    for proc, owner in enumerate(("alice", "mallory")):
        ad = classad2.ClassAd({"ClusterId": 1, "ProcId": proc, "JobStatus": 1, "RequestCpus": 1, "RequestMemory": 64,
                               "RequestPhiMemory": 100, "RequestPhiThreads": 4, "Owner": owner})
        ad["Requirements"] = classad2.ExprTree("true")
        jobs.append((job_from_ad(ad, "s"), ad))
    out = eligible_slots(jobs, slots)
    # START is judged as if the job were pinned to the slot; "false" never takes anybody.
    assert out[JobKey("s", 1, 0)] == {"slot2@node1@h"} and out[JobKey("s", 1, 1)] == frozenset()


def _refused_ad(pin_time: int, idle_since: int) -> classad2.ClassAd:
    ad = classad2.ClassAd({"ClusterId": 1, "ProcId": 0, "JobStatus": 1, "RequestCpus": 1, "RequestMemory": 64,
                           "RequestPhiMemory": 100, "RequestPhiThreads": 4, "CoSchedPinSlot": "slotA",
                           "CoSchedPinCycle": 9, "CoSchedPinTime": pin_time, "EnteredCurrentStatus": idle_since,
                           "VacateReasonCode": 1007, "VacateReason": "device threads 200+60 > 240 on mic0"})
    ad["Requirements"] = classad2.ExprTree(f"true && {PIN}")
    return ad


def test_a_start_the_node_refused_unpins_the_job_tells_why_and_avoids_that_slot_once():
    assert job_from_ad(_refused_ad(100, 99), "s").start_refused is None  # refused before this pin: not this one
    refused = job_from_ad(_refused_ad(100, 130), "s")
    assert "200+60" in refused.start_refused
    d = decide(PoolState((refused,), (slot("slotA"), slot("slotB"))), 10, FirstFit())
    assert "refused to start it on slotA" in d.unpins[0].reason
    assert [p.slot for p in d.pins] == ["slotB"]  # not straight back onto the slot that refused it
    assert d.reasons[refused.key].startswith("the execute node refused") and "now pinned to slotB" in d.reasons[refused.key]


def test_an_idle_job_whose_ad_cannot_be_planned_is_held_naming_the_attribute():
    bad = classad2.ClassAd({"ClusterId": 3, "ProcId": 0, "JobStatus": 1, "RequestCpus": 1, "RequestMemory": 64,
                            "RequestPhiMemory": 100, "CoSchedAlpha": 2})
    running_bad = classad2.ClassAd({**{k: bad[k] for k in bad.keys()}, "ProcId": 1, "JobStatus": 2})
    _, skipped = jobs_from_ads([bad, running_bad], "s")
    d = decide(PoolState((), (slot("slotA"),), tuple(skipped)), 1, FirstFit())
    assert [h.job.proc for h in d.holds] == [0]  # a running job is left alone
    assert "RequestPhiThreads is missing" in d.holds[0].reason and "condor_release" in d.holds[0].reason
    editor = RecordingEditor()
    assert apply_cycle(d, editor).held == 1 and "RequestPhiThreads" in editor.attrs[JobKey("s", 3, 0)]["HoldReason"]


def test_every_idle_covered_job_gets_a_reason_and_only_changed_reasons_are_written():
    jobs = (device_job(1, mem=6000), device_job(2, mem=6000), device_job(3, mem=6000))
    d = decide(PoolState(jobs, (slot("slotA"), slot("slotB"))), 4, FirstFit())
    assert set(d.reasons) == {j.key for j in jobs}
    assert d.reasons[jobs[2].key] == "waiting: no room"
    assert d.reasons[jobs[0].key].startswith("pinned to slotA in cycle 4")
    current = {jobs[2].key: "waiting: no room"}
    edits = reasons_to_write(d, current)
    assert sorted(k.proc for js in edits.values() for k in js) == [1, 2] and len(edits) == 2
    editor = RecordingEditor()
    outcome = apply_cycle(d, editor, current)
    assert outcome.told == 2 and "CoSchedPinReason" not in editor.attrs.get(jobs[2].key, {})


def test_a_failed_pin_is_not_told_as_pinned():
    jobs = (device_job(1), device_job(2))
    d = decide(PoolState(jobs, (slot("slotA"),)), 1, FirstFit())
    editor = RecordingEditor(fail_on=jobs[0].key)
    apply_cycle(d, editor, {})
    assert "CoSchedPinReason" not in editor.attrs.get(jobs[0].key, {})
    assert editor.attrs[jobs[1].key]["CoSchedPinReason"].startswith("pinned to slotA")


# ---- fair share --------------------------------------------------------------------------

def _user_jobs(user, n, first_proc, mem=2000, prio=0, mix=None):
    return [device_job(first_proc + i, mem=mix[i % len(mix)] if mix else mem, submitter=user,
                       owner=user.split("@")[0], job_prio=prio, submitted_at_s=first_proc + i) for i in range(n)]


def test_fair_order_interleaves_submitters_by_weight_and_keeps_each_users_own_order():
    alice = _user_jobs("alice@d", 4, 0)
    bob = _user_jobs("bob@d", 4, 10)
    bob[3] = replace(bob[3], job_prio=5)  # bob's own order: his JobPrio 5 job first
    order = fair_order(alice + bob, (), [slot("slotA")], {})
    assert [j.submitter[0] for j in order] == list("abababab")
    assert order[1].key.proc == 13
    # bob's priority 4x worse than alice's (1.0 vs 0.25): alice gets 4 turns to each of his.
    order = fair_order(alice + bob, (), [slot("slotA")], {"alice@d": 0.25, "bob@d": 1.0})
    assert [j.submitter[0] for j in order[:5]] == list("aaaab")


def test_what_a_submitter_already_runs_counts_against_its_share():
    alice, bob = _user_jobs("alice@d", 3, 0), _user_jobs("bob@d", 3, 10)
    running = [RunningJob(replace(j, status=JobStatus.RUNNING, key=JobKey("s", 9, i)), "slotA", "n", 0)
               for i, j in enumerate(_user_jobs("alice@d", 2, 20, mem=4096))]
    order = fair_order(alice + bob, running, [slot("slotA")], {})
    assert [j.submitter[0] for j in order] == list("bbbaaa")  # alice holds a whole device already
    assert dominant_share(Resources(device_memory_mb=4096, device_threads=60), DEV, ("device_memory_mb", "device_threads")) == 0.5


def test_one_submitter_is_never_cut_and_several_get_a_window_of_the_free_capacity():
    alice = _user_jobs("alice@d", 10, 0)
    assert fair_window(alice, [slot("slotA")], lambda j: False) == alice
    bob = _user_jobs("bob@d", 10, 20)
    window = fair_window(fair_order(alice + bob, (), [slot("slotA")], {}), [slot("slotA")], lambda j: False)
    # 60 of 240 threads each (the dominant share): the free capacity holds 4, two per user.
    assert Counter(j.submitter for j in window) == {"alice@d": 2, "bob@d": 2}
    aged = fair_window(fair_order(alice + bob, (), [slot("slotA")], {}), [slot("slotA")], lambda j: j.key.proc == 29)
    assert aged[-1].key.proc == 29  # a job past the aging limit is always offered


def test_two_users_with_equal_queues_get_equal_starts_over_cycles():
    """The cycle with the paper's knapsack: each cycle's pins start, then end; over 20 cycles
    the two submitters' starts stay within 25% of their equal shares (without fair share
    alice, first in the queue, takes 160 of 240 starts)."""
    mix = [1500, 2500, 3000, 4000, 1000]  # both users submit the same mix; more than 20 cycles can start
    jobs = _user_jobs("alice@d", 400, 0, mix=mix) + _user_jobs("bob@d", 400, 1000, mix=mix)
    slots = tuple(slot(f"slot{i}") for i in range(3))
    config = CycleConfig(get_policy("knapsack"), None, unpin_age_cycles=3)
    starts: Counter = Counter()
    queue = list(jobs)
    for cycle in range(1, 21):
        d = decide_cycle(PoolState(tuple(queue), slots), CycleMemory(cycle), config)
        pinned = {p.job for p in d.pins}
        starts.update(j.submitter for j in queue if j.key in pinned)
        queue = [j for j in queue if j.key not in pinned]  # they start, run one cycle and end
    total = sum(starts.values())
    assert total > 100 and all(abs(starts[u] - total / 2) <= 0.25 * total / 2 for u in ("alice@d", "bob@d"))


# ---- explain -------------------------------------------------------------------------------

def test_explain_says_why_each_slot_cannot_take_the_job():
    big = device_job(1, mem=9000)
    waiting = device_job(2, mem=6000)
    slots = (replace(slot("slotA"), unavailable="is draining"), slot("slotB", free=replace(DEV, device_memory_mb=1000)),
             slot("slotC"))
    state = PoolState((big, waiting, device_job(3, mem=6000)), slots, eligible={waiting.key: frozenset({"slotA", "slotB"})})
    d = decide(state, 1, FirstFit())
    text = "\n".join(explain(state, d, find_job(state, "1.2")))
    assert "slotA: takes no new job: it is draining" in text
    assert "slotB: no room now: device_memory_mb 6000 > 1000 free" in text
    assert "slotC: refused: the job's Requirements or the slot's START" in text
    text = "\n".join(explain(state, d, find_job(state, "s#1.1")))
    assert "too small even when empty: device_memory_mb 9000 > 8192" in text
    with pytest.raises(LookupError):
        find_job(state, "7.0")


def test_explain_command_on_the_bundled_snapshot():
    result = CliRunner().invoke(main, ["explain", "65.2"])
    assert result.exit_code == 0, result.output
    assert "pinned to slot" in result.output and "pinned here" in result.output
    assert CliRunner().invoke(main, ["explain", "999.0"]).exit_code == 1


# ---- Rank -----------------------------------------------------------------------------------

def test_rank_is_evaluated_per_slot_and_a_constant_rank_prefers_nothing():
    slots = [_slot_ad(), _slot_ad(Name="slot3@node1@h", TotalSlotPhiMemory=16384)]
    ads = []
    for proc, rank in enumerate(("TARGET.TotalSlotPhiMemory", "0", 'TARGET.Name == "slot2@node1@h"')):
        ad = classad2.ClassAd({"ClusterId": 1, "ProcId": proc, "JobStatus": 1, "RequestCpus": 1, "RequestMemory": 64,
                               "RequestPhiMemory": 100, "RequestPhiThreads": 4})
        ad["Rank"] = classad2.ExprTree(rank)
        ads.append((job_from_ad(ad, "s"), ad))
    ranks = slot_ranks(ads, slots)
    assert ranks[JobKey("s", 1, 0)] == {"slot2@node1@h": 8192.0, "slot3@node1@h": 16384.0}
    assert JobKey("s", 1, 1) not in ranks
    assert ranks[JobKey("s", 1, 2)] == {"slot2@node1@h": 1.0, "slot3@node1@h": 0.0}


def test_rank_breaks_ties_among_slots_with_room_and_never_overfills_one():
    jobs = (device_job(1, mem=3000), device_job(2, mem=3000), device_job(3, mem=3000))
    prefers_b = {j.key: {"slotA": 0.0, "slotB": 1.0} for j in jobs}
    state = PoolState(jobs, (slot("slotA"), slot("slotB")), ranks=prefers_b)
    d = decide(state, 1, FirstFit())  # first fit puts two on slotA, one on slotB
    by_slot = Counter(p.slot for p in d.pins)
    # slotB (8192 MB) takes two of the three 3000 MB jobs, the third stays on slotA.
    assert by_slot == {"slotB": 2, "slotA": 1}
    assert {p.job for p in d.pins} == {j.key for j in jobs}


@pytest.mark.parametrize("value, problem", [(-5, "RequestPhiMemory = -5 is outside [1, 1000000000000]"),
                                            ("abc", "RequestPhiMemory = 'abc' is not a number")])
def test_an_invalid_device_request_is_held_not_left_waiting(value, problem):
    ad = classad2.ClassAd({"ClusterId": 4, "ProcId": 0, "JobStatus": 1, "RequestCpus": 1, "RequestMemory": 64,
                           "RequestPhiMemory": value, "RequestPhiThreads": 60})
    _, skipped = jobs_from_ads([ad], "s")
    d = decide(PoolState((), (slot("slotA"),), tuple(skipped)), 1, FirstFit())
    assert len(d.holds) == 1 and problem in d.holds[0].reason and "RequestPhiMemory" in d.holds[0].reason


def test_a_window_never_cuts_a_spread_jobs_procs_apart():
    def procs(user, cluster, n):
        return [replace(device_job(p, mem=0, threads=0), key=JobKey("s", cluster, p), submitter=user, spread=True,
                        program="MG", request=Resources(cpus=4, memory_mb=64)) for p in range(n)]
    sockets = [replace(slot("sock"), kind=SlotKind.SOCKET, total=Resources(cpus=8), free=Resources(cpus=8))]
    jobs = procs("alice@d", 1, 4) + procs("bob@d", 2, 4)
    window = fair_window(fair_order(jobs, (), sockets, {}), sockets, lambda j: False)
    by_cluster = Counter(j.key.cluster for j in window)
    assert all(count == 4 for count in by_cluster.values()) and by_cluster


def test_a_job_the_node_refused_stays_eligible_for_a_new_pin_under_the_real_start():
    """config.d/20's START keeps a refused job off the pin it was refused on; judged as a pin
    written now, the job may still go anywhere (else it would never be pinned again)."""
    from test_startd_config import REFUSED, START

    slots = [classad2.ClassAd({"Name": name, "Machine": "node1.cosched.test", "PartitionableSlot": True,
                               "PhiDeviceName": dev, "Start": START})
             for name, dev in (("slot2@node1@node1.cosched.test", "mic0"), ("slot3@node1@node1.cosched.test", "mic1"))]
    ads = []
    for proc, pin in enumerate(({"CoSchedPinSlot": "slot2@node1@node1.cosched.test", "CoSchedPinCycle": 9,
                                 "CoSchedPinTime": 900}, {})):  # refused on its pin; already unpinned
        ad = classad2.ClassAd({"ClusterId": 1, "ProcId": proc, "JobStatus": 1, "RequestCpus": 1, "RequestMemory": 64,
                               "RequestPhiMemory": 1000, "RequestPhiThreads": 60, **REFUSED, **pin})
        ad["Requirements"] = classad2.ExprTree(f"true && {PIN}")
        ads.append((job_from_ad(ad, "s"), ad))
    assert eligible_slots(ads, slots) == {}  # every slot, for both
    refused = ads[0][0]
    d = decide(PoolState((refused,), (slot("slot2@node1@node1.cosched.test"), slot("slot3@node1@node1.cosched.test"))),
               10, FirstFit())
    assert [p.slot for p in d.pins] == ["slot3@node1@node1.cosched.test"]
