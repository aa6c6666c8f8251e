"""The simulator on paper 000's parallel CPU jobs: the profile model, invariants, determinism."""
from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from condor_sched.inventory import Inventory, Node, Socket
from condor_sched.model import Assignment, Plan, SlotKind
from condor_sched.policies.base import PlanSettings, PolicyKind, get_policy
from condor_sched.profiles import ProfileStore, parse_profile
from condor_sched.simulate.command import simulate_command
from condor_sched.simulate.engine import simulate, xeon_inventory
from condor_sched.simulate.metrics import run_metrics
from condor_sched.simulate.profile_model import ProfileDrivenModel, exclusive_runtime_s
from condor_sched.simulate.study import spec_for
from condor_sched.simulate.workloads import SimJob, default_profiles, load_workload, sns_random_jobs

SNS_POLICIES = ("ce", "cs", "sns", "sns-global")


def flat(program: str, runtime_s: float, bw_per_proc: float, ipc=((2, 1.0), (20, 1.0))):
    return parse_profile({"program": program, "max_scale": 1, "runtime_s": {1: runtime_s},
                          "curves": {1: {"ipc_llc": [list(p) for p in ipc],
                                         "bw_llc_gbs": [[2, bw_per_proc], [20, bw_per_proc]]}}})


def one_socket_node(cores: int = 4, peak_gbs: float = 10.0) -> Inventory:
    return Inventory((Node("n1", cores, 8192, (Socket(0, 20, peak_gbs),)),))


def cpu_job(index: int, program: str, runtime_s: float, procs: int = 2) -> SimJob:
    return SimJob(index, program, 0, 0, runtime_s, procs=procs)


class Explicit:
    """A test policy: every proc to the first socket slot, with the ways given per job."""

    name = "test-explicit"
    kind = PolicyKind.SPREAD

    def __init__(self, group_ways: dict[int, int]):
        self.group_ways = group_ways

    def plan(self, request, settings):
        jobs, slots = request.idle, request.slots
        slot = next(s for s in slots if s.kind is SlotKind.SOCKET)
        out = []
        for job in jobs:
            ways = self.group_ways[job.key.cluster - 2]
            out.append(Assignment(job.key, slot.name, {"llc_ways": ways // 2, "group_llc_ways": ways,
                                                       "mem_bw_gbs": 0.0}))
        return Plan(self.name, tuple(out))


def test_bandwidth_demand_of_one_and_a_half_peaks_slows_both_jobs_by_one_and_a_half():
    # One socket, peak 10 GB/s. A and B: 2 procs each at 3.75 GB/s per proc, so 7.5 GB/s
    # each (within the peak alone: rate 1 alone) and 15 GB/s = 1.5 x peak together.
    # Flat IPC curves: the ways do not matter. Both run at 10/15 = 2/3:
    # A and B (100 s of exclusive work each) end at 100 / (2/3) = 150 s.
    store = ProfileStore.of([flat("A", 100.0, 3.75), flat("B", 100.0, 3.75)])
    jobs = [cpu_job(0, "A", 100.0), cpu_job(1, "B", 100.0)]

    result = simulate(jobs, one_socket_node(), get_policy("cs"), cycle_s=1000.0,
                      model=ProfileDrivenModel(store), profiles=store)

    assert [(r.start_s, r.end_s) for r in result.jobs] == [(0.0, pytest.approx(150.0))] * 2
    metrics = run_metrics(result)
    assert metrics["alpha_violations"] == 2          # 150 s > 100 s / 0.9
    assert metrics["bw_oversubscribed_s"] == pytest.approx(150.0)


def test_rates_are_re_evaluated_when_a_co_runner_finishes():
    # As above, but B has 50 s of work: both at 2/3 until B ends at 50 / (2/3) = 75 s,
    # when A has done 75 x 2/3 = 50 s of its 100; alone, A does the other 50 s at rate 1
    # and ends at 125 s.
    store = ProfileStore.of([flat("A", 100.0, 3.75), flat("B", 50.0, 3.75)])
    jobs = [cpu_job(0, "A", 100.0), cpu_job(1, "B", 50.0)]

    result = simulate(jobs, one_socket_node(), get_policy("cs"), cycle_s=1000.0,
                      model=ProfileDrivenModel(store), profiles=store)

    assert [r.end_s for r in result.jobs] == pytest.approx([125.0, 75.0])
    assert result.pool.work_done_s == pytest.approx({0: 100.0, 1: 50.0})


def test_fewer_ways_lower_ipc_along_the_curve_until_the_co_runner_leaves():
    # A: IPC 0.5 at 2 ways, 1.0 at 20 (linear between), no bandwidth; it gets 10 ways,
    # B (flat IPC) the other 10, nothing is left over. A's IPC at 10 ways is
    # 0.5 + 0.5 x 8/18 = 13/18 of its full-cache IPC, so it runs at rate 13/18. B ends at
    # 50 s; A has done 50 x 13/18 = 36.11 s of work, and alone it gets all 20 ways back
    # (the leftover is given away, Section 4.4): the other 63.89 s at rate 1 -> 113.89 s.
    store = ProfileStore.of([flat("A", 100.0, 0.0, ipc=((2, 0.5), (20, 1.0))), flat("B", 50.0, 0.0)])
    jobs = [cpu_job(0, "A", 100.0), cpu_job(1, "B", 50.0)]

    result = simulate(jobs, one_socket_node(), Explicit({0: 10, 1: 10}), cycle_s=1000.0,
                      model=ProfileDrivenModel(store))

    assert [r.end_s for r in result.jobs] == pytest.approx([50 + 100 - 50 * 13 / 18, 50.0])


def test_exclusive_runtime_is_interpolated_between_profiled_scales_and_flat_beyond():
    mg = default_profiles().get("MG")       # t(1) 400, t(2) 362, t(4) 325, t(8) 295
    gan = default_profiles().get("GAN")     # one node only: t(1) 600

    assert exclusive_runtime_s(mg, 3) == pytest.approx((362 + 325) / 2)
    assert exclusive_runtime_s(mg, 16) == pytest.approx(295.0)
    assert exclusive_runtime_s(gan, 2) == pytest.approx(600.0)


def test_sns_random_sequences_have_the_papers_shape():
    programs = {p.program for p in default_profiles().profiles.values()}
    jobs = load_workload("sns-random", None, 5).jobs

    assert len(programs) == 12 and len(jobs) == 20
    assert all(j.procs in (16, 28) and j.program in programs and j.arrival_s == 0 and j.alpha == 0.9
               for j in jobs)
    assert all(j.exclusive_runtime_s == default_profiles().get(j.program).runtime_s[1] for j in jobs)
    assert sns_random_jobs(20, 5) == jobs and sns_random_jobs(20, 6) != jobs
    assert {j.procs for s in range(5) for j in sns_random_jobs(20, s)} == {16, 28}


@pytest.mark.parametrize("policy", SNS_POLICIES)
@pytest.mark.parametrize("seed", [1, 2])
def test_every_proc_runs_once_and_placements_never_exceed_a_socket(policy, seed):
    jobs = sns_random_jobs(10, seed)
    spec = spec_for("sns-random", policy, 5.0, PlanSettings(age_limit_cycles=60, solver_time_limit_s=0.2), nodes=4)

    result = simulate(jobs, spec.inventory, get_policy(policy), seed=seed, cycle_s=5.0, model=spec.model,
                      settings=spec.settings)

    assert result.invalid_assignments == 0 and result.refused_starts == 0
    totals = {s.slot.name: s.slot.total for s in result.sockets}
    for r in result.jobs:
        assert r.start_s is not None and r.end_s is not None
        assert len(r.allocations) == r.job.procs
        # Rates never exceed 1, and the work done is the exclusive run time at its scale.
        assert r.end_s - r.start_s >= r.exclusive_at_scale_s - 1e-6
        assert result.pool.work_done_s[r.job.index] == pytest.approx(r.exclusive_at_scale_s, rel=1e-9)
    # At every start instant, the procs resident on a socket fit it.
    for r in result.jobs:
        used: dict[str, list[float]] = {}
        for o in result.jobs:
            if o.start_s <= r.start_s < o.end_s:
                for slot, req in o.allocations:
                    u = used.setdefault(slot, [0, 0, 0.0])
                    u[0] += req.cpus
                    u[1] += req.llc_ways
                    u[2] += req.mem_bw_gbs
        for slot, (cpus, ways, bw) in used.items():
            total = totals[slot]
            assert cpus <= total.cpus and ways <= total.llc_ways and bw <= total.mem_bw_gbs + 1e-6


@pytest.mark.parametrize("policy", SNS_POLICIES)
def test_same_seed_gives_byte_identical_json_for_every_sns_policy(policy):
    args = ["--workload", "sns-random", "--jobs", "8", "--nodes", "4", "--policy", policy, "--seed", "3",
            "--cycle-s", "5", "--sequences", "2", "--json"]

    first = CliRunner().invoke(simulate_command, args)
    second = CliRunner().invoke(simulate_command, args)

    assert first.exit_code == 0, first.output
    assert first.output == second.output
    report = json.loads(first.output)
    assert report["model"] == "profile" and report["jobs"] == 8 and report["nodes"] == 4
    assert report["alpha_violations_total"] == sum(s["alpha_violations"] for s in report["sequences"])
    for key in ("throughput", "mean_turnaround_s", "alpha_violations", "mean_run_ratio"):
        assert key in report


def test_the_xeon_inventory_is_the_papers_cluster():
    node = xeon_inventory(8).nodes[0]

    assert len(xeon_inventory(8).nodes) == 8 and node.cores == 28
    assert [(s.llc_ways, s.mem_bw_gbs) for s in node.sockets] == [(20, 59.0), (20, 59.0)]
