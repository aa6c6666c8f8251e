"""Snapshot readers and state rules under hostile or careless input (issue 10, planner and
readers): nothing vanishes without a reason, no slot is oversubscribed, no traceback."""
from __future__ import annotations

import json
from pathlib import Path

import classad2
import pytest

from condor_sched.classads import snapshot_files as classads
from condor_sched.classads import SnapshotError, read_ads
from condor_sched.cycle import CycleConfig, CycleMemory, decide_cycle
from condor_sched.device_kinds import PHI
from condor_sched.modes.planning import PlanSettings
from condor_sched.modes.registry import get_policy
from condor_sched.profiles import ProfileStore
from condor_sched.snapshot import load_snapshot

MACHINE = "node1.cosched.test"


def job(cluster: int = 7, proc: int = 0, **overrides) -> dict:
    ad = {"ClusterId": cluster, "ProcId": proc, "JobStatus": 1, "Owner": "alice", "RequestCpus": 1,
          "RequestMemory": 64, "RequestPhiMemory": 500, "RequestPhiThreads": 60, "QDate": 1700000000,
          "GlobalJobId": f"schedA#{cluster}.{proc}#1700000000", "Cmd": "/bin/km"}
    ad.update(overrides)
    return {k: v for k, v in ad.items() if v is not None}


def spread_job(cluster: int = 9, proc: int = 0, **overrides) -> dict:
    return job(cluster, proc, **{"RequestPhiMemory": None, "RequestPhiThreads": None, "CoSchedProgram": "MG",
                                 **overrides})


def device_slot(name: str = f"slot2@node1@{MACHINE}", **overrides) -> dict:
    ad = {"Name": name, "Machine": MACHINE, "PartitionableSlot": True, "Cpus": 4, "TotalSlotCpus": 4,
          "Memory": 1024, "TotalSlotMemory": 1024, "PhiMemory": 8192, "TotalSlotPhiMemory": 8192,
          "PhiThreads": 240, "TotalSlotPhiThreads": 240, "PhiDeviceName": "mic0", "LastHeardFrom": 1000}
    ad.update(overrides)
    return {k: v for k, v in ad.items() if v is not None}


def socket_slot(name: str = f"slot1@node1@{MACHINE}", **overrides) -> dict:
    ad = {"Name": name, "Machine": MACHINE, "PartitionableSlot": True, "Cpus": 8, "TotalSlotCpus": 8,
          "Memory": 4096, "TotalSlotMemory": 4096, "LLCWays": 20, "TotalSlotLLCWays": 20, "MemBW": 50,
          "TotalSlotMemBW": 50, "LLCCacheId": 0, "LastHeardFrom": 1000}
    ad.update(overrides)
    return {k: v for k, v in ad.items() if v is not None}


def write(path: Path, ads: list[dict]) -> Path:
    path.write_text(json.dumps(ads, ensure_ascii=False), encoding="utf-8")
    return path


def decide(queue: Path, machines: Path, policy: str = "knapsack", spread: str = "sns"):
    state = load_snapshot(queue, machines)
    config = CycleConfig(get_policy(policy), get_policy(spread), PlanSettings(seed=1, deterministic=True), 3,
                         ProfileStore())
    return state, decide_cycle(state, CycleMemory.fresh(state), config)


# ---------------------------------------------------------------------------------------
# condor_q -json: expressions and non-ASCII text


def test_json_expression_requests_are_evaluated_next_to_non_ascii_text(tmp_path):
    q = write(tmp_path / "q.json", [job(Owner="jürgen", Args="数据 處理 🚀",
                                        RequestPhiMemory="/Expr(1000 + 24)/",
                                        RequestPhiThreads="/Expr(RequestCpus * 60)/")])
    state = load_snapshot(q, write(tmp_path / "m.json", [device_slot()]))
    (read,) = state.jobs
    assert read.owner == "jürgen" and state.skipped == ()
    assert (read.request.device_memory_mb, read.request.device_threads) == (1024, 60)


def test_json_values_keep_their_classad_types_and_nested_expressions(tmp_path):
    q = write(tmp_path / "q.json", [{"A": "/Expr(1 + 2)/", "L": [1, "x", "/Expr(2 * 3)/"], "R": {"a": "/Expr(4)/"},
                                     "N": None, "B": True, "F": 2.5, "S": "a/b/Expr(", "U": "ü"}])
    (ad,) = read_ads(q)
    assert ad.eval("A") == 3 and ad.eval("B") is True and ad.eval("F") == 2.5 and ad.eval("S") == "a/b/Expr("
    assert ad.eval("U") == "ü" and "N" in ad and isinstance(ad.eval("N"), classad2.Value)
    assert "".join(str(ad.lookup("L")).split()) == '{1,"x",2*3}'
    assert ad.eval("R").eval("a") == 4


def test_the_same_queue_as_json_and_as_long_text_plans_identically(tmp_path):
    ads = [classad2.ClassAd(job(proc=p, Owner="jürgen" if p % 2 else "李", Args="データ/x")) for p in range(4)]
    for ad in ads:
        ad["RequestPhiMemory"] = classad2.ExprTree("1000 + 24")
        ad["Requirements"] = classad2.ExprTree('(TARGET.PhiMemory >= RequestPhiMemory) && Owner != "nobody"')
    as_json = tmp_path / "q.json"
    as_json.write_text(classads.ads_to_json(ads), encoding="utf-8")
    as_long = tmp_path / "q.long"
    as_long.write_text("\n".join(ad.printOld() for ad in ads), encoding="utf-8")
    machines = write(tmp_path / "m.json", [device_slot(), device_slot(f"slot3@node1@{MACHINE}", PhiDeviceName="mic1")])
    json_state, json_decision = decide(as_json, machines)
    long_state, long_decision = decide(as_long, machines)
    assert json_state.skipped == () and len(json_state.jobs) == 4
    assert json_decision.to_json() | {"stats": None} == long_decision.to_json() | {"stats": None}
    assert len(json_decision.pins) == 4


# ---------------------------------------------------------------------------------------
# Duplicates and contradictions


def test_duplicate_slot_names_keep_the_newest_ad_and_report_the_others(tmp_path):
    name = f"slot2@node1@{MACHINE}"
    m = write(tmp_path / "m.json", [device_slot(name, LastHeardFrom=900, PhiThreads=10),
                                    device_slot(name, LastHeardFrom=1000, PhiThreads=200),
                                    device_slot(name, LastHeardFrom=1000, PhiThreads=30)])
    state = load_snapshot(write(tmp_path / "q.json", []), m)
    (slot,) = state.slots
    assert slot.free.device_threads == 200
    reasons = [str(s) for s in state.skipped]
    assert len(reasons) == 2 and all(name in r and "duplicate Name" in r for r in reasons)


@pytest.mark.parametrize("policy", ["random", "global", "knapsack", "exclusive"])
def test_forty_copies_of_one_slot_are_planned_as_the_newest_copy_says(tmp_path, policy):
    q = write(tmp_path / "q.json", [job(proc=p, RequestPhiThreads=10, RequestPhiMemory=100) for p in range(40)])
    newest = device_slot(Cpus=1, LastHeardFrom=2000)  # three of its four cpus are taken
    m = write(tmp_path / "m.json", [newest] + [device_slot(LastHeardFrom=1000 + i) for i in range(39)])
    state, decision = decide(q, m, policy)
    assert len(decision.pins) == 1 and len(state.skipped) == 39


def test_a_duplicate_job_id_is_planned_once_and_the_copy_reported(tmp_path):
    q = write(tmp_path / "q.json", [job(), job(), job(RequestPhiThreads="bad")])
    state, decision = decide(q, write(tmp_path / "m.json", [device_slot()]), "global")
    assert len(state.jobs) == 1 and [p.job.job_id for p in decision.pins] == ["7.0"]
    assert len(state.skipped) == 2 and all("duplicate job id" in s.reason for s in state.skipped)
    assert decision.holds == () and decision.unpins == ()  # the kept ad is fine: nothing held for a copy


@pytest.mark.parametrize("attr", ["ClusterId", "ProcId"])
def test_a_non_integer_job_id_is_skipped_naming_the_attribute(tmp_path, attr):
    q = write(tmp_path / "q.json", [job(**{attr: 3.7}), job(proc=1)])
    state, decision = decide(q, write(tmp_path / "m.json", [device_slot()]))
    assert [j.key.job_id for j in state.jobs] == ["7.1"]
    (skip,) = state.skipped
    assert attr in skip.reason and "integer" in skip.reason and skip.job is None
    assert {p.job.job_id for p in decision.pins} == {"7.1"}


def test_free_above_total_is_clamped_to_the_total_with_a_reason(tmp_path):
    m = write(tmp_path / "m.json", [device_slot(Cpus=64, PhiThreads=4000)])
    q = write(tmp_path / "q.json", [job(proc=p, RequestPhiThreads=60, RequestPhiMemory=100) for p in range(10)])
    state, decision = decide(q, m, "random")
    (slot,) = state.slots
    assert (slot.free.cpus, slot.free.device_threads) == (4, 240)
    (note,) = state.skipped
    assert "Cpus 64" in note.reason and "TotalSlotCpus 4" in note.reason and "PhiThreads" in note.reason
    assert len(decision.pins) == 4


# ---------------------------------------------------------------------------------------
# -long text


def long_ad(cluster: int, proc: int) -> str:
    return (f'ClusterId = {cluster}\nProcId = {proc}\nJobStatus = 1\nRequestCpus = 1\nRequestMemory = 64\n'
            f'Owner = "jürgen"\nGlobalJobId = "s1#{cluster}.{proc}#1"\n')


def test_long_ads_separated_by_lines_holding_only_spaces_are_all_read(tmp_path):
    q = tmp_path / "q.long"
    q.write_text(" \n".join(long_ad(5, p) for p in range(20)) + "  \n\n"
                 + "\t\r\n".join(long_ad(6, p) for p in range(20)), encoding="utf-8")
    assert len(read_ads(q)) == 40


def test_two_long_ads_without_a_blank_line_between_them_are_an_error(tmp_path):
    q = tmp_path / "q.long"
    q.write_text(long_ad(5, 0) + long_ad(5, 1), encoding="utf-8")
    with pytest.raises(SnapshotError, match=r"q\.long: line 8: ClusterId again \(as on line 1\)"):
        read_ads(q)


def test_a_long_line_that_is_not_attr_equals_value_is_an_error_naming_file_and_line(tmp_path):
    q = tmp_path / "q.long"
    q.write_text(long_ad(5, 0) + "\n" + long_ad(5, 1) + "this is garbage\n" + long_ad(5, 2), encoding="utf-8")
    with pytest.raises(SnapshotError, match=r"q\.long: line 16 is not 'Attr = value'"):
        read_ads(q)


def test_a_long_value_that_does_not_parse_is_an_error_naming_the_line(tmp_path):
    q = tmp_path / "q.long"
    q.write_text(long_ad(5, 0) + "\n" + "ClusterId = 5\nRequestCpus = (((\nProcId = 1\n", encoding="utf-8")
    with pytest.raises(SnapshotError, match=r"q\.long: line 10: RequestCpus does not parse"):
        read_ads(q)


# ---------------------------------------------------------------------------------------
# Bounds: size, depth, count, expression length


def test_deeply_nested_json_is_an_error_naming_file_and_place(tmp_path):
    q = tmp_path / "q.json"
    q.write_text('[{"A": ' + "[" * 100_000 + "]" * 100_000 + "}]")
    with pytest.raises(SnapshotError, match=r"q\.json: nested deeper than \d+ levels at line 1 column \d+"):
        read_ads(q)


def test_nesting_within_json_parsing_but_beyond_the_bound_names_item_and_attribute(tmp_path):
    q = write(tmp_path / "q.json", [job(), job(Deep=[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]])])
    with pytest.raises(SnapshotError, match=r"q\.json: item 1, attribute Deep: nested deeper than"):
        read_ads(q)


def test_an_integer_too_large_for_a_classad_reads_as_a_real_that_is_out_of_range(tmp_path):
    q = tmp_path / "q.json"
    q.write_text(json.dumps([job(), job(proc=1, RequestMemory=2**70)]).replace("500", "1" + "0" * 5000, 1))
    state = load_snapshot(q, write(tmp_path / "m.json", []))
    assert state.jobs == () and len(state.skipped) == 2
    assert {s.reason.split()[0] for s in state.skipped} == {"RequestPhiMemory", "RequestMemory"}


def test_a_file_over_the_size_bound_is_refused_before_it_is_read(tmp_path, monkeypatch):
    monkeypatch.setattr(classads, "MAX_SNAPSHOT_BYTES", 1000)
    q = write(tmp_path / "q.json", [job(proc=p) for p in range(20)])
    with pytest.raises(SnapshotError, match=r"q\.json: larger than 1000 bytes"):
        read_ads(q)


def test_more_ads_than_the_bound_is_an_error(tmp_path, monkeypatch):
    monkeypatch.setattr(classads, "MAX_ADS", 5)
    with pytest.raises(SnapshotError, match=r"q\.json: more than 5 ClassAds"):
        read_ads(write(tmp_path / "q.json", [job(proc=p) for p in range(6)]))
    q = tmp_path / "q.long"
    q.write_text("\n".join(long_ad(1, p) for p in range(6)))
    with pytest.raises(SnapshotError, match=r"q\.long: more than 5 ClassAds \(line 41\)"):
        read_ads(q)


def test_an_expression_longer_than_the_bound_is_an_error_naming_the_attribute(tmp_path):
    huge = "+".join(["1"] * 300_000)  # classad2 25.14 crashes parsing this (stack overflow)
    with pytest.raises(SnapshotError, match=r"q\.json: item 0, attribute RequestMemory: expression longer than"):
        read_ads(write(tmp_path / "q.json", [job(RequestMemory=f"/Expr({huge})/")]))
    q = tmp_path / "q.long"
    q.write_text(f"ClusterId = 1\nRequestMemory = {huge}\n")
    with pytest.raises(SnapshotError, match=r"q\.long: line 2: RequestMemory: value longer than"):
        read_ads(q)


def test_an_unparsable_json_expression_is_an_error_naming_item_and_attribute(tmp_path):
    with pytest.raises(SnapshotError, match=r"q\.json: item 1, attribute Requirements: expression does not parse"):
        read_ads(write(tmp_path / "q.json", [job(), job(Requirements="/Expr(((()/")]))


def test_non_utf8_bytes_are_an_error_naming_the_line(tmp_path):
    q = tmp_path / "q.long"
    q.write_bytes(b'ClusterId = 1\nOwner = "j\xfcrgen"\n')
    with pytest.raises(SnapshotError, match=r"q\.long: not UTF-8 text \(line 2, byte 24\)"):
        read_ads(q)


# ---------------------------------------------------------------------------------------
# Requests the execute node would refuse


@pytest.mark.parametrize(("memory", "compute", "problem"), [
    (None, None, None), (0, 0, None), (0, None, None), (1024, 60, None), (1024.0, 60.0, None), (0, 5, None),
    (None, 2.5, None), (10**12, 100000, None),
    (1024, 0, "RequestPhiThreads = 0 is outside [1, 100000]"), (1024, None, "RequestPhiThreads is missing"),
    (1024, 2.5, "RequestPhiThreads = 2.5 is not an integer"), (1024.5, 60, "RequestPhiMemory = 1024.5 is not an integer"),
    (-5, 60, "RequestPhiMemory = -5 is outside [1, 1000000000000]"), (10**12 + 1, 60, "RequestPhiMemory"),
    (1024, 100001, "RequestPhiThreads"), ("abc", 60, "RequestPhiMemory"), (True, 60, "RequestPhiMemory"),
])
def test_device_request_problems_are_those_the_prepare_job_hook_refuses(memory, compute, problem):
    found = classads.request_problem(PHI, memory=memory, compute=compute)
    assert (found is None) == (problem is None), found
    if problem is not None:
        assert problem in found


@pytest.mark.parametrize(("program", "cpus", "problem"), [
    ("MG", 1, None), ("mg-2.x_1+b", 16, None), ("MG", None, None), ("MG", 2.0, None),
    (".hidden", 1, "CoSchedProgram"), ("a b", 1, "CoSchedProgram"), ("x" * 65, 1, "CoSchedProgram"),
    ("", 1, "CoSchedProgram"), (5, 1, "CoSchedProgram"), ("MG", 0, "RequestCpus"), ("MG", 1.5, "RequestCpus"),
    ("MG", 100001, "RequestCpus"),
])
def test_spread_request_problems_are_those_the_prepare_job_hook_refuses(program, cpus, problem):
    found = classads.request_problem(None, program=program, cpus=cpus)
    assert (found is None) == (problem is None), found
    if problem is not None:
        assert problem in found


@pytest.mark.parametrize("overrides", [{"RequestPhiThreads": 0}, {"RequestPhiThreads": 2.5},
                                       {"RequestPhiMemory": 100.5}, {"RequestPhiMemory": 10**12 + 2}])
def test_a_device_job_the_hook_would_refuse_is_held_never_pinned(tmp_path, overrides):
    q = write(tmp_path / "q.json", [job(**overrides), job(proc=1)])
    _, decision = decide(q, write(tmp_path / "m.json", [device_slot()]))
    assert [p.job.job_id for p in decision.pins] == ["7.1"]
    (hold,) = decision.holds
    assert hold.job.job_id == "7.0" and next(iter(overrides)) in hold.reason


@pytest.mark.parametrize(("overrides", "attr"), [({"CoSchedProgram": "../../etc"}, "CoSchedProgram"),
                                                 ({"RequestCpus": 1.5}, "RequestCpus")])
def test_a_spread_job_the_hook_would_refuse_is_held_never_pinned(tmp_path, overrides, attr):
    q = write(tmp_path / "q.json", [spread_job(**overrides)])
    _, decision = decide(q, write(tmp_path / "m.json", [socket_slot()]))
    assert decision.pins == () and len(decision.holds) == 1 and attr in decision.holds[0].reason


def test_a_device_slot_whose_device_name_the_hook_refuses_is_skipped(tmp_path):
    m = write(tmp_path / "m.json", [device_slot(PhiDeviceName="../mic0"), device_slot(f"slot3@node1@{MACHINE}")])
    state = load_snapshot(write(tmp_path / "q.json", []), m)
    assert [s.name for s in state.slots] == [f"slot3@node1@{MACHINE}"]
    assert "PhiDeviceName" in state.skipped[0].reason


@pytest.mark.parametrize("policy", ["sns", "sns-global", "ce", "cs"])
def test_spread_procs_are_never_pinned_to_a_socket_without_their_memory(tmp_path, policy):
    q = write(tmp_path / "q.json", [spread_job(proc=p, RequestMemory=100_000) for p in range(4)]
              + [spread_job(cluster=10, proc=p, RequestMemory=1500) for p in range(4)])
    m = write(tmp_path / "m.json", [socket_slot(f"slot{i}@node{n}@node{n}.t", Machine=f"node{n}.t", LLCCacheId=i - 1)
                                    for n in (1, 2) for i in (1, 2)])
    state, decision = decide(q, m, spread=policy)
    assert not any(p.job.cluster == 9 for p in decision.pins)
    assert all("100000 MB memory" in u.reason for u in decision.unplaced if u.job.cluster == 9)
    per_slot: dict[str, int] = {}
    for p in decision.pins:
        per_slot[p.slot] = per_slot.get(p.slot, 0) + 1500
    assert per_slot and max(per_slot.values()) <= 4096
