"""Snapshot round trip on the real pool: live -> files -> model equals live -> model (issue 2)."""
import htcondor2
import pytest

from condor_sched import pool as live
from condor_sched.snapshot import load_snapshot, write_snapshot

pytestmark = pytest.mark.pool


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
        assert sorted(direct.slots, key=lambda s: s.name) == sorted(from_files.slots, key=lambda s: s.name)
        assert len(direct.slots) == 12 and direct.skipped == from_files.skipped == ()
        mine = [j for j in from_files.jobs if j.key.cluster == cluster]
        assert len(mine) == 3 and all(j.request.device_memory_mb == 700 and j.has_pin_clause for j in mine)
    finally:
        pool.schedd().act(htcondor2.JobAction.Remove, f"ClusterId == {cluster} || ClusterId == {plain}")
