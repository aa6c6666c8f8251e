"""``condor-sched plan`` on a snapshot of a node-sharing pool decides what the sidecar would
(paper 001's live mapping): the guest, its mate's longer limit, and the reasons."""
import json
import sys
from pathlib import Path

from click.testing import CliRunner

from condor_sched.classads import ads_to_json
from condor_sched.cli import main

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "unit"))
from test_node_sharing import CORES, job_ad, node_slot_ads, running_mate  # noqa: E402


def test_plan_on_a_snapshot_names_the_guest_its_mate_and_the_mates_new_limit(tmp_path):
    queue, machines = tmp_path / "queue.json", tmp_path / "machines.json"
    queue.write_text(ads_to_json([running_mate(0, requested=3600), job_ad(1, requested=2000), job_ad(2, cpus=4)]))
    machines.write_text(ads_to_json(node_slot_ads("node1", busy_cpus=CORES)))
    out = CliRunner().invoke(main, ["plan", "--queue", str(queue), "--machines", str(machines), "--json"],
                             catch_exceptions=False)
    assert out.exit_code == 0, out.output
    decision = json.loads(out.output)
    (guest,) = decision["guests"]
    assert guest["job"] == "1.1" and guest["mate"] == "1.0" and guest["slot"] == "slot2@node1.test"
    (mate,) = decision["mates"]
    assert mate["job"] == "1.0" and mate["writes"]["AllowedExecuteDuration"] == str(3600 + guest["mate_increase_s"])
    reasons = {r["job"]: r["reason"] for r in decision["reasons"]}
    assert "whole-node jobs" in reasons["1.2"]

    none = CliRunner().invoke(main, ["plan", "--queue", str(queue), "--machines", str(machines), "--json",
                                     "--policy", "backfill"], catch_exceptions=False)
    assert json.loads(none.output)["guests"] == []  # the static baseline starts no guest


def test_plan_text_lists_the_guest(tmp_path):
    queue, machines = tmp_path / "queue.json", tmp_path / "machines.json"
    queue.write_text(ads_to_json([running_mate(0, requested=3600), job_ad(1, requested=2000)]))
    machines.write_text(ads_to_json(node_slot_ads("node1", busy_cpus=CORES)))
    out = CliRunner().invoke(main, ["plan", "--queue", str(queue), "--machines", str(machines)],
                             catch_exceptions=False)
    assert "guest on slot2@node1.test of mate 1.0 (its limit +2000 s)" in out.output, out.output
