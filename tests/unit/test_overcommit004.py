"""Paper 004's overcommitting: the placement rules (pure) and the simulator on hand-built pair
tables whose answers are known, then on the committed dataset."""
import pytest

from condor_sched.interference.dataset import check_dataset, pair_records
from condor_sched.interference.model import DEFAULT_EV_THRESHOLD, Verdict
from condor_sched.interference.pair_table import PairTable, out_of_fold_verdicts, pair_table
from condor_sched.modes.overcommit.placement import Core, choose_blind, choose_core, place
from condor_sched.simulate.overcommit004 import MixJob, OvercommitSimulation, overcommit_mix, simulate_overcommit004
from tests.unit.test_interference import dataset

SAFE = Verdict(False, "", 0.0, 0.0)


def judge_of(probabilities, ill=frozenset()):
    """A judge: Pr(Ev > t) per (victim, opponent, placement) (default 0.1); ``ill``: pairs refused."""
    def judge(a, b, placement):
        p_ab = probabilities.get((a, b, placement), 0.1)
        p_ba = probabilities.get((b, a, placement), 0.1)
        if frozenset((a, b)) in ill or a in ill or b in ill:
            return Verdict(True, f"{a} and {b} are ill-matched ({placement})", p_ab, p_ba)
        return Verdict(False, "", p_ab, p_ba)
    return judge


def cores(*nodes):
    return [Core(f"n{n}", i, tuple(programs)) for n, node in enumerate(nodes) for i, programs in enumerate(node)]


def test_a_free_core_comes_before_sharing_one_and_the_least_degradation_wins():
    pool = cores([["a"], []], [["b"], ["c"]])
    assert choose_core("x", pool, 2, judge_of({})).core == pool[1]      # the only free core
    busy = cores([["a"], ["b"]])
    worse = judge_of({("x", "a", "shared"): 0.4, ("x", "b", "shared"): 0.2})
    choice = choose_core("x", busy, 2, worse)
    assert choice.core == busy[1] and choice.predicted == pytest.approx(0.2)


def test_multiplicity_bounds_every_core_and_exclusive_shares_none():
    full = cores([["a", "b"], ["c", "d"]])
    assert choose_core("x", full, 2, judge_of({})).core is None
    assert choose_blind(cores([["a"], []]), 1).core.index == 1
    assert place("exclusive", "x", cores([["a"], ["b"]]), judge_of({})).core is None
    assert place("naive", "x", cores([["a"], ["b", "c"]]), judge_of({})).core.index == 0
    with pytest.raises(ValueError, match="unknown overcommit policy"):
        place("greedy", "x", full, judge_of({}))


def test_a_refused_pair_is_never_formed_and_the_reason_names_it():
    # x is ill-matched with the bully, on its core or beside it on the node: node 0 is out
    pool = cores([["bully"], []], [["calm", "calm"], ["calm"]])
    choice = choose_core("x", pool, 2, judge_of({}, ill={frozenset(("x", "bully"))}))
    assert choice.core == pool[3]
    only_bully = cores([["bully"], []])
    waiting = choose_core("x", only_bully, 2, judge_of({}, ill={frozenset(("x", "bully"))}))
    assert waiting.core is None
    assert "beside bully on n0 cpu 0" in waiting.reason and "x and bully are ill-matched" in waiting.reason
    assert "1 more cores refused" in waiting.reason
    # a dangerous program refuses every neighbour
    assert choose_core("x", cores([["danger"], []]), 2, judge_of({}, ill={"danger"})).core is None


def table_of(speeds, ill_pairs, interactive=frozenset()):
    labels = {}
    programs = {p for key in speeds for p in key[1:]}
    for placement in ("shared", "separate"):
        for a in programs:
            for b in programs:
                labels[(placement, *sorted((a, b)))] = frozenset((a, b)) in ill_pairs.get(placement, ())
    return PairTable(speeds, labels, frozenset(interactive))


def uniform_speeds(programs, shared=0.5, separate=1.0, overrides=None):
    out = {}
    for a in programs:
        for b in programs:
            out[("shared", a, b)] = shared
            out[("separate", a, b)] = separate
    out.update(overrides or {})
    return out


def test_exclusive_runs_two_jobs_on_a_node_side_by_side_at_their_measured_speeds():
    table = table_of(uniform_speeds(["a", "b"], overrides={("separate", "a", "b"): 0.5}), {})
    jobs = [MixJob(0, "a", False, 0.0, 100.0), MixJob(1, "b", False, 0.0, 100.0)]
    result = OvercommitSimulation(jobs, 1, "exclusive", table, {}).run()
    # a runs at half speed beside b until b ends at 100 s, then alone: 50 units left -> 150 s
    assert result["makespan_s"] == pytest.approx(150.0)
    assert result["separate_pair_s"] == pytest.approx(100.0) and result["shared_pair_s"] == 0.0


def test_naive_time_shares_a_core_and_counts_the_measured_ill_matched_time():
    table = table_of(uniform_speeds(["a", "b"]), {"shared": {frozenset(("a", "b"))}})
    jobs = [MixJob(i, p, False, 0.0, 100.0) for i, p in enumerate(["a", "a", "b"])]
    result = OvercommitSimulation(jobs, 1, "naive", table, {}).run()
    # three jobs on two cores: two share a core at half speed; each pair's time counted once
    assert result["shared_pair_s"] > 0 and result["composed_share"] > 0
    assert 0 < result["ill_matched_pair_share"] <= 1
    assert OvercommitSimulation(jobs, 1, "exclusive", table, {}).run()["shared_pair_s"] == 0.0


def test_overcommit_keeps_a_pair_the_model_refuses_apart_and_naive_does_not():
    programs = ["calm", "bully"]
    table = table_of(uniform_speeds(programs, overrides={("separate", "calm", "bully"): 0.6}),
                     {"separate": {frozenset(programs)}, "shared": {frozenset(programs)}})
    refused = Verdict(True, "bully beside calm: Pr(Ev > 0.1) = 0.9 > 0.5 (separate)", 0.9, 0.9)
    verdicts = {(placement, "bully", "calm"): refused for placement in ("shared", "separate")}
    jobs = [MixJob(i, programs[i % 2], False, 10.0 * i, 500.0) for i in range(4)]
    guarded = OvercommitSimulation(jobs, 1, "overcommit", table, verdicts).run()
    blind = OvercommitSimulation(jobs, 1, "naive", table, verdicts).run()
    # one node: the bullies wait for the calm jobs to end (one run after the other)
    assert guarded["ill_matched_pair_share"] == 0.0 and guarded["model_refusals"] > 0
    assert guarded["makespan_s"] > 1000.0
    assert blind["ill_matched_pair_share"] > 0.0


def test_the_mix_has_long_batch_and_short_interactive_jobs_and_is_seeded():
    jobs = overcommit_mix(["a", "b", "i"], frozenset({"i"}), 2, seed=3)
    assert jobs == overcommit_mix(["a", "b", "i"], frozenset({"i"}), 2, seed=3)
    batch = [j for j in jobs if not j.interactive]
    sessions = [j for j in jobs if j.interactive]
    assert len(batch) == 16 and len(sessions) == 32
    assert min(j.work_s for j in batch) >= 3600 > max(j.work_s for j in sessions)
    assert sum(j.arrival_s == 0 for j in batch) == 8 and all(j.program == "i" for j in sessions)
    with pytest.raises(ValueError, match="batch and interactive"):
        overcommit_mix(["a"], frozenset(), 1, 0)


def test_pair_table_speeds_are_1_minus_ev_for_batch_pairs_and_labels_follow_the_issue():
    speeds = {("a", "b"): 0.45, ("b", "a"): 0.45, ("a", "a"): 0.5, ("b", "b"): 0.55}
    raw = dataset(["a", "b"], lambda v, o: speeds.get((v, o), 1.0), placements=("shared", "separate"), probes=False)
    data = check_dataset(raw)
    table = pair_table(data, DEFAULT_EV_THRESHOLD)
    for r in pair_records(data):
        assert table.speed(r.placement, r.victim, r.opponent) == pytest.approx(1 - r.ev)
    assert table.ill_matched("shared", "a", "b") is True       # E = 0.55 + 0.55 >= 1
    assert table.ill_matched("shared", "b", "b") is False      # E = 0.9
    assert table.ill_matched("separate", "b", "a") is True     # Ev = 0.55 > 0.1


def test_every_measured_pair_gets_a_verdict_from_a_model_that_did_not_see_it():
    from condor_sched.interference.dataset import load_dataset
    from condor_sched.interference.report import default_dataset

    data = load_dataset(default_dataset())
    verdicts = out_of_fold_verdicts(data, DEFAULT_EV_THRESHOLD, 0.5, folds=3)
    pairs = {(r.placement, *r.pair) for r in pair_records(data)}
    assert set(verdicts) == pairs
    assert 0 < sum(v.ill_matched for v in verdicts.values()) < len(verdicts)


def test_the_measured_label_yardstick_never_forms_a_pair_measured_ill_matched():
    from condor_sched.simulate.overcommit004 import MEASURED

    result = simulate_overcommit004(2, MEASURED, seed=0)
    assert result["ill_matched_pair_share"] == 0.0 and result["shared_pair_s"] > 0.0
    assert result["model_refusals"] > 0


def test_the_committed_dataset_drives_all_three_policies():
    results = {policy: simulate_overcommit004(2, policy, seed=0) for policy in ("exclusive", "naive", "overcommit")}
    assert results["exclusive"]["shared_pair_s"] == 0.0
    assert results["naive"]["shared_pair_s"] > 0.0
    # the model refuses pairs the blind policy forms: less ill-matched time than naive
    assert results["overcommit"]["ill_matched_pair_share"] < results["naive"]["ill_matched_pair_share"]
    assert all(r["makespan_s"] > 0 for r in results.values())
