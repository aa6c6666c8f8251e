"""Execute-node programs: PREPARE_JOB hook, node agent, startd cron (stdlib-only, node_hooks/)."""

from __future__ import annotations

import io
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

HOOKS = Path(__file__).resolve().parents[2] / "node_hooks"
sys.path.insert(0, str(HOOKS))

import cosched_node as cn  # noqa: E402
import cosched_node_agent as agent  # noqa: E402
import cosched_prepare_job as hook  # noqa: E402
import cosched_startd_cron as cron  # noqa: E402

NODE = {"node": "node1", "domain": "cosched.test", "cores": 12, "memory_mb": 6144, "slots": [
    {"slot_id": 1, "kind": "socket", "cache_id": 0, "cores": 4, "memory_mb": 4096, "llc_ways": 11,
     "mem_bw_gbs": 50.0},
    {"slot_id": 2, "kind": "device", "device": "mic0", "cores": 4, "memory_mb": 1024,
     "device_memory_mb": 8192, "hardware_threads": 240},
    {"slot_id": 3, "kind": "device", "device": "mic1", "cores": 4, "memory_mb": 1024,
     "device_memory_mb": 8192, "hardware_threads": 240}]}
SYSTEM_PYTHON = shutil.which("python3", path="/usr/bin:/bin") or sys.executable


def own_comm() -> str:
    return Path("/proc/self/comm").read_text().strip()


class Node:
    """A temp node: config file, agent-prepared state dir, scratch dir, probe dir."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.config = root / "node1.json"
        self.config.write_text(json.dumps(NODE))
        self.state = root / "state"
        agent.prepare_state_dir(str(self.state))
        self.scratch = root / "execute" / "dir_1"
        self.scratch.mkdir(parents=True)
        self.probe = root / "probe"
        self.counter = 0

    def machine_ad(self, text: str) -> str:
        self.counter += 1
        path = self.root / f"machine{self.counter}.ad"
        path.write_text(text)
        return str(path)

    def env(self, machine_ad: str, scratch: Path | None = None) -> dict:
        return {"COSCHED_NODE_CONFIG": str(self.config), "COSCHED_STATE_DIR": str(self.state),
                "_CONDOR_MACHINE_AD": machine_ad, "_CONDOR_SCRATCH_DIR": str(scratch or self.scratch)}

    def prepare(self, job_ad: "str | bytes", slot: str = "slot2_1", extra_machine: str = "",
                starter_pid: int | None = None, scratch: Path | None = None) -> tuple[int, dict]:
        ad = self.machine_ad(f'Name = "{slot}@node1@node1.cosched.test"\n{extra_machine}')
        out = io.StringIO()
        data = job_ad.encode() if isinstance(job_ad, str) else job_ad
        code = hook.main([], stdin=io.BytesIO(data), stdout=out, env=self.env(ad, scratch),
                         starter_pid=os.getpid() if starter_pid is None else starter_pid)
        return code, cn.parse_classad(out.getvalue(), "hook output")

    def requests(self) -> list[str]:
        return sorted(os.listdir(self.state / "requests"))

    def hooks_log(self) -> str:
        return (self.state / "hooks.log").read_text()


@pytest.fixture
def node(tmp_path: Path) -> Node:
    return Node(tmp_path)


def job(cluster: int = 10, proc: int = 0, threads: object = 60, memory: object = 2048, extra: str = "") -> str:
    lines = [f"ClusterId = {cluster}", f"ProcId = {proc}", 'Owner = "alice"',
             f'GlobalJobId = "submit#{cluster}.{proc}#1"']
    if threads is not None:
        lines.append(f"RequestPhiThreads = {threads}")
    if memory is not None:
        lines.append(f"RequestPhiMemory = {memory}")
    return "\n".join(lines + ([extra] if extra else [])) + "\n"


def environment(out: dict) -> dict:
    return dict(hook.parse_environment_v2(cn.ad_get(out, "Environment")))


# --------------------------------------------------------------------------------------- parsing

def test_classad_parser_reads_values_without_evaluating_them():
    ad = cn.parse_classad('A = 3\nB = "say \\"hi\\""\nC = true\nD = 1.5\nE = undefined\n'
                          'Requirements = (TARGET.Arch == "X86_64") && true\n')
    assert cn.ad_get(ad, "a") == 3 and cn.ad_get(ad, "B") == 'say "hi"' and cn.ad_get(ad, "C") is True
    assert cn.ad_get(ad, "D") == 1.5 and cn.ad_get(ad, "E") is None
    assert isinstance(cn.ad_get(ad, "Requirements"), cn.Expr)


@pytest.mark.parametrize("data", [b"A = \xff\xfe\n", b"not a classad line\n", b'A = "open\n', b"A = 1\x00\n"])
def test_classad_parser_refuses_malformed_input(data):
    with pytest.raises(cn.AdError):
        cn.parse_classad(data)


def test_quoted_strings_survive_a_round_trip():
    line = cn.format_line("Msg", 'a "quoted" word')
    assert cn.ad_get(cn.parse_classad(line), "Msg") == 'a "quoted" word'
    with pytest.raises(ValueError):
        cn.format_line("Msg", "new\nline")
    with pytest.raises(ValueError):
        cn.format_line("Bad-Name", 1)


def test_environment_v2_round_trip_keeps_quoting():
    pairs = hook.parse_environment_v2("A=1 B='x y' C='it''s' D=")
    assert pairs == [("A", "1"), ("B", "x y"), ("C", "it's"), ("D", "")]
    assert hook.parse_environment_v2(hook.format_environment_v2(pairs)) == pairs
    with pytest.raises(ValueError):
        hook.parse_environment_v2("A='open")


def test_old_env_is_converted_and_kept():
    merged = hook.merge_environment({"env": "A=1;B=2"}, [("B", "3"), ("C", "4")])
    assert hook.parse_environment_v2(merged) == [("A", "1"), ("B", "3"), ("C", "4")]


def test_placement_takes_whole_free_cores_lowest_first_and_needs_no_contiguity():
    # an idle 240-thread device: 60 threads are cores 0-14, as a contiguous range was
    assert cn.place_units(240, 4, [], 60) == ((0, 60),)
    # 118 threads after a 60-thread job: 29 whole cores and 2 threads of core 44
    assert cn.place_units(240, 4, [(0, 60)], 118) == ((60, 178),)
    # issue 9's hold: cores 30-44 busy, 45 free cores on either side: 180 threads fit
    assert cn.place_units(240, 4, [(120, 180)], 180) == ((0, 120), (180, 240))
    # a remainder goes to the partly used core it fits, keeping whole cores whole
    assert cn.place_units(16, 4, [(0, 2)], 6) == ((2, 8),)
    # no core has room for it alone: spread over the cores with most free threads
    assert cn.place_units(8, 4, [(0, 2), (4, 6)], 3) == ((2, 4), (6, 7))
    assert cn.place_units(8, 4, [(0, 8)], 1) is None
    assert cn.place_units(8, 4, [(0, 1)], 8) is None


def test_unit_lists_and_core_lists():
    units = ((0, 60), (64, 66), (70, 71))
    assert cn.format_ranges(units) == "0-59,64-65,70"
    assert cn.format_ranges(units, 1) == "1-60,65-66,71"     # Xeon Phi logical CPUs
    assert cn.core_ranges(units, 4) == ((0, 15), (16, 18))
    assert cn.to_ranges([5, 1, 2, 3, 7, 8]) == ((1, 4), (5, 6), (7, 9))
    assert cn.parse_units([[0, 60], [64, 66]], 62) == ((0, 60), (64, 66))
    # empty, empty range, unsorted, adjacent (not canonical), bool, negative, beyond any device, text, triple
    for bad, threads in (([], 0), ([[0, 0]], 0), ([[4, 8], [0, 2]], 6), ([[0, 4], [4, 8]], 8), ([[0, True]], 1),
                         ([[-1, 2]], 3), ([[0, 10 ** 6]], 10 ** 6), ("0-59", 60), ([[0, 4, 8]], 4)):
        with pytest.raises(ValueError, match="bad 'units'"):
            cn.parse_units(bad, threads)
    with pytest.raises(ValueError, match="add up"):
        cn.parse_units([[0, 60]], 59)


def test_node_config_rejects_bad_device_names(tmp_path: Path):
    bad = json.loads(json.dumps(NODE))
    bad["slots"][1]["device"] = "../mic0"
    with pytest.raises(cn.ConfigError):
        cn.parse_node_config(bad)
    assert cn.parse_node_config(NODE).device("mic1").device_cores == 60


# --------------------------------------------------------------------------------------- the hook

def test_device_job_gets_thread_caps_and_its_environment_kept(node: Node):
    code, out = node.prepare(job(threads=60, extra="Environment = \"FOO=bar X='a b'\""))
    assert code == cn.EXIT_OK
    env = environment(out)
    assert env["FOO"] == "bar" and env["X"] == "a b"
    assert env["OMP_NUM_THREADS"] == env["MIC_OMP_NUM_THREADS"] == "60"
    # one OpenMP thread per hardware thread, on logical CPUs 1-60 of the card (CPU 0 is the OS core's)
    assert env["MIC_KMP_AFFINITY"] == "granularity=fine,explicit,proclist=[1-60]"
    assert env["COSCHED_DEVICE_CORES"] == "0-14" and env["COSCHED_DEVICE_THREADS"] == "0-59"
    assert env["COSCHED_DEVICE"] == "mic0" and env["OFFLOAD_DEVICES"] == "0" and "MIC_KMP_PLACE_THREADS" not in env
    assert cn.ad_get(out, "CoSchedDevice") == "mic0" and cn.ad_get(out, "CoSchedDeviceCores") == "0-14"
    assert "hookstatuscode" not in out
    request = json.loads((node.state / "requests" / "10.0.slot2_1.json").read_text())
    assert request["threads"] == 60 and request["memory_mb"] == 2048 and request["units"] == [[0, 60]]


def test_co_running_jobs_get_disjoint_hardware_threads(node: Node):
    starter = subprocess.Popen(["sleep", "60"])
    try:
        assert node.prepare(job(10, threads=60), "slot2_1", starter_pid=starter.pid)[0] == 0
        _, second = node.prepare(job(11, threads=118), "slot2_2")   # 29 cores and 2 threads of core 44
        _, other_device = node.prepare(job(12, threads=8), "slot3_1")
        assert environment(second)["COSCHED_DEVICE_CORES"] == "15-44"
        assert environment(second)["COSCHED_DEVICE_THREADS"] == "60-177"
        assert environment(other_device)["COSCHED_DEVICE_CORES"] == "0-1"
        starter.kill()
        starter.wait()
        _, third = node.prepare(job(13, threads=40), "slot2_3")       # job 10 ended: its threads free
        assert environment(third)["COSCHED_DEVICE_CORES"] == "0-9"
        _, fourth = node.prepare(job(14, threads=20), "slot2_4")
        assert environment(fourth)["COSCHED_DEVICE_CORES"] == "10-14"
        _, fifth = node.prepare(job(15, threads=2), "slot2_5")        # the 2 threads left on core 44
        assert environment(fifth)["COSCHED_DEVICE_THREADS"] == "178-179"
        assert environment(fifth)["MIC_KMP_AFFINITY"] == "granularity=fine,explicit,proclist=[179-180]"
    finally:
        starter.kill()
        starter.wait()


def test_oversubscribing_start_goes_back_to_idle_with_a_reason_users_can_read(node: Node):
    assert node.prepare(job(20, threads=100, memory=6000), "slot2_1")[0] == 0
    code, out = node.prepare(job(21, threads=100, memory=4000), "slot2_2")
    # HookStatusCode >= 300: HTCondor sends the job back to Idle, the message in VacateReason
    assert code == cn.EXIT_OVERSUBSCRIBED == 3 and cn.ad_get(out, "HookStatusCode") == 303
    assert cn.ad_get(out, "HookStatusMessage") == (
        "condor_sched: device node1/mic0 (slot2_2) is full: device memory 6000+4000 MB > 8192 MB on mic0 "
        "(running jobs + this one); back to idle for a new plan")
    assert set(out) == {"hookstatuscode", "hookstatusmessage"}
    assert "job 21.0 refused on device node1/mic0" in node.hooks_log()
    assert "device memory 6000+4000 MB > 8192 MB" in node.hooks_log()
    code, out = node.prepare(job(22, threads=160, memory=100), "slot2_3")
    assert code == cn.EXIT_OVERSUBSCRIBED and "device PhiThreads 100+160 > 240" in node.hooks_log()
    assert "device PhiThreads 100+160 > 240" in cn.ad_get(out, "HookStatusMessage")
    assert node.requests() == ["20.0.slot2_1.json"]


def test_refusal_lines_are_exactly_what_htcondor_reads(node: Node):
    node.prepare(job(20, threads=240, memory=100), "slot2_1")
    ad = node.machine_ad('Name = "slot2_2@node1@node1.cosched.test"\n')
    out = io.StringIO()
    assert hook.main([], stdin=io.BytesIO(job(21, threads=4).encode()), stdout=out, env=node.env(ad),
                     starter_pid=os.getpid()) == cn.EXIT_OVERSUBSCRIBED
    first, second = out.getvalue().splitlines()
    assert first == "HookStatusCode = 303"
    assert second.startswith('HookStatusMessage = "condor_sched: device node1/mic0 (slot2_2) is full: ')


def test_a_request_larger_than_the_device_is_refused(node: Node):
    assert node.prepare(job(threads=241), "slot2_1")[0] == cn.EXIT_OVERSUBSCRIBED
    assert node.prepare(job(threads=4, memory=8193), "slot2_1")[0] == cn.EXIT_OVERSUBSCRIBED
    assert node.requests() == []


def test_concurrent_starts_on_one_device_never_overlap(node: Node):
    script = str(HOOKS / "cosched_prepare_job.py")
    procs = []
    for index in range(7):   # 7 x 40 threads on a 240-thread device: exactly one is refused
        ad = node.machine_ad(f'Name = "slot2_{index + 1}@node1@node1.cosched.test"\n')
        procs.append(subprocess.Popen([SYSTEM_PYTHON, script], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, env=dict(node.env(ad), PATH="/usr/bin:/bin")))
    for index, proc in enumerate(procs):
        proc.stdin.write(job(60 + index, threads=40, memory=100).encode())
        proc.stdin.close()
    codes, ranges = [], []
    for proc in procs:
        codes.append(proc.wait(timeout=60))
        out = cn.parse_classad(proc.stdout.read())
        if cn.ad_get(out, "Environment") is not None:
            ranges.append(environment(out)["COSCHED_DEVICE_THREADS"])
    assert sorted(codes) == [0] * 6 + [cn.EXIT_OVERSUBSCRIBED]
    placed = sorted((r for r in ranges if r), key=lambda r: int(r.split("-")[0]))
    assert placed == [f"{c}-{c + 39}" for c in range(0, 240, 40)]


def test_a_slot_of_another_node_is_a_config_error(node: Node):
    assert node.prepare(job(), "slot2_1@node2@node2.cosched.test#")[0] == cn.EXIT_BAD_AD
    ad = node.machine_ad('Name = "slot2_1@node2@node2.cosched.test"\n')
    assert hook.main([], stdin=io.BytesIO(job().encode()), stdout=io.StringIO(), env=node.env(ad),
                     starter_pid=os.getpid()) == cn.EXIT_BAD_CONFIG


def test_start_beyond_the_slots_allocation_is_held_as_an_inconsistent_ad(node: Node):
    code, out = node.prepare(job(threads=120), extra_machine="PhiThreads = 60\nPhiMemory = 4096\n")
    assert code == cn.EXIT_BAD_AD and cn.ad_get(out, "HookStatusCode") == cn.EXIT_BAD_AD
    assert "allocated 60" in node.hooks_log() and "allocated 60" in cn.ad_get(out, "HookStatusMessage")


def test_non_device_jobs_get_nothing(node: Node):
    assert node.prepare(job(threads=None, memory=None, extra="RequestCpus = 1"), "slot1_1") == (0, {})
    assert node.prepare(job(threads=None, memory=None), "slot2_1") == (0, {})
    assert node.requests() == []


@pytest.mark.parametrize("job_ad, slot, extra_machine", [
    (job(threads='"1; rm -rf /"'), "slot2_1", ""),
    (job(threads=10 ** 30), "slot2_1", ""),
    (job(threads=-4), "slot2_1", ""),
    (job(threads=2.5), "slot2_1", ""),
    (job(threads="RequestCpus * 1000"), "slot2_1", ""),
    (job(memory=10 ** 30), "slot2_1", ""),
    (job(threads=0, memory=100), "slot2_1", ""),
    (job().replace("ClusterId = 10", 'ClusterId = "../../etc"'), "slot2_1", ""),
    (job().replace('Owner = "alice"', 'Owner = "../root"'), "slot2_1", ""),
    (job().encode() + b'Environment = "A=\xff"\n', "slot2_1", ""),
    (job(extra="Environment = \"A='open\""), "slot2_1", ""),
    (job(), "slot2_1@../../etc/passwd", ""),
    (job(), "slot9_1", ""),
    (job(), "slot2_1", 'PhiDeviceName = "../mic0"'),
    (job(), "slot2_1", 'PhiDeviceName = "mic1"'),
])
def test_hostile_values_are_refused_cleanly(node: Node, capsys, job_ad, slot, extra_machine):
    code, out = node.prepare(job_ad, slot, extra_machine=extra_machine)
    # held (HookStatusCode 4 < 300) with a readable message carrying no hostile value
    assert code == cn.EXIT_BAD_AD and cn.ad_get(out, "HookStatusCode") == cn.EXIT_BAD_AD
    message = cn.ad_get(out, "HookStatusMessage")
    assert message.startswith("condor_sched: malformed job or machine ad: ")
    assert not any(bad in message for bad in ("rm -rf", "../", "etc/passwd", "\\", "RequestCpus * 1000"))
    assert len(message) <= cn.MAX_HOOK_MESSAGE
    assert node.requests() == []
    assert "malformed ad" in node.hooks_log()
    assert "Traceback" not in capsys.readouterr().err


def test_device_name_comes_from_the_slot_ad_when_present(node: Node):
    code, out = node.prepare(job(), "slot3_1", extra_machine='PhiDeviceName = "mic1"')
    assert code == 0 and environment(out)["COSCHED_DEVICE"] == "mic1"


def test_bad_config_and_missing_agent_state_have_their_own_codes(node: Node):
    ad = node.machine_ad('Name = "slot2_1@node1@node1.cosched.test"\n')
    env = node.env(ad)
    env["COSCHED_NODE_CONFIG"] = str(node.root / "missing.json")
    out = io.StringIO()
    assert hook.main([], stdin=io.BytesIO(job().encode()), stdout=out, env=env) == cn.EXIT_BAD_CONFIG
    status = cn.parse_classad(out.getvalue())
    assert cn.ad_get(status, "HookStatusCode") == cn.EXIT_BAD_CONFIG        # held: no replan fixes it
    assert "bad node config on this node: node config " in cn.ad_get(status, "HookStatusMessage")
    env = node.env(ad)
    env["COSCHED_STATE_DIR"] = str(node.root / "no-agent")
    out = io.StringIO()
    assert hook.main([], stdin=io.BytesIO(job().encode()), stdout=out, env=env,
                     starter_pid=os.getpid()) == cn.EXIT_NO_STATE
    status = cn.parse_classad(out.getvalue())
    assert cn.ad_get(status, "HookStatusCode") == 305                       # back to idle: a replan may
    assert "node agent state unavailable" in cn.ad_get(status, "HookStatusMessage")


def test_hook_runs_under_the_system_python_without_tracebacks(node: Node):
    ad = node.machine_ad('Name = "slot2_1@node1@node1.cosched.test"\n')
    script = str(HOOKS / "cosched_prepare_job.py")
    env = dict(node.env(ad), PATH="/usr/bin:/bin")
    good = subprocess.run([SYSTEM_PYTHON, script], input=job(threads=32).encode(), env=env,
                          capture_output=True, timeout=60)
    assert good.returncode == 0, good.stderr
    assert environment(cn.parse_classad(good.stdout))["OMP_NUM_THREADS"] == "32"
    bad = subprocess.run([SYSTEM_PYTHON, script], input=b"\xff\xfe garbage = = =\n", env=env,
                         capture_output=True, timeout=60)
    assert bad.returncode == cn.EXIT_BAD_AD and b"Traceback" not in bad.stderr
    status = cn.parse_classad(bad.stdout)
    assert cn.ad_get(status, "HookStatusCode") == cn.EXIT_BAD_AD and "not UTF-8" in cn.ad_get(status, "HookStatusMessage")
    assert "not UTF-8" in node.hooks_log()


# --------------------------------------------------------------------------------------- the agent

def run_agent(node: Node, *extra: str) -> int:
    return agent.main(["--node-config", str(node.config), "--state-dir", str(node.state),
                       "--probe", "file", "--probe-dir", str(node.probe), "--once",
                       "--starter-comm", own_comm(), "--kill-grace", "3", *extra])


def spawn_job(scratch: Path) -> subprocess.Popen:
    env = dict(os.environ, _CONDOR_SCRATCH_DIR=str(scratch))
    return subprocess.Popen(["sleep", "60"], env=env, start_new_session=True)


def test_agent_stops_a_job_over_its_device_memory_and_records_why(node: Node):
    victim = spawn_job(node.scratch)
    other_scratch = node.root / "execute" / "dir_2"
    other_scratch.mkdir()
    bystander = spawn_job(other_scratch)
    try:
        assert node.prepare(job(30, memory=1024), "slot2_1")[0] == 0
        assert node.prepare(job(31, memory=1024), "slot2_2", scratch=other_scratch)[0] == 0
        (node.probe / "mic0").mkdir(parents=True)
        (node.probe / "mic0" / "30.0").write_text("1500\n")
        (node.probe / "mic0" / "31.0").write_text("900\n")
        assert run_agent(node) == 0
        assert victim.wait(timeout=10) == -signal.SIGTERM
        assert bystander.poll() is None
        record = json.loads((node.state / "killed" / "30.0.json").read_text())
        assert record["pids"] == [victim.pid]
        assert "1500 MB on mic0 exceeds its request of 1024 MB" in record["reason"]
        assert "job 30.0 stopped" in (node.state / "agent.log").read_text()
        state = json.loads((node.state / "devices" / "mic0.json").read_text())
        assert state["used_mb"] == 2400 and state["allocated_mb"] == 2048
        assert [j.get("killed") is not None for j in state["jobs"]] == [True, False]
    finally:
        for child in (victim, bystander):
            child.kill()
            child.wait()


def test_agent_never_signals_processes_of_another_job_or_user(node: Node):
    lookalike = subprocess.Popen(["sleep", "60"], start_new_session=True)   # no job environment
    try:
        assert node.prepare(job(32, memory=100), "slot2_1")[0] == 0
        (node.probe / "mic0").mkdir(parents=True)
        (node.probe / "mic0" / "32.0").write_text("5000")
        request = cn.read_requests(str(node.state / "requests"))[0][0]
        assert agent.find_job_processes(request, os.geteuid()) == []
        assert agent.find_job_processes(request, os.geteuid() + 12345) == []
        assert run_agent(node) == 0
        assert lookalike.poll() is None
        assert json.loads((node.state / "killed" / "32.0.json").read_text())["pids"] == []
    finally:
        lookalike.kill()
        lookalike.wait()


def test_agent_drops_ended_forged_and_malformed_requests(node: Node):
    starter = subprocess.Popen(["sleep", "60"])
    requests = node.state / "requests"
    try:
        assert node.prepare(job(40), "slot2_1", starter_pid=starter.pid)[0] == 0
        assert node.prepare(job(41), "slot2_2")[0] == 0
        (requests / "42.0.slot2_3.json").write_text("{not json")
        (requests / "43.0.slot2_4.json").symlink_to("/etc/passwd")
        (requests / "junk").write_text("x")
        starter.kill()
        starter.wait()
        assert run_agent(node) == 0
        assert sorted(os.listdir(requests)) == ["41.0.slot2_2.json"]
        log = (node.state / "agent.log").read_text()
        assert "job 40.0 on mic0 ended" in log and "'junk' removed" in log
        # a starter that is not a condor_starter process is a forgery
        assert agent.main(["--node-config", str(node.config), "--state-dir", str(node.state),
                           "--probe", "file", "--probe-dir", str(node.probe), "--once"]) == 0
        assert os.listdir(requests) == []
        assert "is not a condor_starter process" in (node.state / "agent.log").read_text()
    finally:
        starter.kill()
        starter.wait()


def test_agent_stops_cleanly_on_sigterm(node: Node):
    proc = subprocess.Popen([SYSTEM_PYTHON, str(HOOKS / "cosched_node_agent.py"), "--node-config",
                             str(node.config), "--state-dir", str(node.state), "--probe", "file",
                             "--probe-dir", str(node.probe), "--interval", "0.2"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        heartbeat = node.state / "agent.heartbeat"
        deadline = time.monotonic() + 20
        while not heartbeat.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert heartbeat.exists()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == 0
        assert b"Traceback" not in proc.stderr.read()
    finally:
        proc.kill()
        proc.wait()


def test_agent_refuses_an_unsafe_state_dir_and_bad_arguments(node: Node, tmp_path: Path):
    unsafe = tmp_path / "unsafe"
    unsafe.mkdir(mode=0o777)
    os.chmod(unsafe, 0o777)
    args = ["--node-config", str(node.config), "--probe", "file", "--probe-dir", "/x", "--once"]
    assert agent.main(args + ["--state-dir", str(unsafe)]) == cn.EXIT_NO_STATE
    assert agent.main(["--probe", "bogus"]) == cn.EXIT_BAD_CONFIG
    assert agent.main(["--node-config", str(node.config), "--probe", "file", "--once"]) == cn.EXIT_BAD_CONFIG


MICSMC_SAMPLE = """\
mic0 (freq):
   Core Frequency: ....... 1.24 GHz
   Total Power: .......... 115.00 Watts
mic0 (mem):
   Free Memory: .......... 15236.59 MB
   Total Memory: ......... 15513.71 MB
   Memory Usage: ......... 277.12 MB
mic1 (mem):
   Free Memory: .......... 7000.00 MB
   Total Memory: ......... 7696.00 MB
   Memory Usage: ......... 696.00 MB
"""


def test_micsmc_output_is_parsed_per_device():
    parsed = agent.parse_micsmc(MICSMC_SAMPLE)
    assert parsed["mic0"] == {"free_mb": 15236.59, "total_mb": 15513.71, "used_mb": 277.12}
    assert parsed["mic1"]["used_mb"] == 696.0
    assert agent.parse_micsmc("garbage\n\x00\n") == {}


def test_file_probe_ignores_hostile_readings(tmp_path: Path):
    (tmp_path / "mic0").mkdir()
    (tmp_path / "mic0" / "1.0").write_text("12; rm -rf /")
    (tmp_path / "mic0" / "2.0").write_text(" 512\n")
    probe = agent.FileProbe(str(tmp_path))
    assert probe.job_usage_mb("mic0", 1, 0) is None and probe.job_usage_mb("mic0", 2, 0) == 512
    assert probe.job_usage_mb("../mic0", 2, 0) is None and probe.job_usage_mb("mic0", 3, 0) is None


# --------------------------------------------------------------------------------------- the cron

MICINFO_SAMPLE = """\
MicInfo Utility Log
Created Mon Jan 12 10:01:05 2015

\tSystem Info
\t\tHOST OS\t\t\t: Linux
\t\tMPSS Version\t\t: 3.4.1

Device No: 0, Device Name: mic0

\tBoard
\t\tCoprocessor Stepping \t : C0
\t\tBoard SKU \t\t : C0PRQ-7120 P/A/X/D
\t\tECC Mode \t\t : Enabled

\tCores
\t\tTotal No of Active Cores : 61
\t\tFrequency\t\t : 1238095 kHz

\tGDDR
\t\tGDDR Size\t\t : 15872 MB

Device No: 1, Device Name: mic1

\tBoard
\t\tBoard SKU \t\t : C0PRQ-3120 "P"
\tCores
\t\tTotal No of Active Cores : 57
"""


def test_micinfo_output_is_parsed_per_device():
    parsed = cron.parse_micinfo(MICINFO_SAMPLE)
    assert parsed["mic0"] == {"model": "C0PRQ-7120 P/A/X/D", "active_cores": 61, "memory_mb": 15872}
    assert parsed["mic1"] == {"model": "C0PRQ-3120 P", "active_cores": 57}


def test_cron_prints_valid_classad_lines(node: Node):
    assert node.prepare(job(50, threads=60, memory=1024), "slot2_1")[0] == 0
    (node.probe / "mic0").mkdir(parents=True)
    (node.probe / "mic0" / "50.0").write_text("700")
    assert run_agent(node) == 0
    out = io.StringIO()
    args = ["--node-config", str(node.config), "--state-dir", str(node.state)]
    assert cron.main(args, stdout=out, micinfo_text=None) == 0
    lines = out.getvalue().splitlines()
    assert all(" = " in line for line in lines)
    ad = cn.parse_classad(out.getvalue())
    assert cn.ad_get(ad, "CoSchedNodeAgentAlive") is True
    assert cn.ad_get(ad, "CoSchedDeviceModels") == "emulated"
    assert cn.ad_get(ad, "CoSchedPhiUsedMemory_mic0") == 700
    assert cn.ad_get(ad, "CoSchedPhiAllocatedThreads_mic0") == 60
    assert cn.ad_get(ad, "CoSchedPhiBusyCores_mic0") == 15 and cn.ad_get(ad, "CoSchedPhiJobs_mic1") == 0
    out = io.StringIO()
    assert cron.main(args + ["--max-age", "0"], stdout=out, micinfo_text=MICINFO_SAMPLE) == 0
    ad = cn.parse_classad(out.getvalue())
    assert cn.ad_get(ad, "CoSchedDeviceModels") == "mic0=C0PRQ-7120 P/A/X/D,mic1=C0PRQ-3120 P"
    later = cron.facts(cn.load_node_config(str(node.config)), str(node.state), None, 180, time.time() + 1000)
    assert "CoSchedNodeAgentAlive = false" in later


def test_cron_reports_a_dead_agent_and_the_last_kill(node: Node):
    cn.write_json_atomic(str(node.state), "agent.heartbeat", {"time": time.time() - 1000})
    cn.write_json_atomic(str(node.state / "killed"), "7.0.json",
                         {"job": "7.0", "reason": 'used 9 MB > 1 MB "x"', "time": time.time()})
    out = io.StringIO()
    assert cron.main(["--node-config", str(node.config), "--state-dir", str(node.state)],
                     stdout=out, micinfo_text=None) == 0
    ad = cn.parse_classad(out.getvalue())
    assert cn.ad_get(ad, "CoSchedNodeAgentAlive") is False
    assert cn.ad_get(ad, "CoSchedLastKill") == "7.0 used 9 MB  1 MB x"


def test_cron_with_a_bad_config_says_so(tmp_path: Path):
    bad = tmp_path / "bad.json"
    bad.write_bytes(b"\xff{")
    out = io.StringIO()
    assert cron.main(["--node-config", str(bad)], stdout=out) == cn.EXIT_BAD_CONFIG
    assert out.getvalue() == "CoSchedNodeConfigOK = false\n"
