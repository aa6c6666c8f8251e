"""Spread (SNS) jobs on the execute node: PREPARE_JOB request, the agent's resctrl groups,
piggyback run records and the next scale factor (node_hooks/, stdlib only)."""

from __future__ import annotations

import io
import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

HOOKS = Path(__file__).resolve().parents[2] / "node_hooks"
sys.path.insert(0, str(HOOKS))

import cosched_node as cn  # noqa: E402
import cosched_node_agent as agent  # noqa: E402
import cosched_prepare_job as hook  # noqa: E402
import cosched_profile_record as pr  # noqa: E402

SYSTEM_PYTHON = shutil.which("python3", path="/usr/bin:/bin") or sys.executable
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
    def __init__(self, root: Path) -> None:
        self.root = root
        self.config = root / "node1.json"
        self.config.write_text(json.dumps(NODE))
        self.state = root / "state"
        agent.prepare_state_dir(str(self.state))
        self.resctrl = root / "resctrl"
        self.profiles = root / "profiles"
        self.counter = 0
        self.children: list[subprocess.Popen] = []

    def make_resctrl(self, closids: int = 8, mba: bool = True) -> Path:
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
        return self.resctrl

    def starter(self, name: str) -> tuple[subprocess.Popen, Path]:
        """A stand-in condor_starter (sh) whose child (sleep) is the job, in its own session."""
        scratch = self.root / "execute" / name
        scratch.mkdir(parents=True)
        proc = subprocess.Popen(["sh", "-c", "sleep 60 & wait"], env=dict(os.environ, _CONDOR_SCRATCH_DIR=str(scratch)),
                                start_new_session=True)
        self.children.append(proc)
        return proc, scratch

    def end(self, proc: subprocess.Popen) -> None:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()

    def prepare(self, job_ad: str, slot: str = "slot1_1", starter: subprocess.Popen | None = None,
                scratch: Path | None = None) -> tuple[int, dict]:
        self.counter += 1
        machine = self.root / f"machine{self.counter}.ad"
        machine.write_text(f'Name = "{slot}@node1@node1.cosched.test"\n')
        env = {"COSCHED_NODE_CONFIG": str(self.config), "COSCHED_STATE_DIR": str(self.state),
               "_CONDOR_MACHINE_AD": str(machine), "_CONDOR_SCRATCH_DIR": str(scratch or self.root)}
        out = io.StringIO()
        code = hook.main([], stdin=io.BytesIO(job_ad.encode()), stdout=out, env=env,
                         starter_pid=starter.pid if starter else os.getpid())
        return code, cn.parse_classad(out.getvalue(), "hook output")

    def agent(self, *extra: str) -> int:
        return agent.main(["--node-config", str(self.config), "--state-dir", str(self.state),
                           "--probe", "sysfs", "--once", "--starter-comm", "sh",
                           "--resctrl-root", str(self.resctrl), "--profile-dir", str(self.profiles),
                           "--perf", "", *extra])

    def requests(self) -> list[str]:
        return sorted(os.listdir(self.state / "requests"))

    def log(self, name: str = "agent.log") -> str:
        return (self.state / name).read_text()

    def schemata(self, job: str) -> str:
        return (self.resctrl / f"cosched_{job}" / "schemata").read_text()

    def tasks(self, job: str) -> list[int]:
        return [int(x) for x in (self.resctrl / f"cosched_{job}" / "tasks").read_text().split()]

    def record(self, program: str, job: str) -> dict:
        return json.loads((self.profiles / "runs" / program / f"{job}.json").read_text())


@pytest.fixture
def node(tmp_path: Path):
    n = Node(tmp_path)
    yield n
    for proc in n.children:
        if proc.poll() is None:
            n.end(proc)


def job_pids(starter: subprocess.Popen) -> list[int]:
    children = Path(f"/proc/{starter.pid}/task/{starter.pid}/children")
    return sorted(int(x) for x in children.read_text().split())


def environment(out: dict) -> dict:
    return dict(hook.parse_environment_v2(cn.ad_get(out, "Environment")))


def group(cluster: int) -> str:
    """The resctrl group of a cluster's procs run by this test's user (the request files' owner)."""
    return f"{cluster}-uid{os.geteuid()}"


# --------------------------------------------------------------------------------------- the hook

def test_spread_job_gets_its_thread_cap_and_a_request_for_the_agent(node: Node):
    code, out = node.prepare(spread_job(10, cpus=6, ways=4, bw=12.5, scale=2, nodes=4,
                                        extra='Environment = "FOO=bar"'), "slot1_3")
    assert code == cn.EXIT_OK
    assert environment(out) == {"FOO": "bar", "OMP_NUM_THREADS": "6"}
    request = json.loads((node.state / "requests" / "10.0.slot1_3.json").read_text())
    assert request == {"kind": "spread", "job": "10.0", "cluster": 10, "proc": 0, "slot": "slot1_3",
                       "slot_id": 1, "cache_id": 0, "llc_ways": 4, "mem_bw_gbs": 12.5, "program": "lulesh",
                       "scale": 2, "nodes": 4, "cpus": 6, "starter_pid": os.getpid(),
                       "starter_start": cn.process_start_time(os.getpid()), "scratch_dir": str(node.root),
                       "owner": "alice"}
    assert "job 10.0 (program lulesh, scale 2) started on node1 slot slot1_3" in node.log("hooks.log")


def test_second_socket_maps_to_its_cache_id_and_unpinned_jobs_run_ungrouped(node: Node):
    assert node.prepare(spread_job(11, pin="slot2@node1@node1.cosched.test"), "slot2_1")[0] == 0
    assert json.loads((node.state / "requests" / "11.0.slot2_1.json").read_text())["cache_id"] == 1
    code, out = node.prepare(spread_job(12, cpus=3, ways=None, bw=None, scale=None, pin=None), "slot1_1")
    assert code == 0 and environment(out) == {"OMP_NUM_THREADS": "3"}
    assert node.requests() == ["11.0.slot2_1.json"]
    assert "job 12.0 (program lulesh) on node1 slot slot1_1 has no CoSchedPinSlot" in node.log("hooks.log")
    # a job without CoSchedProgram on a socket slot is not ours
    assert node.prepare(spread_job(13, program=None), "slot1_2") == (0, {})


@pytest.mark.parametrize("job_ad, slot, why", [
    (spread_job(program="../etc"), "slot1_1", "CoSchedProgram has a disallowed value"),
    (spread_job(program=".."), "slot1_1", "CoSchedProgram has a disallowed value"),
    (spread_job(program="a" * 65), "slot1_1", "CoSchedProgram has a disallowed value"),
    (spread_job(program=7), "slot1_1", "CoSchedProgram is not a string"),
    (spread_job(ways=10 ** 30), "slot1_1", "CoSchedPinLLCWays=huge is outside [0, 11]"),
    (spread_job(ways=12), "slot1_1", "CoSchedPinLLCWays=12 is outside [0, 11]"),
    (spread_job(ways=-1), "slot1_1", "CoSchedPinLLCWays=-1 is outside [0, 11]"),
    (spread_job(ways="4; rm -rf /"), "slot1_1", "CoSchedPinLLCWays is not an integer"),
    (spread_job(bw=-3.5), "slot1_1", "CoSchedPinMemBW=-3.5 is outside [0, 50]"),
    (spread_job(bw=1e300), "slot1_1", "CoSchedPinMemBW=huge"),
    (spread_job(bw="RequestCpus * 2"), "slot1_1", "CoSchedPinMemBW is not a number"),
    (spread_job(scale=3), "slot1_1", "CoSchedPinScale=3 is not one of"),
    (spread_job(scale=16), "slot1_1", "CoSchedPinScale=16 is outside"),
    (spread_job(nodes=-1), "slot1_1", "CoSchedPinNodes=-1"),
    (spread_job(cpus=10 ** 30), "slot1_1", "RequestCpus=huge"),
    (spread_job(pin="slot1@node2@node2.cosched.test"), "slot1_1", "CoSchedPinSlot names another node"),
    (spread_job(pin="slot1@node1@node1.evil.test"), "slot1_1", "CoSchedPinSlot names another node"),
    (spread_job(pin="slot1@node1/../x"), "slot1_1", "CoSchedPinSlot is not slotN@host"),
    (spread_job(pin="slot2@node1@node1.cosched.test"), "slot1_1", "names slot2, but the job runs in slot1_1"),
    (spread_job(pin="slot3@node1@node1.cosched.test"), "slot3_1", None),   # a device slot: device rules
    (spread_job(pin=5), "slot1_1", "CoSchedPinSlot is not a string"),
])
def test_hostile_spread_values_are_refused_with_a_logged_reason(node: Node, capsys, job_ad, slot, why):
    code, out = node.prepare(job_ad, slot)
    assert node.requests() == []
    assert "Traceback" not in capsys.readouterr().err
    if why is None:
        # on a device slot a job without RequestPhi* gets nothing (today's behaviour)
        assert (code, out) == (0, {})
        return
    # held with the reason in HoldReason (HookStatusCode 4 < 300)
    assert code == cn.EXIT_BAD_AD and cn.ad_get(out, "HookStatusCode") == cn.EXIT_BAD_AD
    assert why in cn.ad_get(out, "HookStatusMessage")
    log = node.log("hooks.log")
    assert "job 10.0: malformed ad" in log and why in log, log


def test_more_cpus_than_the_socket_is_an_inconsistent_ad(node: Node):
    code, out = node.prepare(spread_job(cpus=9))
    assert code == cn.EXIT_BAD_AD and "RequestCpus 9 > the 8 cores of slot1" in node.log("hooks.log")
    assert "RequestCpus 9 > the 8 cores of slot1" in cn.ad_get(out, "HookStatusMessage")


def test_a_proc_with_no_ways_of_its_own_starts(node: Node):
    # MG's 3 ways over 4 procs on one socket: one proc's share is 0 (it uses its job's group)
    code, out = node.prepare(spread_job(10, ways=0), "slot1_4")
    assert code == cn.EXIT_OK and environment(out) == {"OMP_NUM_THREADS": "4"}
    assert json.loads((node.state / "requests" / "10.0.slot1_4.json").read_text())["llc_ways"] == 0


def test_spread_hook_under_the_system_python(node: Node):
    machine = node.root / "m.ad"
    machine.write_text('Name = "slot1_1@node1@node1.cosched.test"\n')
    env = {"COSCHED_NODE_CONFIG": str(node.config), "COSCHED_STATE_DIR": str(node.state),
           "_CONDOR_MACHINE_AD": str(machine), "_CONDOR_SCRATCH_DIR": str(node.root), "PATH": "/usr/bin:/bin"}
    run = subprocess.run([SYSTEM_PYTHON, str(HOOKS / "cosched_prepare_job.py")], input=spread_job(cpus=2).encode(),
                         env=env, capture_output=True, timeout=60)
    assert run.returncode == 0, run.stderr
    assert environment(cn.parse_classad(run.stdout))["OMP_NUM_THREADS"] == "2"
    assert node.requests() == ["10.0.slot1_1.json"]


# --------------------------------------------------------------------------------------- the agent

def test_resctrl_groups_follow_the_jobs_give_away_reclaim_and_removal(node: Node):
    node.make_resctrl()
    starter_a, scratch_a = node.starter("a")
    starter_b, scratch_b = node.starter("b")
    assert node.prepare(spread_job(10, ways=4, bw=10.0), "slot1_1", starter_a, scratch_a)[0] == 0
    assert node.agent() == 0
    # alone on cache 0: its 4 ways plus the 7 unallocated ones; MBA 10/50 GB/s = 20 %
    assert node.schemata(group(10)) == "L3:0=7ff;1=400\nMB:0=20\n"
    assert node.tasks(group(10)) == job_pids(starter_a)
    assert node.agent() == 0
    assert node.tasks(group(10)) == job_pids(starter_a)          # no task written twice

    assert node.prepare(spread_job(11, ways=3, bw=20.0), "slot1_2", starter_b, scratch_b)[0] == 0
    assert node.agent() == 0
    # 4 + 3 asked, 4 spare reclaimed and shared equally: 10.0 has 6 ways, 11.0 has 5 after them
    assert node.schemata(group(10)) == "L3:0=3f;1=400\nMB:0=20\n"
    assert node.schemata(group(11)) == "L3:0=7c0;1=400\nMB:0=40\n"
    assert node.tasks(group(11)) == job_pids(starter_b)

    node.end(starter_a)
    assert node.agent() == 0
    assert not (node.resctrl / f"cosched_{group(10)}").exists()
    assert node.schemata(group(11)) == "L3:0=7ff;1=400\nMB:0=40\n"     # its ways given away again
    assert node.requests() == ["11.0.slot1_2.json"]
    node.end(starter_b)
    assert node.agent() == 0
    assert sorted(p.name for p in node.resctrl.iterdir()) == ["info", "schemata", "tasks"]
    assert (node.resctrl / "schemata").read_text() == "L3:0=7ff;1=7ff\nMB:0=100;1=100\n"
    log = node.log()
    assert f"job {group(10)}: resctrl group cosched_{group(10)} created" in log
    assert f"job {group(10)}: resctrl group cosched_{group(10)} removed (job ended)" in log
    # both ran, but not alone on their socket slot: records say so
    assert node.record("lulesh", "10.0")["exclusive"] is False
    assert node.record("lulesh", "11.0")["exclusive"] is False
    assert os.listdir(node.state / "spread") == []


def test_a_jobs_procs_on_one_cache_share_one_group_of_the_sum_of_their_ways(node: Node):
    node.make_resctrl()
    # MG's w = 3 ways over its 4 procs on socket 0: shares 1, 1, 1, 0 (sns.per_proc_details)
    starters = [node.starter(f"p{i}") for i in range(4)]
    for proc, ((starter, scratch), ways) in enumerate(zip(starters, (1, 1, 1, 0))):
        assert node.prepare(spread_job(10, proc=proc, cpus=1, ways=ways, bw=7.25), f"slot1_{proc + 1}",
                            starter, scratch)[0] == 0
    other, other_scratch = node.starter("other")
    assert node.prepare(spread_job(11, cpus=2, ways=4, bw=10.0), "slot1_5", other, other_scratch)[0] == 0
    assert node.agent() == 0
    # asked 3 + 4 of 11 ways; the 4 spare ones shared equally (name order): 5 and 6 ways
    assert node.schemata(group(10)) == "L3:0=1f;1=400\nMB:0=60\n"       # 4 x 7.25 GB/s = 58% of 50
    assert node.schemata(group(11)) == "L3:0=7e0;1=400\nMB:0=20\n"
    assert node.tasks(group(10)) == sorted(pid for starter, _ in starters for pid in job_pids(starter))
    assert sorted(p.name for p in node.resctrl.iterdir() if p.name.startswith("cosched_")) == \
        [f"cosched_{group(10)}", f"cosched_{group(11)}"]
    node.end(starters[0][0])
    assert node.agent() == 0
    # 2 + 4 asked, 5 spare: 3 of them to the group; 3 x 7.25 GB/s = 44% of 50, MBA step 10
    assert node.schemata(group(10)) == "L3:0=1f;1=400\nMB:0=50\n"
    for starter, _ in starters[1:3]:
        node.end(starter)
    assert node.agent() == 0
    # the proc left has no way of its own (HTCondor accounts it none): no group, it runs
    # in the default group as an unpinned job does
    assert not (node.resctrl / f"cosched_{group(10)}").exists()
    assert node.schemata(group(11)) == "L3:0=7ff;1=400\nMB:0=20\n"
    assert starters[3][0].poll() is None


def test_group_ways_sum_distinct_procs_bounded_by_the_socket():
    config = cn.parse_node_config(NODE)

    def proc(n: int, ways: int, starter: int, uid: int = 2001, cluster: int = 10, slot_id: int = 1):
        return (cn.SpreadRequest(cluster, n, f"slot{slot_id}_{n + 1}", slot_id, slot_id - 1, ways, 5.0, "MG", 1, 0,
                                 1, starter, 77, "/x", "alice"), uid)

    mg = [proc(0, 1, 100), proc(1, 1, 101), proc(2, 1, 102), proc(3, 0, 103)]
    assert agent.group_shares(config, mg) == ({"10-uid2001": {0: 3}}, {"10-uid2001": {0: 40}})
    # a second request of one proc (same starter) adds nothing; another uid is another group
    forged = [proc(1, 5, 101), proc(4, 2, 104, uid=2002)]
    assert agent.group_shares(config, mg + forged)[0] == {"10-uid2001": {0: 7}, "10-uid2002": {0: 2}}
    # 3 procs x 5 ways on an 11-way socket: the group is the socket's 11 ways; one proc per socket
    wide = [proc(0, 5, 100), proc(1, 5, 101), proc(2, 5, 102), proc(3, 4, 103, slot_id=2)]
    assert agent.group_shares(config, wide)[0] == {"10-uid2001": {0: 11, 1: 4}}
    # no proc with a way (compact-share plans none): no group, its procs run ungrouped
    assert agent.group_shares(config, [proc(0, 0, 100), proc(1, 0, 101)]) == ({}, {})


def test_jobs_on_two_sockets_get_masks_on_their_own_cache_ids(node: Node):
    node.make_resctrl()
    starter_a, scratch_a = node.starter("a")
    starter_b, scratch_b = node.starter("b")
    assert node.prepare(spread_job(10, ways=2), "slot1_1", starter_a, scratch_a)[0] == 0
    assert node.prepare(spread_job(11, ways=5, pin="slot2@node1@node1.cosched.test"), "slot2_1",
                        starter_b, scratch_b)[0] == 0
    assert node.agent() == 0
    assert node.schemata(group(10)) == "L3:0=7ff;1=400\nMB:0=20\n"
    assert node.schemata(group(11)) == "L3:0=400;1=7ff\nMB:1=20\n"
    node.end(starter_a)
    node.end(starter_b)
    assert node.agent() == 0
    # different socket slots: each ran exclusive on its own
    assert node.record("lulesh", "10.0")["exclusive"] is True
    assert node.record("lulesh", "11.0")["exclusive"] is True


def test_closids_exhausted_leaves_the_newcomer_ungrouped_with_a_logged_reason(node: Node):
    node.make_resctrl(closids=2)           # the default group + one
    starter_a, scratch_a = node.starter("a")
    starter_b, scratch_b = node.starter("b")
    assert node.prepare(spread_job(10), "slot1_1", starter_a, scratch_a)[0] == 0
    assert node.prepare(spread_job(11), "slot1_2", starter_b, scratch_b)[0] == 0
    agent_once = node.agent
    assert agent_once() == 0
    assert (node.resctrl / f"cosched_{group(10)}").is_dir() and not (node.resctrl / f"cosched_{group(11)}").exists()
    assert f"job {group(11)} runs ungrouped: no CLOSID left" in node.log()
    node.end(starter_a)
    assert agent_once() == 0               # a CLOSID is free again: the waiting job gets it
    assert (node.resctrl / f"cosched_{group(11)}").is_dir() and not (node.resctrl / f"cosched_{group(10)}").exists()
    assert node.tasks(group(11)) == job_pids(starter_b)


def test_absent_resctrl_is_logged_and_jobs_still_run_and_get_records(node: Node):
    starter_a, scratch_a = node.starter("a")
    assert node.prepare(spread_job(10, program="hpcg", scale=4, nodes=2), "slot1_1", starter_a, scratch_a)[0] == 0
    assert node.agent() == 0
    assert "resctrl absent at" in node.log()
    assert starter_a.poll() is None and node.requests() == ["10.0.slot1_1.json"]
    node.end(starter_a)
    assert node.agent() == 0
    record = node.record("hpcg", "10.0")
    assert record["scale_factor"] == 4 and record["nodes"] == 2 and record["exclusive"] is True


@pytest.mark.parametrize("change, why", [
    ({"llc_ways": 10 ** 30}, "bad 'llc_ways'"),
    ({"llc_ways": 11, "slot": "slot1_1"}, None),                     # fits: kept
    ({"program": "../../etc"}, "bad 'program'"),
    ({"program": ".."}, "bad 'program'"),
    ({"mem_bw_gbs": -1.0}, "bad 'mem_bw_gbs'"),
    ({"mem_bw_gbs": float("nan")}, "bad 'mem_bw_gbs'"),
    ({"mem_bw_gbs": 51.0}, "51 GB/s exceed the 50 GB/s of slot1"),
    ({"cache_id": 1}, "cache id 1 is not that of slot1 (0)"),
    ({"slot_id": 3, "slot": "slot3_1"}, "slot3 is not a socket slot"),
    ({"slot_id": 2}, "'slot' is not a dynamic slot of 'slot_id'"),
    ({"scale": 3}, "bad 'scale'"),
    ({"cpus": 9}, "9 cpus exceed the 8 cores of slot1"),
    ({"kind": "bogus"}, "bad 'kind'"),
])
def test_agent_refuses_hostile_spread_requests(node: Node, capsys, change, why):
    node.make_resctrl()
    starter_a, scratch_a = node.starter("a")
    request = {"kind": "spread", "job": "10.0", "cluster": 10, "proc": 0, "slot": "slot1_1", "slot_id": 1,
               "cache_id": 0, "llc_ways": 4, "mem_bw_gbs": 10.0, "program": "lulesh", "scale": 1,
               "nodes": 0, "cpus": 4, "starter_pid": starter_a.pid,
               "starter_start": cn.process_start_time(starter_a.pid), "scratch_dir": str(scratch_a),
               "owner": "alice"}
    request.update(change)
    name = f"10.0.{request['slot']}.json"
    (node.state / "requests" / name).write_text(json.dumps(request))
    assert node.agent() == 0
    assert "Traceback" not in capsys.readouterr().err
    if why is None:
        assert node.requests() == [name] and (node.resctrl / f"cosched_{group(10)}").is_dir()
        return
    assert node.requests() == [] and not (node.resctrl / f"cosched_{group(10)}").exists()
    assert f"request file '{name}' removed: {why}" in node.log()
    assert not (node.profiles / "runs").exists() or not any((node.profiles / "runs").iterdir())


def test_a_forged_request_without_job_processes_claims_no_ways(node: Node):
    node.make_resctrl()
    starter_a, _ = node.starter("a")
    # names a real starter, but a scratch dir no process of it has
    assert node.prepare(spread_job(10, ways=11), "slot1_1", starter_a, node.root / "elsewhere")[0] == 0
    assert node.agent() == 0
    assert not (node.resctrl / f"cosched_{group(10)}").exists()
    node.end(starter_a)
    assert node.agent() == 0
    assert node.record("lulesh", "10.0")["exclusive"] is False


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


def test_exclusive_run_is_recorded_with_perf_ipc_and_bandwidth(node: Node):
    node.make_resctrl()
    perf = node.root / "perf"
    perf.write_text(FAKE_PERF.format(python=SYSTEM_PYTHON))
    perf.chmod(0o755)
    starter_a, scratch_a = node.starter("a")
    assert node.prepare(spread_job(10, program="lulesh", cpus=8, ways=5, bw=12.5, scale=1, nodes=3),
                        "slot1_1", starter_a, scratch_a)[0] == 0
    opts = ("--perf", str(perf), "--perf-sample", "0.1")
    assert node.agent(*opts) == 0
    assert node.agent(*opts) == 0
    node.end(starter_a)
    assert node.agent(*opts) == 0
    record = node.record("lulesh", "10.0")
    start = agent.starter_wall_start(cn.SpreadRequest(10, 0, "slot1_1", 1, 0, 5, 12.5, "lulesh", 1, 3, 8,
                                                      2, cn.process_start_time(os.getpid()) or 0, "/x", "a"))
    assert record["exclusive"] is True and record["scale_factor"] == 1 and record["nodes"] == 3
    assert record["program"] == "lulesh" and record["job"] == "10.0" and record["node"] == "node1"
    assert record["cpus"] == 8 and record["alloc_llc_ways"] == 5 and record["alloc_mem_bw_gbs"] == 12.5
    assert 0 < record["runtime_s"] < 120 and record["end"] >= record["start"] > start - 600
    assert record["ipc"] == 1.5 and record["perf_samples"] == 2
    assert record["bandwidth_gbs"] == pytest.approx(768 * 1048576 / 0.1 / 1e9, rel=1e-3)
    assert pr.validate_record(record)["exclusive"] is True
    assert pr.load_records(str(node.profiles), "lulesh")[0]["runtime_s"] == record["runtime_s"]
    assert pr.next_scale_to_try(pr.load_records(str(node.profiles), "lulesh")) == 2
    assert "run record" in node.log()


def test_perf_csv_parsing():
    text = ("1000,,cpu_core/instructions/,1,100.00,,\n500,,cpu_core/cycles/,1,100.00,,\n"
            "200,,cpu_atom/instructions/,1,100.00,,\n100,,cpu_atom/cycles/,1,100.00,,\n"
            "<not counted>,,ref-cycles,0,0,,\n7,,stalled-cycles-frontend,1,100,,\n")
    assert agent.parse_perf_csv(text) == {"instructions": 1200.0, "cycles": 600.0}
    assert agent.parse_perf_csv("garbage\n,,,\nnan,,instructions\n") == {}


# --------------------------------------------------------------------------------------- next scale

def run(scale: int, runtime: float, exclusive: bool = True, program: str = "lulesh") -> dict:
    return {"program": program, "scale_factor": scale, "runtime_s": runtime, "exclusive": exclusive}


def test_next_scale_walks_up_while_spreading_pays():
    assert pr.next_scale_to_try([]) == 1
    assert pr.next_scale_to_try([run(1, 100.0)]) == 2
    assert pr.next_scale_to_try([run(1, 100.0), run(2, 80.0)]) == 4
    # 4 was not faster than 2 by more than 5 %: spreading stopped paying
    assert pr.next_scale_to_try([run(1, 100.0), run(2, 80.0), run(4, 77.0)]) is None
    assert pr.best_scale([run(1, 100.0), run(2, 80.0), run(4, 77.0)]) == 4
    assert pr.next_scale_to_try([run(1, 100.0), run(2, 80.0), run(4, 70.0)]) == 8
    assert pr.next_scale_to_try([run(1, 100.0), run(2, 80.0), run(4, 70.0), run(8, 50.0)]) is None
    # 2 slower than 1: stop at once; best stays 1
    assert pr.next_scale_to_try([run(1, 100.0), run(2, 120.0)]) is None
    assert pr.best_scale([run(1, 100.0), run(2, 120.0)]) == 1


def test_next_scale_uses_only_valid_exclusive_records_of_the_program():
    records = [run(1, 100.0), run(2, 50.0, exclusive=False), run(2, 90.0, program="other"),
               {"program": "lulesh", "scale_factor": 3, "runtime_s": 1.0, "exclusive": True},
               {"program": "lulesh", "scale_factor": 2, "runtime_s": -1.0, "exclusive": True},
               {"program": "../x", "scale_factor": 2, "runtime_s": 10.0, "exclusive": True},
               "junk", None]
    assert pr.next_scale_to_try(records, program="lulesh") == 2
    # the median of repeated runs decides: 2 -> (70, 90, 200) median 90 is faster than 100 by 10 %
    more = [run(1, 100.0), run(2, 70.0), run(2, 90.0), run(2, 200.0)]
    assert pr.next_scale_to_try(more) == 4
    assert pr.next_scale_to_try(more + [run(2, 99.0), run(2, 98.0)]) is None   # median 98: < 5 %
