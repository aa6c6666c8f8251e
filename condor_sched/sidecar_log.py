"""The sidecar's own log, COSCHED_LOG, and where its words go when that file cannot be written.

A condor_master sends a non-DaemonCore daemon's stdout and stderr to /dev/null and logs only
its exit status, so a sidecar that could not open COSCHED_LOG would fail unseen. It does not:

1. COSCHED_LOG, bounded by MAX_COSCHED_LOG with one ``.old`` file, as HTCondor's own logs;
2. else ``<COSCHED_LOG>.<account>`` beside it (the case of a log left by another account,
   e.g. root before ``COSCHED_SIDECAR_USERID`` was set), whose first line says why; the
   sidecar runs on and its ad's CoSchedConfigError says where it logs;
3. else the system log (``journalctl -t condor-sched``), and the sidecar refuses to start
   (SettingsError naming COSCHED_LOG), so the error is there and in the master's log's exit line.
"""
from __future__ import annotations

import logging
import logging.handlers
import os
import pwd
import stat

from condor_sched.settings import SettingsError

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
#: The system log's socket and the name the sidecar's lines carry there.
SYSLOG_SOCKET = "/dev/log"
SYSLOG_IDENT = "condor-sched"

log = logging.getLogger(__name__)


def _old_log_name(default_name: str) -> str:
    """HTCondor keeps one rotated log as ``<log>.old``; RotatingFileHandler would say ``.1``."""
    return default_name[:-2] + ".old" if default_name.endswith(".1") else default_name


def account_name() -> str:
    """The name of the account this process runs as (its uid when it has none)."""
    try:
        return pwd.getpwuid(os.geteuid()).pw_name
    except KeyError:
        return str(os.geteuid())


def fallback_log_path(log_path: str) -> str:
    """Where the sidecar logs when COSCHED_LOG cannot be opened: beside it, named for its account."""
    return f"{log_path}.{account_name()}"


class LogFile:
    """The root logger's handler for COSCHED_LOG: bounded, replaced when the knobs change.

    ``problem`` says, after ``apply``, why the sidecar does not log to COSCHED_LOG itself
    ("" when it does), for the ad's CoSchedConfigError and ``condor-sched doctor``."""

    def __init__(self, syslog_socket: str = SYSLOG_SOCKET) -> None:
        self.handler: logging.Handler | None = None
        self.path = ""
        self.problem = ""
        self._knobs: tuple[str, int] | None = None
        self._syslog_socket = syslog_socket

    def apply(self, log_path: str, max_log_bytes: int) -> None:
        if self._knobs == (log_path, max_log_bytes):
            return
        self.close()
        self._knobs = (log_path, max_log_bytes)
        if not log_path:
            return
        try:
            self._attach(self._open(log_path, max_log_bytes), log_path)
            return
        except OSError as e:
            self.problem = f"COSCHED_LOG = {log_path}: {e.strerror or e}"
        fallback = fallback_log_path(log_path)
        try:
            self._attach(self._open(fallback, max_log_bytes), fallback)
        except OSError as e:
            self.problem += f"; {fallback}: {e.strerror or e}"
            self._attach_syslog()
            raise SettingsError(self.problem) from None
        self.problem += f"; logging to {fallback} instead"
        log.warning("%s (fix: make COSCHED_LOG writable by %s, or point it elsewhere)", self.problem,
                    account_name())

    @staticmethod
    def _open(path: str, max_log_bytes: int) -> logging.Handler:
        handler = logging.handlers.RotatingFileHandler(path, maxBytes=max_log_bytes, backupCount=1)
        handler.namer = _old_log_name
        return handler

    def _attach(self, handler: logging.Handler, path: str) -> None:
        handler.setFormatter(logging.Formatter(LOG_FORMAT))
        logging.getLogger().addHandler(handler)
        self.handler, self.path = handler, path

    def _attach_syslog(self) -> None:
        """The last place left: the system log (journald keeps what the master drops), when
        this host has one listening."""
        try:
            if not stat.S_ISSOCK(os.stat(self._syslog_socket).st_mode):
                return
        except OSError:
            return
        try:
            handler = logging.handlers.SysLogHandler(address=self._syslog_socket,
                                                     facility=logging.handlers.SysLogHandler.LOG_DAEMON)
        except OSError:
            return
        handler.ident = f"{SYSLOG_IDENT}: "
        self._attach(handler, f"syslog:{self._syslog_socket}")

    def close(self) -> None:
        if self.handler is not None:
            logging.getLogger().removeHandler(self.handler)
            self.handler.close()
            self.handler = None
        self.path, self.problem = "", ""
        self._knobs = None
