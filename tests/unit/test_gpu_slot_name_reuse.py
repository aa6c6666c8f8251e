"""A claim under a reused dynamic slot name (found by tests/integration/test_gpu_scale_live.py).

The startd reuses dynamic slot names: when slot1_4 of one claim is released, the next claim
of the node may be slot1_4 again. A GPU node slot ad read between that new claim and the
startd's next update still lists slot1_4 in ChildName (the ended claim) and still counts the
ended claim's shares, not the new one's. The new claim's shares must not be given away."""
from __future__ import annotations

from test_gpu_sharing import NOW, decide, gpu_job, gpu_node_ad, pins_of

NODE = "slot1@node1.test"


def running(proc: int, dslot: int, started_s: int, owner: str = "alice", gpu: str = "0"):
    return gpu_job(proc, owner=owner, status=2, RemoteHost=f"slot1_{dslot}@node1.test", JobCurrentStartDate=started_s,
                   CoSchedPinGPUs=gpu, CoSchedPinSlot=NODE, CoSchedPinGPUCompute=250, CoSchedPinGPUMemory=3000,
                   memory=3000)


def test_a_new_claim_under_a_name_the_ad_lists_for_an_ended_claim_is_not_given_away():
    # The ad (3 s old): alice's three quarters on GPU 0 (slot1_1..3), bob's quarter on GPU 1 (slot1_4).
    ad = gpu_node_ad("node1", used={0: (750, 9000), 1: (250, 3000)}, LastHeardFrom=NOW - 3,
                     children=[f"slot1_{i}@node1.test" for i in (1, 2, 3, 4)])
    # Now: bob's job has left the queue; alice's fourth quarter got slot1_4 one second ago, on GPU 0.
    jobs = [running(0, 1, NOW - 60), running(1, 2, NOW - 60), running(2, 3, NOW - 60), running(3, 4, NOW - 1),
            gpu_job(4, memory=3000)]
    pins = pins_of(decide(jobs, [ad]))
    # GPU 0 runs 4 x 250: the idle quarter may go to GPU 1 (free of bob now) or wait, never to GPU 0.
    assert pins.get(4, (NODE, (1,))) == (NODE, (1,)), pins


def test_the_rule_the_cycle_and_gpu_sharing_share_trusts_a_listed_name_only_in_an_ad_sent_after_the_start():
    from dataclasses import replace

    from condor_sched.consistency import claim_not_yet_in_ad
    from condor_sched.model import Job, JobKey, JobStatus, Resources, Slot, SlotKind

    slot = Slot(NODE, "node1.test", SlotKind.NODE, Resources(cpus=8), Resources(cpus=4), updated_at_s=NOW,
                children=("slot1_1@node1.test",))
    job = Job(JobKey("s", 1, 0), "alice", JobStatus.RUNNING, Resources(cpus=2), remote_slot="slot1_1@node1.test",
              started_at_s=NOW - 10)
    slots = {NODE: slot}
    assert claim_not_yet_in_ad(job, slots) is None                                  # listed, started before the ad
    assert claim_not_yet_in_ad(replace(job, started_at_s=NOW + 1), slots) == NODE   # the name may be a reused one
    assert claim_not_yet_in_ad(replace(job, remote_slot="slot1_2@node1.test"), slots) == NODE  # not listed
    timeless = {NODE: replace(slot, updated_at_s=0)}
    assert claim_not_yet_in_ad(replace(job, started_at_s=NOW + 1), timeless) is None  # no time: the names say it
    assert claim_not_yet_in_ad(replace(job, status=JobStatus.IDLE), slots) is None
