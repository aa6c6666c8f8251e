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
  3. publishes DIR/devices/<dev>.json (allocations, measured use) and DIR/agent.heartbeat.

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
import os
import re
import signal
import stat
import subprocess
import sys
import time
from typing import Callable, Dict, List, Optional, Sequence, Tuple

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import cosched_node as cn  # noqa: E402

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
    for name, mode in (("requests", 0o1777), ("devices", 0o755), ("killed", 0o755)):
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


def collect_requests(config: cn.NodeConfig, requests_dir: str, starter_comm: str, log: Log,
                     proc_root: str = "/proc") -> List[Tuple[cn.Request, int]]:
    """Live, valid requests with their owner uid; deletes bad, forged and ended ones."""
    errors: List[Tuple[str, str]] = []
    kept: List[Tuple[cn.Request, int]] = []
    for request, info in cn.read_requests(requests_dir, None, errors):
        device = config.device(request.device)
        problem = None
        if device is None:
            problem = "unknown device"
        elif request.threads > device.hardware_threads or request.memory_mb > device.device_memory_mb \
                or request.first_core + request.cores > device.device_cores:
            problem = "exceeds the device"
        elif not cn.request_is_live(request, proc_root):
            log(f"job {request.job} on {request.device} ended: allocation cores "
                f"{request.first_core}-{request.first_core + request.cores - 1} released")
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


def run_once(config: cn.NodeConfig, state_dir: str, probe, log: Log, starter_comm: str = "condor_starter",
             kill_grace_s: float = 5.0, proc_root: str = "/proc") -> Dict[str, dict]:
    """One agent interval; returns the published per-device state."""
    requests_dir = os.path.join(state_dir, "requests")
    with cn.StateLock(state_dir, timeout_s=30.0):
        live = collect_requests(config, requests_dir, starter_comm, log, proc_root)
    killed_dir = os.path.join(state_dir, "killed")
    published: Dict[str, dict] = {}
    for device in config.devices:
        name = device.device or ""
        jobs = []
        for request, owner_uid in (item for item in live if item[0].device == name):
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
                 "busy_cores": sum(j["cores"] for j in jobs),
                 "device_memory_mb": device.device_memory_mb, "hardware_threads": device.hardware_threads}
        per_job = [j["used_mb"] for j in jobs if j["used_mb"] is not None]
        device_used = probe.device_usage_mb(name)
        state["used_mb"] = device_used if device_used is not None else (sum(per_job) if per_job else None)
        if device_used is not None and device_used > device.device_memory_mb:
            log(f"device {name}: measured {device_used} MB exceeds its {device.device_memory_mb} MB")
        cn.write_json_atomic(os.path.join(state_dir, "devices"), f"{name}.json", state)
        published[name] = state
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
        if not 0.1 <= args.interval <= 3600 or not 0 <= args.kill_grace <= 300:
            raise cn.ConfigError("--interval must be in [0.1, 3600] s and --kill-grace in [0, 300] s")
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
    log(f"started for node {config.node}, state {state_dir}, probe {probe.name}")
    while not stopping:
        try:
            run_once(config, state_dir, probe, log, args.starter_comm, args.kill_grace)
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
