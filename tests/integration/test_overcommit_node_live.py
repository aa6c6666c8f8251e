"""Paper 004's overcommit mode on the real pool (Section 3.3): node8 of the default inventory is a
socket node of the host's 2 cores whose startd counts each core twice (a slot of 4 CPUs). Jobs a
user submits with ``+CoSchedOvercommit = true`` are pinned there by the sidecar's ``overcommit``
policy and run up to two per core, never more (HTCondor's own accounting); with
``COSCHED_INTERFERENCE`` on, a job whose program the model judges ill-matched with one running
there waits, says why in condor_q, and runs once that program has left.

The programs are test_interference_live's: copies of the pool's ``sleep`` told apart by their
bytes, the two of an ill-matched measured pair given those programs' profiles."""
from __future__ import annotations

import htcondor2
import pytest
from test_device_cosched import stop
from test_interference_live import guarded_sidecar, ill_matched_programs, program, wait

pytestmark = pytest.mark.pool

NODE = "node8"


def submit_overcommitted(pool, exe, seconds: int) -> int:
    """One job of ``exe`` opted in to overcommitting, its own cluster (the guard never judges a
    cluster's procs against each other). It asks for node8: an opted-in job may also run on an
    ordinary slot, one job per core, wherever HTCondor matches it first."""
    return pool.schedd().submit(htcondor2.Submit({
        "executable": str(exe), "arguments": str(seconds), "initialdir": str(exe.parent),
        "should_transfer_files": "YES", "request_cpus": "1", "request_memory": "64",
        "requirements": f'Machine == "{NODE}.{pool.domain}"', "+CoSchedOvercommit": "true"})).cluster()


def most_at_once(runs: list[dict]) -> int:
    """The most of ``runs`` (JobCurrentStartDate, CompletionDate) running at one time."""
    events = sorted([(r["JobCurrentStartDate"], 1) for r in runs] + [(r["CompletionDate"], -1) for r in runs],
                    key=lambda e: (e[0], e[1]))
    now = best = 0
    for _, step in events:
        now += step
        best = max(best, now)
    return best


def test_opted_in_jobs_share_node8s_cores_two_at_most_and_an_ill_matched_one_waits_saying_why(pool):
    runs_dir = pool.info.root / "var/lib/condor_sched/profiles"
    bully, bully_exe, victim, victim_exe = ill_matched_programs(pool, runs_dir, b"overcommit-")
    calm, _ = program(pool, "calm", b"\0cosched-overcommit-calm")     # no profile: allowed anywhere
    sidecar = guarded_sidecar(pool, runs_dir)
    try:
        # Six opted-in jobs of one CPU for a node of 2 cores counted twice: all run on node8, at
        # most 4 at once and more than its 2 cores at some time. The bully and the victim run
        # here too, before the sidecar knows their programs (learned from the running jobs).
        first = [submit_overcommitted(pool, bully, 50), submit_overcommitted(pool, victim, 50)]
        first += [submit_overcommitted(pool, calm, 25) for _ in range(4)]
        runs = [wait(pool, cluster, lambda ad: ad.get("JobStatus") == 4, timeout_s=300) for cluster in first]
        assert all(r["LastRemoteHost"].split("@")[-1].startswith(NODE) for r in runs), runs
        assert all(str(r.get("CoSchedPinSlot") or "").endswith(f"@{NODE}.{pool.domain}") for r in runs), runs
        assert 2 < most_at_once(runs) <= 4, runs
        # The bully runs on node8; the victim, ill-matched beside it, waits and says why, then
        # runs there once the bully has left.
        held_node = submit_overcommitted(pool, bully, 30)
        wait(pool, held_node, lambda ad: ad.get("JobStatus") == 2, timeout_s=120)
        kept_off = submit_overcommitted(pool, victim, 2)
        told = wait(pool, kept_off, lambda ad: f"interference model keeps it off {NODE}" in
                    str(ad.get("CoSchedPinReason") or ""), timeout_s=90)
        assert told["JobStatus"] == 1 and f"alice/{bully_exe[:12]}" in told["CoSchedPinReason"], told
        ran = wait(pool, kept_off, lambda ad: ad.get("JobStatus") == 4, timeout_s=240)
        bully_run = wait(pool, held_node, lambda ad: ad.get("JobStatus") == 4)
        assert ran["LastRemoteHost"].split("@")[-1].startswith(NODE), ran
        assert ran["JobCurrentStartDate"] >= bully_run["CompletionDate"], (ran, bully_run)
    finally:
        log = stop(sidecar)
    assert "interference profile left out" not in log, log[-2000:]
