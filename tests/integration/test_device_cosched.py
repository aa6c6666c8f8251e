"""Device co-scheduling end to end on the real pool, with the sidecar running (issue 3)."""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections import defaultdict

import htcondor2
import pytest

from condor_sched.localpool import chroot
from condor_sched.localpool.jobs import table1_submit
from condor_sched.model import partitionable_slot_of

pytestmark = pytest.mark.pool

HISTORY_ATTRS = ["ProcId", "JobStatus", "ExitCode", "LastRemoteHost", "JobCurrentStartDate", "CompletionDate",
                 "RequestPhiMemory", "RequestPhiThreads"]


def start_sidecar(pool, policy: str, *extra: str, **knobs: str) -> subprocess.Popen:
    env = {**os.environ, **pool.env(pool.info.admin_user), "_CONDOR_COSCHED_POLICY": policy,
           "_CONDOR_COSCHED_UNPIN_AGE_CYCLES": "8", "_CONDOR_COSCHED_INTERVAL": "5",
           **{f"_CONDOR_{k}": v for k, v in knobs.items()}}
    return subprocess.Popen([sys.executable, "-m", "condor_sched", "run", *extra], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def stop(proc: subprocess.Popen) -> str:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
    return proc.stdout.read() if proc.stdout else ""


def run_with_sidecar(pool, cluster: int, policy: str, timeout_s: float, **knobs: str) -> str:
    """Run the sidecar until every job of ``cluster`` has left the queue; its log."""
    sidecar = start_sidecar(pool, policy, **knobs)
    try:
        wait_cluster_done(pool, cluster, timeout_s)
    finally:
        output = stop(sidecar)
    return output


def submit_table1(pool, n: int, seed: int) -> int:
    d = pool.job_dir()
    description, items = table1_submit(n, seed, str(d))
    return pool.schedd().submit(htcondor2.Submit(description), itemdata=iter(items)).cluster()


def wait_cluster_done(pool, cluster: int, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        left = pool.schedd().query(f"ClusterId == {cluster}", projection=["JobStatus", "HoldReason"])
        held = [dict(a) for a in left if a.get("JobStatus") == 5]
        assert not held, f"jobs went on hold: {held[:3]}"
        if not left:
            return
        time.sleep(1)
    raise AssertionError(f"cluster {cluster} still has jobs after {timeout_s} s")


def device_timelines(pool, cluster: int) -> dict[str, list[dict]]:
    history = [dict(a) for a in pool.schedd().history(f"ClusterId == {cluster}", projection=HISTORY_ATTRS)]
    by_device: dict[str, list[dict]] = defaultdict(list)
    for ad in history:
        by_device[partitionable_slot_of(ad["LastRemoteHost"])].append(ad)
    return by_device


def peak_use(jobs: list[dict]) -> tuple[int, int, int]:
    """Most jobs, memory and threads running at once on one device, from start/end times."""
    events = sorted([(j["JobCurrentStartDate"], 1, j) for j in jobs] + [(j["CompletionDate"], 0, j) for j in jobs],
                    key=lambda e: (e[0], e[1]))  # ends before starts at the same second
    running: list[dict] = []
    peak = (0, 0, 0)
    for _, is_start, job in events:
        if is_start:
            running.append(job)
        else:
            running.remove(job)
        use = (len(running), sum(j["RequestPhiMemory"] for j in running), sum(j["RequestPhiThreads"] for j in running))
        peak = tuple(max(a, b) for a, b in zip(peak, use))
    return peak


def device_totals(pool) -> dict[str, tuple[int, int]]:
    ads = htcondor2.Collector().query(htcondor2.AdTypes.Startd, "PartitionableSlot && TotalSlotPhiMemory > 0",
                                      projection=["Name", "TotalSlotPhiMemory", "TotalSlotPhiThreads"])
    return {a["Name"]: (a["TotalSlotPhiMemory"], a["TotalSlotPhiThreads"]) for a in ads}


def test_table1_mix_shares_devices_without_oversubscribing_them(pool):
    totals = device_totals(pool)
    assert len(totals) == 6
    cluster = submit_table1(pool, 40, seed=2)
    output = run_with_sidecar(pool, cluster, "knapsack", timeout_s=420)
    timelines = device_timelines(pool, cluster)
    jobs = [j for js in timelines.values() for j in js]
    assert len(jobs) == 40 and all(j["JobStatus"] == 4 and j["ExitCode"] == 0 for j in jobs), output[-2000:]
    peaks = {device: peak_use(js) for device, js in timelines.items()}
    assert set(peaks) <= set(totals)
    for device, (count, memory, threads) in peaks.items():
        assert memory <= totals[device][0] and threads <= totals[device][1], (device, peaks[device])
    assert max(count for count, _, _ in peaks.values()) > 1, peaks
    assert re.search(r"cycle \d+: \d+ idle co-scheduled jobs seen, \d+ pins kept, [1-9]\d* pinned", output)


def test_exclusive_never_shares_a_device(pool):
    cluster = submit_table1(pool, 12, seed=3)
    output = run_with_sidecar(pool, cluster, "exclusive", timeout_s=300)
    timelines = device_timelines(pool, cluster)
    assert sum(len(js) for js in timelines.values()) == 12, output[-2000:]
    shared = {d: sorted((j["JobCurrentStartDate"], j["CompletionDate"], j["ProcId"]) for j in js)
              for d, js in timelines.items() if peak_use(js)[0] > 1}
    pin_log = [line for line in output.splitlines() if "pinned" in line]
    assert not shared, f"devices shared (start, end, proc): {shared}\nsidecar pins:\n" + "\n".join(pin_log[-40:])


def node_daemon(pool, node: str, action: str) -> None:
    local_name = f"NODE{pool.info.nodes.index(node) + 1}"
    chroot.in_chroot(pool.info.root, [f"condor_{action}", "-daemon", local_name])


def wait_slots(predicate, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        names = {a["Name"] for a in htcondor2.Collector().query(htcondor2.AdTypes.Startd, projection=["Name"])}
        if predicate(names):
            return
        time.sleep(1)
    raise AssertionError("the collector's slots did not change as expected")


def test_job_pinned_to_a_vanished_node_is_unpinned_and_runs_elsewhere(pool):
    gone = pool.slot(2, "node2")
    node_daemon(pool, "node2", "off")
    try:
        wait_slots(lambda names: not any("@node2@" in n for n in names))
        cluster = pool.submit(request_PhiMemory="400", request_PhiThreads="60", arguments="2")
        assert pool.admin_edit(f"{cluster}.0", "CoSchedPinCycle", "1") == 1
        assert pool.admin_edit(f"{cluster}.0", "CoSchedPinSlot", f'"{gone}"') == 1
        sidecar = start_sidecar(pool, "knapsack")
        try:
            ad = pool.wait_for(cluster, lambda a: a.get("JobStatus") == 4,
                               ["LastRemoteHost", "ExitCode"], timeout_s=120)
        finally:
            output = stop(sidecar)
        assert "vanished" in output
        assert "@node2@" not in ad["LastRemoteHost"] and ad["ExitCode"] == 0
    finally:
        node_daemon(pool, "node2", "on")
        wait_slots(lambda names: any("@node2@" in n for n in names))


def test_killing_the_sidecar_mid_cycle_leaves_every_job_pinned_or_untouched(pool):
    # Device memory no device has free keeps jobs from running, so pins stay visible.
    cluster = submit_table1(pool, 60, seed=5)
    sidecar = start_sidecar(pool, "knapsack", "--once")
    pinned_lines = 0
    try:
        for line in sidecar.stdout:
            if " pinned " in line and " to slot" in line:
                pinned_lines += 1
                if pinned_lines == 5:
                    sidecar.send_signal(signal.SIGKILL)
                    break
    finally:
        sidecar.kill()
        sidecar.wait()
    assert pinned_lines == 5
    ads = pool.schedd().query(f"ClusterId == {cluster}", projection=[
        "ProcId", "Requirements", "CoSchedPinSlot", "CoSchedPinCycle", "CoSchedPinOriginalRequirements"])
    try:
        pinned = 0
        for ad in ads:
            assert "CoSchedPinOriginalRequirements" in ad, ad
            assert "CoSchedPinSlot" in str(ad.lookup("Requirements")), ad
            if isinstance(ad.get("CoSchedPinSlot"), str):
                pinned += 1
                assert isinstance(ad.get("CoSchedPinCycle"), int), ad
        assert 5 <= pinned < len(ads)
    finally:
        pool.schedd().act(htcondor2.JobAction.Remove, f"ClusterId == {cluster}")
