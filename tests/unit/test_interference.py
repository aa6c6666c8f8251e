"""The interference dataset's derivations (Eq. 1-2, probes) and the model's two phases, on
synthetic datasets whose answers are known."""
import itertools
import json
import math

import pytest

from condor_sched.interference.dataset import (
    DatasetError, bubble_probes, bubble_up_prediction, check_dataset, degradation, noise_cv, pair_records, repeats,
)
from condor_sched.interference.model import ModelSettings, fit_model
from condor_sched.interference.suite import bubble

SIZES = [1024, 8192, 65536]


def report(units, busy=1.0, **extra):
    return {"units": units, "busy_s": busy, "span_s": 1.0, "elapsed_s": 1.2, "user_s": 1.1, "system_s": 0.01,
            "max_rss_kib": 4096, "minor_faults": 5, "voluntary_switches": 1, "involuntary_switches": 3,
            "sched_wait_ns": 1000, "sched_timeslices": 4, **extra}


def dataset(programs, pair_speed, alone_units=100, placements=("separate",), repeat=3, probes=True):
    """A dataset where every program does ``alone_units`` alone and ``pair_speed(victim, opponent)``
    of that beside an opponent (bubbles and the reporter too)."""
    bubbles = [bubble(s).name for s in SIZES]

    def pair(kind, placement, a, b):
        return {"kind": kind, "placement": placement, "programs": [a, b],
                "reports": [report(alone_units * pair_speed(a, b)), report(alone_units * pair_speed(b, a))]}

    runs = [{"kind": "alone", "placement": "alone", "programs": [p], "reports": [report(alone_units)]}
            for p in list(programs) + bubbles + ["reporter"] for _ in range(repeat)]
    for placement, _ in itertools.product(placements, range(repeat)):
        runs += [pair("pair", placement, a, b) for a, b in itertools.combinations_with_replacement(programs, 2)]
        if probes:
            runs += [pair("probe", placement, p, b) for p in programs for b in bubbles]
            runs += [pair("pressure", placement, "reporter", p) for p in programs]
            runs += [pair("calibration", placement, "reporter", b) for b in bubbles]
    return {"version": 2, "suite": [{"name": p} for p in programs], "placements": list(placements),
            "bubble_sizes_kib": SIZES, "reporter": {"name": "reporter"}, "runs": runs}


def test_degradation_follows_eq_1_and_2():
    # two batch programs time-sharing perfectly: each at half speed, Ev = Eo = 0.5 (Eq. 3-6)
    assert degradation(report(50), report(25), 100, 50) == pytest.approx((0.5, 0.5))
    # an interactive opponent busy a quarter of the window: the victim's loss over its busy time
    ev, eo = degradation(report(90), report(20, busy=0.25), 100, 100)
    assert ev == pytest.approx(0.1 / 0.25) and eo == pytest.approx(1 - 0.8)


def test_records_run_both_ways_a_program_beside_itself_once_and_take_medians():
    speeds = {("a", "b"): 0.9, ("b", "a"): 0.6}
    data = check_dataset(dataset(["a", "b"], lambda v, o: speeds.get((v, o), 1.0), probes=False))
    records = {(r.victim, r.opponent): r for r in pair_records(data)}
    assert set(records) == {("a", "a"), ("a", "b"), ("b", "a"), ("b", "b")}
    assert records[("a", "b")].ev == pytest.approx(0.1) and records[("a", "b")].eo == pytest.approx(0.4)
    assert records[("b", "a")].ev == pytest.approx(0.4)
    assert len(records[("a", "b")].ev_runs) == 3
    assert repeats(data, "separate") == 3 and noise_cv(data, "separate") == pytest.approx(0.0)


def test_bubble_probes_read_the_size_an_opponent_equals():
    # the reporter slows by bubble size: 1m -> 0.0, 8m -> 0.2, 64m -> 0.6; program "hog" slows
    # it by 0.4, half way between 8m and 64m on the log scale (log2 MiB 3 .. 6 -> 4.5)
    slow = {1024: 0.0, 8192: 0.2, 65536: 0.6}

    def speed(victim, opponent):
        if victim == "reporter":
            if opponent.startswith("bubble-"):
                return 1 - slow[next(s for s in SIZES if bubble(s).name == opponent)]
            return {"hog": 0.6, "meek": 1.0}[opponent]
        if victim == "meek" and opponent.startswith("bubble-"):
            return 1 - {bubble(1024).name: 0.0, bubble(8192).name: 0.1, bubble(65536).name: 0.5}[opponent]
        return 1.0

    data = check_dataset(dataset(["hog", "meek"], speed))
    probes = bubble_probes(data)["separate"]
    assert probes["hog"]["log2_bubble_mib"] == pytest.approx(4.5)
    assert probes["meek"]["log2_bubble_mib"] == pytest.approx(0.0)
    assert probes["meek"]["sensitivity_64m"] == pytest.approx(0.5)
    # Bubble-Up's prediction of meek beside hog: meek's sensitivity at 2^4.5 MiB
    assert bubble_up_prediction(probes, "meek", "hog", SIZES) == pytest.approx(0.1 + 0.4 * 0.5)


@pytest.mark.parametrize("mutate, named", [
    (lambda d: d.update(version=7), "version 7"),
    (lambda d: d["runs"].__setitem__(0, {**d["runs"][0], "kind": "odd"}), "runs[0]: 'kind'"),
    (lambda d: d["runs"][-1]["reports"][0].update(units=float("nan")), "'units' must be a positive number"),
    (lambda d: d.update(runs=[r for r in d["runs"] if r["programs"] != ["b"]]), "no run alone of ['b']"),
    (lambda d: d["runs"][-1].update(programs=["a", "zzz"]), "'programs' must name 2"),
    (lambda d: d.update(reporter="r"), "'reporter' must be a program"),
    (lambda d: d["runs"][0]["reports"][0].update(user_s="1.0"), "report field 'user_s' must be a number >= 0"),
    (lambda d: d["runs"][0]["reports"][0].update(minor_faults=-3), "report field 'minor_faults'"),
    (lambda d: d["runs"][0].update(pressure_us_per_s={"cpu": "high"}), "'pressure_us_per_s' must map"),
    (lambda d: d["suite"].append({"name": "a"}), "names a program twice"),
])
def test_a_damaged_dataset_is_refused_naming_what_is_wrong(mutate, named):
    raw = dataset(["a", "b"], lambda v, o: 1.0)
    mutate(raw)
    with pytest.raises(DatasetError) as e:
        check_dataset(json.loads(json.dumps(raw)), "d.json")
    assert named in str(e.value) and str(e.value).startswith("d.json: ")


def synthetic_profiles(n=12):
    """Programs with a cache sensitivity and a pressure; Ev = sensitivity x pressure."""
    return {f"p{i}": {"sensitivity_x": (i % 4) / 3, "pressure_x_per_s": 10.0 ** (i // 4), "user_share": 1.0}
            for i in range(n)}


def records_for(profiles, hurt):
    from condor_sched.interference.dataset import PairRecord

    return [PairRecord("separate", v, o, hurt(v, o), hurt(o, v), ()) for v in profiles for o in profiles]


def test_phase_two_learns_which_pairs_hurt_and_judges_both_ways():
    profiles = synthetic_profiles()

    def hurt(v, o):   # additive in the victim's sensitivity and the opponent's pressure, as Eq. 7
        return 0.1 * (3 * profiles[v]["sensitivity_x"] + math.log10(profiles[o]["pressure_x_per_s"])) - 0.15

    model = fit_model(records_for(profiles, hurt), profiles, "separate",
                      ModelSettings(ev_threshold=0.1, clusters=1, features="all"))
    assert not model.dangerous
    assert model.probability("p3", "p11") > 0.7        # most sensitive beside the heaviest
    assert model.probability("p0", "p11") < 0.3        # insensitive
    verdict = model.judge("p11", "p3")                  # p11 is sensitive too (i % 4 == 3)
    assert verdict.ill_matched and "beside" in verdict.reason and "Pr(Ev > 0.1)" in verdict.reason
    assert not model.judge("p0", "p4").ill_matched
    assert model.probability("p3", "never-profiled") == 0.0 and not model.judge("p3", "never-profiled").ill_matched


def test_phase_one_flags_a_cluster_degraded_beside_everyone():
    profiles = synthetic_profiles()
    profiles["fragile"] = {"sensitivity_x": 9.0, "pressure_x_per_s": 1e6, "user_share": 0.1}
    profiles["fragile2"] = {"sensitivity_x": 9.5, "pressure_x_per_s": 1e6, "user_share": 0.1}

    def hurt(v, o):
        return 0.9 if v.startswith("fragile") else 0.0

    model = fit_model(records_for(profiles, hurt), profiles, "separate",
                      ModelSettings(ev_threshold=0.1, clusters=4, features="all"))
    assert model.dangerous == {"fragile", "fragile2"}
    verdict = model.judge("p0", "fragile")
    assert verdict.ill_matched and "fragile is dangerous" in verdict.reason
    assert model.probability("p0", "p1") < 0.5


def test_a_measurement_plans_every_pair_probe_and_run_alone_in_a_shuffled_order():
    from condor_sched.interference.measure import plan_runs
    from condor_sched.interference.suite import REPORTER, SUITE

    runs = plan_runs(SUITE, SIZES, REPORTER, repeats=3, alone_repeats=5, seed=1)
    count = {kind: sum(r.kind == kind for r in runs) for kind in ("alone", "pair", "probe", "pressure", "calibration")}
    n = len(SUITE)
    assert count == {"alone": 5 * (n + len(SIZES) + 1), "pair": 3 * 2 * n * (n + 1) // 2, "probe": 3 * 2 * n * len(SIZES),
                     "pressure": 3 * 2 * n, "calibration": 3 * 2 * len(SIZES)}
    assert n * (n + 1) // 2 >= 150                       # the pairs a placement needs
    assert runs != plan_runs(SUITE, SIZES, REPORTER, repeats=3, alone_repeats=5, seed=2)
    assert [r.kind for r in runs[:40]].count("pair") < 40  # shuffled, not kind by kind


def test_a_written_dataset_reads_back(tmp_path):
    from condor_sched.interference.dataset import load_dataset
    from condor_sched.interference.measure import write_dataset

    raw = dataset(["a", "b"], lambda v, o: 0.8)
    write_dataset(raw, tmp_path / "d.json")
    data = load_dataset(tmp_path / "d.json")
    assert data.programs == ("a", "b") and len(data.runs) == len(raw["runs"])
    assert [r.ev for r in pair_records(data)] == pytest.approx([0.2] * 4)


def test_label_noise_reads_how_often_one_run_disagrees_with_the_median():
    from condor_sched.interference.dataset import PairRecord
    from condor_sched.interference.evaluate import label_noise

    records = [PairRecord("separate", "a", "b", 0.15, 0.0, (0.05, 0.15, 0.2)),   # runs disagree
               PairRecord("separate", "b", "a", 0.0, 0.15, (0.0, 0.01, -0.01)),  # all well-matched
               PairRecord("separate", "a", "a", 0.4, 0.4, (0.3, 0.4, 0.5))]      # all ill-matched
    noise = label_noise(records, 0.1)
    assert noise["repeat_agreement"] == pytest.approx(2 / 3)
    # ill-matched by the median: 6 runs, 5 say so; well-matched: 3 runs, all say so
    assert noise["single_run_accuracy"] == pytest.approx((5 / 6 + 1) / 2)
