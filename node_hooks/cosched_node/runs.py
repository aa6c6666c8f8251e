"""Piggyback scaling profiles (Section 4.2 of paper 000): run records and the next scale.

Standard library only, Python 3.9+, no side effects at import: the node agent (root, on the
execute node) writes the records, and condor_sched's planner imports this module to read
them and to pick a program's next scale factor.

A run record is one JSON object per finished spread job, written by the node agent to
``<profile-dir>/runs/<program>/<ClusterId>.<ProcId>.json``::

    {"version": 1, "program": "lulesh", "job": "12.0", "node": "node1", "slot": "slot1_2",
     "cache_id": 0, "scale_factor": 2, "nodes": 4,          # nodes: null when unknown
     "cpus": 8, "alloc_llc_ways": 5, "alloc_mem_bw_gbs": 12.5,
     "start": 1700000000.0, "end": 1700000360.0,            # epoch s: starter start, end seen
     "runtime_s": 360.0, "runtime_error_s": 10.0,           # end seen at most this late
     "exclusive": true,                                      # no other job on its socket slot
     "ipc": 1.42, "bandwidth_gbs": 21.7, "perf_samples": 30} # only when perf measured them

Only exclusive runs (``exclusive`` true) are profile data: co-runners distort the runtime.
"""

from __future__ import annotations

import json
import math
import os
import re
import stat
import statistics
from typing import TYPE_CHECKING, Any, Dict, Iterable, List, Mapping, Optional, Sequence

from cosched_node.errors import StateError
from cosched_node.rules import JOB_ID_RE as JOB_RE
from cosched_node.rules import PROGRAM_RE, SCALE_FACTORS
from cosched_node.state import write_json_atomic

if TYPE_CHECKING:
    from cosched_node.jobs import Running

RECORD_VERSION = 1
#: Spreading "pays" while each scale is faster than the previous one by more than this.
MIN_GAIN = 0.05
MAX_RECORD_BYTES = 65536
MAX_RECORDS = 10000


def _number(value: Any, low: float, high: float) -> Optional[float]:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    value = float(value)
    return value if math.isfinite(value) and low <= value <= high else None


def validate_record(obj: Any) -> Optional[Dict[str, Any]]:
    """The record with its fields checked (a hostile or damaged file gives None).

    Required: program, scale_factor in SCALE_FACTORS, runtime_s > 0, exclusive (bool).
    Optional numbers that fail their checks are dropped, not fatal.
    """
    if not isinstance(obj, dict):
        return None
    program = obj.get("program")
    scale = obj.get("scale_factor")
    runtime = _number(obj.get("runtime_s"), 0.0, 1e9)
    exclusive = obj.get("exclusive")
    if not isinstance(program, str) or not PROGRAM_RE.match(program) or isinstance(scale, bool) \
            or scale not in SCALE_FACTORS or not runtime or not isinstance(exclusive, bool):
        return None
    out: Dict[str, Any] = {"program": program, "scale_factor": int(scale), "runtime_s": runtime,
                           "exclusive": exclusive}
    for key, low, high in (("nodes", 1, 100000), ("cpus", 1, 100000), ("cache_id", 0, 4095),
                           ("alloc_llc_ways", 1, 64)):
        value = obj.get(key)
        if not isinstance(value, bool) and isinstance(value, int) and low <= value <= high:
            out[key] = value
    for key, low, high in (("start", 0, 1e11), ("end", 0, 1e11), ("runtime_error_s", 0, 1e9),
                           ("alloc_mem_bw_gbs", 0, 1e5), ("ipc", 0, 1e3), ("bandwidth_gbs", 0, 1e5)):
        value = _number(obj.get(key), low, high)
        if value is not None:
            out[key] = value
    for key, pattern in (("job", JOB_RE), ("node", re.compile(r"^[A-Za-z0-9][A-Za-z0-9-]{0,62}$")),
                         ("slot", re.compile(r"^slot\d{1,4}(?:_\d{1,6})?$"))):
        value = obj.get(key)
        if isinstance(value, str) and pattern.match(value):
            out[key] = value
    return out


def processes(record: Mapping[str, Any]) -> Optional[int]:
    """The job's total process count (cpus x nodes) when both are known."""
    if "cpus" in record and "nodes" in record:
        return int(record["cpus"]) * int(record["nodes"])
    return None


def scale_runtimes(records: Iterable[Mapping[str, Any]], program: Optional[str] = None,
                   total_processes: Optional[int] = None) -> Dict[int, float]:
    """Median exclusive runtime per scale factor (records failing validation are ignored).

    ``program`` keeps only that program's records; ``total_processes`` only the runs of that
    size (records whose size is unknown are kept).
    """
    runtimes: Dict[int, List[float]] = {}
    for raw in records:
        record = validate_record(raw)
        if record is None or not record["exclusive"]:
            continue
        if program is not None and record["program"] != program:
            continue
        size = processes(record)
        if total_processes is not None and size is not None and size != total_processes:
            continue
        runtimes.setdefault(record["scale_factor"], []).append(record["runtime_s"])
    return {scale: statistics.median(values) for scale, values in runtimes.items()}


def next_scale_to_try(records: Iterable[Mapping[str, Any]], scales: Sequence[int] = SCALE_FACTORS,
                      min_gain: float = MIN_GAIN, program: Optional[str] = None,
                      total_processes: Optional[int] = None) -> Optional[int]:
    """The scale factor the program's next run should try, or None when profiling is done.

    Walks ``scales`` (1, 2, 4, 8) upwards over the exclusive runs' median runtimes: the first
    scale with no exclusive run is the next to try, provided every measured step so far paid,
    i.e. each scale ran faster than the one before by more than ``min_gain`` (5%).  As soon
    as the latest measured scale was not faster than the previous by more than 5%, spreading
    stopped paying: None (use :func:`best_scale`).  None too when every scale was measured.
    """
    times = scale_runtimes(records, program, total_processes)
    previous: Optional[int] = None
    for scale in scales:
        if scale not in times:
            return scale
        if previous is not None and not times[scale] < times[previous] * (1.0 - min_gain):
            return None
        previous = scale
    return None


def best_scale(records: Iterable[Mapping[str, Any]], program: Optional[str] = None,
               total_processes: Optional[int] = None) -> Optional[int]:
    """The measured scale factor with the shortest median exclusive runtime (ties: smaller)."""
    times = scale_runtimes(records, program, total_processes)
    if not times:
        return None
    return min(times, key=lambda scale: (times[scale], scale))


def load_records(profile_dir: str, program: str) -> List[Dict[str, Any]]:
    """The valid records in ``<profile_dir>/runs/<program>/`` (unreadable ones skipped)."""
    if not PROGRAM_RE.match(program):
        raise ValueError("program name refused")
    directory = os.path.join(profile_dir, "runs", program)
    try:
        names = sorted(os.listdir(directory))
    except OSError:
        return []
    out = []
    for name in names[:MAX_RECORDS]:
        if not name.endswith(".json") or name.startswith("."):
            continue
        try:
            fd = os.open(os.path.join(directory, name), os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
            try:
                data = os.read(fd, MAX_RECORD_BYTES + 1)
            finally:
                os.close(fd)
            if len(data) > MAX_RECORD_BYTES:
                continue
            record = validate_record(json.loads(data.decode("utf-8")))
        except (OSError, ValueError):
            continue
        if record is not None and record["program"] == program:
            out.append(record)
    return out


def safe_subdir(parent: str, name: str) -> str:
    """``parent/name``, created 0755 if missing; refused if a symlink or not ours."""
    path = os.path.join(parent, name)
    try:
        os.mkdir(path, 0o755)
    except FileExistsError:
        pass
    info = os.lstat(path)
    if not stat.S_ISDIR(info.st_mode) or info.st_uid not in (os.geteuid(), 0) or info.st_mode & 0o022:
        raise StateError(0, f"{path} is not a directory of ours (or is group/other-writable)")
    return path


def run_record(node: str, job: Running, cache_id: int, now: float, start: Optional[float],
               watch_slack_s: float) -> Dict[str, object]:
    """The piggyback profile record of an ended spread job (format: this module's docstring)."""
    claim = job.claim
    start = job.first_seen if start is None else start
    # exclusive only when watched from (nearly) its start: a co-runner that came and went
    # before the agent first saw this job would otherwise go unnoticed
    watched_from_start = job.first_seen - start <= watch_slack_s
    record: Dict[str, object] = {
        "version": RECORD_VERSION, "program": claim.program, "job": claim.job,
        "node": node, "slot": claim.slot, "cache_id": cache_id,
        "scale_factor": claim.scale or 1, "nodes": claim.nodes or None, "cpus": max(1, claim.cpus),
        "alloc_llc_ways": claim.llc_ways, "alloc_mem_bw_gbs": claim.mem_bw_gbs,
        "start": round(start, 3), "end": round(now, 3), "runtime_s": round(max(0.0, now - start), 3),
        "runtime_error_s": round(max(0.0, now - (job.last_seen or now)), 3),
        "exclusive": job.verified and not job.shared and watched_from_start}
    if job.perf.get("cycles", 0) > 0:
        record["ipc"] = round(job.perf.get("instructions", 0.0) / job.perf["cycles"], 4)
    if job.perf.get("imc_seconds", 0) > 0:
        record["bandwidth_gbs"] = round(job.perf.get("imc_bytes", 0.0) / job.perf["imc_seconds"] / 1e9, 4)
    if job.samples:
        record["perf_samples"] = int(job.samples)
    return record


def write_run_record(profile_dir: str, record: Dict[str, object]) -> str:
    program = str(record["program"])
    if not PROGRAM_RE.match(program) or not JOB_RE.match(str(record["job"])):
        raise ValueError("program or job name refused")
    directory = safe_subdir(safe_subdir(profile_dir, "runs"), program)
    name = f"{record['job']}.json"
    write_json_atomic(directory, name, record, 0o644)
    return os.path.join(directory, name)
