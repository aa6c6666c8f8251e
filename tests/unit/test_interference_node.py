"""The node agent's interference profiles (paper 004, issue 30): a job alone on its node is
sampled from /proc and, when it ends, recorded under its owner (from the startd's claim) and
the sha256 of the binary it runs; a job that shared the node, a hostile owner name or junk in
the record tree gives no profile."""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from cosched_node import interference_duty, memory_watch, procs
from test_node_harness import FakeView, Starters, device_ad, make_agent, needs_root, wait_for, write_config

NODE = {"node": "node1", "domain": "cosched.test", "cores": 4, "memory_mb": 4096, "slots": [
    {"slot_id": 1, "kind": "device", "device": "mic0", "cores": 4, "memory_mb": 4096,
     "device_memory_mb": 8192, "hardware_threads": 240}]}


def sha256_of(path: str) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def test_counters_of_a_busy_process_grow_and_its_exe_hash_is_its_binarys():
    busy = subprocess.Popen([sys.executable, "-c", "import time\nt=time.time()\nwhile time.time()-t<5: pass"])
    try:
        first = wait_for(lambda: interference_duty.process_counters(busy.pid), "the first reading")
        time.sleep(0.3)
        second = interference_duty.process_counters(busy.pid)
        assert second["user_s"] + second["system_s"] > first["user_s"] + first["system_s"]
        assert second["peak_kib"] > 0 and second["voluntary_switches"] >= 0
        assert interference_duty.exe_sha256(busy.pid) == sha256_of(os.path.realpath(sys.executable))
        assert interference_duty.exe_sha256(busy.pid, limit=1024) is None   # too large to hash
    finally:
        busy.kill()
        busy.wait()
    assert interference_duty.process_counters(busy.pid) is None
    assert interference_duty.exe_sha256(busy.pid) is None


@pytest.mark.parametrize("remote_user, owner", [("alice@cosched.test", "alice"), ("bob", "bob"),
                                                 ("../etc@x", None), ("", None), ("a b@x", None),
                                                 ("x" * 65 + "@d", None)])
def test_the_owner_is_the_claims_remote_user_when_a_plain_name(remote_user, owner):
    assert interference_duty.owner_of(remote_user) == owner


def test_the_signals_are_per_second_of_the_alone_window():
    window = interference_duty.AloneWindow(exe="0" * 64, seconds=10.0, intervals=5, peak_kib=4 * 1024,
                                           totals={"user_s": 9.0, "system_s": 0.5, "minor_faults": 100.0,
                                                   "voluntary_switches": 20.0, "involuntary_switches": 30.0,
                                                   "sched_wait_ns": 2e9, "pressure_cpu": 5e6})
    signals = interference_duty.signals(window)
    assert signals["user_share"] == pytest.approx(0.9) and signals["system_share"] == pytest.approx(0.05)
    assert signals["perf_context_switches_per_s"] == pytest.approx(5.0)
    assert signals["sched_wait_share"] == pytest.approx(0.2) and signals["pressure_cpu"] == pytest.approx(0.5)
    assert signals["log2_peak_rss_mib"] == pytest.approx(2.0)


class Node:
    def __init__(self, root: Path, starters: Starters) -> None:
        self.config_path, self.config = write_config(root, NODE)
        self.view = FakeView(self.config)
        self.logs: list[str] = []
        self.profiles = root / "profiles"
        self.profiles.mkdir(mode=0o755)
        self.agent = make_agent(self.config, root / "state", self.view, self.logs,
                                memory_watch.FileProbe(str(root / "probe")), profile_dir=str(self.profiles))
        self.starters = starters

    def claim(self, slot: str, job: str, user: str = "alice@cosched.test"):
        starter = self.starters.job()
        self.view.ads.append(device_ad(slot, job, starter.pid, 512, 30, RemoteUser=user))
        return starter

    def intervals(self, n: int) -> None:
        for _ in range(n):
            self.agent.tick()
            time.sleep(0.05)

    def end(self, starter, job: str) -> None:
        starter.end()
        self.view.drop(job)
        self.agent.tick()


@pytest.fixture
def node(tmp_path: Path):
    starters = Starters()
    yield Node(tmp_path, starters)
    starters.close()


@needs_root
def test_a_job_alone_on_its_node_leaves_a_profile_under_its_owner_and_binary(node: Node):
    starter = node.claim("slot1_1", "12.0")
    node.intervals(interference_duty.MIN_ALONE_INTERVALS + 2)
    node.end(starter, "12.0")
    exe = sha256_of(os.path.realpath(shutil.which("sleep")))
    paths = interference_duty.records_of(str(node.profiles))
    assert paths == [str(node.profiles / "interference" / "alice" / exe / "12.0.json")]
    record = json.loads(Path(paths[0]).read_text())
    assert record["owner"] == "alice" and record["exe_sha256"] == exe and record["job"] == "12.0"
    assert record["intervals"] >= interference_duty.MIN_ALONE_INTERVALS and record["alone_s"] > 0
    assert 0 <= record["signals"]["user_share"] < 0.5   # sleep barely runs


@needs_root
def test_a_job_that_shared_the_node_or_ran_too_briefly_alone_leaves_none(node: Node):
    first = node.claim("slot1_1", "12.0")
    second = node.claim("slot1_2", "13.0")
    node.intervals(interference_duty.MIN_ALONE_INTERVALS + 2)   # side by side all along
    node.end(first, "12.0")
    node.intervals(1)                                            # 13.0 alone for one interval only
    node.end(second, "13.0")
    assert interference_duty.records_of(str(node.profiles)) == []


@needs_root
def test_a_hostile_owner_name_writes_nothing(node: Node):
    starter = node.claim("slot1_1", "12.0", user="../../etc@cosched.test")
    node.intervals(interference_duty.MIN_ALONE_INTERVALS + 2)
    node.end(starter, "12.0")
    assert not (node.profiles / "interference").exists() or interference_duty.records_of(str(node.profiles)) == []
    assert not any(p.name == "etc" for p in node.profiles.rglob("*"))


def test_records_of_lists_only_owner_hash_job_files(tmp_path: Path):
    root = tmp_path / "interference"
    good = root / "alice" / ("a" * 64)
    good.mkdir(parents=True)
    (good / "1.0.json").write_text("{}")
    (good / ".tmp.2.0.json.7").write_text("{}")
    (root / "alice" / "not-a-hash").mkdir()
    (root / "alice" / "not-a-hash" / "3.0.json").write_text("{}")
    (root / "bad owner").mkdir()
    assert interference_duty.records_of(str(tmp_path)) == [str(good / "1.0.json")]
    assert interference_duty.records_of(str(tmp_path / "missing")) == []
    assert procs.read_proc(os.getpid()) is not None


@needs_root
def test_every_running_jobs_binary_is_published_for_the_startd_cron(node: Node):
    first = node.claim("slot1_1", "12.0")
    node.claim("slot1_2", "13.0")
    node.intervals(1)
    exe = sha256_of(os.path.realpath(shutil.which("sleep")))
    published = json.loads((Path(node.agent.state_dir) / interference_duty.STATE_NAME).read_text())
    assert published["jobs"] == {"12.0": f"alice {exe}", "13.0": f"alice {exe}"}
    lines = interference_duty.published_lines(published, published["updated"] + 1, 180)
    assert lines == [f'CoSchedJobExe_12_0 = "alice {exe}"', f'CoSchedJobExe_13_0 = "alice {exe}"']
    node.end(first, "12.0")
    published = json.loads((Path(node.agent.state_dir) / interference_duty.STATE_NAME).read_text())
    assert list(published["jobs"]) == ["13.0"]


@pytest.mark.parametrize("state", [None, [], {"updated": 0, "jobs": {"1.0": "alice " + "a" * 64}},
                                   {"updated": True, "jobs": {}},
                                   {"updated": 1000, "jobs": {"1.0 = x": "alice " + "a" * 64, "2.0": "alice x",
                                                              "3.0": ["a" * 64], "4.0": "a" * 64,
                                                              "5.0": "al ice " + "a" * 64}}])
def test_a_stale_or_malformed_state_publishes_nothing(state):
    assert interference_duty.published_lines(state, 1010, 180) == []
