"""Spread (SNS) jobs on the execute node: the PREPARE_JOB hook's thread cap and its question
to the agent, the agent's resctrl groups sized from the startd's claims (LLCWays, MemBW),
piggyback run records and the next scale factor (the ``cosched_node`` package)."""

from __future__ import annotations

import io
import json
import os
import subprocess
from pathlib import Path

import pytest
from cosched_node import ads, environment, errors, perf, prepare_job, resctrl, runs
from test_node_harness import (HOOKS, JOB_UID, SYSTEM_PYTHON, FakeView, Starter, Starters, make_agent, needs_root,
                               spread_ad, write_config)

NODE = {"node": "node1", "domain": "cosched.test", "cores": 20, "memory_mb": 9216, "slots": [
    {"slot_id": 1, "kind": "socket", "cache_id": 0, "cores": 8, "memory_mb": 4096, "llc_ways": 11,
     "mem_bw_gbs": 50.0},
    {"slot_id": 2, "kind": "socket", "cache_id": 1, "cores": 8, "memory_mb": 4096, "llc_ways": 11,
     "mem_bw_gbs": 50.0},
    {"slot_id": 3, "kind": "device", "device": "mic0", "cores": 4, "memory_mb": 1024,
     "device_memory_mb": 8192, "hardware_threads": 240}]}
PIN1 = "slot1@node1@node1.cosched.test"


def spread_job(cluster: int = 10, program: object = "lulesh", cpus: object = 4, ways: object = 4,
               bw: object = 10.0, scale: object = 1, pin: object = PIN1, nodes: object = None,
               extra: str = "", proc: int = 0) -> str:
    def value(v: object) -> str:
        return f'"{v}"' if isinstance(v, str) else str(v)
    lines = [f"ClusterId = {cluster}", f"ProcId = {proc}", 'Owner = "alice"', f"RequestCpus = {cpus}"]
    if program is not None:
        lines.append(f"CoSchedProgram = {value(program)}")
    for attr, v in (("CoSchedPinSlot", pin), ("CoSchedPinLLCWays", ways), ("CoSchedPinMemBW", bw),
                    ("CoSchedPinScale", scale), ("CoSchedPinNodes", nodes)):
        if v is not None:
            lines.append(f"{attr} = {value(v)}")
    return "\n".join(lines + ([extra] if extra else [])) + "\n"


class Node:
    def __init__(self, root: Path, starters: Starters) -> None:
        self.root = root
        self.config_path, self.config = write_config(root, NODE)
        self.state = root / "state"
        self.resctrl = root / "resctrl"
        self.profiles = root / "profiles"
        self.profiles.mkdir()                 # the agent program makes it (agent.build)
        self.view = FakeView(self.config)
        self.logs: list[str] = []
        self.starters = starters
        self.asked: list[str] = []
        self.counter = 0
        self.agent = self.new_agent()

    def new_agent(self, manager: bool = True, **kwargs: object):
        mgr = resctrl.ResctrlManager(str(self.resctrl), log=self.logs.append) if manager else None
        return make_agent(self.config, self.state, self.view, self.logs, manager=mgr,
                          profile_dir=str(self.profiles), **kwargs)

    def make_resctrl(self, closids: int = 8, mba: bool = True) -> None:
        """A directory laid out as resctrl is (11 ways on caches 0 and 1), and a manager on it."""
        (self.resctrl / "info" / "L3").mkdir(parents=True)
        (self.resctrl / "info" / "L3" / "cbm_mask").write_text("7ff\n")
        (self.resctrl / "info" / "L3" / "min_cbm_bits").write_text("1\n")
        (self.resctrl / "info" / "L3" / "num_closids").write_text(f"{closids}\n")
        if mba:
            (self.resctrl / "info" / "MB").mkdir(parents=True)
            (self.resctrl / "info" / "MB" / "min_bandwidth").write_text("10\n")
            (self.resctrl / "info" / "MB" / "bandwidth_gran").write_text("10\n")
        (self.resctrl / "schemata").write_text("L3:0=7ff;1=7ff\nMB:0=100;1=100\n")
        (self.resctrl / "tasks").write_text("")
        self.agent = self.new_agent()

    def claim(self, slot: str, job: str, ways: int = 4, bw: float = 10.0, **kwargs: object) -> Starter:
        """The startd claims socket slot ``slot`` for a spread proc and starts its starter."""
        job_uid = kwargs.pop("job_uid", None)
        starter = self.starters.job(job_uid=job_uid)
        self.view.ads.append(spread_ad(slot, job, starter.pid, ways, bw, **kwargs))
        return starter

    def end(self, starter: Starter) -> None:
        starter.end()
        self.view.ads = [ad for ad in self.view.ads if ad["StarterPid"] != starter.pid]

    def prepare(self, job_ad: str, slot: str = "slot1_1", starter: Starter | None = None) -> tuple[int, dict]:
        self.counter += 1
        machine = self.root / f"machine{self.counter}.ad"
        machine.write_text(f'Name = "{slot}@node1@node1.cosched.test"\n')
        hook_args = ["--node-config", str(self.config_path), "--state-dir", str(self.state)]
        env = {"_CONDOR_MACHINE_AD": str(machine)}

        def ask(state_dir: str) -> dict:
            self.asked.append(state_dir)
            assert starter is not None, "the hook asked the agent"
            return self.agent.answer(starter.child, JOB_UID)

        out = io.StringIO()
        code = prepare_job.main(hook_args, stdin=io.BytesIO(job_ad.encode()), stdout=out, env=env, ask=ask)
        return code, ads.parse_classad(out.getvalue(), "hook output")

    def log(self) -> str:
        return "\n".join(self.logs)

    def schemata(self, group: str) -> str:
        return (self.resctrl / f"cosched_{group}" / "schemata").read_text()

    def tasks(self, group: str) -> list[int]:
        return [int(x) for x in (self.resctrl / f"cosched_{group}" / "tasks").read_text().split()]

    def groups(self) -> list[str]:
        return sorted(p.name for p in self.resctrl.iterdir() if p.name.startswith("cosched_"))

    def record(self, program: str, job: str) -> dict:
        return json.loads((self.profiles / "runs" / program / f"{job}.json").read_text())


@pytest.fixture
def node(tmp_path: Path):
    starters = Starters()
    yield Node(tmp_path, starters)
    starters.close()


def env_of(out: dict) -> dict:
    return dict(environment.parse_environment_v2(ads.ad_get(out, "Environment")))


def group(cluster: int) -> str:
    """The resctrl group of a cluster's procs run by the job user."""
    return f"{cluster}-uid{JOB_UID}"


# --------------------------------------------------------------------------------------- the hook

def test_spread_job_gets_its_thread_cap_and_the_agent_records_its_claim(node: Node):
    starter = node.claim("slot1_3", "10.0", ways=4, bw=12.5, scale=2, nodes=4, cpus=6)
    # the job ad's pin attributes are validated, but the agent keeps what the startd allocated
    code, out = node.prepare(spread_job(10, cpus=6, ways=11, bw=12.5, scale=2, nodes=4,
                                        extra='Environment = "FOO=bar"'), "slot1_3", starter)
    assert code == errors.EXIT_OK and node.asked == [str(node.state)]
    assert env_of(out) == {"FOO": "bar", "OMP_NUM_THREADS": "6"}
    (record,) = node.agent.records.values()
    assert record.is_spread and not record.is_device and record.starter_pid == starter.pid
    claim = record.claim
    assert (claim.job, claim.slot, claim.slot_id, claim.llc_ways, claim.mem_bw_gbs, claim.program, claim.scale,
            claim.nodes, claim.cpus) == ("10.0", "slot1_3", 1, 4, 12.5, "lulesh", 2, 4, 6)
    assert [r["claim"]["job"] for r in json.loads((node.state / "jobs.json").read_text())] == ["10.0"]
    assert node.agent.answer(starter.child, JOB_UID) == {"status": "ok", "kind": "socket", "slot": "slot1_3",
                                                         "llc_ways": 4, "mem_bw_gbs": 12.5}


def test_unpinned_spread_jobs_run_without_asking_and_other_jobs_get_nothing(node: Node):
    code, out = node.prepare(spread_job(12, cpus=3, ways=None, bw=None, scale=None, pin=None), "slot1_1")
    assert code == 0 and env_of(out) == {"OMP_NUM_THREADS": "3"}
    # a job without CoSchedProgram on a socket slot is not ours
    assert node.prepare(spread_job(13, program=None), "slot1_2") == (0, {})
    assert node.asked == [] and node.agent.records == {}


def test_a_pinned_spread_job_without_a_claim_goes_back_to_idle(node: Node):
    stranger = node.starters.job()
    code, out = node.prepare(spread_job(10), "slot1_1", stranger)
    assert code == errors.EXIT_NO_STATE and ads.ad_get(out, "HookStatusCode") == 305
    assert "the startd reports no claim for starter" in ads.ad_get(out, "HookStatusMessage")


@pytest.mark.parametrize("job_ad, slot, why", [
    (spread_job(program="../etc"), "slot1_1", "CoSchedProgram = '../etc' is not a program name"),
    (spread_job(program=".."), "slot1_1", "CoSchedProgram = '..' is not a program name"),
    (spread_job(program="a" * 65), "slot1_1", "is not a program name"),
    (spread_job(program=7), "slot1_1", "CoSchedProgram = 7 is not a program name"),
    (spread_job(ways=10 ** 30), "slot1_1", "CoSchedPinLLCWays = huge is outside [0, 11]"),
    (spread_job(ways=12), "slot1_1", "CoSchedPinLLCWays = 12 is outside [0, 11]"),
    (spread_job(ways=-1), "slot1_1", "CoSchedPinLLCWays = -1 is outside [0, 11]"),
    (spread_job(ways=2.5), "slot1_1", "CoSchedPinLLCWays = 2.5 is not a"),
    (spread_job(ways="4; rm -rf /"), "slot1_1", "CoSchedPinLLCWays = '4; rm -rf /' is not a number"),
    (spread_job(bw=-3.5), "slot1_1", "CoSchedPinMemBW = -3.5 is outside [0, 50]"),
    (spread_job(bw=1e300), "slot1_1", "CoSchedPinMemBW = 1e+300 is outside [0, 50]"),
    (spread_job(bw="RequestCpus * 2"), "slot1_1", "CoSchedPinMemBW"),
    (spread_job(scale=3), "slot1_1", "CoSchedPinScale = 3 is not one of (1, 2, 4, 8)"),
    (spread_job(scale=16), "slot1_1", "CoSchedPinScale = 16 is outside"),
    (spread_job(scale=None), "slot1_1", "CoSchedPinScale = None is not a number"),
    (spread_job(nodes=-1), "slot1_1", "CoSchedPinNodes = -1 is outside"),
    (spread_job(cpus=10 ** 30), "slot1_1", "RequestCpus = huge"),
    (spread_job(pin="slot1@node2@node2.cosched.test"), "slot1_1", "CoSchedPinSlot names another node"),
    (spread_job(pin="slot1@node1@node1.evil.test"), "slot1_1", "CoSchedPinSlot names another node"),
    (spread_job(pin="slot1@node1/../x"), "slot1_1", "CoSchedPinSlot is not slotN@host"),
    (spread_job(pin="slot2@node1@node1.cosched.test"), "slot1_1", "names slot2, but the job runs in slot1_1"),
    (spread_job(pin="slot3@node1@node1.cosched.test"), "slot3_1", None),   # a device slot: device rules
    (spread_job(pin=5), "slot1_1", "CoSchedPinSlot is not a string"),
])
def test_hostile_spread_values_are_held_with_a_reason(node: Node, capsys, job_ad, slot, why):
    code, out = node.prepare(job_ad, slot)
    assert node.asked == [] and node.agent.records == {}
    assert "Traceback" not in capsys.readouterr().err
    if why is None:
        # on a device slot a job without RequestPhiMemory gets nothing
        assert (code, out) == (0, {})
        return
    # held with the reason in HoldReason (HookStatusCode 4 < 300)
    assert code == errors.EXIT_BAD_AD and ads.ad_get(out, "HookStatusCode") == errors.EXIT_BAD_AD
    message = ads.ad_get(out, "HookStatusMessage")
    assert message.startswith("condor_sched: malformed job or machine ad: ") and why in message, message


def test_more_cpus_than_the_socket_is_an_inconsistent_ad(node: Node):
    code, out = node.prepare(spread_job(cpus=9))
    assert code == errors.EXIT_BAD_AD
    assert "RequestCpus 9 > the 8 cores of slot1" in ads.ad_get(out, "HookStatusMessage")


def test_a_proc_with_no_ways_of_its_own_starts(node: Node):
    # MG's 3 ways over 4 procs on one socket: one proc's share is 0 (it uses its job's group)
    starter = node.claim("slot1_4", "10.0", ways=0)
    code, out = node.prepare(spread_job(10, ways=0), "slot1_4", starter)
    assert code == errors.EXIT_OK and env_of(out) == {"OMP_NUM_THREADS": "4"}
    assert [r.claim.llc_ways for r in node.agent.records.values()] == [0]


def test_spread_hook_under_the_system_python(node: Node):
    machine = node.root / "m.ad"
    machine.write_text('Name = "slot1_1@node1@node1.cosched.test"\n')
    hook_args = ["--node-config", str(node.config_path), "--state-dir", str(node.state)]
    env = {"_CONDOR_MACHINE_AD": str(machine), "PATH": "/usr/bin:/bin"}
    hook = [SYSTEM_PYTHON, "-Es", str(HOOKS / "cosched_prepare_job.py"), *hook_args]
    unpinned = subprocess.run(hook, input=spread_job(cpus=2, pin=None).encode(), env=env, capture_output=True,
                              timeout=60)
    assert unpinned.returncode == 0 and unpinned.stderr == b"", unpinned.stderr
    assert env_of(ads.parse_classad(unpinned.stdout))["OMP_NUM_THREADS"] == "2"
    # a pinned one must reach the agent: none listens here
    pinned = subprocess.run(hook, input=spread_job(cpus=2).encode(), env=env, capture_output=True, timeout=60)
    assert pinned.returncode == errors.EXIT_NO_STATE and b"Traceback" not in pinned.stderr
    assert ads.ad_get(ads.parse_classad(pinned.stdout), "HookStatusCode") == 305


# --------------------------------------------------------------------------------------- the agent

def test_group_shares_sum_a_jobs_ways_per_cache_bounded_by_the_socket():
    def share(ways: int, group: str = "10-uid2001", cache: int = 0, bw: float = 5.0) -> resctrl.ProcShare:
        return resctrl.ProcShare(group, cache, ways, bw, 11, 50.0)

    mg = [share(1), share(1), share(1), share(0)]          # MG's w = 3 ways over its 4 procs on socket 0
    assert resctrl.group_shares(mg) == ({"10-uid2001": {0: 3}}, {"10-uid2001": {0: 40}})
    # another group (another cluster or another uid) is sized on its own
    assert resctrl.group_shares(mg + [share(2, "10-uid2002")])[0] == {"10-uid2001": {0: 3}, "10-uid2002": {0: 2}}
    # 3 procs x 5 ways on an 11-way socket: the group gets the socket's 11 ways; one proc on cache 1
    wide = [share(5), share(5), share(5), share(4, cache=1)]
    assert resctrl.group_shares(wide)[0] == {"10-uid2001": {0: 11, 1: 4}}
    # no proc with a way (compact-share plans none): no group, its procs run ungrouped
    assert resctrl.group_shares([share(0), share(0)]) == ({}, {})
    # unknown socket totals: no bound, no bandwidth percentage
    assert resctrl.group_shares([resctrl.ProcShare("g", 0, 70, 5.0, 0, 0.0)]) == ({"g": {0: 70}}, {})


@needs_root
def test_resctrl_groups_follow_the_claims_give_away_reclaim_and_removal(node: Node):
    node.make_resctrl()
    a = node.claim("slot1_1", "10.0", ways=4, bw=10.0)
    node.agent.tick()
    # alone on cache 0: its 4 ways plus the 7 unallocated ones; MBA 10/50 GB/s = 20 %
    assert node.schemata(group(10)) == "L3:0=7ff;1=400\nMB:0=20\n"
    assert node.tasks(group(10)) == [a.child]
    node.agent.tick()
    assert node.tasks(group(10)) == [a.child]                      # no task written twice

    b = node.claim("slot1_2", "11.0", ways=3, bw=20.0)
    node.agent.tick()
    # 4 + 3 asked, 4 spare reclaimed and shared equally: 10.0 has 6 ways, 11.0 has 5 after them
    assert node.schemata(group(10)) == "L3:0=3f;1=400\nMB:0=20\n"
    assert node.schemata(group(11)) == "L3:0=7c0;1=400\nMB:0=40\n"
    assert node.tasks(group(11)) == [b.child]

    node.end(a)
    node.agent.tick()
    assert not (node.resctrl / f"cosched_{group(10)}").exists()
    assert node.schemata(group(11)) == "L3:0=7ff;1=400\nMB:0=40\n"     # its ways given away again
    node.end(b)
    node.agent.tick()
    assert sorted(p.name for p in node.resctrl.iterdir()) == ["info", "schemata", "tasks"]
    assert (node.resctrl / "schemata").read_text() == "L3:0=7ff;1=7ff\nMB:0=100;1=100\n"
    assert f"job {group(10)}: resctrl group cosched_{group(10)} created" in node.log()
    assert f"job {group(10)}: resctrl group cosched_{group(10)} removed (job ended)" in node.log()
    # both ran, but not alone on their socket slot: the records say so
    assert node.record("lulesh", "10.0")["exclusive"] is False
    assert node.record("lulesh", "11.0")["exclusive"] is False
    assert node.agent.records == {}


@needs_root
def test_a_jobs_procs_on_one_cache_share_one_group_of_the_sum_of_their_claims_ways(node: Node):
    node.make_resctrl()
    # MG's w = 3 ways over its 4 procs on socket 0: the startd allocated 1, 1, 1, 0 LLCWays
    procs = [node.claim(f"slot1_{p + 1}", f"10.{p}", ways=ways, bw=7.25, cpus=1)
             for p, ways in enumerate((1, 1, 1, 0))]
    node.claim("slot1_5", "11.0", ways=4, bw=10.0, cpus=2)
    node.agent.tick()
    # asked 3 + 4 of 11 ways; the 4 spare ones shared equally (name order): 5 and 6 ways
    assert node.schemata(group(10)) == "L3:0=1f;1=400\nMB:0=60\n"       # 4 x 7.25 GB/s = 58% of 50
    assert node.schemata(group(11)) == "L3:0=7e0;1=400\nMB:0=20\n"
    assert node.tasks(group(10)) == sorted(p.child for p in procs)
    assert node.groups() == [f"cosched_{group(10)}", f"cosched_{group(11)}"]
    node.end(procs[0])
    node.agent.tick()
    # 2 + 4 asked, 5 spare: 3 of them to the group; 3 x 7.25 GB/s = 44% of 50, MBA step 10
    assert node.schemata(group(10)) == "L3:0=1f;1=400\nMB:0=50\n"
    for p in procs[1:3]:
        node.end(p)
    node.agent.tick()
    # the proc left has no way of its own (HTCondor accounts it none): no group, it runs
    # in the default group as an unpinned job does
    assert node.groups() == [f"cosched_{group(11)}"]
    assert node.schemata(group(11)) == "L3:0=7ff;1=400\nMB:0=20\n"
    assert procs[3].child_alive()


@needs_root
def test_jobs_on_two_sockets_get_masks_on_their_own_cache_ids_and_run_exclusive(node: Node):
    node.make_resctrl()
    a = node.claim("slot1_1", "10.0", ways=2)
    b = node.claim("slot2_1", "11.0", ways=5)
    node.agent.tick()
    assert node.schemata(group(10)) == "L3:0=7ff;1=400\nMB:0=20\n"
    assert node.schemata(group(11)) == "L3:0=400;1=7ff\nMB:1=20\n"
    node.end(a)
    node.end(b)
    node.agent.tick()
    # different socket slots: each ran alone on its own
    assert node.record("lulesh", "10.0")["exclusive"] is True
    assert node.record("lulesh", "11.0")["exclusive"] is True
    assert node.groups() == []


@needs_root
def test_closids_exhausted_leaves_the_newcomer_ungrouped_with_a_logged_reason(node: Node):
    node.make_resctrl(closids=2)           # the default group + one
    a = node.claim("slot1_1", "10.0")
    b = node.claim("slot1_2", "11.0")
    node.agent.tick()
    assert node.groups() == [f"cosched_{group(10)}"]
    assert f"job {group(11)} runs ungrouped: no CLOSID left" in node.log()
    node.end(a)
    node.agent.tick()                      # a CLOSID is free again: the waiting job gets it
    assert node.groups() == [f"cosched_{group(11)}"]
    assert node.tasks(group(11)) == [b.child]


@needs_root
def test_absent_resctrl_is_logged_and_jobs_still_run_and_get_records(node: Node):
    a = node.claim("slot1_1", "10.0", program="hpcg", scale=4, nodes=2)
    node.agent.tick()
    assert "resctrl absent at" in node.log() and not node.resctrl.exists()
    assert a.child_alive()
    node.end(a)
    node.agent.tick()
    record = node.record("hpcg", "10.0")
    assert record["scale_factor"] == 4 and record["nodes"] == 2 and record["exclusive"] is True
    assert record["alloc_llc_ways"] == 4 and record["alloc_mem_bw_gbs"] == 10.0 and record["slot"] == "slot1_1"


def test_a_claim_whose_starter_runs_no_job_process_gets_no_group_and_no_exclusive_record(node: Node):
    node.make_resctrl()
    # the starter's only child runs as the starter's own uid: no job process to group or measure
    a = node.claim("slot1_1", "10.0", ways=11, job_uid=os.getuid())
    node.agent.tick()
    assert node.groups() == []
    node.end(a)
    node.agent.tick()
    assert node.record("lulesh", "10.0")["exclusive"] is False


def test_an_unpinned_claim_or_one_without_a_program_writes_no_run_record(node: Node):
    plain = node.claim("slot1_1", "10.0", pin=None)
    nameless = node.claim("slot1_2", "11.0", program="../x")
    node.agent.tick()
    assert not any(r.is_spread for r in node.agent.records.values())
    node.end(plain)
    node.end(nameless)
    node.agent.tick()
    assert not (node.profiles / "runs").exists()


FAKE_PERF = """#!{python}
import sys
args = sys.argv[1:]
assert args[:3] == ["stat", "-x", ","], args
if "-a" in args:
    sys.stderr.write("512.00,MiB,uncore_imc/cas_count_read/,100,100.00,,\\n"
                     "256.00,MiB,uncore_imc/cas_count_write/,100,100.00,,\\n")
else:
    assert "-p" in args and args[args.index("-p") + 1].replace(",", "").isdigit(), args
    sys.stderr.write("3000000,,instructions:u,100,100.00,,\\n2000000,,cycles:u,100,100.00,,\\n"
                     "<not supported>,,cycles,0,100.00,,\\n")
"""


@needs_root
def test_exclusive_run_is_recorded_with_perf_ipc_and_bandwidth(node: Node):
    node.make_resctrl()
    fake = node.root / "perf"
    fake.write_text(FAKE_PERF.format(python=SYSTEM_PYTHON))
    fake.chmod(0o755)
    node.agent = node.new_agent(perf=perf.PerfSampler(str(fake), 0.1, node.logs.append))
    a = node.claim("slot1_1", "10.0", ways=5, bw=12.5, scale=1, nodes=3, cpus=8)
    node.agent.tick()
    node.agent.tick()
    node.end(a)
    node.agent.tick()
    record = node.record("lulesh", "10.0")
    assert record["exclusive"] is True and record["scale_factor"] == 1 and record["nodes"] == 3
    assert record["program"] == "lulesh" and record["job"] == "10.0" and record["node"] == "node1"
    assert record["cpus"] == 8 and record["alloc_llc_ways"] == 5 and record["alloc_mem_bw_gbs"] == 12.5
    assert record["cache_id"] == 0 and record["slot"] == "slot1_1"
    assert 0 <= record["runtime_s"] < 120 and record["end"] >= record["start"]
    assert record["ipc"] == 1.5 and record["perf_samples"] == 2
    assert record["bandwidth_gbs"] == pytest.approx(768 * 1048576 / 0.1 / 1e9, rel=1e-3)
    assert runs.validate_record(record)["exclusive"] is True
    assert runs.load_records(str(node.profiles), "lulesh")[0]["runtime_s"] == record["runtime_s"]
    assert runs.next_scale_to_try(runs.load_records(str(node.profiles), "lulesh")) == 2
    assert "job 10.0: run record" in node.log()


def test_perf_csv_parsing():
    text = ("1000,,cpu_core/instructions/,1,100.00,,\n500,,cpu_core/cycles/,1,100.00,,\n"
            "200,,cpu_atom/instructions/,1,100.00,,\n100,,cpu_atom/cycles/,1,100.00,,\n"
            "<not counted>,,ref-cycles,0,0,,\n7,,stalled-cycles-frontend,1,100,,\n")
    assert perf.parse_perf_csv(text) == {"instructions": 1200.0, "cycles": 600.0}
    assert perf.parse_perf_csv("garbage\n,,,\nnan,,instructions\n-5,,cycles,,\n") == {}


def test_run_records_refuse_hostile_names_and_damaged_files(tmp_path: Path):
    good = {"version": 1, "program": "lulesh", "job": "1.0", "scale_factor": 2, "runtime_s": 5.0, "exclusive": True}
    runs.write_run_record(str(tmp_path), good)
    for bad in ({**good, "program": "../x"}, {**good, "job": "1.0/../../x"}):
        with pytest.raises(ValueError):
            runs.write_run_record(str(tmp_path), bad)
    (tmp_path / "runs" / "lulesh" / "2.0.json").write_bytes(b"\xff{")
    (tmp_path / "runs" / "lulesh" / "3.0.json").write_text(json.dumps({**good, "scale_factor": 3}))
    assert [r["scale_factor"] for r in runs.load_records(str(tmp_path), "lulesh")] == [2]
    with pytest.raises(ValueError):
        runs.load_records(str(tmp_path), "..")


# --------------------------------------------------------------------------------------- next scale

def run(scale: int, runtime: float, exclusive: bool = True, program: str = "lulesh") -> dict:
    return {"program": program, "scale_factor": scale, "runtime_s": runtime, "exclusive": exclusive}


def test_next_scale_walks_up_while_spreading_pays():
    assert runs.next_scale_to_try([]) == 1
    assert runs.next_scale_to_try([run(1, 100.0)]) == 2
    assert runs.next_scale_to_try([run(1, 100.0), run(2, 80.0)]) == 4
    # 4 was not faster than 2 by more than 5 %: spreading stopped paying
    assert runs.next_scale_to_try([run(1, 100.0), run(2, 80.0), run(4, 77.0)]) is None
    assert runs.best_scale([run(1, 100.0), run(2, 80.0), run(4, 77.0)]) == 4
    assert runs.next_scale_to_try([run(1, 100.0), run(2, 80.0), run(4, 70.0)]) == 8
    assert runs.next_scale_to_try([run(1, 100.0), run(2, 80.0), run(4, 70.0), run(8, 50.0)]) is None
    # 2 slower than 1: stop at once; best stays 1
    assert runs.next_scale_to_try([run(1, 100.0), run(2, 120.0)]) is None
    assert runs.best_scale([run(1, 100.0), run(2, 120.0)]) == 1


def test_next_scale_uses_only_valid_exclusive_records_of_the_program():
    records = [run(1, 100.0), run(2, 50.0, exclusive=False), run(2, 90.0, program="other"),
               {"program": "lulesh", "scale_factor": 3, "runtime_s": 1.0, "exclusive": True},
               {"program": "lulesh", "scale_factor": 2, "runtime_s": -1.0, "exclusive": True},
               {"program": "../x", "scale_factor": 2, "runtime_s": 10.0, "exclusive": True},
               "junk", None]
    assert runs.next_scale_to_try(records, program="lulesh") == 2
    # the median of repeated runs decides: 2 -> (70, 90, 200) median 90 is faster than 100 by 10 %
    more = [run(1, 100.0), run(2, 70.0), run(2, 90.0), run(2, 200.0)]
    assert runs.next_scale_to_try(more) == 4
    assert runs.next_scale_to_try(more + [run(2, 99.0), run(2, 98.0)]) is None   # median 98: < 5 %
