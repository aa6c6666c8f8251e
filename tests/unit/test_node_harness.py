"""Harness of the execute-node tests (test_node_*.py, test_device_*.py import it), and the
tests that it stands in for what the node agent trusts.

- slot ads as ``condor_status -direct <startd> -json`` prints a startd's dynamic slots;
- ``FakeView``: the agent's slot view serving those ads through ``slots.parse_claims``;
- ``Starters``: stand-in condor_starters, real processes whose comm is ``condor_starter`` (a
  copy of dash), each with one child: the job (``sleep``, run as ``JOB_UID`` when the tests
  run as root, as a real job runs as its owner) or a given command (the PREPARE_JOB hook).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path

import pytest
from cosched_node import agent, config, memory_watch, procs, slots, state

REPO = Path(__file__).resolve().parents[2]
HOOKS = REPO / "node_hooks"
SYSTEM_PYTHON = "/usr/bin/python3" if os.access("/usr/bin/python3", os.X_OK) else sys.executable
DASH = shutil.which("dash") or "/bin/sh"
IS_ROOT = os.geteuid() == 0
#: The job user of the fake starters' jobs (nobody) and a second, unrelated user.
JOB_UID = 65534
OTHER_UID = 65533
needs_root = pytest.mark.skipif(not IS_ROOT, reason="runs processes as other users (root only)")


def wait_for(predicate, what: str, timeout_s: float = 20.0):
    """Poll until ``predicate()`` is truthy (readiness, never a proof of absence)."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


def write_config(root: Path, obj: dict) -> tuple[Path, config.NodeConfig]:
    path = root / "node.json"
    path.write_text(json.dumps(obj))
    return path, config.load_node_config(str(path))


# --------------------------------------------------------------------------------------- slot ads

def slot_ad(slot: str, job: str, starter_pid: int | None, host: str = "node1", domain: str = "cosched.test",
            **attrs: object) -> dict:
    """A claimed dynamic slot ``slotN_M`` running ``job`` under ``starter_pid``."""
    match = re.match(r"^slot(\d+)_\d+$", slot)
    assert match, slot
    ad = {"Name": f"{slot}@{host}@{host}.{domain}", "SlotType": "Dynamic", "State": "Claimed", "JobId": job,
          "ParentSlotId": int(match.group(1)), "RemoteUser": f"alice@{domain}", "Cpus": 1, "Memory": 512,
          "LLCWays": 0, "MemBW": 0}
    if starter_pid is not None:
        ad["StarterPid"] = starter_pid
    ad.update(attrs)
    return ad


def device_ad(slot: str, job: str, starter_pid: int | None, memory_mb: int, threads: int,
              device: str | None = None, **attrs: object) -> dict:
    extra = {"PhiMemory": memory_mb, "PhiThreads": threads}
    if device is not None:
        extra["PhiDeviceName"] = device
    return slot_ad(slot, job, starter_pid, **extra, **attrs)


def spread_ad(slot: str, job: str, starter_pid: int | None, ways: int, bw: float, program: str = "lulesh",
              scale: int = 1, nodes: int | None = None, cpus: int = 4, pin: str | None = "auto",
              **attrs: object) -> dict:
    """A socket slot's claim of a spread proc the sidecar pinned (CoSchedPin* via STARTD_JOB_ATTRS)."""
    extra: dict = {"LLCWays": ways, "MemBW": bw, "Cpus": cpus, "CoSchedProgram": program, "CoSchedPinScale": scale}
    if pin is not None:
        extra["CoSchedPinSlot"] = f"slot{slot[4:].split('_')[0]}@node1@node1.cosched.test" if pin == "auto" else pin
    if nodes is not None:
        extra["CoSchedPinNodes"] = nodes
    extra.update(attrs)
    return slot_ad(slot, job, starter_pid, **extra)


class FakeView:
    """The slot view of a startd whose claims are ``ads`` (what ``condor_status -direct
    -json`` would print); ``fail`` makes it unreachable."""

    def __init__(self, node_config: config.NodeConfig, ads: Iterable[dict] = ()) -> None:
        self.config = node_config
        self.ads: list[dict] = list(ads)
        self.fail: str | None = None
        self.reads = 0

    def read(self):
        self.reads += 1
        if self.fail:
            raise state.StateError(0, self.fail)
        return slots.parse_claims(list(self.ads), self.config)

    def drop(self, job: str) -> None:
        self.ads = [ad for ad in self.ads if ad["JobId"] != job]


def make_agent(node_config: config.NodeConfig, state_dir: Path, view, logs: list, probe=None,
               **kwargs: object) -> agent.Agent:
    """An agent on ``state_dir`` (prepared) whose starters run as this test's uid."""
    state.prepare_state_dir(str(state_dir))
    kwargs.setdefault("starter_uid", os.getuid())
    kwargs.setdefault("kill_grace_s", 3.0)
    return agent.Agent(node_config, str(state_dir), view, probe or memory_watch.SysfsProbe("/nonexistent"),
                       logs.append, **kwargs)


FAKE_CONDOR_STATUS = """#!{python}
import json, sys
with open({argv_file!r}, "a") as f:
    f.write(json.dumps(sys.argv[1:]) + "\\n")
with open({ads_file!r}) as f:
    sys.stdout.write(f.read())
"""


def fake_condor_status(root: Path, slot_ads: list) -> tuple[Path, Path, Path]:
    """(condor_status, startd address file, argv log) of a startd whose slots are ``slot_ads``."""
    (root / "ads.json").write_text(json.dumps(slot_ads))
    script = root / "condor_status"
    script.write_text(FAKE_CONDOR_STATUS.format(python=SYSTEM_PYTHON, argv_file=str(root / "argv.log"),
                                                ads_file=str(root / "ads.json")))
    script.chmod(0o755)
    address = root / "startd_address"
    address.write_text("<127.0.0.1:9618?addrs=127.0.0.1-9618&alias=node1.cosched.test>\n$CondorVersion$\n")
    return script, address, root / "argv.log"


# --------------------------------------------------------------------------------------- fake starters

class Starter:
    """One stand-in condor_starter process and its child."""

    def __init__(self, popen: subprocess.Popen) -> None:
        self.popen = popen
        self.pid = popen.pid
        self.start = 0
        self.child = 0

    def children(self) -> list[int]:
        try:
            text = Path(f"/proc/{self.pid}/task/{self.pid}/children").read_text()
        except OSError:
            return []
        return sorted(int(x) for x in text.split())

    def alive(self) -> bool:
        return procs.is_alive(self.pid, self.start)

    def child_alive(self) -> bool:
        return procs.read_proc(self.child) is not None

    def end(self) -> None:
        """The starter and its job exit (SIGKILL to its process group, by pid)."""
        if self.popen.poll() is None:
            try:
                os.killpg(self.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.popen.wait(timeout=20)

    def exit_status_of_job(self) -> str:
        """What the starter printed when its job ended (``wait``'s status: 143 = SIGTERM)."""
        out, _ = self.popen.communicate(timeout=30)
        return out.decode().strip()


class Starters:
    """Fake starters: ``bin/condor_starter`` (a copy of dash) in a world-readable temp dir, so
    that it can run as another user too. Ends every process it started, by pid."""

    def __init__(self) -> None:
        self.bin = Path(tempfile.mkdtemp(prefix="cosched-starter-"))
        os.chmod(self.bin, 0o755)
        self.exe = self.bin / "condor_starter"
        shutil.copy(DASH, self.exe)
        os.chmod(self.exe, 0o755)
        self.started: list[Starter] = []
        self.others: list[subprocess.Popen] = []

    def _spawn(self, script: str, args: Iterable[str] = (), user: int | None = None,
               stdin=subprocess.DEVNULL, env: dict | None = None) -> Starter:
        popen = subprocess.Popen([str(self.exe), "-c", script, "condor_starter", *args], stdin=stdin,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True, env=env,
                                 **({"user": user, "group": user, "extra_groups": []} if user is not None else {}))
        starter = Starter(popen)
        self.started.append(starter)
        proc = wait_for(lambda: (p := procs.read_proc(starter.pid)) and p.comm == "condor_starter" and p,
                        "the fake starter to exec")
        starter.start = proc.start
        return starter

    def job(self, job_uid: int | None = None, user: int | None = None) -> Starter:
        """A starter (run as ``user``, default this test's) whose child is the job, ``sleep``
        run as ``job_uid`` (default JOB_UID when root, else this test's uid)."""
        runs_as = os.getuid() if user is None else user
        if job_uid is None:
            job_uid = JOB_UID if IS_ROOT else runs_as
        command = "sleep 600"
        if job_uid != runs_as:
            command = f"setpriv --reuid={job_uid} --regid={job_uid} --clear-groups sleep 600"
        starter = self._spawn(f"{command} & wait $!; echo $?", user=user)

        def job_started() -> int:
            kids = starter.children()
            proc = procs.read_proc(kids[0]) if kids else None
            return proc.pid if proc and proc.comm == "sleep" and proc.uid == job_uid else 0

        starter.child = wait_for(job_started, "the fake job to start")
        return starter

    def hook(self, argv: list[str], job_ad: Path, out: Path, err: Path, env: dict | None = None) -> Starter:
        """A starter that runs ``argv`` as its direct child (environment ``env``, stdin
        ``job_ad``, stdout ``out``) once ``go()`` writes a line to it, prints the child's exit
        status, and lives on (as a starter runs its job) until its stdin closes."""
        script = 'read go; "$@" < "$JOB_AD" > "$HOOK_OUT" 2> "$HOOK_ERR"; echo $?; read done'
        env = dict(os.environ if env is None else env, JOB_AD=str(job_ad), HOOK_OUT=str(out), HOOK_ERR=str(err))
        return self._spawn(script, argv, stdin=subprocess.PIPE, env=env)

    def lookalike(self, uid: int) -> subprocess.Popen:
        """A ``sleep`` of ``uid`` under no starter (another user's, or a job's escaped process)."""
        argv = ["sleep", "600"] if uid == os.getuid() else \
            ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "sleep", "600"]
        popen = subprocess.Popen(argv, start_new_session=True)
        self.others.append(popen)
        wait_for(lambda: (p := procs.read_proc(popen.pid)) and p.comm == "sleep" and p.uid == uid, "the lookalike")
        return popen

    def close(self) -> None:
        for starter in self.started:
            try:
                starter.end()
            except (OSError, subprocess.TimeoutExpired):
                pass
        for popen in self.others:
            if popen.poll() is None:
                popen.kill()
            popen.wait(timeout=20)
        shutil.rmtree(self.bin, ignore_errors=True)


def let_go(starter: Starter) -> None:
    """Let a ``Starters.hook`` starter run its child."""
    starter.popen.stdin.write(b"go\n")
    starter.popen.stdin.flush()


def status_of(starter: Starter) -> str:
    """The exit status of a ``Starters.hook`` starter's child (the starter lives on)."""
    return starter.popen.stdout.readline().decode().strip()


def go(starter: Starter) -> str:
    """Let a ``Starters.hook`` starter run its child; the child's exit status."""
    let_go(starter)
    return status_of(starter)


# --------------------------------------------------------------------------------------- the harness's own tests

@pytest.fixture
def starters():
    s = Starters()
    yield s
    s.close()


def test_a_fake_starter_is_a_condor_starter_whose_child_is_its_job(starters: Starters):
    starter = starters.job()
    table = procs.process_table()
    assert table[starter.pid].comm == "condor_starter" and table[starter.pid].uid == os.getuid()
    assert table[starter.child].ppid == starter.pid
    jobs = procs.job_processes(starter.pid, starter.start, table)
    # as root the job runs as another user, so it is the starter's job; else it is the starter's own
    assert [p.pid for p in jobs] == ([starter.child] if IS_ROOT else [])
    starter.end()
    assert not starter.alive()


def test_a_fake_view_serves_its_ads_as_claims(tmp_path: Path):
    _, cfg = write_config(tmp_path, {"node": "node1", "domain": "cosched.test", "cores": 4, "memory_mb": 1024,
                                     "slots": [{"slot_id": 1, "kind": "device", "device": "mic0", "cores": 4,
                                                "memory_mb": 1024, "device_memory_mb": 8192,
                                                "hardware_threads": 240}]})
    view = FakeView(cfg, [device_ad("slot1_1", "3.0", 4242, 1024, 60)])
    claims, problems = view.read()
    assert problems == [] and [(c.job, c.device, c.device_memory_mb, c.compute) for c in claims] == \
        [("3.0", "mic0", 1024, 60)]
    view.fail = "condor_status -direct exited 1: no startd"
    with pytest.raises(state.StateError):
        view.read()
