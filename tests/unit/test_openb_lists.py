"""The GPU default on every published openb list (issue 31): paired differences with their
intervals, tuning lists kept apart from evaluation lists, the committed evaluation rendered,
and the script that runs it on a small trace of its own."""
from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from condor_sched.simulate.openb_lists import (
    TUNING_LISTS,
    list_name,
    load_evaluation,
    paired,
    section,
    summarise,
)

ROOT = Path(__file__).resolve().parents[2]


def runs(name: str, ours: list[float], fgd: list[float]) -> list[dict]:
    return ([{"list": name, "policy": "mine", "seed": s, "unallocated": v} for s, v in enumerate(ours)]
            + [{"list": name, "policy": "fgd", "seed": s, "unallocated": v} for s, v in enumerate(fgd)])


def test_a_paired_difference_has_the_t_interval_of_its_seeds():
    got = paired("x", [4.0, 5.0, 6.0], [5.0, 6.1, 6.9])    # differences -1, -1.1, -0.9
    assert got.mean_difference == pytest.approx(-1.0)
    # t(0.975, 2) = 4.303, standard error 0.1 / sqrt(3)
    assert got.high == pytest.approx(-1.0 + 4.3027 * 0.1 / math.sqrt(3), abs=1e-3)
    assert (got.wins, got.ties, got.losses, got.verdict) == (3, 0, 0, "better")
    assert paired("y", [5.0, 4.0], [4.0, 5.0]).verdict == "no difference"
    assert paired("z", [3.0], [4.0]).verdict == "no difference"   # one pair: no interval
    with pytest.raises(ValueError, match="2 runs of ours against 1"):
        paired("w", [1.0, 2.0], [1.0])


def test_lists_are_compared_on_the_seeds_both_ran_and_tuning_lists_stay_out_of_the_evaluation_pool():
    assert "default" in TUNING_LISTS and "gpushare20" not in TUNING_LISTS
    data = runs("default", [4.0, 4.1], [5.0, 5.0]) + runs("gpushare20", [6.0, 7.0, 9.9], [6.5, 6.5])
    rows = {r.name: r for r in summarise(data, "mine")}
    assert rows["gpushare20"].pairs == 2 and rows["gpushare20"].ours_median == 6.5   # seed 2 has no fgd run
    assert rows["evaluation lists pooled"].pairs == 2 and rows["every list pooled"].pairs == 4
    with pytest.raises(ValueError, match="list cpu0: no seed run under both mine and fgd"):
        summarise(runs("cpu0", [1.0], []), "mine")


def test_the_section_states_the_goal_from_the_numbers():
    data = {"ours": "mine", "against": "fgd", "batch": 1, "seeds": [0, 1, 2], "source": "the trace",
            "runs": runs("default", [4.0, 4.1, 4.2], [5.0, 5.0, 5.1]) + runs("cpu0", [6.0, 6.2, 6.1], [5.0, 5.1, 5.2])}
    text = "\n".join(section(data))
    assert "| default (tuning) | 5.00 | 4.10 |" in text and "| cpu0 (evaluation) | 5.10 | 6.10 |" in text
    assert "Median at or below FGD's on 1 of 2 lists (goal: every list): not met, above on cpu0 (+1.000)" in text
    assert "interval lies above zero on cpu0" in text and text.endswith("(goal: below zero): not met.")


def test_the_committed_evaluation_covers_every_published_list_and_both_policies():
    data = load_evaluation()
    names = {r["list"] for r in data["runs"]}
    assert TUNING_LISTS <= names and len(names) == 24
    assert {r["policy"] for r in data["runs"]} == {data["ours"], data["against"]}
    assert len(data["runs"]) == 2 * len(names) * len(data["seeds"])
    assert list_name("openb_pod_list_gpuspec33.csv") == "gpuspec33"


def test_the_script_runs_every_list_of_a_trace_directory_and_names_what_is_missing(tmp_path: Path):
    script = [sys.executable, str(ROOT / "scripts" / "openb_every_list")]
    nodes = "sn,cpu_milli,memory_mib,gpu,model\n" + "".join(f"n{i},32000,262144,2,T4\n" for i in range(3))
    tasks = "name,cpu_milli,memory_mib,num_gpu,gpu_milli\n" + "".join(
        f"p{i},2000,4096,1,{(300, 500, 1000)[i % 3]}\n" for i in range(12))
    (tmp_path / "openb_pod_list_tiny.csv").write_text(tasks)
    missing = subprocess.run(script + ["--traces", str(tmp_path)], capture_output=True, text=True)
    assert missing.returncode == 2 and "no openb_node_list_gpu_node.csv there" in missing.stderr
    (tmp_path / "openb_node_list_gpu_node.csv").write_text(nodes)
    unknown = subprocess.run(script + ["--traces", str(tmp_path), "--lists", "huge"], capture_output=True, text=True)
    assert unknown.returncode == 2 and "no openb_pod_list_huge.csv" in unknown.stderr
    out = tmp_path / "eval.json"
    done = subprocess.run(script + ["--traces", str(tmp_path), "--seeds", "0-1", "--jobs", "1", "--out", str(out)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    data = json.loads(out.read_text())
    assert {(r["list"], r["policy"], r["seed"]) for r in data["runs"]} == {
        ("tiny", p, s) for p in ("fgd", "fgd-mem-batch") for s in (0, 1)}
    assert "| tiny (evaluation) |" in done.stdout
