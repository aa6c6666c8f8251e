"""``condor-sched interference measure`` (the two-kernel smoke suite, for real) and
``interference evaluate`` on the committed dataset, via CliRunner."""
import json

import pytest
from click.testing import CliRunner

from condor_sched.cli import main
from condor_sched.interference.dataset import load_dataset, pair_records, program_features
from condor_sched.interference.report import default_dataset

KEYS = {"pairs", "repeats", "noise_cv", "accuracy", "false_negative_rate", "positive_share"}


def cli(*args, **env):
    return CliRunner().invoke(main, ["interference", *args], env=env or None, catch_exceptions=False)


@pytest.fixture(scope="module")
def smoke_dataset(tmp_path_factory):
    out = tmp_path_factory.mktemp("smoke") / "smoke.json"
    build = tmp_path_factory.mktemp("build")
    result = cli("measure", "--smoke", "--repeats", "2", "--alone-repeats", "2", "--window", "0.2",
                 "--warmup", "0.05", "--out", str(out), "--build-dir", str(build))
    assert result.exit_code == 0, result.output
    return out


def test_the_smoke_measurement_runs_both_kernels_in_both_placements(smoke_dataset):
    data = load_dataset(smoke_dataset)
    records = pair_records(data)
    assert {(r.placement, r.victim, r.opponent) for r in records} == {
        (p, v, o) for p in ("separate", "shared")
        for v, o in (("fma", "fma"), ("fma", "stream-small"), ("stream-small", "fma"), ("stream-small", "stream-small"))}
    # time-sharing one vCPU halves each program's speed at least: Ev >= 0.5 less noise
    assert all(r.ev > 0.4 for r in records if r.placement == "shared")
    assert all(abs(r.ev) < 0.4 for r in records if r.placement == "separate" and "fma" in (r.victim, r.opponent))
    features = program_features(data)
    assert features["fma"]["user_share"] > 0.8 and features["stream-small"]["log2_peak_rss_mib"] >= 3


def test_evaluate_reads_the_smoke_dataset(smoke_dataset):
    result = cli("evaluate", str(smoke_dataset), "--folds", "2", "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert KEYS <= set(report) and report["placements"] == ["separate", "shared"]
    assert report["pairs"] == {"separate": 3, "shared": 3} and report["repeats"] == {"separate": 2, "shared": 2}


def test_the_committed_dataset_holds_what_the_model_needs_and_the_model_beats_its_baselines():
    result = cli("evaluate", str(default_dataset()), "--folds", "3", "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert report["placements"] == ["separate", "shared"]
    for placement in report["placements"]:
        r = report["by_placement"][placement]
        assert r["pairs"] >= 150 and r["repeats"] >= 3 and r["records"] == r["pairs"] * 2 - 18
        assert r["accuracy"] >= max(r["baselines"]["majority_class"], r["baselines"]["placement_only"]) + 0.10
        # no predictor trained on noisy labels beats the labels' own repeatability by much
        assert r["accuracy"] <= r["label_noise"]["single_run_accuracy"] + 0.05
    assert report["by_placement"]["shared"]["positive_share"] >= 0.30
    assert report["by_placement"]["shared"]["false_negative_rate"] <= 0.05


def test_the_paper_threshold_on_a_time_shared_vcpu_labels_noise():
    result = cli("evaluate", str(default_dataset()), "--ev-threshold", "shared=0.5", "--json")
    shared = json.loads(result.output)["by_placement"]["shared"]
    assert shared["ev_threshold"] == 0.5 and shared["positive_share"] > 0.6
    assert abs(shared["median_ev"] - 0.5) < 0.03


def test_the_text_report_names_each_placement_and_its_baselines():
    result = cli("evaluate", str(default_dataset()))
    assert result.exit_code == 0, result.output
    assert "separate (t = 0.1)" in result.output and "shared (t = 0.55)" in result.output
    assert "majority" in result.output and "Bubble-Up" in result.output


def _strict(text):
    def refuse(constant):
        raise ValueError(f"not JSON: {constant}")
    return json.loads(text, parse_constant=refuse)


def test_a_dataset_too_small_for_the_folds_is_refused_by_name_and_json_stays_json(tmp_path, smoke_dataset):
    result = cli("evaluate", str(smoke_dataset), "--folds", "20", "--json")
    assert result.exit_code == 1 and "cannot cross-validate with 20 folds" in result.output
    # strict JSON (no NaN) from a dataset whose labels do not hang on a 0.2 s window's noise
    _strict(cli("evaluate", str(default_dataset()), "--folds", "3", "--json").output)


def test_bad_input_is_named(tmp_path):
    junk = tmp_path / "junk.json"
    junk.write_text("{not json")
    result = cli("evaluate", str(junk))
    assert result.exit_code == 1 and "junk.json: not a readable JSON dataset" in result.output
    result = cli("evaluate", str(default_dataset()), "--ev-threshold", "gpu=0.2")
    assert result.exit_code == 2 and "placement must be one of" in result.output
    result = cli("measure", "--smoke", "--out", str(tmp_path / "x.json"), "--build-dir", str(tmp_path / "b"),
                 CC="no-such-compiler-here")
    assert result.exit_code == 1 and "no C compiler 'no-such-compiler-here'" in result.output
    result = cli("measure", "--smoke", "--out", str(tmp_path / "no" / "such" / "x.json"))
    assert result.exit_code == 2 and "is not a directory" in result.output
    assert not (tmp_path / "no").exists()


def test_a_measurement_against_itself_reproduces_its_labels_and_its_cross_validation(smoke_dataset):
    dataset = str(default_dataset())
    result = cli("evaluate", dataset, "--against", dataset, "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert set(report["against"]) == set(report["placements"]) and report["against_host"] == report["host"]
    for placement, again in report["against"].items():
        assert again["labels"]["accuracy"] == 1.0 and again["ev_correlation"] == pytest.approx(1.0)
        # the same folds over the same labels: the model scores what cross-validation scored
        assert again["model"]["accuracy"] == pytest.approx(report["accuracy"][placement])
        assert again["pooled"]["repeats"] == 2 * report["repeats"][placement]
    text = cli("evaluate", dataset, "--against", dataset).output
    assert text.count(f"against {dataset}") == len(report["placements"]) and "measured on: " in text
    other = cli("evaluate", dataset, "--against", str(smoke_dataset))
    assert other.exit_code == 1 and "--against: " in other.output and "measure different suites" in other.output


def test_the_committed_measurements_of_two_node_types_compare():
    from condor_sched.interference.compare_report import MEASUREMENTS, dataset_path

    xeon, epyc = dataset_path("Xeon"), dataset_path("EPYC")
    assert {"EPYC", "Xeon"} <= set(MEASUREMENTS)
    report = json.loads(cli("evaluate", str(epyc), "--against", str(xeon), "--json").output)
    assert "Xeon" in report["against_host"]["cpu_model"] and "EPYC" in report["host"]["cpu_model"]
    for placement in report["placements"]:
        assert report["against"][placement]["records"] == 2 * report["pairs"][placement] - len(
            load_dataset(epyc).programs)   # every directed record, a program beside itself once


def test_simulate_overcommit_004_prints_the_issue_keys_and_refuses_what_it_does_not_take():
    run = CliRunner().invoke(main, ["simulate", "--workload", "overcommit-004", "--nodes", "2", "--policy", "naive",
                                    "--seed", "1", "--json"], catch_exceptions=False)
    assert run.exit_code == 0, run.output
    report = json.loads(run.output)
    assert report["makespan_s"] > 0 and 0 <= report["ill_matched_pair_share"] <= 1
    for args, words in ((["--policy", "greedy"], "takes --policy exclusive|naive|overcommit|overcommit-measured"),
                        (["--jobs", "5"], "--jobs: not for --workload overcommit-004"),
                        (["--nodes", "65"], "at most 64 nodes")):
        bad = CliRunner().invoke(main, ["simulate", "--workload", "overcommit-004", *args])
        assert bad.exit_code == 2 and words in bad.output, bad.output


def test_simulate_interference_guard_reports_both_runs_and_refuses_what_it_cannot_run():
    run = CliRunner().invoke(main, ["simulate", "--workload", "phi-table1", "--jobs", "40", "--nodes", "2",
                                    "--interference-guard", "--json"])
    assert run.exit_code == 0, run.output
    report = json.loads(run.output)
    assert report["policy"] == "lp-pack" and report["cycle_s"] == 5.0 and len(report["seeds"]) == 1
    assert report["makespan_loss"] == pytest.approx(report["makespan_on_s"] / report["makespan_off_s"] - 1, abs=1e-5)
    assert 0.0 <= report["ill_matched_share_on"] <= 1.0 and "measured_makespan_loss" in report
    text = CliRunner().invoke(main, ["simulate", "--workload", "sns-random", "--jobs", "6", "--interference-guard"])
    assert text.exit_code == 0, text.output
    assert "policy sns" in text.output and "makespan_loss" in text.output and "measured_makespan" not in text.output
    for args, words in ((["--workload", "sns-random", "--policy", "lp-pack"], "takes a spread policy"),
                        (["--workload", "x.swf"], "built-in device and sns workloads"),
                        (["--workload", "phi-table1", "--footprint-against", "exclusive"], "--footprint-against")):
        bad = CliRunner().invoke(main, ["simulate", *args, "--interference-guard"])
        assert bad.exit_code == 2 and words in bad.output, bad.output
