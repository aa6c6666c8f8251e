"""The openb trace readers and the inflation protocol of Weng et al. (ATC '23) (issue 13)."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pytest

from condor_sched.modes.gpus.fleet import GpuFleet, GpuTask
from condor_sched.modes.registry import gpu_policy
from condor_sched.simulate.openb import (
    MODEL_GPU_MEMORY_MB,
    OpenbError,
    allocation_curve,
    inflate,
    read_openb_nodes,
    read_openb_tasks,
    run_inflation,
)

NODES = "sn,cpu_milli,memory_mib,gpu,model\nn-0,64000,262144,2,P100\nn-1,96000,786432,8,G2\n"
PODS = ("name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,scheduled_time\n"
        "p-0,12000,16384,1,1000,,LS,Running,0,12537496,0\n"
        "p-1,6000,12288,1,460,V100M16|T4,LS,Running,427061,12902960,427061\n"
        "p-2,4000,8192,0,0,,BE,Pending,5,,\n"
        "p-3,88000,327680,8,1000,,BE,Succeeded,9,20,10\n")


def write(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text)
    return path


def test_nodes_become_a_fleet_with_one_gpu_per_count_and_the_model_memory(tmp_path):
    fleet = read_openb_nodes(write(tmp_path, "nodes.csv", NODES))
    assert fleet.names == ["n-0", "n-1"]
    assert list(fleet.gpu_count) == [2, 8] and fleet.total_gpu_milli == 10000
    assert list(fleet.cpu_total_milli) == [64000, 96000] and list(fleet.memory_total_mib) == [262144, 786432]
    assert fleet.gpu_memory_total_mb[0, :2].tolist() == [MODEL_GPU_MEMORY_MB["P100"]] * 2
    assert fleet.gpu_memory_total_mb[1].tolist() == [MODEL_GPU_MEMORY_MB["G2"]] * 8


def test_pods_become_tasks_with_models_and_times(tmp_path):
    tasks = read_openb_tasks(write(tmp_path, "pods.csv", PODS))
    assert [t.task.name for t in tasks] == ["p-0", "p-1", "p-2", "p-3"]
    share = tasks[1]
    assert (share.task.gpus, share.task.gpu_milli, share.task.models) == (1, 460, frozenset({"V100M16", "T4"}))
    assert share.task.gpu_memory_mb is None   # its compute share of the GPU's memory
    assert (share.creation_s, share.scheduled_s, share.deletion_s) == (427061, 427061, 12902960)
    assert (tasks[2].task.gpus, tasks[2].scheduled_s, tasks[2].deletion_s) == (0, None, None)
    assert tasks[3].task.gpu_milli_total == 8000


def test_multigpu_lists_have_five_columns_and_no_times(tmp_path):
    tasks = read_openb_tasks(write(tmp_path, "m.csv", "name,cpu_milli,memory_mib,num_gpu,gpu_milli\np,1000,10,2,1000\n"))
    assert tasks[0].task.gpus == 2 and tasks[0].creation_s is None and tasks[0].task.models is None


@pytest.mark.parametrize("text, line, column", [
    ("name,cpu_milli,memory_mib,num_gpu\np,1,1,0\n", 1, "gpu_milli"),
    ("name,cpu_milli,memory_mib,num_gpu,gpu_milli\np,1,1,0,0\nq,x,1,0,0\n", 3, "cpu_milli"),
    ("name,cpu_milli,memory_mib,num_gpu,gpu_milli\np,1,-5,0,0\n", 2, "memory_mib"),
    ("name,cpu_milli,memory_mib,num_gpu,gpu_milli\np,1,1,1,1001\n", 2, "gpu_milli"),
    ("name,cpu_milli,memory_mib,num_gpu,gpu_milli\np,1,1,2,500\n", 2, "gpu_milli"),
    ("name,cpu_milli,memory_mib,num_gpu,gpu_milli\np,1,1,0,300\n", 2, "gpu_milli"),
    ("name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec\np,1,1,1,300,H100\n", 2, "gpu_spec"),
    ("name,cpu_milli,memory_mib,num_gpu,gpu_milli\np,1,1,1.5,300\n", 2, "num_gpu"),
])
def test_bad_pod_lists_name_file_line_and_column(tmp_path, text, line, column):
    path = write(tmp_path, "bad.csv", text)
    with pytest.raises(OpenbError) as err:
        read_openb_tasks(path)
    assert str(path) in str(err.value) and f"line {line}" in str(err.value) and column in str(err.value)


@pytest.mark.parametrize("text, line, column", [
    ("sn,cpu_milli,memory_mib,gpu,model\nn,1,1,2,RTX9\n", 2, "model"),
    ("sn,cpu_milli,memory_mib,gpu\nn,1,1,2\n", 1, "model"),
    ("sn,cpu_milli,memory_mib,gpu,model\nn,1,1,-2,T4\n", 2, "gpu"),
])
def test_bad_node_lists_name_file_line_and_column(tmp_path, text, line, column):
    path = write(tmp_path, "bad_nodes.csv", text)
    with pytest.raises(OpenbError) as err:
        read_openb_nodes(path)
    assert str(path) in str(err.value) and f"line {line}" in str(err.value) and column in str(err.value)


def one_gpu_nodes(count: int, cpu: int = 8000) -> GpuFleet:
    return GpuFleet([f"n{i:03d}" for i in range(count)], ["T4"] * count, [cpu] * count, [65536] * count,
                    [[16000]] * count)


def mixed_tasks(count: int, seed: int = 0) -> list[GpuTask]:
    rng = np.random.default_rng(seed)
    tasks = []
    for i in range(count):
        kind = rng.integers(3)
        if kind == 0:
            tasks.append(GpuTask(f"t{i:03d}", 1000, 1024))
        elif kind == 1:
            tasks.append(GpuTask(f"t{i:03d}", 1000, 1024, 1, int(rng.integers(1, 10)) * 100))
        else:
            tasks.append(GpuTask(f"t{i:03d}", 1000, 1024, 1, 1000))
    return tasks


def test_clones_fill_requests_up_to_130_percent_of_capacity():
    tasks = mixed_tasks(50)
    capacity = 100 * 1000
    arrivals = inflate(tasks, capacity, np.random.default_rng(3))
    requested = sum(t.gpu_milli_total for t in arrivals)
    # The first draw that would pass 130% stops the clones: within one GPU of the limit.
    assert 1.3 * capacity - 1000 < requested <= 1.3 * capacity
    assert sorted(t.name for t in arrivals[:50]) == sorted(t.name for t in tasks)   # all originals, shuffled
    assert [t.name for t in arrivals[:50]] != [t.name for t in tasks]
    assert all("-tuned-" in t.name for t in arrivals[50:])


def test_whole_gpu_tasks_on_one_gpu_nodes_fill_the_cluster_exactly_at_100_percent():
    fleet = one_gpu_nodes(100)
    tasks = [GpuTask(f"t{i}", 1000, 1024, 1, 1000) for i in range(40)]
    result = run_inflation(fleet, tasks, gpu_policy("best-fit"), seed=1)
    # 130 tasks of a whole GPU (130%); the first 100 take every GPU, the other 30 fail.
    assert (result.tasks, result.clones, result.failed_tasks, result.failed_tasks_at_100) == (130, 90, 30, 0)
    assert result.unallocated_gpu_pct_at_100 == 0.0
    assert result.curve == [[float(p), float(100 - min(p, 100))] for p in range(0, 131)]


@pytest.mark.parametrize("name", ["random-fit", "best-fit", "fgd"])
def test_inflation_curve_has_a_point_per_percent_and_never_regains_gpus(name):
    fleet = GpuFleet([f"n{i}" for i in range(20)], ["T4"] * 20, [16000] * 20, [65536] * 20, [[16000] * 4] * 20)
    result = run_inflation(fleet, mixed_tasks(120), gpu_policy(name), seed=2)
    points = [p for p, _ in result.curve]
    assert set(range(75, 131)) <= set(points) and points == sorted(set(points))
    unallocated = [u for _, u in result.curve]
    assert all(a >= b for a, b in zip(unallocated, unallocated[1:]))   # tasks never finish
    assert result.to_json()["failed_tasks"] == result.failed_tasks
    assert result.unallocated_gpu_pct_at_100 == dict(result.curve)[100]


@dataclass
class NeverPlaces:
    """A stand-in policy that records each batch it is given and places nothing."""

    name: str = "stub"
    batches: list = field(default_factory=list)

    def place(self, fleet, tasks, context):
        self.batches.append([t.name for t in tasks])
        return [None] * len(tasks)


def test_batches_are_planned_once_and_unplaced_tasks_are_never_retried():
    fleet = one_gpu_nodes(10)
    tasks = [GpuTask(f"t{i}", 1000, 1024, 1, 500) for i in range(10)]
    stub = NeverPlaces()
    result = run_inflation(fleet, tasks, stub, seed=0, batch=4)
    names = [n for batch in stub.batches for n in batch]
    assert len(names) == len(set(names)) == result.tasks       # each task offered once
    assert [len(b) for b in stub.batches[:-1]] == [4] * (len(stub.batches) - 1)
    assert result.failed_tasks == result.tasks                  # nothing placed, nothing retried
    assert result.unallocated_gpu_pct_at_100 == 100.0


def test_one_by_one_baselines_give_the_same_result_in_batches():
    fleet = GpuFleet([f"n{i}" for i in range(20)], ["T4"] * 20, [16000] * 20, [65536] * 20, [[16000] * 4] * 20)
    tasks = mixed_tasks(120, seed=5)
    online = run_inflation(fleet, tasks, gpu_policy("best-fit"), seed=4, batch=1)
    batched = run_inflation(fleet, tasks, gpu_policy("best-fit"), seed=4, batch=16)
    assert online.curve == batched.curve and online.failed_tasks == batched.failed_tasks


def test_same_seed_same_run_and_the_input_fleet_is_untouched():
    fleet = GpuFleet([f"n{i}" for i in range(20)], ["T4"] * 20, [16000] * 20, [65536] * 20, [[16000] * 4] * 20)
    tasks = mixed_tasks(120)
    a = run_inflation(fleet, tasks, gpu_policy("random-fit"), seed=7)
    b = run_inflation(fleet, tasks, gpu_policy("random-fit"), seed=7)
    assert a.to_json() == b.to_json()
    assert fleet.allocated_gpu_milli() == 0


def test_curve_averages_the_rows_of_each_rounded_percentage():
    # Capacity 1 GPU: rows at 99.6% and 100.4% arrived round to 100; allocation 90% and 92%.
    arrived = np.array([0, 996, 1004])
    allocated = np.array([0, 900, 920])
    curve = dict(allocation_curve(arrived, allocated, 1000, top_pct=101))
    assert curve[100] == pytest.approx(100 - 91.0)
    assert curve[101] == pytest.approx(100 - 91.0)   # no row at 101: rows within one point
