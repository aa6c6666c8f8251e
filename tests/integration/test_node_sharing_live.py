"""Paper 001's live mapping on the real pool (issue 14, item 3): node5 of the default inventory
is a node-sharing node (a NODE slot of 8 cores and its overlapping GUEST slot).

On these machines the pool's chroot has no cgroup v2 (/sys is empty, ../shared/FACTS.md), so
node5's agent cannot move cores: its guest slot advertises that it hosts no guest, the sidecar
pins none there and tells the waiting job why, and a guest pinned there anyway is refused by
the node and sent back to Idle. A mate's longer limit, written as the sidecar writes it,
reaches the shadow that enforces it."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import classad2
import htcondor2
import pytest

pytestmark = pytest.mark.pool

NODE = "node5"
MALLEABLE = {"executable": "/bin/sleep", "should_transfer_files": "YES", "output": "out", "error": "err",
             "log": "log", "request_cpus": "8", "request_memory": "500", "+CoSchedMalleable": "true",
             # node6 (a GPU node) runs 8-core CPU jobs too: keep these on the node-sharing node
             "requirements": "TARGET.CoSchedNodeSlot =?= true || TARGET.CoSchedGuestSlot =?= true"}
ATTRS = ["JobStatus", "RemoteHost", "CoSchedPinSlot", "CoSchedPinReason", "CoSchedPinMate", "VacateReason",
         "VacateReasonCode", "HoldReasonCode", "ExitCode", "AllowedExecuteDuration", "LastRemoteHost"]

_WRITE = """
import sys
from condor_sched.edits import Edit
from condor_sched.model import JobKey
from condor_sched.pool import JobEditor
schedd, cluster, attr, value = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
JobEditor().write(Edit(schedd, attr, value, (JobKey(schedd, cluster, 0),)))
"""


def unset(ad: dict, attr: str) -> bool:
    """Absent or undefined (the schedd transform sets the sidecar's attributes to undefined)."""
    return ad.get(attr) is None or ad.get(attr) is classad2.Value.Undefined


def cli(pool, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, **pool.env(pool.info.admin_user)}
    return subprocess.run([sys.executable, "-m", "condor_sched", *args], env=env, capture_output=True, text=True,
                          timeout=120)


def submit(pool, seconds: int, limit: int, **extra: str) -> int:
    return pool.schedd().submit(htcondor2.Submit({**MALLEABLE, "initialdir": str(pool.job_dir()),
                                                  "arguments": str(seconds),
                                                  "allowed_execute_duration": str(limit), **extra})).cluster()


def guest_slot_ad(pool) -> dict:
    (ad,) = htcondor2.Collector().query(htcondor2.AdTypes.Startd, f'Name == "{pool.slot(2, NODE)}"')
    return dict(ad)


def test_the_node_sharing_layout_and_a_guest_refused_where_cgroups_cannot_be_written(pool):
    mate = submit(pool, 120, 600)
    guest = submit(pool, 5, 60)
    try:
        running = pool.wait_for(mate, lambda a: a["JobStatus"] == 2, ATTRS, timeout_s=90)
        assert running["RemoteHost"].startswith("slot1_") and f"@{NODE}@" in running["RemoteHost"], running
        guest_slot = guest_slot_ad(pool)
        assert guest_slot["CoSchedGuestSlot"] is True and guest_slot["TotalSlotCpus"] == 8
        assert guest_slot.get("CoSchedNodeSharing") is not True, guest_slot  # no cgroup v2 in the chroot

        # The sidecar pins no guest on a node that cannot move cores, and says why.
        ran = cli(pool, "run", "--once")
        assert ran.returncode == 0, ran.stdout + ran.stderr
        ad = pool.job(guest, ATTRS)
        assert ad["JobStatus"] == 1 and unset(ad, "CoSchedPinSlot"), ad
        assert "no node can host a guest" in ad["CoSchedPinReason"] and "cpusets" in ad["CoSchedPinReason"], ad

        # Pinned there anyway (as the sidecar would write it), the node refuses the guest: back to Idle.
        for attr, value in (("CoSchedPinCycle", "1"), ("CoSchedPinTime", str(int(time.time()))),
                            ("CoSchedPinMate", f'"{mate}.0"'), ("CoSchedPinMateIncrease", "60"),
                            ("CoSchedPinSlot", f'"{pool.slot(2, NODE)}"')):
            assert pool.admin_edit(f"{guest}.0", attr, value) == 1
        refused = pool.wait_for(guest, lambda a: a.get("VacateReasonCode") == 1007 and a["JobStatus"] == 1, ATTRS,
                                timeout_s=90)
        assert refused["JobStatus"] == 1 and "condor_sched: " in refused["VacateReason"], refused
        assert "slot2_" in refused["VacateReason"] and "cpuset" in refused["VacateReason"].lower(), refused

        # The next cycle unpins it and tells its user; it is never pinned as a guest again.
        ran = cli(pool, "run", "--once")
        assert ran.returncode == 0, ran.stdout + ran.stderr
        ad = pool.job(guest, ATTRS)
        assert unset(ad, "CoSchedPinSlot") and unset(ad, "CoSchedPinMate"), ad
        assert "refused it as a guest" in ad["CoSchedPinReason"], ad
        assert pool.job(mate, ATTRS)["JobStatus"] == 2  # the mate ran on, untouched
    finally:
        pool.admin_remove(f"ClusterId == {mate} || ClusterId == {guest}")


def test_a_mates_longer_limit_reaches_its_shadow(pool):
    # Limit 30 s, runs 50 s: held (code 47) unless the longer limit reaches the shadow.
    mate = submit(pool, 50, 30)
    try:
        pool.wait_for(mate, lambda a: a["JobStatus"] == 2, ATTRS, timeout_s=90)
        name = htcondor2.Collector().query(htcondor2.AdTypes.Schedd)[0]["Name"]
        out = subprocess.run([sys.executable, "-c", _WRITE, name, str(mate),
                              "AllowedExecuteDuration", "120"],
                             env={**os.environ, **pool.env(pool.info.admin_user)}, capture_output=True, text=True,
                             timeout=60)
        assert out.returncode == 0, out.stderr
        done = pool.wait_for(mate, lambda a: a["JobStatus"] in (4, 5), ATTRS, timeout_s=120)
        assert done["JobStatus"] == 4 and unset(done, "HoldReasonCode"), json.dumps(done, default=str)
    finally:
        pool.admin_remove(f"ClusterId == {mate}")


def test_node_sharing_attributes_a_user_submits_are_cleared(pool):
    forged = {"+CoSchedPinSlot": f'"{pool.slot(2, NODE)}"', "+CoSchedPinMate": '"1.0"',
              "+CoSchedPinMateIncrease": "99999", "+CoSchedPinMateBaseDuration": "5",
              "+CoSchedPinGuest": '"x#1.0"'}
    malleable = submit(pool, 1, 60, **forged, hold="true")
    plain = {k: v for k, v in MALLEABLE.items() if k != "+CoSchedMalleable"}  # a job that never opted in
    ordinary = pool.schedd().submit(htcondor2.Submit({**plain, **forged, "initialdir": str(pool.job_dir()),
                                                      "arguments": "1", "hold": "true"})).cluster()
    try:
        for cluster in (malleable, ordinary):
            ad = pool.job(cluster, [a[1:] for a in forged])
            assert all(unset(ad, a[1:]) for a in forged), ad
    finally:
        pool.admin_remove(f"ClusterId == {malleable} || ClusterId == {ordinary}")
