"""Fuzz of the snapshot surface (``condor_q -json`` / ``condor_status -json`` files) and of
the ClassAd expressions a job user writes: from the bundled snapshot of the real pool, with
values replaced by hostile ones and expressions drawn from a ClassAd grammar (nested records,
doubling references, string substitution, eval, regular expressions).

Whatever the input: reading it either refuses the file with a SnapshotError or gives a state;
a cycle on that state ends within the bound, pins no job twice and no job the reader skipped;
``condor-sched plan --json`` exits 0 or 2 with strict JSON and no traceback."""
from __future__ import annotations

import copy
import json
import sys
import time
from pathlib import Path

from hypothesis import given, strategies as st

from fuzzing import ROOT, fuzz_settings, run_bounded
from condor_sched.classads import SnapshotError
from condor_sched.cycle import CycleConfig, CycleMemory, decide_cycle
from condor_sched.settings import settings_from_knobs
from condor_sched.snapshot import load_snapshot

EXAMPLE = ROOT / "examples" / "snapshots" / "default"
QUEUE = json.loads((EXAMPLE / "queue.json").read_text())
MACHINES = json.loads((EXAMPLE / "machines.json").read_text())
#: A state read and a cycle decided on 40 jobs and 12 slots take well under a second; a
#: hostile ad may make it no slower than this (the sidecar's budget for one user's ad).
CYCLE_S = 10.0

NAMES = st.sampled_from(["RequestCpus", "RequestMemory", "RequestDisk", "Owner", "a0", "a1", "X", "MyTag",
                         "TARGET.Cpus", "MY.RequestCpus", "TARGET.Name", "CoSchedPinSlot", "Requirements"])
FUNCTIONS = st.sampled_from(["strcat", "size", "ifThenElse", "regexp", "regexps", "replaceall", "eval",
                             "toUpper", "split", "join", "substr", "member", "sum", "isUndefined", "int",
                             "stringListMember", "sprintf", "random", "time", "nosuchfunction"])
LITERALS = st.one_of(st.integers(-2**70, 2**70).map(str), st.sampled_from(
    ["true", "false", "undefined", "error", '"ab"', '"\\\\1\\\\1\\\\1"', '"(.*)"', '""', "1e308", "-0.0",
     '"a\\000b"', '"\\u00e9"', "{1, 2, 3}"]))


def doubling(levels: int) -> str:
    chain = ";".join(["a0 = 1"] + [f"a{i} = a{i - 1} + a{i - 1}" for i in range(1, levels + 1)])
    return f"[{chain}].a{levels}"


def expressions() -> st.SearchStrategy[str]:
    """ClassAd expression texts, valid and not, up to a few levels deep."""
    leaves = st.one_of(LITERALS, NAMES, st.integers(1, 60).map(doubling))

    def extend(inner: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
        return st.one_of(
            st.tuples(inner, st.sampled_from(["+", "*", "&&", "||", "==", "=?=", "<", "/", "%", "."]), inner)
            .map(lambda t: f"({t[0]} {t[1]} {t[2]})"),
            st.tuples(FUNCTIONS, st.lists(inner, max_size=3)).map(lambda t: f"{t[0]}({', '.join(t[1])})"),
            st.lists(st.tuples(st.sampled_from(["a0", "a1", "b", "X"]), inner), min_size=1, max_size=3)
            .map(lambda kv: "[" + "; ".join(f"{k} = {v}" for k, v in kv) + "]"),
            st.tuples(inner, inner).map(lambda t: f"{t[0]}[{t[1]}]"),
            st.tuples(inner, inner, inner).map(lambda t: f"({t[0]} ? {t[1]} : {t[2]})"),
            inner.map(lambda e: f"!{e}"),
        )

    return st.recursive(leaves, extend, max_leaves=12)


HOSTILE_VALUES = st.one_of(
    expressions().map(lambda e: f"/Expr({e})/"),
    st.sampled_from([None, True, -1, 0, 2**63, -2**63 - 1, 10**400, 1e308, -1e-308, "", "MG\u0000x", "\ud800",
                     "x" * 70_000, [], [1, [2, [3]]], {"a": {"b": "/Expr(a + a)/"}}, "/Expr(", "/Expr()/"]),
    st.text(max_size=40),
    st.integers(),
    st.floats(allow_nan=False),
)
ATTRIBUTES = st.sampled_from(["Requirements", "Rank", "RequestCpus", "RequestMemory", "RequestPhiMemory",
                              "RequestPhiThreads", "CoSchedProgram", "Owner", "JobStatus", "ClusterId", "ProcId",
                              "QDate", "JobPrio", "CoSchedPinSlot", "CoSchedPinCycle", "RequestDisk", "MyTag",
                              "CoSchedMalleable", "AllowedExecuteDuration", "RequestGPUCompute", "RequestGPUMemory",
                              "RequireGPUs", "CoSchedPinOriginalRequirements", "AccountingGroup"])
SLOT_ATTRIBUTES = st.sampled_from(["Name", "Cpus", "TotalSlotCpus", "Memory", "PhiMemory", "TotalSlotPhiMemory",
                                   "Start", "PartitionableSlot", "LastHeardFrom", "PhiDeviceName", "State"])


@st.composite
def snapshots(draw) -> tuple[list, list]:
    """The bundled snapshot with a few jobs and slots changed by hostile values."""
    queue, machines = copy.deepcopy(QUEUE[:12]), copy.deepcopy(MACHINES)
    for _ in range(draw(st.integers(1, 4))):
        ad = queue[draw(st.integers(0, len(queue) - 1))]
        ad[draw(ATTRIBUTES)] = draw(HOSTILE_VALUES)
    if draw(st.booleans()):
        ad = machines[draw(st.integers(0, len(machines) - 1))]
        ad[draw(SLOT_ATTRIBUTES)] = draw(HOSTILE_VALUES)
    for ad in queue + machines:
        for key in [k for k, v in ad.items() if v is None]:
            del ad[key]
    return queue, machines


def write(tmp: Path, queue: list, machines: list) -> tuple[Path, Path]:
    q, m = tmp / "queue.json", tmp / "machines.json"
    q.write_text(json.dumps(queue, ensure_ascii=False), encoding="utf-8", errors="surrogatepass")
    m.write_text(json.dumps(machines, ensure_ascii=False), encoding="utf-8", errors="surrogatepass")
    return q, m


CONFIG = CycleConfig.from_settings(settings_from_knobs({"COSCHED_POLICY": "knapsack"}))


@given(snapshot=snapshots())
@fuzz_settings(examples=40)
def test_a_hostile_snapshot_is_refused_or_planned_within_the_bound(snapshot, tmp_path_factory):
    queue, machines = write(tmp_path_factory.mktemp("s"), *snapshot)
    start = time.perf_counter()
    try:
        state = load_snapshot(queue, machines)
    except SnapshotError as e:
        assert str(queue) in str(e) or str(machines) in str(e)
        return
    decision = decide_cycle(state, CycleMemory.fresh(state), CONFIG)
    assert time.perf_counter() - start < CYCLE_S
    pinned = [p.job for p in decision.pins] + [a.job for a in decision.kept]
    assert len(pinned) == len(set(pinned))
    # a job skipped as unreadable is never pinned (a second ad of one job id is skipped as a copy)
    skipped = {s.job for s in state.skipped if s.job is not None and "duplicate job id" not in s.reason}
    assert not skipped & set(pinned)
    json.dumps(decision.to_json(), allow_nan=False)


@given(expression=expressions(), attribute=st.sampled_from(["Requirements", "Rank", "RequestMemory", "MyTag"]))
@fuzz_settings(examples=60)
def test_any_expression_a_user_writes_costs_the_cycle_no_more_than_the_bound(expression, attribute, tmp_path_factory):
    queue = copy.deepcopy(QUEUE[:6])
    queue[0][attribute] = f"/Expr({expression})/"
    if attribute == "MyTag":
        queue[0]["Requirements"] = "/Expr(MyTag =!= 7 && TARGET.Cpus >= RequestCpus)/"
    q, m = write(tmp_path_factory.mktemp("e"), queue, MACHINES)
    start = time.perf_counter()
    try:
        state = load_snapshot(q, m)
    except SnapshotError:
        return
    decide_cycle(state, CycleMemory.fresh(state), CONFIG)
    assert time.perf_counter() - start < CYCLE_S, expression


@given(snapshot=snapshots())
@fuzz_settings(examples=4)
def test_plan_json_on_a_hostile_snapshot_exits_cleanly_with_strict_json(snapshot, tmp_path_factory):
    queue, machines = write(tmp_path_factory.mktemp("c"), *snapshot)
    out = run_bounded([sys.executable, "-m", "condor_sched", "plan", "--queue", str(queue), "--machines",
                       str(machines), "--json"], json_out=True)
    assert out.returncode in (0, 2)
    if out.returncode == 2:
        assert "Error" in out.stderr or "error" in out.stderr
