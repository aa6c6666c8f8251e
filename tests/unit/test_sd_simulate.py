"""The whole-node CPU-job simulator (paper 001): malleable draining, runtime models, SWF mapping."""
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from condor_sched.modes.mates.backfill import (
    SlurmBackfillConfig,
    easy_backfill,
    slurm_backfill_pass,
    slurm_main_schedule,
)
from condor_sched.modes.mates.cpu_nodes import RuntimeModel
from condor_sched.modes.mates.sd import SdSettings, sd_starts, slurm_sd_starts
from condor_sched.simulate.cpu_jobs import NodeJob, NodeSimulation, read_swf_nodes, simulate_nodes
from condor_sched.simulate.workloads import WorkloadError


def sd(settings=SdSettings(math.inf)):
    return lambda cluster: sd_starts(cluster, settings)


def test_easy_backfill_in_the_simulator_keeps_the_reservation():
    jobs = [NodeJob(0, 2, 100, 100, 0), NodeJob(1, 4, 50, 50, 1), NodeJob(2, 2, 200, 200, 2),
            NodeJob(3, 2, 80, 80, 2)]
    result = NodeSimulation(jobs, 4, 8, easy_backfill).run()
    assert result.started_s == {0: 0, 1: 100, 3: 2, 2: 150}


def slurm(jobs, nodes, pass_planner=slurm_backfill_pass, interval_s=30.0):
    return NodeSimulation(jobs, nodes, 8, pass_planner, event_planner=slurm_main_schedule,
                          backfill_interval_s=interval_s).run()


def test_slurm_backfills_only_at_interval_ticks_and_starts_in_order_at_events():
    # Job 0 holds n0 until 1000; head job 1 (2 nodes) blocks the main scheduler, so job 2
    # (1 node, 10 s, submitted at 5) waits for the next backfill tick (30), not starting at 5
    # as under EASY at every event; at 1000 the finish starts job 1 at once (main scheduler).
    jobs = [NodeJob(0, 1, 1000, 1000, 0), NodeJob(1, 2, 50, 50, 1), NodeJob(2, 1, 10, 10, 5)]
    assert slurm(jobs, 2).started_s == {0: 0, 2: 30, 1: 1000}
    assert slurm(jobs, 2, interval_s=7.0).started_s[2] == 7
    assert NodeSimulation(jobs, 2, 8, easy_backfill).run().started_s[2] == 5


def test_slurm_runs_a_pass_only_when_something_changed_since_the_last():
    calls = []

    def counting_pass(cluster):
        calls.append(cluster.now_s)
        return slurm_backfill_pass(cluster)

    # Job 2 can never backfill (it would overlap job 1's reservation): one pass at 30 sees
    # the arrivals, and none again until the finish at 1000 (which starts job 1) changes the
    # state: the next tick, 1020, runs one.
    jobs = [NodeJob(0, 1, 1000, 1000, 0), NodeJob(1, 2, 50, 50, 1), NodeJob(2, 1, 2000, 2000, 5)]
    result = slurm(jobs, 2, counting_pass)
    assert calls == [30.0, 1020.0]
    assert result.started_s == {0: 0, 1: 1000, 2: 1050}


def test_slurm_window_lets_later_jobs_pass_a_head_that_starts_beyond_it():
    # The head (2 nodes) can start only after 2 days: with SLURM's 1-day window it holds no
    # reservation and the 3-day job behind it takes the free node at the first tick.
    day = 86400
    jobs = [NodeJob(0, 1, 2 * day, 2 * day, 0), NodeJob(1, 2, 100, 100, 1), NodeJob(2, 1, 3 * day, 3 * day, 2)]
    assert slurm(jobs, 2).started_s[2] == 30
    wide = lambda c: slurm_backfill_pass(c, SlurmBackfillConfig(window_s=4 * day))  # noqa: E731
    assert slurm(jobs, 2, wide).started_s[2] == 2 * day + 100


def test_slurm_sd_starts_guests_at_backfill_ticks():
    jobs = [NodeJob(0, 1, 100, 1000, 0), NodeJob(1, 1, 10, 10, 1)]
    result = slurm(jobs, 1, lambda c: slurm_sd_starts(c, SdSettings(math.inf)))
    assert result.started_s[1] == 30 and (result.malleable_jobs, result.mate_jobs) == (1, 1)
    assert result.finish_s[1] == pytest.approx(50)  # 10 s of work at 4 of 8 cores


def test_a_shrunk_mate_drains_at_the_new_rate_and_expands_back():
    # The mate runs 1 s alone, 20 s at 4/8 cores (10 s of work) while the guest runs 10 s of
    # work at 4/8, then alone again: 100 - 1 - 10 = 89 s more.
    jobs = [NodeJob(0, 1, 100, 1000, 0), NodeJob(1, 1, 10, 10, 1)]
    sim = NodeSimulation(jobs, 1, 8, sd())
    result = sim.run()
    assert result.finish_s[1] == pytest.approx(21)
    assert result.finish_s[0] == pytest.approx(110)
    assert (result.malleable_jobs, result.mate_jobs) == (1, 1)


@pytest.mark.parametrize("model, guest_end", [(RuntimeModel.IDEAL, 61.0), (RuntimeModel.WORST, 81.0)])
def test_an_unbalanced_guest_drains_as_its_runtime_model_says(model, guest_end):
    # Mates m1 (1 s alone, then 10 s of work at half speed: ends at 21) and m2 share their
    # nodes with a guest of 40 s of work from 1. By 21 it did 10; then it holds 8 cores on
    # m1's node and 4 on m2's: ideal (Eq. 5) 0.75 -> 30 / 0.75 = 40 s more, worst case
    # (Eq. 6) 0.5 -> 60 s more.
    jobs = [NodeJob(0, 1, 11, 1000, 0), NodeJob(1, 1, 1000, 2000, 0), NodeJob(2, 2, 40, 100, 1)]
    result = NodeSimulation(jobs, 2, 8, sd(), model).run()
    assert result.started_s[2] == 1
    assert result.finish_s[0] == pytest.approx(21)
    assert result.finish_s[2] == pytest.approx(guest_end)


def test_metrics_are_the_papers():
    jobs = [NodeJob(0, 1, 100, 100, 0), NodeJob(1, 1, 50, 100, 10)]
    m = simulate_nodes(jobs, 1, 8, easy_backfill)
    assert m["makespan_s"] == 150
    assert m["mean_turnaround_s"] == pytest.approx((100 + 140) / 2)
    assert m["mean_slowdown"] == pytest.approx((1 + 140 / 50) / 2)


def test_swf_maps_processors_onto_whole_nodes(tmp_path):
    trace = tmp_path / "t.swf"
    trace.write_text("; a comment\n"
                     "1 100 0 50 -1 -1 -1 16 200 -1 1 1 1 -1 1 -1 -1\n"  # 17 fields (no think time)
                     "2 130 0 60 -1 -1 -1 9 -1 -1 1 1 1 -1 1 -1 -1 -1\n")
    w = read_swf_nodes(trace, 8)
    assert [(j.nodes, j.runtime_s, j.requested_s, j.arrival_s) for j in w.jobs] == [(2, 50, 200, 0), (2, 60, 60, 30)]
    assert [j.nodes for j in read_swf_nodes(trace, 4).jobs] == [4, 3]
    with pytest.raises(WorkloadError):
        read_swf_nodes(trace, 0)


def test_a_job_larger_than_the_pool_is_refused_up_front():
    with pytest.raises(ValueError, match="needs 3 nodes"):
        NodeSimulation([NodeJob(0, 3, 1, 1, 0)], 2, 8, easy_backfill)


class _Checked(NodeSimulation):
    """The simulator with its node accounting checked after every planning call."""

    def _plan(self, now: float, planner) -> int:
        started = super()._plan(now, planner)
        holders: dict[int, list[int]] = {}
        for index, run in self.running.items():
            for n in run.nodes:
                holders.setdefault(n, []).append(index)
        assert not set(holders) & set(self.free), "a free node holds a job"
        assert len(self.free) == len(set(self.free))
        for n, jobs in holders.items():
            assert len(jobs) <= 2, f"node {n} holds {jobs}"
            if len(jobs) == 2:  # a mate and its guest, never two static jobs
                a, b = (self.running[i] for i in jobs)
                assert a.guest == b.job.index or b.guest == a.job.index
        return started


@given(st.lists(st.tuples(st.integers(1, 4), st.integers(1, 500), st.integers(1, 1000), st.integers(0, 2000)),
                min_size=1, max_size=25),
       st.sampled_from([math.inf, 2.0, None]), st.sampled_from(list(RuntimeModel)))
@settings(max_examples=60, deadline=None)
def test_every_job_runs_to_its_end_and_no_node_is_oversubscribed(rows, max_slowdown, model):
    jobs = [NodeJob(i, n, run, run + extra, arrival) for i, (n, run, extra, arrival) in enumerate(rows)]
    slurm_sd = lambda c: slurm_sd_starts(c, SdSettings(max_slowdown))  # noqa: E731
    for planner, interval in ((easy_backfill, None), (sd(SdSettings(max_slowdown)), None),
                              (slurm_backfill_pass, 30.0), (slurm_sd, 30.0)):
        sim = _Checked(jobs, 4, 8, planner, model, event_planner=interval and slurm_main_schedule,
                       backfill_interval_s=interval)
        result = sim.run()
        assert set(result.finish_s) == {j.index for j in jobs}
        for j in jobs:
            # A job never finishes before its work at full speed, and a static one takes exactly it.
            ran = result.finish_s[j.index] - result.started_s[j.index]
            assert ran >= j.runtime_s - 1e-6
            if j.index not in sim.guests and j.index not in sim.mates:
                assert ran == pytest.approx(j.runtime_s)
        assert len(sim.free) == 4 and not sim.running
