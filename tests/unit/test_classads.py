"""ClassAds and snapshot files to records: the bad-input rule of issue 2."""
import json

import classad2
import pytest

from condor_sched.classads import SnapshotError, job_from_ad, read_ads, AdError
from condor_sched.model import JobStatus, SlotKind
from condor_sched.snapshot import load_snapshot


def job(**overrides):
    ad = {"ClusterId": 7, "ProcId": 1, "JobStatus": 1, "Owner": "alice", "RequestCpus": 1,
          "RequestMemory": 128, "RequestPhiMemory": 500, "RequestPhiThreads": 60,
          "GlobalJobId": "schedA#7.1#1700000000", "QDate": 1700000000, "Cmd": "/home/alice/bin/km",
          "Requirements": "/Expr((TARGET.Arch == \"X86_64\") && (TARGET.Name =?= MY.CoSchedPinSlot))/"}
    ad.update(overrides)
    return {k: v for k, v in ad.items() if v is not None}


def pslot(name="slot2@node1@node1.cosched.test", **overrides):
    ad = {"Name": name, "Machine": "node1.cosched.test", "PartitionableSlot": True,
          "Cpus": 4, "TotalSlotCpus": 4, "Memory": 1024, "TotalSlotMemory": 1024,
          "PhiMemory": 7000, "TotalSlotPhiMemory": 8192, "PhiThreads": 180, "TotalSlotPhiThreads": 240,
          "PhiDeviceName": "mic0"}
    ad.update(overrides)
    return {k: v for k, v in ad.items() if v is not None}


def write(tmp_path, name, ads):
    path = tmp_path / name
    path.write_text(json.dumps(ads))
    return path


def test_json_snapshot_gives_jobs_keyed_by_schedd_and_device_slots(tmp_path):
    q = write(tmp_path, "q.json", [job(), job(ProcId=2, GlobalJobId="schedB#7.2#1")])
    m = write(tmp_path, "m.json", [pslot(), pslot("slot2_1@node1@node1.cosched.test", PartitionableSlot=False)])
    state = load_snapshot(q, m)
    assert [str(j.key) for j in state.jobs] == ["schedA#7.1", "schedB#7.2"]
    j = state.jobs[0]
    assert (j.request.device_memory_mb, j.request.device_threads, j.status) == (500, 60, JobStatus.IDLE)
    assert j.has_pin_clause and j.pinned_slot is None and j.program == "km"
    assert len(state.slots) == 1  # the dynamic slot is accounted in its parent
    s = state.slots[0]
    assert s.kind is SlotKind.DEVICE and s.free.device_memory_mb == 7000 and s.total.device_threads == 240
    assert state.skipped == ()


def test_string_where_a_number_belongs_skips_that_job_and_names_the_attribute(tmp_path):
    q = write(tmp_path, "q.json", [job(), job(ProcId=2, RequestPhiThreads="sixty")])
    m = write(tmp_path, "m.json", [pslot(), pslot("slot3@node1@node1.cosched.test", TotalSlotPhiMemory="big")])
    state = load_snapshot(q, m)
    assert len(state.jobs) == 1 and len(state.slots) == 1
    reasons = [str(s) for s in state.skipped]
    assert any("job schedA#7.2" in r and "RequestPhiThreads" in r for r in reasons)
    assert any("slot slot3@node1" in r and "TotalSlotPhiMemory" in r for r in reasons)


@pytest.mark.parametrize("missing", ["RequestCpus", "RequestMemory", "RequestPhiThreads", "ClusterId"])
def test_missing_request_attribute_is_a_recorded_skip(tmp_path, missing):
    q = write(tmp_path, "q.json", [job(**{missing: None}), job(ProcId=3)])
    state = load_snapshot(q, write(tmp_path, "m.json", [pslot()]))
    assert [j.key.proc for j in state.jobs] == [3]
    assert len(state.skipped) == 1 and missing in state.skipped[0].reason


def test_bad_json_is_an_error_naming_file_and_place(tmp_path):
    q = tmp_path / "q.json"
    q.write_text('[\n {"ClusterId": 1,\n  "ProcId": }\n]')
    with pytest.raises(SnapshotError, match=r"q\.json: bad JSON at line 3 column"):
        load_snapshot(q, write(tmp_path, "m.json", []))


def test_non_list_and_non_object_items_are_errors(tmp_path):
    with pytest.raises(SnapshotError, match="item 1 is not a JSON object"):
        read_ads(write(tmp_path, "q.json", [job(), 5]))
    with pytest.raises(SnapshotError, match="cannot read"):
        read_ads(tmp_path / "absent.json")


def test_long_format_is_read_and_an_unparsable_ad_is_an_error(tmp_path):
    good = tmp_path / "q.long"
    good.write_text('ClusterId = 4\nProcId = 0\nJobStatus = 2\nRequestCpus = 1\nRequestMemory = 64\n'
                    'GlobalJobId = "s1#4.0#1"\nRemoteHost = "slot2_1@node1@node1.cosched.test"\n\n'
                    'ClusterId = 5\nProcId = 0\nJobStatus = 1\nRequestCpus = 1\nRequestMemory = 64\n'
                    'GlobalJobId = "s1#5.0#1"\n')
    state = load_snapshot(good, write(tmp_path, "m.json", []))
    assert [j.status for j in state.jobs] == [JobStatus.RUNNING, JobStatus.IDLE]
    assert state.jobs[0].remote_slot.startswith("slot2_1@node1")
    bad = tmp_path / "bad.long"
    bad.write_text("ClusterId = 4\n\nthis is not = = a classad ][\n")
    with pytest.raises(SnapshotError, match="line 3 is not 'Attr = value'"):
        read_ads(bad)


def test_expression_requests_are_evaluated_and_bad_ranges_refused():
    ad = classad2.ClassAd(job(RequestMemory=None))
    ad["ImageSize"] = 4096
    ad["RequestMemory"] = classad2.ExprTree("(ImageSize + 1023) / 1024")
    assert job_from_ad(ad, "s").request.memory_mb == 4
    ad["RequestPhiMemory"] = -5
    with pytest.raises(AdError, match=r"RequestPhiMemory = -5 is outside \[1, 1000000000000\]"):
        job_from_ad(ad, "s")
    ad["RequestPhiMemory"] = 500
    ad["CoSchedAlpha"] = 3.0
    with pytest.raises(AdError, match="CoSchedAlpha"):
        job_from_ad(ad, "s")


def test_a_skipped_job_keeps_its_key_and_pin(tmp_path):
    q = write(tmp_path, "q.json", [job(RequestPhiThreads="x", CoSchedPinSlot="slot2@node1@h")])
    state = load_snapshot(q, write(tmp_path, "m.json", []))
    (skip,) = state.skipped
    assert (str(skip.job), skip.pinned_slot) == ("schedA#7.1", "slot2@node1@h")
