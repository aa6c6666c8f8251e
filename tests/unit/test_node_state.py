"""The node agent's state dir (issue 10): root's own, so that no job can fill it, plant in it
or hold its lock; the world-writable layout of earlier versions is removed at start."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import tempfile
from pathlib import Path

import pytest
from cosched_node import agent, channel, errors, state
from test_node_harness import JOB_UID, SYSTEM_PYTHON, fake_condor_status, needs_root, write_config

NODE = {"node": "node1", "domain": "cosched.test", "cores": 8, "memory_mb": 4096, "slots": [
    {"slot_id": 1, "kind": "device", "device": "mic0", "cores": 4, "memory_mb": 1024,
     "device_memory_mb": 8192, "hardware_threads": 240}]}


def writable_by_others(root: Path) -> list[str]:
    """Every entry under ``root`` (itself included) that group or others may write, or that is
    not owned by this test's user."""
    found = []
    for path in [root, *root.rglob("*")]:
        info = os.lstat(path)
        if info.st_mode & 0o022 or info.st_uid != os.geteuid():
            found.append(f"{path.relative_to(root)} {stat.filemode(info.st_mode)}")
    return found


def legacy_layout(state_dir: Path, outside: Path) -> None:
    """What versions before issue 10 left, and what jobs put there."""
    requests = state_dir / "requests"
    requests.mkdir(parents=True)
    os.chmod(requests, 0o1777)
    (requests / "10.0.slot2_1.json").write_text('{"memory_mb": 8192}')
    (requests / "x").mkdir()                                    # the IsADirectoryError attack
    (requests / "victim.json").symlink_to(outside / "precious")
    (state_dir / "hooks.log").write_text("old log\n")
    os.chmod(state_dir / "hooks.log", 0o622)
    (state_dir / "lock").write_text("")
    os.chmod(state_dir / "lock", 0o644)
    (state_dir / "spread").mkdir()
    (state_dir / "spread" / "10.0.json").write_text("{}")


def test_a_prepared_state_dir_has_no_entry_others_can_write(tmp_path: Path):
    state_dir = tmp_path / "state"
    state.prepare_state_dir(str(state_dir))
    assert sorted(p.name for p in state_dir.iterdir()) == ["devices", "killed"]
    assert writable_by_others(state_dir) == []
    state.prepare_state_dir(str(state_dir))                      # again: nothing changes
    assert writable_by_others(state_dir) == []


def test_legacy_world_writable_leftovers_are_removed(tmp_path: Path):
    state_dir, outside = tmp_path / "state", tmp_path / "outside"
    outside.mkdir()
    (outside / "precious").write_text("keep me")
    legacy_layout(state_dir, outside)
    (state_dir / "devices").mkdir()
    os.chmod(state_dir / "devices", 0o777)
    state.prepare_state_dir(str(state_dir))
    assert sorted(p.name for p in state_dir.iterdir()) == ["devices", "killed"]
    assert writable_by_others(state_dir) == []
    assert (outside / "precious").read_text() == "keep me"       # a symlink in requests/ is not followed


def test_a_legacy_name_that_is_a_symlink_is_removed_not_followed(tmp_path: Path):
    state_dir, outside = tmp_path / "state", tmp_path / "outside"
    (outside / "requests").mkdir(parents=True)
    (outside / "requests" / "keep").write_text("x")
    state_dir.mkdir()
    (state_dir / "requests").symlink_to(outside / "requests")
    state.prepare_state_dir(str(state_dir))
    assert not os.path.lexists(state_dir / "requests") and (outside / "requests" / "keep").exists()


@pytest.mark.parametrize("unsafe", ["group-writable", "world-writable", "a symlink", "a file"])
def test_an_unsafe_state_dir_is_refused(tmp_path: Path, unsafe: str):
    path = tmp_path / "state"
    if unsafe == "a symlink":
        (tmp_path / "real").mkdir()
        path.symlink_to(tmp_path / "real")
    elif unsafe == "a file":
        path.write_text("")
    else:
        path.mkdir()
        os.chmod(path, 0o775 if unsafe == "group-writable" else 0o777)
    with pytest.raises(OSError):
        state.prepare_state_dir(str(path))


def test_a_subdir_that_is_a_symlink_is_refused(tmp_path: Path):
    state_dir = tmp_path / "state"
    state_dir.mkdir()
    (tmp_path / "elsewhere").mkdir()
    (state_dir / "killed").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(errors.StateError, match="is not our directory"):
        state.prepare_state_dir(str(state_dir))


def test_the_lock_is_the_agents_alone_and_a_second_agent_exits_5(tmp_path: Path, capsys):
    config_path, _ = write_config(tmp_path, NODE)
    state_dir = tmp_path / "state"
    state.prepare_state_dir(str(state_dir))
    lock = state.AgentLock(str(state_dir))
    lock.acquire()
    try:
        info = os.stat(state_dir / "agent.lock")
        assert stat.S_IMODE(info.st_mode) == 0o600 and info.st_uid == os.geteuid()
        with pytest.raises(errors.StateError, match="another node agent runs"):
            state.AgentLock(str(state_dir)).acquire()
        script, address, _ = fake_condor_status(tmp_path, [])
        args = ["--node-config", str(config_path), "--state-dir", str(state_dir), "--startd-address-file",
                str(address), "--condor-status", str(script), "--probe", "sysfs", "--perf", "", "--once"]
        capsys.readouterr()
        assert agent.main(args) == errors.EXIT_NO_STATE
        assert "another node agent runs" in capsys.readouterr().err
        assert not (state_dir / "agent.heartbeat").exists()
    finally:
        lock.release()
    # once the first agent is gone, the next one runs
    assert agent.main(args) == errors.EXIT_OK
    assert (state_dir / "agent.heartbeat").exists()


def test_a_lock_file_that_is_not_a_plain_file_is_refused(tmp_path: Path):
    state_dir = tmp_path / "state"
    state.prepare_state_dir(str(state_dir))
    (state_dir / "agent.lock").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(OSError):
        state.AgentLock(str(state_dir)).acquire()
    assert not (tmp_path / "elsewhere").exists()


def test_after_an_agent_run_only_the_socket_is_writable_by_others(tmp_path: Path):
    config_path, _ = write_config(tmp_path, NODE)
    state_dir = tmp_path / "state"
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "precious").write_text("keep me")
    legacy_layout(state_dir, outside)
    script, address, _ = fake_condor_status(tmp_path, [])
    assert agent.main(["--node-config", str(config_path), "--state-dir", str(state_dir), "--startd-address-file",
                       str(address), "--condor-status", str(script), "--probe", "sysfs", "--perf", "",
                       "--once"]) == 0
    assert writable_by_others(state_dir) == ["agent.sock srw-rw-rw-"]
    assert sorted(p.name for p in state_dir.iterdir()) == ["agent.heartbeat", "agent.lock", "agent.log",
                                                          "agent.sock", "devices", "interference.json", "jobs.json",
                                                          "killed"]
    assert json.loads((state_dir / "devices" / "mic0.json").read_text())["jobs"] == []


def test_a_stale_socket_is_replaced_and_a_planted_file_refused(tmp_path: Path):
    state_dir = tmp_path / "state"
    state.prepare_state_dir(str(state_dir))
    channel.listen(str(state_dir)).close()                        # left by an agent that died
    server = channel.listen(str(state_dir))
    server.close()
    os.unlink(state_dir / "agent.sock")
    (state_dir / "agent.sock").write_text("")
    with pytest.raises(errors.StateError, match="is not a socket"):
        channel.listen(str(state_dir))


@needs_root
def test_a_job_user_can_neither_lock_nor_fill_nor_plant_in_the_state_dir():
    base = Path(tempfile.mkdtemp(prefix="cosched-state-"))
    try:
        os.chmod(base, 0o755)                                     # reachable by the job user, as /var/lib is
        state_dir = base / "state"
        state.prepare_state_dir(str(state_dir))
        lock = state.AgentLock(str(state_dir))
        lock.acquire()
        attacks = f"""
import fcntl, os, sys
d = {str(state_dir)!r}
results = []
for what, attempt in [
        ("open the lock", lambda: os.open(os.path.join(d, "agent.lock"), os.O_RDONLY)),
        ("mkdir requests", lambda: os.mkdir(os.path.join(d, "requests"))),
        ("plant jobs.json", lambda: os.open(os.path.join(d, ".tmp.jobs.json.1"), os.O_WRONLY | os.O_CREAT)),
        ("fill devices", lambda: os.open(os.path.join(d, "devices", "mic0.json"), os.O_WRONLY | os.O_CREAT)),
        ("fill killed", lambda: os.mkdir(os.path.join(d, "killed", "x")))]:
    try:
        attempt()
        results.append(what + ": done")
    except PermissionError:
        results.append(what + ": refused")
print("\\n".join(results))
"""
        run = subprocess.run([SYSTEM_PYTHON, "-c", attacks], capture_output=True, timeout=60, user=JOB_UID,
                             group=JOB_UID, extra_groups=[])
        assert run.returncode == 0, run.stderr
        assert run.stdout.decode().split("\n")[:5] == [
            "open the lock: refused", "mkdir requests: refused", "plant jobs.json: refused",
            "fill devices: refused", "fill killed: refused"]
        lock.release()
    finally:
        shutil.rmtree(base, ignore_errors=True)
