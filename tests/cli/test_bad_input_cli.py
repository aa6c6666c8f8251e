"""``condor-sched plan`` on hostile snapshot files: a non-zero exit and one line naming the
file and the place, never a traceback."""
import json
import re
import subprocess
import sys

import pytest
from click.testing import CliRunner

from condor_sched.cli import DEFAULT_SNAPSHOT, main

MACHINES = str(DEFAULT_SNAPSHOT / "machines.json")
GOOD_JOB = json.loads((DEFAULT_SNAPSHOT / "queue.json").read_text())[0]


def json_text(ads) -> str:
    return json.dumps(ads)


BAD_QUEUES = {
    "deep.json": ('[{"A": ' + "[" * 50_000 + "]" * 50_000 + "}]", r"nested deeper than"),
    "deep-value.json": (json_text([{"A": [[[[[[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]]]]]}]), r"item 0, attribute A: nested"),
    "huge-int.json": ('[{"ClusterId": 1' + "0" * 5000 + "}]", None),
    "long-expr.json": (json_text([{**GOOD_JOB, "RequestMemory": "/Expr(" + "+".join(["1"] * 300_000) + ")/"}]),
                       r"attribute RequestMemory: expression longer than"),
    "bad-expr.json": (json_text([{**GOOD_JOB, "Requirements": "/Expr(((()/"}]), r"expression does not parse"),
    "not-an-ad.json": ("[1, 2]", r"item 0 is not a JSON object"),
    # classad2 25.14 kills the process on a string holding half a UTF-16 pair
    "surrogate.json": ('[{"ClusterId": 1, "ProcId": 0, "Owner": "\\ud800"}]', r"item 0, attribute Owner: not Unicode"),
    "surrogate-name.json": ('[{"ClusterId": 1, "O\\udfffwner": 1}]', r"item 0, attribute O\\udfffwner: not Unicode"),
    "garbage.long": ("ClusterId = 1\nProcId = 0\nthis is garbage\n", r"line 3 is not 'Attr = value'"),
    "latin1.long": (b'ClusterId = 1\nOwner = "j\xfcrgen"\n', r"not UTF-8 text \(line 2"),
    "long-line.long": ("ClusterId = 1\nRequestMemory = " + "+".join(["1"] * 300_000) + "\n", r"line 2: RequestMemory"),
}


@pytest.mark.parametrize("name", sorted(BAD_QUEUES))
def test_plan_on_a_hostile_queue_exits_2_with_one_line_naming_the_file(tmp_path, name):
    text, place = BAD_QUEUES[name]
    queue = tmp_path / name
    if isinstance(text, bytes):
        queue.write_bytes(text)
    else:
        queue.write_text(text)
    result = CliRunner().invoke(main, ["plan", "--queue", str(queue), "--machines", MACHINES])
    if name == "huge-int.json":  # read as a real out of range: the job is skipped with the attribute
        assert result.exit_code == 0 and "ClusterId" in result.output, result.output
        return
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output and isinstance(result.exception, SystemExit)
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and str(queue) in lines[0], result.output
    assert re.search(place, lines[0]), lines[0]


def test_plan_on_a_snapshot_with_duplicates_reports_each_copy(tmp_path):
    jobs = json.loads((DEFAULT_SNAPSHOT / "queue.json").read_text())
    slots = json.loads((DEFAULT_SNAPSHOT / "machines.json").read_text())
    queue, machines = tmp_path / "q.json", tmp_path / "m.json"
    queue.write_text(json.dumps(jobs + jobs[:3]))
    machines.write_text(json.dumps(slots + slots[:2]))
    result = CliRunner().invoke(main, ["plan", "--json", "--queue", str(queue), "--machines", str(machines)])
    assert result.exit_code == 0, result.output
    out = json.loads(result.output)
    reasons = [s["reason"] for s in out["skipped"]]
    assert sum("duplicate job id" in r for r in reasons) == 3
    assert sum("duplicate Name" in r for r in reasons) == 2
    planned = [a["job"] for a in out["assignments"]]
    assert len(planned) == len(set(planned))


def test_plan_in_a_fresh_process_matches_jobs_to_slots_whose_start_says_my():
    """The bundled snapshot's START refers to ``MY.Name``; a process that reads only JSON
    must still evaluate it (classad2 turns MY on when it first parses an ad)."""
    out = subprocess.run([sys.executable, "-m", "condor_sched", "plan"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "policy lp-pack: 16 placed, 24 unplaced" in out.stdout, out.stdout[:500]
