"""The condor-sched commands on the bundled snapshot (click's CliRunner, no pool)."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from condor_sched.cli import DEFAULT_SNAPSHOT, main


def run(*args):
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


def test_plan_json_is_one_object_with_assignments_on_device_slots():
    result = run("plan", "--json")
    assert result.exit_code == 0
    out = json.loads(result.output)
    assert out["policy"] == "lp-pack" and out["skipped"] == []      # the sidecar's default
    assert len(out["assignments"]) + len(out["unplaced"]) == 40
    assert all(a["schedd"] and a["job"].count(".") == 1 and a["slot"].startswith("slot") for a in out["assignments"])


def test_global_places_at_least_as_many_as_knapsack_on_the_snapshot():
    greedy = json.loads(run("plan", "--json", "--policy", "knapsack").output)
    best = json.loads(run("plan", "--json", "--policy", "global", "--time-limit", "1").output)
    assert len(best["assignments"]) >= len(greedy["assignments"])


def _planned_threads(out: dict) -> dict[str, int]:
    queue = json.loads((DEFAULT_SNAPSHOT / "queue.json").read_text())
    threads = {f"{ad['ClusterId']}.{ad['ProcId']}": ad["RequestPhiThreads"] for ad in queue}
    per_slot: dict[str, int] = {}
    for a in out["assignments"]:
        per_slot[a["slot"]] = per_slot.get(a["slot"], 0) + threads[a["job"]]
    return per_slot


def test_thread_overcommit_plans_beyond_the_hardware_threads_but_within_the_factor():
    hard = json.loads(run("plan", "--json").output)
    doubled = json.loads(run("plan", "--json", "--thread-overcommit", "2").output)
    assert max(_planned_threads(hard).values()) <= 240
    assert 240 < max(_planned_threads(doubled).values()) <= 480
    assert len(doubled["assignments"]) > len(hard["assignments"])
    assert run("plan", "--thread-overcommit", "0.5").exit_code == 2


def test_readable_plan_shows_per_device_use():
    result = run("plan", "--policy", "exclusive")
    assert result.exit_code == 0
    assert "policy exclusive: 6 placed" in result.output and "planned mem/threads" in result.output


def test_bad_snapshot_exits_2_naming_the_file(tmp_path):
    bad = tmp_path / "queue.json"
    bad.write_text("[{")
    result = CliRunner().invoke(main, ["plan", "--queue", str(bad), "--machines",
                                       str(DEFAULT_SNAPSHOT / "machines.json")])
    assert result.exit_code == 2 and "queue.json: bad JSON at line 1" in result.output
    assert "Traceback" not in result.output


def test_a_malformed_job_is_skipped_and_reported(tmp_path):
    jobs = json.loads((DEFAULT_SNAPSHOT / "queue.json").read_text())
    jobs[0]["RequestPhiThreads"] = "lots"
    queue = tmp_path / "queue.json"
    queue.write_text(json.dumps(jobs))
    out = json.loads(run("plan", "--json", "--queue", str(queue), "--machines",
                         str(DEFAULT_SNAPSHOT / "machines.json")).output)
    assert len(out["skipped"]) == 1 and "RequestPhiThreads" in out["skipped"][0]["reason"]
    assert len(out["assignments"]) + len(out["unplaced"]) == 39


def test_show_lists_idle_jobs_and_devices():
    out = json.loads(run("show", "--json").output)
    assert len(out["idle_jobs"]) == 40 and sum(s["kind"] == "device" for s in out["slots"]) == 6


def test_pool_up_refuses_without_root(monkeypatch):
    import os

    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    for action in ("up", "down", "status"):
        result = CliRunner().invoke(main, ["pool", action])
        assert result.exit_code == 1 and f"pool {action} needs root" in result.output
        assert "Traceback" not in result.output


def test_install_node_writes_every_hook_executable_and_is_idempotent(tmp_path):
    target = tmp_path / "hooks"
    first = run("install-node", str(target))
    assert first.exit_code == 0
    installed = sorted(str(p.relative_to(target)) for p in target.rglob("*.py"))
    assert "cosched_prepare_job.py" in installed and "cosched_node/agent.py" in installed
    assert "fake_nvidia_smi.py" not in installed      # a test double: never on a node
    assert all((target / name).stat().st_mode & 0o777 == 0o755 for name in installed)
    assert first.output.count("wrote") == len(installed)
    again = run("install-node", str(target))
    assert again.exit_code == 0 and again.output.count("unchanged") == len(installed)
    # The installed programs run from there with the system python3 and no other path.
    for program in ("cosched_prepare_job.py", "cosched_node_agent.py", "cosched_startd_cron.py",
                    "discover_devices.py", "cosched_describe_node.py"):
        out = subprocess.run(["/usr/bin/python3", "-Es", str(target / program), "--help"], capture_output=True,
                             text=True, timeout=60, cwd=tmp_path)
        assert "Traceback" not in out.stderr and "ModuleNotFoundError" not in out.stderr, (program, out.stderr)


def test_install_node_refuses_a_different_file_unless_forced(tmp_path):
    (tmp_path / "cosched_prepare_job.py").write_text("# the admin's own hook\n")
    refused = CliRunner().invoke(main, ["install-node", str(tmp_path)])
    assert refused.exit_code == 1 and "cosched_prepare_job.py" in refused.output and "--force" in refused.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cosched_prepare_job.py"]
    assert (tmp_path / "cosched_prepare_job.py").read_text() == "# the admin's own hook\n"
    forced = run("install-node", "--force", str(tmp_path))
    assert forced.exit_code == 0 and f"replaced  {tmp_path / 'cosched_prepare_job.py'}" in forced.output
    assert "the admin's own hook" not in (tmp_path / "cosched_prepare_job.py").read_text()


def test_config_writes_this_installs_paths_or_the_prefixs(tmp_path):
    """A snippet is copied as it is: its paths are the running install's, or --prefix's."""
    def knobs(text: str) -> dict[str, str]:
        return dict(line.split(" = ", 1) for line in text.splitlines() if line.startswith("COSCHED_") and " = " in line)

    mine = knobs(run("config").output)
    assert mine["COSCHED_SIDECAR"] == str(Path(sys.executable).parent / "condor-sched")
    assert mine["COSCHED_NODE_HOOKS"] == str(Path(sys.prefix) / "libexec" / "condor_sched")
    opt = knobs(run("config", "--prefix", "/opt/condor-sched").output)
    assert opt["COSCHED_SIDECAR"] == "/opt/condor-sched/bin/condor-sched"
    assert opt["COSCHED_NODE_HOOKS"] == "/opt/condor-sched/libexec/condor_sched"
    assert opt["COSCHED_HOOK_PREPARE_JOB"] == "$(COSCHED_NODE_HOOKS)/cosched_prepare_job.py"
    shared = knobs(run("config", "30-cosched-execute.conf", "--node-hooks", "/shared/cosched").output)
    assert shared["COSCHED_NODE_HOOKS"] == "/shared/cosched"
    relative = CliRunner().invoke(main, ["config", "--prefix", "opt"])
    assert relative.exit_code == 2 and "absolute" in relative.output


def test_config_lists_prints_one_or_all_snippets():
    names = run("config", "--list").output.split()
    assert names == ["10-cosched-schedd.conf", "20-cosched-startd.conf", "30-cosched-execute.conf",
                     "50-cosched-sidecar.conf"]
    sidecar = run("config", "50-cosched-sidecar.conf").output
    assert "COSCHED_POLICY" in sidecar and "=====" not in sidecar
    everything = run("config").output
    assert all(f"# ===== {name} =====" in everything for name in names) and sidecar in everything
    unknown = CliRunner().invoke(main, ["config", "99-nothing.conf"])
    assert unknown.exit_code == 2 and "50-cosched-sidecar.conf" in unknown.output


@pytest.mark.parametrize("knob, value", [("MAX_COSCHED_LOG", "lots"), ("COSCHED_POLICY", "fastest")])
def test_run_refuses_a_bad_knob_with_exit_2_naming_it(tmp_path, knob, value):
    env = {**os.environ, "CONDOR_CONFIG": str(tmp_path / "condor_config"), f"_CONDOR_{knob}": value}
    (tmp_path / "condor_config").write_text("")
    result = subprocess.run([sys.executable, "-m", "condor_sched", "run"], env=env, capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 2 and knob in result.stderr, result.stderr


def test_gpu_policy_option_plans_gpu_jobs_with_a_device_policy_and_policy_keeps_the_phi_one(tmp_path):
    machine = "gpu1.test"
    slot = {"Name": f"slot1@{machine}", "Machine": machine, "MyType": "Machine", "PartitionableSlot": True,
            "Arch": "X86_64", "TotalSlotCpus": 16, "Cpus": 16, "TotalSlotMemory": 65536, "Memory": 65536,
            "State": "Unclaimed", "CoSchedGPUNode": True, "CoSchedGPUCount": 1, "CoSchedGPU0Uuid": "GPU-gpu1-0",
            "CoSchedGPU0DeviceName": "Tesla T4", "CoSchedGPU0Capability": 7.5, "TotalSlotCoSchedGPU0Memory": 15360,
            "CoSchedGPU0Memory": 15360, "TotalSlotCoSchedGPU0Compute": 1000, "CoSchedGPU0Compute": 1000}
    jobs = [{"ClusterId": 1, "ProcId": p, "Owner": "alice", "JobStatus": 1, "QDate": 1000 + p, "MyType": "Job",
             "GlobalJobId": f"schedd.test#1.{p}#1", "Cmd": "/bin/train", "RequestCpus": 1, "RequestMemory": 1024,
             "RequestGPUCompute": compute, "RequestGPUMemory": 2000} for p, compute in enumerate((600, 500, 500))]
    (tmp_path / "q.json").write_text(json.dumps(jobs))
    (tmp_path / "m.json").write_text(json.dumps([slot]))
    files = ["--queue", str(tmp_path / "q.json"), "--machines", str(tmp_path / "m.json"), "--json"]
    knapsack = json.loads(run("plan", *files, "--gpu-policy", "knapsack").output)
    assert knapsack["gpu_policy"] == "knapsack"
    assert sorted(p["job"] for p in knapsack["gpu_pins"]) == ["1.1", "1.2"]  # the most jobs on the GPU
    fifo = json.loads(run("plan", *files, "--gpu-policy", "best-fit", "--policy", "knapsack").output)
    assert fifo["policy"] == "knapsack" and fifo["gpu_policy"] == "best-fit"
    assert sorted(p["job"] for p in fifo["gpu_pins"]) == ["1.0"]
