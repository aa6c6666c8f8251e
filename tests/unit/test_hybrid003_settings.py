"""Paper 003's simulator under what the text leaves open (``hybrid003_model.ModelSettings``):
each setting's validation, its effect on the jobs and the run, the CLI flags and the report."""
from __future__ import annotations

import json
import math

import pytest
from click.testing import CliRunner

from condor_sched.simulate import hybrid003_report, hybrid003_settings
from condor_sched.simulate.command import simulate_command
from condor_sched.simulate.hybrid003 import SPARE_POLICIES, metrics, run_policy, walltime
from condor_sched.simulate.hybrid003_model import ModelSettings, calibrate
from condor_sched.simulate.hybrid003_workload import APPS, SEQUENTIAL_SHARE, generate, scaled_apps

TIME_SLICING = ModelSettings(interference="time-slicing")


@pytest.mark.parametrize("kwargs, words", [
    ({"interference": "cache"}, "interference must be shared or time-slicing"),
    ({"parallel_idle": -0.1}, "parallel_idle must be in [0, 1]"),
    ({"parallel_idle": 1.5}, "parallel_idle must be in [0, 1]"),
    ({"parallel_idle": math.nan}, "parallel_idle must be in [0, 1]"),
    ({"deadlines": "never"}, "deadlines must be kill or overrun"),
])
def test_settings_refuse_what_they_cannot_mean(kwargs, words):
    with pytest.raises(ValueError, match=words.replace("[", r"\[").replace("]", r"\]")):
        ModelSettings(**kwargs)


def test_label_names_only_what_differs():
    assert ModelSettings().label() == "defaults"
    assert ModelSettings("time-slicing", 0.5).label() == "interference time-slicing, parallel_idle 0.5"
    assert ModelSettings(deadlines="overrun").label() == "deadlines overrun"


def test_busier_primaries_change_only_the_parallel_stages():
    assert scaled_apps(1.0) is APPS
    busy, half = scaled_apps(0.0), scaled_apps(0.5)
    for name, app in APPS.items():
        stages = [s for s, _ in app.head] + list(app.cycle) + [s for s, _ in app.tail]
        scaled = [s for s, _ in busy[name].head] + list(busy[name].cycle) + [s for s, _ in busy[name].tail]
        halves = [s for s, _ in half[name].head] + list(half[name].cycle) + [s for s, _ in half[name].tail]
        for old, new, mid in zip(stages, scaled, halves):
            if old.first_share <= SEQUENTIAL_SHARE:
                assert new == old == mid
            else:
                assert new.first_share == new.rest_share == 1.0 and new.mean_s == old.mean_s
                assert mid.first_share == pytest.approx(1 - (1 - old.first_share) / 2)


def test_busier_primaries_keep_the_seeds_jobs():
    plain, busy = generate(8, 3), generate(8, 3, 0.0)
    for a, b in zip(plain, busy, strict=True):
        assert (a.app, a.cores, a.runtime_s, a.requested_s, a.arrival_s) == (b.app, b.cores, b.runtime_s,
                                                                               b.requested_s, b.arrival_s)
        assert [s.end_s for s in a.segments] == [s.end_s for s in b.segments]
        assert all(y.first_share >= x.first_share for x, y in zip(a.segments, b.segments))
        assert b.mean_share() >= a.mean_share()
    assert sum(j.mean_share() for j in busy) > sum(j.mean_share() for j in plain)
    assert calibrate(0.0)["montage"] != calibrate(1.0)["montage"]


@pytest.mark.parametrize("policy", SPARE_POLICIES)
def test_time_slicing_reading_never_slows_a_primary_where_shared_does(policy):
    """Under time-slicing the idle class removes Table I's slowdown beyond the CPU share, and the
    cap leaves the primaries all the CPU they demand: every HPC job runs at its vanilla pace."""
    slowed = False
    for seed in (1, 2):
        result = run_policy(4, policy, seed, TIME_SLICING)
        for job in result.jobs:
            if job.hpc:
                out = result.outcomes[job.index]
                assert not out.missed
                assert walltime(result, job.index) == pytest.approx(job.runtime_s, abs=1e-6)
        shared = run_policy(4, policy, seed)
        slowed |= any(walltime(shared, j.index) > j.runtime_s + 1 for j in shared.jobs if j.hpc)
    assert slowed, "the shared reading slowed no HPC job: the comparison shows nothing"


def test_overrun_lets_a_late_job_finish_and_counts_it_missed():
    model = ModelSettings(deadlines="overrun")
    killed = run_policy(4, "hybrid", 1)
    late = [j for j in killed.jobs if killed.outcomes[j.index].killed]
    assert late, "seed 1 no longer kills a job under hybrid: pick a seed that does"
    ran_on = run_policy(4, "hybrid", 1, model)
    assert not any(o.killed for o in ran_on.outcomes.values())
    over = [j for j in ran_on.jobs if ran_on.outcomes[j.index].overran]
    assert over
    for job in over:
        assert walltime(ran_on, job.index) > job.requested_s
    vanilla = run_policy(4, "vanilla", 1, model)
    assert metrics(ran_on, vanilla)["missed_deadlines"] == pytest.approx(len(over) / len(ran_on.jobs), abs=1e-6)


def test_cli_takes_the_settings_for_hybrid_003_only():
    runner = CliRunner()
    base = ["--workload", "hybrid-003", "--nodes", "4", "--policy", "hybrid", "--seed", "1", "--json"]
    out = runner.invoke(simulate_command, base + ["--interference", "time-slicing"])
    assert out.exit_code == 0, out.output
    assert json.loads(out.output)["primary_slowdown"] == 0
    out = runner.invoke(simulate_command, base + ["--parallel-idle", "0", "--deadlines", "overrun"])
    assert out.exit_code == 0, out.output
    assert json.loads(out.output) != json.loads(runner.invoke(simulate_command, base).output)
    out = runner.invoke(simulate_command, base + ["--parallel-idle", "1.5"])
    assert out.exit_code == 2 and "--parallel-idle" in out.output
    out = runner.invoke(simulate_command, base + ["--deadlines", "never"])
    assert out.exit_code == 2 and "--deadlines" in out.output
    out = runner.invoke(simulate_command, ["--workload", "phi-table1", "--jobs", "5", "--interference", "shared"])
    assert out.exit_code == 2 and "--interference: only for --workload hybrid-003" in out.output


def _fake(task) -> dict:
    nodes, policy, seed, *model = task
    value = 1.0 + nodes / 100 + seed / 1000 + (0.5 if policy == "hybrid" else 0)
    keys = ("makespan_s", "mean_wait_s", "cpu_utilization", "missed_deadlines", "guest_core_hours",
            "primary_slowdown", "hpc_walltime_ratio", "reclaimed_core_hours", "di_turnaround_s", "hpc_killed")
    return {**{k: value for k in keys}, "app_walltime_s": {a: [value] for a in APPS}}


class _Read(dict):
    """Remembers the keys read."""

    def __init__(self, items) -> None:
        super().__init__(items)
        self.read: set = set()

    def __getitem__(self, key):
        self.read.add(key)
        return super().__getitem__(key)


@pytest.mark.parametrize("quick", [True, False])
def test_report_reads_every_run_it_asks_for(quick):
    """The section reads exactly the runs ``tasks`` asks for: a run missing raises, none is left
    unread, and every table row is closed."""
    tasks = hybrid003_report.tasks(quick) + hybrid003_settings.tasks(quick)
    assert len(set(tasks)) == len(tasks)
    results = _Read((t, _fake(t)) for t in tasks)
    lines = hybrid003_report.section(results, quick)
    assert results.read == set(tasks)
    assert all(line.endswith("|") for line in lines if line.startswith("|"))
    assert any("What the text leaves open" in line for line in lines)
    missing = dict(results)
    del missing[hybrid003_settings.tasks(quick)[-1]]
    with pytest.raises(KeyError):
        hybrid003_report.section(missing, quick)
