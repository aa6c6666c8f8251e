#!/usr/bin/python3
"""Node agent: COSMIC's enforcement on one execute node (Section IV-D2 of paper 002).

Runs as ROOT under the execute node's condor_master (SIGTERM stops it cleanly).  Each
interval it
  1. under DIR/lock, validates every request file the PREPARE_JOB hook wrote (hostile: a
     job's user wrote it) and deletes malformed ones, forged ones (starter pid not a
     ``--starter-comm`` process) and those of ended jobs (starter gone or pid reused);
  2. reads the device-memory usage probe per job and STOPS a job whose device memory use
     exceeds its RequestPhiMemory: SIGTERM, then SIGKILL after ``--kill-grace``, recorded in
     DIR/killed/<job>.json and the agent log;
  3. publishes DIR/devices/<dev>.json (allocations, measured use) and DIR/agent.heartbeat;
  4. for spread (SNS, paper 000) jobs: keeps one resctrl group per job (cluster and owning
     uid: ``cosched_<ClusterId>-uid<uid>``) under ``--resctrl-root`` (default
     /sys/fs/resctrl) in step with the live spread requests (cosched_resctrl.ResctrlManager
     .sync: on each cache id the job runs on, a contiguous mask of the sum of its procs'
     ways there (``group_shares``), unallocated ways given away equally and reclaimed when a
     job arrives, the group removed when the job's last proc ends; the validated processes'
     task ids written to its ``tasks``).  resctrl absent: logged once, jobs run ungrouped.  No CLOSID left:
     the job runs ungrouped, logged.  The agent's watch of each spread job (co-runners on
     its socket slot, perf samples) lives in DIR/spread/<request file>;
  5. piggyback profiling: when a spread job ends, writes its run record (format:
     cosched_profile_record) to ``<--profile-dir>/runs/<program>/<ClusterId>.<ProcId>.json``:
     program, scale factor, nodes (if the sidecar said), runtime from the starter's start to
     the end the agent saw, ``exclusive`` (no other job's request on its socket slot while it
     ran, watched from its start) and, when ``perf`` exists (``--perf``), IPC
     (instructions/cycles of the job's processes, ``perf stat -p``) and memory bandwidth
     (uncore IMC CAS counts, ``perf stat -a``, sampled only while the job is alone on the
     node), sampled for ``--perf-sample`` s each interval while the job runs exclusive.

A process is signalled only if ALL hold: pid > 1 and not ours; its real uid is the uid
that owns the request file; it descends from the request's starter pid (whose start time
matches); its environment has ``_CONDOR_SCRATCH_DIR`` equal to the request's scratch dir.
Process groups are signalled only when their leader passed the same checks.

Probes: ``file`` reads ``<probe-dir>/<device>/<ClusterId>.<ProcId>`` (integer MB, per job);
``micsmc`` parses ``micsmc -f`` (device-wide used memory only: logged, not attributable to
a job, so it never kills); ``sysfs`` reads /sys/class/mic/<dev> inventory (no usage).

Exit codes: 0 stopped by SIGTERM/SIGINT or --once done; 2 bad arguments or node config;
5 state dir unsafe (exists but not owned by us, or group/other-writable).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import shutil
import signal
import stat
import subprocess
import sys
import time
from typing import Callable, Dict, List, Optional, Sequence, Tuple

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import cosched_node as cn  # noqa: E402
import cosched_profile_record as profile_record  # noqa: E402
import cosched_resctrl as resctrl  # noqa: E402

PROGRAM = "cosched_node_agent"
Log = Callable[[str], None]


# ---------------------------------------------------------------------------------------
# Probes

class FileProbe:
    """Per-job device memory in ``<probe_dir>/<device>/<ClusterId>.<ProcId>`` (integer MB)."""
    name = "file"

    def __init__(self, probe_dir: str) -> None:
        self.probe_dir = probe_dir

    def job_usage_mb(self, device: str, cluster: int, proc: int) -> Optional[int]:
        if not cn.DEVICE_RE.match(device):
            return None
        try:
            data, _ = cn.read_small_file(os.path.join(self.probe_dir, device), f"{int(cluster)}.{int(proc)}", 64)
            text = data.decode("ascii").strip()
        except (OSError, ValueError):
            return None
        return int(text) if re.match(r"^\d{1,15}$", text) else None

    def device_usage_mb(self, device: str) -> Optional[int]:
        return None


def parse_micsmc(text: str) -> Dict[str, Dict[str, float]]:
    """``micsmc -f`` text -> {device: {"free_mb", "total_mb", "used_mb"}} (MB)."""
    devices: Dict[str, Dict[str, float]] = {}
    current: Optional[str] = None
    keys = {"free memory": "free_mb", "total memory": "total_mb", "memory usage": "used_mb"}
    for line in text.splitlines():
        header = re.match(r"^\s*(mic\d{1,3})\s*(\(.*\))?\s*:\s*$", line)
        if header:
            current = header.group(1)
            devices.setdefault(current, {})
            continue
        value = re.match(r"^\s*([A-Za-z ]+?)\s*:[\s.]*([0-9]+(?:\.[0-9]+)?)\s*(kB|KB|MB|GB)\s*$", line)
        if current and value and value.group(1).lower() in keys:
            scale = {"kB": 1 / 1024, "KB": 1 / 1024, "MB": 1.0, "GB": 1024.0}[value.group(3)]
            devices[current][keys[value.group(1).lower()]] = float(value.group(2)) * scale
    return {name: values for name, values in devices.items() if values}


class MicsmcProbe:
    """Device-wide memory use from ``micsmc -f`` (MPSS 3); no per-job attribution."""
    name = "micsmc"

    def __init__(self, command: str = "micsmc") -> None:
        self.command = command
        self._cache: Tuple[float, Dict[str, Dict[str, float]]] = (0.0, {})

    def job_usage_mb(self, device: str, cluster: int, proc: int) -> Optional[int]:
        return None

    def device_usage_mb(self, device: str) -> Optional[int]:
        stamp, parsed = self._cache
        if time.monotonic() - stamp > 1.0:
            try:
                out = subprocess.run([self.command, "-f"], capture_output=True, timeout=20, check=False)
                parsed = parse_micsmc(out.stdout.decode("utf-8", "replace"))
            except (OSError, subprocess.SubprocessError):
                parsed = {}
            self._cache = (time.monotonic(), parsed)
        used = parsed.get(device, {}).get("used_mb")
        return None if used is None else int(used)


class SysfsProbe:
    """Inventory from /sys/class/mic/<dev>; MPSS exposes no per-process memory there."""
    name = "sysfs"

    def __init__(self, root: str = "/sys/class/mic") -> None:
        self.root = root

    def job_usage_mb(self, device: str, cluster: int, proc: int) -> Optional[int]:
        return None

    def device_usage_mb(self, device: str) -> Optional[int]:
        return None


def make_probe(kind: str, probe_dir: Optional[str]):
    if kind == "file":
        if not probe_dir:
            raise cn.ConfigError("--probe file needs --probe-dir")
        return FileProbe(probe_dir)
    if kind == "micsmc":
        return MicsmcProbe()
    return SysfsProbe(probe_dir or "/sys/class/mic")


# ---------------------------------------------------------------------------------------
# Processes

def _status_fields(pid: int, proc_root: str) -> Optional[Tuple[int, int, int]]:
    """(real uid, ppid, pgid) of a live process, None if gone or a zombie."""
    try:
        with open(f"{proc_root}/{pid}/stat", "rb") as handle:
            data = handle.read(4096).decode("ascii", "replace")
        info = os.stat(f"{proc_root}/{pid}")
    except OSError:
        return None
    fields = data[data.rfind(")") + 2:].split()
    if len(fields) < 3 or fields[0] in ("Z", "X"):
        return None
    try:
        uid = _real_uid(pid, proc_root)
        return (info.st_uid if uid is None else uid), int(fields[1]), int(fields[2])
    except ValueError:
        return None


def _real_uid(pid: int, proc_root: str) -> Optional[int]:
    try:
        with open(f"{proc_root}/{pid}/status", "rb") as handle:
            for line in handle.read(16384).decode("ascii", "replace").splitlines():
                if line.startswith("Uid:"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return None


def _has_scratch_env(pid: int, scratch_dir: str, proc_root: str) -> bool:
    try:
        with open(f"{proc_root}/{pid}/environ", "rb") as handle:
            environ = handle.read(1 << 20)
    except OSError:
        return False
    return ("_CONDOR_SCRATCH_DIR=" + scratch_dir).encode() in environ.split(b"\0")


def find_job_processes(request: cn.Request, owner_uid: int, proc_root: str = "/proc") -> List[Tuple[int, int]]:
    """(pid, pgid) of the processes that provably belong to the request's job."""
    if not cn.request_is_live(request, proc_root):
        return []
    table: Dict[int, Tuple[int, int, int]] = {}
    for entry in os.listdir(proc_root):
        if entry.isdigit():
            fields = _status_fields(int(entry), proc_root)
            if fields:
                table[int(entry)] = fields
    found = []
    for pid, (uid, _, pgid) in table.items():
        if pid <= 1 or pid == os.getpid() or pid == request.starter_pid or uid != owner_uid:
            continue
        ancestor, depth = table[pid][1], 0
        while ancestor > 1 and ancestor != request.starter_pid and ancestor in table and depth < 128:
            ancestor, depth = table[ancestor][1], depth + 1
        if ancestor == request.starter_pid and _has_scratch_env(pid, request.scratch_dir, proc_root):
            found.append((pid, pgid))
    return found


def signal_job(request: cn.Request, owner_uid: int, signum: int, proc_root: str = "/proc") -> List[int]:
    """Send ``signum`` to the job's validated processes (and groups they lead); pids signalled."""
    members = find_job_processes(request, owner_uid, proc_root)
    pids = {pid for pid, _ in members}
    signalled = []
    for pid, pgid in members:
        try:
            if pgid == pid and pgid > 1:
                os.killpg(pgid, signum)
            elif pgid not in pids:
                os.kill(pid, signum)
            signalled.append(pid)
        except ProcessLookupError:
            pass
        except PermissionError:
            pass
    return signalled


def stop_job(request: cn.Request, owner_uid: int, grace_s: float, proc_root: str = "/proc") -> List[int]:
    """SIGTERM the job's processes, then SIGKILL whatever remains after ``grace_s``."""
    signalled = signal_job(request, owner_uid, signal.SIGTERM, proc_root)
    deadline = time.monotonic() + grace_s
    while signalled and time.monotonic() < deadline:
        if not find_job_processes(request, owner_uid, proc_root):
            return signalled
        time.sleep(0.1)
    return signalled + signal_job(request, owner_uid, signal.SIGKILL, proc_root)


def process_comm(pid: int, proc_root: str = "/proc") -> str:
    try:
        with open(f"{proc_root}/{pid}/comm", "rb") as handle:
            return handle.read(64).decode("utf-8", "replace").strip()
    except OSError:
        return ""


# ---------------------------------------------------------------------------------------
# State dir

def prepare_state_dir(state_dir: str) -> None:
    """Create (or check) the layout described in cosched_node's docstring."""
    os.makedirs(state_dir, mode=0o755, exist_ok=True)
    info = os.lstat(state_dir)
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.geteuid() or info.st_mode & 0o022:
        raise cn.StateError(0, f"{state_dir} must be a directory owned by uid {os.geteuid()}, "
                               "not group/other-writable")
    for name, mode in (("requests", 0o1777), ("devices", 0o755), ("killed", 0o755), ("spread", 0o755)):
        path = os.path.join(state_dir, name)
        if not os.path.lexists(path):
            os.mkdir(path, 0o700)
        sub = os.lstat(path)
        if not stat.S_ISDIR(sub.st_mode) or sub.st_uid != os.geteuid():
            raise cn.StateError(0, f"{path} is not our directory")
        os.chmod(path, mode)
    for name, mode in (("lock", 0o644), ("hooks.log", 0o622), ("agent.log", 0o644)):
        fd = os.open(os.path.join(state_dir, name), os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_APPEND, mode)
        try:
            if os.fstat(fd).st_uid != os.geteuid():
                raise cn.StateError(0, f"{state_dir}/{name} is not ours")
            os.fchmod(fd, mode)
        finally:
            os.close(fd)


def _unlink(directory: str, name: str) -> None:
    try:
        os.unlink(os.path.join(directory, name))
    except FileNotFoundError:
        pass


def _parent_slot_id(short_slot: str) -> Optional[int]:
    match = cn.SLOT_NAME_RE.match(short_slot + "@")
    return int(match.group(2)) if match else None


def spread_problem(config: cn.NodeConfig, request: cn.SpreadRequest) -> Optional[str]:
    """Why a spread request does not fit the node config (None when it does)."""
    slot = config.slot(request.slot_id)
    if slot is None or slot.kind != "socket":
        return f"slot{request.slot_id} is not a socket slot"
    if slot.cache_id != request.cache_id:
        return f"cache id {request.cache_id} is not that of slot{request.slot_id} ({slot.cache_id})"
    if slot.llc_ways and request.llc_ways > slot.llc_ways:
        return f"{request.llc_ways} LLC ways exceed the {slot.llc_ways} of slot{request.slot_id}"
    if slot.mem_bw_gbs and request.mem_bw_gbs > slot.mem_bw_gbs:
        return f"{request.mem_bw_gbs:g} GB/s exceed the {slot.mem_bw_gbs:g} GB/s of slot{request.slot_id}"
    if slot.cores and request.cpus > slot.cores:
        return f"{request.cpus} cpus exceed the {slot.cores} cores of slot{request.slot_id}"
    return None


def collect_requests(config: cn.NodeConfig, requests_dir: str, starter_comm: str, log: Log,
                     proc_root: str = "/proc", ended: Optional[List[Tuple[object, os.stat_result]]] = None
                     ) -> List[Tuple[object, int]]:
    """Live, valid requests (device and spread) with their owner uid; deletes bad, forged and
    ended ones.  Ended spread requests (valid, starter gone) are appended to ``ended``."""
    errors: List[Tuple[str, str]] = []
    kept: List[Tuple[object, int]] = []
    for request, info in cn.read_requests(requests_dir, None, errors):
        problem = None
        spread = isinstance(request, cn.SpreadRequest)
        if spread:
            problem = spread_problem(config, request)
        else:
            device = config.device(request.device)
            if device is None:
                problem = "unknown device"
            elif request.threads > device.hardware_threads or request.memory_mb > device.device_memory_mb \
                    or request.units[-1][1] > device.hardware_threads:
                problem = "exceeds the device"
        if problem:
            pass
        elif not cn.request_is_live(request, proc_root):
            if spread:
                log(f"job {request.job} (spread, program {request.program}) on {request.slot} ended")
                if ended is not None:
                    ended.append((request, info))
            else:
                log(f"job {request.job} on {request.device} ended: allocation units "
                    f"{cn.format_ranges(request.units)} released")
        elif starter_comm and process_comm(request.starter_pid, proc_root) != starter_comm:
            problem = f"starter pid {request.starter_pid} is not a {starter_comm} process"
        else:
            kept.append((request, info.st_uid))
            continue
        if problem:
            errors.append((request.file_name, problem))
        _unlink(requests_dir, request.file_name)
    now = time.time()
    for name, problem in errors:
        log(f"request file {name[:80]!r} removed: {problem}")
        _unlink(requests_dir, name)
    for name in os.listdir(requests_dir):
        if name.startswith(".tmp."):
            try:
                if now - os.lstat(os.path.join(requests_dir, name)).st_mtime > 60:
                    _unlink(requests_dir, name)
            except OSError:
                pass
    return kept


# ---------------------------------------------------------------------------------------
# Spread jobs: resctrl groups, the watch of each job, perf samples, run records

def task_ids(pids: Sequence[int], proc_root: str = "/proc") -> List[int]:
    """Every thread id of the given (validated) processes: resctrl ``tasks`` takes threads."""
    tids = set()
    for pid in pids:
        tids.add(pid)
        try:
            names = os.listdir(f"{proc_root}/{int(pid)}/task")
        except OSError:
            continue
        tids.update(int(n) for n in names if n.isdigit() and len(n) < 8)
    return sorted(t for t in tids if 2 <= t <= resctrl.PID_MAX)


def boot_time(proc_root: str = "/proc") -> Optional[float]:
    try:
        with open(f"{proc_root}/stat", "rb") as handle:
            for line in handle.read(1 << 16).decode("ascii", "replace").splitlines():
                if line.startswith("btime "):
                    return float(int(line.split()[1]))
    except (OSError, ValueError, IndexError):
        return None
    return None


def starter_wall_start(request, proc_root: str = "/proc") -> Optional[float]:
    """Epoch seconds at which the request's starter started (from /proc, not from the user)."""
    btime = boot_time(proc_root)
    if btime is None:
        return None
    return btime + request.starter_start / float(os.sysconf("SC_CLK_TCK"))


def parse_perf_csv(text: str) -> Dict[str, float]:
    """``perf stat -x ,`` output -> sums of instructions, cycles and IMC bytes read+written."""
    out = {"instructions": 0.0, "cycles": 0.0, "imc_bytes": 0.0}
    seen = set()
    for line in text.splitlines():
        fields = line.split(",")
        if len(fields) < 3 or line.startswith("#"):
            continue
        try:
            value = float(fields[0])
        except ValueError:
            continue   # <not counted>, <not supported>
        if not math.isfinite(value) or value < 0:
            continue
        unit, event = fields[1].strip(), fields[2].strip().lower()
        if "cas_count_read" in event or "cas_count_write" in event:
            scale = {"MiB": 1048576.0, "MB": 1e6, "KiB": 1024.0, "B": 1.0}.get(unit, 64.0)
            out["imc_bytes"] += value * scale
            seen.add("imc_bytes")
        elif "instructions" in event:
            out["instructions"] += value
            seen.add("instructions")
        elif re.search(r"(^|[/:])cycles([/:]|$)|^cpu-cycles", event):
            out["cycles"] += value
            seen.add("cycles")
    return {key: value for key, value in out.items() if key in seen}


class PerfSampler:
    """``perf stat`` of a job's processes (IPC) and of the node (IMC bandwidth); list argv
    and a timeout, never a shell."""

    def __init__(self, perf: str, seconds: float, log: Log) -> None:
        self.perf = perf
        self.seconds = seconds
        self.log = log
        self.sleep = shutil.which("sleep", path="/usr/bin:/bin") or "/bin/sleep"
        self.bandwidth_ok = True
        self.ipc_ok = True

    def sample(self, pids: Sequence[int], node_wide: bool) -> Dict[str, float]:
        if not pids or not self.ipc_ok:
            return {}
        secs = "%.3f" % self.seconds
        runs = [("ipc", [self.perf, "stat", "-x", ",", "-e", "instructions,cycles",
                         "-p", ",".join(str(int(p)) for p in pids), "--", self.sleep, secs])]
        if node_wide and self.bandwidth_ok:
            runs.append(("bw", [self.perf, "stat", "-x", ",", "-a", "-e",
                                "uncore_imc/cas_count_read/,uncore_imc/cas_count_write/",
                                "--", self.sleep, secs]))
        procs = []
        for what, argv in runs:
            try:
                procs.append((what, subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                                     stderr=subprocess.PIPE, close_fds=True)))
            except OSError as exc:
                self.log(f"perf not usable ({exc.strerror}): no IPC/bandwidth samples")
        out: Dict[str, float] = {}
        for what, proc in procs:
            try:
                stdout, stderr = proc.communicate(timeout=self.seconds + 10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.communicate()
                continue
            text = (stderr + b"\n" + stdout).decode("utf-8", "replace")
            parsed = parse_perf_csv(text)
            if what == "ipc":
                if parsed.get("cycles", 0) > 0 and "instructions" in parsed:
                    out["instructions"], out["cycles"] = parsed["instructions"], parsed["cycles"]
                elif "<not supported>" in text and self.ipc_ok:
                    self.ipc_ok = False
                    self.log("perf: instructions/cycles not supported here: IPC and bandwidth not recorded")
            elif what == "bw":
                if "imc_bytes" in parsed:
                    out["imc_bytes"], out["imc_seconds"] = parsed["imc_bytes"], self.seconds
                elif self.bandwidth_ok:
                    self.bandwidth_ok = False
                    self.log("perf: no uncore_imc CAS counters here: bandwidth not recorded")
        return out


def make_perf(option: str, seconds: float, log: Log) -> Optional[PerfSampler]:
    if option == "":
        return None
    path = shutil.which("perf", path="/usr/bin:/bin:/usr/sbin:/sbin:/usr/local/bin") if option == "auto" else option
    if not path or not os.path.isfile(path) or not os.access(path, os.X_OK):
        if option != "auto":
            log(f"--perf {option}: not an executable: IPC/bandwidth not recorded")
        return None
    return PerfSampler(path, seconds, log)


_WATCH_KEYS = {"instructions", "cycles", "imc_bytes", "imc_seconds"}


def read_watch(spread_dir: str, name: str) -> Optional[Dict[str, object]]:
    try:
        data, _ = cn.read_small_file(spread_dir, name, 16384)
        watch = json.loads(data.decode("utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(watch, dict) or not all(isinstance(watch.get(k), (int, float)) and
                                              not isinstance(watch.get(k), bool)
                                              for k in ("first_seen", "last_seen", "requested")):
        return None
    return watch


def new_watch(request, info: os.stat_result, now: float) -> Dict[str, object]:
    return {"file": request.file_name, "job": request.job, "requested": info.st_ctime,
            "first_seen": now, "last_seen": now, "shared": False, "verified": False,
            "co_runners": [], "samples": 0, **{k: 0.0 for k in _WATCH_KEYS}}


def safe_subdir(parent: str, name: str) -> str:
    """``parent/name``, created 0755 if missing; refused if a symlink or not ours."""
    path = os.path.join(parent, name)
    try:
        os.mkdir(path, 0o755)
    except FileExistsError:
        pass
    info = os.lstat(path)
    if not stat.S_ISDIR(info.st_mode) or info.st_uid not in (os.geteuid(), 0) or info.st_mode & 0o022:
        raise cn.StateError(0, f"{path} is not a directory of ours (or is group/other-writable)")
    return path


def run_record(config: cn.NodeConfig, request, watch: Dict[str, object], now: float,
               start: Optional[float], watch_slack_s: float) -> Dict[str, object]:
    """The piggyback profile record of an ended spread job (see cosched_profile_record)."""
    start = float(watch["requested"]) if start is None else start
    first_seen, last_seen = float(watch["first_seen"]), float(watch["last_seen"])
    # exclusive only when watched from (nearly) its start: a co-runner that came and went
    # before the agent first saw this job would otherwise go unnoticed
    watched_from_start = first_seen - float(watch["requested"]) <= watch_slack_s
    record: Dict[str, object] = {
        "version": profile_record.RECORD_VERSION, "program": request.program, "job": request.job,
        "node": config.node, "slot": request.slot, "cache_id": request.cache_id,
        "scale_factor": request.scale, "nodes": request.nodes or None, "cpus": request.cpus,
        "alloc_llc_ways": request.llc_ways, "alloc_mem_bw_gbs": request.mem_bw_gbs,
        "start": round(start, 3), "end": round(now, 3), "runtime_s": round(max(0.0, now - start), 3),
        "runtime_error_s": round(max(0.0, now - last_seen), 3),
        "exclusive": bool(watch.get("verified")) and not watch.get("shared") and watched_from_start}
    if float(watch.get("cycles", 0) or 0) > 0:
        record["ipc"] = round(float(watch["instructions"]) / float(watch["cycles"]), 4)
    if float(watch.get("imc_seconds", 0) or 0) > 0:
        record["bandwidth_gbs"] = round(float(watch["imc_bytes"]) / float(watch["imc_seconds"]) / 1e9, 4)
    if watch.get("samples"):
        record["perf_samples"] = int(watch["samples"])
    return record


def write_run_record(profile_dir: str, record: Dict[str, object]) -> str:
    program = str(record["program"])
    if not cn.PROGRAM_RE.match(program) or not re.match(r"^\d{1,12}\.\d{1,9}$", str(record["job"])):
        raise ValueError("program or job name refused")
    directory = safe_subdir(safe_subdir(profile_dir, "runs"), program)
    name = f"{record['job']}.json"
    cn.write_json_atomic(directory, name, record, 0o644)
    return os.path.join(directory, name)


def mb_percent(mem_bw_gbs: float, slot: Optional[cn.SlotConfig]) -> Optional[int]:
    """A bandwidth share as a percentage of its socket's peak (MBA ``MB:`` line)."""
    if slot is None or not slot.mem_bw_gbs or mem_bw_gbs <= 0:
        return None
    return max(1, min(100, math.ceil(100.0 * mem_bw_gbs / slot.mem_bw_gbs)))


def group_name(request: cn.SpreadRequest, owner_uid: int) -> str:
    """The resctrl group of a spread job's procs on this node: one per cluster (the procs of
    a cluster are one parallel job) and per owning uid (the request file's owner, which no
    job can forge), ``<ClusterId>-uid<uid>``."""
    return f"{request.cluster}-uid{owner_uid}"


def group_shares(config: cn.NodeConfig, requests: Sequence[Tuple[cn.SpreadRequest, int]]
                 ) -> Tuple[Dict[str, Dict[int, int]], Dict[str, Dict[int, int]]]:
    """(ways, MBA percent) per group and cache id for the given (request, owner uid) pairs.

    A job's procs on one cache share its group there, so the group's ways are the SUM of
    their shares (Spread-n-Share splits the job's w ways over its procs on a socket, some
    possibly 0, and HTCondor accounts each share as the proc's RequestLLCWays), bounded by
    the socket slot's ways; its bandwidth likewise.  Each proc counts once, by its starter:
    a second request naming the same starter adds nothing.  A group with 0 ways on a cache
    has no mask there; one with 0 ways everywhere is left out (its procs run ungrouped)."""
    per_proc: Dict[str, Dict[int, Dict[Tuple[int, int], Tuple[int, float]]]] = {}
    slots: Dict[int, Optional[cn.SlotConfig]] = {}
    for request, owner_uid in requests:
        procs = per_proc.setdefault(group_name(request, owner_uid), {}).setdefault(request.cache_id, {})
        key = (request.starter_pid, request.starter_start)
        ways, bw = procs.get(key, (0, 0.0))
        procs[key] = (max(ways, request.llc_ways), max(bw, request.mem_bw_gbs))
        slots[request.cache_id] = config.slot(request.slot_id)
    ways_of: Dict[str, Dict[int, int]] = {}
    percent_of: Dict[str, Dict[int, int]] = {}
    for group, per_cache in per_proc.items():
        for cache_id, procs in per_cache.items():
            slot = slots.get(cache_id)
            ways = sum(w for w, _ in procs.values())
            ways = min(ways, slot.llc_ways) if slot is not None and slot.llc_ways else ways
            if ways > 0:
                ways_of.setdefault(group, {})[cache_id] = ways
                percent = mb_percent(sum(b for _, b in procs.values()), slot)
                if percent:
                    percent_of.setdefault(group, {})[cache_id] = percent
    return ways_of, percent_of


def manage_spread(config: cn.NodeConfig, state_dir: str, live: List[Tuple[object, int]],
                  ended: List[Tuple[object, os.stat_result]], log: Log, manager=None,
                  profile_dir: Optional[str] = None, perf: Optional[PerfSampler] = None,
                  interval_s: float = 10.0, proc_root: str = "/proc") -> Dict[str, Optional[str]]:
    """Watch the spread jobs, sync their resctrl groups, record the ended ones' runs."""
    spread_dir = os.path.join(state_dir, "spread")
    now = time.time()
    spread_live = [(r, uid) for r, uid in live if isinstance(r, cn.SpreadRequest)]
    infos = {}
    requests_dir = os.path.join(state_dir, "requests")
    for request, _ in spread_live:
        try:
            infos[request.file_name] = os.lstat(os.path.join(requests_dir, request.file_name))
        except OSError:
            pass
    # every request seen this interval, live or ended, by its socket slot id; the procs of
    # one cluster are one parallel job, so only other clusters make a run shared
    on_slot: Dict[int, List[Tuple[int, str]]] = {}
    for request in [r for r, _ in live] + [r for r, _ in ended]:
        slot_id = _parent_slot_id(request.slot)
        if slot_id is not None:
            on_slot.setdefault(slot_id, []).append((request.cluster, request.job))
    node_jobs = {r.job for r, _ in live}

    def update(request, info, alive: bool, pids: Sequence[int]) -> Dict[str, object]:
        watch = read_watch(spread_dir, request.file_name) or new_watch(request, info, now)
        others = sorted({job for cluster, job in on_slot.get(request.slot_id, []) if cluster != request.cluster})
        if others:
            watch["shared"] = True
            watch["co_runners"] = sorted(set(watch.get("co_runners") or []) | set(others))[:64]
        if alive:
            watch["last_seen"] = now
        if pids:
            watch["verified"] = True
        if alive and pids and perf is not None and not watch["shared"]:
            sample = perf.sample(pids, node_wide=node_jobs == {request.job})
            if sample:
                watch["samples"] = int(watch.get("samples", 0) or 0) + 1
                for key in _WATCH_KEYS:
                    watch[key] = float(watch.get(key, 0) or 0) + sample.get(key, 0.0)
        return watch

    grouped: List[Tuple[cn.SpreadRequest, int]] = []
    tasks: Dict[str, List[int]] = {}
    for request, owner_uid in spread_live:
        info = infos.get(request.file_name)
        if info is None:
            continue
        pids = [pid for pid, _ in find_job_processes(request, owner_uid, proc_root)]
        watch = update(request, info, True, pids)
        try:
            cn.write_json_atomic(spread_dir, request.file_name, watch)
        except OSError as exc:
            log(f"job {request.job}: cannot write its watch: {exc.strerror}")
        if not watch.get("verified"):
            continue   # no group before its processes are proven: a forged request claims nothing
        grouped.append((request, owner_uid))
        tasks.setdefault(group_name(request, owner_uid), []).extend(task_ids(pids, proc_root))
    desired, shares = group_shares(config, grouped)
    for group in sorted(set(tasks) - set(desired)):
        del tasks[group]
    result: Dict[str, Optional[str]] = {}
    if manager is not None:
        try:
            result = manager.sync(desired, tasks, shares)
        except (OSError, resctrl.ResctrlError) as exc:
            log(f"resctrl sync failed: {getattr(exc, 'strerror', None) or exc}")
    for request, info in ended:
        watch = read_watch(spread_dir, request.file_name)
        if watch is None:
            log(f"job {request.job} (program {request.program}) ended unwatched: no run record")
            continue
        watch = update(request, info, False, [])
        _unlink(spread_dir, request.file_name)
        if not profile_dir:
            continue
        record = run_record(config, request, watch, now, starter_wall_start(request, proc_root),
                            3 * interval_s + 5)
        try:
            path = write_run_record(profile_dir, record)
            log(f"job {request.job}: run record {path} (scale {request.scale}, "
                f"{record['runtime_s']} s, exclusive {record['exclusive']})")
        except (OSError, ValueError) as exc:
            log(f"job {request.job}: run record not written: {getattr(exc, 'strerror', None) or exc}")
    # watches of requests that vanished without an end (deleted by their owner): dropped
    keep = {r.file_name for r, _ in spread_live}
    for name in os.listdir(spread_dir):
        if name not in keep and (cn.REQUEST_NAME_RE.match(name) or name.startswith(".tmp.")):
            _unlink(spread_dir, name)
    return result


def run_once(config: cn.NodeConfig, state_dir: str, probe, log: Log, starter_comm: str = "condor_starter",
             kill_grace_s: float = 5.0, proc_root: str = "/proc", manager=None,
             profile_dir: Optional[str] = None, perf: Optional[PerfSampler] = None,
             interval_s: float = 10.0) -> Dict[str, dict]:
    """One agent interval; returns the published per-device state."""
    requests_dir = os.path.join(state_dir, "requests")
    ended: List[Tuple[object, os.stat_result]] = []
    with cn.StateLock(state_dir, timeout_s=30.0):
        live = collect_requests(config, requests_dir, starter_comm, log, proc_root, ended)
    killed_dir = os.path.join(state_dir, "killed")
    published: Dict[str, dict] = {}
    for device in config.devices:
        name = device.device or ""
        jobs = []
        for request, owner_uid in (item for item in live
                                   if isinstance(item[0], cn.Request) and item[0].device == name):
            used = probe.job_usage_mb(name, request.cluster, request.proc)
            entry = dict(request.to_json(), used_mb=used, owner_uid=owner_uid)
            if used is not None and used > request.memory_mb:
                reason = (f"device memory use {used} MB on {name} exceeds its request of "
                          f"{request.memory_mb} MB")
                pids = stop_job(request, owner_uid, kill_grace_s, proc_root)
                entry["killed"] = reason
                if not os.path.exists(os.path.join(killed_dir, f"{request.job}.json")):
                    cn.write_json_atomic(killed_dir, f"{request.job}.json",
                                         {"job": request.job, "device": name, "slot": request.slot,
                                          "reason": reason, "pids": sorted(pids), "time": time.time()})
                    log(f"job {request.job} stopped: {reason} (signalled pids {sorted(pids)})")
            jobs.append(entry)
        state = {"device": name, "updated": time.time(), "probe": probe.name, "jobs": jobs,
                 "allocated_mb": sum(j["memory_mb"] for j in jobs),
                 "allocated_threads": sum(j["threads"] for j in jobs),
                 "busy_cores": cn.units_count(cn.core_ranges(
                     [r for j in jobs for r in j["units"]], device.device_kind.compute_per_core)),
                 "device_memory_mb": device.device_memory_mb, "hardware_threads": device.hardware_threads}
        per_job = [j["used_mb"] for j in jobs if j["used_mb"] is not None]
        device_used = probe.device_usage_mb(name)
        state["used_mb"] = device_used if device_used is not None else (sum(per_job) if per_job else None)
        if device_used is not None and device_used > device.device_memory_mb:
            log(f"device {name}: measured {device_used} MB exceeds its {device.device_memory_mb} MB")
        cn.write_json_atomic(os.path.join(state_dir, "devices"), f"{name}.json", state)
        published[name] = state
    try:
        manage_spread(config, state_dir, live, ended, log, manager, profile_dir, perf, interval_s, proc_root)
    except (OSError, cn.StateError) as exc:
        log(f"spread jobs not managed this interval: {exc.strerror or exc}")
    cn.write_json_atomic(state_dir, "agent.heartbeat", {"time": time.time(), "pid": os.getpid()})
    return published


def parse_args(argv: Optional[Sequence[str]]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog=PROGRAM, description=__doc__.split("\n")[0])
    parser.add_argument("--node-config", required=True)
    parser.add_argument("--state-dir")
    parser.add_argument("--probe", choices=("file", "sysfs", "micsmc"), default="micsmc")
    parser.add_argument("--probe-dir")
    parser.add_argument("--interval", type=float, default=10.0)
    parser.add_argument("--kill-grace", type=float, default=5.0)
    parser.add_argument("--starter-comm", default="condor_starter",
                        help="process name a request's starter pid must have ('' disables the check)")
    parser.add_argument("--resctrl-root", default="/sys/fs/resctrl",
                        help="resctrl mount point (a directory laid out as resctrl in tests)")
    parser.add_argument("--profile-dir", default=None,
                        help="profile store: run records go to DIR/runs/<program>/<job>.json")
    parser.add_argument("--perf", default="auto",
                        help="perf binary for IPC/bandwidth samples ('auto': look it up, '': none)")
    parser.add_argument("--perf-sample", type=float, default=1.0, help="seconds per perf sample")
    parser.add_argument("--once", action="store_true")
    return parser.parse_args(argv)


def main(argv: Optional[Sequence[str]] = None) -> int:
    try:
        args = parse_args(argv)
    except SystemExit as exc:
        return cn.EXIT_BAD_CONFIG if exc.code else cn.EXIT_OK
    log_path: Optional[str] = None

    def log(message: str) -> None:
        cn.log_line(log_path, PROGRAM, message)

    try:
        if not 0.1 <= args.interval <= 3600 or not 0 <= args.kill_grace <= 300 \
                or not 0.01 <= args.perf_sample <= 60:
            raise cn.ConfigError("--interval must be in [0.1, 3600] s, --kill-grace in [0, 300] s "
                                 "and --perf-sample in [0.01, 60] s")
        for option, value in (("--resctrl-root", args.resctrl_root), ("--profile-dir", args.profile_dir)):
            if value is not None and (not cn.ABS_PATH_RE.match(value) or "/../" in value + "/"):
                raise cn.ConfigError(f"{option} must be a plain absolute path")
        config = cn.load_node_config(args.node_config)
        state_dir = cn.state_dir_for(config, {}, args.state_dir)
        probe = make_probe(args.probe, args.probe_dir)
    except cn.ConfigError as exc:
        log(f"bad configuration: {exc}")
        return cn.EXIT_BAD_CONFIG
    try:
        prepare_state_dir(state_dir)
    except OSError as exc:
        log(f"state dir unusable: {exc.strerror or exc}")
        return cn.EXIT_NO_STATE
    log_path = os.path.join(state_dir, "agent.log")
    stopping: List[int] = []
    if not args.once:
        signal.signal(signal.SIGTERM, lambda signum, frame: stopping.append(signum))
        signal.signal(signal.SIGINT, lambda signum, frame: stopping.append(signum))
        # condor_reconfig makes the master send SIGHUP, whose default would kill the agent;
        # its settings are its arguments, so there is nothing to re-read.
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
    manager = None
    if config.sockets:
        try:
            manager = resctrl.ResctrlManager(args.resctrl_root, log=log)
        except (OSError, resctrl.ResctrlError) as exc:
            log(f"resctrl at {args.resctrl_root} unusable ({getattr(exc, 'strerror', None) or exc}): "
                "spread jobs run ungrouped")
        if manager is not None and not manager.available:
            manager = None
    perf = make_perf(args.perf, args.perf_sample, log)
    if args.profile_dir:
        try:
            os.makedirs(args.profile_dir, mode=0o755, exist_ok=True)
        except OSError as exc:
            log(f"profile dir {args.profile_dir}: {exc.strerror}: run records will fail")
    log(f"started for node {config.node}, state {state_dir}, probe {probe.name}, resctrl "
        f"{args.resctrl_root if manager else 'absent'}, profiles {args.profile_dir or 'off'}, "
        f"perf {perf.perf if perf else 'off'}")
    while not stopping:
        try:
            run_once(config, state_dir, probe, log, args.starter_comm, args.kill_grace,
                     manager=manager, profile_dir=args.profile_dir, perf=perf, interval_s=args.interval)
        except Exception as exc:  # survive one bad interval; the heartbeat goes stale
            log(f"interval failed: {exc.__class__.__name__}: {exc}")
        if args.once:
            break
        deadline = time.monotonic() + args.interval
        while not stopping and time.monotonic() < deadline:
            time.sleep(min(0.2, args.interval))
    log("stopped")
    return cn.EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
