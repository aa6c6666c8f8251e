"""The node agent's state dir: root-only, so no job can fill it, plant in it or lock it.

Layout (``/var/lib/condor_sched/<node>``, or ``state_dir`` in the node config)::

    DIR/                   root 0755  refused if not the agent's or group/other-writable
    DIR/agent.lock         root 0600  flock()ed by the running agent for its lifetime: one
                                      agent per node, and no other user can even open it
    DIR/agent.sock         root 0666  Unix socket: the PREPARE_JOB hook asks the agent for
                                      its job's start here (``channel``)
    DIR/jobs.json          root 0644  the agent's records of running jobs (placements, watches)
    DIR/devices/<dev>.json root 0644  allocations and measured memory per device (startd cron)
    DIR/killed/<job>.json  root 0644  why the agent stopped a job
    DIR/cpusets.json       root 0644  node-sharing nodes: whether the agent can set cpusets, the
                                      CPUs lent to guests whose mates ended, each claim's CPUs
    DIR/agent.heartbeat    root 0644  rewritten every interval (the startd cron checks its age)
    DIR/agent.log          root 0644  the agent's log (every start it placed, every refusal)

Nothing in it is writable by anyone but root: earlier versions kept a world-writable,
sticky ``requests/`` directory and lock file there, which a job could fill, forge or hold
(issue 10); the agent removes them at start.
"""

from __future__ import annotations

import datetime
import errno
import fcntl
import json
import os
import shutil
import stat
import sys
import tempfile
from typing import Any, Optional, Tuple

from cosched_node.errors import StateError

SOCKET_NAME = "agent.sock"
LOCK_NAME = "agent.lock"
JOBS_NAME = "jobs.json"
HEARTBEAT_NAME = "agent.heartbeat"
LOG_NAME = "agent.log"
SUBDIRS = ("devices", "killed")
#: Left by versions before issue 10; world-writable, so removed at start.
LEGACY = ("requests", "spread", "lock", "hooks.log")
MAX_STATE_FILE_BYTES = 1 << 22


def _ours(info: os.stat_result) -> bool:
    return info.st_uid == os.geteuid() and not info.st_mode & 0o022


def prepare_state_dir(state_dir: str) -> None:
    """Create (or check) the layout above; StateError when a part is not root's own."""
    os.makedirs(state_dir, mode=0o755, exist_ok=True)
    info = os.lstat(state_dir)
    if not stat.S_ISDIR(info.st_mode) or not _ours(info):
        raise StateError(0, f"{state_dir} must be a directory owned by uid {os.geteuid()}, "
                            "not group/other-writable")
    for name in LEGACY:
        path = os.path.join(state_dir, name)
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path, ignore_errors=True)
        elif os.path.lexists(path):
            os.unlink(path)
    for name in SUBDIRS:
        path = os.path.join(state_dir, name)
        if not os.path.lexists(path):
            os.mkdir(path, 0o755)
        sub = os.lstat(path)
        if not stat.S_ISDIR(sub.st_mode) or sub.st_uid != os.geteuid():
            raise StateError(0, f"{path} is not our directory")
        os.chmod(path, 0o755)


class AgentLock:
    """The agent's lifetime lock on DIR/agent.lock (mode 0600: only root can open it)."""

    def __init__(self, state_dir: str) -> None:
        self.path = os.path.join(state_dir, LOCK_NAME)
        self.fd = -1

    def acquire(self) -> None:
        """StateError when another agent holds it, or the file is not root's own."""
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_uid != os.geteuid():
            os.close(fd)
            raise StateError(0, f"{self.path} is not our file")
        os.fchmod(fd, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(fd)
            if exc.errno in (errno.EAGAIN, errno.EACCES):
                raise StateError(exc.errno, f"{self.path} is held: another node agent runs") from None
            raise
        self.fd = fd

    def release(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def read_small_file(directory: str, name: str, limit: int = MAX_STATE_FILE_BYTES) -> Tuple[bytes, os.stat_result]:
    """Read a regular, single-link file without following symlinks; raises OSError/ValueError."""
    fd = os.open(os.path.join(directory, name), os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_nlink != 1:
            raise ValueError("not a plain regular file")
        if info.st_size > limit:
            raise ValueError("too large")
        data = os.read(fd, limit + 1)
        if len(data) > limit:
            raise ValueError("too large")
        return data, info
    finally:
        os.close(fd)


def read_json(directory: str, name: str, limit: int = MAX_STATE_FILE_BYTES) -> Optional[Any]:
    """A JSON file the agent wrote, or None when missing or unreadable."""
    try:
        data, _ = read_small_file(directory, name, limit)
        return json.loads(data.decode("utf-8"))
    except (OSError, ValueError, RecursionError):
        return None


def write_json_atomic(directory: str, name: str, obj: Any, mode: int = 0o644) -> None:
    """Write tmp + fsync + rename, never following a symlink planted at the tmp name."""
    tmp = os.path.join(directory, f".tmp.{name}.{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            json.dump(obj, handle, sort_keys=True)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, mode)
        os.rename(tmp, os.path.join(directory, name))
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def replace_file(path: str, text: str, mode: int = 0o644) -> None:
    """Replace ``path`` by ``text`` through a temporary file in its directory (created if
    missing), fsync and a rename, so no reader ever sees half a file and a failed write
    leaves the old one; root-owned when run as root (the node config, the slot layout)."""
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, mode=0o755, exist_ok=True)
    fd, temporary = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            if os.geteuid() == 0:
                os.fchown(handle.fileno(), 0, 0)
            os.fchmod(handle.fileno(), mode)
            os.fsync(handle.fileno())
        os.replace(temporary, path)
    except BaseException:
        try:
            os.unlink(temporary)
        except OSError:
            pass
        raise
    directory_fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(directory_fd)
    finally:
        os.close(directory_fd)


def log_line(path: Optional[str], program: str, message: str) -> None:
    """One line per event: to the log file when given and writable, else stderr."""
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    safe = "".join(ch if 32 <= ord(ch) < 127 else "?" for ch in message)[:2000]
    line = f"{stamp} {program}[{os.getpid()}] {safe}\n"
    if path:
        try:
            fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o644)
            try:
                os.write(fd, line.encode("ascii"))
                return
            finally:
                os.close(fd)
        except OSError:
            pass
    try:
        sys.stderr.write(line)
        sys.stderr.flush()
    except (OSError, ValueError):
        pass
