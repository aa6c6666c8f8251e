"""The node agent trusts only what no job can write (issue 10): the startd's claims, /proc and
its root-only state dir.

- it answers a caller only when the caller's parent is the starter (run by the starter uid)
  of a claim the startd reports, and records nothing for anyone else;
- device jobs get compute units disjoint from their live co-runners', or a refusal (code 3)
  when the claims' allocations exceed the device;
- its records survive a restart: live starters keep their placements, dead ones are dropped;
- a device job whose probe reads more than its CLAIM's allocation is stopped, and only the
  processes of that job;
- ``slots.parse_claims`` keeps the claimed dynamic slots and names every ad it skips;
- on its world-writable socket, callers that trickle bytes, send too much or never read
  delay no other caller, and each connection is closed within one total deadline.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import stat
import threading
import time
from pathlib import Path

import pytest
from cosched_node import agent, channel, config, errors, hook_server, jobs, memory_watch, slots, state
from test_node_harness import (JOB_UID, OTHER_UID, FakeView, Starters, device_ad, fake_condor_status, make_agent,
                               needs_root, slot_ad, spread_ad, wait_for, write_config)

NODE = {"node": "node1", "domain": "cosched.test", "cores": 16, "memory_mb": 8192, "slots": [
    {"slot_id": 1, "kind": "socket", "cache_id": 0, "cores": 8, "memory_mb": 4096, "llc_ways": 11,
     "mem_bw_gbs": 50.0},
    {"slot_id": 2, "kind": "device", "device": "mic0", "cores": 4, "memory_mb": 1024,
     "device_memory_mb": 8192, "hardware_threads": 240},
    {"slot_id": 3, "kind": "device", "device": "mic1", "cores": 4, "memory_mb": 1024,
     "device_memory_mb": 8192, "hardware_threads": 240}]}


class Node:
    def __init__(self, root: Path, starters: Starters) -> None:
        self.root = root
        self.config_path, self.config = write_config(root, NODE)
        self.state = root / "state"
        self.probe = root / "probe"
        self.view = FakeView(self.config)
        self.logs: list[str] = []
        self.starters = starters
        self.agent = self.new_agent()

    def new_agent(self, **kwargs: object):
        """An agent (a restart, when one ran before) on this node's state dir."""
        self.logs = []
        return make_agent(self.config, self.state, self.view, self.logs, memory_watch.FileProbe(str(self.probe)),
                          **kwargs)

    def claim(self, slot: str, job: str, memory_mb: int, threads: int, **starter_kwargs: object):
        starter = self.starters.job(**starter_kwargs)
        self.view.ads.append(device_ad(slot, job, starter.pid, memory_mb, threads))
        return starter

    def ask(self, starter, uid: int | None = None) -> dict:
        return self.agent.answer(starter.child, os.getuid() if uid is None else uid)

    def reading(self, device: str, job: str, mb: int) -> None:
        (self.probe / device).mkdir(parents=True, exist_ok=True)
        (self.probe / device / job).write_text(f"{mb}\n")

    def units(self) -> dict:
        return {r.claim.job: r.units for r in self.agent.records.values()}

    def log(self) -> str:
        return "\n".join(self.logs)


@pytest.fixture
def node(tmp_path: Path):
    starters = Starters()
    yield Node(tmp_path, starters)
    starters.close()


REFUSED_NOT_A_HOOK = {"status": "refused", "code": errors.EXIT_NO_STATE,
                      "message": "the caller is not a job's PREPARE_JOB hook (its parent is no starter)"}


# --------------------------------------------------------------------------------------- who may ask

def test_a_caller_whose_parent_is_not_a_starter_is_refused_and_nothing_is_recorded(node: Node):
    node.claim("slot2_1", "10.0", 8192, 240)
    assert node.agent.answer(os.getpid(), os.getuid()) == REFUSED_NOT_A_HOOK
    # the job's own child (a grandchild of the starter) is no hook either
    nested = node.starters._spawn("sh -c 'sleep 600 & wait' & wait")
    node.view.ads.append(device_ad("slot2_2", "11.0", nested.pid, 100, 4))
    shell = wait_for(nested.children, "the job (a shell)")[0]
    grandchild = Path(f"/proc/{shell}/task/{shell}/children")
    pid = wait_for(lambda: grandchild.exists() and grandchild.read_text().split(), "the job's child")[0]
    assert node.agent.answer(int(pid), os.getuid()) == REFUSED_NOT_A_HOOK
    assert node.agent.records == {} and not (node.state / "jobs.json").exists()
    assert "start refused (caller pid" in node.log() and "its parent is no starter" in node.log()


def test_a_process_named_condor_starter_run_by_another_uid_is_no_starter(node: Node):
    # the agent expects starters of another uid than the one running this fake (as root, the
    # real thing below: a job user's copy of dash named condor_starter)
    node.agent = node.new_agent(starter_uid=os.getuid() + 1)
    forged = node.claim("slot2_1", "10.0", 8192, 240)
    assert node.ask(forged) == REFUSED_NOT_A_HOOK
    node.agent.tick()
    assert node.agent.records == {} and json.loads((node.state / "jobs.json").read_text()) == []


@needs_root
def test_a_job_users_fake_starter_named_in_a_claim_gets_nothing_and_the_honest_job_the_whole_device(node: Node):
    forged = node.claim("slot2_1", "10.0", 8192, 240, user=JOB_UID)
    assert node.ask(forged, JOB_UID) == REFUSED_NOT_A_HOOK
    node.agent.tick()
    assert node.agent.records == {}
    honest = node.claim("slot2_2", "11.0", 8192, 240)
    assert node.ask(honest, JOB_UID) == {"status": "ok", "kind": "device", "device": "mic0", "slot": "slot2_2",
                                         "memory_mb": 8192, "compute": 240, "units": [[0, 240]]}


def test_a_starter_the_startd_reports_no_claim_for_is_refused(node: Node):
    node.claim("slot2_1", "10.0", 100, 4)
    stranger = node.starters.job()
    reply = node.ask(stranger)
    assert reply == {"status": "refused", "code": errors.EXIT_NO_STATE,
                     "message": f"the startd reports no claim for starter {stranger.pid}"}
    assert node.view.reads == 3                     # asked the startd again before refusing
    assert [r.claim.job for r in node.agent.records.values()] == ["10.0"]


def test_each_caller_learns_only_its_own_claims_placement(node: Node):
    first = node.claim("slot2_1", "10.0", 1000, 60)
    second = node.claim("slot3_1", "11.0", 2000, 8)
    assert node.ask(second)["device"] == "mic1" and node.ask(first)["device"] == "mic0"
    assert node.ask(second) == {"status": "ok", "kind": "device", "device": "mic1", "slot": "slot3_1",
                                "memory_mb": 2000, "compute": 8, "units": [[0, 8]]}


# --------------------------------------------------------------------------------------- placement

def test_two_starts_on_one_device_get_disjoint_units_and_an_overfull_one_is_refused(node: Node):
    first = node.ask(node.claim("slot2_1", "10.0", 4000, 100))
    second = node.ask(node.claim("slot2_2", "11.0", 2000, 100))
    assert (first["units"], second["units"]) == ([[0, 100]], [[100, 200]])
    # the startd's claims say 4000 + 2000 + 3000 MB of an 8192 MB device: refused, readable
    refused = node.claim("slot2_3", "12.0", 3000, 8)
    assert node.ask(refused) == {
        "status": "refused", "code": errors.EXIT_OVERSUBSCRIBED,
        "message": "device node1/mic0 (slot2_3) is full: device memory 6000+3000 MB > 8192 MB on mic0"}
    refused.end()                   # its starter exits, the startd drops the claim
    node.view.drop("12.0")
    fourth = node.ask(node.claim("slot2_4", "13.0", 100, 41))
    assert fourth["code"] == errors.EXIT_OVERSUBSCRIBED and "device PhiThreads 200+41 > 240 on mic0" in \
        fourth["message"]
    assert {job: units for job, units in node.units().items() if units} == {"10.0": ((0, 100),),
                                                                           "11.0": ((100, 200),)}
    assert "job 12.0: start refused" in node.log()


def test_a_device_claim_without_device_memory_is_refused_as_a_bad_ad(node: Node):
    reply = node.ask(node.claim("slot2_1", "10.0", 0, 4))
    assert reply["status"] == "refused" and reply["code"] == errors.EXIT_BAD_AD
    assert "RequestPhiMemory is 0" in reply["message"]
    assert node.units() == {"10.0": None}


# --------------------------------------------------------------------------------------- restart

def test_placements_survive_an_agent_restart_and_dead_starters_are_dropped(node: Node):
    ended = node.claim("slot2_1", "10.0", 1000, 60)
    live = node.claim("slot2_2", "11.0", 1000, 60)
    assert node.ask(ended)["units"] == [[0, 60]] and node.ask(live)["units"] == [[60, 120]]
    info = os.stat(node.state / "jobs.json")
    assert info.st_uid == os.geteuid() and stat.S_IMODE(info.st_mode) == 0o644
    ended.end()
    node.view.drop("10.0")
    node.agent = node.new_agent()                 # the agent restarts
    assert node.units() == {"10.0": ((0, 60),), "11.0": ((60, 120),)}
    node.agent.tick()
    assert node.units() == {"11.0": ((60, 120),)}
    assert "job 10.0 on mic0 ended: units 0-59 released" in node.log()
    # the live job keeps its units: a newcomer of 180 threads gets the rest around them
    assert node.ask(node.claim("slot2_3", "12.0", 1000, 180))["units"] == [[0, 60], [120, 240]]
    assert node.ask(live)["units"] == [[60, 120]]
    node.agent = node.new_agent()
    assert node.units() == {"11.0": ((60, 120),), "12.0": ((0, 60), (120, 240))}


def test_a_restart_drops_a_starter_that_died_while_the_agent_was_down(node: Node):
    ended = node.claim("slot2_1", "10.0", 1000, 240)
    assert node.ask(ended)["units"] == [[0, 240]]
    ended.end()
    node.view.drop("10.0")
    node.agent = node.new_agent()
    # no tick yet: the newcomer's question reconciles first, so the dead job's units are free
    assert node.ask(node.claim("slot2_2", "11.0", 1000, 240))["units"] == [[0, 240]]


def test_unreadable_job_records_are_dropped_with_a_reason(node: Node):
    state.write_json_atomic(str(node.state), "jobs.json", [{"claim": {"slot": "slot2_1"}}, "junk"])
    node.agent = node.new_agent()
    assert node.agent.records == {}
    assert sum("job record dropped" in line for line in node.logs) == 2


# --------------------------------------------------------------------------------------- memory watch

def process_state(pid: int) -> str:
    """The state letter of ``pid`` in /proc (T: stopped)."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


@needs_root
def test_a_device_job_over_its_claims_allocation_is_stopped_and_nothing_else_is_signalled(node: Node):
    # both jobs run as the same user; the stopped one is the one over ITS claim's allocation
    over = node.claim("slot2_1", "30.0", 1024, 60)
    within = node.claim("slot2_2", "31.0", 2048, 60)
    elsewhere = node.claim("slot3_1", "32.0", 1024, 60)
    same_user = node.starters.lookalike(JOB_UID)            # the job user's process under no starter
    other_user = node.starters.lookalike(OTHER_UID)
    for job in (over, within, elsewhere):
        node.ask(job, JOB_UID)
    node.reading("mic0", "30.0", 1500)
    node.reading("mic0", "31.0", 1500)                      # more than 30.0's, within its own 2048
    node.reading("mic1", "32.0", 1000)
    published = node.agent.tick()
    assert process_state(over.child) == "T"                 # stopped at once, for the startd to hold it
    assert within.child_alive() and elsewhere.child_alive() and within.alive() and elsewhere.alive()
    assert process_state(within.child) != "T" and process_state(elsewhere.child) != "T"
    assert same_user.poll() is None and other_user.poll() is None
    killed = json.loads((node.state / "killed" / "30.0.json").read_text())
    assert killed["pids"] == [over.child] and killed["device"] == "mic0" and killed["slot"] == "slot2_1"
    assert killed["reason"] == "device memory use 1500 MB on mic0 exceeds its allocation of 1024 MB"
    assert f"job 30.0 stopped: {killed['reason']} (signalled pids [{over.child}]); the startd holds it" in node.log()
    assert not (node.state / "killed" / "31.0.json").exists()
    mic0 = published["mic0"]
    assert mic0 == json.loads((node.state / "devices" / "mic0.json").read_text())
    assert mic0["allocated_mb"] == 3072 and mic0["used_mb"] == 3000 and mic0["allocated_threads"] == 120
    assert [(j["job"], j["killed"] is not None) for j in mic0["jobs"]] == [("30.0", True), ("31.0", False)]
    node.agent.tick()                                       # within its hold grace: still only stopped
    assert process_state(over.child) == "T"
    # No hold came (a node without config.d/20's policy): after the grace the agent kills it.
    node.agent.hold_grace_s = 0
    node.agent.tick()
    assert over.exit_status_of_job() == "143"               # SIGTERM, then SIGCONT to act on it
    assert "not held within 0 s of its stop (is config.d/20-cosched-startd.conf installed?): ended" in node.log()
    assert within.child_alive()


@needs_root
def test_a_stopped_job_whose_claim_the_startd_releases_is_ended_at_once(node: Node):
    """The startd holds a stopped job by vacating its claim; the starter's SIGTERM would wait
    while the job is stopped, so the agent resumes and ends it as soon as the claim is gone."""
    over = node.claim("slot2_1", "30.0", 1024, 60)
    node.ask(over, JOB_UID)
    node.reading("mic0", "30.0", 1500)
    node.agent.tick()
    assert process_state(over.child) == "T"
    node.view.ads[:] = [ad for ad in node.view.ads if ad.get("JobId") != "30.0"]     # the startd let go of it
    node.agent.tick()
    assert over.exit_status_of_job() == "143"
    assert "job 30.0: its claim released (the startd holds it): ended" in node.log()


def test_the_watch_signals_no_process_of_the_starters_own_user(node: Node):
    # the job runs as the starter's uid (root's own processes, or a starter run as the job
    # user): nothing of the starter's uid is ever signalled
    starter = node.claim("slot2_1", "30.0", 100, 4, job_uid=os.getuid())
    node.ask(starter)
    node.reading("mic0", "30.0", 5000)
    node.agent.tick()
    assert starter.child_alive() and starter.alive()
    # nothing was stopped, so nothing is recorded as killed: the next interval tries again
    assert not (node.state / "killed" / "30.0.json").exists()
    assert any("over its allocation, but no process of it to stop" in line for line in node.logs)


def test_an_unreachable_startd_keeps_the_last_known_claims_enforced(node: Node):
    starter = node.claim("slot2_1", "30.0", 1024, 60)
    node.ask(starter)
    node.view.fail = "condor_status -direct exited 1: connection refused"
    node.agent.tick()
    node.agent.tick()
    assert sum("slot view unavailable: condor_status -direct exited 1" in line for line in node.logs) == 1
    assert list(node.units()) == ["30.0"]
    node.reading("mic0", "30.0", 2000)
    node.agent.tick()
    assert (node.state / "killed" / "30.0.json").exists()
    starter.end()
    node.agent.tick()                               # a dead starter is dropped without the startd
    assert node.units() == {}


# --------------------------------------------------------------------------------------- the slot view

def test_claimed_dynamic_slots_become_claims():
    cfg = config.parse_node_config(NODE)
    ads = [device_ad("slot2_1", "10.0", 4242, 2048, 60, device="mic0", Cpus=2, Memory=1024),
           spread_ad("slot1_3", "11.2", 4343, ways=4, bw=12.5, program="lulesh", scale=2, nodes=4, cpus=6),
           slot_ad("slot1_4", "12.0", 4444, CoSchedProgram="../x", CoSchedPinScale=3, CoSchedPinNodes=-1)]
    claims, problems = slots.parse_claims(ads, cfg)
    assert problems == []
    device, spread, plain = claims
    assert device == slots.Claim("slot2_1", 2, "10.0", 4242, "alice@cosched.test", 2, 1024, "mic0", 2048, 60, 0, 0.0,
                                 None, False, 0, 0)
    assert spread == slots.Claim("slot1_3", 1, "11.2", 4343, "alice@cosched.test", 6, 512, None, 0, 0, 4, 12.5,
                                 "lulesh", True, 2, 4)
    assert (spread.cluster, spread.proc) == (11, 2)
    # labels that break the rules are dropped, never the claim
    assert (plain.program, plain.pinned, plain.scale, plain.nodes) == (None, False, 0, 0)


def test_unclaimed_partitionable_and_starterless_ads_are_ignored_silently():
    cfg = config.parse_node_config(NODE)
    ads = [{**device_ad("slot2_1", "10.0", 4242, 100, 4), "State": "Unclaimed"},
           {**slot_ad("slot2_1", "10.0", 4242), "SlotType": "Partitionable", "Name": "slot2@node1@node1.cosched.test"},
           device_ad("slot2_2", "11.0", None, 100, 4),
           "not an ad", None]
    assert slots.parse_claims(ads, cfg) == ([], [])
    with pytest.raises(ValueError):
        slots.parse_claims({"Name": "slot2_1@node1"}, cfg)


@pytest.mark.parametrize("change, why", [
    ({"Name": "slot2@node1@node1.cosched.test"}, "Name is not a dynamic slot name"),
    ({"Name": "../slot2_1@node1"}, "Name is not a dynamic slot name"),
    ({"Name": 7}, "Name is not a dynamic slot name"),
    ({"JobId": "10"}, "JobId is not ClusterId.ProcId"),
    ({"JobId": "10.0; rm -rf /"}, "JobId is not ClusterId.ProcId"),
    ({"JobId": 10.0}, "JobId is not ClusterId.ProcId"),
    ({"StarterPid": "4242"}, "StarterPid"),
    ({"StarterPid": 1}, "StarterPid = 1 is outside"),
    ({"StarterPid": 2 ** 40}, "StarterPid"),
    ({"StarterPid": True}, "StarterPid"),
    ({"StarterPid": 4242.5}, "StarterPid = 4242.5 is not a"),
    ({"ParentSlotId": 3}, "ParentSlotId does not match the slot's name"),
    ({"ParentSlotId": "2"}, "ParentSlotId"),
    ({"PhiDeviceName": "mic1"}, "PhiDeviceName 'mic1' is not slot2's device mic0"),
    ({"PhiDeviceName": "../mic0"}, "is not slot2's device mic0"),
    ({"PhiThreads": 2.5}, "PhiThreads = 2.5 is not a"),
    ({"PhiThreads": -1}, "PhiThreads = -1 is outside"),
    ({"PhiMemory": 10 ** 12 + 1}, "PhiMemory = 1000000000001 is outside"),
    ({"PhiMemory": 1e300}, "PhiMemory = huge is outside"),
    ({"PhiMemory": "8192"}, "PhiMemory = '8192' is not a number"),
    ({"LLCWays": 65}, "LLCWays = 65 is outside"),
    ({"MemBW": -1.0}, "MemBW = -1 is outside"),
    ({"Cpus": 1.5}, "Cpus = 1.5 is not a"),
    ({"Memory": 10 ** 30}, "Memory = huge is outside"),
])
def test_malformed_or_hostile_slot_ads_are_skipped_with_a_reason_naming_the_ad(change, why):
    cfg = config.parse_node_config(NODE)
    good = device_ad("slot2_2", "11.0", 4343, 100, 4)
    bad = {**device_ad("slot2_1", "10.0", 4242, 100, 4), **change}
    claims, problems = slots.parse_claims([bad, good], cfg)
    assert [c.job for c in claims] == ["11.0"]
    assert len(problems) == 1 and problems[0].startswith(f"slot ad #0 ({str(bad['Name'])[:80]!r}): ")
    assert why in problems[0], problems[0]


def test_skipped_slot_ads_are_logged_by_the_agent(node: Node):
    node.view.ads.append({**device_ad("slot2_1", "10.0", 4242, 100, 4), "JobId": "x"})
    node.agent.tick()
    assert "slot ad ignored: slot ad #0 ('slot2_1@node1@node1.cosched.test'): JobId is not ClusterId.ProcId" \
        in node.log()


def test_the_slot_view_asks_the_startd_directly(tmp_path: Path):
    _, cfg = write_config(tmp_path, NODE)
    script, address, argv_log = fake_condor_status(tmp_path, [device_ad("slot2_1", "10.0", 4242, 100, 4),
                                                              {**device_ad("slot2_2", "11.0", 4343, 100, 4),
                                                               "JobId": None}])
    claims, problems = slots.SlotView(cfg, str(address), str(script)).read()
    assert [c.job for c in claims] == ["10.0"] and len(problems) == 1
    argv = json.loads(argv_log.read_text())
    assert argv[:3] == ["-direct", address.read_text().splitlines()[0], "-json"]
    assert argv[-2:] == ["-constraint", 'SlotType == "Dynamic"']


@pytest.mark.parametrize("what", ["no address", "exit 1", "not json", "too deep"])
def test_a_startd_that_does_not_answer_is_a_state_error(tmp_path: Path, what: str):
    _, cfg = write_config(tmp_path, NODE)
    script, address, _ = fake_condor_status(tmp_path, [])
    if what == "no address":
        address.write_text("garbage\n")
    elif what == "exit 1":
        script.write_text("#!/bin/sh\necho 'ERROR: failed to connect' >&2\nexit 1\n")
    elif what == "not json":
        (tmp_path / "ads.json").write_text("[{")
    else:
        (tmp_path / "ads.json").write_text("[" * 100000 + "]" * 100000)
    view = slots.SlotView(cfg, str(address), str(script))
    with pytest.raises(errors.StateError) as caught:
        view.read()
    if what == "exit 1":
        assert "exited 1: ERROR: failed to connect" in str(caught.value)


def test_a_startd_answer_that_is_no_list_leaves_the_agent_enforcing(node: Node, tmp_path: Path):
    starter = node.claim("slot2_1", "30.0", 1024, 60)
    node.ask(starter)
    script, address, _ = fake_condor_status(tmp_path, [])
    (tmp_path / "ads.json").write_text('{"Name": "slot2_1@node1@node1.cosched.test"}')
    node.agent.view = slots.SlotView(node.config, str(address), str(script))
    node.agent.tick()
    assert "slot view unavailable" in node.log() and (node.state / "agent.heartbeat").exists()
    assert list(node.units()) == ["30.0"]


def test_records_of_the_view_round_trip_through_jobs_json(node: Node):
    starter = node.claim("slot2_1", "10.0", 1000, 60)
    node.ask(starter)
    records, problems = jobs.load(str(node.state))
    assert problems == [] and [r.to_json() for r in records.values()] == \
        [r.to_json() for r in node.agent.records.values()]


# --------------------------------------------------------------------------------------- the socket

@pytest.fixture
def serving(tmp_path: Path):
    """The agent's main loop (``agent.serve``) on a real socket in a thread; the socket's path."""
    _, node_config = write_config(tmp_path, NODE)
    the_agent = make_agent(node_config, tmp_path / "state", FakeView(node_config), [])
    listener = channel.listen(str(tmp_path / "state"))
    stopping: list[int] = []
    thread = threading.Thread(target=agent.serve, args=(the_agent, listener, stopping, False), daemon=True)
    thread.start()
    yield str(tmp_path / "state" / state.SOCKET_NAME)
    stopping.append(signal.SIGTERM)
    thread.join(timeout=10)
    listener.close()
    assert not thread.is_alive()


def accepted_client(path: str) -> socket.socket:
    """A caller that sent one byte and holds the first byte of its reply: the agent accepted it."""
    client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    client.settimeout(10)
    client.connect(path)
    client.send(b"{")
    assert client.recv(1) == b"{"
    return client


#: A slow caller's pace: each byte comes before a per-read timeout of the old agent ran out.
TRICKLE_GAP_S = 0.1


class Trickler(threading.Thread):
    """A caller that connects, then sends one byte every TRICKLE_GAP_S and never reads, until
    the agent closes its connection (``open_s``: how long it stayed open, from its connect)."""

    def __init__(self, path: str) -> None:
        super().__init__(daemon=True)
        self.client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.client.connect(path)        # queued, answered or not: the agent sees it either way
        self.began = time.monotonic()
        self.open_s: float | None = None

    def run(self) -> None:
        with self.client:
            while time.monotonic() - self.began < 60:
                try:
                    self.client.send(b"x")
                except OSError:
                    self.open_s = time.monotonic() - self.began
                    return
                time.sleep(TRICKLE_GAP_S)


def test_callers_trickling_bytes_delay_no_other_caller_and_are_cut_off_at_one_total_deadline(serving: str):
    slow = [Trickler(serving) for _ in range(16)]
    for trickler in slow:
        trickler.start()
    began = time.monotonic()
    reply = channel.ask(str(Path(serving).parent), timeout_s=60)
    latency = time.monotonic() - began
    assert reply == REFUSED_NOT_A_HOOK          # answered (this test process is no hook)
    # connected after 16 slow callers, yet served before any of their deadlines could pass
    assert latency < hook_server.CONNECTION_DEADLINE_S, latency
    for trickler in slow:
        trickler.join(timeout=60)
    # every trickled byte is read, yet no connection outlives its one total deadline (plus a round)
    open_s = [t.open_s for t in slow]
    assert None not in open_s and max(open_s) < hook_server.CONNECTION_DEADLINE_S + hook_server.POLL_S + 0.5, open_s


class StubServer:
    """A ``HookServer`` answering every caller with its pid, polled in a thread."""

    def __init__(self, path: Path, **kwargs: object) -> None:
        self.listener = channel.listen(str(path))
        self.server = hook_server.HookServer(self.listener, lambda pid, uid: {"status": "ok", "pid": pid},
                                             lambda message: None, **kwargs)
        self.peak = 0
        self.stopping = False
        self.thread = threading.Thread(target=self.loop, daemon=True)
        self.thread.start()
        self.path = str(path / state.SOCKET_NAME)

    def loop(self) -> None:
        while not self.stopping:
            self.server.poll(0.05)
            self.peak = max(self.peak, len(self.server.open))

    def stop(self) -> None:
        self.stopping = True
        self.thread.join(timeout=10)
        self.server.close_all()
        self.listener.close()


def rest_of_reply(client: socket.socket) -> dict:
    """The reply of an ``accepted_client``, whose first byte it read already."""
    data = b"{"
    while chunk := client.recv(4096):
        data += chunk
    return json.loads(data)


def test_more_callers_than_connections_all_get_their_reply_and_the_oldest_give_way(tmp_path: Path):
    stub = StubServer(tmp_path, max_connections=4)
    try:
        clients = [accepted_client(stub.path) for _ in range(10)]    # none reads on nor closes
        for client in clients:
            assert rest_of_reply(client)["pid"] == os.getpid()
    finally:
        stub.stop()
    assert stub.peak <= 4


def test_a_caller_sending_more_than_a_request_may_hold_gets_its_reply_then_is_cut_off(tmp_path: Path):
    stub = StubServer(tmp_path, deadline_s=30.0)
    client = accepted_client(stub.path)
    sent = 0
    try:
        with pytest.raises(OSError):            # the agent closes on the byte past the bound
            while sent <= 4 * hook_server.MAX_REQUEST_BYTES:
                sent += client.send(b"x" * 4096)
    finally:
        client.close()
        stub.stop()
    assert hook_server.MAX_REQUEST_BYTES < sent <= 4 * hook_server.MAX_REQUEST_BYTES
