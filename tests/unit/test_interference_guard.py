"""COSCHED_INTERFERENCE (paper 004, issue 30): the cycle keeps pairs the model predicts
ill-matched off one node, whether the other job runs (read by its node's agent) or is pinned
(in an earlier cycle or earlier in this one), knows an idle job's program only from what a
node agent read for a running job of the same schedd, Owner and Cmd, allows programs without
a profile, and tells the waiting job which pair was refused."""
import json
import os
from dataclasses import replace

import pytest

from condor_sched.cycle import CycleConfig, CycleMemory, decide_cycle
from condor_sched.interference.dataset import load_dataset, program_features
from condor_sched.interference.guard import CycleGuard, InterferenceSetting, learn_exes, program_name
from condor_sched.interference.live_profiles import ProfileReader
from condor_sched.interference.report import default_dataset
from condor_sched.model import Job, JobKey, JobStatus, PoolState, Resources, RunningJob, Slot, SlotKind
from condor_sched.settings import SettingsError, settings_from_knobs
from tests.unit.test_sidecar import DEV, FirstFit, device_job

A, B, C, D = ("a" * 64, "b" * 64, "c" * 64, "d" * 64)


@pytest.fixture(scope="module")
def setting():
    return InterferenceSetting.from_dataset(default_dataset())


@pytest.fixture(scope="module")
def programs(setting):
    """Two measured programs the model keeps apart on a node, and two it lets share."""
    signals = program_features(load_dataset(default_dataset()))
    names = sorted(setting.model.profiles)
    judged = {(a, b): setting.model.judge(a, b) for a in names for b in names if a <= b}
    bad = next(pair for pair, v in judged.items() if v.ill_matched and pair[0] != pair[1])
    good = next(pair for pair, v in judged.items() if not v.ill_matched and pair[0] != pair[1])
    return {A: signals[bad[0]], B: signals[bad[1]], C: signals[good[0]], D: signals[good[1]]}


def node_slot(node, exes=None, free=DEV):
    return Slot(f"slot1@{node}", node, SlotKind.DEVICE, DEV, free, device_name="mic0",
                running_exes=exes or {})


def idle(proc, cmd, owner="alice", cluster=1):
    return device_job(proc, key=JobKey("s", cluster, proc), executable=cmd, owner=owner, submitter=owner)


def state_of(slots, jobs, profiles):
    return PoolState(tuple(jobs), tuple(slots), program_profiles={("alice", k): v for k, v in profiles.items()})


def decide(state, setting, exes=None, cycle=1):
    config = CycleConfig(FirstFit(), None, unpin_age_cycles=3, interference=setting)
    return decide_cycle(state, CycleMemory(cycle, exes=exes or {}), config)


def test_a_job_is_kept_off_the_node_where_a_program_it_is_ill_matched_with_runs(setting, programs):
    running_a = {"5.0": ("alice", A)}
    exes = {("s", "alice", "/bin/b"): B}
    state = state_of([node_slot("node1", running_a), node_slot("node2")], [idle(0, "/bin/b")], programs)
    decision = decide(state, setting, exes)
    assert [(p.job.proc, p.slot) for p in decision.pins] == [(0, "slot1@node2")]
    alone = state_of([node_slot("node1", running_a)], [idle(0, "/bin/b")], programs)
    decision = decide(alone, setting, exes)
    assert decision.pins == ()
    why = decision.reasons[JobKey("s", 1, 0)]
    assert why.startswith("waiting: ") and "the interference model keeps it off node1, where job 5.0 runs" in why
    assert "Pr(Ev > 0.1)" in why or "is dangerous to share" in why
    assert program_name(("alice", A)) in why and program_name(("alice", B)) in why
    # the same job beside a program it suits, or with the guard off, is pinned there
    suits = replace(alone, slots=(node_slot("node1", {"5.0": ("alice", C)}),))
    assert [p.slot for p in decide(suits, setting, {("s", "alice", "/bin/b"): D}).pins] == ["slot1@node1"]
    assert [p.slot for p in decide(alone, None, exes).pins] == ["slot1@node1"]


def test_programs_without_a_profile_or_a_known_binary_are_allowed(setting, programs):
    running_a = {"5.0": ("alice", A)}
    unknown_cmd = state_of([node_slot("node1", running_a)], [idle(0, "/bin/never-ran")], programs)
    assert [p.slot for p in decide(unknown_cmd, setting, {("s", "alice", "/bin/b"): B}).pins] == ["slot1@node1"]
    no_profile = state_of([node_slot("node1", running_a)], [idle(0, "/bin/b")], {A: programs[A]})
    assert [p.slot for p in decide(no_profile, setting, {("s", "alice", "/bin/b"): B}).pins] == ["slot1@node1"]
    # another owner's observation of the same Cmd says nothing of alice's job
    other = {("s", "bob", "/bin/b"): B}
    assert [p.slot for p in decide(state_of([node_slot("node1", running_a)], [idle(0, "/bin/b")], programs),
                                   setting, other).pins] == ["slot1@node1"]


def test_two_ill_matched_jobs_planned_in_one_cycle_never_share_a_node(setting, programs):
    exes = {("s", "alice", "/bin/a"): A, ("s", "alice", "/bin/b"): B}
    state = state_of([node_slot("node1")], [idle(0, "/bin/a"), idle(0, "/bin/b", cluster=2)], programs)
    decision = decide(state, setting, exes)
    assert [p.job for p in decision.pins] == [JobKey("s", 1, 0)]
    assert "where job 1.0 runs" in decision.reasons[JobKey("s", 2, 0)]
    # pinned in an earlier cycle counts as well: the pin is kept and the other job waits
    pinned = replace(state, jobs=(replace(state.jobs[0], pinned_slot="slot1@node1", pinned_cycle=1), state.jobs[1]))
    later = decide(pinned, setting, exes, cycle=2)
    assert [a.job for a in later.kept] == [JobKey("s", 1, 0)] and later.pins == ()
    assert "where job 1.0 runs" in later.reasons[JobKey("s", 2, 0)]
    # the procs of one cluster are one submission: they never refuse each other
    together = state_of([node_slot("node1")], [idle(0, "/bin/a"), idle(1, "/bin/a")], programs)
    assert len(decide(together, setting, {("s", "alice", "/bin/a"): A}).pins) == 2


def test_a_spread_job_loses_all_its_pins_when_one_proc_is_refused(setting, programs):
    from condor_sched.model import Assignment, Plan

    exes = {("s", "alice", "/bin/a"): A, ("s", "alice", "/bin/b"): B}
    state = state_of([node_slot("node1", {"5.0": ("alice", A)}), node_slot("node2")], [], programs)
    guard = CycleGuard(setting, state, [], exes)
    procs = [idle(p, "/bin/b", cluster=9) for p in range(2)]
    plan = Plan("sns", (Assignment(procs[0].key, "slot1@node2"), Assignment(procs[1].key, "slot1@node1")), ())
    kept, why = guard.admit(plan, procs, gang=True)
    assert kept.assignments == () and set(why) == {procs[0].key, procs[1].key}
    assert why[procs[0].key].startswith("another proc of its job was refused: the interference model keeps it off node1")
    assert guard.members.get("node2") is None   # the lost proc's pin is not counted on node2
    alone, why = CycleGuard(setting, state, [], exes).admit(plan, procs)   # device jobs: each on its own
    assert [a.job for a in alone.assignments] == [procs[0].key] and list(why) == [procs[1].key]


def test_an_idle_jobs_program_is_learned_from_a_running_job_of_the_same_schedd_owner_and_cmd(setting, programs):
    run = Job(JobKey("s", 7, 0), "alice", JobStatus.RUNNING, Resources(cpus=1, memory_mb=64),
              remote_slot="slot1_1@node1", executable="/bin/b")
    slots = {"node1": [node_slot("node1", {"7.0": ("alice", B)})]}
    running = [RunningJob(run, "slot1@node1", "node1", None)]
    assert learn_exes({}, running, slots) == {("s", "alice", "/bin/b"): B}
    # an entry published for another owner (another schedd's job 7.0) is not this job's
    assert learn_exes({}, running, {"node1": [node_slot("node1", {"7.0": ("bob", B)})]}) == {}
    state = state_of([node_slot("node1", {"7.0": ("alice", B)}), node_slot("node2")], [run], programs)
    first = decide(state, setting)
    assert first.exes == {("s", "alice", "/bin/b"): B}
    assert first.next_memory().exes == first.exes
    guard = CycleGuard(setting, state, running, {})
    assert guard.program_of(idle(3, "/bin/b")) == program_name(("alice", B))


def test_phase_one_judges_live_programs_as_it_judged_the_measured_ones(setting):
    signals = program_features(load_dataset(default_dataset()))
    model = setting.model
    live = model.with_profiles({f"live-{name}": signals[name] for name in model.profiles})
    assert {n.removeprefix("live-") for n in live.dangerous} == set(model.dangerous)
    some = sorted(model.profiles)[:3]
    for a in some:
        for b in some:
            assert live.probability(f"live-{a}", f"live-{b}") == pytest.approx(model.probability(a, b))
    partial = model.with_profiles({"half": {"user_share": 1.0}})
    assert partial.profiles == {}   # a profile missing a feature is no profile: allowed


def write_record(root, owner, exe, job, signals, **extra):
    directory = root / "interference" / owner / exe
    directory.mkdir(parents=True, exist_ok=True)
    body = {"version": 1, "owner": owner, "exe_sha256": exe, "job": job, "signals": signals, **extra}
    (directory / f"{job}.json").write_text(json.dumps(body))
    return directory / f"{job}.json"


def test_profile_records_are_checked_named_and_reduced_to_medians(tmp_path):
    write_record(tmp_path, "alice", A, "1.0", {"user_share": 0.9, "minor_faults_per_s": 10})
    write_record(tmp_path, "alice", A, "2.0", {"user_share": 0.7, "minor_faults_per_s": 30})
    write_record(tmp_path, "alice", A, "3.0", {"user_share": 0.8})
    bad_value = write_record(tmp_path, "alice", B, "4.0", {"user_share": -1})
    wrong_dir = write_record(tmp_path, "alice", C, "5.0", {"user_share": 1}, exe_sha256=D)
    not_json = tmp_path / "interference" / "alice" / C / "6.0.json"
    not_json.write_text("{")
    (tmp_path / "interference" / "bob" / "not-a-hash").mkdir(parents=True)
    reader = ProfileReader(str(tmp_path))
    profiles = reader.read()
    assert profiles == {("alice", A): {"user_share": 0.8, "minor_faults_per_s": 20.0}}
    assert set(reader.problems) == {str(bad_value), str(wrong_dir), str(not_json)}
    assert "signals.user_share must be a finite number" in reader.problems[str(bad_value)]
    assert "must name its directory" in reader.problems[str(wrong_dir)]
    os.remove(bad_value)
    assert reader.read() == profiles and str(bad_value) not in reader.problems


def test_the_knobs_are_parsed_and_a_dataset_that_does_not_load_is_named(tmp_path):
    runs = {"COSCHED_PROFILE_RUNS_DIR": str(tmp_path)}
    settings = settings_from_knobs({"COSCHED_INTERFERENCE": "True", "COSCHED_INTERFERENCE_CUTOFF": "0.3", **runs})
    assert settings.interference is True and settings.interference_cutoff == 0.3
    assert settings_from_knobs({}).interference is False
    with pytest.raises(SettingsError, match="needs COSCHED_PROFILE_RUNS_DIR"):
        settings_from_knobs({"COSCHED_INTERFERENCE": "true"})
    with pytest.raises(SettingsError, match="COSCHED_INTERFERENCE = 'maybe'"):
        settings_from_knobs({"COSCHED_INTERFERENCE": "maybe"})
    with pytest.raises(SettingsError, match="COSCHED_INTERFERENCE_CUTOFF"):
        settings_from_knobs({"COSCHED_INTERFERENCE_CUTOFF": "1.5"})
    broken = tmp_path / "broken.json"
    broken.write_text("{}")
    bad = settings_from_knobs({"COSCHED_INTERFERENCE": "true", "COSCHED_INTERFERENCE_DATASET": str(broken), **runs})
    with pytest.raises(SettingsError, match="COSCHED_INTERFERENCE_DATASET .*broken.json"):
        CycleConfig.from_settings(bad)
    assert CycleConfig.from_settings(settings).interference.model.settings.prob_cutoff == 0.3


def test_a_job_started_since_its_node_last_advertised_is_known_by_its_cmd(setting, programs):
    run = Job(JobKey("s", 7, 0), "alice", JobStatus.RUNNING, Resources(cpus=1, memory_mb=64),
              remote_slot="slot1_1@node1", executable="/bin/a")
    exes = {("s", "alice", "/bin/a"): A, ("s", "alice", "/bin/b"): B}
    state = state_of([node_slot("node1")], [run, idle(0, "/bin/b")], programs)   # node1 advertises nothing yet
    decision = decide(state, setting, exes)
    assert decision.pins == () and "where job 7.0 runs" in decision.reasons[JobKey("s", 1, 0)]


def test_a_kept_pin_is_taken_back_when_an_ill_matched_job_now_runs_on_its_node(setting, programs):
    exes = {("s", "alice", "/bin/b"): B}
    pinned = replace(idle(0, "/bin/b"), pinned_slot="slot1@node1", pinned_cycle=1)
    state = state_of([node_slot("node1", {"5.0": ("alice", A)}), node_slot("node2")], [pinned], programs)
    decision = decide(state, setting, exes, cycle=2)
    assert [u.job for u in decision.unpins] == [pinned.key]
    assert "the interference model keeps it off node1, where job 5.0 runs" in decision.unpins[0].reason
    assert [(p.job, p.slot) for p in decision.pins] == [(pinned.key, "slot1@node2")]   # planned again at once
    suits = replace(state, slots=(node_slot("node1", {"5.0": ("alice", C)}), node_slot("node2")))
    assert [a.job for a in decide(suits, setting, {("s", "alice", "/bin/b"): D}, cycle=2).kept] == [pinned.key]


def test_hostile_or_malformed_advertised_lines_are_left_out_of_a_slot():
    from condor_sched.classads import slot_from_ad
    from tests.unit.pool_ads import slot_ad

    ad = slot_ad(node_slot("node1"))
    ad["CoSchedJobExe_12_0"] = f"alice {A}"
    ad["CoSchedJobExe_13_0"] = f"../etc {A}"           # not an owner name
    ad["CoSchedJobExe_14_0"] = "alice not-a-hash"
    ad["CoSchedJobExe_15_0"] = 42                      # not a string
    ad["CoSchedJobExe_x_0"] = f"alice {A}"             # not a job id
    assert slot_from_ad(ad).running_exes == {"12.0": ("alice", A)}


def test_at_scale_no_pin_forms_an_ill_matched_pair_and_every_waiting_job_says_why(setting, programs):
    """More idle jobs than the pool holds, three owners, a bully running on a third of the
    nodes, jobs that can never match: every node's pins and running jobs stay well-matched."""
    owners = ("alice", "bob", "carol")
    profiles = {(o, k): v for o in owners for k, v in programs.items()}
    slots = [node_slot(f"node{n:02d}", {"900.0": ("alice", A)} if n % 3 == 0 else {}) for n in range(30)]
    exes = {("s", o, f"/bin/{p}"): k for o in owners for p, k in (("a", A), ("b", B), ("c", C), ("d", D))}
    jobs = [idle(p, f"/bin/{'abcd'[(c + p) % 4]}", owner=owners[c % 3], cluster=c + 1)
            for c in range(40) for p in range(10)]
    never = idle(0, "/bin/b", cluster=99)
    jobs.append(never)
    state = PoolState(tuple(jobs), tuple(slots), program_profiles=profiles,
                      eligible={never.key: frozenset()})
    decision = decide(state, setting, exes)
    assert 0 < len(decision.pins) < len(jobs) - 1
    by_key = {j.key: j for j in jobs}
    guard = CycleGuard(setting, state, [], exes)
    for slot in slots:
        here = [guard.program_of(by_key[p.job]) for p in decision.pins if p.slot == slot.name]
        clusters = [p.job.cluster for p in decision.pins if p.slot == slot.name]
        running = [program_name(k) for k in slot.running_exes.values()]
        for i, a in enumerate(here):
            for b in running:
                assert not guard.verdict(a, b).ill_matched, (slot.name, a, b)
            for b, cb in zip(here[i + 1:], clusters[i + 1:]):
                assert cb == clusters[i] or not guard.verdict(a, b).ill_matched, (slot.name, a, b)
    waiting = {j.key for j in jobs} - {p.job for p in decision.pins}
    assert all(decision.reasons.get(k) for k in waiting)
    assert decision.reasons[never.key].startswith("waiting")
