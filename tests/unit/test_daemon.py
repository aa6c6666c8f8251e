"""The sidecar daemon without a pool: its ad, its knobs, its log bound, its loop and signals."""
from __future__ import annotations

import logging
import os
import signal
import threading
import time
from dataclasses import replace
from pathlib import Path

import classad2
import htcondor2
import pytest

from condor_sched import daemon, lease
from condor_sched.daemon import DaemonCycle, DaemonKnobs, DaemonStatus, SidecarDaemon
from condor_sched.pool import CollectorUnreachable
from condor_sched.settings import SettingsError, settings_from_htcondor

KNOBS = DaemonKnobs(name="cosched@cm.example.org", machine="cm.example.org")


def test_ad_advertises_the_cycle_numbers_beside_the_daemons_identity():
    status = DaemonStatus(start_time=1000, pid=42, cycles_run=7, failed_cycles=1, cycle_s=0.0614,
                          last_cycle_time=1060, update_sequence=7)
    ad = daemon.sidecar_ad(KNOBS, status, {"Cycle": 12, "IdleJobs": 40, "Pinned": 9, "Unplaced": 28},
                           {"Policy": "knapsack", "DryRun": False}, lifetime_s=210)
    assert ad["MyType"] == "CoSchedSidecar" and ad["Name"] == "cosched@cm.example.org"
    assert (ad["CoSchedCycle"], ad["CoSchedIdleJobs"], ad["CoSchedPinned"], ad["CoSchedUnplaced"]) == (12, 40, 9, 28)
    assert ad["CoSchedCycleSeconds"] == pytest.approx(0.061)
    assert (ad["CoSchedPolicy"], ad["CoSchedDryRun"]) == ("knapsack", False)
    assert (ad["DaemonStartTime"], ad["CoSchedPid"], ad["CoSchedLastCycleTime"]) == (1000, 42, 1060)
    assert (ad["CoSchedCyclesRun"], ad["CoSchedFailedCycles"], ad["ClassAdLifetime"]) == (7, 1, 210)
    assert ad["CoSchedLastError"] == "" and ad["CoSchedConfigError"] == ""


def test_ad_before_any_cycle_reports_zeros_and_counts_its_own_cycles():
    ad = daemon.sidecar_ad(KNOBS, DaemonStatus(start_time=1, pid=2, cycles_run=3), {}, {}, lifetime_s=60)
    assert (ad["CoSchedCycle"], ad["CoSchedIdleJobs"], ad["CoSchedPinned"], ad["CoSchedUnplaced"]) == (3, 0, 0, 0)
    assert "CoSchedLastCycleTime" not in ad


def test_ad_refuses_a_number_that_is_no_attribute_name():
    with pytest.raises(ValueError, match="idle jobs"):
        daemon.sidecar_ad(KNOBS, DaemonStatus(start_time=1, pid=2), {"idle jobs": 3}, {}, lifetime_s=60)


def test_invalidation_removes_this_processs_ad_and_no_other_of_the_same_name():
    query = daemon.invalidation_ad('cosched@"odd"', "cm.example.org", 42)
    assert (query["MyType"], query["TargetType"]) == ("Query", "CoSchedSidecar")
    assert "Name" not in query  # with a Name the collector removes that Name's ad, whoever sent it
    requirements = query.lookup("Requirements")

    def removes(**attrs) -> bool:
        ad = classad2.ClassAd(attrs)
        ad["Requirements"] = requirements
        return ad.eval("Requirements") is True

    assert removes(Name='cosched@"odd"', Machine="cm.example.org", CoSchedPid=42)
    assert not removes(Name='cosched@"odd"', Machine="cm.example.org", CoSchedPid=43)
    assert not removes(Name='cosched@"odd"', Machine="other.example.org", CoSchedPid=42)


def test_ad_outlives_three_missed_cycles():
    assert daemon.ad_lifetime_s(60) == 210 and daemon.ad_lifetime_s(0.2) == 33


def test_knobs_default_to_the_host_name_and_htcondors_log_bound():
    knobs = DaemonKnobs.from_param({"FULL_HOSTNAME": "cm.example.org", "COSCHED_LOG": "/var/log/condor/CoSchedLog"})
    assert knobs == DaemonKnobs("cosched@cm.example.org", "cm.example.org", "/var/log/condor/CoSchedLog",
                                10 * 1024 * 1024)
    named = DaemonKnobs.from_param({"FULL_HOSTNAME": "h", "COSCHED_NAME": "east", "MAX_COSCHED_LOG": "0"})
    assert (named.name, named.log_path, named.max_log_bytes) == ("east", "", 0)


@pytest.mark.parametrize("value", ["10 MB", "-1"])
def test_a_bad_log_bound_names_the_knob(value):
    with pytest.raises(SettingsError, match="MAX_COSCHED_LOG"):
        DaemonKnobs.from_param({"MAX_COSCHED_LOG": value})


def test_log_is_bounded_with_one_rotated_file(tmp_path):
    log_file = daemon.LogFile()
    path = tmp_path / "CoSchedLog"
    logger = logging.getLogger("condor_sched.test_daemon")
    logger.setLevel(logging.INFO)
    log_file.apply(str(path), 2000)
    try:
        for i in range(200):
            logger.info("cycle %d: 40 idle co-scheduled jobs seen", i)
    finally:
        log_file.close()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["CoSchedLog", "CoSchedLog.old"]
    assert path.stat().st_size <= 2000 and (tmp_path / "CoSchedLog.old").stat().st_size <= 2000
    assert "cycle 199:" in path.read_text()


class Recorder:
    """A fake collector: every ad and command sent; asks ``daemon`` to stop once it has
    received ``stop_after`` updates."""

    def __init__(self, stop_after: int | None = None) -> None:
        self.sent: list[tuple[str, dict]] = []
        self.stop_after = stop_after
        self.daemon: SidecarDaemon | None = None

    def __call__(self, ad, command: str) -> None:
        self.sent.append((command, dict(ad)))
        if self.stop_after is not None and len(self.updates()) >= self.stop_after:
            self.daemon.request_stop()

    def updates(self) -> list[dict]:
        return [ad for command, ad in self.sent if command == "UPDATE_AD_GENERIC"]


def make_daemon(run_cycle, send, interval_s=60.0, cycle_end=None, **kw) -> SidecarDaemon:
    param = {"FULL_HOSTNAME": "h", **kw.pop("param", {})}
    options = {"query_sidecars": list, "settle_s": 0.0, "poll_s": 0.05, **kw}
    return SidecarDaemon(lambda: DaemonCycle(run_cycle, interval_s, cycle_end, {"Policy": "knapsack"}),
                         param=lambda: param, reload_config=lambda: None, send=send, **options)


def test_a_failed_cycle_is_advertised_and_the_next_success_clears_it():
    results = iter([RuntimeError("schedd unreachable"), {"IdleJobs": 4, "Pinned": 4, "Unplaced": 0}])

    def run_cycle():
        result = next(results)
        if isinstance(result, Exception):
            raise result
        return result

    send = Recorder(stop_after=3)  # the lease claim and two cycles
    send.daemon = make_daemon(run_cycle, send, cycle_end=iter([None, 100, 101, 102]).__next__)
    send.daemon.serve()
    claim, first, second = send.updates()
    assert claim["CoSchedCyclesRun"] == 0
    assert first["CoSchedLastError"] == "RuntimeError: schedd unreachable" and first["CoSchedFailedCycles"] == 1
    assert second["CoSchedLastError"] == "" and second["CoSchedPinned"] == 4 and second["CoSchedCyclesRun"] == 2
    command, ad = send.sent[-1]
    assert command == "INVALIDATE_ADS_GENERIC" and 'Name == "cosched@h"' in str(ad["Requirements"])


def test_a_stop_request_ends_a_long_wait_promptly():
    send = Recorder()
    the_daemon = make_daemon(lambda: {"Pinned": 1}, send, interval_s=600)
    stopper = threading.Timer(0.3, the_daemon.request_stop)
    started = time.monotonic()
    stopper.start()
    the_daemon.serve()
    assert time.monotonic() - started < 2
    # The lease claim, the first cycle's ad, the withdrawal.
    assert [c for c, _ in send.sent] == ["UPDATE_AD_GENERIC", "UPDATE_AD_GENERIC", "INVALIDATE_ADS_GENERIC"]


def test_each_new_negotiation_cycle_starts_a_cycle():
    ends = iter([5, 5, 5, 6, 6, 7])
    runs = []
    the_daemon = None

    def run_cycle():
        runs.append(time.monotonic())
        if len(runs) == 3:
            the_daemon.request_stop()
        return {}

    the_daemon = make_daemon(run_cycle, Recorder(), interval_s=600, cycle_end=lambda: next(ends))
    the_daemon.serve()
    assert len(runs) == 3 and runs[-1] - runs[0] < 2  # cycles 6 and 7, not the 600 s interval


@pytest.fixture
def condor_config(tmp_path):
    """A CONDOR_CONFIG file for this process's htcondor2; the previous configuration afterwards."""
    path = tmp_path / "condor_config"
    before = os.environ.get("CONDOR_CONFIG")
    os.environ["CONDOR_CONFIG"] = str(path)
    yield path
    if before is None:
        os.environ.pop("CONDOR_CONFIG", None)
    else:
        os.environ["CONDOR_CONFIG"] = before
    htcondor2.reload_config()


def test_sighup_rereads_the_cosched_knobs(condor_config, tmp_path, caplog):
    caplog.set_level(logging.INFO)
    first_log, second_log = tmp_path / "CoSchedLog", tmp_path / "CoSchedLog.2"
    condor_config.write_text(f"COSCHED_POLICY = knapsack\nCOSCHED_LOG = {first_log}\n")
    htcondor2.reload_config()
    send = Recorder(stop_after=3)  # the lease claim and two cycles

    def configure() -> DaemonCycle:
        return DaemonCycle(run_cycle, 600, None, {"Policy": settings_from_htcondor().policy})

    def run_cycle():
        if len(send.updates()) == 1:  # the lease claim only
            condor_config.write_text(f"COSCHED_POLICY = global\nCOSCHED_LOG = {second_log}\nMAX_COSCHED_LOG = 5000\n")
            os.kill(os.getpid(), signal.SIGHUP)  # as condor_reconfig's master does
        return {}

    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGHUP, signal.SIGTERM, signal.SIGQUIT, signal.SIGINT)}
    try:
        the_daemon = send.daemon = SidecarDaemon(configure, send=send, poll_s=0.05, query_sidecars=list, settle_s=0)
        the_daemon.install_signal_handlers()
        the_daemon.serve()
    finally:
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
    assert [ad["CoSchedPolicy"] for ad in send.updates()] == ["knapsack", "knapsack", "global"]
    assert the_daemon.knobs.max_log_bytes == 5000
    assert "reconfig: re-reading the configuration" in first_log.read_text()
    assert "stopping after 2 cycles" in second_log.read_text()


def test_a_bad_reconfig_keeps_the_running_settings_and_says_why():
    send = Recorder(stop_after=3)
    param = {"FULL_HOSTNAME": "h"}

    def run_cycle():
        if len(send.updates()) == 1:  # the lease claim only
            param["MAX_COSCHED_LOG"] = "lots"
            the_daemon.request_reconfig()
        return {}

    the_daemon = send.daemon = SidecarDaemon(lambda: DaemonCycle(run_cycle, 600), param=lambda: param, reload_config=lambda: None,
                               send=send, poll_s=0.05, query_sidecars=list, settle_s=0)
    the_daemon.serve()
    _, first, second = send.updates()
    assert first["CoSchedConfigError"] == ""
    assert "MAX_COSCHED_LOG" in second["CoSchedConfigError"] and second["CoSchedCyclesRun"] == 2


def test_log_file_follows_the_knobs(tmp_path: Path):
    log_file = daemon.LogFile()
    log_file.apply(str(tmp_path / "a"), 100)
    first = log_file.handler
    log_file.apply(str(tmp_path / "a"), 100)
    assert log_file.handler is first
    log_file.apply("", 100)
    assert log_file.handler is None and first not in logging.getLogger().handlers


def test_an_unwritable_log_names_the_knob(tmp_path):
    log_file = daemon.LogFile(syslog_socket=str(tmp_path / "no-syslog"))
    with pytest.raises(SettingsError, match="COSCHED_LOG"):
        log_file.apply(str(tmp_path / "missing-dir" / "CoSchedLog"), 100)
    assert log_file.handler is None          # no system log listens there: nothing attached


# --- stopping within 2 s ---------------------------------------------------------------

@pytest.fixture
def restore_signal_handlers():
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGHUP, signal.SIGTERM, signal.SIGQUIT, signal.SIGINT)}
    yield
    for sig, handler in handlers.items():
        signal.signal(sig, handler)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGQUIT])
def test_a_signal_wakes_a_daemon_waiting_for_a_negotiation_cycle_at_once(restore_signal_handlers, sig):
    # A negotiator that ends no cycle, a long interval and a long poll: only the signal can end the wait.
    the_daemon = make_daemon(lambda: {}, Recorder(), interval_s=600, cycle_end=lambda: 100, poll_s=30)
    the_daemon.install_signal_handlers()
    sent_at = []

    def send_signal():
        sent_at.append(time.monotonic())
        os.kill(os.getpid(), sig)

    threading.Timer(0.3, send_signal).start()
    the_daemon.serve()
    stopped_after_s = time.monotonic() - sent_at[0]
    assert stopped_after_s < 0.5, stopped_after_s


def test_a_stop_during_a_cycle_ends_the_daemon_after_that_cycle_without_another_ad():
    send = Recorder()
    cycles = []

    def run_cycle():
        cycles.append(1)
        the_daemon.request_stop()  # as a SIGTERM while the cycle edits jobs
        assert the_daemon.stop_requested  # what the cycle's editing loop asks between jobs
        return {"Pinned": 1}

    the_daemon = make_daemon(run_cycle, send, interval_s=600)
    the_daemon.serve()
    assert len(cycles) == 1
    assert [c for c, _ in send.sent] == ["UPDATE_AD_GENERIC", "INVALIDATE_ADS_GENERIC"]  # claim, withdrawal


# --- the collector and the negotiator: warned once -------------------------------------

def test_a_collector_down_for_many_polls_is_warned_once_and_its_return_logged_once(caplog):
    caplog.set_level(logging.INFO)
    down = {"now": True}
    ends = iter(range(1000))
    done = []

    def unreachable():
        return CollectorUnreachable("cannot query the negotiator ad: Failed communication with collector.")

    def cycle_end():
        if down["now"]:
            raise unreachable()
        return next(ends)

    def run_cycle():
        if down["now"]:
            raise unreachable()
        done.append(1)
        if len(done) == 2:
            the_daemon.request_stop()
        return {}

    class FlakySend(Recorder):
        def __call__(self, ad, command):
            if down["now"]:
                raise unreachable()
            super().__call__(ad, command)

    def sidecars():
        if down["now"]:
            raise unreachable()
        return []

    threading.Timer(1.5, lambda: down.update(now=False)).start()
    the_daemon = make_daemon(run_cycle, FlakySend(), interval_s=1, cycle_end=cycle_end, query_sidecars=sidecars)
    the_daemon.serve()
    down_warnings = [m for m in messages(caplog) if "collector does not answer" in m]
    assert len(down_warnings) == 1, messages(caplog)
    assert messages(caplog).count("the collector answers again") == 1
    assert not [m for m in messages(caplog) if "negotiation cycle" in m]  # the collector's fault, not the negotiator's


def messages(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records]


def test_a_silent_negotiator_is_warned_once_and_following_it_again_is_logged(caplog):
    caplog.set_level(logging.INFO)
    ends = iter([None] * 40 + [7] * 10 + list(range(8, 1000)))
    the_daemon = None
    cycles = []

    def run_cycle():
        cycles.append(time.monotonic())
        if len(cycles) == 6:
            the_daemon.request_stop()
        return {}

    the_daemon = make_daemon(run_cycle, Recorder(), interval_s=1, cycle_end=lambda: next(ends),
                             negotiator_patience_s=0.5)
    the_daemon.serve()
    warnings = [m for m in messages(caplog) if "no new negotiation cycle" in m]
    assert len(warnings) == 1, messages(caplog)
    assert "the collector has no negotiator ad" in warnings[0] and "fall back to every 1 s" in warnings[0]
    assert messages(caplog).count("negotiation cycles are followed again") == 1


# --- one sidecar at a time -------------------------------------------------------------

class FakeCollector:
    """Generic ads keyed by Name, stamped with LastHeardFrom on update; invalidation by
    Requirements, as the collector does for a query ad without a Name."""

    def __init__(self) -> None:
        self.ads: dict[str, dict] = {}
        self.lock = threading.Lock()

    def send(self, ad, command: str) -> None:
        with self.lock:
            if command == "UPDATE_AD_GENERIC":
                self.ads[ad["Name"]] = {**dict(ad), "LastHeardFrom": int(time.time())}
            elif command == "INVALIDATE_ADS_GENERIC":
                for name, stored in list(self.ads.items()):
                    probe = classad2.ClassAd({k: v for k, v in stored.items()})
                    probe["Requirements"] = ad.lookup("Requirements")
                    if probe.eval("Requirements") is True:
                        del self.ads[name]

    def query(self) -> list[dict]:
        with self.lock:
            return [dict(a) for a in self.ads.values()]


def running_sidecar_ad(name="cosched@cm", machine="cm", pid=4242, started_s_ago=300, heard_s_ago=5, lifetime=210):
    now = int(time.time())
    return {"MyType": "CoSchedSidecar", "Name": name, "Machine": machine, "CoSchedPid": pid,
            "DaemonStartTime": now - started_s_ago, "LastHeardFrom": now - heard_s_ago, "ClassAdLifetime": lifetime}


def lease_daemon(collector: FakeCollector, run_cycle=lambda: {}, host="h", **kw) -> SidecarDaemon:
    return make_daemon(run_cycle, collector.send, interval_s=kw.pop("interval_s", 1),
                       query_sidecars=kw.pop("query_sidecars", collector.query),
                       param={"FULL_HOSTNAME": host, **kw.pop("param", {})}, **kw)


def test_a_second_sidecar_refuses_to_run_naming_the_running_one():
    collector = FakeCollector()
    collector.ads["cosched@cm"] = running_sidecar_ad()
    cycles = []
    the_daemon = lease_daemon(collector, lambda: cycles.append(1) or {})
    with pytest.raises(lease.LeaseHeld) as refused:
        the_daemon.serve()
    for part in ("cosched@cm on cm", "pid 4242", "running for 5 min 0 s", "--dry-run"):
        assert part in str(refused.value)
    assert cycles == [] and list(collector.ads) == ["cosched@cm"]  # nothing run, the running one's ad untouched


@pytest.mark.parametrize("stale", [
    running_sidecar_ad(heard_s_ago=400),  # older than its lease: a sidecar that died elsewhere
    running_sidecar_ad(name="cosched@h", machine="h", pid=99),  # on this host, process gone (alive says no)
    {**running_sidecar_ad(), "CoSchedDryRun": True},  # a dry run holds no lease
])
def test_a_stale_ad_or_a_dry_run_does_not_block_a_start(stale):
    collector = FakeCollector()
    collector.ads[stale["Name"]] = stale
    the_daemon = lease_daemon(collector, lambda: the_daemon.request_stop() or {}, alive=lambda pid: False)
    the_daemon.serve()
    assert the_daemon.status.cycles_run == 1


def test_a_dry_run_runs_beside_the_sidecar_under_its_own_ad_name():
    collector = FakeCollector()
    collector.ads["cosched@h"] = running_sidecar_ad(name="cosched@h", machine="h")
    names = []
    the_daemon = lease_daemon(collector, lambda: {}, dry_run=True)

    def run_cycle():
        names.extend(collector.ads)
        the_daemon.request_stop()
        return {}

    the_daemon.config = None
    the_daemon._configure = lambda: DaemonCycle(run_cycle, 1, None, {})
    the_daemon.serve()
    assert the_daemon.knobs.name == "dry-run-cosched@h" and the_daemon.status.cycles_run == 1
    assert list(collector.ads) == ["cosched@h"]  # the real sidecar's ad is neither replaced nor withdrawn


def run_in_thread(the_daemon: SidecarDaemon) -> tuple[threading.Thread, list]:
    outcome: list = []

    def serve():
        try:
            the_daemon.serve()
            outcome.append("stopped")
        except lease.LeaseHeld as e:
            outcome.append(e)

    thread = threading.Thread(target=serve)
    thread.start()
    return thread, outcome


@pytest.mark.parametrize("same_name", [False, True])
def test_of_two_sidecars_started_at_once_the_one_started_first_runs_and_the_other_exits(same_name):
    collector = FakeCollector()
    names = {"COSCHED_NAME": "cosched@pool"} if same_name else {}
    ends = iter(range(10_000))
    both_looked = threading.Barrier(2)

    def query_at_once(looked=[]):
        """Both sidecars' first look finds no one: both claim the lease."""
        ads = collector.query()
        if threading.current_thread() not in looked:
            looked.append(threading.current_thread())
            both_looked.wait(timeout=5)
        return ads

    # The same pid (one test process): the hosts tell them apart; "a" started a second earlier.
    first = lease_daemon(collector, host="a", param=names, settle_s=0.3, cycle_end=lambda: next(ends),
                         query_sidecars=query_at_once)
    second = lease_daemon(collector, host="b", param=names, settle_s=0.3, cycle_end=lambda: next(ends),
                          query_sidecars=query_at_once)
    first.status = replace(first.status, start_time=second.status.start_time - 1)
    (t1, out1), (t2, out2) = run_in_thread(first), run_in_thread(second)
    try:
        t2.join(timeout=10)
        assert not t2.is_alive() and isinstance(out2[0], lease.LeaseHeld), out2
        assert "on a, pid" in str(out2[0]) and "started first" in str(out2[0])
        assert t1.is_alive() and not out1
        time.sleep(0.3)
        assert [(ad["Machine"], ad["Name"]) for ad in collector.query()] == [("a", first.knobs.name)]
    finally:
        first.request_stop()
        t1.join(timeout=10)
    assert out1 == ["stopped"] and first.status.cycles_run > 0 and collector.ads == {}


def test_a_rival_that_started_first_stops_a_running_sidecar_which_withdraws_only_its_own_ad():
    collector = FakeCollector()
    cycles = []

    def run_cycle():
        cycles.append(1)
        if len(cycles) == 2:  # e.g. the collector had lost the first sidecar's ad when this one started
            collector.ads["cosched@cm"] = running_sidecar_ad(started_s_ago=3600)
        return {}

    ends = iter(range(100))
    the_daemon = lease_daemon(collector, run_cycle, cycle_end=lambda: next(ends))
    with pytest.raises(lease.LeaseHeld, match="cosched@cm on cm.*started first; this one stops"):
        the_daemon.serve()
    assert len(cycles) == 2 and list(collector.ads) == ["cosched@cm"]


def test_a_rival_that_started_later_is_noted_once_and_its_end_logged(caplog):
    caplog.set_level(logging.INFO)
    collector = FakeCollector()
    cycles = []

    def run_cycle():
        cycles.append(1)
        if len(cycles) == 2:
            collector.ads["late@x"] = running_sidecar_ad(name="late@x", machine="x", started_s_ago=-60)
        if len(cycles) == 5:
            del collector.ads["late@x"]
        if len(cycles) == 6:
            the_daemon.request_stop()
        return {}

    ends = iter(range(100))
    the_daemon = lease_daemon(collector, run_cycle, cycle_end=lambda: next(ends))
    the_daemon.serve()
    noted = [m for m in messages(caplog) if m.startswith("another sidecar runs: late@x on x")]
    assert len(noted) == 1 and "it started later and stops at its next cycle" in noted[0]
    assert messages(caplog).count("the other sidecar x/late@x/4242 is gone") == 1


@pytest.fixture
def world_dir():
    """A directory any account may write, reachable by any account (unlike pytest's tmp_path)."""
    import shutil
    import tempfile

    path = Path(tempfile.mkdtemp(prefix="cosched-log-", dir="/tmp"))
    path.chmod(0o777)
    yield path
    shutil.rmtree(path)


def test_a_log_left_by_another_account_falls_back_beside_it_and_says_why(world_dir):
    """COSCHED_LOG owned by root (a run before COSCHED_SIDECAR_USERID was set) and this sidecar
    an unprivileged account: it logs to <COSCHED_LOG>.<account>, whose first line names the
    knob and the fix, and ``problem`` (the ad's CoSchedConfigError) says so."""
    import pwd

    import condor_sched.sidecar_log as sidecar_log

    tmp_path = world_dir
    path = tmp_path / "CoSchedLog"
    path.write_text("root's log\n")
    path.chmod(0o600)
    nobody = pwd.getpwnam("nobody")
    child = os.fork()
    if child == 0:      # the sidecar as an unprivileged account, as the master starts it
        code = 1
        try:
            os.setgid(nobody.pw_gid)
            os.setuid(nobody.pw_uid)
            log_file = daemon.LogFile()
            log_file.apply(str(path), 10_000)
            logging.getLogger("condor_sched.test_daemon").error("a cycle's line")
            log_file.close()
            code = 0
        finally:
            os._exit(code)
    _, status = os.waitpid(child, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    fallback = tmp_path / "CoSchedLog.nobody"
    text = fallback.read_text()
    assert text.splitlines()[0].endswith(f"COSCHED_LOG = {path}: Permission denied; logging to {fallback} instead "
                                         "(fix: make COSCHED_LOG writable by nobody, or point it elsewhere)")
    assert "a cycle's line" in text and path.read_text() == "root's log\n"
    assert sidecar_log.fallback_log_path(str(path)) == f"{path}.root"        # this test process's own


def test_a_log_nowhere_writable_goes_to_the_system_log_and_refuses_to_start(tmp_path):
    """Neither COSCHED_LOG nor its fallback can be opened: the refusal names COSCHED_LOG and
    is sent to the system log (a datagram socket standing in for /dev/log here)."""
    import socket

    sink = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sink.bind(str(tmp_path / "log.sock"))
    sink.settimeout(5)
    log_file = daemon.LogFile(syslog_socket=str(tmp_path / "log.sock"))
    with pytest.raises(SettingsError, match="COSCHED_LOG = .*missing-dir/CoSchedLog: No such file"):
        log_file.apply(str(tmp_path / "missing-dir" / "CoSchedLog"), 100)
    try:
        logging.getLogger("condor_sched.daemon").error("cannot start: %s", log_file.problem)
        assert b"condor-sched: " in sink.recv(4096) and "CoSchedLog.root" in log_file.problem
    finally:
        log_file.close()
        sink.close()
