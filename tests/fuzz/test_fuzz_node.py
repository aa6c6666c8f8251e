"""Fuzz the execute-node programs (``node_hooks``): what a job can write or say to them, and
what the node's tools print for them.

- The PREPARE_JOB hook, run as the starter runs it (a subprocess), reads a job ad in the
  ``-long`` ClassAd text format with hostile values (NUL and non-UTF-8 bytes, huge numbers,
  very long strings, repeated attributes, ``Environment`` / ``Env`` strings with odd quoting)
  and a machine ad from the job's own sandbox; its node agent is a stub on the real socket.
  Every run ends with a documented exit code and prints what the starter parses (a refusal:
  HookStatusCode and HookStatusMessage only); a start prints every variable once, each one the
  hook sets with the hook's value.
- The discovery program reads fuzzed ``micinfo`` and ``nvidia-smi`` output and prints
  well-formed configuration lines, or nothing (exit 2).
- The node agent's world-writable socket takes fuzzed callers (any bytes, in any pieces,
  reading or not, half-closing or not): every caller that reads gets the whole reply, every
  connection is closed by its deadline, and a well-behaved caller among them is answered at once.
- Files the agent reads that a job or a tool writes (/proc stat and cgroup lines, a cgroup's
  cpuset.cpus, nvidia-smi, micsmc and micinfo output, resctrl's info files, probe readings) are
  parsed into values within their bounds or refused with the module's own error.

A program runs under ``run_bounded`` through a small wrapper that installs a Python audit hook:
a file opened for writing, created, renamed, removed or re-moded outside the test's temp dir,
or a process spawned, is reported and fails the test. The wrapper reports the program's exit
code on stderr (``run_bounded`` admits 0, 1 and 2; the hook's refusals exit 3 to 5).
"""
from __future__ import annotations

import io
import json
import os
import re
import socket
import sys
import threading
import time
from pathlib import Path
from typing import NamedTuple

import pytest
from hypothesis import event, given
from hypothesis import strategies as st

from fuzzing import NODE_HOOKS, fuzz_settings, run_bounded
from test_node_input_rules import GPU_NODE, PHI_NODE, SHARING_NODE, U0

from cosched_node import (ads, channel, config, cpusets, discover, environment, gpus, hook_server, memory_watch,
                          prepare_job, procs, resctrl, state)
from cosched_node import startd_cron
from cosched_node.agent import Agent

SYSTEM_PYTHON = "/usr/bin/python3" if os.access("/usr/bin/python3", os.X_OK) else sys.executable
HOOK = str(Path(NODE_HOOKS) / "cosched_prepare_job.py")
DISCOVER = str(Path(NODE_HOOKS) / "discover_devices.py")

WRAPPER = r'''
import os, runpy, sys
sandbox, program = os.path.realpath(sys.argv[1]), sys.argv[2]
WRITES = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
MUTATING = {"os.mkdir", "os.rename", "os.remove", "os.rmdir", "os.symlink", "os.link", "os.chmod", "os.chown",
            "os.truncate", "os.utime", "os.mkfifo", "os.mknod", "os.setxattr", "os.removexattr"}
SPAWNING = {"subprocess.Popen", "os.exec", "os.posix_spawn", "os.spawn", "os.system", "os.fork", "os.forkpty"}

def inside(path):
    real = os.path.realpath(os.fsdecode(path))
    return real == sandbox or real.startswith(sandbox + os.sep)

def report(what, path):
    os.write(2, ("cosched-fuzz: outside the sandbox: %s %r\n" % (what, path)).encode("utf-8", "replace"))

def audit(event, args):
    if event == "open":
        path, mode, flags = args
        path = os.fspath(path) if isinstance(path, os.PathLike) else path
        writes = any(c in mode for c in "wax+") if isinstance(mode, str) else bool(flags & WRITES)
        if writes and isinstance(path, (str, bytes)) and not inside(path):
            report("open for writing", path)
    elif event in MUTATING:
        for arg in args:
            arg = os.fspath(arg) if isinstance(arg, os.PathLike) else arg
            if isinstance(arg, (str, bytes)) and not inside(arg):
                report(event, arg)
    elif event in SPAWNING:
        report(event, args[:1])

sys.argv = [program] + sys.argv[3:]
sys.path[0] = os.path.dirname(os.path.abspath(program))
sys.addaudithook(audit)
code = 0
try:
    runpy.run_path(program, run_name="__main__")
except SystemExit as exc:
    code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
sys.stdout.flush()
os.write(2, ("cosched-fuzz: exit %d\n" % code).encode())
'''

NODES = {"phi": PHI_NODE, "sharing": SHARING_NODE, "gpu": GPU_NODE}


class Start(NamedTuple):
    """A kind of start: its node, slot, job and machine ad lines, and the stub agent's reply."""
    node: str
    slot: str
    job: str
    machine: str = ""
    reply: dict | None = None


STARTS = {
    "phi-device": Start("phi", "slot2_1", "RequestPhiThreads = 60\nRequestPhiMemory = 2048\n", reply={
        "status": "ok", "kind": "device", "device": "mic0", "compute": 60, "units": [[0, 60]]}),
    "spread": Start("phi", "slot1_1", 'CoSchedProgram = "lulesh"\nRequestCpus = 4\n'),
    "node-slot": Start("sharing", "slot1_1", "RequestCpus = 6\n",
                       reply={"status": "ok", "kind": "node", "cpus": "0-5"}),
    "guest-slot": Start("sharing", "slot2_1", "RequestCpus = 8\n",
                        reply={"status": "ok", "kind": "guest", "cpus": "3-5", "threads": 3}),
    "gpu": Start("gpu", "slot1_1", 'CoSchedPinGPUs = "0"\nCoSchedPinGPUCompute = 250\nCoSchedPinGPUMemory = 4000\n',
                 "CoSchedGPU0Memory = 4000\nCoSchedGPU0Compute = 250\n",
                 {"status": "ok", "kind": "gpu", "gpus": [[0, 4000, 250]]}),
    "no-gpu": Start("gpu", "slot1_1", ""),
}
#: Every variable some start sets (test_the_fuzzed_names_cover_every_variable_the_hook_sets), and others.
HOOK_SET_NAMES = ["OMP_NUM_THREADS", "MIC_ENV_PREFIX", "MIC_OMP_NUM_THREADS", "MIC_KMP_AFFINITY", "COSCHED_DEVICE",
                  "COSCHED_DEVICE_CORES", "COSCHED_DEVICE_THREADS", "OFFLOAD_DEVICES", "COSCHED_CPUS",
                  "CUDA_VISIBLE_DEVICES", "CUDA_MPS_PIPE_DIRECTORY", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE",
                  "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"]
START_ATTRS = {"Environment", "CoSchedDevice", "CoSchedDeviceCores", "CoSchedDeviceUnits", "CoSchedCpus", "CoSchedGPUs"}


class StubAgent:
    """The node agent's socket answering every caller with ``reply``, served in a thread."""

    def __init__(self, state_dir: Path) -> None:
        state_dir.mkdir()
        self.listener = channel.listen(str(state_dir))
        self.reply: dict = {"status": "refused", "code": 5, "message": "no start here"}
        self.server = hook_server.HookServer(self.listener, lambda pid, uid: self.reply, lambda message: None)
        self.stopping = False
        self.thread = threading.Thread(target=self.loop, daemon=True)
        self.thread.start()

    def loop(self) -> None:
        while not self.stopping:
            self.server.poll(0.05)

    def stop(self) -> None:
        self.stopping = True
        self.thread.join(timeout=10)
        self.server.close_all()
        self.listener.close()


class Sandbox(NamedTuple):
    root: Path
    agent: StubAgent
    expected: dict[str, dict[str, str]]   # start -> the variables it sets, for a job that sets none


def hook_args(root: Path, start: Start) -> list[str]:
    return ["--node-config", str(root / f"{start.node}.json"), "--state-dir", str(root / "state")]


def hook_env(root: Path, start: Start) -> dict[str, str]:
    return {"_CONDOR_MACHINE_AD": str(root / "machine.ad"), "PATH": "/usr/bin:/bin", "HOME": str(root),
            "TMPDIR": str(root)}


@pytest.fixture(scope="module")
def sandbox(tmp_path_factory) -> Sandbox:
    root = tmp_path_factory.mktemp("node-fuzz")
    (root / "wrapper.py").write_text(WRAPPER)
    for name, node in NODES.items():
        (root / f"{name}.json").write_text(json.dumps(node))
    expected = {}
    for name, start in STARTS.items():      # the hook in-process, for a job that sets nothing
        (root / "machine.ad").write_text(f'Name = "{start.slot}@node1@node1.cosched.test"\n{start.machine}')
        out = io.StringIO()
        code = prepare_job.main(hook_args(root, start), stdin=io.BytesIO(f"ClusterId = 1\nProcId = 0\n{start.job}".encode()), stdout=out,
                                env=hook_env(root, start), ask=lambda state_dir, s=start: s.reply)
        assert code == 0, out.getvalue()
        expected[name] = dict(environment.parse_environment_v2(ads.ad_get(ads.parse_classad(out.getvalue()),
                                                                          "Environment")))
    agent = StubAgent(root / "state")
    yield Sandbox(root, agent, expected)
    agent.stop()


def run_program(root: Path, program: str, args: list[str], stdin: bytes | None, env: dict) -> tuple[int, str]:
    """(exit code, stdout) of a node program run under the bounds and the audit wrapper."""
    out = run_bounded([SYSTEM_PYTHON, "-B", "-Es", str(root / "wrapper.py"), str(root), program, *args],
                      stdin=stdin, env=env, cwd=root)
    outside = [line for line in out.stderr.splitlines() if line.startswith("cosched-fuzz: outside")]
    assert not outside, outside
    codes = re.findall(r"^cosched-fuzz: exit (-?\d+)$", out.stderr, re.MULTILINE)
    assert len(codes) == 1, out.stderr[-3000:]
    return int(codes[0]), out.stdout


# --------------------------------------------------------------------------------------- job ads

#: What a job's variables mostly hold (quoting and delimiter characters included), and the
#: RARE characters one draw in ten adds: NUL, line breaks other than LF, odd Unicode.
PLAIN = list("ab0=;|,' \"\t$()-_:/.")
RARE = ["\x00", "\x0b", "\x0c", "\r", "\\", "\u00e9", "\u2028", "\ufeff", "\U0001f600"]
PLAIN_TEXT = st.text(alphabet=st.sampled_from(PLAIN), max_size=12)
ODD_TEXT = st.text(alphabet=st.sampled_from(PLAIN + RARE), max_size=12)
ENV_NAMES = st.one_of(st.sampled_from(HOOK_SET_NAMES + ["MINE", "PATH", "omp_num_threads"]),
                      st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,8}", fullmatch=True))


def rarely(draw, common, rare):
    """``rare`` one draw in ten, else ``common``."""
    return draw(rare if draw(st.integers(0, 9)) == 7 else common)


def classad_string(text: str) -> str:
    return '"' + text.replace('"', '\\"') + '"'


@st.composite
def env_pairs(draw) -> list[tuple[str, str]]:
    """The variables a job sets (names often the hook's own, repeated), before spelling."""
    text = ODD_TEXT if draw(st.integers(0, 9)) == 7 else PLAIN_TEXT
    return [(rarely(draw, ENV_NAMES, text), draw(text)) for _ in range(draw(st.integers(0, 8)))]


def new_syntax_entry(draw, name: str, value: str) -> str:
    """``name=value`` spelled as the starter reads it (plain, quoted, a name split by an empty
    quote) or, rarely, as it refuses or reads otherwise (blank-padded names, raw or
    unterminated values)."""
    name = rarely(draw, st.sampled_from([name, f"'{name}'", name[:1] + "''" + name[1:]]),
                  st.sampled_from([" " + name, name + " ", name + "'"]))
    quoted = "'" + value.replace("'", "''") + "'"
    written = quoted if value == "" or any(c in value for c in " \t'") else value
    return f"{name}={rarely(draw, st.sampled_from([written, quoted]), st.sampled_from([value, quoted[:-1]]))}"


@st.composite
def environment_lines(draw) -> str:
    """An ``Environment`` (new syntax) or ``Env`` (old, with its delimiters) line, or both."""
    pairs = draw(env_pairs())
    attr = draw(st.sampled_from(["Environment", "environment", "ENVIRONMENT"]))
    separator = rarely(draw, st.sampled_from([" ", "  ", "\t"]), st.sampled_from(["\x0b", "\r", "\n"]))
    new = f"{attr} = {classad_string(separator.join(new_syntax_entry(draw, n, v) for n, v in pairs))}\n"
    delimiter = draw(st.sampled_from([";", ";", "|", " ", ","]))
    lead = draw(st.sampled_from(["", delimiter, "|", "!"]))
    old_entries = [rarely(draw, st.just(""), st.sampled_from([" ", "\t"])) + f"{n}=" +
                   rarely(draw, st.just(v.replace(delimiter, "").replace(lead, "") if lead else
                                        v.replace(delimiter, "")), st.just(v)) for n, v in pairs]
    old = f"Env = {classad_string(lead + delimiter.join(old_entries))}\n"
    if draw(st.booleans()):
        old += f"EnvDelim = {classad_string(draw(st.sampled_from([delimiter, delimiter, '', ' ', '=', ';;'])))}\n"
    return draw(st.sampled_from([new, old, old + new, new + new]))


ATTRS = ["ClusterId", "ProcId", "Owner", "RequestCpus", "RequestPhiThreads", "RequestPhiMemory", "CoSchedProgram",
         "CoSchedPinSlot", "Environment", "Env", "EnvDelim", "RequestGPUMemory", "CoSchedPinLLCWays", "CoSchedPinGPUs",
         "CoSchedPinGPUCompute", "CoSchedPinGPUMemory"]
ATTR_NAMES = st.one_of(st.sampled_from(ATTRS).flatmap(lambda a: st.sampled_from([a, a.lower(), a.upper()])),
                       st.from_regex(r"[A-Za-z_][A-Za-z0-9_.]{0,12}", fullmatch=True))
VALUES = st.one_of(
    st.integers(-2**80, 2**80).map(str),
    st.sampled_from(["0", "-1", "1" + "0" * 45, "1e400", "-0.0", "nan", "true", "undefined", "error", "{ 1, 2 }",
                     "[ a = 1 ]", "(RequestCpus * 2)", '"', '""', "''", "x" + " " * 5000 + "x"]),
    PLAIN_TEXT.map(classad_string),
    ODD_TEXT.map(classad_string),
    st.integers(0, 1_100_000).map(lambda n: classad_string("x" * n)),   # up to past the 1 MiB bound
)


@st.composite
def job_ads(draw, start: Start) -> bytes:
    """A job ad for ``start`` with hostile lines among (or instead of) its own."""
    lines = [f"ClusterId = {draw(st.integers(1, 99))}\nProcId = 0\n", start.job, draw(environment_lines())]
    for _ in range(draw(st.sampled_from([0, 0, 0, 1, 2, 4]))):
        lines.append(f"{draw(ATTR_NAMES)} = {draw(VALUES)}\n")
    lines = draw(st.permutations(lines))
    data = "".join(lines).encode("utf-8", "surrogatepass")
    if draw(st.integers(0, 9)) == 7:                                     # raw bytes somewhere
        cut = draw(st.integers(0, len(data)))
        data = data[:cut] + draw(st.binary(max_size=16)) + data[cut:]
    return data


@st.composite
def machine_ads(draw, start: Start) -> str:
    """The slot's machine ad (a file in the job's sandbox), sometimes with hostile lines added."""
    extra = rarely(draw, st.just([]), st.lists(st.sampled_from([
        "CoSchedGPU0Memory = 15360", "CoSchedGPU0Compute = 1000", 'PhiDeviceName = "mic1"', "CoSchedGPU1Compute = 5",
        'Name = "slot9_1@node1@node1.cosched.test"', 'Name = "slot1_1@node2@node2.cosched.test"',
        "CoSchedGPU0Memory = -1",
        'CoSchedGPU0Memory = "4000"', "Name = undefined", "\x00", "= 1"]), min_size=1, max_size=2))
    return f'Name = "{start.slot}@node1@node1.cosched.test"\n{start.machine}' + "".join(f"{e}\n" for e in extra)


@st.composite
def hook_runs(draw) -> tuple[str, bytes, str]:
    name = draw(st.sampled_from(sorted(STARTS)))
    return name, draw(job_ads(STARTS[name])), draw(machine_ads(STARTS[name]))


def test_the_fuzzed_names_cover_every_variable_the_hook_sets(sandbox: Sandbox):
    assert {name for variables in sandbox.expected.values() for name in variables} <= set(HOOK_SET_NAMES)


@fuzz_settings()
@given(run=hook_runs())
def test_the_hook_exits_cleanly_and_prints_each_variable_it_sets_once_with_its_value(sandbox: Sandbox, run):
    name, job_ad, machine_ad = run
    start = STARTS[name]
    (sandbox.root / "machine.ad").write_text(machine_ad)
    sandbox.agent.reply = start.reply or {"status": "refused", "code": 5, "message": "no start here"}
    code, stdout = run_program(sandbox.root, HOOK, hook_args(sandbox.root, start), job_ad, hook_env(sandbox.root, start))
    event(f"{name}: exit {code}")
    assert code in prepare_job.HOOK_STATUS or code == 0, code
    assert code != 1, stdout                                   # no internal error, whatever the ad
    printed = ads.parse_classad(stdout, "hook output")         # the starter parses what it prints
    if code != 0:
        assert set(printed) == {"hookstatuscode", "hookstatusmessage"}, stdout
        assert printed["hookstatuscode"] == prepare_job.HOOK_STATUS[code]
        return
    assert set(printed) <= {a.lower() for a in START_ATTRS}, stdout
    if "environment" not in printed:
        return
    entries = environment.parse_environment_v2(printed["environment"])
    assert len({n for n, _ in entries}) == len(entries), entries          # every variable once
    for variable, value in sandbox.expected[name].items():     # each one the hook sets: once, its value
        values = [v for n, v in entries if n == variable]
        if name == "spread":                                     # OMP_NUM_THREADS = the job's RequestCpus
            assert len(values) == 1 and re.fullmatch(r"[1-9]\d{0,5}", values[0]), entries
        else:
            assert values == [value], entries


# --------------------------------------------------------------------------------------- the discovery program

NUMBERISH = st.one_of(st.integers(-10, 2**64).map(str), st.sampled_from(["", "[N/A]", "nan", "1e9", "15360 MiB", "7.5",
                                                                         "0", "00012", " 8 ", "\u0661", "9" * 30]))
GPU_NAMES = st.one_of(st.sampled_from(["Tesla T4", 'Tesla "T4"', "A100; Evil=1", "x" * 300, "", "T4\\", "T4\x00"]),
                      ODD_TEXT)


@st.composite
def nvidia_smi_outputs(draw) -> str:
    """``nvidia-smi --query-gpu`` rows, each field hostile one draw in six, rows cut or padded."""
    rows = []
    for k in range(draw(st.integers(0, 10))):
        valid = [str(k), draw(st.sampled_from([U0, U0[:-2] + f"{k:02d}", "MIG-" + U0[4:]])), "Tesla T4",
                 f"{draw(st.integers(1, 100000))} MiB", draw(st.sampled_from(["7.5", "8.0", "9.0"]))]
        hostile = [NUMBERISH, st.sampled_from(["GPU-x", "", U0 + "0"]), GPU_NAMES, NUMBERISH, NUMBERISH]
        fields = [draw(bad) if draw(st.integers(0, 5)) == 3 else good for good, bad in zip(valid, hostile)]
        rows.append(", ".join(fields[:rarely(draw, st.just(5), st.integers(3, 6))]))
    return "\n".join(rows) + rarely(draw, st.just("\n"), st.sampled_from(["", "\r\n", "\nFailed to initialize NVML\n"]))


@st.composite
def micinfo_outputs(draw) -> str:
    lines = []
    for k in range(draw(st.integers(0, 3))):
        device = draw(st.sampled_from(["mic0", "mic1", "mic0", "gpu0", "mic9999"]))
        lines.append(f"Device No: {k}, Device Name: {device}")
        lines.append(f"\t\tGDDR Size\t\t : {draw(NUMBERISH)} {draw(st.sampled_from(['MB', 'GB', 'TB', '']))}")
        lines.append(f"\t\tTotal No of Active Cores : {draw(NUMBERISH)}")
    return "\n".join(lines + draw(st.lists(ODD_TEXT, max_size=3))) + "\n"


#: The startd's own knobs (NODE1. / NODE1_), its agent's, and the host-wide declarations.
CONFIG_LINE = re.compile(r'^(NODE1[._][A-Za-z0-9_.]+|COSCHED_NODE_AGENTS?(_NODE1(_ARGS)?)?|MACHINE_RESOURCE_[A-Za-z0-9]+|'
                         r'SLOT_TYPE_\d+_PARTITIONABLE|MAX_SLOT_TYPES) = [^"\\]*("[^"\\\n]*"[^"\\]*)*$')


@fuzz_settings()
@given(node=st.sampled_from(["phi", "gpu"]), micinfo=micinfo_outputs(), smi=nvidia_smi_outputs())
def test_discovery_prints_well_formed_slot_lines_or_nothing(sandbox: Sandbox, node: str, micinfo: str, smi: str):
    (sandbox.root / "micinfo.txt").write_text(micinfo, encoding="utf-8", errors="surrogatepass")
    (sandbox.root / "smi.txt").write_text(smi, encoding="utf-8", errors="surrogatepass")
    code, stdout = run_program(sandbox.root, DISCOVER, [
        "--node-config", str(sandbox.root / f"{node}.json"), "--local-name", "NODE1", "--micinfo",
        str(sandbox.root / "micinfo.txt"), "--nvidia-smi", str(sandbox.root / "smi.txt")], None,
        {"PATH": "/usr/bin:/bin", "HOME": str(sandbox.root)})
    assert code in (0, 2), code
    event(f"{node}: exit {code}")
    if code == 2:
        assert stdout == ""
        return
    lines = [line for line in stdout.splitlines() if not line.startswith("#")]
    assert lines and all(CONFIG_LINE.match(line) for line in lines), stdout
    settings = dict(line.split(" = ", 1) for line in lines)
    assert int(settings["NODE1.NUM_CPUS"]) == NODES[node]["cores"]
    for key, value in settings.items():
        if key.startswith("NODE1.MACHINE_RESOURCE_"):
            assert re.fullmatch(r"\d{1,10}", value) and int(value) < 2**31, (key, value)


# --------------------------------------------------------------------------------------- the agent's socket

class EmptyView:
    """A startd that reports no claims."""

    def read(self):
        return [], []


@pytest.fixture(scope="module")
def agent_socket(tmp_path_factory):
    """The real agent's answer behind a ``HookServer`` with a short deadline; (server, path)."""
    root = tmp_path_factory.mktemp("agent-fuzz")
    (root / "node.json").write_text(json.dumps(PHI_NODE))
    state.prepare_state_dir(str(root / "state"))
    the_agent = Agent(config.load_node_config(str(root / "node.json")), str(root / "state"), EmptyView(),
                      memory_watch.SysfsProbe("/nonexistent"), lambda message: None, starter_uid=os.getuid())
    listener = channel.listen(str(root / "state"))
    server = hook_server.HookServer(listener, the_agent.answer, lambda message: None, deadline_s=0.2)
    stopping: list[bool] = []

    def loop() -> None:
        while not stopping:
            server.poll(0.05)

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    yield server, str(root / "state" / state.SOCKET_NAME)
    stopping.append(True)
    thread.join(timeout=10)
    server.close_all()
    listener.close()


class Caller(NamedTuple):
    payload: bytes
    pieces: int        # sent in this many pieces, a pause between
    half_close: bool   # shut down its side once sent
    reads: bool        # reads the reply (or never does)


CALLERS = st.builds(Caller, st.one_of(st.binary(max_size=300), st.integers(0, 3 * hook_server.MAX_REQUEST_BYTES // 2)
                                      .map(lambda n: b"{" * n)),
                    st.integers(1, 4), st.booleans(), st.booleans())


def call(path: str, caller: Caller, replies: list) -> None:
    """One caller; what it read goes to ``replies`` when it reads."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client:
        client.settimeout(10)
        client.connect(path)
        size = -(-len(caller.payload) // caller.pieces) if caller.payload else 0
        try:
            for i in range(caller.pieces):
                client.sendall(caller.payload[i * size:(i + 1) * size])
                time.sleep(0.005)
            if caller.half_close:
                client.shutdown(socket.SHUT_WR)
        except OSError:
            pass          # cut off past the request bound: its reply is still queued for it
        if not caller.reads:
            return
        data = b""
        try:
            while chunk := client.recv(65536):
                data += chunk
        except OSError:
            pass
        replies.append(data)


@fuzz_settings(examples=15)
@given(callers=st.lists(CALLERS, min_size=1, max_size=6))
def test_every_caller_of_the_agent_is_answered_or_refused_and_none_holds_another(agent_socket, callers):
    server, path = agent_socket
    replies: list[bytes] = []
    threads = [threading.Thread(target=call, args=(path, caller, replies)) for caller in callers]
    for thread in threads:
        thread.start()
    began = time.monotonic()
    reply = channel.ask(os.path.dirname(path), timeout_s=30)        # a well-behaved caller among them
    assert time.monotonic() - began < hook_server.CONNECTION_DEADLINE_S
    assert reply["status"] == "refused" and reply["code"] == 5      # this test process is no hook
    for thread in threads:
        thread.join(timeout=30)
    assert len(replies) == sum(caller.reads for caller in callers)
    for data in replies:
        assert json.loads(data)["status"] in ("ok", "refused")
    deadline = time.monotonic() + server.deadline_s + 2.0            # every connection closed by its deadline
    while server.open and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not server.open


# --------------------------------------------------------------------------------------- files the agent reads

@fuzz_settings()
@given(comm=st.text(alphabet=st.characters(blacklist_characters="\x00"), max_size=40),
       ppid=st.integers(1, procs.PID_MAX), start=st.integers(0, 2**62), uid=st.integers(0, 2**32 - 2))
def test_a_process_name_a_job_chose_never_changes_its_parent_start_or_uid(tmp_path_factory, comm, ppid, start, uid):
    root = tmp_path_factory.mktemp("proc")
    (root / "4242").mkdir()
    fields = ["S", str(ppid), "4242"] + ["0"] * 16 + [str(start)] + ["0"] * 30
    (root / "4242" / "stat").write_text(f"4242 ({comm}) {' '.join(fields)}\n", errors="surrogatepass")
    name = comm[:15].replace("\\", "\\\\").translate({ord(c): "\\" + e for c, e in zip("\f\n\r\t\v", "fnrtv")})
    (root / "4242" / "status").write_text(f"Name:\t{name}\nUid:\t{uid}\t{uid}\t{uid}\t{uid}\n",  # escaped as Linux does
                                          errors="surrogatepass")
    found = procs.read_proc(4242, str(root))
    assert found is not None and (found.pid, found.ppid, found.start, found.uid) == (4242, ppid, start, uid)


@fuzz_settings()
@given(stat_bytes=st.binary(max_size=400), status_bytes=st.binary(max_size=400), cgroup_bytes=st.binary(max_size=400),
       cpus_text=st.one_of(st.binary(max_size=200), st.lists(st.tuples(st.integers(0, 17000), st.integers(0, 17000)),
                                                              max_size=50).map(
           lambda pairs: ",".join(f"{a}-{b}" for a, b in pairs).encode())))
def test_hostile_proc_and_cgroup_files_give_bounded_values_or_refusals(tmp_path_factory, stat_bytes, status_bytes,
                                                                      cgroup_bytes, cpus_text):
    root = tmp_path_factory.mktemp("files")
    (root / "proc" / "7").mkdir(parents=True)
    for name, data in (("stat", stat_bytes), ("status", status_bytes), ("cgroup", cgroup_bytes)):
        (root / "proc" / "7" / name).write_bytes(data)
    proc = procs.read_proc(7, str(root / "proc"))
    assert proc is None or proc.pid == 7
    assert set(procs.process_table(str(root / "proc"))) <= {7}
    cgroup_dir = root / "cg" / "htcondor" / "slot1_1"      # a job's delegated cgroup: it writes the file
    cgroup_dir.mkdir(parents=True)
    (cgroup_dir / cpusets.CPUS_FILE).write_bytes(cpus_text)
    cgroups = cpusets.CgroupCpusets(str(root / "cg"), str(root / "proc"))
    path = cgroups.proc_cgroup(7)
    assert path is None or "\n" not in path
    try:
        cpus = cgroups.read("/htcondor/slot1_1")
        assert all(0 <= cpu <= cpusets.MAX_CPU for cpu in cpus)
    except cpusets.CpusetError:
        pass
    found, problem = cgroups.cgroup_of([7], 1)
    assert (found is None) != (problem is None)


TOOL_TEXT = st.one_of(st.text(max_size=300), st.lists(st.sampled_from(
    [f"0, {U0}, Tesla T4, 15360 MiB, 7.5", f"4711, {U0}, 4000", f"4711, {U0}, [N/A]", "mic0 (mem):",
     "   Memory Usage: ......... 277.12 MB", "Device No: 0, Device Name: mic0", "\t\tGDDR Size\t\t : 15872 MB",
     "\t\tTotal No of Active Cores : 61", 'DetectedGPUs="GPU-5f1c0d1e"', 'GPU_5f1c0d1e=[ id="GPU-5f1c0d1e"; ]',
     "\x00", "9" * 50, "1e999", ", , , ,", "-1, x"]), max_size=12).map("\n".join))


@fuzz_settings()
@given(text=TOOL_TEXT)
def test_tool_output_is_parsed_within_bounds_or_refused(text: str):
    for parse in (gpus.parse_query_gpu, gpus.parse_compute_apps, gpus.parse_gpu_discovery):
        try:
            parsed = parse(text)
        except gpus.GpuError:
            continue
        assert isinstance(parsed, list)
        if parse is gpus.parse_compute_apps:
            assert all(app.pid > 0 and (app.used_mb is None or app.used_mb >= 0) for app in parsed)
    for device, values in memory_watch.parse_micsmc(text).items():
        assert re.fullmatch(r"mic\d{1,3}", device) and all(v >= 0 for v in values.values())
    for device, values in discover.parse_micinfo(text).items():
        assert 0 < values["device_memory_mb"] <= discover.MAX_INT and values["hardware_threads"] > 0
    assert isinstance(startd_cron.parse_micinfo(text), dict)


@fuzz_settings()
@given(reading=st.binary(max_size=80), mask=st.text(max_size=20), bits=st.text(max_size=10),
       schemata=st.text(max_size=80))
def test_probe_readings_and_resctrl_info_files_give_bounded_values_or_refusals(tmp_path_factory, reading, mask, bits,
                                                                              schemata):
    root = tmp_path_factory.mktemp("probe")
    (root / "probe" / "mic0").mkdir(parents=True)
    (root / "probe" / "mic0" / "3.0").write_bytes(reading)
    used = memory_watch.FileProbe(str(root / "probe")).job_usage_mb("mic0", 3, 0)
    assert used is None or 0 <= used < 10**15
    (root / "resctrl" / "info" / "L3").mkdir(parents=True)
    (root / "resctrl" / "info" / "L3" / "cbm_mask").write_text(mask, errors="surrogatepass")
    (root / "resctrl" / "info" / "L3" / "min_cbm_bits").write_text(bits, errors="surrogatepass")
    (root / "resctrl" / "schemata").write_text(schemata, errors="surrogatepass")
    try:
        manager = resctrl.ResctrlManager(str(root / "resctrl"), log=lambda message: None)
    except (OSError, resctrl.ResctrlError):
        return
    assert 1 <= manager.width <= 64 and manager.min_bits >= 1 and all(c >= 0 for c in manager.cache_ids)
