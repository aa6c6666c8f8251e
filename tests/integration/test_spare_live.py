"""Paper 003's spare capacity on the real pool: node7 of the default inventory is a socket node
of the host's 2 cores with a SPARE slot (docs/spare-capacity.md). Its agent samples node7's
primaries, publishes the estimate through the startd cron, and confines spare-capacity jobs in
real cgroup v1 groups of the host (the pool binds the host's cgroup mounts into the chroot for
it); the sidecar pins a ``+CoSchedSpare`` job there; a primary that needs the memory back gets
the spare job vacated, and the user reads why with condor_q."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import htcondor2
import pytest

from condor_sched.localpool import config as pool_config

pytestmark = pytest.mark.pool

NODE = "node7"
HOST_CPU = Path("/sys/fs/cgroup/cpu")
HOST_MEMORY = Path("/sys/fs/cgroup/memory")
ATTRS = ["JobStatus", "RemoteHost", "CoSchedPinSlot", "CoSchedPinReason", "LastVacateTime", "NumJobStarts"]
#: A job that holds ``MB`` of memory (touched) and burns one core until it is removed.
HOLDER = """#!/usr/bin/python3
import sys, time
block = bytearray(int(sys.argv[1]) * 2**20)
for i in range(0, len(block), 4096):
    block[i] = 1
open("ready", "w").write("ready")
while True:
    if sys.argv[2] == "burn":
        sum(range(10000))
    else:
        time.sleep(1)
"""


def host_has_v1() -> bool:
    return (HOST_CPU / "cpu.cfs_quota_us").is_file() and (HOST_MEMORY / "memory.limit_in_bytes").is_file() \
        and os.access(HOST_CPU, os.W_OK)


def cli(pool, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, **pool.env(pool.info.admin_user)}
    return subprocess.run([sys.executable, "-m", "condor_sched", *args], env=env, capture_output=True, text=True,
                          timeout=120)


def spare_slot_ad(pool) -> dict:
    (ad,) = htcondor2.Collector().query(htcondor2.AdTypes.Startd, f'Name == "{pool.slot(2, NODE)}"')
    return dict(ad)


def wait_spare_published(pool, usable: bool, timeout_s: float = 150) -> dict:
    deadline = time.monotonic() + timeout_s
    ad: dict = {}
    while time.monotonic() < deadline:
        ad = spare_slot_ad(pool)
        if ad.get("CoSchedSpareUsable") is usable:
            return ad
        time.sleep(2)
    raise AssertionError(f"{NODE}'s spare slot never published CoSchedSpareUsable = {usable}: {ad}")


def submit_holder(pool, megabytes: int, mode: str, **extra: str) -> int:
    d = pool.job_dir()
    (d / "holder.py").write_text(HOLDER)
    (d / "holder.py").chmod(0o755)
    os.chown(d / "holder.py", pool.settings.uid, pool.settings.uid)
    return pool.schedd().submit(htcondor2.Submit({
        "executable": str(d / "holder.py"), "arguments": f"{megabytes} {mode}", "initialdir": str(d),
        "should_transfer_files": "YES", "output": "out", "error": "err", "log": "log", **extra})).cluster()


def spare_state(pool) -> dict:
    path = pool.settings.in_root(pool_config.AGENT_STATE_DIR / NODE / "spare.json")
    return json.loads(path.read_text())


def test_a_spare_job_runs_confined_and_is_vacated_when_the_primaries_need_its_memory(pool):
    ad = spare_slot_ad(pool)
    assert ad["CoSchedSpareSlot"] is True and ad["TotalSlotCpus"] == 2 and ad["TotalSlotMemory"] == 4096, ad
    if not host_has_v1():   # a host without writable cgroup v1: the node says so, nothing runs unconfined
        ad = wait_spare_published(pool, usable=False)
        assert "cgroup" in ad.get("CoSchedSpareProblem", ""), ad
        spare = submit_holder(pool, 10, "sleep", request_cpus="1", request_memory="100", **{"+CoSchedSpare": "true"})
        ran = cli(pool, "run", "--once")
        assert ran.returncode == 0, ran.stdout + ran.stderr
        reason = pool.job(spare, ATTRS)["CoSchedPinReason"]
        assert f"{NODE}.{pool.domain}: its node agent takes no spare-capacity job now" in reason, reason
        pool.admin_remove(f"ClusterId == {spare}")
        return
    ad = wait_spare_published(pool, usable=True)
    # nothing runs on node7 yet: the primaries leave both cores and all memory idle
    assert ad["CoSchedSpareCpus"] == pytest.approx(2.0, abs=0.2) and ad["CoSchedSpareMemory"] > 3500, ad
    assert ad["CoSchedSpareConfidence"] == pytest.approx(0.8) and ad["CoSchedSpareSamples"] >= 12, ad
    spare = submit_holder(pool, 1200, "burn", request_cpus="1", request_memory="1500", **{"+CoSchedSpare": "true"})
    primary = None
    try:
        ran = cli(pool, "run", "--once")
        assert ran.returncode == 0, ran.stdout + ran.stderr
        pinned = pool.job(spare, ATTRS)
        assert pinned["CoSchedPinSlot"] == pool.slot(2, NODE), (pinned.get("CoSchedPinReason"), {k: v for k, v in spare_slot_ad(pool).items() if "Spare" in k or k in ("Cpus", "Memory", "State", "Activity")}, ran.stderr[-2000:])
        running = pool.wait_for(spare, lambda a: a["JobStatus"] == 2, ATTRS, timeout_s=120)
        assert running["RemoteHost"].startswith("slot2_") and f"@{NODE}@" in running["RemoteHost"], running

        # Confined in a real v1 group of the host: the idle class, a CFS cap, a memory limit.
        deadline = time.monotonic() + 30
        claim = None
        while time.monotonic() < deadline and not claim:
            claim = next((c for c in spare_state(pool).get("claims", []) if c.get("job") == f"{spare}.0"), None)
            time.sleep(1)
        assert claim, spare_state(pool)
        group = (claim["cgroup"] or "").strip("/")
        assert group, claim
        cpu, memory = HOST_CPU / group, HOST_MEMORY / group
        assert (cpu / "cpu.idle").read_text().strip() == "1"
        quota = int((cpu / "cpu.cfs_quota_us").read_text())
        assert 0 < quota <= 2 * int((cpu / "cpu.cfs_period_us").read_text()), quota
        assert int((memory / "memory.limit_in_bytes").read_text()) <= 4096 * 2**20
        assert (cpu / "cgroup.procs").read_text().split(), "no process in the spare job's group"

        # A primary on node7's socket slot takes 3300 MB: the spare job's 1200 no longer fit
        # (4096 - 3300 MB), so the agent has the startd vacate it; it goes back to idle.
        primary = submit_holder(pool, 3300, "sleep", request_cpus="1", request_memory="3500",
                                requirements=f'TARGET.Machine == "{NODE}.{pool.domain}"')
        pool.wait_for(primary, lambda a: a["JobStatus"] == 2, ATTRS, timeout_s=120)
        back = pool.wait_for(spare, lambda a: a["JobStatus"] == 1 and a.get("LastVacateTime") is not None,
                             ATTRS, timeout_s=150)
        assert back["NumJobStarts"] >= 1, back
        # The sidecar looks once the claim is gone and the startd's ad holds only the agent's
        # record of the request (the case a sidecar a cycle late meets): the job is told why.
        record = f"coschedsparevacated_{spare}_0"
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            names = {k.lower() for k in spare_slot_ad(pool)}
            if record in names and not any(k.startswith("coschedspareevict_") for k in names):
                break
            time.sleep(2)
        evicted = {k.lower(): v for k, v in spare_slot_ad(pool).items() if k.lower().startswith("coschedsparev")}
        assert record in evicted, evicted
        ran = cli(pool, "run", "--once")
        assert ran.returncode == 0, ran.stdout + ran.stderr
        job = pool.job(spare, ATTRS)
        told = job["CoSchedPinReason"]
        # Told why, whichever came first: the sidecar saw the vacate, or the job matched node7
        # again and its node refused the start (it cannot hold the request now). Never run
        # again there, never killed: the job is idle, with its reason.
        node = f"{NODE}.{pool.domain}"
        assert job["JobStatus"] == 1 and job["NumJobStarts"] == 1, (job, evicted)
        first = told.split("; now ")[0]
        assert first.startswith((f"vacated from {node}: ", f"{node} refused it as a spare-capacity job: ")) \
            and "primaries" in first, (told, evicted)
        assert "; now waiting: " in told, told     # node7 has no room for it, or just refused it
    finally:
        pool.admin_remove(f"ClusterId == {spare}" + (f" || ClusterId == {primary}" if primary else ""))
    # the agent removes the group of a claim that ended
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and (HOST_CPU / group).exists():
        time.sleep(1)
    assert not (HOST_CPU / group).exists(), f"{group} left behind"
