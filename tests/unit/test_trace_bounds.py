"""Hostile workload traces are refused at the reader, by rule: every number of an openb node or
task list and of an SWF log has a range, a file's bytes and lines are bounded, and the FGD
inflation protocol ends on every list (it is refused when its clones could never, or only after
too many tasks, reach the target). Each error names the file, the line, the column or field and
what is allowed."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from condor_sched.modes.gpus.fleet import GpuFleet, GpuTask
from condor_sched.modes.registry import gpu_policy
from condor_sched.simulate import openb
from condor_sched.simulate.cpu_jobs import read_swf_nodes
from condor_sched.simulate.openb import (
    MAX_CPU_MILLI, MAX_GPUS, MAX_INFLATED_TASKS, MAX_MEMORY_MIB, MAX_OPENB_LINE_BYTES, MAX_TIME_S, OpenbError,
    inflate, read_openb_nodes, read_openb_tasks, run_inflation,
)
from condor_sched.simulate.openb_report import TRACES
from condor_sched.simulate.workloads import SWF_BOUNDS, WorkloadError, read_swf

# Real rows of ../shared/traces (Alibaba cluster-trace-gpu-v2023, openb lists; RICC-2010-2 of
# the Parallel Workloads Archive), as they are.
NODE_HEADER = "sn,cpu_milli,memory_mib,gpu,model\n"
NODE_ROWS = ["openb-node-0000,64000,262144,2,P100\n", "openb-node-0026,96000,393216,8,G2\n",
             "openb-node-1032,128000,1048576,1,A10\n", "openb-node-0035,96000,393216,4,T4\n"]
POD_HEADER = ("name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,"
              "scheduled_time\n")
POD_ROWS = ["openb-pod-0000,12000,16384,1,1000,,LS,Running,0,12537496,0\n",
            "openb-pod-0001,6000,12288,1,460,,LS,Running,427061,12902960,427061\n",
            "openb-pod-0005,20000,65536,0,0,,LS,Running,2759674,12902960,2759676\n",
            "openb-pod-0061,11908,47104,1,1000,,BE,Pending,10001278,10001403,\n",
            "openb-pod-0031,16000,32768,1,1000,V100M16|V100M32|V100M32,LS,Running,9961302,9994357,9961304\n"]
SWF_ROWS = ["1 12485571 31 2184 -1 -1 -1 8 259200 1200000 1 152 94 -1 1 -1 -1\n",
            "179 12488150 1522 508 -1 -1 -1 576 2400 1200000 1 135 101 -1 1 -1 -1\n",
            "3357 12524605 151 229706 -1 -1 -1 128 259200 1200000 1 5 5 -1 1 -1 -1\n"]


def write(tmp_path: Path, name: str, text: str | bytes) -> Path:
    path = tmp_path / name
    path.write_bytes(text.encode() if isinstance(text, str) else text)
    return path


def with_value(row: str, column: int, value: str, sep: str = ",") -> str:
    fields = row.rstrip("\n").split(sep)
    fields[column] = value
    return sep.join(fields) + "\n"


def refused(reader, path: Path, *parts: str) -> str:
    with pytest.raises(OpenbError) as err:
        reader(path)
    message = str(err.value)
    assert str(path) in message and "\n" not in message and len(message) < 400, message
    for part in parts:
        assert part in message, message
    return message


# --- openb node lists --------------------------------------------------------------------------

@pytest.mark.parametrize("column, value, allowed", [
    (3, "1000000", f"0..{MAX_GPUS}"),              # a numpy array of a million GPUs per node (5 GB)
    (3, "1000000000", f"0..{MAX_GPUS}"),           # MemoryError
    (1, "1" + "0" * 30, f"0..{MAX_CPU_MILLI}"),    # OverflowError in the fleet's int64 arrays
    (2, str(2**64), f"0..{MAX_MEMORY_MIB}"),
    (2, "-1", f"0..{MAX_MEMORY_MIB}"),
    (1, "1e3", f"0..{MAX_CPU_MILLI}"),
    (1, "64_000", f"0..{MAX_CPU_MILLI}"),          # int() would take it
    (1, "\u0661\u0662", f"0..{MAX_CPU_MILLI}"),    # Arabic-Indic digits: int() would take them too
    (3, "", f"0..{MAX_GPUS}"),
    (3, "nan", f"0..{MAX_GPUS}"),
])
def test_a_node_number_out_of_range_names_file_line_column_and_range(tmp_path, column, value, allowed):
    rows = [NODE_ROWS[0], with_value(NODE_ROWS[1], column, value), NODE_ROWS[2]]
    path = write(tmp_path, "nodes.csv", NODE_HEADER + "".join(rows))
    refused(read_openb_nodes, path, "line 3", f"column {openb.NODE_COLUMNS[column]}", allowed)


def test_a_node_list_without_nodes_or_without_gpus_is_refused_naming_the_file(tmp_path):
    refused(read_openb_nodes, write(tmp_path, "empty.csv", NODE_HEADER), "line 1", "no rows")
    zero = NODE_HEADER + with_value(NODE_ROWS[0], 3, "0") + with_value(NODE_ROWS[1], 3, "0")
    refused(read_openb_nodes, write(tmp_path, "zero.csv", zero), "column gpu", "no node has a GPU", f"1..{MAX_GPUS}")


def test_a_fleet_without_gpus_is_refused_by_the_protocol_not_reported_as_nan():
    fleet = GpuFleet(["n0"], ["T4"], [8000], [65536], [[]])
    with pytest.raises(OpenbError, match="no GPU"):
        run_inflation(fleet, [GpuTask("t", 1000, 1024, 1, 500)], gpu_policy("best-fit"), seed=0)


def test_requests_that_never_reach_100_percent_are_refused_and_results_are_strict_json():
    fleet = GpuFleet(["n0"], ["T4"], [64000], [65536], [[16000]])
    with pytest.raises(OpenbError, match=r"reach only 90\.0% .* never the 100%"):
        run_inflation(fleet, [GpuTask("t", 1000, 1024, 1, 900)], gpu_policy("best-fit"), seed=0)
    result = run_inflation(fleet, [GpuTask("t", 1000, 1024, 1, 500)], gpu_policy("best-fit"), seed=0)
    json.dumps(result.to_json(), allow_nan=False)


# --- openb task lists --------------------------------------------------------------------------

@pytest.mark.parametrize("column, value, allowed", [
    (3, str(MAX_GPUS + 1), f"0..{MAX_GPUS}"),
    (1, "1" + "0" * 30, f"0..{MAX_CPU_MILLI}"),
    (2, str(2**64), f"0..{MAX_MEMORY_MIB}"),
    (8, "1" + "0" * 400, f"0..{MAX_TIME_S}"),      # float() of it: OverflowError in the replay
    (9, "-5", f"0..{MAX_TIME_S}"),
    (10, "9" * 4000, f"0..{MAX_TIME_S}"),
    (4, "1001", "0..1000"),
])
def test_a_task_number_out_of_range_names_file_line_column_and_range(tmp_path, column, value, allowed):
    path = write(tmp_path, "pods.csv", POD_HEADER + POD_ROWS[0] + with_value(POD_ROWS[1], column, value))
    name = POD_HEADER.rstrip().split(",")[column]
    refused(read_openb_tasks, path, "line 3", f"column {name}", allowed)


@pytest.mark.parametrize("reader, text", [(read_openb_tasks, POD_HEADER + POD_ROWS[0]),
                                          (read_openb_nodes, NODE_HEADER + NODE_ROWS[0])])
def test_a_file_that_is_not_utf8_names_the_file_and_line(tmp_path, reader, text):
    path = write(tmp_path, "latin1.csv", text.encode() + "caf\u00e9,1\n".encode("latin-1"))
    refused(reader, path, "line 3: not UTF-8 text (byte 3 of the line)")


def test_a_byte_order_mark_is_read_as_the_start_of_the_header(tmp_path):
    path = write(tmp_path, "bom.csv", "\ufeff" + NODE_HEADER + NODE_ROWS[0])
    assert read_openb_nodes(path).names == ["openb-node-0000"]


@pytest.mark.parametrize("text, parts", [
    (POD_HEADER + POD_ROWS[0].rstrip("\n") + ",extra\n", ("line 2", "12 columns, the header has 11")),
    (POD_HEADER + "p,1000,1024,0,0\n", ("line 2", "5 columns")),
    (POD_HEADER + POD_ROWS[0].replace("openb-pod-0000", "x" * 300), ("line 2", "column name", "1 to 253 characters")),
    (POD_HEADER + POD_ROWS[0].replace("openb-pod-0000", ""), ("line 2", "column name")),
    (POD_HEADER + "p," + "1" * MAX_OPENB_LINE_BYTES + ",1,0,0\n", ("line 2", f"longer than {MAX_OPENB_LINE_BYTES}")),
    (POD_HEADER + 'p,"' + "1\n" * 70_000 + '",1,0,0\n', ("line", "not CSV")),
    (POD_HEADER.replace("qos", "name"), ("line 1", "'name' appears more than once")),
    ("name,cpu_milli,memory_mib,gpu_milli\n", ("line 1", "column 'num_gpu' missing")),
    ("", ("line 1", "missing")),
    (POD_HEADER + POD_ROWS[0].replace("12000", "12\x00000"), ("line 2", "column cpu_milli")),
])
def test_malformed_task_lists_name_file_line_and_what_is_wrong(tmp_path, text, parts):
    refused(read_openb_tasks, write(tmp_path, "pods.csv", text), *parts)


def test_the_row_and_byte_bounds_stop_reading_early(tmp_path, monkeypatch):
    monkeypatch.setattr(openb, "MAX_OPENB_ROWS", 3)
    refused(read_openb_tasks, write(tmp_path, "rows.csv", POD_HEADER + "".join(POD_ROWS)), "line 5", "more than 3 rows")
    monkeypatch.setattr(openb, "MAX_OPENB_BYTES", 300)
    refused(read_openb_tasks, write(tmp_path, "big.csv", POD_HEADER + POD_ROWS[0] * 10), "larger than 300 bytes")


# --- the inflation protocol ends on every list --------------------------------------------------

class DrawBudget:
    """A generator that fails the test once it has drawn ``budget`` clones (a loop that would
    otherwise never end); ``pick`` chooses the drawn task (default: numpy's choice)."""

    def __init__(self, budget: int, pick=None) -> None:
        self.rng = np.random.default_rng(0)
        self.budget = budget
        self.pick = pick

    def permutation(self, n: int) -> np.ndarray:
        return self.rng.permutation(n)

    def integers(self, n: int) -> int:
        self.budget -= 1
        assert self.budget >= 0, "the clone loop ran past its budget"
        return self.pick(n) if self.pick else int(self.rng.integers(n))


def cpu_only(count: int) -> list[GpuTask]:
    return [GpuTask(f"p{i}", 1000, 1000) for i in range(count)]


def test_a_cpu_only_task_list_is_refused_before_any_clone_is_drawn():
    with pytest.raises(OpenbError, match=r"no task of the list requests a GPU .* can never bring"):
        inflate(cpu_only(50), 6212 * 1000, DrawBudget(0))


def test_a_list_whose_clones_would_pass_the_bound_is_refused_before_any_clone_is_drawn():
    tasks = cpu_only(99) + [GpuTask("share", 1000, 1000, 1, 1)]
    with pytest.raises(OpenbError, match=rf"would take about \d+ tasks, more than {MAX_INFLATED_TASKS}"):
        inflate(tasks, 6212 * 1000, DrawBudget(0))


def test_the_clone_loop_stops_at_the_bound_whatever_it_draws():
    # The mean request reaches 130% within 26 tasks, but the draws keep taking the CPU-only task.
    tasks = [GpuTask("gpu", 1000, 1000, 1, 1000), GpuTask("cpu", 1000, 1000)]
    with pytest.raises(OpenbError, match=f"passed {MAX_INFLATED_TASKS} tasks"):
        inflate(tasks, 10 * 1000, DrawBudget(MAX_INFLATED_TASKS + 1, pick=lambda n: n - 1))


def test_the_cli_refuses_a_cpu_only_list_with_exit_2(tmp_path):
    from click.testing import CliRunner

    from condor_sched.cli import main

    rows = "".join(f"p{i},1000,1000,0,0,,LS,Running,0,10,0\n" for i in range(50))   # the probe's list
    pods = write(tmp_path, "pods.csv", POD_HEADER + rows)
    nodes = write(tmp_path, "nodes.csv", NODE_HEADER + "".join(NODE_ROWS))
    result = CliRunner().invoke(main, ["simulate", f"--workload=openb:{pods}", f"--inventory=openb:{nodes}", "--json"])
    assert result.exit_code == 2 and "no task of the list requests a GPU" in result.output


# --- SWF ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("field, value", [
    (8, "1.7e308"),      # 4 x processors overflowed to inf: OverflowError in swf_request
    (8, "1e9"),
    (4, "1e300"),
    (2, "-2"),
    (11, "6"),
    (9, "inf"),
    (1, "nan"),
    (10, "1" * 400),
])
def test_an_swf_field_out_of_range_names_file_line_field_and_range(tmp_path, field, value):
    name = list(SWF_BOUNDS)[field - 1]
    path = write(tmp_path, "t.swf", "; RICC\n" + SWF_ROWS[0] + with_value(SWF_ROWS[1], field - 1, value, " "))
    for reader in (read_swf, lambda p: read_swf_nodes(p, 8)):
        with pytest.raises(WorkloadError) as err:
            reader(path)
        message = str(err.value)
        assert f"t.swf:3: field '{name}' is not a number in -1..{SWF_BOUNDS[name]} (field {field})" in message


# --- the real traces --------------------------------------------------------------------------

def test_real_rows_are_admitted(tmp_path):
    fleet = read_openb_nodes(write(tmp_path, "nodes.csv", NODE_HEADER + "".join(NODE_ROWS)))
    assert list(fleet.gpu_count) == [2, 8, 1, 4]
    tasks = read_openb_tasks(write(tmp_path, "pods.csv", POD_HEADER + "".join(POD_ROWS)))
    assert [t.task.gpu_milli for t in tasks] == [1000, 460, 0, 1000, 1000] and tasks[3].scheduled_s is None
    assert len(read_swf_nodes(write(tmp_path, "t.swf", "".join(SWF_ROWS)), 8).jobs) == 3


def test_every_real_trace_file_is_admitted_where_the_shared_traces_are():
    """The project's layout puts the traces in ../shared/traces; every file there reads."""
    for path in sorted(TRACES.glob("openb_pod_list_*.csv")):
        assert len(read_openb_tasks(path)) > 7000
    for path in sorted(TRACES.glob("openb_node_list_*.csv")):
        assert len(read_openb_nodes(path)) == 1213
    for path in sorted(TRACES.parent.glob("*.swf")):
        assert len(read_swf_nodes(path, 8).jobs) == 9978
