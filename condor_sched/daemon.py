"""The sidecar as an HTCondor daemon: the loop a condor_master runs, around one cycle callable.

The master starts ``condor-sched run`` from DAEMON_LIST as a non-DaemonCore daemon and
signals it (condor_master.V6/masterDaemon.cpp, ``daemon::Stop``, ``StopFast``, ``Reconfig``):
SIGTERM on ``condor_off -daemon COSCHED_SIDECAR`` (SIGQUIT after SHUTDOWN_GRACEFUL_TIMEOUT,
or at once on ``condor_off -fast``) and SIGHUP on ``condor_reconfig``. So this daemon

- advertises after each cycle a ``MyType = "CoSchedSidecar"`` ad about itself to the
  collector (UPDATE_AD_GENERIC, keyed by ``Name``; ``condor_status -any`` lists it), and
  invalidates it when it exits;
- on SIGHUP re-reads the configuration (``htcondor2.reload_config``) and rebuilds its cycle;
- logs to COSCHED_LOG, bounded by MAX_COSCHED_LOG bytes with one rotated file
  (``<log>.old``), as HTCondor bounds its daemons' logs with MAX_<SUBSYS>_LOG;
- exits cleanly on SIGTERM, SIGQUIT or SIGINT: at once when waiting, after the running cycle
  otherwise (a cycle's edits are safe to interrupt anyway, but it need not be).

What a cycle does is the planning code's business: :class:`DaemonCycle` carries a
``run_cycle`` callable that returns the cycle's numbers, ``{"IdleJobs": 40, "Pinned": 9, ...}``,
each advertised as ``CoSched<key>``.
"""
from __future__ import annotations

import logging
import logging.handlers
import math
import os
import re
import signal
import time
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Mapping

import classad2

from condor_sched import __version__
from condor_sched.settings import SettingsError

log = logging.getLogger("condor_sched.daemon")

AD_TYPE = "CoSchedSidecar"
#: HTCondor's default for MAX_<SUBSYS>_LOG.
DEFAULT_MAX_LOG_BYTES = 10 * 1024 * 1024
LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
#: Numbers every ad carries, 0 until a cycle reports them.
REQUIRED_NUMBERS = ("IdleJobs", "Pinned", "Unplaced")
_ATTR_SUFFIX = re.compile(r"^[A-Z][A-Za-z0-9]*$")


@dataclass(frozen=True, slots=True)
class DaemonKnobs:
    """The daemon's own knobs; the planning knobs belong to the cycle."""

    name: str
    machine: str
    log_path: str = ""
    max_log_bytes: int = DEFAULT_MAX_LOG_BYTES

    @classmethod
    def from_param(cls, param: Mapping[str, str]) -> DaemonKnobs:
        """COSCHED_NAME (default ``cosched@<FULL_HOSTNAME>``), COSCHED_LOG, MAX_COSCHED_LOG
        (bytes; 0: unbounded) from a mapping like ``htcondor2.param``."""
        machine = str(param.get("FULL_HOSTNAME") or "localhost").strip()
        raw_max = str(param.get("MAX_COSCHED_LOG") or "").strip()
        try:
            max_log_bytes = int(raw_max) if raw_max else DEFAULT_MAX_LOG_BYTES
        except ValueError:
            raise SettingsError(f"MAX_COSCHED_LOG = {raw_max!r} is not a number of bytes") from None
        if max_log_bytes < 0:
            raise SettingsError(f"MAX_COSCHED_LOG = {raw_max!r} must be 0 (unbounded) or positive")
        return cls(name=str(param.get("COSCHED_NAME") or "").strip() or f"cosched@{machine}",
                   machine=machine, log_path=str(param.get("COSCHED_LOG") or "").strip(),
                   max_log_bytes=max_log_bytes)


def _old_log_name(default_name: str) -> str:
    """HTCondor keeps one rotated log as ``<log>.old``; RotatingFileHandler would say ``.1``."""
    return default_name[:-2] + ".old" if default_name.endswith(".1") else default_name


class LogFile:
    """The root logger's file handler for COSCHED_LOG: bounded, replaced when the knobs change."""

    def __init__(self) -> None:
        self.handler: logging.handlers.RotatingFileHandler | None = None
        self._knobs: tuple[str, int] | None = None

    def apply(self, log_path: str, max_log_bytes: int) -> None:
        if self._knobs == (log_path, max_log_bytes):
            return
        self.close()
        self._knobs = (log_path, max_log_bytes)
        if not log_path:
            return
        try:
            handler = logging.handlers.RotatingFileHandler(log_path, maxBytes=max_log_bytes, backupCount=1)
        except OSError as e:
            raise SettingsError(f"COSCHED_LOG = {log_path}: {e.strerror or e}") from None
        handler.namer = _old_log_name
        handler.setFormatter(logging.Formatter(LOG_FORMAT))
        logging.getLogger().addHandler(handler)
        self.handler = handler

    def close(self) -> None:
        if self.handler is not None:
            logging.getLogger().removeHandler(self.handler)
            self.handler.close()
            self.handler = None
        self._knobs = None


def log_to_cosched_log() -> LogFile:
    """Log to COSCHED_LOG, bounded by MAX_COSCHED_LOG, when it is set (e.g. ``run --once``)."""
    knobs = DaemonKnobs.from_param(_htcondor_param())
    log_file = LogFile()
    log_file.apply(knobs.log_path, knobs.max_log_bytes)
    return log_file


@dataclass(frozen=True, slots=True)
class DaemonCycle:
    """One configuration's cycle: what runs, when the next one is due, what the ad says of it.

    ``cycle_end`` reads the negotiator's last cycle end (a new value starts a cycle); None
    means a cycle every ``interval_s``, which is otherwise the longest wait. ``describe``
    holds settings to advertise, e.g. ``{"Policy": "knapsack"}`` as ``CoSchedPolicy``.
    """

    run_cycle: Callable[[], Mapping[str, Any]]
    interval_s: float
    cycle_end: Callable[[], int | None] | None = None
    describe: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class DaemonStatus:
    """What the ad reports besides the cycle's numbers."""

    start_time: int
    pid: int
    cycles_run: int = 0
    failed_cycles: int = 0
    cycle_s: float = 0.0
    last_cycle_time: int | None = None
    last_error: str = ""
    config_error: str = ""
    update_sequence: int = 0


def _attr_value(value: Any) -> Any:
    return value if isinstance(value, (bool, int, float, str)) else str(value)


def sidecar_ad(knobs: DaemonKnobs, status: DaemonStatus, numbers: Mapping[str, Any],
               describe: Mapping[str, Any], lifetime_s: int) -> classad2.ClassAd:
    """The daemon's collector ad: identity, liveness, configuration and the last cycle's numbers.

    ``CoSchedLastError`` is the last cycle's error ("" when it succeeded), ``CoSchedConfigError``
    the error of the last configuration read ("" when it was used); ``ClassAdLifetime`` lets
    the collector drop the ad of a sidecar that died without invalidating it.
    """
    ad = classad2.ClassAd()
    ad["MyType"] = AD_TYPE
    ad["Name"] = knobs.name
    ad["Machine"] = knobs.machine
    ad["DaemonStartTime"] = status.start_time
    ad["UpdateSequenceNumber"] = status.update_sequence
    ad["ClassAdLifetime"] = lifetime_s
    ad["CoSchedVersion"] = __version__
    ad["CoSchedPid"] = status.pid
    for key, value in {**{k: 0 for k in REQUIRED_NUMBERS}, "Cycle": status.cycles_run, **numbers,
                       **describe}.items():
        if not _ATTR_SUFFIX.match(key):
            raise ValueError(f"cannot advertise {key!r}: not a ClassAd attribute suffix")
        ad[f"CoSched{key}"] = _attr_value(value)
    ad["CoSchedCyclesRun"] = status.cycles_run
    ad["CoSchedFailedCycles"] = status.failed_cycles
    ad["CoSchedCycleSeconds"] = round(status.cycle_s, 3)
    if status.last_cycle_time is not None:
        ad["CoSchedLastCycleTime"] = status.last_cycle_time
    ad["CoSchedLastError"] = status.last_error
    ad["CoSchedConfigError"] = status.config_error
    return ad


def invalidation_ad(name: str) -> classad2.ClassAd:
    """The INVALIDATE_ADS_GENERIC query removing the ad named ``name`` (the collector finds
    the table by TargetType and the ad by Name)."""
    ad = classad2.ClassAd()
    ad["MyType"] = "Query"
    ad["TargetType"] = AD_TYPE
    ad["Name"] = name
    ad["Requirements"] = classad2.ExprTree(f"Name == {classad2.quote(name)}")
    return ad


def ad_lifetime_s(interval_s: float) -> int:
    """Three missed updates, as the longest wait between cycles is ``interval_s``."""
    return int(math.ceil(3 * max(interval_s, 1.0))) + 30


def _htcondor_param() -> Mapping[str, str]:
    import htcondor2

    return htcondor2.param


def _reload_config() -> None:
    import htcondor2

    htcondor2.reload_config()


def _send_to_collector(ad: classad2.ClassAd, command: str) -> None:
    from condor_sched import pool

    pool.advertise(ad, command)


class SidecarDaemon:
    """Cycle, advertise, wait; re-read the configuration on SIGHUP; stop on SIGTERM/SIGQUIT/SIGINT.

    ``configure`` builds the cycle from the current configuration (it reads the COSCHED_*
    knobs); it is called at start and after every reload. Side effects are injected so the
    loop is tested without a pool.
    """

    def __init__(self, configure: Callable[[], DaemonCycle], *,
                 param: Callable[[], Mapping[str, str]] = _htcondor_param,
                 reload_config: Callable[[], None] = _reload_config,
                 send: Callable[[classad2.ClassAd, str], None] = _send_to_collector,
                 log_file: LogFile | None = None, poll_s: float = 0.5) -> None:
        self._configure = configure
        self._param = param
        self._reload_config = reload_config
        self._send = send
        self.log_file = log_file or LogFile()
        self._poll_s = poll_s
        # Plain flags: signal handlers only set them (an Event's lock could deadlock a handler).
        self._stopping = False
        self._reconfig_requested = False
        self.knobs = DaemonKnobs.from_param(param())
        self.config: DaemonCycle | None = None
        self.status = DaemonStatus(start_time=int(time.time()), pid=os.getpid())
        self.numbers: dict[str, Any] = {}

    # --- signals -------------------------------------------------------------------

    def request_stop(self, *_: Any) -> None:
        self._stopping = True

    def request_reconfig(self, *_: Any) -> None:
        self._reconfig_requested = True

    def install_signal_handlers(self) -> None:
        for sig in (signal.SIGTERM, signal.SIGQUIT, signal.SIGINT):
            signal.signal(sig, self.request_stop)
        signal.signal(signal.SIGHUP, self.request_reconfig)

    # --- configuration -------------------------------------------------------------

    def _load(self) -> None:
        """Read the daemon's knobs and build the cycle; raise on a configuration it cannot use."""
        knobs = DaemonKnobs.from_param(self._param())
        self.log_file.apply(knobs.log_path, knobs.max_log_bytes)
        self.config = self._configure()
        if knobs.name != self.knobs.name:
            self._invalidate()
        self.knobs = knobs

    def _reconfigure(self) -> None:
        """SIGHUP: reload the configuration files; keep the running configuration if the new one is bad."""
        self._reconfig_requested = False
        log.info("reconfig: re-reading the configuration")
        try:
            self._reload_config()
            self._load()
        except Exception as e:
            log.error("reconfig failed, keeping the previous settings: %s", e)
            self.status = replace(self.status, config_error=f"{type(e).__name__}: {e}")
        else:
            self.status = replace(self.status, config_error="")

    # --- the loop ------------------------------------------------------------------

    def serve(self) -> None:
        """Cycle until asked to stop, then invalidate the ad."""
        try:
            self._load()
        except Exception as e:
            log.error("cannot start: %s", e)
            raise
        log.info("started (pid %d) as %s", self.status.pid, self.knobs.name)
        last_end = self._read_cycle_end()
        while not self._stopping:
            if self._reconfig_requested:
                self._reconfigure()
            self._run_one_cycle()
            self._advertise()
            last_end = self._wait_for_next_cycle(last_end)
        log.info("stopping after %d cycles", self.status.cycles_run)
        self._invalidate()
        self.log_file.close()

    def _run_one_cycle(self) -> None:
        assert self.config is not None
        started = time.perf_counter()
        try:
            numbers = dict(self.config.run_cycle())
            error = ""
        except Exception as e:  # the pool may be down for a while; keep going
            log.error("cycle failed: %s", e)
            numbers, error = self.numbers, f"{type(e).__name__}: {e}"
        self.numbers = numbers
        self.status = replace(self.status, cycles_run=self.status.cycles_run + 1,
                               failed_cycles=self.status.failed_cycles + bool(error),
                               cycle_s=time.perf_counter() - started, last_cycle_time=int(time.time()),
                               last_error=error)

    def current_ad(self) -> classad2.ClassAd:
        assert self.config is not None
        return sidecar_ad(self.knobs, self.status, self.numbers, self.config.describe,
                          ad_lifetime_s(self.config.interval_s))

    def _advertise(self) -> None:
        self.status = replace(self.status, update_sequence=self.status.update_sequence + 1)
        try:
            self._send(self.current_ad(), "UPDATE_AD_GENERIC")
        except Exception as e:
            log.warning("cannot advertise to the collector: %s", e)

    def _invalidate(self) -> None:
        try:
            self._send(invalidation_ad(self.knobs.name), "INVALIDATE_ADS_GENERIC")
        except Exception as e:
            log.warning("cannot invalidate the ad %s: %s", self.knobs.name, e)

    def _interrupted(self) -> bool:
        return self._stopping or self._reconfig_requested

    def _read_cycle_end(self) -> int | None:
        if self.config is None or self.config.cycle_end is None:
            return None
        try:
            return self.config.cycle_end()
        except Exception as e:
            log.warning("cannot read the negotiator's last cycle end: %s", e)
            return None

    def _wait_for_next_cycle(self, last_end: int | None) -> int | None:
        """Until the negotiator ends a cycle after ``last_end`` or ``interval_s`` passes, or a
        signal arrives; returns the cycle end seen."""
        assert self.config is not None
        deadline = time.monotonic() + max(self.config.interval_s, 1.0)
        while not self._interrupted():
            end = self._read_cycle_end()
            if end is not None and end != last_end:
                return end
            left = deadline - time.monotonic()
            if left <= 0:
                return last_end
            time.sleep(min(self._poll_s, left))
        return last_end
