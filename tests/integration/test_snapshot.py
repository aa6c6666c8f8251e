"""Snapshot round trip on the real pool: live -> files -> model equals live -> model (issue 2)."""
import dataclasses

import htcondor2
import pytest

from condor_sched import pool as live
from condor_sched.inventory import default_inventory_path, load_inventory, node_slots
from condor_sched.snapshot import load_snapshot, write_snapshot

pytestmark = pytest.mark.pool


def _unstamped(slot):
    return dataclasses.replace(slot, updated_at_s=0)


def test_snapshot_files_give_the_same_model_as_the_live_pool(pool, tmp_path):
    # Idle, unpinned device jobs cannot match: the queue and slots hold still while we read.
    d = pool.job_dir()
    cluster = pool.schedd().submit(htcondor2.Submit({
        "executable": "/bin/sleep", "arguments": "1", "initialdir": str(d), "request_PhiMemory": "700",
        "request_PhiThreads": "60"}), count=3).cluster()
    plain = pool.submit(request_cpus="1", hold="true")
    try:
        direct = live.ads_to_state(live.read_ads())
        queue, machines = write_snapshot(tmp_path)
        from_files = load_snapshot(queue, machines)
        assert {j.key for j in direct.jobs} >= {j.key for j in from_files.jobs if j.key.cluster in (cluster, plain)}
        assert sorted(direct.jobs, key=lambda j: j.key) == sorted(from_files.jobs, key=lambda j: j.key)
        # Startds re-advertise (startd cron) between the two reads: only the freshness stamp may move, forward.
        live_slots, file_slots = (sorted(s, key=lambda s: s.name) for s in (direct.slots, from_files.slots))
        assert [_unstamped(s) for s in live_slots] == [_unstamped(s) for s in file_slots]
        assert all(f.updated_at_s >= d.updated_at_s > 0 for d, f in zip(live_slots, file_slots))
        layout = [s for n in load_inventory(default_inventory_path()).nodes for s in node_slots(n, pool.domain)]
        assert len(direct.slots) == len(layout) and direct.skipped == from_files.skipped == ()
        mine = [j for j in from_files.jobs if j.key.cluster == cluster]
        assert len(mine) == 3 and all(j.request.device_memory_mb == 700 and j.has_pin_clause for j in mine)
    finally:
        pool.schedd().act(htcondor2.JobAction.Remove, f"ClusterId == {cluster} || ClusterId == {plain}")
