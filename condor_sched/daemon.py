"""The sidecar as an HTCondor daemon: the loop a condor_master runs, around one cycle callable.

The master starts ``condor-sched run`` from DAEMON_LIST as a non-DaemonCore daemon and
signals it (condor_master.V6/masterDaemon.cpp, ``daemon::Stop``, ``StopFast``, ``Reconfig``):
SIGTERM on ``condor_off -daemon COSCHED_SIDECAR`` (SIGQUIT after SHUTDOWN_GRACEFUL_TIMEOUT,
or at once on ``condor_off -fast``) and SIGHUP on ``condor_reconfig``. So this daemon

- holds the pool's one-sidecar lease (``condor_sched.lease``): it refuses to start while
  another sidecar's ad is live, and stops if a rival that started first shows up;
- advertises after each cycle a ``MyType = "CoSchedSidecar"`` ad about itself to the
  collector (UPDATE_AD_GENERIC, keyed by ``Name``; ``condor_status -any`` lists it), and
  invalidates it (its own, by Name, Machine and pid) when it exits;
- on SIGHUP re-reads the configuration (``htcondor2.reload_config``) and rebuilds its cycle;
- logs to COSCHED_LOG, bounded by MAX_COSCHED_LOG bytes with one rotated file
  (``<log>.old``), as HTCondor bounds its daemons' logs with MAX_<SUBSYS>_LOG;
- exits cleanly on SIGTERM, SIGQUIT or SIGINT within a second: the wait for the next
  negotiation cycle wakes at once (a self-pipe the handlers write to), and a running cycle
  stops after the job it is editing (the cycle asks :attr:`SidecarDaemon.stop_requested`).
  A call into htcondor2 is not interrupted: the bindings hold the interpreter (and its
  signal handlers) until the call returns, which is at once unless a daemon accepts the
  connection and never answers (then at the bindings' timeout; the master's SIGKILL is safe);
- warns once, not every cycle or poll, when the collector stops answering or the
  negotiator's cycles stop coming (it then cycles every COSCHED_INTERVAL), and logs once
  when they are back (``condor_sched.watch.Notices``).

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
import select
import signal
import time
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Mapping

import classad2

from condor_sched import __version__, lease
from condor_sched.pool import CollectorUnreachable
from condor_sched.settings import SettingsError
from condor_sched.sidecar_log import LogFile
from condor_sched.watch import Notices

log = logging.getLogger("condor_sched.daemon")

AD_TYPE = "CoSchedSidecar"
#: HTCondor's default for MAX_<SUBSYS>_LOG.
DEFAULT_MAX_LOG_BYTES = 10 * 1024 * 1024
#: Numbers every ad carries, 0 until a cycle reports them.
REQUIRED_NUMBERS = ("IdleJobs", "Pinned", "Unplaced")
_ATTR_SUFFIX = re.compile(r"^[A-Z][A-Za-z0-9]*$")
#: Seconds between reads of the negotiator ad while waiting for a negotiation cycle.
POLL_S = 0.5
#: Negotiation cycles count as stopped after this many COSCHED_INTERVALs without a new one.
NEGOTIATOR_PATIENCE_INTERVALS = 2
#: Prefix of a dry run's ad Name: it must not replace (or withdraw) the real sidecar's ad.
DRY_RUN_PREFIX = "dry-run-"


@dataclass(frozen=True, slots=True)
class DaemonKnobs:
    """The daemon's own knobs; the planning knobs belong to the cycle."""

    name: str
    machine: str
    log_path: str = ""
    max_log_bytes: int = DEFAULT_MAX_LOG_BYTES

    @classmethod
    def from_param(cls, param: Mapping[str, str], dry_run: bool = False) -> DaemonKnobs:
        """COSCHED_NAME (default ``cosched@<FULL_HOSTNAME>``; a dry run's is prefixed with
        ``dry-run-``), COSCHED_LOG, MAX_COSCHED_LOG (bytes; 0: unbounded) from a mapping like
        ``htcondor2.param``."""
        machine = str(param.get("FULL_HOSTNAME") or "localhost").strip()
        raw_max = str(param.get("MAX_COSCHED_LOG") or "").strip()
        try:
            max_log_bytes = int(raw_max) if raw_max else DEFAULT_MAX_LOG_BYTES
        except ValueError:
            raise SettingsError(f"MAX_COSCHED_LOG = {raw_max!r} is not a number of bytes") from None
        if max_log_bytes < 0:
            raise SettingsError(f"MAX_COSCHED_LOG = {raw_max!r} must be 0 (unbounded) or positive")
        name = str(param.get("COSCHED_NAME") or "").strip() or f"cosched@{machine}"
        return cls(name=f"{DRY_RUN_PREFIX}{name}" if dry_run else name, machine=machine, log_path=str(param.get("COSCHED_LOG") or "").strip(),
                   max_log_bytes=max_log_bytes)


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


def invalidation_ad(name: str, machine: str, pid: int) -> classad2.ClassAd:
    """The INVALIDATE_ADS_GENERIC query removing this process's ad, and no other sidecar's.

    The collector finds the table by TargetType. With a ``Name`` attribute it would remove
    the ad of that name whoever sent it (seen on HTCondor 25); without one it removes the ads
    its Requirements match, so a sidecar that loses the lease to another of the same Name
    withdraws only its own ad.
    """
    ad = classad2.ClassAd()
    ad["MyType"] = "Query"
    ad["TargetType"] = AD_TYPE
    ad["Requirements"] = classad2.ExprTree(
        f"Name == {classad2.quote(name)} && Machine == {classad2.quote(machine)} && CoSchedPid == {int(pid)}")
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


def _sidecar_ads() -> list[classad2.ClassAd]:
    from condor_sched import pool

    return pool.generic_ads(AD_TYPE)


def refuse_if_a_sidecar_runs(param: Callable[[], Mapping[str, str]] = _htcondor_param,
                             query_sidecars: Callable[[], list[classad2.ClassAd]] = _sidecar_ads,
                             clock: Callable[[], float] = time.time,
                             alive: Callable[[int], bool] = lease.sidecar_alive) -> None:
    """``run --once``: raise :class:`lease.LeaseHeld` while another sidecar's lease is live
    (a one-shot cycle checks, without claiming the lease itself)."""
    knobs = DaemonKnobs.from_param(param())
    me = lease.SidecarId(int(clock()), knobs.machine, knobs.name, os.getpid())
    rivals = lease.live_rivals([dict(ad) for ad in query_sidecars()], me, clock(), alive)
    if rivals:
        raise lease.LeaseHeld(lease.refusal(rivals[0], clock()))


class Wakeup:
    """A self-pipe: ``notify`` (safe in a signal handler or another thread) ends a ``wait`` at once."""

    def __init__(self) -> None:
        self._read_fd, self._write_fd = os.pipe()
        os.set_blocking(self._read_fd, False)
        os.set_blocking(self._write_fd, False)
        self._closed = False

    def notify(self) -> None:
        if self._closed:  # the descriptors may belong to another file by now
            return
        try:
            os.write(self._write_fd, b"\0")
        except OSError:  # full: a wake-up is pending anyway; closed: nobody waits
            pass

    def wait(self, timeout_s: float) -> None:
        """Until notified or ``timeout_s`` passes; consumes the notifications."""
        readable, _, _ = select.select([self._read_fd], [], [], max(timeout_s, 0.0))
        if readable:
            try:
                while os.read(self._read_fd, 512):
                    pass
            except BlockingIOError:
                pass

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for fd in (self._read_fd, self._write_fd):
            try:
                os.close(fd)
            except OSError:
                pass


class SidecarDaemon:
    """Cycle, advertise, wait; re-read the configuration on SIGHUP; stop on SIGTERM/SIGQUIT/SIGINT.

    ``configure`` builds the cycle from the current configuration (it reads the COSCHED_*
    knobs); it is called at start and after every reload. A ``dry_run`` daemon advertises
    under a ``dry-run-`` name and takes no lease. Side effects (configuration, collector,
    clock, process check) are injected so the loop is tested without a pool.
    """

    def __init__(self, configure: Callable[[], DaemonCycle], *,
                 param: Callable[[], Mapping[str, str]] = _htcondor_param,
                 reload_config: Callable[[], None] = _reload_config,
                 send: Callable[[classad2.ClassAd, str], None] = _send_to_collector,
                 query_sidecars: Callable[[], list[classad2.ClassAd]] = _sidecar_ads,
                 log_file: LogFile | None = None, poll_s: float = POLL_S, dry_run: bool = False,
                 settle_s: float = lease.SETTLE_S, notices: Notices | None = None,
                 clock: Callable[[], float] = time.time,
                 alive: Callable[[int], bool] = lease.sidecar_alive,
                 negotiator_patience_s: float | None = None) -> None:
        self._configure = configure
        self._param = param
        self._reload_config = reload_config
        self._send = send
        self._query_sidecars = query_sidecars
        self.log_file = log_file or LogFile()
        self._poll_s = poll_s
        self.dry_run = dry_run
        self._settle_s = settle_s
        self.notices = notices or Notices(log)
        self._clock = clock
        self._alive = alive
        self._negotiator_patience_s = negotiator_patience_s
        # Signal handlers only set flags and write to the self-pipe (no lock a handler could
        # deadlock on); the loop reads the flags.
        self._stopping = False
        self._reconfig_requested = False
        self._wake = Wakeup()
        self.knobs = DaemonKnobs.from_param(param(), dry_run)
        self.config: DaemonCycle | None = None
        self.status = DaemonStatus(start_time=int(clock()), pid=os.getpid())
        self.numbers: dict[str, Any] = {}
        self._last_new_cycle_s = time.monotonic()

    # --- signals -------------------------------------------------------------------

    def request_stop(self, *_: Any) -> None:
        self._stopping = True
        self._wake.notify()

    def request_reconfig(self, *_: Any) -> None:
        self._reconfig_requested = True
        self._wake.notify()

    @property
    def stop_requested(self) -> bool:
        """True once asked to stop: a running cycle finishes the job it edits and returns."""
        return self._stopping

    def install_signal_handlers(self) -> None:
        for sig in (signal.SIGTERM, signal.SIGQUIT, signal.SIGINT):
            signal.signal(sig, self.request_stop)
        signal.signal(signal.SIGHUP, self.request_reconfig)

    # --- configuration -------------------------------------------------------------

    def _load(self) -> None:
        """Read the daemon's knobs and build the cycle; raise on a configuration it cannot use."""
        knobs = DaemonKnobs.from_param(self._param(), self.dry_run)
        self.log_file.apply(knobs.log_path, knobs.max_log_bytes)
        self.config = self._configure()
        if knobs.name != self.knobs.name:
            self._invalidate()
        self.knobs = knobs
        self.status = replace(self.status, config_error=self.log_file.problem)   # "" when COSCHED_LOG is used

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

    # --- the loop ------------------------------------------------------------------

    def serve(self) -> None:
        """Cycle until asked to stop, then invalidate the ad. Raises :class:`lease.LeaseHeld`
        when another sidecar holds the pool's lease (at start, or one that started first
        shows up later)."""
        try:
            self._load()
        except Exception as e:
            log.error("cannot start: %s", e)   # to COSCHED_LOG, its fallback or the system log
            self.log_file.close()
            raise
        log.info("started (pid %d) as %s%s", self.status.pid, self.knobs.name,
                 " (dry run: no lease, edits nothing)" if self.dry_run else "")
        try:
            if not self.dry_run:
                self._claim_lease()
            last_end = self._read_cycle_end() if not self._stopping else None
            while not self._stopping:
                if self._reconfig_requested:
                    self._reconfigure()
                if not self.dry_run:
                    self._check_lease()
                self._run_one_cycle()
                if self._stopping:
                    break
                self._advertise()
                last_end = self._wait_for_next_cycle(last_end)
            log.info("stopping after %d cycles", self.status.cycles_run)
        except lease.LeaseHeld as e:
            log.error("refusing to run: %s", e)
            raise
        finally:
            if self.config is not None:
                self._invalidate()
            self._wake.close()
            self.log_file.close()

    def _run_one_cycle(self) -> None:
        assert self.config is not None
        started = time.perf_counter()
        try:
            numbers = dict(self.config.run_cycle())
            error = ""
        except CollectorUnreachable as e:  # no read without the collector; it will come back
            self._collector_down(e)
            numbers, error = self.numbers, f"{type(e).__name__}: {e}"
        except Exception as e:  # a bad moment of the pool; keep going
            self.notices.warn("cycle", f"cycle failed: {e}", kind=f"{type(e).__name__}: {e}")
            numbers, error = self.numbers, f"{type(e).__name__}: {e}"
        else:
            self._collector_up()
            self.notices.clear("cycle", "cycles succeed again")
        self.numbers = numbers
        self.status = replace(self.status, cycles_run=self.status.cycles_run + 1,
                               failed_cycles=self.status.failed_cycles + bool(error),
                               cycle_s=time.perf_counter() - started, last_cycle_time=int(self._clock()),
                               last_error=error)

    def current_ad(self) -> classad2.ClassAd:
        assert self.config is not None
        return sidecar_ad(self.knobs, self.status, self.numbers, self.config.describe,
                          ad_lifetime_s(self.config.interval_s))

    def _advertise(self) -> bool:
        self.status = replace(self.status, update_sequence=self.status.update_sequence + 1)
        ok, _ = self._through_collector(lambda: self._send(self.current_ad(), "UPDATE_AD_GENERIC"), "advertise",
                                        "cannot advertise to the collector",
                                        "the collector takes the sidecar's ad again")
        return ok

    def _invalidate(self) -> None:
        try:
            self._send(invalidation_ad(self.knobs.name, self.knobs.machine, self.status.pid),
                       "INVALIDATE_ADS_GENERIC")
        except Exception as e:
            log.warning("cannot invalidate the ad %s: %s", self.knobs.name, e)

    def _interrupted(self) -> bool:
        return self._stopping or self._reconfig_requested

    # --- the collector and the negotiator ------------------------------------------

    def _through_collector(self, call: Callable[[], Any], key: str, failure: str,
                           recovered: str) -> tuple[bool, Any]:
        """(succeeded, value) of ``call``; the collector going down or up, and ``call``'s own
        failures (``key``), are each told once."""
        try:
            value = call()
        except CollectorUnreachable as e:
            self._collector_down(e)
            return False, None
        except Exception as e:
            self.notices.warn(key, f"{failure}: {e}")
            return False, None
        self._collector_up()
        self.notices.clear(key, recovered)
        return True, value

    def _collector_down(self, e: Exception) -> None:
        self.notices.warn("collector", f"the collector does not answer ({e}): no cycle runs until it does "
                          "(co-scheduled jobs cannot match meanwhile either)", kind="down")

    def _collector_up(self) -> None:
        if self.notices.clear("collector", "the collector answers again"):
            self._last_new_cycle_s = time.monotonic()  # its downtime does not count against the negotiator

    def _read_cycle_end(self) -> int | None:
        """The negotiator's last cycle end (None: none, or the collector did not answer)."""
        if self.config is None or self.config.cycle_end is None:
            return None
        _, end = self._through_collector(self.config.cycle_end, "negotiator-read",
                                         "cannot read the negotiator's last cycle end",
                                         "the negotiator's last cycle end reads again")
        return end

    def _negotiator_quiet(self, end: int | None) -> None:
        """No new negotiation cycle in this poll: warn once when none came for too long."""
        assert self.config is not None
        patience_s = self._negotiator_patience_s or NEGOTIATOR_PATIENCE_INTERVALS * max(self.config.interval_s, 1.0)
        quiet_s = time.monotonic() - self._last_new_cycle_s
        if quiet_s < patience_s or self.notices.active("collector") or self.notices.active("negotiator-read"):
            return
        why = ("the collector has no negotiator ad" if end is None else
               f"LastNegotiationCycleEnd0 stays {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(end))}")
        self.notices.warn("negotiator", f"no new negotiation cycle for {quiet_s:.0f} s ({why}): cycles fall back "
                          f"to every {self.config.interval_s:g} s (COSCHED_INTERVAL); is the negotiator running, "
                          "with NEGOTIATOR_UPDATE_AFTER_CYCLE = True?", kind="quiet")

    def _wait_for_next_cycle(self, last_end: int | None) -> int | None:
        """Until the negotiator ends a cycle after ``last_end`` or ``interval_s`` passes, or a
        signal arrives; returns the cycle end seen."""
        assert self.config is not None
        deadline = time.monotonic() + max(self.config.interval_s, 1.0)
        while not self._interrupted():
            if self.config.cycle_end is not None:
                end = self._read_cycle_end()
                if end is not None and end != last_end:
                    self._last_new_cycle_s = time.monotonic()
                    self.notices.clear("negotiator", "negotiation cycles are followed again")
                    return end
                if not self.notices.active("collector"):
                    self._negotiator_quiet(end)
            left = deadline - time.monotonic()
            if left <= 0:
                return last_end
            self._wake.wait(min(self._poll_s, left))
        return last_end

    # --- the lease -----------------------------------------------------------------

    def _me(self) -> lease.SidecarId:
        return lease.SidecarId(self.status.start_time, self.knobs.machine, self.knobs.name, self.status.pid)

    def _rivals(self) -> list[lease.Rival]:
        ads = [dict(ad) for ad in self._query_sidecars()]
        return lease.live_rivals(ads, self._me(), self._clock(), self._alive)

    def _claim_lease(self) -> None:
        """Refuse if another sidecar's lease is live; else advertise, let rivals that claimed at
        the same moment show up, and yield to one that started first. Waits while the
        collector does not answer (nothing can run without it)."""
        while not self._stopping:
            try:
                rivals = self._rivals()
                if rivals:
                    raise lease.LeaseHeld(lease.refusal(rivals[0], self._clock()))
                self._send(self.current_ad(), "UPDATE_AD_GENERIC")
                self._wake.wait(self._settle_s)
                first = lease.first_rival_before(self._rivals(), self._me())
            except CollectorUnreachable as e:
                self._collector_down(e)
                self._wake.wait(min(max(self.config.interval_s if self.config else 5.0, 1.0), 5.0))
                continue
            self._collector_up()
            if first is not None:
                raise lease.LeaseHeld(lease.refusal(first, self._clock()) + " (it started first)")
            log.info("holds the pool's sidecar lease (ad %s, lease %d s)", self.knobs.name,
                     ad_lifetime_s(self.config.interval_s) if self.config else 0)
            return

    def _check_lease(self) -> None:
        """Before a cycle: stop if a live rival started first; note once one that must yield."""
        try:
            rivals = self._rivals()
        except CollectorUnreachable as e:
            self._collector_down(e)
            return
        me = self._me()
        first = lease.first_rival_before(rivals, me)
        if first is not None:
            raise lease.LeaseHeld(lease.refusal(first, self._clock()) + " (it started first; this one stops)")
        self.notices.settle("rival", {
            f"{r.id.machine}/{r.id.name}/{r.id.pid}": f"another sidecar runs: {r.describe(self._clock())}; "
            "it started later and stops at its next cycle" for r in rivals},
            ended=lambda who: f"the other sidecar {who} is gone")
