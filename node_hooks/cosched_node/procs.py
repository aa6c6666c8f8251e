"""Processes, as /proc shows them: what no job can forge (pids, parents, start times, uids).

A job's processes are the descendants of its starter (the pid the startd reports for the
claim, checked by its start time so a reused pid is never taken for it) that run as
neither root nor the starter's own user. Only those are ever signalled.
"""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass
from typing import Dict, Iterable, List, Optional

PID_MAX = 4194304  # PID_MAX_LIMIT on 64-bit Linux


@dataclass(frozen=True)
class Proc:
    pid: int
    ppid: int
    pgid: int
    uid: int          # real uid
    euid: int
    start: int        # clock ticks since boot (field 22 of /proc/<pid>/stat)
    comm: str


def read_proc(pid: int, proc_root: str = "/proc") -> Optional[Proc]:
    """A live, non-zombie process, or None."""
    try:
        with open(f"{proc_root}/{int(pid)}/stat", "rb") as handle:
            data = handle.read(4096).decode("utf-8", "replace")
        with open(f"{proc_root}/{int(pid)}/status", "rb") as handle:
            status = handle.read(16384).decode("utf-8", "replace")
    except OSError:
        return None
    comm = data[data.find("(") + 1:data.rfind(")")]
    fields = data[data.rfind(")") + 2:].split()
    if len(fields) < 20 or fields[0] in ("Z", "X"):
        return None
    uids = next((line.split()[1:3] for line in status.splitlines() if line.startswith("Uid:")), None)
    try:
        if not uids or len(uids) < 2:
            return None
        return Proc(int(pid), int(fields[1]), int(fields[2]), int(uids[0]), int(uids[1]), int(fields[19]), comm)
    except ValueError:
        return None


def process_table(proc_root: str = "/proc") -> Dict[int, Proc]:
    table = {}
    for entry in os.listdir(proc_root):
        if entry.isdigit() and len(entry) < 8:
            proc = read_proc(int(entry), proc_root)
            if proc:
                table[proc.pid] = proc
    return table


def start_time(pid: int, proc_root: str = "/proc") -> Optional[int]:
    proc = read_proc(pid, proc_root)
    return proc.start if proc else None


def is_alive(pid: int, start: int, proc_root: str = "/proc") -> bool:
    """The process ``pid`` that started at ``start`` still runs (pid reuse is not)."""
    return start_time(pid, proc_root) == start


def job_processes(starter_pid: int, starter_start: int, table: Dict[int, Proc]) -> List[Proc]:
    """The starter's descendants that run as the job's user (not root, not the starter's uid)."""
    starter = table.get(starter_pid)
    if starter is None or starter.start != starter_start:
        return []
    privileged = {0, starter.uid, starter.euid}
    found = []
    for proc in table.values():
        if proc.pid <= 1 or proc.pid == os.getpid() or proc.uid in privileged or proc.euid in privileged:
            continue
        ancestor, depth = proc.ppid, 0
        while ancestor > 1 and ancestor != starter_pid and ancestor in table and depth < 256:
            ancestor, depth = table[ancestor].ppid, depth + 1
        if ancestor == starter_pid:
            found.append(proc)
    return found


def signal_job(starter_pid: int, starter_start: int, signum: int, proc_root: str = "/proc") -> List[int]:
    """Send ``signum`` to the job's processes (a group only when its leader is one); pids signalled."""
    members = job_processes(starter_pid, starter_start, process_table(proc_root))
    pids = {p.pid for p in members}
    signalled = []
    for proc in members:
        try:
            if proc.pgid == proc.pid and proc.pgid > 1:
                os.killpg(proc.pgid, signum)
            elif proc.pgid not in pids:
                os.kill(proc.pid, signum)
            signalled.append(proc.pid)
        except (ProcessLookupError, PermissionError):
            pass
    return signalled


def stop_job(starter_pid: int, starter_start: int, grace_s: float, proc_root: str = "/proc") -> List[int]:
    """SIGTERM the job's processes, then SIGKILL whatever remains after ``grace_s``."""
    signalled = signal_job(starter_pid, starter_start, signal.SIGTERM, proc_root)
    deadline = time.monotonic() + grace_s
    while signalled and time.monotonic() < deadline:
        if not job_processes(starter_pid, starter_start, process_table(proc_root)):
            return signalled
        time.sleep(0.1)
    return signalled + signal_job(starter_pid, starter_start, signal.SIGKILL, proc_root)


def task_ids(pids: Iterable[int], proc_root: str = "/proc") -> List[int]:
    """Every thread id of the given processes: resctrl ``tasks`` takes threads."""
    tids = set()
    for pid in pids:
        tids.add(pid)
        try:
            names = os.listdir(f"{proc_root}/{int(pid)}/task")
        except OSError:
            continue
        tids.update(int(n) for n in names if n.isdigit() and len(n) < 8)
    return sorted(t for t in tids if 2 <= t <= PID_MAX)


def boot_time(proc_root: str = "/proc") -> Optional[float]:
    try:
        with open(f"{proc_root}/stat", "rb") as handle:
            for line in handle.read(1 << 16).decode("ascii", "replace").splitlines():
                if line.startswith("btime "):
                    return float(int(line.split()[1]))
    except (OSError, ValueError, IndexError):
        return None
    return None


def wall_start(start_ticks: int, proc_root: str = "/proc") -> Optional[float]:
    """Epoch seconds of a process start given in clock ticks since boot."""
    btime = boot_time(proc_root)
    return None if btime is None else btime + start_ticks / float(os.sysconf("SC_CLK_TCK"))
