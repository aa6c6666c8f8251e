"""Spread-n-Share on the real pool: a scaling program's procs are spread, and run where pinned."""
from __future__ import annotations

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
