"""The sidecar as a daemon of the pool's condor_master (config.d/50-cosched-sidecar.conf), and
as it lives through daemons of the pool going away and coming back (issue 9, items 6, 7, 10)."""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable

import classad2
import htcondor2
import pytest

from condor_sched import localpool
from condor_sched.localpool import chroot
from condor_sched.model import partitionable_slot_of
from waiting import wait_until

pytestmark = pytest.mark.pool

DAEMON = "COSCHED_SIDECAR"
TEST_KNOBS = "60-cosched-test-sidecar.conf"


def sidecar_pids(pool) -> list[int]:
    """Processes in the pool root that are the master's sidecar (``condor-sched run``)."""
    def cmdline(pid: int) -> bytes:
        try:
            return Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            return b""

    return [p for p in chroot.processes_in(pool.info.root)
            if b"condor-sched\0run" in cmdline(p) and b"python" in cmdline(p)]


def sidecar_ads() -> list[dict[str, Any]]:
    return [dict(ad) for ad in htcondor2.Collector().query(htcondor2.AdType.Any, 'MyType == "CoSchedSidecar"')]


def live_ad(pool, min_cycles: int = 1, **expected: Any) -> dict[str, Any] | None:
    """The ad of the running sidecar process once it has advertised ``min_cycles`` cycles."""
    pids = sidecar_pids(pool)
    for ad in sidecar_ads():
        if (ad.get("CoSchedPid") in pids and ad.get("CoSchedCyclesRun", 0) >= min_cycles
                and all(ad.get(k) == v for k, v in expected.items())):
            return ad
    return None


def condor(pool, *command: str) -> None:
    chroot.in_chroot(pool.info.root, list(command), timeout_s=30)


def sidecar_log(pool) -> str:
    return (pool.info.root / "var/log/condor/CoSchedLog").read_text()


@pytest.fixture
def master_sidecar(pool):
    """The pool's master runs the sidecar for this test; afterwards it is off again."""
    test_knobs = pool.info.root / "etc/condor/config.d" / TEST_KNOBS
    localpool.set_sidecar(True, pool.settings)
    try:
        yield test_knobs
    finally:
        test_knobs.unlink(missing_ok=True)
        localpool.set_sidecar(False, pool.settings)
        wait_until(lambda: not sidecar_pids(pool), "the sidecar stops once out of DAEMON_LIST", timeout_s=30)


def test_master_runs_the_sidecar_which_pins_advertises_and_obeys_condor_off_on_and_reconfig(pool, master_sidecar):
    started = time.monotonic()
    ad = wait_until(lambda: live_ad(pool), "the master's sidecar advertises a cycle")
    print(f"sidecar advertised after {time.monotonic() - started:.1f} s")
    for attr in ("Name", "DaemonStartTime", "CoSchedCycle", "CoSchedIdleJobs", "CoSchedPinned", "CoSchedUnplaced",
                 "CoSchedCycleSeconds", "CoSchedLastCycleTime"):
        assert attr in ad, attr
    assert ad["CoSchedLastError"] == "" and ad["CoSchedConfigError"] == "" and ad["CoSchedPolicy"] == "lp-pack"
    first_pid = ad["CoSchedPid"]
    condor_uid = int(chroot.in_chroot(pool.info.root, ["id", "-u", "condor"]).stdout)
    uids = re.search(r"^Uid:\s+(\d+)", Path(f"/proc/{first_pid}/status").read_text(), re.M).group(1)
    assert int(uids) == condor_uid  # COSCHED_SIDECAR_USERID: the queue super user, not root

    # Its cycles pin device jobs that alice submits, which then run on their pinned devices.
    d = pool.job_dir()
    cluster = pool.schedd().submit(htcondor2.Submit({
        "executable": "/bin/sleep", "arguments": "2", "initialdir": str(d), "should_transfer_files": "YES",
        "log": "log", "request_PhiMemory": "1250", "request_PhiThreads": "60"}), count=4).cluster()
    history = wait_until(lambda: [dict(a) for a in pool.schedd().history(
        f"ClusterId == {cluster}", projection=["ProcId", "JobStatus", "ExitCode", "LastRemoteHost", "CoSchedPinSlot"])]
        if not pool.schedd().query(f"ClusterId == {cluster}", projection=["ProcId"]) else None,
        "the device jobs run and leave the queue", timeout_s=120)
    assert len(history) == 4 and all(a["JobStatus"] == 4 and a["ExitCode"] == 0 for a in history), history
    for a in history:
        assert partitionable_slot_of(a["LastRemoteHost"]) == a["CoSchedPinSlot"], a
        assert re.search(rf"pinned \S+#{cluster}\.{a['ProcId']} to {re.escape(a['CoSchedPinSlot'])}", sidecar_log(pool))

    # condor_off: SIGTERM, the process exits and its ad is invalidated.
    logged_before = len(sidecar_log(pool))
    off_at = time.monotonic()
    condor(pool, "condor_off", "-daemon", DAEMON)
    wait_until(lambda: not sidecar_pids(pool), "condor_off stops the sidecar", timeout_s=30)
    print(f"condor_off -daemon {DAEMON}: the sidecar exited {time.monotonic() - off_at:.2f} s after the command")
    wait_until(lambda: not sidecar_ads(), "the stopped sidecar's ad leaves the collector", timeout_s=30)
    last_words = sidecar_log(pool)[logged_before:].splitlines()[-1]
    assert re.search(r"stopping after \d+ cycles$", last_words), last_words

    # condor_on: a new process, new cycles, a new ad.
    condor(pool, "condor_on", "-daemon", DAEMON)
    ad = wait_until(lambda: live_ad(pool, min_cycles=2), "condor_on restarts the sidecar, which cycles again")
    assert ad["CoSchedPid"] != first_pid

    # condor_reconfig: the same process re-reads its knobs (SIGHUP).
    master_sidecar.write_text("COSCHED_POLICY = exclusive\n")
    condor(pool, "condor_reconfig")
    reconfigured = wait_until(lambda: live_ad(pool, CoSchedPolicy="exclusive"), "condor_reconfig changes the policy")
    assert reconfigured["CoSchedPid"] == ad["CoSchedPid"] and reconfigured["CoSchedConfigError"] == ""


# --- a sidecar of this test, on the host -----------------------------------------------

class HostSidecar:
    """``condor-sched run`` started by this test (as the queue super user, on the host), its
    log lines collected as they come."""

    def __init__(self, pool, *args: str, **knobs: str) -> None:
        env = {**os.environ, **pool.env(pool.info.admin_user), "_CONDOR_COSCHED_INTERVAL": "5",
               **{f"_CONDOR_{k}": v for k, v in knobs.items()}}
        self.proc = subprocess.Popen([sys.executable, "-m", "condor_sched", "run", *args], env=env,
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))

    @property
    def pid(self) -> int:
        return self.proc.pid

    def wait_for(self, pattern: str, timeout_s: float = 60, after: int = 0) -> int:
        """The index of the first line from ``after`` on that matches ``pattern``."""
        regex = re.compile(pattern)

        def found() -> tuple[int] | None:
            return next(((i,) for i in range(after, len(self.lines)) if regex.search(self.lines[i])), None)

        try:
            (index,) = wait_until(found, f"sidecar logs /{pattern}/", timeout_s)
        except AssertionError as e:
            raise AssertionError(f"{e}; its last lines:\n{self.tail()}") from None
        return index

    def count(self, pattern: str) -> int:
        regex = re.compile(pattern)
        return sum(1 for line in self.lines if regex.search(line))

    def tail(self, n: int = 15) -> str:
        return "\n".join(self.lines[-n:])

    def stop(self, sig: int = signal.SIGTERM) -> float:
        """Signal it and wait for its exit; the seconds it took (kills it after 20 s)."""
        if self.proc.poll() is not None:
            return 0.0
        started = time.monotonic()
        self.proc.send_signal(sig)
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        took = time.monotonic() - started
        self._reader.join(timeout=5)
        return took


def schedd_names() -> list[str]:
    return sorted(a.get("Name") for a in htcondor2.Collector().query(htcondor2.AdType.Schedd, projection=["Name"]))


def schedds_when(count: int) -> list[str] | None:
    """The schedds' Names once the collector lists ``count`` of them."""
    names = schedd_names()
    return names if len(names) == count else None


def schedd_named(name: str) -> htcondor2.Schedd:
    return htcondor2.Schedd(next(a for a in htcondor2.Collector().locateAll(htcondor2.DaemonType.Schedd)
                                 if a.get("Name") == name))


def submit_device_jobs(pool, schedd: htcondor2.Schedd, count: int, memory_mb: int = 1250) -> int:
    return schedd.submit(htcondor2.Submit({
        "executable": "/bin/sleep", "arguments": "2", "initialdir": str(pool.job_dir()),
        "should_transfer_files": "YES", "request_PhiMemory": str(memory_mb), "request_PhiThreads": "60"}),
        count=count).cluster()


def wait_ran_on_their_pins(schedd: htcondor2.Schedd, cluster: int, count: int, timeout_s: float = 90) -> None:
    def finished():
        if schedd.query(f"ClusterId == {cluster}", projection=["ProcId"]):
            return None
        done = [dict(a) for a in schedd.history(f"ClusterId == {cluster}", projection=[
            "ProcId", "JobStatus", "LastRemoteHost", "CoSchedPinSlot"])]
        return done if len(done) == count and all(a.get("LastRemoteHost") for a in done) else None

    for ad in wait_until(finished, f"cluster {cluster} runs and leaves the queue", timeout_s):
        assert ad["JobStatus"] == 4 and partitionable_slot_of(ad["LastRemoteHost"]) == ad["CoSchedPinSlot"], ad


def safely(probe: Callable[[], Any]) -> Callable[[], Any]:
    """``probe`` returning None instead of raising (a daemon of the pool may be down)."""
    def guarded():
        try:
            return probe()
        except Exception:
            return None
    return guarded


def own_ad(sidecar: HostSidecar, **expected: Any) -> dict[str, Any] | None:
    return next((ad for ad in sidecar_ads() if ad.get("CoSchedPid") == sidecar.pid
                 and all(ad.get(k) == v for k, v in expected.items())), None)


# --- schedds that go away -------------------------------------------------------------

def no_running_jobs(pool) -> None:
    """Wait until the schedd runs no job: a graceful condor_off of the schedd waits for them."""
    wait_until(lambda: not pool.schedd().query("JobStatus == 2", projection=["ClusterId"]),
               "earlier tests' jobs finish", timeout_s=120)


def test_a_stopped_schedd_is_warned_once_and_pinning_resumes_when_it_is_back(pool):
    (name,) = schedd_names()
    no_running_jobs(pool)
    sidecar = HostSidecar(pool)
    cluster = None
    try:
        sidecar.wait_for(r"cycle \d+: ")
        condor(pool, "condor_off", "-daemon", "SCHEDD")
        try:
            # Shutting down it may stop answering before its ad leaves: one warning either way.
            gone = sidecar.wait_for(rf"schedd {re.escape(name)} is (gone|unreachable) ")
            seen = gone
            for _ in range(3):  # cycles go on without it, each naming it, none warning again
                seen = sidecar.wait_for(rf"cycle \d+: .*; schedds not read: {re.escape(name)}$", after=seen + 1)
            wait_until(safely(lambda: own_ad(sidecar, CoSchedUnreachableSchedds=name)),
                       "the sidecar's ad names the schedd it cannot read")
        finally:
            condor(pool, "condor_on", "-daemon", "SCHEDD")
        sidecar.wait_for(rf"schedd {re.escape(name)} is back")
        assert sidecar.count(r"is gone|is unreachable") == 1, sidecar.tail(40)
        cluster = wait_until(safely(lambda: submit_device_jobs(pool, pool.schedd(), 2)), "the schedd takes jobs again")
        wait_ran_on_their_pins(pool.schedd(), cluster, 2)
        assert own_ad(sidecar)["CoSchedUnreachableSchedds"] == ""
    finally:
        took = sidecar.stop()
        if cluster is not None:
            pool.schedd().act(htcondor2.JobAction.Remove, f"ClusterId == {cluster}")
    assert sidecar.proc.returncode == 0 and took < 2, (took, sidecar.tail())


def test_with_two_schedds_a_stopped_one_leaves_the_other_pinned(pool):
    localpool.set_second_schedd(True, pool.settings)
    sidecar = None
    first_cluster = None
    try:
        names = wait_until(lambda: schedds_when(2), "the second schedd advertises")
        second = next(n for n in names if n.startswith("schedd2@"))
        first = next(n for n in names if n != second)
        # A job on the second schedd that no device can take: idle, co-scheduled, never pinned.
        too_big = submit_device_jobs(pool, schedd_named(second), 1, memory_mb=100_000)
        sidecar = HostSidecar(pool)
        sidecar.wait_for(r"cycle \d+: ")  # it has read both schedds
        condor(pool, "condor_off", "-daemon", "SCHEDD2")
        try:
            sidecar.wait_for(rf"schedd {re.escape(second)} is (gone|unreachable) \(.*\): its 1 idle co-scheduled "
                             "job is not planned until it (is back|answers); the other schedds go on")
            # The first schedd goes on: its jobs are pinned and run while the second is down.
            first_cluster = submit_device_jobs(pool, schedd_named(first), 2)
            wait_ran_on_their_pins(schedd_named(first), first_cluster, 2)
            assert sidecar.count(rf"pinned {re.escape(first)}#{first_cluster}\.\d to slot") == 2, sidecar.tail(40)
            assert sidecar.count(rf"schedds not read: {re.escape(second)}$") >= 2
        finally:
            condor(pool, "condor_on", "-daemon", "SCHEDD2")
        back = sidecar.wait_for(rf"schedd {re.escape(second)} is back: its 1 idle co-scheduled job is planned again")
        cycle = sidecar.wait_for(r"cycle \d+: ", after=back)
        assert "schedds not read" not in sidecar.lines[cycle]
        assert sidecar.count(r"is gone|is unreachable") == 1, sidecar.tail(40)
        wait_until(safely(lambda: schedd_named(second).act(htcondor2.JobAction.Remove, f"ClusterId == {too_big}")),
                   "the second schedd removes its job")
    finally:
        if sidecar is not None:
            sidecar.stop()
        localpool.set_second_schedd(False, pool.settings)
        wait_until(lambda: len(schedd_names()) == 1, "the second schedd's ad leaves", timeout_s=30)


def test_a_schedd_that_does_not_answer_is_warned_once_and_the_others_go_on(pool):
    # A schedd the collector lists but nobody answers for (its address is a closed port).
    ghost = classad2.ClassAd({"MyType": "Scheduler", "Name": "ghost@nowhere.cosched.test",
                              "Machine": "nowhere.cosched.test", "MyAddress": "<127.0.0.1:9>",
                              "ClassAdLifetime": 300})
    htcondor2.Collector().advertise([ghost], "UPDATE_SCHEDD_AD")
    sidecar = None
    cluster = None
    try:
        listed = wait_until(lambda: schedds_when(2), "the collector lists the ghost")
        (name,) = [n for n in listed if not n.startswith("ghost@")]
        sidecar = HostSidecar(pool)
        seen = sidecar.wait_for(r"schedd ghost@nowhere.cosched.test is unreachable \(.+\): its idle co-scheduled "
                                r"jobs \(none seen yet\) are not planned until it answers")
        cluster = submit_device_jobs(pool, schedd_named(name), 2)
        wait_ran_on_their_pins(schedd_named(name), cluster, 2)
        for _ in range(2):
            seen = sidecar.wait_for(r"cycle \d+: .*; schedds not read: ghost@nowhere.cosched.test$", after=seen + 1)
        assert sidecar.count("is unreachable") == 1, sidecar.tail(40)
        assert own_ad(sidecar)["CoSchedUnreachableSchedds"] == "ghost@nowhere.cosched.test"
    finally:
        if sidecar is not None:
            sidecar.stop()
        invalidate = classad2.ClassAd({"MyType": "Query", "TargetType": "Scheduler", "Name": ghost["Name"]})
        invalidate["Requirements"] = classad2.ExprTree(f"Name == {classad2.quote(ghost['Name'])}")
        htcondor2.Collector().advertise([invalidate], "INVALIDATE_SCHEDD_ADS")
        if cluster is not None:
            schedd_named(name).act(htcondor2.JobAction.Remove, f"ClusterId == {cluster}")
    wait_until(lambda: len(schedd_names()) == 1, "the ghost leaves the collector", timeout_s=30)


# --- the collector and the negotiator -------------------------------------------------

def test_a_stopped_collector_is_warned_once_and_the_sidecar_resumes_when_it_is_back(pool):
    sidecar = HostSidecar(pool)
    cluster = None
    try:
        sidecar.wait_for(r"cycle \d+: ")
        condor(pool, "condor_off", "-daemon", "COLLECTOR")
        try:
            down = sidecar.wait_for(r"the collector does not answer")
            time.sleep(6)  # a dozen polls of the negotiator ad, a cycle or two
        finally:
            condor(pool, "condor_on", "-daemon", "COLLECTOR")
        sidecar.wait_for(r"the collector answers again", after=down)
        assert sidecar.count(r"the collector does not answer|cannot") == 1, sidecar.tail(40)
        wait_until(safely(lambda: own_ad(sidecar)), "the sidecar advertises to the new collector")
        cluster = wait_until(safely(lambda: submit_device_jobs(pool, pool.schedd(), 2)), "the schedd is listed again")
        wait_ran_on_their_pins(pool.schedd(), cluster, 2)
    finally:
        sidecar.stop()
        if cluster is not None:
            pool.schedd().act(htcondor2.JobAction.Remove, f"ClusterId == {cluster}")


def test_with_the_negotiator_off_the_sidecar_warns_once_and_follows_cycles_again_when_it_is_back(pool):
    sidecar = HostSidecar(pool, COSCHED_INTERVAL="2")
    try:
        sidecar.wait_for(r"cycle \d+: ")
        condor(pool, "condor_off", "-daemon", "NEGOTIATOR")
        try:
            quiet = sidecar.wait_for(r"no new negotiation cycle for \d+ s \((the collector has no negotiator ad|"
                                     r"LastNegotiationCycleEnd0 stays [^)]*)\): cycles fall back to every 2 s "
                                     r"\(COSCHED_INTERVAL\)", timeout_s=30)
            seen = quiet
            for _ in range(3):  # it goes on cycling, every interval
                seen = sidecar.wait_for(r"cycle \d+: ", after=seen + 1, timeout_s=10)
        finally:
            condor(pool, "condor_on", "-daemon", "NEGOTIATOR")
        sidecar.wait_for(r"negotiation cycles are followed again", after=quiet, timeout_s=60)
        assert sidecar.count(r"no new negotiation cycle") == 1, sidecar.tail(40)
    finally:
        sidecar.stop()


# --- SIGTERM --------------------------------------------------------------------------

def test_sigterm_stops_the_sidecar_within_2_s_even_while_it_waits_for_a_negotiation_cycle(pool):
    condor(pool, "condor_off", "-daemon", "NEGOTIATOR")  # no cycle ends: the wait lasts COSCHED_INTERVAL
    try:
        waiting = HostSidecar(pool, COSCHED_INTERVAL="60")
        waiting.wait_for(r"cycle \d+: ")
        time.sleep(1.5)
        took_waiting = waiting.stop()
    finally:
        condor(pool, "condor_on", "-daemon", "NEGOTIATOR")
    cycling = HostSidecar(pool, COSCHED_INTERVAL="60")
    first_cycle = cycling.wait_for(r"cycle \d+: ")
    cycling.wait_for(r"cycle \d+: ", after=first_cycle + 1)  # negotiation cycles every 2 s: it cycles, polls, waits
    took_cycling = cycling.stop(signal.SIGQUIT)
    print(f"SIGTERM while waiting for a negotiation cycle: stopped in {took_waiting:.3f} s; "
          f"SIGQUIT while following cycles: {took_cycling:.3f} s")
    for sidecar, took in ((waiting, took_waiting), (cycling, took_cycling)):
        assert sidecar.proc.returncode == 0 and took < 2, (took, sidecar.tail())
        assert re.search(r"stopping after \d+ cycles$", sidecar.lines[-1]), sidecar.tail()
    wait_until(lambda: not [ad for ad in sidecar_ads() if ad.get("CoSchedPid") in (waiting.pid, cycling.pid)],
               "both withdrew their ads", timeout_s=10)


# --- one sidecar at a time ------------------------------------------------------------

def run_sidecar(pool, *args: str, timeout_s: float = 30, **knobs: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, **pool.env(pool.info.admin_user), **{f"_CONDOR_{k}": v for k, v in knobs.items()}}
    return subprocess.run([sys.executable, "-m", "condor_sched", "run", *args], env=env, capture_output=True,
                          text=True, timeout=timeout_s)


def test_a_second_sidecar_refuses_to_run_while_the_first_runs(pool):
    first = HostSidecar(pool)
    others: list[HostSidecar] = []
    try:
        first.wait_for(r"holds the pool's sidecar lease")
        ad = wait_until(lambda: own_ad(first), "the first sidecar advertises")
        for args in ((), ("--once",)):
            refused = run_sidecar(pool, *args)
            assert refused.returncode == 3, (args, refused.stderr[-2000:])
            for part in (f"{ad['Name']} on {ad['Machine']}", f"pid {first.pid}", "running for"):
                assert part in refused.stderr, (part, refused.stderr[-2000:])
        # A dry run edits nothing: it runs beside the sidecar, under its own ad name.
        dry = HostSidecar(pool, "--dry-run")
        others.append(dry)
        dry.wait_for(r"cycle \d+: ", after=dry.wait_for(r"cycle \d+: ") + 1)  # two cycles
        assert dry.proc.poll() is None and own_ad(dry)["Name"] == f"dry-run-{ad['Name']}"
        assert dry.stop() < 2 and own_ad(first) is not None
        # A sidecar that died without withdrawing its ad (killed) does not block the next one.
        first.stop(signal.SIGKILL)
        assert own_ad(first) is not None  # its ad outlives it
        successor = HostSidecar(pool)
        others.append(successor)
        successor.wait_for(r"holds the pool's sidecar lease", timeout_s=30)
        successor.wait_for(r"cycle \d+: ")
        assert own_ad(successor)["Name"] == ad["Name"]  # it took over the name, and the ad with it
    finally:
        for sidecar in (first, *others):
            sidecar.stop()


def test_of_two_sidecars_started_at_once_one_runs_and_the_other_exits_3(pool):
    pair = [HostSidecar(pool, COSCHED_NAME=name) for name in ("cosched-a@test", "cosched-b@test")]
    try:
        exited = wait_until(lambda: [s for s in pair if s.proc.poll() is not None] or None,
                            "one of the two gives way", timeout_s=30)
        (loser,) = exited
        (winner,) = [s for s in pair if s is not loser]
        assert loser.proc.wait() == 3
        loser._reader.join(timeout=5)
        assert loser.count(r"refusing to run: another sidecar runs on this pool") == 1, loser.tail()
        winner.wait_for(r"cycle \d+: ", after=winner.wait_for(r"cycle \d+: ") + 1)
        assert winner.proc.poll() is None
    finally:
        for sidecar in pair:
            sidecar.stop()
