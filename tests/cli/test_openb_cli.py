"""``condor-sched simulate`` on openb GPU traces (issue 13), via CliRunner, on small hand-made lists."""
import json

import pytest
from click.testing import CliRunner

from condor_sched.cli import main
from condor_sched.settings import SidecarSettings

NODES = "sn,cpu_milli,memory_mib,gpu,model\nn0,32000,131072,2,T4\nn1,32000,131072,1,V100M32\n"
HEADER = "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,scheduled_time\n"
PODS = HEADER + "".join([
    "p0,4000,8192,1,500,,LS,Running,0,100,0\n",
    "p1,4000,8192,1,500,,LS,Running,10,200,12\n",
    "p2,2000,4096,1,1000,T4,LS,Running,20,50,20\n",
    "p3,1000,1024,0,0,,BE,Running,30,90,30\n",
    "p4,1000,1024,1,250,,BE,Failed,40,45,\n",
])


@pytest.fixture
def trace(tmp_path):
    (tmp_path / "nodes.csv").write_text(NODES)
    (tmp_path / "pods.csv").write_text(PODS)
    return [f"--workload=openb:{tmp_path / 'pods.csv'}", f"--inventory=openb:{tmp_path / 'nodes.csv'}"]


def simulate(*args):
    return CliRunner().invoke(main, ["simulate", *args], catch_exceptions=False)


@pytest.mark.parametrize("batch", ["1", "16"])
def test_inflation_prints_the_papers_keys_with_a_point_per_percent(trace, batch):
    result = simulate(*trace, "--protocol", "inflation", "--policy", "best-fit", "--seed", "3", "--batch", batch,
                      "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert {"unallocated_gpu_pct_at_100", "curve", "failed_tasks"} <= set(report)
    assert 0.0 <= report["unallocated_gpu_pct_at_100"] <= 100.0
    arrived = [point[0] for point in report["curve"]]
    assert arrived == sorted(arrived) and all(b - a == 1 for a, b in zip(arrived, arrived[1:]))
    assert arrived[-1] >= 100


def test_sequences_report_each_seed_and_their_median(trace):
    result = simulate(*trace, "--policy", "random-fit", "--seed", "5", "--sequences", "3", "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    figures = sorted(run["unallocated_gpu_pct_at_100"] for run in report["sequences"])
    assert [run["seed"] for run in report["sequences"]] == [5, 6, 7]
    assert report["unallocated_gpu_pct_at_100"] == figures[1]


def test_without_policy_openb_runs_the_sidecars_gpu_default(trace):
    report = json.loads(simulate(*trace, "--json").output)
    assert report["policy"] == SidecarSettings().gpu_policy


def test_replay_prints_the_keys_of_other_workloads(trace):
    for policy in ("native-whole", "best-fit"):
        result = simulate(*trace, "--protocol", "replay", "--policy", policy, "--cycle-s", "5", "--json")
        assert result.exit_code == 0, result.output
        report = json.loads(result.output)
        assert {"mean_wait_s", "makespan_s", "gpu_utilization", "memory_oversubscriptions"} <= set(report)
        assert report["tasks_never_scheduled"] == 1  # p4 has no scheduled_time


@pytest.mark.parametrize("extra, message", [
    (["--jobs", "10"], "--jobs"), (["--nodes", "1"], "--nodes"),
    (["--protocol", "replay", "--batch", "16"], "--batch belongs"),
    (["--protocol", "inflation", "--cycle-s", "5"], "--cycle-s belongs"),
    (["--policy", "no-such"], "no-such"), (["--protocol", "bogus"], "bogus"), (["--batch", "0"], "--batch"),
])
def test_bad_openb_options_are_usage_errors(trace, extra, message):
    result = simulate(*trace, *extra, "--json")
    assert result.exit_code == 2
    assert message in result.output


def test_openb_needs_both_files_and_names_the_bad_one(trace, tmp_path):
    assert "--inventory" in simulate(trace[0], "--json").output
    result = simulate(trace[0], f"--inventory=openb:{tmp_path / 'missing.csv'}", "--json")
    assert result.exit_code == 2 and "missing.csv" in result.output
    (tmp_path / "bad.csv").write_text(HEADER + "p0,4000,8192,1,1500,,LS,Running,0,100,0\n")
    result = simulate(f"--workload=openb:{tmp_path / 'bad.csv'}", trace[1], "--json")
    assert result.exit_code == 2 and "bad.csv" in result.output and "gpu_milli" in result.output


def test_batch_is_refused_for_other_workloads():
    result = simulate("--workload", "phi-table1", "--jobs", "5", "--batch", "4")
    assert result.exit_code == 2 and "openb" in result.output
