"""EASY backfill and SD-Policy (paper 001) on hand-built node views: each mechanism alone."""
import math

import pytest

from condor_sched.model import Job, JobKey, JobStatus, Resources, RunningJob, Slot, SlotKind
from condor_sched.modes.planning import PlanRequest, PlanSettings
from condor_sched.modes.registry import get_policy
from condor_sched.modes.mates.backfill import (
    SLURM_DEFAULTS,
    SlurmBackfillConfig,
    easy_backfill,
    slurm_backfill_pass,
    slurm_main_schedule,
)
from condor_sched.modes.mates.cpu_nodes import (
    NodeCluster,
    Role,
    RunningNodeJob,
    RuntimeModel,
    WaitingJob,
    progress_rate,
)
from condor_sched.modes.mates.sd import SdSettings, dynamic_max_slowdown, guest_cores, sd_starts, slurm_sd_starts

C = 8


def key(i: int) -> JobKey:
    return JobKey("t", 1, i)


def running(i: int, nodes, *, submitted=0.0, started=0.0, requested=1000.0, role=Role.STATIC, cores=C):
    return RunningNodeJob(key(i), tuple(nodes), submitted, started, requested, started + requested, cores, role)


def waiting(i: int, nodes: int, requested: float, submitted: float = 0.0) -> WaitingJob:
    return WaitingJob(key(i), nodes, requested, submitted)


def cluster(now, total, free, run, queue) -> NodeCluster:
    return NodeCluster(now, C, total, tuple(free), tuple(run), tuple(queue))


def test_easy_backfill_never_starts_a_job_that_would_delay_the_reservation():
    # 2 nodes run until 100, 2 are free; the head needs 4 (reserved at 100, no spare node).
    view = cluster(2, 4, ["n2", "n3"], [running(0, ["n0", "n1"], requested=100)],
                   [waiting(1, 4, 50), waiting(2, 2, 200), waiting(3, 2, 80)])
    starts = easy_backfill(view)
    assert [s.job for s in starts] == [key(3)]  # ends at 82 <= 100; job 2 would end at 202
    assert set(starts[0].nodes) == {"n2", "n3"}


def test_easy_backfill_lets_a_long_job_use_the_reservations_spare_nodes():
    # At 100, 3 nodes come free and the head needs 2: one spare node for a long job.
    view = cluster(0, 4, ["n3"], [running(0, ["n0", "n1", "n2"], requested=100)],
                   [waiting(1, 2, 50), waiting(2, 1, 500)])
    assert [s.job for s in easy_backfill(view)] == [key(2)]


def test_sd_tries_the_static_start_first():
    view = cluster(10, 2, ["n1"], [running(0, ["n0"])], [waiting(1, 1, 100)])
    (start,) = sd_starts(view, SdSettings(math.inf))
    assert not start.malleable and start.nodes == ("n1",)


def test_sd_starts_a_guest_only_when_its_malleable_end_beats_the_static_end():
    # The only node is busy until 1000: static_end = 990 + req, mall_end = 2 req (k = 4 of 8).
    mate = running(0, ["n0"])
    (guest,) = sd_starts(cluster(10, 1, [], [mate], [waiting(1, 1, 100)]), SdSettings(math.inf))
    assert guest.mates == (key(0),) and guest.cores_per_node == 4
    assert guest.predicted_end_s == pytest.approx(10 + 200)  # worst case: half the cores, twice the time
    assert guest.mate_increase_s == pytest.approx(100)  # the mate runs at 4/8 for 200 s
    assert sd_starts(cluster(10, 1, [], [mate], [waiting(1, 1, 995)]), SdSettings(math.inf)) == []


def _mates(a_submitted: float):
    # Penalties (Eq. 4) for a guest of req 10 (mate increase 10) at now = 100:
    # B, C: (1000 + 10) / 1000 = 1.01; D: 2.01; A (2 nodes): (1000 - a_submitted + 10) / 1000.
    return [running(1, ["a0", "a1"], submitted=a_submitted), running(2, ["b"]), running(3, ["c"]),
            running(4, ["d"], submitted=-1000)]


def test_sd_picks_the_mates_with_the_least_sum_of_penalties():
    queue = [waiting(9, 2, 10)]
    (pair,) = sd_starts(cluster(100, 5, [], _mates(-3000), queue), SdSettings(math.inf))
    assert set(pair.mates) == {key(2), key(3)}  # 1.01 + 1.01 < 4.01
    (single,) = sd_starts(cluster(100, 5, [], _mates(0), queue), SdSettings(math.inf))
    assert single.mates == (key(1),)  # 1.01 < 2.02
    assert set(single.nodes) == {"a0", "a1"}


def test_sd_never_takes_a_mate_whose_penalty_reaches_max_slowdown():
    only_d = [running(4, ["d"], submitted=-1000)]  # p = 2.01
    queue = [waiting(9, 1, 10)]
    assert sd_starts(cluster(100, 1, [], only_d, queue), SdSettings(2.0)) == []
    assert sd_starts(cluster(100, 1, [], only_d, queue), SdSettings(3.0))[0].mates == (key(4),)


def test_dynamic_max_slowdown_is_the_running_jobs_mean_predicted_slowdown():
    jobs = (running(1, ["a"]), running(2, ["b"], submitted=-1000))  # 1.0 and 2.0
    assert dynamic_max_slowdown(jobs, 0) == pytest.approx(1.5)
    queue = [waiting(9, 1, 10)]
    # DynAVGSD = 1.5: job 2 (p 2.01) is filtered, job 1 (p 1.01) is taken.
    assert sd_starts(cluster(100, 2, [], jobs, queue), SdSettings(None))[0].mates == (key(1),)


def test_sharing_factor_sets_the_guests_cores_and_its_predicted_run():
    assert guest_cores(8, 0.5) == 4 and guest_cores(8, 0.25) == 2 and guest_cores(2, 0.9) == 1
    (start,) = sd_starts(cluster(0, 1, [], [running(0, ["n0"], requested=10000)], [waiting(1, 1, 100)]),
                         SdSettings(math.inf, sharing_factor=0.25))
    assert start.cores_per_node == 2
    assert start.predicted_end_s == pytest.approx(400)  # 2 of 8 cores: four times the requested time
    assert start.mate_increase_s == pytest.approx(100)  # 400 s at 6/8


def test_a_guest_must_end_inside_its_mates_allocation():
    # A 2-node guest of req 10 ends at now + 20; mate m1 ends at now + end1 (+10 of increase).
    def plan(end1: float):
        run = [running(1, ["n0"], requested=end1), running(2, ["n1"], requested=1000)]
        return sd_starts(cluster(0, 2, [], run, [waiting(9, 2, 10)]), SdSettings(math.inf))

    assert plan(9.0) == []
    assert set(plan(10.0)[0].mates) == {key(1), key(2)}


def test_a_mate_is_shrunk_once_and_a_guest_is_never_a_mate():
    run = [running(1, ["n0"], role=Role.MATE, cores=4), running(2, ["n0"], role=Role.GUEST, cores=4)]
    assert sd_starts(cluster(0, 1, [], run, [waiting(9, 1, 10)]), SdSettings(math.inf)) == []


def test_runtime_models_eq5_averages_the_nodes_and_eq6_takes_the_least_served():
    shares = [(8, 1), (4, 1)]
    assert progress_rate(shares, 8, RuntimeModel.IDEAL) == pytest.approx(0.75)
    assert progress_rate(shares, 8, RuntimeModel.WORST) == pytest.approx(0.5)


def test_sd_plans_through_the_common_interface_on_node_slots():
    slots = [Slot(f"slot1@n{i}", f"n{i}", SlotKind.NODE, Resources(cpus=C), Resources(cpus=0)) for i in range(2)]
    busy = [RunningJob(Job(key(i), "u", JobStatus.RUNNING, Resources(cpus=C), submitted_at_s=0,
                           requested_runtime_s=1000), f"slot1_1@n{i}", f"n{i}", 0, 1000) for i in range(2)]
    idle = Job(key(9), "u", JobStatus.IDLE, Resources(cpus=2 * C), submitted_at_s=90, requested_runtime_s=10)
    request = PlanRequest.of([idle], slots, running=tuple(busy), now_s=100)
    plan = get_policy("sd").plan(request, PlanSettings(sd_max_slowdown=math.inf))
    assert sorted(a.slot for a in plan.assignments) == ["slot1@n0", "slot1@n1"]
    assert plan.assignments[0].details["cores_per_node"] == 4
    assert get_policy("backfill").plan(request, PlanSettings()).assignments == ()


def test_the_static_wait_counts_the_reservations_of_the_jobs_ahead():
    # n0 frees at 1000, n1 at 10000. Alone, B (req 1500) would wait 1000 < 1500: no guest.
    # Behind A (req 2000, waits 1000 < 2000, reserved on [1000, 3000)), B waits until 3000.
    run = [running(1, ["n0"], requested=1000), running(2, ["n1"], requested=10000)]
    b = waiting(4, 1, 1500)
    assert sd_starts(cluster(0, 2, [], run, [b]), SdSettings(math.inf)) == []
    (guest,) = sd_starts(cluster(0, 2, [], run, [waiting(3, 1, 2000), b]), SdSettings(math.inf))
    assert guest.job == key(4) and guest.mates == (key(2),)  # n0's job ends before the guest would


# --- SLURM's backfill (slurm-backfill, slurm-sd) ---------------------------------------------

DAY = 86400.0


def test_slurm_defaults_are_slurm_17_11s():
    assert (SLURM_DEFAULTS.interval_s, SLURM_DEFAULTS.window_s, SLURM_DEFAULTS.max_job_test,
            SLURM_DEFAULTS.resolution_s) == (30, 1440 * 60, 100, 60)
    assert get_policy("slurm-backfill").backfill_interval_s == 30
    assert get_policy("slurm-sd").backfill_interval_s == 30


def test_slurm_main_scheduler_stops_at_the_first_job_that_cannot_start():
    view = cluster(0, 3, ["n1", "n2"], [running(0, ["n0"], requested=100)],
                   [waiting(1, 1, 100), waiting(2, 2, 100), waiting(3, 1, 10)])
    assert [s.job for s in slurm_main_schedule(view)] == [key(1)]  # job 3 would fit, but 2 waits
    assert [s.job for s in slurm_backfill_pass(view)] == [key(1), key(3)]  # a pass backfills it


def test_a_job_starting_beyond_bf_window_gets_no_reservation():
    # n0 is busy for 2 days, n1 is free. Head A needs both nodes: its start (2 days) lies
    # beyond the 1-day window, so it reserves nothing and B (1 node, 3 days) takes n1 now.
    view = cluster(0, 2, ["n1"], [running(0, ["n0"], requested=2 * DAY)],
                   [waiting(1, 2, 100), waiting(2, 1, 3 * DAY)])
    assert [s.job for s in slurm_backfill_pass(view)] == [key(2)]
    # With a 3-day window A is reserved from 2 days on and B, which would overlap it, waits.
    assert slurm_backfill_pass(view, SlurmBackfillConfig(window_s=3 * DAY)) == []
    # EASY always reserves for the head: B waits there too.
    assert easy_backfill(view) == []


def test_the_pass_stops_when_the_map_holds_bf_max_job_test_records():
    # n0 busy until 100, n1 free. A (2 nodes from 100) is reserved on [60, 180) (bounds rounded
    # down to 60 s): records 1 + 2 = 3.
    # B (2 nodes) would add a reservation: with bf_max_job_test = 3 the pass stops before
    # C (1 node, 10 s), which fits now, is ever tried.
    view = cluster(0, 2, ["n1"], [running(0, ["n0"], requested=100)],
                   [waiting(1, 2, 80), waiting(2, 2, 60), waiting(3, 1, 10)])
    assert slurm_backfill_pass(view, SlurmBackfillConfig(max_job_test=3)) == []
    assert [s.job for s in slurm_backfill_pass(view, SlurmBackfillConfig(max_job_test=4))] == [key(3)]


def test_reservations_are_rounded_down_to_bf_resolution():
    # n0 frees at 130; A (2 nodes, 100 s) is reserved on [120, 180) with 60 s resolution, so
    # B (1 node, 125 s from 0: ends at 125) overlaps it; with 1 s resolution [130, 230) it fits.
    view = cluster(0, 2, ["n1"], [running(0, ["n0"], requested=130)], [waiting(1, 2, 100), waiting(2, 1, 125)])
    assert slurm_backfill_pass(view) == []
    assert [s.job for s in slurm_backfill_pass(view, SlurmBackfillConfig(resolution_s=1))] == [key(2)]


def test_slurm_sd_makes_listing_1s_try_inside_the_backfill_pass_only():
    mate = running(0, ["n0"])
    view = cluster(10, 1, [], [mate], [waiting(1, 1, 100)])
    (guest,) = slurm_sd_starts(view, SdSettings(math.inf))
    assert guest.mates == (key(0),) and guest.cores_per_node == 4
    assert get_policy("slurm-sd").event_starts(view, PlanSettings(sd_max_slowdown=math.inf)) == []
    assert slurm_sd_starts(cluster(10, 1, [], [mate], [waiting(1, 1, 995)]), SdSettings(math.inf)) == []


def test_slurm_sd_tries_jobs_beyond_the_window_with_their_exact_wait():
    # n0, n1 busy for 3 days. A (1 node, 3.5 days) starts beyond the 1-day window and its
    # malleable try fails (wait 3 days < increase 3.5 days): no reservation. B (1 node,
    # 2 days) is not skipped: its wait of 3 days beats its increase of 2 days, a guest.
    mates = [running(0, ["n0"], requested=3 * DAY), running(1, ["n1"], requested=3 * DAY)]
    queue = [waiting(2, 1, 3.5 * DAY), waiting(3, 1, 2 * DAY), waiting(4, 1, 4 * DAY)]
    (guest,) = slurm_sd_starts(cluster(10, 2, [], mates, queue), SdSettings(math.inf))
    assert guest.job == key(3)
    # Without malleable tries, jobs dominated by A (C: as many nodes, longer) are skipped,
    # which changes nothing: none starts.
    assert slurm_backfill_pass(cluster(10, 2, [], mates, queue)) == []


def test_slurm_sd_takes_a_job_started_earlier_in_the_same_pass_as_a_mate():
    # n1 already holds a mate and its guest (neither may host another); n0 is free. A starts
    # statically on n0; B cannot start (waits ~1000 s > its increase of 100 s) and, in
    # slurm-sd, becomes A's guest: SLURM's backfill marks A running at once (mates are "the
    # already running jobs", paper 001 Section 3). The EASY sd keeps same-call starts out.
    run = [running(0, ["n1"], role=Role.MATE, cores=4), running(5, ["n1"], role=Role.GUEST, cores=4)]
    view = cluster(10, 2, ["n0"], run, [waiting(1, 1, 1000), waiting(2, 1, 100)])
    static, guest = slurm_sd_starts(view, SdSettings(math.inf))
    assert static.job == key(1) and not static.malleable and static.nodes == ("n0",)
    assert guest.job == key(2) and guest.mates == (key(1),) and guest.nodes == ("n0",)
    assert [s.job for s in sd_starts(view, SdSettings(math.inf))] == [key(1)]
