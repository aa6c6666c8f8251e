"""A spare job the primaries need the memory back from goes back to idle, never OOM-killed, and
is told why however late the sidecar looks: no claim's limit is below its request, a start the
node cannot hold is refused, the agent keeps its request as a record once the claim is gone
(``CoSchedSpareVacated_<c>_<p>``), which never preempts, and the sidecar keeps the words in the
job's reason until it runs again."""
from __future__ import annotations

import shutil
from pathlib import Path

from cosched_node import ads, errors
from cosched_node.spare_cgroups import Limits
from cosched_node.spare_duty import NodeLimits, SpareUse, split
from test_spare_mode import NOW, decide, job_ad, key, node_ads, pinned, published
from test_spare_node import GOOD, MB, Node, cron_lines

LIMITS = NodeLimits(cores=4.0, memory_hard_mb=4000.0, memory_soft_mb=3000.0, tightened=False)
WHY = "spare capacity: the primaries need the memory back (spare jobs may use 2000 MB, this job uses 3000 MB)"


def test_a_claim_keeps_at_least_its_request_and_the_largest_holder_goes_first():
    # a job using 100 of the 1500 MB it asked for keeps 1500 plus its share of the slack
    shares, evicted = split([SpareUse("a", 1, 100 * MB, 1500 * MB), SpareUse("b", 1, 200 * MB, 500 * MB)], LIMITS)
    assert evicted == [] and shares["a"] == Limits(2.0, 2500 * MB - 500 * MB, 2500 * MB)
    assert shares["b"].memory_hard_bytes == 1500 * MB
    # requests beyond the node: the largest holder goes, even though both use little
    shares, evicted = split([SpareUse("a", 1, 100 * MB, 3000 * MB), SpareUse("b", 1, 200 * MB, 1500 * MB)], LIMITS)
    assert evicted == ["a"] and shares["b"].memory_hard_bytes == 4000 * MB
    # a job above its request holds what it uses
    _, evicted = split([SpareUse("a", 1, 3500 * MB, 1000 * MB), SpareUse("b", 1, 200 * MB, 1000 * MB)], LIMITS)
    assert evicted == ["a"]


def test_a_start_the_node_cannot_hold_is_refused_with_what_it_has(tmp_path: Path):
    node = Node(tmp_path, 2)
    first = node.spare_start(1)                                         # no estimate yet
    assert first["status"] == "refused" and first["code"] == errors.EXIT_OVERSUBSCRIBED
    assert "the node has no estimate of its primaries yet" in first["message"]
    node.view.drop(first["job"])
    primary = node.claim(1, 4)
    for k in range(14):                                                 # the primary holds 6500 of 8000 MB
        node.burn(primary, 0, anon_kb=6500 * 1024)
        node.tick(1000.0 + 5 * k)
    ok = node.spare_start(1)                                            # 1000 MB of the 1500 left
    assert ok["status"] == "ok", ok
    node.tick(1070.0)
    refused = node.spare_start(1)
    assert refused["status"] == "refused" and refused["message"].endswith(
        "the primaries leave spare jobs 1500 MB now; spare jobs hold 1000 MB and this one asks 1000 MB"), refused
    waiting = node.claim(2, 1, admitted=False)                          # its hook has not asked yet
    published = node.tick(1075.0)
    assert [c["job"] for c in published["claims"]] == [ok["job"]]       # neither is confined, nor vacated
    assert published["evict"] == [] and f"spare job {waiting} " not in node.log()


def test_a_request_outlives_its_claim_as_a_record_that_never_preempts(tmp_path: Path):
    node = Node(tmp_path, 2)
    primary = node.claim(1, 4)
    node.burn(primary, 0, anon_kb=1000 * 1024)
    node.tick(1000.0)
    big = node.claim(2, 2, own_cgroup=True)
    (node.group_dir(node.jobs[big]["group"]) / "memory.stat").write_text(f"anon {3000 * MB}\nshmem 0\n")
    node.tick(1005.0)
    node.burn(primary, 0, anon_kb=6000 * 1024)
    assert [e["job"] for e in node.tick(1010.0)["evict"]] == [big]
    slot = node.jobs[big]["slot"]
    assert ads.ad_get(node.cron(1010.0), f"CoSchedSpareEvict_{slot}").startswith(big)

    shutil.rmtree(node.proc / str(node.jobs[big]["starter"]))       # the startd vacated it: the claim is gone
    node.view.drop(big)
    published_now = node.tick(1015.0)
    assert published_now["evict"] == [] and [e["job"] for e in published_now["vacated"]] == [big]
    ad = node.cron(1015.0)
    assert ads.ad_get(ad, f"CoSchedSpareEvict_{slot}") is None              # nothing left for PREEMPT to read
    text = ads.ad_get(ad, f"CoSchedSpareVacated_{big.replace('.', '_')}")
    assert text.startswith("1010 spare capacity: the primaries need the memory back"), text

    assert node.tick(1010.0 + 900)["vacated"]                                # kept 15 minutes
    assert node.tick(1010.0 + 905)["vacated"] == []                          # then history


def test_the_cron_publishes_only_records_with_valid_ids_and_times(tmp_path: Path):
    vacated = [{"job": "4.0", "time": 1990.7, "reason": 'r" ; PREEMPT = true'},
               {"job": "5.0\n", "time": 1990, "reason": "newline in the id"},
               {"job": "6.0", "time": "soon", "reason": "r"}, {"job": "7.0", "time": -1, "reason": "r"},
               {"job": "8.0 || true", "time": 1990, "reason": "r"}, {"job": "9.1", "time": 1990, "reason": 5},
               "garbage"]
    ad = cron_lines(tmp_path, {**GOOD, "vacated": vacated})
    assert sorted(k.lower() for k in ad if k.lower().startswith("coschedsparevacated")) == ["coschedsparevacated_4_0"]
    assert ads.ad_get(ad, "CoSchedSpareVacated_4_0") == "1990 r  PREEMPT  true"
    assert not any(k.lower().startswith("coschedsparevacated") for k in cron_lines(tmp_path, {**GOOD, "vacated": {}}))


def vacated_slots(when: int) -> list:
    return node_ads("n1", spare=published(8.0, 30000, CoSchedSpareVacated_1_0=f"{when} {WHY}",
                                          CoSchedSpareVacated_1_7="not a time")) + \
        node_ads("n2", spare=published(8.0, 30000))


def test_the_sidecar_tells_a_vacated_job_why_from_the_record_of_its_last_run():
    last_run = NOW - 300
    job = job_ad(0, CoSchedPinSlot="slot2@n1.test", CoSchedPinCycle=4, LastVacateTime=NOW - 30,
                 JobCurrentStartDate=last_run, CoSchedPinReason="running on slot2_1@n1.test (pinned there by condor_sched)")
    decision = decide([job], vacated_slots(last_run + 200))
    assert {u.job: u.reason for u in decision.unpins} == {key(0): f"vacated from n1.test: {WHY}"}
    assert decision.reasons[key(0)].startswith(f"vacated from n1.test: {WHY}; now pinned to slot2@")

    # A request older than the job's last start is about an earlier run: the pin stands, and
    # the job is told it is idle again rather than still "running on".
    decision = decide([job], vacated_slots(last_run - 10))
    assert not decision.unpins
    assert decision.reasons[key(0)].startswith("idle again after running; still pinned to slot2@n1.test")


def test_the_words_stay_in_the_reason_until_the_job_runs_again():
    told = f"vacated from n1.test: {WHY}; now waiting: no node has room"
    idle = job_ad(0, CoSchedPinReason=told)
    decision = decide([idle], node_ads("n1", spare=published(8.0, 30000)))
    assert pinned(decision) == {0: "slot2@n1.test"}
    assert decision.reasons[key(0)].startswith(f"vacated from n1.test: {WHY}; now pinned to slot2@n1.test")

    ran = job_ad(0, status=2, slot="slot2_1@n1.test", CoSchedPinSlot="slot2@n1.test", CoSchedPinCycle=4,
                 CoSchedPinReason=decision.reasons[key(0)])
    decision = decide([ran], node_ads("n1", spare=published(8.0, 30000), spare_busy=4, spare_memory_busy=4000))
    assert decision.reasons[key(0)] == "running on slot2_1@n1.test (pinned there by condor_sched)"


def test_a_job_its_only_node_just_refused_is_told_so_not_that_no_slot_accepts_it():
    refused = job_ad(0, CoSchedPinSlot="slot2@n1.test", CoSchedPinCycle=4, CoSchedPinTime=NOW - 100,
                     LastVacateTime=NOW - 30, VacateReasonCode=1007,
                     VacateReason="spare-capacity start of 1.0 on n1 (slot2_1) refused: the primaries leave ...")
    decision = decide([refused], node_ads("n1", spare=published(8.0, 30000)))
    (unpin,) = decision.unpins
    assert unpin.reason.startswith("n1.test refused it as a spare-capacity job: spare-capacity start of 1.0")
    assert decision.reasons[key(0)].endswith("; now waiting: no slot but slot2@n1.test accepts it, tried again next cycle")
