"""The sidecar as a daemon of the pool's condor_master (config.d/50-cosched-sidecar.conf)."""
from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any, Callable

import htcondor2
import pytest

from condor_sched import localpool
from condor_sched.localpool import chroot
from condor_sched.model import partitionable_slot_of

pytestmark = pytest.mark.pool

DAEMON = "COSCHED_SIDECAR"
TEST_KNOBS = "60-cosched-test-sidecar.conf"


def wait_until(probe: Callable[[], Any], what: str, timeout_s: float = 60) -> Any:
    """Poll ``probe`` until it returns something truthy; that value."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = probe()
        if value:
            return value
        time.sleep(0.5)
    raise AssertionError(f"not within {timeout_s} s: {what}")


def sidecar_pids(pool) -> list[int]:
    """Processes in the pool root that are the master's sidecar (``condor-sched run``)."""
    def cmdline(pid: int) -> bytes:
        try:
            return Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            return b""

    return [p for p in chroot.processes_in(pool.info.root)
            if b"condor-sched\0run" in cmdline(p) and b"python" in cmdline(p)]


def sidecar_ads() -> list[dict[str, Any]]:
    return [dict(ad) for ad in htcondor2.Collector().query(htcondor2.AdType.Any, 'MyType == "CoSchedSidecar"')]


def live_ad(pool, min_cycles: int = 1, **expected: Any) -> dict[str, Any] | None:
    """The ad of the running sidecar process once it has advertised ``min_cycles`` cycles."""
    pids = sidecar_pids(pool)
    for ad in sidecar_ads():
        if (ad.get("CoSchedPid") in pids and ad.get("CoSchedCyclesRun", 0) >= min_cycles
                and all(ad.get(k) == v for k, v in expected.items())):
            return ad
    return None


def condor(pool, *command: str) -> None:
    chroot.in_chroot(pool.info.root, list(command), timeout_s=30)


def sidecar_log(pool) -> str:
    return (pool.info.root / "var/log/condor/CoSchedLog").read_text()


@pytest.fixture
def master_sidecar(pool):
    """The pool's master runs the sidecar for this test; afterwards it is off again."""
    test_knobs = pool.info.root / "etc/condor/config.d" / TEST_KNOBS
    localpool.set_sidecar(True, pool.settings)
    try:
        yield test_knobs
    finally:
        test_knobs.unlink(missing_ok=True)
        localpool.set_sidecar(False, pool.settings)
        wait_until(lambda: not sidecar_pids(pool), "the sidecar stops once out of DAEMON_LIST", timeout_s=30)


def test_master_runs_the_sidecar_which_pins_advertises_and_obeys_condor_off_on_and_reconfig(pool, master_sidecar):
    started = time.monotonic()
    ad = wait_until(lambda: live_ad(pool), "the master's sidecar advertises a cycle")
    print(f"sidecar advertised after {time.monotonic() - started:.1f} s")
    for attr in ("Name", "DaemonStartTime", "CoSchedCycle", "CoSchedIdleJobs", "CoSchedPinned", "CoSchedUnplaced",
                 "CoSchedCycleSeconds", "CoSchedLastCycleTime"):
        assert attr in ad, attr
    assert ad["CoSchedLastError"] == "" and ad["CoSchedConfigError"] == "" and ad["CoSchedPolicy"] == "knapsack"
    first_pid = ad["CoSchedPid"]
    condor_uid = int(chroot.in_chroot(pool.info.root, ["id", "-u", "condor"]).stdout)
    uids = re.search(r"^Uid:\s+(\d+)", Path(f"/proc/{first_pid}/status").read_text(), re.M).group(1)
    assert int(uids) == condor_uid  # COSCHED_SIDECAR_USERID: the queue super user, not root

    # Its cycles pin device jobs that alice submits, which then run on their pinned devices.
    d = pool.job_dir()
    cluster = pool.schedd().submit(htcondor2.Submit({
        "executable": "/bin/sleep", "arguments": "2", "initialdir": str(d), "should_transfer_files": "YES",
        "log": "log", "request_PhiMemory": "1250", "request_PhiThreads": "60"}), count=4).cluster()
    history = wait_until(lambda: [dict(a) for a in pool.schedd().history(
        f"ClusterId == {cluster}", projection=["ProcId", "JobStatus", "ExitCode", "LastRemoteHost", "CoSchedPinSlot"])]
        if not pool.schedd().query(f"ClusterId == {cluster}", projection=["ProcId"]) else None,
        "the device jobs run and leave the queue", timeout_s=120)
    assert len(history) == 4 and all(a["JobStatus"] == 4 and a["ExitCode"] == 0 for a in history), history
    for a in history:
        assert partitionable_slot_of(a["LastRemoteHost"]) == a["CoSchedPinSlot"], a
        assert re.search(rf"pinned \S+#{cluster}\.{a['ProcId']} to {re.escape(a['CoSchedPinSlot'])}", sidecar_log(pool))

    # condor_off: SIGTERM, the process exits and its ad is invalidated.
    logged_before = len(sidecar_log(pool))
    condor(pool, "condor_off", "-daemon", DAEMON)
    wait_until(lambda: not sidecar_pids(pool), "condor_off stops the sidecar", timeout_s=30)
    wait_until(lambda: not sidecar_ads(), "the stopped sidecar's ad leaves the collector", timeout_s=30)
    last_words = sidecar_log(pool)[logged_before:].splitlines()[-1]
    assert re.search(r"stopping after \d+ cycles$", last_words), last_words

    # condor_on: a new process, new cycles, a new ad.
    condor(pool, "condor_on", "-daemon", DAEMON)
    ad = wait_until(lambda: live_ad(pool, min_cycles=2), "condor_on restarts the sidecar, which cycles again")
    assert ad["CoSchedPid"] != first_pid

    # condor_reconfig: the same process re-reads its knobs (SIGHUP).
    master_sidecar.write_text("COSCHED_POLICY = exclusive\n")
    condor(pool, "condor_reconfig")
    reconfigured = wait_until(lambda: live_ad(pool, CoSchedPolicy="exclusive"), "condor_reconfig changes the policy")
    assert reconfigured["CoSchedPid"] == ad["CoSchedPid"] and reconfigured["CoSchedConfigError"] == ""
