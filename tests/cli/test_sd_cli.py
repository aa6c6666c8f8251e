"""``condor-sched simulate --cores-per-node`` (paper 001's whole-node CPU jobs), via CliRunner."""
import json

import pytest
from click.testing import CliRunner

from condor_sched.cli import main

KEYS = {"makespan_s", "mean_turnaround_s", "mean_slowdown", "malleable_jobs", "mate_jobs"}


@pytest.fixture
def trace(tmp_path):
    path = tmp_path / "small.swf"
    # Two whole-node jobs with long requests, then short ones that wait for them.
    rows = ["1 0 0 1000 -1 -1 -1 8 5000 -1 1 1 1 -1 1 -1 -1", "2 0 0 1000 -1 -1 -1 8 5000 -1 1 1 1 -1 1 -1 -1",
            "3 5 0 20 -1 -1 -1 16 40 -1 1 1 1 -1 1 -1 -1", "4 6 0 30 -1 -1 -1 8 60 -1 1 1 1 -1 1 -1 -1"]
    path.write_text("\n".join(rows) + "\n")
    return str(path)


def simulate(*args):
    return CliRunner().invoke(main, ["simulate", *args], catch_exceptions=False)


@pytest.mark.parametrize("extra", [["--policy", "backfill"],
                                   ["--policy", "sd", "--max-slowdown", "unbounded"],
                                   ["--policy", "sd", "--max-slowdown", "10", "--runtime-model", "worst"],
                                   ["--policy", "sd", "--max-slowdown", "dynamic"],
                                   ["--policy", "slurm-backfill"],
                                   ["--policy", "slurm-sd", "--max-slowdown", "unbounded"]])
def test_simulate_cpu_jobs_prints_the_papers_metrics_as_json(trace, extra):
    result = simulate("--workload", trace, "--cores-per-node", "8", "--nodes", "2", *extra, "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert KEYS <= set(report)
    assert report["jobs"] == 4 and report["nodes"] == 2
    if extra[1] == "sd" and extra[3] == "unbounded":
        assert report["malleable_jobs"] == 2 and report["mate_jobs"] == 2
    if extra[1] in ("backfill", "slurm-backfill"):
        assert report["malleable_jobs"] == 0
    if extra[1].startswith("slurm"):
        assert (report["bf_interval_s"], report["bf_window_s"], report["bf_max_job_test"],
                report["bf_resolution_s"]) == (30, 86400, 100, 60)
    if extra[1] == "slurm-sd":  # the 2-node job takes both mates at a tick, the 1-node one after it
        assert report["malleable_jobs"] == 2 and report["mate_jobs"] == 2 and report["max_slowdown"] == "unbounded"


def test_simulate_cpu_jobs_refuses_bad_combinations(trace):
    assert simulate("--workload", trace, "--max-slowdown", "5").exit_code == 2
    assert simulate("--workload", trace, "--cores-per-node", "8").exit_code == 2  # no --nodes
    assert simulate("--workload", trace, "--cores-per-node", "8", "--nodes", "2", "--policy", "knapsack").exit_code == 2
    assert simulate("--workload", trace, "--cores-per-node", "8", "--nodes", "2", "--policy", "sd",
                    "--max-slowdown", "-1").exit_code == 2
    assert simulate("--workload", trace, "--cores-per-node", "8", "--nodes", "1").exit_code == 2  # 2-node job
