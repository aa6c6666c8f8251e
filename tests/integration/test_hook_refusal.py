"""What a user sees when the PREPARE_JOB hook refuses a start, on the real pool (issue 9).

A refusal a new plan can fix sends the job back to Idle with the reason in VacateReason; the
START guard of config.d/20 keeps it off the pin it was refused on until a newer
CoSchedPinTime; a refusal no plan fixes holds it with the reason in HoldReason.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

import htcondor2
import pytest
from cosched_node import jobs, procs
from cosched_node.errors import EXIT_BAD_AD
from cosched_node.slots import Claim

from condor_sched.localpool import chroot, config

pytestmark = pytest.mark.pool

REFUSAL_ATTRS = ["JobStatus", "VacateReason", "VacateReasonCode", "VacateReasonSubCode", "LastVacateTime",
                 "NumShadowStarts", "NumJobStarts", "HoldReason", "HoldReasonCode", "HoldReasonSubCode",
                 "ExitCode", "LastRemoteHost", "CoSchedPinTime"]
#: HTCondor's VacateReasonCode when a PREPARE_JOB hook sends a job back to Idle (StarterError).
VACATE_CODE_STARTER_ERROR = 1007


class CoRunner:
    """A job the node agent holds on a device that HTCondor no longer accounts: a starter
    still alive after its claim ended (or one from before a stale ad). Only root can make
    one: a live root process named condor_starter, and its record in the agent's root-only
    jobs.json, written while the agent is stopped."""

    def __init__(self, pool, node: str, device: str, memory_mb: int, threads: int, tmp: Path) -> None:
        starter = tmp / "condor_starter"
        shutil.copy("/bin/sleep", starter)
        self.process = subprocess.Popen([str(starter), "600"])
        start = None
        while start is None:
            start = procs.start_time(self.process.pid)
        self.root, self.node = pool.info.root, node
        self.agent = config.agent_name(int(node.removeprefix("node")))
        claim = Claim(slot="slot2_999", slot_id=2, job="999999.0", starter_pid=self.process.pid, remote_user="root",
                      cpus=1, memory_mb=0, device=device, device_memory_mb=memory_mb, compute=threads, llc_ways=0,
                      mem_bw_gbs=0.0, program=None, pinned=True, scale=0, nodes=0)
        record = jobs.Running(self.process.pid, start, claim, time.time(), units=((240 - threads, 240),))
        state_dir = str(pool.info.root / "var/lib/condor_sched" / node)
        self._agent("condor_off")
        records, _ = jobs.load(state_dir)
        records[record.key] = record
        jobs.save(state_dir, records)
        self._agent("condor_on")

    def _agent(self, command: str) -> None:
        """Stop (condor_off) or start (condor_on) the node's agent and wait until it is so."""
        chroot.in_chroot(self.root, [command, "-daemon", self.agent], check=True, timeout_s=30)
        deadline = time.monotonic() + 30
        while self._agent_running() != (command == "condor_on") and time.monotonic() < deadline:
            time.sleep(0.2)
        time.sleep(1)  # a started agent has read its records and listens

    def _agent_running(self) -> bool:
        marker = str(config.node_config_path(self.node))
        for pid in chroot.processes_in(self.root):
            try:
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            except OSError:
                continue
            if config.NODE_AGENT_SCRIPT in cmdline and marker in cmdline:
                return True
        return False

    def end(self) -> None:
        self.process.kill()
        self.process.wait()


def agent_log_lines(pool, node: str, text: str) -> int:
    log = pool.info.root / "var/lib/condor_sched" / node / "agent.log"
    return sum(text in line for line in log.read_text().splitlines())


def test_a_refused_device_start_goes_back_to_idle_with_its_reason_and_waits_for_a_new_pin(pool, tmp_path):
    node, slot = "node1", pool.slot(2, "node1")
    co_runner = CoRunner(pool, node, "mic0", 8000, 60, tmp_path)
    cluster = None
    try:
        cluster = pool.submit(request_PhiMemory="1000", request_PhiThreads="60", arguments="1")
        job = f"{cluster}.0"
        assert pool.admin_edit(job, "CoSchedPinSlot", f'"{slot}"') == 1
        # Idle again (never held), the hook's message in VacateReason; HTCondor 25.14 keeps the
        # hook's status only in the text (VacateReasonSubCode is 0): config.d/20 matches on it.
        ad = pool.wait_for(cluster, lambda a: a.get("VacateReasonCode") is not None and a["JobStatus"] != 2,
                           REFUSAL_ATTRS, timeout_s=90)
        print("after the refusal:", ad)
        assert ad["JobStatus"] == 1, ad
        assert ad["VacateReasonCode"] == VACATE_CODE_STARTER_ERROR == 1007 and ad["VacateReasonSubCode"] == 0
        assert ad["VacateReason"].startswith("Error from slot2_"), ad
        assert "PREPARE_JOB (prepare_job) failed (reported status 303): condor_sched: device node1/mic0 (slot2_" \
            in ad["VacateReason"], ad
        assert "is full: device memory 8000+1000 MB > 8192 MB on mic0" in ad["VacateReason"], ad
        assert isinstance(ad["LastVacateTime"], int) and ad["NumShadowStarts"] == 1 and ad.get("NumJobStarts", 0) == 0
        # No loop: 30 s (15 negotiation cycles) later the job has not started again. (Without
        # the START guard it does: with CoSchedPinTime an hour ahead, the hook refused it
        # twice in 30 s on this pool, a new start each ~13 s.)
        time.sleep(30)
        later = pool.job(cluster, REFUSAL_ATTRS)
        print("30 s later:", later)
        assert later["JobStatus"] == 1 and later["NumShadowStarts"] == 1, later
        assert agent_log_lines(pool, node, f"job {job}: start refused") == 1
        # The job's event log tells the user too: the starter's error (021), then the eviction (004).
        events = (Path(pool.schedd().query(f"ClusterId == {cluster}", projection=["Iwd"])[0]["Iwd"]) / "log").read_text()
        print(events)
        assert "021 (" in events and "004 (" in events and "is full: device memory 8000+1000 MB" in events
        # The device frees up and the sidecar pins the job again: it starts and completes.
        co_runner.end()
        assert pool.admin_edit(job, "CoSchedPinTime", str(int(time.time()) + 1)) == 1
        done = pool.wait_for(cluster, lambda a: a["JobStatus"] == 4, REFUSAL_ATTRS, timeout_s=90)
        assert done["ExitCode"] == 0 and done["NumShadowStarts"] == 2, done
    finally:
        co_runner.end()
        if cluster is not None:
            pool.schedd().act(htcondor2.JobAction.Remove, f"ClusterId == {cluster} && JobStatus != 4")


def spread_proc(pool, ways: int, scale: int) -> int:
    cluster = pool.submit(request_cpus="1", request_memory="64", arguments="1", **{"+CoSchedProgram": '"MG"'})
    job = f"{cluster}.0"
    for attr, value in (("CoSchedPinLLCWays", str(ways)), ("CoSchedPinMemBW", "2"), ("CoSchedPinScale", str(scale)),
                        ("CoSchedPinTime", str(int(time.time())))):
        assert pool.admin_edit(job, attr, value) == 1
    assert pool.admin_edit(job, "CoSchedPinSlot", f'"{pool.slot(1, "node2")}"') == 1
    return cluster


def test_a_malformed_pin_holds_the_job_with_a_reason_users_can_read(pool):
    cluster = spread_proc(pool, ways=1, scale=3)
    try:
        ad = pool.wait_for(cluster, lambda a: a["JobStatus"] == 5, REFUSAL_ATTRS, timeout_s=90)
        print("held:", ad)
        assert ad["HoldReasonCode"] == 19 and ad["HoldReasonSubCode"] == EXIT_BAD_AD, ad
        assert "condor_sched: malformed job or machine ad: attribute CoSchedPinScale = 3 is not one of (1, 2, 4, 8)" \
            in ad["HoldReason"], ad
    finally:
        pool.schedd().act(htcondor2.JobAction.Remove, f"ClusterId == {cluster}")


def test_a_spread_proc_with_no_ways_of_its_own_runs(pool):
    cluster = spread_proc(pool, ways=0, scale=1)
    ad = pool.wait_for(cluster, lambda a: a["JobStatus"] in (4, 5), REFUSAL_ATTRS, timeout_s=90)
    assert ad["JobStatus"] == 4 and ad["ExitCode"] == 0, ad
    assert os.path.basename(ad["LastRemoteHost"]).startswith("slot1_") and "@node2@" in ad["LastRemoteHost"]
