"""The sidecar daemon without a pool: its ad, its knobs, its log bound, its loop and signals."""
from __future__ import annotations

import logging
import os
import signal
import threading
import time
from pathlib import Path

import htcondor2
import pytest

from condor_sched import daemon
from condor_sched.daemon import DaemonCycle, DaemonKnobs, DaemonStatus, SidecarDaemon
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


def test_invalidation_names_the_sidecars_table_and_ad():
    ad = daemon.invalidation_ad('cosched@"odd"')
    assert (ad["MyType"], ad["TargetType"], ad["Name"]) == ("Query", "CoSchedSidecar", 'cosched@"odd"')
    assert str(ad.lookup("Requirements")) == 'Name == "cosched@\\"odd\\""' and ad.eval("Requirements") is True


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
    """A fake collector: every ad and command sent."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, dict]] = []

    def __call__(self, ad, command: str) -> None:
        self.sent.append((command, dict(ad)))

    def updates(self) -> list[dict]:
        return [ad for command, ad in self.sent if command == "UPDATE_AD_GENERIC"]


def make_daemon(run_cycle, send, interval_s=60.0, cycle_end=None, **param) -> SidecarDaemon:
    return SidecarDaemon(lambda: DaemonCycle(run_cycle, interval_s, cycle_end, {"Policy": "knapsack"}),
                         param=lambda: {"FULL_HOSTNAME": "h", **param}, reload_config=lambda: None, send=send,
                         poll_s=0.05)


def test_a_failed_cycle_is_advertised_and_the_next_success_clears_it():
    send = Recorder()
    results = iter([RuntimeError("schedd unreachable"), {"IdleJobs": 4, "Pinned": 4, "Unplaced": 0}])
    the_daemon = None

    def run_cycle():
        result = next(results)
        if isinstance(result, Exception):
            raise result
        the_daemon.request_stop()
        return result

    the_daemon = make_daemon(run_cycle, send, cycle_end=iter([None, 100, 101, 102]).__next__)
    the_daemon.serve()
    first, second = send.updates()
    assert first["CoSchedLastError"] == "RuntimeError: schedd unreachable" and first["CoSchedFailedCycles"] == 1
    assert second["CoSchedLastError"] == "" and second["CoSchedPinned"] == 4 and second["CoSchedCyclesRun"] == 2
    command, ad = send.sent[-1]
    assert command == "INVALIDATE_ADS_GENERIC" and ad["Name"] == "cosched@h"


def test_a_stop_request_ends_a_long_wait_promptly():
    send = Recorder()
    the_daemon = make_daemon(lambda: {"Pinned": 1}, send, interval_s=600)
    stopper = threading.Timer(0.3, the_daemon.request_stop)
    started = time.monotonic()
    stopper.start()
    the_daemon.serve()
    assert time.monotonic() - started < 2
    assert [c for c, _ in send.sent] == ["UPDATE_AD_GENERIC", "INVALIDATE_ADS_GENERIC"]


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
    send = Recorder()
    the_daemon = None

    def configure() -> DaemonCycle:
        return DaemonCycle(run_cycle, 600, None, {"Policy": settings_from_htcondor().policy})

    def run_cycle():
        if len(send.updates()) == 0:
            condor_config.write_text(f"COSCHED_POLICY = global\nCOSCHED_LOG = {second_log}\nMAX_COSCHED_LOG = 5000\n")
            os.kill(os.getpid(), signal.SIGHUP)  # as condor_reconfig's master does
        else:
            the_daemon.request_stop()
        return {}

    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGHUP, signal.SIGTERM, signal.SIGQUIT, signal.SIGINT)}
    try:
        the_daemon = SidecarDaemon(configure, send=send, poll_s=0.05)
        the_daemon.install_signal_handlers()
        the_daemon.serve()
    finally:
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
    assert [ad["CoSchedPolicy"] for ad in send.updates()] == ["knapsack", "global"]
    assert the_daemon.knobs.max_log_bytes == 5000
    assert "reconfig: re-reading the configuration" in first_log.read_text()
    assert "stopping after 2 cycles" in second_log.read_text()


def test_a_bad_reconfig_keeps_the_running_settings_and_says_why():
    send = Recorder()
    the_daemon = None
    param = {"FULL_HOSTNAME": "h"}

    def run_cycle():
        if len(send.updates()) == 0:
            param["MAX_COSCHED_LOG"] = "lots"
            the_daemon.request_reconfig()
        else:
            the_daemon.request_stop()
        return {}

    the_daemon = SidecarDaemon(lambda: DaemonCycle(run_cycle, 600), param=lambda: param, reload_config=lambda: None,
                               send=send, poll_s=0.05)
    the_daemon.serve()
    first, second = send.updates()
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
    with pytest.raises(SettingsError, match="COSCHED_LOG"):
        daemon.LogFile().apply(str(tmp_path / "missing-dir" / "CoSchedLog"), 100)
