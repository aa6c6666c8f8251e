"""The PREPARE_JOB hook and the node agent over the real Unix socket.

The agent's serve loop runs in a thread on a temp state dir, with a slot view that serves
the claims the test adds. Each start is a fake starter (a process whose comm is
condor_starter) running ``/usr/bin/python3 -Es node_hooks/cosched_prepare_job.py`` as its
direct child, with the job ad on stdin, as a real starter runs the hook; the claim names the
fake starter's pid."""

from __future__ import annotations

import os
import signal
import threading
from pathlib import Path

import pytest
from cosched_node import ads, agent, channel, environment, errors, placement
from test_node_harness import (HOOKS, SYSTEM_PYTHON, FakeView, Starters, device_ad, go, let_go, make_agent, spread_ad,
                               status_of, write_config)

NODE = {"node": "node1", "domain": "cosched.test", "cores": 12, "memory_mb": 6144, "slots": [
    {"slot_id": 1, "kind": "socket", "cache_id": 0, "cores": 4, "memory_mb": 4096, "llc_ways": 11,
     "mem_bw_gbs": 50.0},
    {"slot_id": 2, "kind": "device", "device": "mic0", "cores": 4, "memory_mb": 1024,
     "device_memory_mb": 8192, "hardware_threads": 240}]}
HOOK = [SYSTEM_PYTHON, "-Es", str(HOOKS / "cosched_prepare_job.py")]


class Node:
    def __init__(self, root: Path, starters: Starters) -> None:
        self.root = root
        self.config_path, self.config = write_config(root, NODE)
        self.state = root / "state"
        self.view = FakeView(self.config)
        self.logs: list[str] = []
        self.agent = make_agent(self.config, self.state, self.view, self.logs)
        self.server = channel.listen(str(self.state))
        self.stopping: list[int] = []
        self.thread = threading.Thread(target=agent.serve, args=(self.agent, self.server, self.stopping, False),
                                       daemon=True)
        self.thread.start()
        self.starters = starters
        self.counter = 0

    def stop(self) -> None:
        self.stopping.append(signal.SIGTERM)
        self.thread.join(timeout=10)
        self.server.close()
        assert not self.thread.is_alive()

    def start(self, slot: str, job_ad: str, claim=device_ad, **claim_args: object):
        """A starter for ``slot`` whose hook is ready to run, and its files (out, err)."""
        self.counter += 1
        n = self.counter
        (self.root / f"job{n}.ad").write_text(job_ad)
        (self.root / f"machine{n}.ad").write_text(f'Name = "{slot}@node1@node1.cosched.test"\n')
        hook_args = ["--node-config", str(self.config_path), "--state-dir", str(self.state)]
        env = {"_CONDOR_MACHINE_AD": str(self.root / f"machine{n}.ad"), "PATH": "/usr/bin:/bin"}
        out, err = self.root / f"out{n}", self.root / f"err{n}"
        starter = self.starters.hook(HOOK + hook_args, self.root / f"job{n}.ad", out, err, env)
        job = ads.ad_get(ads.parse_classad(job_ad), "ClusterId")
        self.view.ads.append(claim(slot, f"{job}.0", starter.pid, **claim_args))
        return starter, out, err


@pytest.fixture
def node(tmp_path: Path):
    starters = Starters()
    n = Node(tmp_path, starters)
    yield n
    n.stop()
    starters.close()


def job(cluster: int, threads: int = 60, memory: int = 2048, extra: str = "") -> str:
    return (f'ClusterId = {cluster}\nProcId = 0\nOwner = "alice"\nRequestPhiThreads = {threads}\n'
            f"RequestPhiMemory = {memory}\n{extra}")


def test_the_hook_prints_the_placement_the_agent_made_for_its_starters_claim(node: Node):
    starter, out, err = node.start("slot2_1", job(10, extra='Environment = "FOO=bar"\n'),
                                   memory_mb=2048, threads=60)
    assert go(starter) == "0", err.read_text()
    assert err.read_text() == ""
    printed = ads.parse_classad(out.read_text())
    record = next(iter(node.agent.records.values()))
    assert (record.starter_pid, record.claim.job) == (starter.pid, "10.0")
    assert record.uid == (os.getuid() or None)            # the hook's uid, from the socket (root's is not kept)
    assert ads.ad_get(printed, "CoSchedDeviceUnits") == placement.format_ranges(record.units) == "0-59"
    assert ads.ad_get(printed, "CoSchedDevice") == "mic0" and ads.ad_get(printed, "CoSchedDeviceCores") == "0-14"
    env = dict(environment.parse_environment_v2(ads.ad_get(printed, "Environment")))
    assert env["FOO"] == "bar" and env["OMP_NUM_THREADS"] == "60"
    assert env["MIC_KMP_AFFINITY"] == "granularity=fine,explicit,proclist=[1-60]"
    # a second start on the device: units disjoint from the first's
    second, out2, _ = node.start("slot2_2", job(11, threads=8), memory_mb=100, threads=8)
    assert go(second) == "0"
    assert ads.ad_get(ads.parse_classad(out2.read_text()), "CoSchedDeviceUnits") == "60-67"


def test_concurrent_starts_on_one_device_never_overlap(node: Node):
    # 6 x 40 threads fill a 240-thread device: the hooks run at once, the agent answers one
    # at a time, every job gets 10 whole cores of its own
    started = [node.start(f"slot2_{i + 1}", job(60 + i, threads=40, memory=100), memory_mb=100, threads=40)
               for i in range(6)]
    for starter, _, _ in started:
        let_go(starter)
    units = []
    for starter, out, err in started:
        assert status_of(starter) == "0", err.read_text()
        units.append(ads.ad_get(ads.parse_classad(out.read_text()), "CoSchedDeviceUnits"))
    assert sorted(units, key=lambda r: int(r.split("-")[0])) == [f"{c}-{c + 39}" for c in range(0, 240, 40)]
    placed = sorted(u for r in node.agent.records.values() for u in r.units)
    assert placed == [(c, c + 40) for c in range(0, 240, 40)]


def test_a_hook_whose_starter_has_no_claim_goes_back_to_idle(node: Node):
    starter, out, _ = node.start("slot2_1", job(10), memory_mb=2048, threads=60)
    node.view.ads.clear()                  # the startd reports no claim of this starter
    assert go(starter) == str(errors.EXIT_NO_STATE)
    printed = ads.parse_classad(out.read_text())
    assert ads.ad_get(printed, "HookStatusCode") == 305
    assert f"the startd reports no claim for starter {starter.pid}" in ads.ad_get(printed, "HookStatusMessage")
    assert node.agent.records == {}


def test_a_pinned_spread_job_is_announced_and_an_unpinned_one_is_not(node: Node):
    spread = 'ClusterId = 20\nProcId = 0\nRequestCpus = 3\nCoSchedProgram = "lulesh"\n' \
             'CoSchedPinSlot = "slot1@node1@node1.cosched.test"\nCoSchedPinLLCWays = 4\nCoSchedPinMemBW = 10.0\n' \
             'CoSchedPinScale = 2\n'
    starter, out, err = node.start("slot1_1", spread, claim=spread_ad, ways=4, bw=10.0, cpus=3, scale=2)
    assert go(starter) == "0", err.read_text()
    printed = ads.parse_classad(out.read_text())
    assert dict(environment.parse_environment_v2(ads.ad_get(printed, "Environment"))) == {"OMP_NUM_THREADS": "3"}
    assert [(r.claim.job, r.is_spread, r.claim.llc_ways) for r in node.agent.records.values()] == \
        [("20.0", True, 4)]
    unpinned = 'ClusterId = 21\nProcId = 0\nRequestCpus = 2\nCoSchedProgram = "lulesh"\n'
    starter, out, _ = node.start("slot1_2", unpinned, claim=spread_ad, ways=0, bw=0.0, pin=None)
    node.view.ads.pop()                    # never asked: the startd's claim does not matter
    assert go(starter) == "0"
    assert "OMP_NUM_THREADS=2" in ads.ad_get(ads.parse_classad(out.read_text()), "Environment")


def test_a_process_that_is_no_hook_gets_a_refusal_over_the_socket(node: Node):
    reply = channel.ask(str(node.state), timeout_s=30)
    assert reply == {"status": "refused", "code": errors.EXIT_NO_STATE,
                     "message": "the caller is not a job's PREPARE_JOB hook (its parent is no starter)"}
