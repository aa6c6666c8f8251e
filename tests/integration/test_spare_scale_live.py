"""Spare capacity (paper 003) as users submit it: two users on two schedds queue more
spare-capacity jobs than node7's spare slot holds at once, and some that no node can take.
The sidecar daemon runs every one within what node7's agent publishes, a user's jobs never
wait behind the other's whole queue, and the ones that cannot run say why."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import htcondor2
import pytest
from test_sidecar_daemon import HostSidecar, schedd_named, schedds_when
from test_spare_live import NODE, cli, host_has_v1, wait_spare_published
from waiting import wait_until

from condor_sched import localpool
from condor_sched.localpool import chroot

pytestmark = pytest.mark.pool

SPARE_JOB = {"executable": "/bin/sleep", "arguments": "3", "should_transfer_files": "YES", "output": "out.$(ProcId)",
             "error": "err.$(ProcId)", "log": "jobs.log", "request_cpus": "1", "request_memory": "128",
             "+CoSchedSpare": "true"}
ATTRS = ["ClusterId", "ProcId", "Owner", "JobStatus", "NumJobStarts", "JobStartDate", "LastRemoteHost", "RemoteHost",
         "VacateReasonCode", "CoSchedPinReason", "GlobalJobId"]

#: Acts on one schedd by name as the given user (the submitting user, or the queue super user).
_ON_SCHEDD = """
import json, sys
import htcondor2
name, action, payload = sys.argv[1:4]
ad = next(a for a in htcondor2.Collector().locateAll(htcondor2.DaemonType.Schedd) if a.get("Name") == name)
schedd = htcondor2.Schedd(ad)
if action == "submit":
    description, count = json.loads(payload)
    print(schedd.submit(htcondor2.Submit(description), count=count).cluster())
else:
    print(schedd.act(htcondor2.JobAction.Remove, payload)["TotalSuccess"])
"""


def on_schedd(pool, user: str, name: str, action: str, payload: str) -> int:
    out = subprocess.run([sys.executable, "-c", _ON_SCHEDD, name, action, payload], env={**os.environ, **pool.env(user)},
                         capture_output=True, text=True, timeout=120)
    if out.returncode != 0:
        raise RuntimeError(f"{action} on {name} as {user} failed: {out.stderr.strip()[-500:]}")
    return int(out.stdout.strip())


def submit(pool, user: str, name: str, count: int, **extra: str) -> int:
    description = {**SPARE_JOB, "initialdir": str(pool.job_dir(user)), **extra}
    return on_schedd(pool, user, name, "submit", json.dumps([description, count]))


def test_two_users_on_two_schedds_run_every_spare_job_within_the_spare_slot(pool):
    localpool.set_second_schedd(True, pool.settings)
    alice, bob = pool.info.user, pool.settings.second_user
    sidecar, first = None, ""
    placed: list[tuple[str, int]] = []
    try:
        first, second = sorted(wait_until(lambda: schedds_when(2), "the second schedd advertises"),
                               key=lambda n: n.startswith("schedd2@"))
        for user in (alice, bob):   # equal shares need equal priorities (earlier tests ran alice's jobs)
            for args in (["-resetusage", f"{user}@{pool.domain}"], ["-setprio", f"{user}@{pool.domain}", "0.5"]):
                chroot.in_chroot(pool.info.root, ["condor_userprio", *args], timeout_s=30)
        if not host_has_v1():   # no writable cgroup v1: node7 takes no spare job, and every job says so
            wait_spare_published(pool, usable=False)
            cluster = submit(pool, alice, first, 3)
            placed.append((first, cluster))
            assert cli(pool, "run", "--once").returncode == 0
            reasons = [a.get("CoSchedPinReason", "") for a in schedd_named(first).query(f"ClusterId == {cluster}", ATTRS)]
            assert len(reasons) == 3 and all("its node agent takes no spare-capacity job now" in r for r in reasons)
            return
        wait_spare_published(pool, usable=True)
        # 12 jobs of one core for node7's spare slot of 2 cores (at most 2 at once), and 2 no node can take
        clusters = {(first, alice): submit(pool, alice, first, 4), (first, bob): submit(pool, bob, first, 4),
                    (second, alice): submit(pool, alice, second, 4)}
        too_big = submit(pool, bob, first, 2, request_cpus="4")
        placed += [(name, c) for (name, _), c in clusters.items()] + [(first, too_big)]
        sidecar = HostSidecar(pool)

        def done() -> list[dict] | None:
            ads = []
            for (name, _), cluster in clusters.items():
                schedd = schedd_named(name)
                ads += [dict(a) for a in schedd.history(f"ClusterId == {cluster} && JobStatus == 4", ATTRS, match=100)]
                held = schedd.query(f"ClusterId == {cluster} && JobStatus == 5", ATTRS)
                assert not held, f"a spare job went on hold: {[dict(h) for h in held]}"
            return ads if len(ads) == 12 else None

        finished = wait_until(done, "every spare job completes", timeout_s=300)
        for ad in finished:
            # each ran once, on node7's spare slot, never refused by the node nor vacated
            assert ad["NumJobStarts"] == 1 and ad.get("VacateReasonCode") is None, ad
            host = ad.get("LastRemoteHost") or ad.get("RemoteHost") or ""
            assert host.startswith("slot2_") and f"@{NODE}@" in host, ad
        # neither user's jobs waited behind the other's: both are among the first four starts
        owners = [ad["Owner"] for ad in sorted(finished, key=lambda a: a["JobStartDate"])]
        assert {alice, bob} <= set(owners[:4]), owners
        waiting = [dict(a) for a in schedd_named(first).query(f"ClusterId == {too_big}", ATTRS)]
        assert len(waiting) == 2 and all(a["JobStatus"] == 1 and "cpus" in a.get("CoSchedPinReason", "")
                                         for a in waiting), waiting
    finally:
        if sidecar is not None:
            sidecar.stop()
        for name, cluster in placed:
            on_schedd(pool, pool.info.admin_user, name, "remove", f"ClusterId == {cluster}")
        localpool.set_second_schedd(False, pool.settings)
        wait_until(lambda: len(htcondor2.Collector().query(htcondor2.AdType.Schedd, projection=["Name"])) == 1,
                   "the second schedd's ad leaves", timeout_s=30)
        ours = " || ".join(f"ClusterId == {c}" for n, c in placed if n == first)
        if ours:   # leave the pool idle for the next test
            wait_until(lambda: not schedd_named(first).query(ours, ["ProcId"]), "the removed jobs leave", timeout_s=60)
