"""COSCHED_INTERFERENCE and the overcommit mode on the real pool (paper 004, issue 30): the node
agents read what each running job runs and record a profile from a run alone; jobs opted in with
``+CoSchedOvercommit`` share node8's cores two at most; with the setting on, the sidecar keeps
two jobs whose programs the model judges ill-matched off one node (a device node, and the
overcommitting one), and the waiting one reads why in condor_q.

The two programs are copies of the pool's ``sleep`` told apart by their bytes (so the agents'
sha256 differ); their profiles are those of a measured pair the model judges ill-matched,
written where the agents write theirs (the agents' own recording is asserted on a third run)."""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from pathlib import Path

import htcondor2
import pytest
from test_device_cosched import start_sidecar, stop
from waiting import wait_until

from condor_sched.device_kinds import PHI
from condor_sched.interference.dataset import load_dataset, program_features
from condor_sched.interference.guard import InterferenceSetting
from condor_sched.interference.report import default_dataset

pytestmark = pytest.mark.pool

#: The default inventory's overcommitting node (``multiplicity = 2``).
OVERCOMMITTED = "node8"
ATTRS = ["ProcId", "JobStatus", "LastRemoteHost", "RemoteHost", "JobCurrentStartDate", "CompletionDate",
         "CoSchedPinReason", "CoSchedPinSlot"]


def program(pool, name: str, trailer: bytes) -> tuple[Path, str]:
    """A copy of the pool's sleep with ``trailer`` appended (an ELF runs with bytes after it)."""
    d = pool.job_dir()
    path = d / name
    path.write_bytes((pool.info.root / "bin/sleep").read_bytes() + trailer)
    os.chmod(path, 0o755)
    os.chown(path, pool.settings.uid, pool.settings.uid)
    return path, hashlib.sha256(path.read_bytes()).hexdigest()


def ill_matched_signals() -> tuple[dict, dict]:
    """The software signals of a measured pair the live model keeps apart (victim, opponent)."""
    model = InterferenceSetting.from_dataset(default_dataset()).model
    names = sorted(model.profiles)
    victim, opponent = next((a, b) for a in names for b in names if a < b and model.judge(a, b).ill_matched)
    signals = program_features(load_dataset(default_dataset()))
    return signals[victim], signals[opponent]


def write_profiles(runs_dir: Path, exe: str, signals: dict, copies: int = 7) -> None:
    """``copies`` records of ``signals`` (the median a program's profile is stays theirs when the
    agents add a few records of the sleeps' own); the program's earlier records removed."""
    directory = runs_dir / "interference" / "alice" / exe
    shutil.rmtree(directory, ignore_errors=True)
    directory.mkdir(parents=True, mode=0o755)
    for i in range(copies):
        job = f"99999999{i}.0"
        (directory / f"{job}.json").write_text(json.dumps(
            {"version": 1, "owner": "alice", "exe_sha256": exe, "job": job, "intervals": 10, "signals": signals}))


def ill_matched_programs(pool, runs_dir: Path) -> tuple[Path, str, Path, str]:
    """A bully and its victim (copies of sleep) with the profiles of a measured pair the live
    model keeps apart: (bully, its sha256, victim, its sha256)."""
    bully, bully_exe = program(pool, "bully", b"\0cosched-bully")
    victim, victim_exe = program(pool, "victim", b"\0cosched-victim")
    victim_signals, bully_signals = ill_matched_signals()
    for exe, signals in ((victim_exe, victim_signals), (bully_exe, bully_signals)):
        write_profiles(runs_dir, exe, signals)
    return bully, bully_exe, victim, victim_exe


def guarded_sidecar(pool, runs_dir: Path):
    """The sidecar with COSCHED_INTERFERENCE on, reading the agents' profiles in ``runs_dir``."""
    return start_sidecar(pool, "knapsack", **{"COSCHED_INTERFERENCE": "true",
                                              "COSCHED_PROFILE_RUNS_DIR": str(runs_dir)})


def submit(pool, exe: Path, seconds: int, node: str, device: bool = True) -> int:
    """A job of ``exe`` on ``node``: a device job (the device mode places it), or a plain one."""
    description = {"executable": str(exe), "arguments": str(seconds), "initialdir": str(exe.parent),
                   "should_transfer_files": "YES", "request_cpus": "1", "request_memory": "64",
                   "requirements": f'Machine == "{node}.{pool.domain}"'}
    if device:
        description.update({f"request_{PHI.memory_attr}": "1000", f"request_{PHI.compute_attr}": "60"})
    return pool.schedd().submit(htcondor2.Submit(description)).cluster()


def wait(pool, cluster: int, done, timeout_s: float = 240) -> dict:
    return pool.wait_for(cluster, done, ATTRS, timeout_s=timeout_s)


def submit_overcommitted(pool, exe: Path, seconds: int) -> int:
    """One job of ``exe`` opted in to overcommitting, its own cluster (the guard never judges a
    cluster's procs against each other). It asks for node8: an opted-in job may also run on an
    ordinary slot, one job per core, wherever HTCondor matches it first."""
    return pool.schedd().submit(htcondor2.Submit({
        "executable": str(exe), "arguments": str(seconds), "initialdir": str(exe.parent),
        "should_transfer_files": "YES", "request_cpus": "1", "request_memory": "64",
        "requirements": f'Machine == "{OVERCOMMITTED}.{pool.domain}"', "+CoSchedOvercommit": "true"})).cluster()


def most_at_once(runs: list[dict]) -> int:
    """The most of ``runs`` (JobCurrentStartDate, CompletionDate) running at one time."""
    events = sorted([(r["JobCurrentStartDate"], 1) for r in runs] + [(r["CompletionDate"], -1) for r in runs],
                    key=lambda e: (e[0], e[1]))
    now = best = 0
    for _, step in events:
        now += step
        best = max(best, now)
    return best


def ran_on(run: dict, node: str) -> bool:
    return str(run.get("LastRemoteHost") or "").split("@")[-1].startswith(node)


def advertises_running(pool, node: str, cluster: int) -> bool:
    """Whether ``node``'s startd ad says what job ``cluster`` runs (its agent's reading, published
    by the startd cron): the sidecar learns a Cmd's program from it."""
    ads = htcondor2.Collector().query(htcondor2.AdType.Startd, f'Machine == "{node}.{pool.domain}"')
    return any(f"CoSchedJobExe_{cluster}_0" in ad for ad in ads)


def sidecar_cycles() -> int:
    """The cycles the running sidecar has advertised (0 before its first)."""
    ads = htcondor2.Collector().query(htcondor2.AdType.Any, 'MyType == "CoSchedSidecar"', ["CoSchedCyclesRun"])
    return max([int(ad.get("CoSchedCyclesRun", 0)) for ad in ads], default=0)


def test_opted_in_jobs_share_node8s_cores_and_ill_matched_programs_never_share_a_node_saying_why(pool):
    """Paper 004's overcommit mode (Section 3.3) and the guard, on one sidecar: node8 of the
    default inventory is a socket node of the host's 2 cores whose startd counts each core twice
    (a slot of 4 CPUs); node1 holds two devices."""
    runs_dir = pool.info.root / "var/lib/condor_sched/profiles"
    bully, _, victim, victim_exe = ill_matched_programs(pool, runs_dir)
    calm, _ = program(pool, "calm", b"\0cosched-calm")     # no profile: allowed anywhere
    sidecar = guarded_sidecar(pool, runs_dir)
    try:
        # Six opted-in jobs of one CPU for a node of 2 cores counted twice, the bully and the
        # victim among them, and the bully as a device job on node1. The sidecar places them
        # before it knows their programs: it learns what each Cmd runs from the agents' reading
        # of a running job (advertised by the startd cron, every 30 s here).
        bullies = {"node1": submit(pool, bully, 50, "node1")}
        first = [submit_overcommitted(pool, bully, 50), submit_overcommitted(pool, victim, 50)]
        first += [submit_overcommitted(pool, calm, 25) for _ in range(4)]
        bullies[OVERCOMMITTED] = first[0]
        wait_until(lambda: all(advertises_running(pool, node, cluster) for node, cluster in bullies.items()),
                   "node1 and node8 advertise what the bully runs", timeout_s=120)
        learned = sidecar_cycles() + 2      # a whole cycle has read those ads
        wait_until(lambda: sidecar_cycles() >= learned, f"the sidecar's cycle {learned}")
        # The victim, ill-matched beside the bully, is now kept off each node while the bully
        # runs there, says why, and runs there once the bully has left.
        victims = {"node1": submit(pool, victim, 2, "node1"), OVERCOMMITTED: submit_overcommitted(pool, victim, 2)}
        for node, cluster in victims.items():
            told = wait(pool, cluster, lambda ad: f"interference model keeps it off {node}" in
                        str(ad.get("CoSchedPinReason") or ""), timeout_s=60)
            # The pair it names is the victim's with a program running there: the bully's, or a calm
            # job's once the agent has recorded it alone on the node (a timing the test does not fix).
            assert told["JobStatus"] == 1 and f"alice/{victim_exe[:12]}" in told["CoSchedPinReason"], told
        ran = {node: wait(pool, cluster, lambda ad: ad.get("JobStatus") == 4) for node, cluster in victims.items()}
        for node, run in ran.items():
            bully_run = wait(pool, bullies[node], lambda ad: ad.get("JobStatus") == 4)
            assert ran_on(run, node), run
            assert run["JobCurrentStartDate"] >= bully_run["CompletionDate"], (run, bully_run)
        # All opted-in jobs ran on node8, at most 4 at once and more than its 2 cores at some time.
        runs = [wait(pool, cluster, lambda ad: ad.get("JobStatus") == 4) for cluster in first] + [ran[OVERCOMMITTED]]
        assert all(ran_on(r, OVERCOMMITTED) for r in runs), runs
        assert all(str(r.get("CoSchedPinSlot") or "").endswith(f"@{OVERCOMMITTED}.{pool.domain}") for r in runs), runs
        assert 2 < most_at_once(runs) <= 4, runs
    finally:
        log = stop(sidecar)
    assert "interference profile left out" not in log, log[-2000:]


def test_a_job_alone_on_its_node_leaves_a_profile_keyed_by_its_owner_and_binary(pool):
    runs_dir = pool.info.root / "var/lib/condor_sched/profiles"
    alone, exe = program(pool, "alone", b"\0cosched-alone-%d" % time.time_ns())
    cluster = submit(pool, alone, 12, "node2", device=False)   # HTCondor places it: no sidecar needed
    wait(pool, cluster, lambda ad: ad.get("JobStatus") == 4, timeout_s=120)
    deadline = time.monotonic() + 30   # the agent writes the record within its interval (2 s) of the end
    records: list[Path] = []
    while time.monotonic() < deadline and not records:
        records = list((runs_dir / "interference" / "alice" / exe).glob(f"{cluster}.0.json"))
        time.sleep(1)
    assert records, f"no profile under {runs_dir / 'interference' / 'alice' / exe}"
    record = json.loads(records[0].read_text())
    assert record["owner"] == "alice" and record["exe_sha256"] == exe and record["intervals"] >= 3
    assert 0 <= record["signals"]["user_share"] < 0.5 and record["signals"]["log2_peak_rss_mib"] >= 0
