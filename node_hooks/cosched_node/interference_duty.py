"""Interference profiles (paper 004, Section 3.3, step 2: a job's profile from a dedicated run):
the software signals of every job while it runs alone on its node, written per run for the
sidecar's model.

Standard library only. What the agent trusts: the owner comes from the startd's claim
(``RemoteUser``, set by the schedd, up to its ``@``), the program from ``/proc/<pid>/exe`` of the
job's oldest process (the binary the kernel runs; a running binary cannot be rewritten, and the
name a job gives itself plays no part), the signals from ``/proc``. A job writes nothing the
agent reads. Only intervals in which the job is the node's only claim count (the paper's
dedicated runs: a co-runner distorts every signal), and a record is written when the job ends
after at least ``MIN_ALONE_INTERVALS`` of them. A script profiles as its interpreter (its
``exe``), so scripts of one interpreter share a profile; the sidecar then finds none for them
(it hashes the script) and allows them, as any program without a profile.

Signals, as the measured dataset names them (``condor_sched.interference.dataset``), summed over
the job's processes and divided by the alone wall time: CPU shares in user and system mode, minor
and major faults, voluntary and involuntary switches, scheduler wait share and timeslices
(``/proc/<pid>/schedstat``), the perf software events they equal (context switches, page faults,
CPU migrations from ``/proc/<pid>/sched``), peak resident memory (``VmHWM``, log2 MiB) and the
node's pressure stall shares (``/proc/pressure``).

Every interval the agent also publishes the owner and binary of every running job, alone or
not, in ``DIR/interference.json`` (``{"updated": t, "jobs": {"12.0": "alice <sha256>"}}``), which
the startd cron hook advertises as ``CoSchedJobExe_<cluster>_<proc> = "alice <sha256>"``: the
sidecar knows what each running job runs, covered by a mode or not, from root's reading, never
from the job's ad.

Record, ``<profile-dir>/interference/<owner>/<sha256>/<ClusterId>.<ProcId>.json``::

    {"version": 1, "owner": "alice", "exe_sha256": "9f2c...", "job": "12.0", "node": "node1",
     "alone_s": 120.0, "intervals": 12, "signals": {"user_share": 0.97, ...}}
"""

from __future__ import annotations

import hashlib
import math
import os
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Dict, List, Optional, Tuple

from cosched_node import procs
from cosched_node.rules import JOB_ID_RE, OWNER_RE, SHA256_RE
from cosched_node.runs import safe_subdir
from cosched_node.state import write_json_atomic

if TYPE_CHECKING:
    from cosched_node.jobs import Running

RECORD_VERSION = 1
SUBDIR = "interference"
STATE_NAME = "interference.json"
MIN_ALONE_INTERVALS = 3
#: A larger executable is not hashed (no profile for it): hashing must not stall the agent.
MAX_EXE_BYTES = 512 * 1024 * 1024
RECORD_NAME_RE = re.compile(r"^\d{1,12}\.\d{1,9}\.json$")
#: Jobs advertised per node at most (a node runs a few dozen at most).
MAX_PUBLISHED = 256
#: Cumulative per-process counters (what is summed over a job's processes).
COUNTERS = ("user_s", "system_s", "minor_faults", "major_faults", "voluntary_switches", "involuntary_switches",
            "sched_wait_ns", "sched_timeslices", "migrations")
PRESSURE = ("cpu", "memory", "io")


def _read(path: str) -> Optional[str]:
    try:
        with open(path, "r", encoding="ascii", errors="replace") as handle:
            return handle.read(65536)
    except OSError:
        return None


def process_counters(pid: int, proc_root: str = "/proc") -> Optional[Dict[str, float]]:
    """One process's cumulative counters and peak memory, or None when it is gone."""
    stat = _read(f"{proc_root}/{pid}/stat")
    status = _read(f"{proc_root}/{pid}/status")
    if stat is None or status is None or ")" not in stat:
        return None
    fields = stat.rsplit(")", 1)[1].split()
    tick = float(os.sysconf("SC_CLK_TCK"))
    try:
        out = {"minor_faults": float(fields[7]), "major_faults": float(fields[9]),
               "user_s": int(fields[11]) / tick, "system_s": int(fields[12]) / tick}
    except (IndexError, ValueError):
        return None
    named = {}
    for line in status.splitlines():
        key, _, value = line.partition(":")
        named[key.strip()] = value.split()
    try:
        out["voluntary_switches"] = float(named["voluntary_ctxt_switches"][0])
        out["involuntary_switches"] = float(named["nonvoluntary_ctxt_switches"][0])
        out["peak_kib"] = float(named.get("VmHWM", ["0"])[0])
    except (KeyError, IndexError, ValueError):
        return None
    schedstat = (_read(f"{proc_root}/{pid}/schedstat") or "").split()
    out["sched_wait_ns"] = float(schedstat[1]) if len(schedstat) >= 3 and schedstat[1].isdigit() else 0.0
    out["sched_timeslices"] = float(schedstat[2]) if len(schedstat) >= 3 and schedstat[2].isdigit() else 0.0
    match = re.search(r"^se\.nr_migrations\s*:\s*(\d+)", _read(f"{proc_root}/{pid}/sched") or "", re.M)
    out["migrations"] = float(match.group(1)) if match else 0.0
    return out


def pressure_totals(proc_root: str = "/proc") -> Dict[str, float]:
    """``some total`` (µs) of each pressure file that exists (system-wide)."""
    out = {}
    for name in PRESSURE:
        for line in (_read(f"{proc_root}/pressure/{name}") or "").splitlines():
            if line.startswith("some ") and "total=" in line:
                try:
                    out[name] = float(line.rsplit("total=", 1)[1])
                except ValueError:
                    pass
    return out


def exe_sha256(pid: int, proc_root: str = "/proc", limit: int = MAX_EXE_BYTES) -> Optional[str]:
    """The sha256 of the binary process ``pid`` runs, or None (gone, unreadable, too large)."""
    digest = hashlib.sha256()
    size = 0
    try:
        with open(f"{proc_root}/{pid}/exe", "rb") as handle:
            while True:
                chunk = handle.read(1 << 20)
                if not chunk:
                    break
                size += len(chunk)
                if size > limit:
                    return None
                digest.update(chunk)
    except OSError:
        return None
    return digest.hexdigest()


def owner_of(remote_user: str) -> Optional[str]:
    """The owner part of a claim's ``RemoteUser`` (``alice@domain``), when a plain name."""
    owner = remote_user.split("@", 1)[0]
    return owner if OWNER_RE.match(owner) else None


@dataclass
class AloneWindow:
    """What one job accumulated while alone on the node."""

    exe: Optional[str] = None
    seconds: float = 0.0
    intervals: int = 0
    totals: Dict[str, float] = field(default_factory=dict)
    peak_kib: float = 0.0
    #: The last reading: (time, per-process counters by (pid, start), pressure totals); None
    #: when the job was not alone at the last interval (the next one starts a new reading).
    last: Optional[Tuple[float, Dict[Tuple[int, int], Dict[str, float]], Dict[str, float]]] = None


def signals(window: AloneWindow) -> Dict[str, float]:
    """The window's signals per second, as the dataset names them (module docstring)."""
    t = window.totals
    per = 1.0 / window.seconds
    out = {"user_share": t.get("user_s", 0.0) * per, "system_share": t.get("system_s", 0.0) * per,
           "minor_faults_per_s": t.get("minor_faults", 0.0) * per,
           "major_faults_per_s": t.get("major_faults", 0.0) * per,
           "voluntary_switches_per_s": t.get("voluntary_switches", 0.0) * per,
           "involuntary_switches_per_s": t.get("involuntary_switches", 0.0) * per,
           "sched_wait_share": t.get("sched_wait_ns", 0.0) / 1e9 * per,
           "sched_timeslices_per_s": t.get("sched_timeslices", 0.0) * per,
           "perf_context_switches_per_s": (t.get("voluntary_switches", 0.0) + t.get("involuntary_switches", 0.0)) * per,
           "perf_page_faults_per_s": (t.get("minor_faults", 0.0) + t.get("major_faults", 0.0)) * per,
           "perf_cpu_migrations_per_s": t.get("migrations", 0.0) * per,
           "log2_peak_rss_mib": math.log2(max(window.peak_kib, 1024.0) / 1024.0)}
    for name in PRESSURE:
        out[f"pressure_{name}"] = t.get(f"pressure_{name}", 0.0) / 1e6 * per
    return {k: round(v, 6) for k, v in out.items()}


class InterferenceDuty:
    """The agent's part: sample each job alone on the node, write its record when it ends.

    Mixed into :class:`~cosched_node.agent.Agent`, which provides ``records``, ``config``,
    ``state_dir``, ``profile_dir``, ``proc_root`` and ``log``."""

    def init_interference(self) -> None:
        self.alone_windows: Dict[str, AloneWindow] = {}
        self.exe_of: Dict[str, str] = {}

    def watch_interference(self, table: Dict[int, "procs.Proc"], now: float) -> None:
        """One interval: publish each running job's binary; the lone job's counters since the
        last interval, when it was alone then too."""
        live = set(self.records)
        for cache in (self.alone_windows, self.exe_of):
            for key in [k for k in cache if k not in live]:
                del cache[key]
        for key, record in self.records.items():
            if key not in self.exe_of:
                members = procs.job_processes(record.starter_pid, record.starter_start, table)
                exe = exe_sha256(min(members, key=lambda p: p.start).pid, self.proc_root) if members else None
                if exe is not None:
                    self.exe_of[key] = exe
        published = {}
        for key, record in self.records.items():
            owner = owner_of(record.claim.remote_user)
            if key in self.exe_of and owner is not None and JOB_ID_RE.match(record.claim.job):
                published[record.claim.job] = f"{owner} {self.exe_of[key]}"
        write_json_atomic(self.state_dir, STATE_NAME, {"updated": now, "jobs": published})
        if not self.profile_dir:
            return
        if len(self.records) != 1:
            for window in self.alone_windows.values():
                window.last = None
            return
        (key, record), = self.records.items()
        window = self.alone_windows.setdefault(key, AloneWindow())
        members = procs.job_processes(record.starter_pid, record.starter_start, table)
        if not members:
            window.last = None
            return
        window.exe = self.exe_of.get(key)
        reading = {}
        for proc in members:
            counters = process_counters(proc.pid, self.proc_root)
            if counters is not None:
                reading[(proc.pid, proc.start)] = counters
                window.peak_kib = max(window.peak_kib, counters["peak_kib"])
        pressure = pressure_totals(self.proc_root)
        if window.last is not None and now > window.last[0]:
            then, before, pressure_before = window.last
            for pid_key, counters in reading.items():
                earlier = before.get(pid_key, {})
                for name in COUNTERS:
                    window.totals[name] = window.totals.get(name, 0.0) + max(0.0, counters[name] - earlier.get(name, 0.0))
            for name, total in pressure.items():
                if name in pressure_before:
                    window.totals[f"pressure_{name}"] = (window.totals.get(f"pressure_{name}", 0.0)
                                                         + max(0.0, total - pressure_before[name]))
            window.seconds += now - then
            window.intervals += 1
        window.last = (now, reading, pressure)

    def interference_ended(self, record: "Running") -> Optional[str]:
        """Write the ended job's record when it ran alone long enough; the path, or None."""
        window = self.alone_windows.pop(record.key, None)
        if not self.profile_dir or window is None or window.intervals < MIN_ALONE_INTERVALS or window.exe is None:
            return None
        owner, job = owner_of(record.claim.remote_user), record.claim.job
        if owner is None or not JOB_ID_RE.match(job) or not SHA256_RE.match(window.exe):
            return None
        body = {"version": RECORD_VERSION, "owner": owner, "exe_sha256": window.exe, "job": job,
                "node": self.config.node, "alone_s": round(window.seconds, 3), "intervals": window.intervals,
                "signals": signals(window)}
        try:
            directory = safe_subdir(safe_subdir(safe_subdir(self.profile_dir, SUBDIR), owner), window.exe)
            write_json_atomic(directory, f"{job}.json", body, 0o644)
        except (OSError, ValueError) as exc:
            self.log(f"job {job}: interference profile not written: {getattr(exc, 'strerror', None) or exc}")
            return None
        path = os.path.join(directory, f"{job}.json")
        self.log(f"job {job}: interference profile {path} ({window.intervals} intervals alone)")
        return path


def _names(path: str, pattern: "re.Pattern[str]") -> List[str]:
    try:
        return sorted(n for n in os.listdir(path) if pattern.match(n))
    except OSError:
        return []


def records_of(profile_dir: str) -> List[str]:
    """Every record path under ``<profile_dir>/interference`` (owner/sha256/<job id>.json),
    sorted; what the agents write and the sidecar reads (``live_profiles``)."""
    root = os.path.join(profile_dir, SUBDIR)
    return [os.path.join(root, owner, exe, name)
            for owner in _names(root, OWNER_RE)
            for exe in _names(os.path.join(root, owner), SHA256_RE)
            for name in _names(os.path.join(root, owner, exe), RECORD_NAME_RE)]


#: ``CoSchedJobExe_<cluster>_<proc>``'s value: the owner and the sha256, one space apart.
PUBLISHED_RE = re.compile(r"^([A-Za-z0-9_][A-Za-z0-9_.-]{0,63}) ([0-9a-f]{64})$")


def published_lines(state: object, now: float, max_age_s: float) -> List[str]:
    """``CoSchedJobExe_<cluster>_<proc> = "<owner> <sha256>"`` from the agent's
    DIR/interference.json when fresh; valid job ids, owners and hashes only, at most
    ``MAX_PUBLISHED`` jobs."""
    from cosched_node.ads import format_line

    if not isinstance(state, dict):
        return []
    updated, jobs = state.get("updated"), state.get("jobs")
    if isinstance(updated, bool) or not isinstance(updated, (int, float)) or not 0 <= now - updated <= max_age_s \
            or not isinstance(jobs, dict):
        return []
    good = sorted((job, exe) for job, exe in jobs.items()
                  if isinstance(job, str) and JOB_ID_RE.match(job) and isinstance(exe, str) and PUBLISHED_RE.match(exe))
    return [format_line(f"CoSchedJobExe_{job.replace('.', '_')}", exe) for job, exe in good[:MAX_PUBLISHED]]
