"""Lasting problems warned once; a schedd that does not answer leaves the others planned."""
from __future__ import annotations

import logging

import classad2
import pytest

from condor_sched import pool
from condor_sched.cycle import CycleConfig
from condor_sched.model import Job, JobKey, JobStatus, PoolState, Resources, Skipped, Slot, SlotKind
from condor_sched.settings import SidecarSettings
from condor_sched.sidecar import Sidecar
from condor_sched.classads import state_from_ads
from condor_sched.watch import Notices, ScheddWatch, WatchedRead

from pool_ads import job_ad, slot_ad
from test_sidecar import FirstFit

log = logging.getLogger("condor_sched.test_watch")


def messages(caplog, level=None) -> list[str]:
    return [r.getMessage() for r in caplog.records if level is None or r.levelno == level]


def test_a_lasting_problem_is_warned_once_and_its_end_logged_once(caplog):
    caplog.set_level(logging.INFO)
    notices = Notices(log)
    for _ in range(5):
        notices.warn("collector", "the collector does not answer (refused)", kind="down")
    notices.warn("collector", "the collector does not answer (timed out)", kind="down")
    assert notices.clear("collector", "the collector answers again")
    assert not notices.clear("collector", "the collector answers again")
    notices.warn("collector", "the collector does not answer (refused)", kind="down")  # a new outage
    assert messages(caplog) == ["the collector does not answer (refused)", "the collector answers again",
                                "the collector does not answer (refused)"]


def test_a_problem_whose_kind_changes_is_warned_again(caplog):
    notices = Notices(log)
    notices.warn("schedd:s2", "s2 unreachable", kind="unreachable")
    notices.warn("schedd:s2", "s2 gone", kind="gone")
    notices.warn("schedd:s2", "s2 gone again", kind="gone")
    assert messages(caplog, logging.WARNING) == ["s2 unreachable", "s2 gone"]


def test_settle_warns_new_problems_and_logs_each_one_that_ended(caplog):
    caplog.set_level(logging.INFO)
    notices = Notices(log)
    ended = lambda what: f"{what} is fine"  # noqa: E731
    notices.settle("skipped", {"job 1.0": "bad 1.0", "job 1.1": "bad 1.1"}, ended)
    notices.settle("skipped", {"job 1.0": "bad 1.0", "job 1.1": "bad 1.1"}, ended)
    notices.settle("skipped", {"job 1.1": "bad 1.1"}, ended)
    notices.settle("other", {}, ended)
    assert messages(caplog) == ["bad 1.0", "bad 1.1", "job 1.0 is fine"]


def test_schedds_that_stop_answering_or_vanish_are_warned_once_per_outage_and_logged_when_back(caplog):
    caplog.set_level(logging.INFO)
    watch = ScheddWatch(Notices(log))
    assert watch.observe({"s1": 3, "s2": 2}, {}) == ()
    assert watch.observe({"s1": 3}, {"s2": "connection refused"}) == ("s2",)
    assert watch.observe({"s1": 4}, {"s2": "connection refused"}) == ("s2",)
    assert watch.observe({"s1": 4}, {}) == ("s2",)  # its ad left the collector: gone
    assert watch.observe({"s1": 4}, {}) == ("s2",)
    assert watch.missing() == {"s2": "gone"}
    assert watch.observe({"s1": 4, "s2": 1}, {}) == ()
    assert watch.observe({"s1": 4}, {"s3": "timed out"}) == ("s2", "s3")  # s2 gone again, s3 never answered
    assert messages(caplog) == [  # unreachable, then gone: one outage, one warning
        "schedd s2 is unreachable (connection refused): its 2 idle co-scheduled jobs are not planned until it "
        "answers; the other schedds go on",
        "schedd s2 is back: its 1 idle co-scheduled job is planned again",
        "schedd s3 is unreachable (timed out): its idle co-scheduled jobs (none seen yet) are not planned until "
        "it answers; the other schedds go on",
        "schedd s2 is gone (its ad left the collector, e.g. condor_off): its 1 idle co-scheduled job is not "
        "planned until it is back; the other schedds go on",
    ]


DEV = Resources(cpus=4, memory_mb=1024, device_memory_mb=8192, device_threads=240)


def device_job(schedd: str, proc: int) -> Job:
    return Job(key=JobKey(schedd, 1, proc), owner="alice", status=JobStatus.IDLE,
               request=Resources(cpus=1, memory_mb=64, device_memory_mb=2000, device_threads=60),
               has_pin_clause=True, submitted_at_s=100)


def device_slot(name: str) -> Slot:
    return Slot(name, "node1.cosched.test", SlotKind.DEVICE, DEV, DEV, device_name="mic0", updated_at_s=1)


class RecordingEditor:
    def __init__(self) -> None:
        self.pins: list[tuple[JobKey, str]] = []

    def hold(self, job, reason):
        pass

    def write(self, edit):
        if edit.attr == "Requirements" or edit.value == "undefined":
            raise AssertionError(f"unexpected enroll or unpin: {edit}")
        if edit.attr == "CoSchedPinSlot":
            self.pins += [(job, classad2.ExprTree(edit.value).eval()) for job in edit.jobs]


def test_one_unreachable_schedd_leaves_the_cycle_to_plan_the_others(caplog):
    caplog.set_level(logging.INFO)
    slots = [slot_ad(device_slot("slot2@node1@node1.cosched.test"))]
    s1_jobs = [job_ad(device_job("s1", p)) for p in range(2)]
    s2_jobs = [job_ad(device_job("s2", p)) for p in range(2)]
    reads = iter([
        pool.LiveAds({"s1": s1_jobs, "s2": s2_jobs}, slots),
        pool.LiveAds({"s1": s1_jobs}, slots, unreachable={"s2": "Failed to fetch ads from schedd"}),
        pool.LiveAds({"s1": s1_jobs}, slots, unreachable={"s2": "Failed to fetch ads from schedd"}),
    ])
    notices = Notices(logging.getLogger("condor_sched.sidecar"))
    editor = RecordingEditor()
    sidecar = Sidecar(SidecarSettings(), CycleConfig(FirstFit(), None), WatchedRead(ScheddWatch(notices), reads.__next__, lambda ads: state_from_ads(ads.jobs, ads.slots)),
                      editor, notices=notices)
    first = sidecar.run_cycle()
    assert first.decision.seen == 4 and first.numbers()["UnreachableSchedds"] == ""
    editor.pins.clear()
    second = sidecar.run_cycle()
    assert second.decision.seen == 2 and [j.schedd for j, _ in editor.pins] == ["s1", "s1"]
    assert second.unreachable_schedds == ("s2",) and second.numbers()["UnreachableSchedds"] == "s2"
    sidecar.run_cycle()
    warnings = messages(caplog, logging.WARNING)
    assert len(warnings) == 1 and warnings[0].startswith("schedd s2 is unreachable (Failed to fetch ads from schedd)")
    assert any(m.startswith("cycle 2: 2 idle co-scheduled jobs seen") and m.endswith("; schedds not read: s2")
               for m in messages(caplog))
    # s2's jobs keep the cycle they were first seen in, for their aging once s2 is back.
    assert sidecar.memory.first_seen[JobKey("s2", 1, 0)] == 1


def test_a_skipped_job_is_warned_once_and_logged_when_it_reads_again(caplog):
    caplog.set_level(logging.INFO)
    slot = device_slot("slotA")
    bad = Skipped("job s1#1.9", "RequestPhiMemory is not a number", JobKey("s1", 1, 9))
    states = iter([PoolState((), (slot,), (bad,))] * 3 + [PoolState((), (slot,))])
    sidecar = Sidecar(SidecarSettings(), CycleConfig(FirstFit(), None), states.__next__, RecordingEditor())
    for _ in range(4):
        sidecar.run_cycle()
    assert [m for m in messages(caplog) if "job s1#1.9" in m] == [
        "skipped job s1#1.9: RequestPhiMemory is not a number",
        "job s1#1.9 is no longer skipped (its ad reads again, or it left)"]


class FakeSchedd:
    down: set[str] = set()

    def __init__(self, ad):
        self.name = ad["Name"]

    def query(self, constraint, projection):
        if self.name in self.down:
            raise RuntimeError("Failed to fetch ads from schedd")
        return [classad2.ClassAd({"ClusterId": 1, "ProcId": 0, "JobStatus": 1})]


class FakeCollector:
    up = True

    def query(self, *args, **kwargs):
        if not self.up:
            raise RuntimeError("Failed communication with collector.")
        return [classad2.ClassAd({"Name": "slot1@n1"})]


@pytest.fixture
def two_schedds(monkeypatch):
    monkeypatch.setattr(pool, "schedd_ads", lambda: [classad2.ClassAd({"Name": n}) for n in ("s1", "s2")])
    monkeypatch.setattr(pool.htcondor2, "Schedd", FakeSchedd)
    collector = FakeCollector()
    monkeypatch.setattr(pool, "_collector", lambda: collector)
    monkeypatch.setattr(FakeSchedd, "down", {"s2"})
    return collector


def test_a_partial_read_records_the_schedd_that_did_not_answer_and_reads_the_rest(two_schedds):
    ads = pool.read_ads(partial=True)
    assert list(ads.jobs) == ["s1"] and ads.unreachable == {"s2": "Failed to fetch ads from schedd"}
    assert pool.ads_to_state(ads).unreachable_schedds == ("s2",)
    with pytest.raises(pool.PoolUnreachable, match="schedd 's2' did not answer"):
        pool.read_ads()  # a snapshot must be whole


def test_a_collector_that_does_not_answer_is_told_apart(two_schedds):
    two_schedds.up = False
    with pytest.raises(pool.CollectorUnreachable, match="startd ads"):
        pool.read_ads(partial=True)
    with pytest.raises(pool.CollectorUnreachable, match="negotiator"):
        pool.last_negotiation_cycle_end()


def test_a_schedd_that_rejects_a_cached_security_session_is_asked_again_at_once(two_schedds, monkeypatch):
    calls = []

    class RestartedSchedd(FakeSchedd):
        def query(self, constraint, projection):
            calls.append(self.name)
            if self.name == "s1" and calls.count("s1") == 1:
                raise RuntimeError("Failed to fetch ads from schedd, errmsg=SECMAN:2004:Server rejected our session id")
            return super().query(constraint, projection)

    monkeypatch.setattr(pool.htcondor2, "Schedd", RestartedSchedd)
    ads = pool.read_ads(partial=True)
    assert list(ads.jobs) == ["s1"] and calls == ["s1", "s1", "s2"]  # s2 down: one attempt, no retry
