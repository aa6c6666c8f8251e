"""The simulator: invariants, a hand-computed schedule, determinism, workload readers."""
from __future__ import annotations

import json
import random

import pytest
from click.testing import CliRunner

from condor_sched.model import Assignment, Plan, SlotKind
from condor_sched.modes.planning import PlanSettings, PolicyKind
from condor_sched.modes.registry import policy_names
from condor_sched.simulate.command import simulate_command
from condor_sched.simulate.engine import phi_inventory, simulate
from condor_sched.simulate.metrics import run_metrics
from condor_sched.simulate.workloads import (
    DIVERSE_THREADS, SimJob, WorkloadError, distribution_jobs, diverse_jobs, level_request, load_workload, read_swf,
    read_yaml, table1_jobs,
)


class FirstFitMemory:
    """A trivial test policy: first fit by device memory only (threads ignored, like random)."""

    name = "test-first-fit"

    def plan(self, request, settings):
        jobs, slots = request.idle, request.slots
        free = {s.name: s.free.device_memory_mb for s in slots if s.kind is SlotKind.DEVICE}
        cpus = {s.name: s.free.cpus for s in slots if s.kind is SlotKind.DEVICE}
        out = []
        for job in jobs:
            for name in sorted(free):
                if job.request.device_memory_mb <= free[name] and cpus[name] >= 1:
                    free[name] -= job.request.device_memory_mb
                    cpus[name] -= 1
                    out.append(Assignment(job.key, name))
                    break
        return Plan(self.name, tuple(out))


class Greedy:
    """A broken test policy: puts every job on the first device, memory be damned."""

    name = "test-greedy"

    def plan(self, request, settings):
        jobs, slots = request.idle, request.slots
        device = next(s for s in slots if s.kind is SlotKind.DEVICE)
        return Plan(self.name, tuple(Assignment(j.key, device.name) for j in jobs))


def random_jobs(rng: random.Random, n: int) -> list[SimJob]:
    return [SimJob(i, "t", rng.choice([300, 1000, 3000, 5000]), rng.choice([60, 120, 180, 240]),
                   rng.uniform(1, 20), arrival_s=rng.choice([0.0, rng.uniform(0, 50)]),
                   offload_fraction=rng.choice([0.0, 0.5, 1.0, rng.random()]), offloads=rng.randint(1, 5))
            for i in range(n)]


@pytest.mark.parametrize("seed", range(6))
def test_simulation_runs_every_job_once_within_memory_and_conserves_work(seed):
    rng = random.Random(seed)
    jobs = random_jobs(rng, rng.randint(1, 40))
    peak: dict[str, int] = {}

    result = simulate(jobs, phi_inventory(rng.randint(1, 3)), FirstFitMemory(), cycle_s=rng.choice([1.0, 7.0]))

    assert sorted(r.job.index for r in result.jobs) == sorted(j.index for j in jobs)
    for r in result.jobs:
        assert r.start_s is not None and r.start_s >= r.job.arrival_s
        assert r.end_s >= r.start_s + r.job.exclusive_runtime_s - 1e-6
    # Memory: at every start instant, resident memory fits the device.
    for r in result.jobs:
        resident = [o for o in result.jobs if o.slot == r.slot and o.start_s <= r.start_s < o.end_s]
        peak[r.slot] = max(peak.get(r.slot, 0), sum(o.job.device_memory_mb for o in resident))
    assert all(m <= 8192 for m in peak.values())
    busy = sum(d.runtime.busy_thread_s for d in result.devices)
    assert busy == pytest.approx(sum(j.device_thread_s for j in jobs), rel=1e-9, abs=1e-6)
    assert run_metrics(result)["memory_oversubscriptions"] == 0


def test_a_plan_beyond_device_memory_is_counted_and_refused():
    jobs = [SimJob(0, "t", 5000, 60, 10.0, offloads=1), SimJob(1, "t", 5000, 60, 10.0, offloads=1)]

    result = simulate(jobs, phi_inventory(1), Greedy(), cycle_s=10.0)

    # Cycle 0 starts job 0 and refuses job 1 (10000 MB > 8192 MB); job 0 ends at 10 s,
    # the cycle at 10 s starts job 1, which ends at 20 s.
    assert result.memory_oversubscriptions == 1
    assert [(r.start_s, r.end_s) for r in result.jobs] == [(0.0, 10.0), (10.0, 20.0)]


def test_a_refused_pin_is_kept_then_unpinned_and_planned_again_as_on_a_live_pool():
    jobs = [SimJob(0, "t", 5000, 60, 10.0, offloads=1), SimJob(1, "t", 5000, 60, 10.0, offloads=1)]

    result = simulate(jobs, phi_inventory(1), Greedy(), cycle_s=1.0)

    # Job 1's pin (cycle 0) is refused while job 0 holds the memory; it is kept in cycles 1
    # and 2, unpinned in cycle 3 (not matched within 3 cycles) and pinned again at once,
    # and so on until job 0 ends at 10 s and the cycle at 10 s starts it.
    assert result.unpins == 3 and result.pins_kept == 7
    assert [(r.start_s, r.end_s) for r in result.jobs] == [(0.0, 10.0), (10.0, 20.0)]


def test_hand_computed_makespan_of_two_full_device_jobs_sharing_one_device():
    # Fig. 2 of paper 002: J1 and J2 both offload with all 240 threads, so COSMIC
    # serialises their offloads. Each: 2 x (host 2 s, offload 3 s) = 10 s alone.
    # J1: host 0-2, offload 2-5, host 5-7, asks at 7 but J2 offloads until 8: offload 8-11.
    # J2: host 0-2, asks at 2 behind J1 (FIFO): offload 5-8, host 8-10, asks at 10 but
    #     J1 offloads until 11: offload 11-14.
    # Makespan 14 s (sequentially 20 s); waits 3 + 1 (J2) and 1 (J1): mean 2.5 s;
    # busy 4 offloads x 3 s x 240 threads.
    jobs = [SimJob(i, "fig2", 1000, 240, 10.0, offload_fraction=0.6, offloads=2) for i in range(2)]

    result = simulate(jobs, phi_inventory(1), FirstFitMemory(), cycle_s=60.0)
    metrics = run_metrics(result)

    assert metrics["makespan_s"] == pytest.approx(14.0)
    assert [r.end_s for r in result.jobs] == pytest.approx([11.0, 14.0])
    assert metrics["mean_offload_wait_s"] == pytest.approx(2.5)
    assert metrics["device_utilization"] == pytest.approx(4 * 3 * 240 / (240 * 14))
    # Resident threads 480 > 240 while both are resident, 0-11 s.
    assert metrics["thread_oversubscribed_s"] == pytest.approx(11.0)


def test_hand_computed_makespan_with_a_negotiation_cycle_gap():
    # Fig. 3-like halves: two 120-thread jobs overlap freely (5 s each, start at 0).
    # A third 8000 MB job does not fit beside them; they end at 5 s, but the next
    # negotiation cycle is at 20 s: it runs 20-25 s. Makespan 25 s.
    jobs = [SimJob(0, "a", 100, 120, 5.0, offloads=1), SimJob(1, "a", 100, 120, 5.0, offloads=1),
            SimJob(2, "b", 8000, 120, 5.0, offloads=1)]

    metrics = run_metrics(simulate(jobs, phi_inventory(1), FirstFitMemory(), cycle_s=20.0))

    assert metrics["makespan_s"] == pytest.approx(25.0)
    assert metrics["mean_wait_s"] == pytest.approx(20.0 / 3)


#: Paper 000's CPU policies place no device job (test_simulate_sns.py covers them).
CPU_POLICIES = {"ce", "cs", "sns", "sns-global"}


@pytest.mark.parametrize("policy", [p for p in policy_names() if p not in CPU_POLICIES
                                    and p not in policy_names(PolicyKind.NODE)      # test_sd_cli.py
                                    and p not in policy_names(PolicyKind.SPARE)     # test_hybrid003.py
                                    and p not in policy_names(PolicyKind.OVERCOMMIT)])  # refused below
def test_same_seed_gives_byte_identical_json_for_every_device_policy(policy):
    args = ["--workload", "phi-normal", "--jobs", "30", "--nodes", "2", "--policy", policy,
            "--seed", "7", "--cycle-s", "5", "--json"]

    first = CliRunner().invoke(simulate_command, args)
    second = CliRunner().invoke(simulate_command, args)

    assert first.exit_code == 0, first.output
    assert first.output == second.output
    report = json.loads(first.output)
    for key in ("makespan_s", "mean_wait_s", "mean_turnaround_s", "mean_slowdown", "throughput",
                "device_utilization", "memory_oversubscriptions", "thread_oversubscribed_s"):
        assert key in report
    assert report["memory_oversubscriptions"] == 0


def test_sequences_and_footprint_in_json():
    policy = "exclusive" if "exclusive" in policy_names() else policy_names()[0]
    result = CliRunner().invoke(simulate_command, [
        "--workload", "phi-low-skew", "--jobs", "24", "--nodes", "3", "--policy", policy, "--seed", "1",
        "--cycle-s", "5", "--sequences", "2", "--footprint-against", policy, "--json"])

    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert len(report["sequences"]) == 2
    assert report["sequences"][0]["seed"] != report["sequences"][1]["seed"]
    assert report["makespan_s"] == pytest.approx(sum(s["makespan_s"] for s in report["sequences"]) / 2, rel=1e-5)
    assert all(s["footprint_nodes"] == 3 or s["footprint_nodes"] < 3 for s in report["sequences"])


def test_table1_generator_follows_table_i():
    jobs = table1_jobs(500, seed=3)
    ranges = {"KM": (60, 300, 1250), "MC": (180, 400, 650), "MD": (180, 300, 750), "SG": (60, 500, 3400),
              "BT": (240, 300, 1250), "SP": (180, 300, 1850), "LU": (180, 400, 1250)}
    assert {j.program for j in jobs} == set(ranges)
    for j in jobs:
        threads, low, high = ranges[j.program]
        assert j.device_threads == threads and low <= j.device_memory_mb <= high
    assert table1_jobs(50, seed=3) == table1_jobs(500, seed=3)[:50]


def test_resource_levels_set_memory_and_threads_together():
    assert level_request(0.0) == (300, 60)
    assert level_request(1.0) == (3400, 240)
    assert level_request(0.5) == (1850, 180)
    low = distribution_jobs("low-skew", 400, 1)
    high = distribution_jobs("high-skew", 400, 1)
    assert sum(j.device_memory_mb for j in low) < sum(j.device_memory_mb for j in high)
    assert all(300 <= j.device_memory_mb <= 3400 and j.device_threads in (60, 120, 180, 240) for j in low + high)


def test_diverse_generator_draws_every_thread_size_and_memory_step_and_runs_bigger_jobs_longer():
    jobs = load_workload("phi-diverse", 2000, 5).jobs
    assert jobs == diverse_jobs(2000, 5) and diverse_jobs(40, 5) == jobs[:40]
    assert {j.device_threads for j in jobs} == set(DIVERSE_THREADS)
    assert {j.device_memory_mb for j in jobs} == set(range(200, 3401, 50))
    small = [j.exclusive_runtime_s for j in jobs if j.device_memory_mb == 200]
    large = [j.exclusive_runtime_s for j in jobs if j.device_memory_mb == 3400]
    assert max(small) < min(large)
    assert diverse_jobs(100, 6) != diverse_jobs(100, 5)


SWF = """; Version: 2.2
; Computer: test
1 0 5 100 4 -1 -1 4 200 204800 1 1 1 -1 1 1 -1 -1
2 10 -1 -1 16 -1 2097152 -1 300 -1 1 2 1 -1 1 1 -1 -1

3 20 -1 -1 -1 -1 -1 -1 -1 -1 0 3 1 -1 1 1 -1 -1
4 35 0 50 1 -1 -1 1 -1 -1 1 1 1 -1 1 1 -1 -1
"""


def test_swf_reader_maps_jobs_and_skips_jobs_without_run_time(tmp_path):
    path = tmp_path / "trace.swf"
    path.write_text(SWF)

    workload = read_swf(path)

    # Job 1: 4 processors -> 16 threads -> 60; 200 MB requested -> 300 (clipped); 100 s.
    # Job 2: no run time -> requested time 300 s; 16 allocated -> 64 -> 120 threads;
    #        used 2 GB -> 2048 MB -> 2050 (50 MB steps); arrives at 10 s.
    # Job 3: no run time at all: skipped with a reason. Job 4: no memory -> level of 60 threads.
    assert [(j.device_memory_mb, j.device_threads, j.exclusive_runtime_s, j.arrival_s) for j in workload.jobs] == [
        (300, 60, 100.0, 0.0), (2050, 120, 300.0, 10.0), (300, 60, 50.0, 35.0)]
    assert len(workload.skipped) == 1 and "run time" in workload.skipped[0].reason
    assert "trace.swf:6" in workload.skipped[0].what


@pytest.mark.parametrize("line, message", [
    ("1 0 5 100 4 -1 -1 4 200", "expected 18 fields, got 9"),
    ("1 0 5 abc 4 -1 -1 4 200 204800 1 1 1 -1 1 1 -1 -1", "field 'run_time' is not a number"),
])
def test_swf_reader_names_file_and_line_of_a_malformed_line(tmp_path, line, message):
    path = tmp_path / "bad.swf"
    path.write_text("; header\n" + line + "\n")

    with pytest.raises(WorkloadError, match=f"bad.swf:2: {message}"):
        read_swf(path)


def test_yaml_workload_and_its_errors(tmp_path):
    good = tmp_path / "w.yaml"
    good.write_text("jobs:\n  - {device_memory_mb: 800, device_threads: 60, runtime_s: 30, count: 3}\n"
                    "  - {program: SG, device_memory_mb: 3000, device_threads: 240, runtime_s: 5, arrival_s: 9}\n")
    bad = tmp_path / "b.yaml"
    bad.write_text("jobs:\n  - {device_memory_mb: 800, runtime_s: 30}\n")

    jobs = load_workload(str(good), None, 0).jobs

    assert len(jobs) == 4 and jobs[3].arrival_s == 9.0 and jobs[3].program == "SG"
    with pytest.raises(WorkloadError, match=r"b.yaml: jobs\[0\]: missing 'device_threads'"):
        read_yaml(bad)
    with pytest.raises(WorkloadError, match="not a built-in workload"):
        load_workload("phi-nothing", 10, 0)


def test_command_reports_bad_input_with_exit_code_2():
    result = CliRunner().invoke(simulate_command, ["--workload", "nope.txt", "--json"])

    assert result.exit_code == 2
    assert "not a built-in workload" in result.output


def test_same_seed_gives_identical_metrics_with_the_cp_sat_knapsack_solver():
    if "knapsack" not in policy_names():
        pytest.skip("knapsack policy not registered")
    from condor_sched.modes.registry import get_policy
    from condor_sched.simulate.metrics import to_json

    jobs = distribution_jobs("normal", 20, seed=4)
    settings = PlanSettings(knapsack_solver="ortools")

    runs = [to_json(run_metrics(simulate(jobs, phi_inventory(2), get_policy("knapsack"), seed=4, cycle_s=5.0,
                                         settings=settings))) for _ in range(2)]

    assert runs[0] == runs[1]


class Never:
    name = "test-never"

    def plan(self, request, settings):
        return Plan(self.name, ())


def test_a_policy_that_never_places_a_job_ends_the_run_with_a_clear_error():
    from condor_sched.simulate.engine import SimulationError

    with pytest.raises(SimulationError, match="can place none of the 1 idle jobs"):
        simulate([SimJob(0, "t", 300, 60, 1.0)], phi_inventory(1), Never(), cycle_s=5.0,
                 settings=PlanSettings(age_limit_cycles=3))


def test_thread_overcommit_lets_offloads_oversubscribe_and_only_then():
    def run(*extra: str) -> dict:
        result = CliRunner().invoke(simulate_command, ["--jobs", "60", "--nodes", "2", "--seed", "4", "--json", *extra])
        assert result.exit_code == 0, result.output
        return json.loads(result.output)

    hard, doubled = run(), run("--thread-overcommit", "2")
    assert hard["thread_oversubscribed_s"] == 0 and doubled["thread_oversubscribed_s"] > 0
    assert hard["memory_oversubscriptions"] == doubled["memory_oversubscriptions"] == 0


@pytest.mark.parametrize("policy", policy_names(PolicyKind.SPARE) + policy_names(PolicyKind.OVERCOMMIT))
def test_a_planner_of_another_kind_of_job_is_refused_on_a_device_workload(policy):
    run = CliRunner().invoke(simulate_command, ["--workload", "phi-normal", "--jobs", "5", "--policy", policy])
    assert run.exit_code == 2 and f"--policy {policy} places" in run.output and "lp-pack" in run.output
