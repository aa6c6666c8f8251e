"""COSCHED_INTERFERENCE in the modes that pin one job at a time (issue 30): a GPU share goes to
another node than the one where a program it is ill-matched with runs, or waits and says why;
a malleable job is not made the guest of a mate it is ill-matched with. From ClassAds as a pool
shows them (the node agents' ``CoSchedJobExe_<c>_<p>`` lines in the slot ads)."""
from __future__ import annotations

from dataclasses import replace

from condor_sched.classads import state_from_ads
from condor_sched.cycle import CycleConfig, CycleMemory, decide_cycle
from condor_sched.interference.guard import program_name
from condor_sched.model import JobKey
from condor_sched.settings import settings_from_knobs
from test_gpu_sharing import NOW, SCHEDD, gpu_job, gpu_node_ad
from test_interference_guard import A, B, programs, setting  # noqa: F401 (fixtures)
from test_node_sharing import CORES, job_ad, node_slot_ads, running_mate

EXES = {(SCHEDD, "alice", "/bin/b"): B}


def decide(jobs, slots, setting, programs, knobs):
    state = replace(state_from_ads({SCHEDD: jobs}, slots), observed_at_s=NOW,
                    program_profiles={("alice", k): v for k, v in programs.items()})
    config = replace(CycleConfig.from_settings(settings_from_knobs(knobs)), interference=setting)
    return decide_cycle(state, CycleMemory(5, exes=EXES), config)


def runs_a(ad, cluster=7):
    ad[f"CoSchedJobExe_{cluster}_0"] = f"alice {A}"
    return ad


def test_a_gpu_share_goes_where_no_ill_matched_program_runs_or_waits_and_says_why(setting, programs):
    knobs = {"COSCHED_GPU_POLICY": "best-fit"}
    share = gpu_job(0, Cmd="/bin/b")
    # best-fit packs onto node1's used GPU, where job 7.0 runs program A
    node1 = runs_a(gpu_node_ad("node1", used={0: (250, 4000)}))
    off = decide([share], [node1, gpu_node_ad("node2")], None, programs, knobs)
    assert [p.slot for p in off.gpu_sharing.pins] == ["slot1@node1.test"]
    on = decide([share], [node1, gpu_node_ad("node2")], setting, programs, knobs)
    assert [p.slot for p in on.gpu_sharing.pins] == ["slot1@node2.test"]
    alone = decide([share], [node1], setting, programs, knobs)
    assert alone.gpu_sharing.pins == ()
    why = alone.reasons[JobKey(SCHEDD, 1, 0)]
    assert why.startswith("waiting: the interference model keeps it off node1.test, where job 7.0 runs")
    assert program_name(("alice", A)) in why


def mate_and_guest(cmd):
    """Mate 7.0 running program A on node1 (its agent says so), and a waiting guest running ``cmd``."""
    mate = running_mate(0, requested=3600, ClusterId=7, GlobalJobId=f"{SCHEDD}#7.0#1")
    return [mate, job_ad(0, requested=2000, Cmd=cmd)], [runs_a(ad) for ad in node_slot_ads("node1", busy_cpus=CORES)]


def test_a_malleable_job_is_not_the_guest_of_a_mate_it_is_ill_matched_with(setting, programs):
    jobs, slots = mate_and_guest("/bin/b")
    off = decide(jobs, slots, None, programs, {})
    assert [p.slot for p in off.node_sharing.pins] == ["slot2@node1.test"]
    on = decide(jobs, slots, setting, programs, {})
    assert on.node_sharing.pins == () and on.node_sharing.lengthen == ()   # the mate keeps its limit
    why = [r for k, r in on.reasons.items() if k.cluster == 1][0]
    assert why.startswith("waiting: for a whole node; the interference model keeps it off node1.test, where job 7.0")


def test_a_guest_whose_program_was_never_seen_running_is_placed_as_before(setting, programs):
    jobs, slots = mate_and_guest("/bin/never-seen-running")
    on = decide(jobs, slots, setting, programs, {})
    assert [p.slot for p in on.node_sharing.pins] == ["slot2@node1.test"]
