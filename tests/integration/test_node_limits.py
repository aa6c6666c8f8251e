"""COSMIC-like limits on the real pool: the node agent stops a job over its device memory and
the startd holds it, the limit and the use in its HoldReason."""
from __future__ import annotations

import json
import time

import htcondor2
import pytest

pytestmark = pytest.mark.pool


def test_job_over_its_device_memory_is_stopped_and_held_with_the_reason(pool):
    slot = pool.slot(2, "node1")
    cluster = pool.submit(request_PhiMemory="500", request_PhiThreads="60", arguments="120")
    assert pool.admin_edit(f"{cluster}.0", "CoSchedPinSlot", f'"{slot}"') == 1
    pool.wait_for(cluster, lambda a: a["JobStatus"] == 2, ["RemoteHost"], timeout_s=60)
    root = pool.info.root
    state = root / "var/lib/condor_sched/node1"
    # The agent placed the job at its hook's request and publishes its claim's allocation.
    deadline = time.monotonic() + 30
    placed = None
    while placed is None and time.monotonic() < deadline:
        device = json.loads((state / "devices" / "mic0.json").read_text())
        placed = next((j for j in device["jobs"] if j["job"] == f"{cluster}.0" and j["units"]), None)
        time.sleep(0.5)
    assert placed is not None and placed["memory_mb"] == 500 and placed["threads"] == 60, placed
    # The device reports 900 MB used by the job: over its 500 MB request.
    probe = root / "var/lib/condor_sched/probe/node1/mic0"
    probe.mkdir(parents=True, exist_ok=True)
    (probe / f"{cluster}.0").write_text("900\n")
    started = time.monotonic()
    # The agent stops it at once and the startd holds it (config.d/20), the reason its HoldReason.
    ad = pool.wait_for(cluster, lambda a: a["JobStatus"] in (3, 4, 5),
                       ["HoldReason", "HoldReasonCode", "HoldReasonSubCode"], timeout_s=120)
    assert time.monotonic() - started < 100  # long before its 120 s sleep would end
    assert ad["JobStatus"] == 5, ad
    # (the startd prefixes its own words: "Error from slot2_1@node1@...: ")
    assert ad["HoldReason"].endswith("condor_sched: stopped on the execute node: device memory use 900 MB on mic0 "
                                     "exceeds its allocation of 500 MB"), ad
    assert (ad["HoldReasonCode"], ad["HoldReasonSubCode"]) == (21, 103)
    record = json.loads((state / "killed" / f"{cluster}.0.json").read_text())
    assert "900" in json.dumps(record) and "500" in json.dumps(record)
    pool.schedd().act(htcondor2.JobAction.Remove, f"ClusterId == {cluster}")
