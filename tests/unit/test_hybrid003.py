"""Paper 003's cluster workload in the simulator: the workload, the field's estimators, the
spare cap, the policies' placement rules, determinism and the ``--json`` keys."""
from __future__ import annotations

import json
import math
import random

import pytest
from click.testing import CliRunner

from cosched_node import insight, spare_duty
from condor_sched.simulate.command import simulate_command
from condor_sched.simulate.hybrid003 import (
    KEYS,
    PLAN_S,
    POLICIES,
    SPARE_POLICIES,
    STEP_S,
    Hybrid003Simulation,
    simulate_hybrid003,
)
from condor_sched.simulate.hybrid003_model import calibrate, collocated_ratio, fair_shares, reference_use
from condor_sched.simulate.hybrid003_workload import (
    APPS,
    ARRIVALS,
    CORES_PER_NODE,
    SIZES,
    HybridJob,
    Segment,
    generate,
    scaled_apps,
)
from condor_sched.simulate.spare_estimators import (
    AutopilotEstimator,
    BlbEstimator,
    DecayingHistogram,
    KoordinatorEstimator,
    autopilot_limit,
    koordinator_batch,
    spare_cap,
    spare_offer,
)


# --- the workload (Section IV-A) ------------------------------------------------------------

def test_workload_has_the_papers_arrivals_and_classes_over_the_three_sizes():
    for seed in (1, 2, 3):
        jobs = {n: generate(n, seed) for n in SIZES}
        assert {n: len(js) for n, js in jobs.items()} == {4: 16, 8: 28, 16: 41} == ARRIVALS
        assert sum(j.hpc for js in jobs.values() for j in js) == 52
        assert sum(not j.hpc for js in jobs.values() for j in js) == 33


def test_workload_cores_run_times_and_requested_times_follow_the_paper():
    ranges = {"montage": (32, 128), "nek5000": (32, 128), "blast": (32, 512), "statistics": (32, 128),
              "synthetic": (32, 512)}
    for n in SIZES:
        for seed in range(1, 6):
            jobs = generate(n, seed)
            assert [j.arrival_s for j in jobs] == sorted(j.arrival_s for j in jobs)
            for j in jobs:
                lo, hi = ranges[j.app]
                assert lo <= j.cores <= min(hi, n * CORES_PER_NODE) and j.cores % CORES_PER_NODE == 0
                assert abs(j.runtime_s / APPS[j.app].vanilla_s - 1) <= 0.05 + 1e-9
                assert j.requested_s % 1800 == 0 and j.runtime_s <= j.requested_s < j.runtime_s + 1800
                assert j.segments[-1].end_s == pytest.approx(j.runtime_s)
                assert 0 < j.mean_share() <= 1


# --- the field's estimators on hand-made series ------------------------------------------------

def test_koordinator_batch_is_total_less_safety_margin_system_and_usage():
    assert koordinator_batch(32, 10) == pytest.approx(32 - 32 * 0.4 - 10)          # 9.2 cores
    assert koordinator_batch(32, 10, system_used=2, reserved=3) == pytest.approx(32 - 12.8 - 3 - 10)
    assert koordinator_batch(100_000, 20_000, threshold_pct=65) == pytest.approx(100_000 - 35_000 - 20_000)
    assert koordinator_batch(32, 25) == 0.0                                           # never negative


def test_koordinator_estimator_uses_the_300_s_mean():
    est = KoordinatorEstimator(32.0)
    for t in range(11):                        # 60 s samples: 0..600 s
        est.observe(60.0 * t, 4.0 if t < 6 else 16.0)
    assert est.used() is None                  # 11 samples: under MIN_SAMPLES, as the other estimators
    est.observe(660.0, 16.0)
    # window (360, 660]: samples at 420..660 s, all 16 cores
    assert est.used() == pytest.approx(32 - koordinator_batch(32, 16.0)) == pytest.approx(12.8 + 16)


def test_decaying_histogram_percentile_and_half_life():
    hist = DecayingHistogram(bucket=1.0, half_life_s=100.0)
    for v in range(20):                        # 0..19, equal weights at one instant
        hist.add(0.0, v + 0.5)
    assert hist.percentile(0.95) == 19.0       # 19 of 20 samples at or under the bucket 18..19's top
    assert autopilot_limit(hist, 0.95, 0.10) == pytest.approx(19.0 * 1.1)
    old = DecayingHistogram(bucket=1.0, half_life_s=100.0)
    old.add(0.0, 10.5)                         # weight 1, then two samples one half-life later (weight 2 each)
    old.add(100.0, 2.5)
    old.add(100.0, 2.5)
    assert old.percentile(0.8) == 3.0          # 4 of 5 weight at 2..3
    assert old.percentile(0.81) == 11.0


def test_autopilot_estimator_is_p95_plus_ten_percent():
    est = AutopilotEstimator(bucket=0.5)
    for t in range(100):
        est.observe(60.0 * t, 30.0 if t % 10 == 0 else 10.0)   # 10% of samples at 30 cores
    assert est.used() == pytest.approx(30.5 * 1.1)


def test_hybrid_estimator_is_the_node_agents_insight_engine():
    """5 s samples into the agent's UsageStream (its window), estimated as spare_duty does."""
    rng = random.Random(5)
    est = BlbEstimator()
    agent = insight.UsageStream(insight.InsightSettings())
    for t in range(400):                         # 2,000 s of 5 s samples: more than the 1,800 s window
        v = rng.uniform(5, 25)
        est.observe(5.0 * t, v)
        agent.add(5.0 * t, v)
    assert len(est) == len(agent) == round(insight.InsightSettings().window_s / STEP_S) == 360
    assert est.used() == pytest.approx(agent.estimate().hard_limit)
    assert est.used() == est.used()              # a fresh Random(0) per estimate, as the agent's


def test_simulator_takes_the_agents_interval_floor_and_rules():
    assert STEP_S == spare_duty.SPARE_INTERVAL_S
    assert PLAN_S % STEP_S == 0
    for estimate, live in ((20.0, 10.0), (20.0, 25.0), (31.5, 0.0), (None, 0.0), (None, 30.0)):
        level = None if estimate is None else insight.Estimate(estimate, 0.0, 0.0, 12, 0.8)
        assert spare_cap(32, estimate, live) == spare_duty.node_limits(32, 1000, level, None, live, 0.0).cores
        assert spare_offer(32, estimate) == spare_duty.spare_offer(32, level)


def test_spare_cap_is_max_of_floor_and_capacity_less_estimate_or_live_use():
    assert spare_cap(32, 20.0, 10.0) == 12.0         # the estimate binds
    assert spare_cap(32, 20.0, 25.0) == 7.0          # a rise above Q + xi tightens it within the interval
    assert spare_cap(32, 31.5, 0.0) == pytest.approx(1.6)   # never under 5% of the node
    assert spare_cap(32, None, 0.0) == pytest.approx(1.6)   # no estimate yet: the floor
    assert spare_offer(32, None) == 0.0 and spare_offer(32, 40.0) == 0.0 and spare_offer(32, 20.0) == 12.0


# --- the interference model -----------------------------------------------------------------

def test_fair_shares_water_fill():
    assert fair_shares([10, 30], 32) == [10, 22]
    assert fair_shares([30, 30], 32) == [16, 16]
    assert fair_shares([5, 5], 32) == [5, 5]


@pytest.mark.parametrize("parallel_idle", [1.0, 0.5])
def test_calibration_reproduces_table_one_collocated_ratio_where_it_can(parallel_idle):
    k = calibrate(parallel_idle)
    apps = scaled_apps(parallel_idle)
    for name, app in apps.items():
        ratio = collocated_ratio(app, k[name], reference_use(app, apps))
        target = app.collocated_s / app.vanilla_s
        if k[name] > 0:
            assert ratio == pytest.approx(target, rel=1e-6)
        else:
            assert ratio >= target                     # the CPU share alone already overshoots


# --- the policies ----------------------------------------------------------------------------

class _Watched(Hybrid003Simulation):
    """Checks the placement rules at every step."""

    def _rates(self):
        for on in self.placed:
            if self.policy in ("vanilla", "hybrid"):
                assert len(on) <= 1, f"{self.policy} shared a node: {on}"
            if self.policy == "collocated":
                assert len(on) <= 2 and sum(self.jobs[i].hpc for i in on) <= 1, on
            if self.policy == "hybrid":
                assert all(self.jobs[i].hpc for i in on), "a DI job took a whole node under hybrid"
        return super()._rates()


@pytest.mark.parametrize("policy", ["vanilla", "collocated", "hybrid"])
def test_placement_rules(policy):
    for nodes, seed in ((4, 1), (8, 2)):
        result = _Watched(generate(nodes, seed), nodes, policy, seed).run()
        assert len(result.outcomes) == ARRIVALS[nodes]


def test_vanilla_never_slows_or_kills_a_job():
    result = Hybrid003Simulation(generate(8, 3), 8, "vanilla", 3).run()
    for j in result.jobs:
        o = result.outcomes[j.index]
        assert not o.killed and o.ended_s - o.started_s == pytest.approx(j.runtime_s, abs=1e-6)


def test_runs_are_deterministic_per_seed():
    a = simulate_hybrid003(4, "hybrid", 4)
    assert a == simulate_hybrid003(4, "hybrid", 4)
    assert a != simulate_hybrid003(4, "hybrid", 5)


def test_json_keys_exact_and_in_range():
    runner = CliRunner()
    for policy in POLICIES:
        out = runner.invoke(simulate_command, ["--workload", "hybrid-003", "--nodes", "4", "--policy", policy,
                                               "--seed", "2", "--json"])
        assert out.exit_code == 0, out.output
        report = json.loads(out.output)
        assert set(report) == set(KEYS)
        assert report["makespan_s"] > 0 and report["mean_wait_s"] >= 0
        assert 0 < report["cpu_utilization"] <= 1
        assert 0 <= report["missed_deadlines"] <= 1
        assert report["guest_core_hours"] > 0
        assert report["primary_slowdown"] >= -1e-9 and math.isfinite(report["primary_slowdown"])
        if policy == "vanilla":
            assert report["primary_slowdown"] == 0 and report["missed_deadlines"] == 0


def test_cli_refuses_other_sizes_and_options():
    runner = CliRunner()
    out = runner.invoke(simulate_command, ["--workload", "hybrid-003", "--nodes", "5", "--json"])
    assert out.exit_code == 2 and "4, 8, 16" in out.output
    out = runner.invoke(simulate_command, ["--workload", "hybrid-003", "--policy", "sd"])
    assert out.exit_code == 2 and "vanilla|collocated" in out.output
    out = runner.invoke(simulate_command, ["--workload", "hybrid-003", "--jobs", "3"])
    assert out.exit_code == 2 and "--jobs" in out.output


class _Capped(Hybrid003Simulation):
    """Checks at every step that spare tasks stay within their node's cap and leave the
    primaries all the CPU they demand."""

    def _rates(self):
        caps = [spare_cap(CORES_PER_NODE, self.estimate[n], self.live[n]) for n in range(self.n)]
        rates, cpu, use = super()._rates()
        for n in range(self.n):
            for i in self.placed[n]:
                run = self.running[i]
                assert use[(n, i)] == pytest.approx(run.share(run.nodes[0] == n) * CORES_PER_NODE)
            single = [j for j, _ in self.tasks_on[n] if self.jobs[j].nodes == 1]
            spare_cpu = sum(cpu[j] for j in single)
            assert spare_cpu <= caps[n] + 1e-9
            assert spare_cpu + sum(use.get((n, i), 0.0) for i in self.placed[n]) <= CORES_PER_NODE + 1e-9
        return rates, cpu, use


@pytest.mark.parametrize("policy", ["hybrid", "koordinator", "autopilot"])
def test_spare_tasks_stay_within_the_cap_and_never_take_the_primaries_cpu(policy):
    result = _Capped(generate(4, 6), 4, policy, 6).run()
    assert len(result.outcomes) == ARRIVALS[4]


# --- the node agent's sample stream ------------------------------------------------------------

def _di_job(index: int = 0, arrival_s: float = 0.0) -> HybridJob:
    return HybridJob(index, "statistics", 32, 600.0, 1800.0, arrival_s, 12, (Segment(600.0, 0.6, 0.6),))


@pytest.mark.parametrize("policy", SPARE_POLICIES)
def test_a_node_under_min_samples_admits_no_spare_task(policy):
    sim = Hybrid003Simulation([_di_job()], 1, policy)
    sim.spare_queue = [(0, 0)]
    for k in range(insight.MIN_SAMPLES - 1):
        sim._sample(STEP_S * (k + 1), {})
        sim._refresh()
        assert sim.estimate[0] is None and sim._spare_slots() == ()   # published not usable
        assert spare_cap(CORES_PER_NODE, sim.estimate[0], sim.live[0]) == spare_duty.FLOOR_SHARE * CORES_PER_NODE
    sim._sample(STEP_S * insight.MIN_SAMPLES, {})
    sim._refresh()
    assert sim.estimate[0] is not None and len(sim._spare_slots()) == 1
    # a whole run: the task waits for the first minute's 12 samples, then starts
    result = Hybrid003Simulation([_di_job()], 1, policy).run()
    assert result.outcomes[0].started_s == insight.MIN_SAMPLES * STEP_S == PLAN_S


def _hpc_job(index: int = 1) -> HybridJob:
    return HybridJob(index, "montage", 32, 1200.0, 1800.0, 0.0, 8, (Segment(1200.0, 0.7, 0.7),))


def test_the_hybrid_stream_starts_anew_when_the_primaries_change():
    """As ``SpareDuty.sample_primaries``: a primary starting or ending restarts the node's
    stream and adds no sample; until MIN_SAMPLES samples hold again, no estimate, no slot
    offered, the cap at the floor; an unchanged set grows the stream."""
    sim = Hybrid003Simulation([_di_job(0), _hpc_job(1)], 1, "hybrid")
    sim.spare_queue = [(0, 0)]
    t = 0.0

    def sample(cores: float) -> None:
        nonlocal t
        t += STEP_S
        sim._sample(t, {(0, i): cores * STEP_S for i in sim.placed[0]})

    for k in range(20):                                        # no primaries: zeros, growing
        sample(0.0)
        assert len(sim.estimators[0]) == k + 1
    sim._refresh()
    assert sim.estimate[0] == 0.0 and len(sim._spare_slots()) == 1
    floor = spare_duty.FLOOR_SHARE * CORES_PER_NODE
    for change in ("start", "end"):
        if change == "start":
            sim.placed[0].append(1)
        else:
            sim.placed[0].remove(1)
        sample(24.0)                                           # the step of the change: no sample
        assert len(sim.estimators[0]) == 0 and sim.estimate[0] is None
        for k in range(insight.MIN_SAMPLES):
            sim._refresh()
            assert sim.estimate[0] is None and sim._spare_slots() == ()          # admits nothing
            assert spare_cap(CORES_PER_NODE, sim.estimate[0], sim.live[0]) == floor
            sample(24.0 if change == "start" else 0.0)
            assert len(sim.estimators[0]) == k + 1
        assert sim.estimate[0] is not None                      # estimated at the 12th sample
        (slot,) = sim._spare_slots()
        if change == "start":                                  # the busy primary's level, not the idle zeros
            assert sim.estimate[0] == pytest.approx(24.0) and slot.spare.cpus == pytest.approx(8.0)
        else:                                                  # not the finished job's busy samples
            assert sim.estimate[0] == 0.0 and slot.spare.cpus == CORES_PER_NODE


class _Streams(Hybrid003Simulation):
    """Checks at every sample that a node's stream restarts exactly when its primaries change
    (the step adding no sample), grows by the primaries' use of the step otherwise, and that
    a node admits no spare task and caps them at the floor for MIN_SAMPLES samples after."""

    window = round(insight.InsightSettings().window_s / STEP_S)

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.seen = [frozenset(p) for p in self.placed]
        self.changes_when_full = 0
        self.changes = 0
        self.step_use = {}
        self.step_started = {}

    def _rates(self):
        for n in range(self.n):
            if len(self.estimators[n]) < insight.MIN_SAMPLES:
                assert self.estimate[n] is None
        rates, cpu, use = super()._rates()
        self.step_use = dict(use)
        self.step_started = {i: r.started_s for i, r in self.running.items()}
        return rates, cpu, use

    def _spare_plan(self, now):
        young = {n for n in range(self.n) if len(self.estimators[n]) < insight.MIN_SAMPLES}
        before = [list(t) for t in self.tasks_on]
        super()._spare_plan(now)
        for n in young:
            assert self.tasks_on[n] == before[n], f"node {n} admitted a task under MIN_SAMPLES"

    def _sample(self, now, cpu_s):
        before = [len(e) for e in self.estimators]
        super()._sample(now, cpu_s)
        for n in range(self.n):
            on = frozenset(self.placed[n])
            if on != self.seen[n]:
                self.changes += 1
                self.changes_when_full += before[n] == self.window
                self.seen[n] = on
                assert len(self.estimators[n]) == 0 and self.estimate[n] is None
                continue
            assert len(self.estimators[n]) == min(before[n] + 1, self.window)
            # a primary ran all the step (the set unchanged): its use in full
            assert all(self.step_started[i] < now - STEP_S for i in on)
            expected = sum(self.step_use.get((n, i), 0.0) for i in on)
            assert self.estimators[n].stream.values()[-1] == pytest.approx(expected)


def test_the_stream_restarts_exactly_when_primaries_change_in_a_run():
    sim = _Streams(generate(4, 1), 4, "hybrid", 1)
    sim.run()
    assert sim.changes > 0 and sim.changes_when_full > 0   # primaries changed, some on full windows
