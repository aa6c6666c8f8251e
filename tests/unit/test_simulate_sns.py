"""The simulator on paper 000's parallel CPU jobs: the profile model, invariants, determinism."""
from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from condor_sched.inventory import Inventory, Node, Socket
from condor_sched.model import Assignment, Plan, SlotKind
from condor_sched.modes.planning import PlanSettings, PolicyKind
from condor_sched.modes.registry import get_policy
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
    mg = default_profiles().get("MG")       # t(1) 97.5, t(2) 88.7, t(4) 81.6, t(8) 75
    gan = default_profiles().get("GAN")     # one node only: t(1) 600

    assert exclusive_runtime_s(mg, 3) == pytest.approx((88.7 + 81.6) / 2)
    assert exclusive_runtime_s(mg, 16) == pytest.approx(75.0)
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
    spec = spec_for("sns-random", policy, 5.0, PlanSettings(spread_age_limit_cycles=60, solver_time_limit_s=0.2), nodes=4)

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


class Crowded:
    """A test policy: all procs of every job on the first socket slot, no ways or bandwidth."""

    name = "test-crowded"
    kind = PolicyKind.SPREAD

    def plan(self, request, settings):
        slot = next(s for s in request.slots if s.kind is SlotKind.SOCKET)
        return Plan(self.name, tuple(Assignment(j.key, slot.name, {"llc_ways": 0, "group_llc_ways": 0,
                                                                   "mem_bw_gbs": 0.0}) for j in request.idle))


def test_crowding_procs_beyond_the_profiled_layout_is_charged():
    # One node, two sockets of 4 cores and 10 GB/s. A: 4 procs at 3.75 GB/s each; profiled
    # "8 cores per socket" style, 2 procs per socket = 7.5 GB/s, within the peak, rate 1.
    # All 4 on one socket demand 15 GB/s: the socket gives 10, so A runs at 10/15 and its
    # 100 s take 150 s (Section 2: a socket's bandwidth does not grow with its cores).
    store = ProfileStore.of([flat("A", 100.0, 3.75)])
    node = Inventory((Node("n1", 8, 8192, (Socket(0, 20, 10.0), Socket(1, 20, 10.0))),))
    crowded = simulate([cpu_job(0, "A", 100.0, procs=4)], node, Crowded(), cycle_s=1000.0,
                       model=ProfileDrivenModel(store), profiles=store)
    assert crowded.jobs[0].end_s == pytest.approx(150.0)
    # cs splits the procs 2 + 2, the profiled layout: exactly t(1)
    balanced = simulate([cpu_job(0, "A", 100.0, procs=4)], node, get_policy("cs"), cycle_s=1000.0,
                        model=ProfileDrivenModel(store), profiles=store)
    assert balanced.jobs[0].end_s == pytest.approx(100.0)


def test_spreading_a_scaling_job_pays_its_profiled_speedup():
    # The gain SNS relies on: MG alone on the 8-node pool runs t(8) under sns and t(1) under ce.
    store = default_profiles()
    mg = store.get("MG")
    job = SimJob(0, "MG", 0, 0, mg.runtime_s[1], procs=16, alpha=0.9)
    runs = {}
    for policy in ("ce", "sns"):
        spec = spec_for("sns-random", policy, 5.0, PlanSettings(spread_age_limit_cycles=10**6))
        result = simulate([job], xeon_inventory(8), get_policy(policy), cycle_s=5.0, model=spec.model,
                          settings=spec.settings, profiles=store)
        runs[policy] = (result.jobs[0].scale, result.jobs[0].end_s - result.jobs[0].start_s)
    assert runs["ce"] == (1.0, pytest.approx(mg.runtime_s[1]))
    # alone, the job gets every way of its sockets back (Section 4.4), so exactly t(8)
    assert runs["sns"] == (8.0, pytest.approx(mg.runtime_s[8]))


def test_parallel_jobs_turn_starving_on_the_spread_limit():
    # MG (7.25 GB/s per process at its w ways) on one node of two 20 GB/s sockets fits
    # only relaxed: sns places it once it has aged spread_age_limit_cycles, whatever the
    # device limit.
    store = default_profiles()
    node = Inventory((Node("n1", 16, 65536, (Socket(0, 20, 20.0), Socket(1, 20, 20.0))),))
    job = SimJob(0, "MG", 0, 0, store.get("MG").runtime_s[1], procs=16, alpha=0.9)
    starts = {}
    for spread in (4, 12):
        result = simulate([job], node, get_policy("sns"), cycle_s=5.0, model=ProfileDrivenModel(store),
                          profiles=store, settings=PlanSettings(age_limit_cycles=10**6, spread_age_limit_cycles=spread))
        starts[spread] = result.jobs[0].start_s
    assert 12 * 5.0 <= starts[12] and 4 * 5.0 <= starts[4] < starts[12]
