"""Spread-n-Share on the real pool: a scaling program's procs are spread, and run where pinned."""
from __future__ import annotations

import json
import shutil
import time

import htcondor2
import pytest

from test_device_cosched import run_with_sidecar

from condor_sched.model import partitionable_slot_of

pytestmark = pytest.mark.pool


def run_spread_job(pool, spread_policy: str, procs: int = 4) -> list[dict]:
    d = pool.job_dir()
    cluster = pool.schedd().submit(htcondor2.Submit({
        "executable": "/bin/sleep", "arguments": "3", "initialdir": str(d), "should_transfer_files": "YES",
        "request_cpus": "1", "request_memory": "64", "+CoSchedProgram": '"MG"'}), count=procs).cluster()
    output = run_with_sidecar(pool, cluster, "knapsack", timeout_s=180, COSCHED_SPREAD_POLICY=spread_policy)
    history = [dict(a) for a in pool.schedd().history(
        f"ClusterId == {cluster}", projection=["ProcId", "ExitCode", "LastRemoteHost", "CoSchedPinSlot",
                                               "CoSchedPinScale", "CoSchedPinLLCWays", "CoSchedPinMemBW"])]
    assert len(history) == procs and all(h["ExitCode"] == 0 for h in history), output[-2000:]
    return history


def nodes_of(history: list[dict]) -> set[str]:
    return {h["LastRemoteHost"].split("@")[1] for h in history}


def test_scaling_program_is_spread_wider_than_compact_exclusive_and_runs_where_pinned(pool):
    spread = run_spread_job(pool, "sns")
    compact = run_spread_job(pool, "ce")
    assert len(nodes_of(spread)) > len(nodes_of(compact)) >= 1, (spread, compact)
    for h in spread + compact:
        assert partitionable_slot_of(h["LastRemoteHost"]) == h["CoSchedPinSlot"], h
    # The procs' dynamic slots were accounted the ways and bandwidth the plan chose.
    assert all(h["CoSchedPinScale"] > 1 and h["CoSchedPinLLCWays"] >= 1 for h in spread), spread


def test_piggyback_profiling_runs_an_unknown_program_wider_next_time(pool):
    """Run 1 of a program without a profile is compact-exclusive (k = 1); the node agents
    record it; run 2 then tries k = 2, spread over twice the nodes."""
    runs_dir = pool.info.root / "var/lib/condor_sched/profiles"
    shutil.rmtree(runs_dir / "runs" / "NEWAPP", ignore_errors=True)  # the cached root keeps old runs
    knobs = {"COSCHED_SPREAD_POLICY": "sns", "COSCHED_PROFILE_RUNS_DIR": str(runs_dir)}

    def run_once() -> list[dict]:
        d = pool.job_dir()
        cluster = pool.schedd().submit(htcondor2.Submit({
            "executable": "/bin/sleep", "arguments": "4", "initialdir": str(d), "request_cpus": "1",
            "request_memory": "64", "+CoSchedProgram": '"NEWAPP"'}), count=2).cluster()
        run_with_sidecar(pool, cluster, "knapsack", timeout_s=180, **knobs)
        history = [dict(a) for a in pool.schedd().history(
            f"ClusterId == {cluster}", projection=["ProcId", "LastRemoteHost", "CoSchedPinScale", "ClusterId"])]
        # The agents notice the end within their interval (2 s) and write the run records.
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and len(list((runs_dir / "runs" / "NEWAPP").glob(f"{cluster}.*.json"))) < 2:
            time.sleep(1)
        return history

    first = run_once()
    records = [json.loads(p.read_text()) for p in (runs_dir / "runs" / "NEWAPP").glob("*.json")]
    assert {h["CoSchedPinScale"] for h in first} == {1} and len(nodes_of(first)) == 1, first
    assert records and all(r["scale_factor"] == 1 and r["runtime_s"] > 0 for r in records), records
    assert any(r["exclusive"] for r in records), records
    second = run_once()
    assert {h["CoSchedPinScale"] for h in second} == {2} and len(nodes_of(second)) == 2, second
