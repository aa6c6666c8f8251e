"""The one-sidecar lease rule, on ads alone: who is a live rival, who keeps the lease."""
from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from condor_sched.lease import SidecarId, first_rival_before, live_rivals, refusal, sidecar_alive

NOW = 10_000
ME = SidecarId(start_time=NOW - 10, machine="h1", name="cosched@h1", pid=100)


def ad(name="cosched@h2", machine="h2", pid=200, start=NOW - 3600, heard=NOW - 5, lifetime=210, **extra):
    return {"MyType": "CoSchedSidecar", "Name": name, "Machine": machine, "CoSchedPid": pid,
            "DaemonStartTime": start, "LastHeardFrom": heard, "ClassAdLifetime": lifetime, **extra}


def rivals(*ads, alive=lambda pid: True):
    return [(r.id.name, r.id.pid) for r in live_rivals(ads, ME, NOW, alive)]


def test_a_sidecar_heard_from_within_its_lease_is_a_rival():
    assert rivals(ad()) == [("cosched@h2", 200)]
    assert rivals(ad(heard=NOW - 210)) == [("cosched@h2", 200)]
    assert rivals(ad(heard=None)) == [("cosched@h2", 200)]  # no stamp: the collector's lifetime decides


def test_an_ad_older_than_its_lease_does_not_block():
    assert rivals(ad(heard=NOW - 211)) == []
    assert rivals(ad(heard=NOW - 100, lifetime=60)) == []


def test_own_ad_dry_runs_and_unreadable_ads_are_no_rivals():
    mine = ad(name=ME.name, machine=ME.machine, pid=ME.pid, start=ME.start_time)
    assert rivals(mine, ad(CoSchedDryRun=True), ad(pid="?"), ad(start=None)) == []


def test_an_ad_of_this_host_whose_process_is_gone_does_not_block_a_restart():
    crashed = ad(name=ME.name, machine=ME.machine, pid=99)
    assert rivals(crashed, alive=lambda pid: False) == []
    assert rivals(crashed, alive=lambda pid: True) == [(ME.name, 99)]
    # Another host's process cannot be checked from here: its lease decides.
    assert rivals(ad(), alive=lambda pid: False) == [("cosched@h2", 200)]


def test_the_sidecar_that_started_first_keeps_the_lease_ties_broken_the_same_way_everywhere():
    earlier, later = ad(start=ME.start_time - 1, name="b"), ad(start=ME.start_time + 1, name="a")
    found = live_rivals([later, earlier], ME, NOW)
    assert [r.id.name for r in found] == ["b", "a"]
    assert first_rival_before(found, ME).id.name == "b"
    assert first_rival_before(live_rivals([later], ME, NOW), ME) is None
    # Same start second: Machine, then Name, then pid; each side computes the same order.
    tie_a = SidecarId(NOW, "h1", "cosched", 7)
    tie_b = SidecarId(NOW, "h2", "cosched", 3)
    a_sees_b = live_rivals([ad(name="cosched", machine="h2", pid=3, start=NOW)], tie_a, NOW)
    b_sees_a = live_rivals([ad(name="cosched", machine="h1", pid=7, start=NOW)], tie_b, NOW)
    assert first_rival_before(a_sees_b, tie_a) is None and first_rival_before(b_sees_a, tie_b).id == tie_a


def test_the_refusal_names_the_running_sidecar_its_host_pid_and_age():
    (rival,) = live_rivals([ad(start=NOW - 330, heard=NOW - 4)], ME, NOW)
    message = refusal(rival, NOW)
    for part in ("cosched@h2 on h2", "pid 200", "running for 5 min 30 s", "updated 4 s ago", "lease 210 s",
                 "condor_off -daemon COSCHED_SIDECAR on h2", "--dry-run"):
        assert part in message, (part, message)


def test_a_pid_is_a_live_sidecar_only_while_a_condor_sched_process_has_it():
    sleep = [sys.executable, "-c", "import time; time.sleep(60)"]
    sidecar, other = subprocess.Popen([*sleep, "condor-sched", "run"]), subprocess.Popen(sleep)
    for proc in (sidecar, other):  # until each has exec'd (before, /proc shows our own command line)
        deadline = time.monotonic() + 10
        while b"time.sleep" not in Path(f"/proc/{proc.pid}/cmdline").read_bytes() and time.monotonic() < deadline:
            time.sleep(0.01)
    try:
        assert sidecar_alive(sidecar.pid)
        assert not sidecar_alive(other.pid)  # a live process that is no sidecar: a reused pid
    finally:
        for proc in (sidecar, other):
            proc.kill()
            proc.wait()
    assert not sidecar_alive(sidecar.pid)


def test_explain_live_says_whether_a_sidecar_holds_the_lease_and_how_old_its_cycle_is():
    from condor_sched.lease import lease_status

    now = 10_000.0
    fresh = {"Name": "cosched@cm", "Machine": "cm", "DaemonStartTime": 9000, "LastHeardFrom": now - 5,
             "ClassAdLifetime": 210, "CoSchedLastCycleTime": now - 40}
    assert lease_status([], now, 60).startswith("no sidecar holds the lease")
    assert lease_status([dict(fresh, LastHeardFrom=now - 500)], now, 60).startswith("no sidecar holds the lease")
    assert lease_status([dict(fresh, CoSchedDryRun=True)], now, 60).startswith("no sidecar holds the lease")
    assert lease_status([fresh], now, 60).startswith("sidecar cosched@cm on cm: last cycle 40 s ago")
    old = lease_status([dict(fresh, CoSchedLastCycleTime=now - 900)], now, 60)
    assert "its last cycle ended 15 min 0 s ago" in old and "pins may be stale" in old
    assert "has not finished a cycle yet" in lease_status([{k: v for k, v in fresh.items()
                                                            if k != "CoSchedLastCycleTime"}], now, 60)
