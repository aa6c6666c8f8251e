"""The overcommit mode on a live pool (paper 004, Section 3.3): overcommitting slots read from
their ads, each job on a core of its own while one is free, then time-sharing up to M jobs per
core, never beside a program the model refuses (on a time-shared core, the time-shared model
too), the least predicted degradation first, and every waiting job told why."""
from __future__ import annotations

import hashlib
from dataclasses import replace

import classad2
import pytest

from condor_sched.classads import state_from_ads
from condor_sched.cycle import CycleConfig, CycleMemory, decide_cycle
from condor_sched.interference.dataset import load_dataset, program_features
from condor_sched.interference.guard import InterferenceSetting, program_name
from condor_sched.interference.report import default_dataset
from condor_sched.model import JobKey, SlotKind
from condor_sched.settings import SettingsError, settings_from_knobs
from condor_sched.sidecar import apply_cycle
from test_sidecar import RecordingEditor

SCHEDD = "schedd@test"
NOW = 1_000_000
CORES = 2


def sha(kernel: str) -> str:
    return hashlib.sha256(kernel.encode()).hexdigest()


def node_ad(node: str, *, held: int = 0, multiplicity: object = 2, runs: dict[str, str] | None = None,
            cpus: int = CORES) -> classad2.ClassAd:
    """An overcommitting node's one partitionable slot (NUM_CPUS = M x cores), ``held`` CPUs
    claimed, ``runs`` the node agent's record of each running job's kernel."""
    machine = f"{node}.test"
    total = cpus * multiplicity if isinstance(multiplicity, int) else cpus
    ad = classad2.ClassAd({"Name": f"slot1@{machine}", "Machine": machine, "PartitionableSlot": True,
                           "Arch": "X86_64", "LastHeardFrom": NOW, "TotalSlotCpus": total, "Cpus": total - held,
                           "TotalSlotMemory": 16000, "Memory": 16000 - 1000 * held, "State": "Unclaimed",
                           "CoSchedMultiplicity": multiplicity})
    for job, kernel in (runs or {}).items():
        cluster, proc = job.split(".")
        ad[f"CoSchedJobExe_{cluster}_{proc}"] = f"alice {sha(kernel)}"
    return ad


def job_ad(cluster: int, *, cmd: str = "/bin/work", overcommit: bool | None = True) -> classad2.ClassAd:
    ad = classad2.ClassAd({"ClusterId": cluster, "ProcId": 0, "Owner": "alice", "JobStatus": 1,
                           "QDate": NOW - 1000 + cluster, "GlobalJobId": f"{SCHEDD}#{cluster}.0#1", "Cmd": cmd,
                           "RequestCpus": 1, "RequestMemory": 1000,
                           "Requirements": classad2.ExprTree("TARGET.Cpus >= RequestCpus")})
    if overcommit is not None:
        ad["CoSchedOvercommit"] = overcommit
    return ad


@pytest.fixture(scope="module")
def setting():
    return InterferenceSetting.from_dataset(default_dataset())


@pytest.fixture(scope="module")
def signals():
    return program_features(load_dataset(default_dataset()))


def decide(jobs, slots, *, setting=None, signals=None, exes=None, knobs=None):
    state = replace(state_from_ads({SCHEDD: jobs}, slots), observed_at_s=NOW,
                    program_profiles={("alice", sha(k)): v for k, v in (signals or {}).items()})
    config = replace(CycleConfig.from_settings(settings_from_knobs(knobs or {})), interference=setting)
    memory = CycleMemory(5, exes={(SCHEDD, "alice", cmd): sha(k) for cmd, k in (exes or {}).items()})
    return decide_cycle(state, memory, config)


def pins(decision) -> dict[int, str]:
    return {p.job.cluster: p.slot.split("@")[1] for p in decision.pins}


def test_an_overcommitting_slot_and_an_opted_in_job_are_read_from_their_ads():
    state = state_from_ads({SCHEDD: [job_ad(1), job_ad(2, overcommit=None)]},
                           [node_ad("n1"), node_ad("n2", multiplicity=1), node_ad("n3", multiplicity="two"),
                            node_ad("n4", multiplicity=9)])
    (slot,) = state.slots
    assert slot.kind is SlotKind.OVERCOMMIT and slot.multiplicity == 2 and slot.total.cpus == 2 * CORES
    assert [j.sharing_mode for j in state.jobs] == ["overcommit", None]
    skipped = " ".join(s.reason for s in state.skipped)
    assert skipped.count("CoSchedMultiplicity") == 3


def test_a_core_of_its_own_first_then_time_sharing_up_to_m_per_core_and_the_rest_wait():
    jobs = [job_ad(c) for c in range(1, 7)]
    d = decide(jobs, [node_ad("n1"), node_ad("n2")])
    placed = pins(d)
    # four cores: the first four jobs get one each, spread; the next two time-share
    assert sorted(placed.values()) == ["n1.test"] * 3 + ["n2.test"] * 3
    assert {placed[1], placed[2]} == {"n1.test", "n2.test"} and placed[1] == placed[3]
    full = decide(jobs + [job_ad(c) for c in range(7, 10)], [node_ad("n1"), node_ad("n2")])
    assert len(full.pins) == 8          # 2 nodes x 2 cores x M = 2
    assert "no overcommitting node has 1 CPUs" in full.reasons[JobKey(SCHEDD, 9, 0)]
    # a queue far longer than the pool holds: the pool fills, every other job says why
    many = decide([job_ad(c) for c in range(1, 2001)], [node_ad("n1")])
    assert len(many.pins) == 4
    assert sum("no overcommitting node has 1 CPUs" in why for why in many.reasons.values()) == 1996
    # a job that did not opt in is not this mode's; the policy can be turned off
    assert pins(decide([job_ad(1, overcommit=None)], [node_ad("n1")])) == {}
    assert pins(decide(jobs, [node_ad("n1")], knobs={"COSCHED_OVERCOMMIT_POLICY": "none"})) == {}
    with pytest.raises(SettingsError, match="COSCHED_OVERCOMMIT_POLICY"):
        settings_from_knobs({"COSCHED_OVERCOMMIT_POLICY": "sns"})


def test_the_naive_policy_takes_the_emptiest_node_blind():
    d = decide([job_ad(1)], [node_ad("n1", held=1), node_ad("n2", held=3)],
               knobs={"COSCHED_OVERCOMMIT_POLICY": "naive-overcommit"})
    assert pins(d) == {1: "n1.test"}


def pair(setting, signals, *, shared_ill: bool, separate_ill: bool):
    """Two kernels whose verdicts are as asked (the victim first)."""
    names = sorted(k for k in signals if k in setting.model.profiles)
    sep = setting.model.with_profiles(signals)
    shr = setting.shared.with_profiles(signals)
    return next((a, b) for a in names for b in names if a != b
                and sep.judge(a, b).ill_matched == separate_ill and shr.judge(a, b).ill_matched == shared_ill)


def test_a_time_shared_core_is_refused_beside_a_program_the_time_shared_model_refuses(setting, signals):
    job, other = pair(setting, signals, shared_ill=True, separate_ill=False)
    exes = {"/bin/work": job}
    # n1: one core left (no time sharing) beside `other`, which the separate model allows
    d = decide([job_ad(1)], [node_ad("n1", held=1, runs={"7.0": other})], setting=setting, signals=signals, exes=exes)
    assert pins(d) == {1: "n1.test"}
    # both cores held: the job would time-share beside `other`, which the time-shared model refuses
    d = decide([job_ad(1)], [node_ad("n1", held=2, runs={"7.0": other})], setting=setting, signals=signals, exes=exes)
    assert pins(d) == {}
    why = d.reasons[JobKey(SCHEDD, 1, 0)]
    assert why.startswith("waiting: the interference model keeps it off n1.test, where job 7.0 runs")
    assert program_name(("alice", sha(other))) in why and "(shared)" in why
    # the guard off: overcommitted blind
    blind = decide([job_ad(1)], [node_ad("n1", held=2, runs={"7.0": other})], signals=signals, exes=exes)
    assert pins(blind) == {1: "n1.test"}


def test_the_node_of_least_predicted_degradation_wins_and_the_next_job_sees_the_pin(setting, signals):
    names = sorted(k for k in signals if k in setting.model.profiles)
    guard_model = setting.shared.with_profiles(signals)
    allowed = [(max(v.probability_ab, v.probability_ba), b) for b in names
               if not (v := guard_model.judge("fma", b)).ill_matched
               and not setting.model.with_profiles(signals).judge("fma", b).ill_matched]
    (low, calm), (high, rough) = min(allowed), max(allowed)
    assert low < high
    slots = [node_ad("n1", held=2, runs={"7.0": rough}), node_ad("n2", held=2, runs={"8.0": calm})]
    d = decide([job_ad(1)], slots, setting=setting, signals=signals, exes={"/bin/work": "fma"})
    assert pins(d) == {1: "n2.test"}
    # the first job's pin is on n2 when the second is placed: a program it is ill-matched with goes elsewhere
    bully = next(b for b in names if setting.model.with_profiles(signals).judge("fma", b).ill_matched)
    d = decide([job_ad(1), job_ad(2, cmd="/bin/bully")], [node_ad("n1"), node_ad("n2")], setting=setting,
               signals=signals, exes={"/bin/work": "fma", "/bin/bully": bully})
    assert pins(d)[1] != pins(d)[2]


def test_a_pin_writes_the_slot_last_and_the_clause_is_enrolled():
    d = decide([job_ad(1)], [node_ad("n1")])
    editor = RecordingEditor()
    apply_cycle(d, editor, now=NOW)
    key = JobKey(SCHEDD, 1, 0)
    writes = [e.attr for e in editor.edits if key in e.jobs and e.attr != "CoSchedPinReason"]
    assert writes[-1] == "CoSchedPinSlot" and "Requirements" in writes
    assert editor.attrs[key]["CoSchedPinSlot"] == "slot1@n1.test"
    assert all(a == "Requirements" or a.startswith("CoSchedPin") for a in writes)
