"""The fast readers of issue 11: streamed snapshot files and live ads read as JSON views must
give exactly the records, skips, eligible slots, ranks and plans of ClassAds evaluated one
attribute at a time, and refuse exactly what the whole-file reader refuses."""
from __future__ import annotations

import json
import os
import random
from pathlib import Path

import classad2
import pytest

from condor_sched.classads import snapshot_files as classads
from condor_sched.classads import SnapshotError, read_ads, state_from_ads
from condor_sched.cycle import CycleConfig, CycleMemory, decide_cycle
from condor_sched.modes.planning import PlanSettings
from condor_sched.modes.registry import get_policy
from condor_sched.profiles import ProfileStore
from condor_sched.snapshot import load_snapshot

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "snapshots" / "default"
PINNED_HERE = r'(TARGET.CoSchedPinSlot =?= regexps("^(slot[0-9]+)(_[0-9]+)?(@.*)", MY.Name, "\\1\\3"))'
START = ("(MY.PhiDeviceName =!= undefined) ? ((TARGET.RequestPhiMemory =!= undefined && TARGET.RequestPhiMemory > 0) "
         f"&& {PINNED_HERE}) : !(TARGET.RequestPhiMemory =!= undefined && TARGET.RequestPhiMemory > 0)")
REQUIREMENTS = ('(TARGET.Arch == "X86_64") && (TARGET.Memory >= RequestMemory) && (TARGET.PhiMemory >= '
                'RequestPhiMemory) && (TARGET.Disk >= RequestDisk) && (TARGET.HasFileTransfer)')
IF_NEEDED = "((TARGET.FileSystemDomain == MY.FileSystemDomain) || (TARGET.HasFileTransfer)) && "


def expr(text: str) -> str:
    return f"/Expr({text})/"


def mixed_queue(n: int, seed: int) -> list[dict]:
    """Jobs of many shapes and kinds, expressions in requests, odd values, a duplicate id."""
    rng = random.Random(seed)
    ads = []
    for i in range(n):
        ad = {"ClusterId": 10 + i // 5, "ProcId": i % 5, "JobStatus": rng.choice([1, 1, 1, 2, 5]),
              "Owner": rng.choice(["alice", "bob", "jürgen"]), "RequestCpus": rng.choice([1, 2]),
              "RequestMemory": rng.choice([64, 100, 2048]), "RequestPhiMemory": rng.choice([300, 650, 1250, 9000]),
              "RequestPhiThreads": rng.choice([60, 180, 240]), "QDate": 1700000000 + i, "Cmd": "/bin/km",
              "GlobalJobId": f"schedA#{10 + i // 5}.{i % 5}#1", "TransferInputSizeMB": rng.choice([1, 12]),
              "RequestDisk": expr("MAX({ 1024,(TransferInputSizeMB + 1) * 1.25 }) * 1024"),
              "Requirements": expr(REQUIREMENTS + " && (TARGET.Name is MY.CoSchedPinSlot)"),
              "CoSchedPinOriginalRequirements": expr(REQUIREMENTS), "Environment": "A=1 B=ü " * 20,
              "FileSystemDomain": "cosched.test", "Rank": 0.0, "CoSchedPinSlot": None, "JobPrio": 0}
        roll = rng.random()
        if roll < 0.1:
            ad.update(RequestPhiMemory=None, RequestPhiThreads=None, CoSchedProgram=rng.choice(["MG", "LU"]))
        elif roll < 0.2:
            ad.update(RequestPhiMemory=expr("1000 + 24"), RequestMemory=expr("RequestCpus * 512"))
        elif roll < 0.3:
            ad.update(rng.choice([{"RequestPhiThreads": 2.5}, {"RequestPhiThreads": "many"}, {"RequestMemory": 1e300},
                                  {"RequestPhiMemory": expr("1/0")}, {"ProcId": 1.5}, {"JobPrio": "high"},
                                  {"RequestPhiMemory": 60.0, "RequestPhiThreads": 60.0}, {"requestmemory": 128},
                                  {"RequestCpus": 2**70}, {"Owner": None}, {"QDate": 0.1 + 0.2}]))
        elif roll < 0.4:
            ad.update(Rank=expr('TARGET.PhiDeviceName == "mic1"'))
        elif roll < 0.5:
            ad.update(CoSchedPinOriginalRequirements=expr(IF_NEEDED + REQUIREMENTS))
        elif roll < 0.55:
            ad.update(CoSchedPinOriginalRequirements=expr(REQUIREMENTS + ' && regexp("node[12]", TARGET.Machine)'))
        elif roll < 0.6:
            ad.update(CoSchedPinOriginalRequirements=None)
        ads.append({k: v for k, v in ad.items() if v is not None or rng.random() < 0.5})
    ads.append(dict(ads[0], Owner="copy"))  # a duplicate job id
    return ads


def machines(nodes: int) -> list[dict]:
    """Two device slots and one socket slot a node; some START variants the classes must keep apart."""
    ads = []
    for node in range(nodes):
        host = f"node{node}.cosched.test"
        for slot in (1, 2, 3):
            ad = {"Name": f"slot{slot}@{host}", "Machine": host, "PartitionableSlot": True, "Arch": "X86_64",
                  "Cpus": 4, "TotalSlotCpus": 4, "Memory": 1024, "TotalSlotMemory": 1024, "Disk": 10**7,
                  "HasFileTransfer": True, "FileSystemDomain": host, "LastHeardFrom": 1000, "Start": expr(START),
                  "ChildName": [], "Requirements": expr("START && WithinResourceLimits")}
            if slot > 1:
                ad.update(PhiDeviceName=f"mic{slot - 2}", PhiMemory=8192, TotalSlotPhiMemory=8192, PhiThreads=240,
                          TotalSlotPhiThreads=240)
            if node == 1 and slot == 2:  # a START that reads its name otherwise
                ad["Start"] = expr(START + ' && regexp("node1", MY.Name)')
            if node == 2 and slot == 3:  # dynamic attribute access
                ad["Start"] = expr(START + ' && eval("MY.Cpus") > 0')
            if node == 3:
                ad["Disk"] = expr("TotalDisk / 2")
                ad["TotalDisk"] = 4 * 10**6
            ads.append(ad)
    return ads


def write(path: Path, ads: list[dict]) -> Path:
    """As condor_q -json writes them (one attribute a line, ``/`` escaped)."""
    text = json.dumps(ads, indent=2, ensure_ascii=False)
    path.write_text(text.replace('"/Expr(', '"\\/Expr(').replace(')/"', ')\\/"'), encoding="utf-8")
    return path


def one_by_one(patch) -> None:
    """Matchmaking as before issue 11: every slot on its own, one symmetric match each."""
    patch.setattr(classads._SlotClasses, "partition", lambda self, probe, signature, with_start=True: self._singletons)
    patch.setattr(classads._SlotClasses, "start_accepting", lambda self, probe, values, requirements: None)


def reference_state(queue: Path, machines_file: Path, monkeypatch) -> classads.PoolState:
    """The state as before issue 11: whole ClassAds evaluated attribute by attribute, every
    slot matched one by one."""
    with monkeypatch.context() as m:
        one_by_one(m)
        return classads._build_state([(None, read_ads(queue))], read_ads(machines_file))


def decision_json(state) -> dict:
    config = CycleConfig(get_policy("knapsack"), get_policy("sns"), PlanSettings(deterministic=True), 3, ProfileStore())
    out = decide_cycle(state, CycleMemory.fresh(state), config).to_json()
    out.pop("stats")
    return out


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_the_streamed_reader_gives_the_state_and_plan_of_whole_classads(tmp_path, monkeypatch, seed):
    q, m = write(tmp_path / "q.json", mixed_queue(120, seed)), write(tmp_path / "m.json", machines(5))
    old = reference_state(q, m, monkeypatch)
    new = load_snapshot(q, m)
    assert new.jobs == old.jobs and new.slots == old.slots and new.skipped == old.skipped
    assert [j.attributes for j in new.jobs] == [j.attributes for j in old.jobs]
    assert new.eligible == old.eligible and new.ranks == old.ranks
    assert decision_json(new) == decision_json(old)
    # the queue exercises what it should: skips, expression requests, eligibility and Rank
    assert len(new.skipped) >= 3 and new.eligible and new.ranks
    assert any(j.request.device_memory_mb == 1024 for j in new.jobs)


def test_the_example_snapshot_plans_as_before(monkeypatch):
    q, m = EXAMPLES / "queue.json", EXAMPLES / "machines.json"
    old = reference_state(q, m, monkeypatch)
    new = load_snapshot(q, m)
    assert (new.jobs, new.slots, new.skipped, new.eligible) == (old.jobs, old.slots, old.skipped, old.eligible)
    assert decision_json(new) == decision_json(old) and decision_json(new)["assignments"]


def test_slot_classes_answer_as_every_slot_would(tmp_path, monkeypatch):
    """A START that reads the slot's name, an eval(), a Disk that is an expression, jobs that
    require a machine by name or compare file systems: each class answers as its members."""
    ads = read_ads(write(tmp_path / "m.json", machines(6)))
    jobs = [(j, ad) for ad in read_ads(write(tmp_path / "q.json", mixed_queue(60, 4)))
            for j in [_job_or_none(ad)] if j is not None and j.is_idle]
    grouped = classads.eligible_slots(jobs, ads)
    one_by_one(monkeypatch)
    assert grouped == classads.eligible_slots(jobs, ads)
    assert any("slot2@node1.cosched.test" not in names for names in grouped.values())
    classes = classads._SlotClasses(classads._targets(ads))
    assert classes.start[3 * 1 + 1] is None and classes.start[3 * 2 + 2] is None  # own classes
    assert classes.start[0] is not None and classes.start[3] is not None


def _job_or_none(ad):
    try:
        return classads.job_from_ad(ad, "schedA")
    except classads.AdError:
        return None


def test_a_queue_read_in_tiny_pieces_reads_the_same(tmp_path, monkeypatch):
    """Reads of 7 bytes cut UTF-8 characters, escapes, numbers and expressions in two."""
    q, m = write(tmp_path / "q.json", mixed_queue(30, 5)), write(tmp_path / "m.json", machines(2))
    whole = load_snapshot(q, m)
    monkeypatch.setattr(classads, "_CHUNK_BYTES", 7)
    assert load_snapshot(q, m) == whole


BAD_FILES = {
    "bad JSON in the middle": lambda text: text.replace('"ProcId": 3', '"ProcId": 3,,', 1),
    "an item that is not an object": lambda text: text.replace("[", "[1,", 1),
    "an expression that does not parse": lambda text: text.replace("1000 + 24", "1000 +* 24", 1),
    "nested too deep": lambda text: text.replace('"JobPrio": 0', '"JobPrio": ' + "[" * 20 + "]" * 20, 1),
    "an unpaired surrogate": lambda text: text.replace('"Cmd": "/bin/km"', '"Cmd": "\\ud800"', 1),
    "a cut file": lambda text: text[: len(text) // 2],
    "trailing garbage": lambda text: text + "x",
    "a BOM": lambda text: "\ufeff" + text,
    "not UTF-8": lambda text: text.replace("jürgen", "j\udcfcrgen", 1),
}


@pytest.mark.parametrize("case", sorted(BAD_FILES))
def test_a_streamed_bad_file_fails_as_the_whole_file_reader_says(tmp_path, case):
    good = write(tmp_path / "good.json", mixed_queue(20, 6)).read_text(encoding="utf-8")
    bad = tmp_path / "q.json"
    bad.write_bytes(BAD_FILES[case](good).encode("utf-8", "surrogateescape"))
    m = write(tmp_path / "m.json", machines(1))
    with pytest.raises(SnapshotError) as whole:
        read_ads(bad)
    with pytest.raises(SnapshotError) as streamed:
        load_snapshot(bad, m)
    assert str(streamed.value) == str(whole.value)
    with pytest.raises(SnapshotError) as machines_bad:  # as the machines file
        load_snapshot(write(tmp_path / "q2.json", mixed_queue(3, 1)), bad)
    assert str(machines_bad.value) == str(whole.value)
    with pytest.raises(SnapshotError, match="q3.json"):  # both bad: the queue is named, as before
        load_snapshot(bad.rename(tmp_path / "q3.json"), tmp_path / "q3.json")


def test_a_lone_object_empty_list_and_long_text_still_read(tmp_path):
    m = write(tmp_path / "m.json", machines(1))
    one = tmp_path / "one.json"
    one.write_text(json.dumps(mixed_queue(1, 7)[0]))
    assert len(load_snapshot(one, m).jobs) == 1
    empty = tmp_path / "empty.json"
    empty.write_text(" [ ] \n")
    assert load_snapshot(empty, m).jobs == ()
    long = tmp_path / "q.long"
    long.write_text("\n\n".join(ad.printOld() for ad in read_ads(write(tmp_path / "q.json", mixed_queue(12, 8)))))
    assert load_snapshot(long, m) == load_snapshot(tmp_path / "q.json", m)


def test_an_unpaired_surrogate_escape_is_refused_naming_the_attribute_not_a_crash(tmp_path):
    """classad2 25.14 kills the process on such a string; the readers refuse it first."""
    q = tmp_path / "q.json"
    q.write_text('[{"ClusterId": 1, "ProcId": 0, "Owner": "\\ud800x"}]')
    with pytest.raises(SnapshotError, match=r"item 0, attribute Owner: not Unicode text"):
        read_ads(q)
    with pytest.raises(SnapshotError, match=r"item 0, attribute Owner: not Unicode text"):
        load_snapshot(q, write(tmp_path / "m.json", []))
    q.write_text('[{"ClusterId": 1, "ProcId": 0, "Owner": "\\ud83d\\ude80"}]')  # a pair is a character
    (ad,) = read_ads(q)
    assert ad["Owner"] == "🚀"


def test_live_ads_read_as_json_views_give_the_records_of_the_classads(tmp_path):
    """What the sidecar calls (state_from_ads) on live ClassAds: reals printJson would round,
    strings that look like expressions, lists and nested ads read as the ClassAds hold them."""
    jobs = [classad2.parseOne(json.dumps(ad), classad2.ParserType.JSON) for ad in mixed_queue(80, 9)]
    odd = classad2.ClassAd({"ClusterId": 99, "ProcId": 0, "JobStatus": 1, "Owner": "/Expr(x)/", "RequestCpus": 1,
                            "RequestMemory": 64, "RequestPhiMemory": 500, "RequestPhiThreads": 60,
                            "CoSchedAlpha": 0.1 + 0.2, "QDate": 1, "L": [1, classad2.ExprTree("2 + 3")],
                            "GlobalJobId": "schedA#99.0#1"})
    jobs.append(odd)
    slots = [classad2.parseOne(json.dumps(ad), classad2.ParserType.JSON) for ad in machines(3)]
    live = state_from_ads({"schedA": jobs}, slots)
    whole = classads._build_state([("schedA", jobs)], slots)  # ClassAds evaluated one attribute at a time
    assert live == whole and [j.attributes for j in live.jobs] == [j.attributes for j in whole.jobs]
    (read,) = [j for j in live.jobs if j.key.cluster == 99]
    assert read.slowdown_threshold == 0.1 + 0.2 and read.owner == "/Expr(x)/"
    assert all(isinstance(ad, classads._PlainAd) for ad in classads.plain_ads(jobs))


def test_job_records_made_once_per_values_are_the_records_of_each_ad(tmp_path, monkeypatch):
    """Jobs of a cluster share one record made once and copied with their ids; values equal to
    Python but not to a ClassAd (1, 1.0, true), an expression among them, a null, an absent
    attribute and odd ids each keep a record of their own."""
    base = mixed_queue(1, 7)[0]
    variants = [{}, {"RequestCpus": 1.0}, {"RequestCpus": True}, {"RequestCpus": expr("1 + 1")},
                {"RequestLLCWays": None}, {"CoSchedPinSlot": "slot2@node1.cosched.test"}, {"ProcId": 1.0},
                {"ClusterId": -1}, {"ProcId": True}, {"JobStatus": 2, "RemoteHost": "slot1@node0.cosched.test"},
                {"QDate": "yesterday"}, {"JobPrio": 7}, {"CoSchedPinSlot": "slot2@node1.cosched.test",
                                                        "VacateReasonCode": 1007, "VacateReason": "no room"}]
    ads = []
    for cluster, variant in enumerate(variants, start=100):
        for proc in range(4):
            ad = dict(base, ClusterId=cluster, ProcId=proc, GlobalJobId=f"schedA#{cluster}.{proc}#1", QDate=1700000000 + proc,
                      JobPrio=proc % 2, EnteredCurrentStatus=1700000100 + proc * 100, CoSchedPinTime=1700000250)
            ad.update(variant)
            ads.append(ad)
    q, m = write(tmp_path / "q.json", ads), write(tmp_path / "m.json", machines(2))
    old, new = reference_state(q, m, monkeypatch), load_snapshot(q, m)
    assert new.jobs == old.jobs and new.skipped == old.skipped and new.eligible == old.eligible
    assert len(new.jobs) >= 24 and len(new.skipped) >= 12
    assert {j.request.cpus for j in new.jobs} == {1, 2}
    assert {j.start_refused for j in new.jobs} == {None, "no room"} and {j.job_prio for j in new.jobs} == {0, 1, 7}


def test_job_records_read_only_the_attributes_their_cache_key_holds(monkeypatch):
    """``_job_record`` keys a record on ``_record_reads()``: ``job_from_ad`` must read nothing else."""
    read: set[str] = set()
    plain, contains = classads._PlainAd._plain, classads._PlainAd.__contains__
    monkeypatch.setattr(classads._PlainAd, "_plain", lambda self, attr: read.add(attr.lower()) or plain(self, attr))
    monkeypatch.setattr(classads._PlainAd, "__contains__",
                        lambda self, attr: read.add(attr.lower()) or contains(self, attr))
    ads = mixed_queue(200, 8) + [dict(mixed_queue(1, 9)[0], JobStatus=1, VacateReasonCode=1007, VacateReason="no",
                                      CoSchedPinSlot="slot2@node1.cosched.test", LastVacateTime=5, CoSchedPinTime=4)]
    for obj in ads:
        try:
            classads.job_from_ad(classads._PlainAd(obj), "schedA")
        except classads.AdError:
            pass
    assert "vacatereason" in read and "requestphimemory" in read
    assert read <= {a.lower() for a in classads._record_reads() + classads._RECORD_PER_JOB_READS} | {"clusterid", "procid"}


def _split_always(monkeypatch) -> list[str]:
    """Read every queue file in two processes; returns the list of how each read ended."""
    ends: list[str] = []
    monkeypatch.setattr(classads, "SPLIT_READ_BYTES", 1)
    reader = classads._split_reader

    def counted(path):
        read = reader(path)
        if read is None:
            ends.append("not split")
            return None

        def counting(start_refs):
            try:
                yield from read(start_refs)
            except classads._SplitFailed:
                ends.append("failed")
                raise
            ends.append("split")
        return counting

    monkeypatch.setattr(classads, "_split_reader", counted)
    return ends


@pytest.mark.parametrize("seed", [1, 2])
def test_a_queue_read_in_two_processes_reads_the_same(tmp_path, monkeypatch, seed):
    q, m = write(tmp_path / "q.json", mixed_queue(150, seed)), write(tmp_path / "m.json", machines(3))
    whole = load_snapshot(q, m)
    ends = _split_always(monkeypatch)
    assert load_snapshot(q, m) == whole and ends == ["split"]


def test_a_cut_that_is_not_between_two_ads_is_read_as_one_stream(tmp_path, monkeypatch):
    """Strings holding ``}, {"`` and lists of nested ads near the middle: the first half does not
    parse as a list (or the other process fails), and the file is read whole, the same."""
    ads = mixed_queue(40, 3)
    for i, ad in enumerate(ads):
        ad["Note"] = 'a}, {"' * 3 if i % 2 else [{"x": 1}, {"y": 2}]
    q, m = write(tmp_path / "q.json", ads), write(tmp_path / "m.json", machines(2))
    whole = load_snapshot(q, m)
    ends = _split_always(monkeypatch)
    assert load_snapshot(q, m) == whole and ends == ["failed"]


def test_a_reader_process_that_dies_leaves_the_file_to_one_stream(tmp_path, monkeypatch):
    q, m = write(tmp_path / "q.json", mixed_queue(60, 4)), write(tmp_path / "m.json", machines(2))
    whole = load_snapshot(q, m)
    ends = _split_always(monkeypatch)
    monkeypatch.setattr(classads, "_read_half", lambda *args: os._exit(3))
    assert load_snapshot(q, m) == whole and ends == ["failed"]


@pytest.mark.parametrize("case", sorted(BAD_FILES))
def test_a_bad_file_read_in_two_processes_fails_as_the_whole_file_reader_says(tmp_path, monkeypatch, case):
    ads = mixed_queue(20, 6)
    good = write(tmp_path / "good.json", ads[:10] + [dict(ad, ClusterId=ad["ClusterId"] + 100) for ad in ads])
    bad = tmp_path / "q.json"
    text = good.read_text(encoding="utf-8")
    half = len(text) // 2 + text[len(text) // 2:].index('"ClusterId"')  # the fault in the second half
    bad.write_bytes((text[:half] + BAD_FILES[case](text[half:])).encode("utf-8", "surrogateescape")
                    if case not in {"a BOM", "an item that is not an object"} else
                    BAD_FILES[case](text).encode("utf-8", "surrogateescape"))
    with pytest.raises(SnapshotError) as whole:
        read_ads(bad)
    _split_always(monkeypatch)
    with pytest.raises(SnapshotError) as split:
        load_snapshot(bad, write(tmp_path / "m.json", machines(1)))
    assert str(split.value) == str(whole.value)


ODD_REQUIREMENTS = [
    "(TARGET.NoSuchAttr > 1) && (TARGET.Cpus > 0)",  # undefined && true: no match
    "(TARGET.Cpus > 0) && (1 / 0 > 0)",  # error operand
    "(TARGET.Cpus > 0) && ((TARGET.Disk > 5) || (TARGET.Memory > 10))",
    "(TARGET.Cpus > 8) || (TARGET.Memory >= 1024)",  # || at the top: one operand
    "(TARGET.Cpus > 0) ? (TARGET.Memory >= RequestMemory) : false",
    "(TARGET.Cpus >= MyCpus) && (TARGET.Memory >= MyMemory)",  # job expressions reading job attributes
    "(TARGET.FileSystemDomain == MY.FileSystemDomain) && (Cpus >= 1) && (TotalDisk =!= undefined)",  # unqualified
    "(TARGET.Cpus > 0) && (MY.Requirements =!= undefined)",  # reads its own Requirements
    '(TARGET.Arch == "X86_64") && (regexp("node[02]", TARGET.Machine)) && (TARGET.Memory >= 64)',
]


@pytest.mark.parametrize("requirements", ODD_REQUIREMENTS)
def test_requirements_evaluated_operand_by_operand_accept_what_the_whole_accepts(tmp_path, monkeypatch, requirements):
    ads = read_ads(write(tmp_path / "m.json", machines(4)))
    jobs = []
    for i, domain in enumerate(["cosched.test", "node1.cosched.test", "node2.cosched.test"]):
        ad = classad2.ClassAd({"ClusterId": 1, "ProcId": i, "JobStatus": 1, "Owner": "alice", "RequestCpus": 1,
                               "RequestMemory": 64 * (i + 1), "RequestPhiMemory": 300, "RequestPhiThreads": 60,
                               "FileSystemDomain": domain, "MyCpus": classad2.ExprTree("RequestCpus * 2"),
                               "MyMemory": classad2.ExprTree("RequestMemory + MyCpus")})
        ad["Requirements"] = classad2.ExprTree(requirements)
        jobs.append((classads.job_from_ad(ad, "schedA"), ad))
    grouped = classads.eligible_slots(jobs, ads)
    one_by_one(monkeypatch)
    assert grouped == classads.eligible_slots(jobs, ads)


def test_a_device_kind_registered_later_is_read_from_ads_read_before(tmp_path):
    """Records are made once per values of what ``job_from_ad`` reads; a kind registered since
    adds what it reads, so an ad whose values were seen before still gets the new kind."""
    from condor_sched.device_kinds import DeviceKind, register_device_kind, unregister_device_kind

    kind = DeviceKind("testgpu", "TestGpuMemory", "TestGpuCompute", "TestGpuName", "units")
    ad = dict(mixed_queue(1, 11)[0], JobStatus=1, RequestPhiMemory=None, RequestPhiThreads=None)
    ad = {k: v for k, v in ad.items() if v is not None}
    ad.update(RequestTestGpuMemory=500, RequestTestGpuCompute=100)
    q, m = write(tmp_path / "q.json", [ad]), write(tmp_path / "m.json", machines(1))
    assert load_snapshot(q, m).jobs[0].device_kind is None
    register_device_kind(kind)
    try:
        assert load_snapshot(q, m).jobs[0].device_kind == "testgpu"
    finally:
        unregister_device_kind(kind.name)


def test_the_live_query_projects_every_attribute_the_reader_reads_and_covers_every_sharing_mode():
    """A live cycle reads jobs through ``covered_jobs()`` projected on ``job_projection()``: an
    attribute the reader uses but the projection leaves out reads as undefined on the live pool
    only (the overcommit opt-in once did), and a mode whose opt-in the constraint leaves out
    never sees its jobs."""
    import classad2

    from condor_sched.pool import covered_jobs, job_projection

    projected = {a.lower() for a in job_projection()}
    assert {a.lower() for a in classads._record_reads() + classads._RECORD_PER_JOB_READS} <= projected
    constraint = classad2.ExprTree(covered_jobs())
    for opt_in in ({"RequestPhiMemory": 100}, {"CoSchedProgram": "MG"}, {"CoSchedMalleable": True},
                   {"CoSchedSpare": True}, {"CoSchedOvercommit": True}, {"RequestGPUs": 1}):
        assert constraint.eval(classad2.ClassAd({"RequestCpus": 1, **opt_in})) is True, opt_in
    assert constraint.eval(classad2.ClassAd({"RequestCpus": 1})) is not True
