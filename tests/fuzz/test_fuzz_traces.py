"""Fuzz the workload-trace readers: openb task lists, openb node lists and SWF logs.

Each input starts from real rows of ../shared/traces (Alibaba cluster-trace-gpu-v2023's openb
lists; RICC-2010-2 of the Parallel Workloads Archive), then is mutated: huge, negative, NaN or
infinite numbers, empty fields, extra or missing columns, non-UTF-8 and NUL bytes, very long
lines. The readers are called in-process (many examples): they return values inside their
bounds or raise their own error, one line naming the file. The command a user runs is called
in a subprocess (a few examples) under the shared bounds of ``run_bounded``."""
from __future__ import annotations

import json
import re
import sys
import tempfile
from pathlib import Path

import numpy as np
from hypothesis import event, given
from hypothesis import strategies as st

from fuzzing import fuzz_settings, run_bounded

from condor_sched.modes.gpus.fleet import GpuFleet
from condor_sched.simulate.cpu_jobs import read_swf_nodes
from condor_sched.simulate.openb import (
    MAX_CPU_MILLI, MAX_GPUS, MAX_INFLATED_TASKS, MAX_MEMORY_MIB, MAX_TIME_S, OpenbError, OpenbTask, inflate,
    read_openb_nodes, read_openb_tasks,
)
from condor_sched.simulate.openb_replay import ReplayError, run_replay
from condor_sched.simulate.workloads import MAX_RUNTIME_S, SWF_BOUNDS, WorkloadError, read_swf

NODE_HEADER = "sn,cpu_milli,memory_mib,gpu,model"
NODE_ROWS = ["openb-node-0000,64000,262144,2,P100", "openb-node-0026,96000,393216,8,G2",
             "openb-node-1032,128000,1048576,1,A10", "openb-node-0035,96000,393216,4,T4",
             "openb-node-0023,96000,786432,8,V100M32", "openb-node-0025,32000,131072,4,V100M16"]
POD_HEADER = ("name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,"
              "scheduled_time")
POD_ROWS = ["openb-pod-0000,12000,16384,1,1000,,LS,Running,0,12537496,0",
            "openb-pod-0001,6000,12288,1,460,,LS,Running,427061,12902960,427061",
            "openb-pod-0005,20000,65536,0,0,,LS,Running,2759674,12902960,2759676",
            "openb-pod-0061,11908,47104,1,1000,,BE,Pending,10001278,10001403,",
            "openb-pod-0031,16000,32768,1,1000,V100M16|V100M32|V100M32,LS,Running,9961302,9994357,9961304",
            "openb-pod-0047,3152,5600,1,1000,V100M16|V100M32,BE,Failed,9989615,9989817,9989615"]
MULTIGPU_HEADER = "name,cpu_milli,memory_mib,num_gpu,gpu_milli"
MULTIGPU_ROWS = ["openb-pod-0017,88000,327680,8,1000", "openb-pod-0000,12000,16384,1,1000"]
SWF_ROWS = ["1 12485571 31 2184 -1 -1 -1 8 259200 1200000 1 152 94 -1 1 -1 -1",
            "179 12488150 1522 508 -1 -1 -1 576 2400 1200000 1 135 101 -1 1 -1 -1",
            "3357 12524605 151 229706 -1 -1 -1 128 259200 1200000 1 5 5 -1 1 -1 -1",
            "2 12485571 31 3317 -1 -1 -1 8 259200 1200000 1 152 94 -1 1 -1 -1"]
SWF_COMMENT = "; RICC-2010-2, mid-September 2010 subset"
#: The fleet of the in-process replays: two real nodes (6 GPUs).
FLEET = GpuFleet(["openb-node-0000", "openb-node-0035"], ["P100", "T4"], [64000, 96000], [262144, 393216],
                 [[16000] * 2, [16000] * 4])

#: Values a hostile or broken file holds where a number belongs.
HOSTILE = st.one_of(
    st.sampled_from(["", " ", "-1", "-0", "0", "1000000", "1000000000", "1" + "0" * 30, str(2**63), str(2**64),
                     "9" * 400, "nan", "NaN", "inf", "-inf", "1e308", "1.7e308", "1e-300", "1.5", "0x10", "1_000",
                     "\u0661\u0662", "\x00", "1\x001", "\ufeff1", "T4", "A10|H100", "|", '"', '""', "\r"]),
    st.integers(-2**70, 2**70).map(str),
    st.integers(0, 2000).map(str),  # in range: such rows reach the protocol
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.text(max_size=12),
)


@st.composite
def mutated_table(draw: st.DrawFn, header: str, rows: list[str], sep: str = ",",
                  unique: bool = False) -> bytes:
    """A table of real rows (``unique``: each at most once) with a few cells, columns, lines or
    bytes changed."""
    table = [header.split(sep)] if header else []
    table += [row.split(sep) for row in draw(st.lists(st.sampled_from(rows), min_size=0, max_size=6, unique=unique))]
    first = 1 if header and len(table) > 1 and draw(st.integers(0, 9)) else 0  # the header now and then
    for _ in range(draw(st.integers(0, 4))):
        if not table:
            break
        row = table[draw(st.integers(first, len(table) - 1))]
        action = draw(st.sampled_from(["value", "value", "value", "drop", "extra", "copy"]))
        if action == "value" and row:
            row[draw(st.integers(0, len(row) - 1))] = draw(HOSTILE)
        elif action == "drop" and row:
            row.pop(draw(st.integers(0, len(row) - 1)))
        elif action == "extra":
            row.append(draw(HOSTILE))
        elif action == "copy":
            table.append(list(row))
    data = ("\n".join(sep.join(row) for row in table) + "\n").encode("utf-8", "surrogatepass")
    for _ in range(draw(st.sampled_from([0, 0, 0, 1, 2]))):
        at = draw(st.integers(0, len(data)))
        junk = draw(st.one_of(st.binary(min_size=1, max_size=6), st.sampled_from(
            [b"\xff\xfe", b"\xc3", b"\x00", b"\xef\xbb\xbf", b"\r\n", b"\r", b"x" * 5000, b"\n" * 3, b'"'])))
        data = data[:at] + junk + data[at:]
    return data


def check_refusal(err: Exception, path: Path) -> None:
    """A refusal is one bounded line that names the file."""
    message = str(err)
    event("refused" + re.sub(r"'.*?'|\d+", "N", message.removeprefix(str(path)))[:60])
    assert str(path) in message and "\n" not in message and len(message) < 1000, message


def check_tasks(tasks: list[OpenbTask]) -> None:
    for t in tasks:
        task = t.task
        assert 0 <= task.cpu_milli <= MAX_CPU_MILLI and 0 <= task.memory_mib <= MAX_MEMORY_MIB
        assert 0 <= task.gpus <= MAX_GPUS and 0 <= task.gpu_milli <= 1000 and task.name
        assert all(v is None or 0 <= v <= MAX_TIME_S for v in (t.creation_s, t.scheduled_s, t.deletion_s))


def check_fleet(fleet: GpuFleet) -> None:
    assert len(fleet) >= 1 and int(fleet.gpu_count.sum()) >= 1 and int(fleet.gpu_count.max()) <= MAX_GPUS
    assert int(fleet.cpu_total_milli.max()) <= MAX_CPU_MILLI and int(fleet.memory_total_mib.max()) <= MAX_MEMORY_MIB


@fuzz_settings()
@given(data=st.one_of(mutated_table(POD_HEADER, POD_ROWS), mutated_table(MULTIGPU_HEADER, MULTIGPU_ROWS)),
       seed=st.integers(0, 2**32 - 1))
def test_task_lists_are_read_within_bounds_or_refused_naming_the_file(data, seed):
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "pods.csv"
        path.write_bytes(data)
        try:
            tasks = read_openb_tasks(path)
        except OpenbError as err:
            check_refusal(err, path)
            return
    event("read")
    check_tasks(tasks)
    assert tasks
    # The inflation ends on every list that reads: within the bound, or refused by rule.
    try:
        arrivals = inflate([t.task for t in tasks], 15_000, np.random.default_rng(seed))
        assert len(arrivals) <= MAX_INFLATED_TASKS
    except OpenbError as err:
        assert "requests a GPU" in str(err) or str(MAX_INFLATED_TASKS) in str(err)
    # So does the replay of its times: a result of finite numbers, or a refusal naming the task.
    try:
        result = run_replay(FLEET, tasks, "native-whole", 60.0, seed)
    except ReplayError as err:
        assert tasks[0].creation_s is None or "task " in str(err), err
        return
    json.dumps(result.to_json(), allow_nan=False)


@fuzz_settings()
@given(data=mutated_table(NODE_HEADER, NODE_ROWS, unique=True))
def test_node_lists_are_read_within_bounds_or_refused_naming_the_file(data):
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "nodes.csv"
        path.write_bytes(data)
        try:
            fleet = read_openb_nodes(path)
        except OpenbError as err:
            check_refusal(err, path)
            return
    event("read")
    check_fleet(fleet)


@fuzz_settings()
@given(data=mutated_table("", [SWF_COMMENT] + SWF_ROWS, sep=" "))
def test_swf_logs_are_read_within_bounds_or_refused_naming_the_file(data):
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "ricc.swf"
        path.write_bytes(data)
        for reader in (read_swf, lambda p: read_swf_nodes(p, 8)):
            try:
                workload = reader(path)
            except WorkloadError as err:
                check_refusal(err, path)
                continue
            for job in workload.jobs:
                runtime = job.runtime_s if hasattr(job, "runtime_s") else job.exclusive_runtime_s
                assert 0 < runtime <= MAX_RUNTIME_S and 0 <= job.arrival_s
                assert getattr(job, "nodes", 1) <= SWF_BOUNDS["requested_processors"]


def condor_sched(*argv: str) -> list[str]:
    return [sys.executable, "-m", "condor_sched", *argv]


@fuzz_settings(2)
@given(pods=mutated_table(POD_HEADER, POD_ROWS), nodes=mutated_table(NODE_HEADER, NODE_ROWS, unique=True),
       replay=st.booleans())
def test_simulate_on_mutated_openb_lists_ends_cleanly(pods, nodes, replay):
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "pods.csv").write_bytes(pods)
        (Path(tmp) / "nodes.csv").write_bytes(nodes)
        out = run_bounded(condor_sched("simulate", f"--workload=openb:{tmp}/pods.csv",
                                       f"--inventory=openb:{tmp}/nodes.csv", "--protocol",
                                       "replay" if replay else "inflation", "--json"), json_out=True)
    assert out.returncode in (0, 2), out.stderr[-2000:]
    if out.returncode == 2:
        assert out.stderr.startswith("Error: ") and out.stderr.count("\n") == 1, out.stderr


@fuzz_settings(2)
@given(data=mutated_table("", [SWF_COMMENT] + SWF_ROWS, sep=" "), cores=st.booleans())
def test_simulate_on_mutated_swf_logs_ends_cleanly(data, cores):
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "ricc.swf"
        path.write_bytes(data)
        extra = ["--cores-per-node", "8", "--nodes", "1024", "--policy", "sd"] if cores else ["--jobs", "5"]
        out = run_bounded(condor_sched("simulate", "--workload", str(path), *extra, "--json"), json_out=True)
    assert out.returncode in (0, 2), out.stderr[-2000:]
