"""Issue 10's attacks on the execute node, run on the real pool as unprivileged users.

The attacks of the issue, each tried the way a hostile user would: from inside a running job
(the PREPARE_JOB hook and the job run as the submitting user, alice) and from outside any
job as another local user (bob). Before issue 10 each of them worked: a job rewrote its own
memory limit in the agent's world-writable request files, a co-runner of the same uid set
another job's limit to 1 MB, a forged request named a live starter, `mkdir requests/x`
stopped every agent interval, and any user could hold the agent's lock. Now the agent takes
limits from the startd's claims and keeps a root-only state dir: each attack is refused,
and the honest jobs beside it run and are enforced as before.
"""
from __future__ import annotations

import errno
import json
import os
from pathlib import Path

import htcondor2
import pytest

from condor_sched.localpool import chroot
from waiting import wait_until

pytestmark = pytest.mark.pool

STATE = "/var/lib/condor_sched/node1"
ATTRS = ["JobStatus", "ExitCode", "HoldReason", "RemoteHost", "LastRemoteHost"]

#: Tries everything issue 10 found open, prints what happened as JSON, then sleeps.
ATTACKER = r'''#!/usr/bin/python3
import json, os, socket, sys, time
state, linger = sys.argv[1], float(sys.argv[2])
tried = {}

def attempt(name, action):
    try:
        action()
        tried[name] = "done"
    except OSError as exc:
        tried[name] = exc.errno

def write(path, text):
    with open(path, "w") as handle:
        handle.write(text)

attempt("write_jobs", lambda: write(os.path.join(state, "jobs.json"), "[]"))
attempt("write_device_state", lambda: write(os.path.join(state, "devices", "mic0.json"), "{}"))
attempt("plant_file", lambda: write(os.path.join(state, "requests.json"), "{}"))
attempt("mkdir", lambda: os.mkdir(os.path.join(state, "requests")))
attempt("open_lock", lambda: open(os.path.join(state, "agent.lock")).close())
client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
client.settimeout(30)
client.connect(os.path.join(state, "agent.sock"))
client.sendall(b'{"memory_mb": 1, "units": [[0, 240]], "job": "1.0"}\n')
data = b""
while True:
    chunk = client.recv(65536)
    if not chunk:
        break
    data += chunk
tried["agent"] = json.loads(data)
tried["env_units"] = os.environ.get("COSCHED_DEVICE_THREADS")
print(json.dumps(tried), flush=True)
time.sleep(linger)
'''


def _script(directory: Path, owner_uid: int) -> Path:
    path = directory / "attack.py"
    path.write_text(ATTACKER)
    path.chmod(0o755)
    os.chown(path, owner_uid, owner_uid)
    return path


def _device_state(pool) -> dict:
    return json.loads((pool.info.root / STATE.lstrip("/") / "devices" / "mic0.json").read_text())


def _refused_everything_but_its_own_placement(tried: dict) -> None:
    for name in ("write_jobs", "write_device_state", "plant_file", "mkdir", "open_lock"):
        assert tried[name] == errno.EACCES, (name, tried)


def test_a_job_cannot_touch_the_agent_state_or_another_jobs_limit_and_both_are_enforced(pool):
    """Jobs of one user share a device: the attacker can neither raise its own limit nor
    lower its co-runner's; the agent enforces each claim's allocation."""
    slot = pool.slot(2, "node1")
    work = pool.job_dir()
    script = _script(work, pool.settings.uid)
    honest = pool.submit(request_PhiMemory="1000", request_PhiThreads="60", arguments="25", initialdir=str(work),
                         output="honest.out", error="honest.err")
    # /tmp and /var/tmp are private to a job (MOUNT_UNDER_SCRATCH): the script travels with it.
    # It lingers far longer than the test waits, so only the agent's kill can end it (the
    # finally removes it); a short linger let it finish on a slow machine before the kill.
    attacker = pool.submit(executable="/usr/bin/python3", arguments=f"{script.name} {STATE} 900",
                           transfer_input_files=script.name, request_PhiMemory="1024", request_PhiThreads="60",
                           initialdir=str(work), output="attacker.out", error="attacker.err",
                           transfer_executable="false")
    probe = pool.info.root / "var/lib/condor_sched/probe/node1/mic0"
    probe.mkdir(parents=True, exist_ok=True)
    try:
        for cluster in (honest, attacker):
            assert pool.admin_edit(f"{cluster}.0", "CoSchedPinSlot", f'"{slot}"') == 1
        pool.wait_for(attacker, lambda a: a["JobStatus"] == 2, ATTRS, timeout_s=90)
        # The honest job uses 900 of its 1000 MB; the attacker 6000 of its 1024 MB.
        (probe / f"{honest}.0").write_text("900\n")
        running = wait_until(lambda: {j["job"]: j for j in _device_state(pool)["jobs"]}.get(f"{attacker}.0"),
                             "the attacker in the agent's device state", 30)
        assert running["memory_mb"] == 1024 and running["threads"] == 60
        tried = wait_until(lambda: _job_output(pool, attacker), "the attacker's report", 60)
        print("attacker from inside its job:", tried)
        _refused_everything_but_its_own_placement(tried)
        # Asked as a job, the agent names that job's own placement (the one its hook was
        # given and the agent published), whatever the job sent it.
        assert tried["agent"]["status"] == "ok" and tried["agent"]["memory_mb"] == 1024, tried
        units = ",".join(f"{a}-{b - 1}" for a, b in tried["agent"]["units"])
        assert units == tried["env_units"], tried
        published = wait_until(lambda: {j["job"]: j["units"] for j in _device_state(pool)["jobs"]}.get(f"{attacker}.0"),
                               "the attacker's units in the agent's device state", 30)
        assert tried["agent"]["units"] == published, (tried, published)
        (probe / f"{attacker}.0").write_text("6000\n")
        stopped = pool.wait_for(attacker, lambda a: a["JobStatus"] != 2, ATTRS, timeout_s=60)
        print("attacker after using 6000 MB:", stopped)
        # The agent writes its record once the signalled processes are gone (after its grace).
        record = pool.info.root / STATE.lstrip("/") / "killed" / f"{attacker}.0.json"
        killed = json.loads(wait_until(lambda: record.exists() and record.read_text(), "the agent's kill record", 30))
        assert "exceeds its allocation of 1024 MB" in killed["reason"], killed
        # The honest co-runner runs to its end: nobody could change its limit.
        done = pool.wait_for(honest, lambda a: a["JobStatus"] in (3, 4, 5), ATTRS, timeout_s=90)
        assert done["JobStatus"] == 4 and done["ExitCode"] == 0, done
        assert not (pool.info.root / STATE.lstrip("/") / "killed" / f"{honest}.0.json").exists()
    finally:
        pool.schedd().act(htcondor2.JobAction.Remove, f"ClusterId == {honest} || ClusterId == {attacker}")


def _job_output(pool, cluster: int) -> dict | None:
    """The attacker's JSON line, read from its running sandbox (its output comes back only at its end)."""
    execute = pool.info.root / "var/lib/condor/execute/node1"
    for path in execute.glob("dir_*/scratch/_condor_stdout"):
        try:
            text = path.read_text().strip()
        except OSError:
            continue
        if text.startswith("{"):
            job_ad = path.parent / ".job.ad"
            if job_ad.exists() and f"ClusterId = {cluster}\n" in job_ad.read_text():
                return json.loads(text.splitlines()[0])
    return None


def test_a_local_user_outside_any_job_is_refused_and_cannot_stop_the_agent(pool):
    """bob, with no job, forges a start, squats the state dir and tries the lock: all
    refused; the agent keeps beating and an honest job starts and completes."""
    root = pool.info.root
    work = pool.job_dir(pool.settings.second_user)
    script = _script(work, pool.settings.uid + 1)
    beat_before = json.loads((root / STATE.lstrip("/") / "agent.heartbeat").read_text())["time"]
    out = chroot.in_chroot(root, ["chroot", "--userspec", f"{pool.settings.second_user}:{pool.settings.second_user}",
                                  "/", "/usr/bin/python3", str(script), STATE, "0"], check=False, timeout_s=60)
    assert out.returncode == 0, out.stderr
    tried = json.loads(out.stdout.strip().splitlines()[-1])
    print("bob outside any job:", tried)
    _refused_everything_but_its_own_placement(tried)
    assert tried["agent"]["status"] == "refused" and "not a job's PREPARE_JOB hook" in tried["agent"]["message"]
    # A forged starter: bob's own process named condor_starter runs the forger as its child.
    fake = work / "condor_starter"
    fake.write_bytes(Path(root / "usr/bin/python3").read_bytes())
    fake.chmod(0o755)
    forged = chroot.in_chroot(root, ["chroot", "--userspec", f"{pool.settings.second_user}:{pool.settings.second_user}",
                                     "/", str(fake), "-c",
                                     f"import subprocess, sys; sys.exit(subprocess.call(['/usr/bin/python3', "
                                     f"'{script}', '{STATE}', '0']))"], check=False, timeout_s=60)
    tried = json.loads(forged.stdout.strip().splitlines()[-1])
    assert tried["agent"]["status"] == "refused", tried
    # The agent still works: its heartbeat moves on and an honest device job starts and ends.
    cluster = pool.submit(request_PhiMemory="500", request_PhiThreads="30", arguments="1")
    try:
        assert pool.admin_edit(f"{cluster}.0", "CoSchedPinSlot", f'"{pool.slot(2, "node1")}"') == 1
        done = pool.wait_for(cluster, lambda a: a["JobStatus"] in (4, 5), ATTRS, timeout_s=90)
        assert done["JobStatus"] == 4 and done["ExitCode"] == 0, done
    finally:
        pool.schedd().act(htcondor2.JobAction.Remove, f"ClusterId == {cluster} && JobStatus != 4")
    beat_after = json.loads((root / STATE.lstrip("/") / "agent.heartbeat").read_text())["time"]
    assert beat_after > beat_before
    log = (root / STATE.lstrip("/") / "agent.log").read_text()
    assert "not a job's PREPARE_JOB hook" in log
