"""What one job user's (or one node's) ad can do to a cycle: nothing beyond its own job.

An expression whose evaluation costs more than the bound, a NUL character, a GPU uuid
advertised twice, a mate's base limit out of range: each is refused where it is read, with
the attribute named, and the cycle goes on for everyone else."""
from __future__ import annotations

import json
import time
from dataclasses import replace

import classad2
import pytest

from condor_sched.classads import state_from_ads, state_from_snapshot
from condor_sched.cycle import CycleConfig, CycleMemory, decide_cycle
from condor_sched.expression_cost import MAX_EXPRESSION_COST, expression_cost_problem
from condor_sched.model import MAX_EXECUTE_DURATION_S, JobKey
from condor_sched.settings import settings_from_knobs
from condor_sched.snapshot import load_snapshot
from test_gpu_sharing import NOW as GPU_NOW, gpu_job, gpu_node_ad
from test_node_sharing import SCHEDD, decide as decide_nodes, job_ad, key, node_slot_ads, running_mate

EXAMPLE = "examples/snapshots/default"


def doubling_record(levels: int) -> str:
    """``[a0 = 1; a1 = a0 + a0; ...].aN``: each level doubles the work of evaluating it."""
    chain = ";".join(["a0 = 1"] + [f"a{i} = a{i - 1} + a{i - 1}" for i in range(1, levels + 1)])
    return f"[{chain}].a{levels}"


def test_a_doubling_chain_is_refused_by_its_text_alone_in_linear_time():
    start = time.perf_counter()
    problem = expression_cost_problem([("Requirements", f"{doubling_record(2000)} < 0 || TARGET.Cpus >= 1")])
    assert time.perf_counter() - start < 1.0
    assert problem is not None and problem[0] == "Requirements" and f"{MAX_EXPRESSION_COST:,}" in problem[1]
    # the same doubling through the ad's own attributes, named at its first costly attribute:
    # A_n reads 3 terms and A_(n-1) twice, 2^(n+2) - 3 in all: 32,765 at A13, 65,533 at A14
    ad = [(f"A{i}", f"A{i - 1} + A{i - 1}") for i in range(1, 41)] + [("A0", "1"), ("Requirements", "A40 > 0")]
    assert expression_cost_problem(ad)[0] == "A14"
    assert expression_cost_problem(ad[:13] + [("A0", "1")]) is None


@pytest.mark.parametrize("levels, refused", [(10, False), (13, True)])
def test_the_bound_sits_where_the_expansion_passes_it(levels, refused):
    # 2^levels reads of a0: 8,192 at 13 levels, each term of the chain counted, passes 50,000
    assert (expression_cost_problem([("Rank", doubling_record(levels))]) is not None) is refused


def test_ordinary_job_expressions_are_far_below_the_bound():
    queue = json.load(open(f"{EXAMPLE}/queue.json"))
    for ad in queue:
        expressions = [(k, v[6:-2]) for k, v in ad.items() if isinstance(v, str) and v.startswith("/Expr(")]
        assert expression_cost_problem(expressions, limit=500) is None
    # many references, each read once, and a loop (ClassAd evaluation stops at it) are fine
    wide = " + ".join(f"B{i}" for i in range(2000))
    assert expression_cost_problem([("X", wide), *[(f"B{i}", "1") for i in range(2000)]]) is None
    assert expression_cost_problem([("X", "Y + 1"), ("Y", "X + 1")]) is None


@pytest.mark.parametrize("expressions, attribute, words", [
    ([("Requirements", 'size(regexps("(.*)", regexps("(.*)", "ab", "\\\\1\\\\1\\\\1"), "\\\\1\\\\1")) > 0')],
     "Requirements", "string substitution"),
    ([("S", 'regexps("(.*)", "ab", "\\\\1\\\\1")'), ("Requirements", 'replaceall("a", S, "bb") != ""')],
     "Requirements", "string substitution"),
    ([("X", 'eval(strcat("Y", "+Y"))'), ("Y", "1")], "X", "calls eval()"),
    ([("Requirements", "countMatches(TARGET.Cpus > 1, {[a = 1], [a = 2]}) > 0")], "Requirements", "countmatches"),
    ([("Requirements", " || ".join(f'regexp("n{i}", TARGET.Machine)' for i in range(11)))], "Requirements",
     "terms"),
])
def test_growing_strings_eval_loops_and_many_regular_expressions_are_refused(expressions, attribute, words):
    problem = expression_cost_problem(expressions)
    assert problem is not None and problem[0] == attribute and words in problem[1]


def snapshot_with(tmp_path, **hostile) -> tuple:
    queue = json.load(open(f"{EXAMPLE}/queue.json"))
    bad = dict(queue[0], ProcId=99, Owner="mallory", User="mallory@cosched.test", **hostile)
    bad.pop("CoSchedPinOriginalRequirements", None)
    (tmp_path / "queue.json").write_text(json.dumps(queue + [bad]))
    return tmp_path / "queue.json", f"{EXAMPLE}/machines.json"


def plan(queue, machines):
    state = load_snapshot(queue, machines)
    config = CycleConfig.from_settings(settings_from_knobs({"COSCHED_POLICY": "knapsack"}))
    return decide_cycle(state, CycleMemory.fresh(state), config)


@pytest.mark.parametrize("attribute, text", [
    ("Requirements", f"/Expr({doubling_record(40)} < 0 || (TARGET.Cpus >= RequestCpus))/"),
    ("Rank", f"/Expr({doubling_record(40)})/"),
    ("RequestMemory", f"/Expr({doubling_record(40)})/"),
])
def test_a_costly_job_is_held_with_the_reason_and_everyone_elses_cycle_is_unchanged(tmp_path, attribute, text):
    start = time.perf_counter()
    decision = plan(*snapshot_with(tmp_path, **{attribute: text}))
    assert time.perf_counter() - start < 30  # 40 levels: days of classad2 evaluation before the bound
    mallory = JobKey("localhost", 65, 99)
    (hold,) = [h for h in decision.holds if h.job == mallory]
    assert attribute in hold.reason and "cannot be evaluated within" in hold.reason
    assert mallory not in {p.job for p in decision.pins}
    others = plan(f"{EXAMPLE}/queue.json", f"{EXAMPLE}/machines.json")
    assert [(p.job, p.slot) for p in decision.pins] == [(p.job, p.slot) for p in others.pins]


def test_a_costly_ad_from_the_live_pool_is_skipped_before_any_evaluation():
    ad = job_ad(1, requested=2000)
    ad["Requirements"] = classad2.ExprTree(f"{doubling_record(60)} < 0 || TARGET.Cpus >= RequestCpus")
    ad["RequestCpus"] = classad2.ExprTree(doubling_record(60))
    start = time.perf_counter()
    state = state_from_ads({SCHEDD: [ad, job_ad(2, requested=2000)]}, node_slot_ads("node1"))
    assert time.perf_counter() - start < 5
    (skipped,) = state.skipped
    assert skipped.job == key(1) and skipped.idle and "RequestCpus cannot be evaluated" in skipped.reason
    assert [j.key for j in state.jobs] == [key(2)]


def test_a_nul_character_skips_only_its_job_with_the_attribute_named(tmp_path):
    decision = plan(*snapshot_with(tmp_path, CoSchedProgram="MG\u0000x"))
    (hold,) = [h for h in decision.holds if h.job.proc == 99]
    assert "CoSchedProgram holds a NUL character" in hold.reason
    assert decision.pins  # the other 40 jobs are planned


def test_a_nul_in_any_attribute_the_match_reads_skips_the_job(tmp_path):
    queue, machines = snapshot_with(tmp_path, MyTag="a\u0000b",
                                    Requirements='/Expr(MyTag =!= undefined && TARGET.Cpus >= RequestCpus)/')
    state = state_from_snapshot(queue, machines)
    (skip,) = state.skipped
    assert skip.job.proc == 99 and skip.reason.startswith("MyTag holds a NUL character")
    assert len(state.jobs) == 40


def gpu_state(*slots):
    config = CycleConfig.from_settings(settings_from_knobs({"COSCHED_GPU_POLICY": "best-fit"}))
    state = replace(state_from_ads({SCHEDD: [gpu_job(i) for i in range(6)]}, list(slots)), observed_at_s=GPU_NOW)
    return state, decide_cycle(state, CycleMemory(5), config)


def test_a_gpu_uuid_repeated_within_a_slot_ad_makes_that_slot_unreadable():
    twice = gpu_node_ad("g1", gpus=2)
    twice["CoSchedGPU1Uuid"] = twice["CoSchedGPU0Uuid"]
    state, decision = gpu_state(twice, gpu_node_ad("g2", gpus=2))
    assert [s.name for s in state.slots] == ["slot1@g2.test"]
    (skip,) = state.skipped
    assert "CoSchedGPU1Uuid repeats CoSchedGPU0Uuid" in skip.reason
    assert {p.slot for p in decision.gpu_sharing.pins} == {"slot1@g2.test"}


def test_a_gpu_uuid_advertised_by_two_nodes_books_neither():
    thief = gpu_node_ad("g2", gpus=2)
    thief["CoSchedGPU1Uuid"] = "GPU-g1-0"
    state, decision = gpu_state(gpu_node_ad("g1", gpus=2), thief, gpu_node_ad("g3", gpus=1))
    assert [s.name for s in state.slots] == ["slot1@g3.test"]
    assert sorted(s.what for s in state.skipped) == ["slot slot1@g1.test", "slot slot1@g2.test"]
    assert all("GPU gpu-g1-0 is also advertised by slot" in s.reason for s in state.skipped)
    assert {p.slot for p in decision.gpu_sharing.pins} == {"slot1@g3.test"}


@pytest.mark.parametrize("base", [-5, 0, 10**15, 2.5e300, "3600"])
def test_a_mates_base_limit_out_of_range_is_never_written_back(base):
    # the guest's pin went stale (refused), so its mate's limit would be restored to the base
    mate = running_mate(0, requested=5600, CoSchedPinGuest=f"{SCHEDD}#1.1", CoSchedPinMateBaseDuration=base)
    guest = job_ad(1, requested=2000, CoSchedPinSlot="slot2@node1.test", CoSchedPinCycle=1, CoSchedPinMate="1.0")
    decision = decide_nodes([mate, guest], node_slot_ads("node1", busy_cpus=8), cycle=20)
    (restore,) = decision.node_sharing.restore
    assert "AllowedExecuteDuration" not in dict(restore.writes)
    assert dict(restore.writes)["CoSchedPinMateBaseDuration"] == "undefined"


def test_a_mates_base_limit_in_range_is_restored_and_a_lengthened_limit_stops_at_the_largest():
    mate = running_mate(0, requested=5600, CoSchedPinGuest=f"{SCHEDD}#1.1", CoSchedPinMateBaseDuration=3600)
    guest = job_ad(1, requested=2000, CoSchedPinSlot="slot2@node1.test", CoSchedPinCycle=1, CoSchedPinMate="1.0")
    (restore,) = decide_nodes([mate, guest], node_slot_ads("node1", busy_cpus=8), cycle=20).node_sharing.restore
    assert dict(restore.writes)["AllowedExecuteDuration"] == "3600"
    from condor_sched.modes.mates.live import lengthen_change
    from condor_sched.model import Job, JobStatus, Resources
    huge = Job(key(0), "alice", JobStatus.RUNNING, Resources(cpus=8), requested_runtime_s=MAX_EXECUTE_DURATION_S - 5,
               malleable=True)
    change = lengthen_change(huge, key(1), 10**6)
    assert dict(change.writes)["AllowedExecuteDuration"] == str(MAX_EXECUTE_DURATION_S)


def test_two_guests_pinned_to_one_mate_keep_one_pin_the_one_the_mate_names():
    mate = running_mate(0, requested=5600, CoSchedPinGuest=f"{SCHEDD}#1.2", CoSchedPinMateBaseDuration=3600)
    pinned = dict(CoSchedPinSlot="slot2@node1.test", CoSchedPinCycle=4, CoSchedPinMate="1.0")
    first, named = job_ad(1, requested=2000, **pinned), job_ad(2, requested=2000, **pinned)
    decision = decide_nodes([mate, first, named], node_slot_ads("node1", busy_cpus=8))
    assert decision.node_sharing.kept == (key(2),)
    (unpin,) = decision.node_sharing.unpins
    assert unpin[0] == key(1) and "already hosts guest" in unpin[1]
    assert decision.to_json()["guest_kept"] == [{"job": "1.2", "schedd": SCHEDD}]


def test_a_slot_whose_start_costs_more_than_the_bound_is_skipped_and_the_rest_planned(tmp_path):
    machines = json.load(open(f"{EXAMPLE}/machines.json"))
    machines[0]["Start"] = f"/Expr({doubling_record(40)} > 0)/"
    (tmp_path / "machines.json").write_text(json.dumps(machines))
    start = time.perf_counter()
    state = load_snapshot(f"{EXAMPLE}/queue.json", tmp_path / "machines.json")
    assert time.perf_counter() - start < 30
    (skip,) = state.skipped
    assert skip.what == f"slot {machines[0]['Name']}" and "cannot be evaluated within" in skip.reason
    assert len(state.slots) == len(machines) - 1


def test_an_integer_beyond_a_doubles_range_skips_its_job_wherever_it_is(tmp_path):
    for value in (10**400, [1, [-10**400]], {"a": 10**400}):
        state = state_from_snapshot(*snapshot_with(tmp_path, RequestMemory=value))
        (skip,) = state.skipped
        assert skip.job.proc == 99 and skip.reason.startswith("RequestMemory"), skip


@pytest.mark.parametrize("attribute, value", [("Name", "slot1@node3\u0000x"), ("OpSys", "LINUX\u0000")])
def test_a_slot_ad_no_probe_can_be_built_of_is_skipped_not_fatal(tmp_path, attribute, value):
    machines = json.load(open(f"{EXAMPLE}/machines.json"))
    machines[0][attribute] = value
    (tmp_path / "machines.json").write_text(json.dumps(machines))
    state = load_snapshot(f"{EXAMPLE}/queue.json", tmp_path / "machines.json")
    assert len(state.slots) == len(machines) - 1 and len(state.skipped) == 1


def test_a_slot_named_by_an_expression_is_matched_by_the_name_it_evaluates_to(tmp_path):
    machines = json.load(open(f"{EXAMPLE}/machines.json"))
    name = "slot2@node1@node1.cosched.test"  # a slot the bundled jobs accept
    (ad,) = [ad for ad in machines if ad["Name"] == name]
    ad["Name"] = f'/Expr(strcat("{name[:5]}", "{name[5:]}"))/'
    (tmp_path / "machines.json").write_text(json.dumps(machines))
    state = load_snapshot(f"{EXAMPLE}/queue.json", tmp_path / "machines.json")
    assert name in {s.name for s in state.slots}
    assert any(name in slots for slots in state.eligible.values())


def test_a_job_expression_that_reads_itself_round_is_planned_not_fatal(tmp_path):
    queue, machines = snapshot_with(tmp_path, MyTag="/Expr([a = b; b = a].a)/",
                                    Requirements="/Expr(MyTag =!= 7 && TARGET.PhiMemory >= RequestPhiMemory)/")
    state = load_snapshot(queue, machines)
    assert len(state.jobs) == 41 and not state.skipped
