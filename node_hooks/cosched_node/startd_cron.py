"""STARTD_CRON job: advertise the node's non-consumable device facts as ``Attr = value`` lines.

Runs periodically as condor's user.  Prints
  CoSchedNodeVersion       the release of the node programs (condor_sched's version)
  CoSchedDeviceModels      "mic0=<Board SKU>,mic1=..." from ``micinfo``, else "emulated"
  CoSchedNodeAgentAlive    true when DIR/agent.heartbeat is fresher than --max-age seconds
  CoSchedPhiUsedMemory_<dev>, CoSchedPhiAllocatedMemory_<dev>, CoSchedPhiAllocatedThreads_<dev>,
  CoSchedPhiBusyCores_<dev>, CoSchedPhiJobs_<dev>  from the agent's DIR/devices/<dev>.json
  CoSchedLastKill          the newest reason in DIR/killed/ (when there is one)
  CoSchedOverLimit_<slot>  "<job> <reason>": a job the agent stopped over its memory on that
                           (dynamic) slot, which the startd's policy (config.d/20) holds
  CoSchedNodeSharing       (nodes with a node slot) true when the agent is alive and can set
                           cpusets (DIR/cpusets.json "usable"): the sidecar pins guests only there
  CoSchedLentCpus          (nodes with a node slot) CPUs guests keep after their mate ended, which
                           no node-slot start may take (START: RequestCpus <= Cpus - CoSchedLentCpus)
On a node with a spare slot (paper 003), from the agent's DIR/spare.json (every value checked;
a missing, stale or malformed file publishes a node that offers nothing):
  CoSchedSpareUsable       true when the agent is alive (heartbeat and spare.json fresher than
                           --max-age), can confine spare jobs (a writable cgroup v1 or v2) and has
                           an estimate (at least 12 samples)
  CoSchedSpareProblem      why not, when not usable
  CoSchedSpareCpus         C - (Q + xi) of the primaries' cores in use, in [0, C] (0.0 when not usable)
  CoSchedSpareMemory       M - (Q + xi) of the primaries' memory (anon + shmem), MB, in [0, M] (0 when
                           not usable)
  CoSchedSpareConfidence   the estimate's confidence (0.8)
  CoSchedSpareSamples      the samples in the estimate's window
  CoSchedSpareUpdated      unix seconds of the agent's estimate
  CoSchedSpareEvict_<slot> "<job> <reason>": a spare job on that (dynamic) slot of the spare slot the
                           agent asks the startd to vacate (config.d/20 preempts it, no hold: it goes
                           back to idle), e.g. when its memory must shrink below what it uses
  CoSchedSpareVacated_<cluster>_<proc>  "<unix time> <reason>": such a request whose claim has ended,
                           kept 15 minutes so the sidecar can tell the job why it is idle again
                           (no policy reads it: it never preempts a later run of the job)
Every node, from the agent's DIR/interference.json (paper 004: fresher than --max-age):
  CoSchedJobExe_<cluster>_<proc>  "<owner> <sha256>": the owner of that running job (its claim's
                           RemoteUser) and the sha256 of the binary it runs (/proc/<pid>/exe, read by
                           the agent as root), which key its interference profile
Exit codes: 0 facts printed; 2 node config invalid (prints only CoSchedNodeConfigOK = false).
"""

from __future__ import annotations

import argparse
import math
import os
import re
import shutil
import subprocess
import sys
import time
from typing import Dict, List, Optional, Sequence, TextIO

from cosched_node import __version__, rules
from cosched_node.ads import format_line
from cosched_node.config import DEFAULT_NODE_CONFIG, NodeConfig, load_node_config, state_dir_for
from cosched_node.errors import EXIT_BAD_CONFIG, EXIT_INTERNAL, EXIT_OK, ConfigError
from cosched_node.interference_duty import STATE_NAME, published_lines
from cosched_node.state import log_line, read_json

PROGRAM = "cosched_startd_cron"
SAFE_TEXT_RE = re.compile(r"[^A-Za-z0-9 ._/:+-]")


def parse_micinfo(text: str) -> Dict[str, Dict[str, object]]:
    """``micinfo`` text -> {device: {"model", "active_cores", "memory_mb"}} (what is present)."""
    devices: Dict[str, Dict[str, object]] = {}
    current: Optional[Dict[str, object]] = None
    for line in text.splitlines():
        header = re.match(r"^\s*Device No:\s*\d+\s*,\s*Device Name:\s*(mic\d{1,3})\s*$", line)
        if header:
            current = devices.setdefault(header.group(1), {})
            continue
        if current is None or ":" not in line:
            continue
        key, _, value = (part.strip() for part in line.partition(":"))
        if key == "Board SKU" and value:
            current["model"] = SAFE_TEXT_RE.sub("", value)[:64]
        elif key == "Total No of Active Cores" and value.isdigit():
            current["active_cores"] = int(value)
        elif key == "GDDR Size":
            size = re.match(r"^(\d{1,9})\s*MB$", value)
            if size:
                current["memory_mb"] = int(size.group(1))
    return devices


def device_models(config: NodeConfig, micinfo_text: Optional[str]) -> str:
    if micinfo_text is None:
        return "emulated"
    parsed = parse_micinfo(micinfo_text)
    models = [f"{d.device}={parsed[d.device].get('model', 'unknown')}"
              for d in config.devices if d.device in parsed]
    return ",".join(models) if models else "emulated"


def run_micinfo() -> Optional[str]:
    path = shutil.which("micinfo")
    if not path:
        return None
    try:
        out = subprocess.run([path], capture_output=True, timeout=30, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.decode("utf-8", "replace") if out.returncode == 0 else None


def _read_json(directory: str, name: str) -> Optional[dict]:
    obj = read_json(directory, name, 1 << 20)
    return obj if isinstance(obj, dict) else None


def _number(obj: dict, key: str) -> Optional[int]:
    value = obj.get(key)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= rules.MAX_INT:
        return None
    return int(value)


def facts(config: NodeConfig, state_dir: str, micinfo_text: Optional[str],
          max_age_s: float, now: Optional[float] = None) -> List[str]:
    """The ``Attr = value`` lines to print (pure apart from reading the state dir)."""
    now = time.time() if now is None else now
    lines = [format_line("CoSchedNodeConfigOK", True), format_line("CoSchedNodeVersion", __version__),
             format_line("CoSchedDeviceModels", device_models(config, micinfo_text))]
    beat = _read_json(state_dir, "agent.heartbeat")
    beat_time = _number(beat, "time") if beat else None
    lines.append(format_line("CoSchedNodeAgentAlive",
                                beat_time is not None and 0 <= now - beat_time <= max_age_s))
    for device in config.devices:
        name = device.device or ""
        state = _read_json(os.path.join(state_dir, "devices"), f"{name}.json")
        if not state or not rules.DEVICE_RE.match(name):
            continue
        jobs = state.get("jobs")
        for attr, key in (("CoSchedPhiUsedMemory", "used_mb"), ("CoSchedPhiAllocatedMemory", "allocated_mb"),
                          ("CoSchedPhiAllocatedThreads", "allocated_threads"),
                          ("CoSchedPhiBusyCores", "busy_cores")):
            value = _number(state, key)
            if value is not None:
                lines.append(format_line(f"{attr}_{name}", value))
        if isinstance(jobs, list):
            lines.append(format_line(f"CoSchedPhiJobs_{name}", len(jobs)))
    if config.node_slot is not None:
        shared = _read_json(state_dir, "cpusets.json")
        alive = beat_time is not None and 0 <= now - beat_time <= max_age_s
        lines.append(format_line("CoSchedNodeSharing", bool(alive and shared and shared.get("usable") is True)))
        lent = _number(shared, "lent_cpus") if shared else None
        lines.append(format_line("CoSchedLentCpus", min(lent or 0, config.node_slot.cores)))
    killed_dir = os.path.join(state_dir, "killed")
    newest = None
    try:
        names = [n for n in os.listdir(killed_dir) if re.match(r"^\d{1,12}\.\d{1,9}\.json$", n)]
    except OSError:
        names = []
    for name in names:
        record = _read_json(killed_dir, name)
        if record and isinstance(record.get("reason"), str) and _number(record, "time") is not None:
            if newest is None or record["time"] > newest["time"]:
                newest = record
    if newest:
        text = SAFE_TEXT_RE.sub("", f"{name_of(newest)} {newest['reason']}")[:200]
        lines.append(format_line("CoSchedLastKill", text))
    lines += over_limit_lines(killed_dir, names, now)
    alive = beat_time is not None and 0 <= now - beat_time <= max_age_s
    lines += spare_lines(config, state_dir, alive, now, max_age_s)
    lines += published_lines(_read_json(state_dir, STATE_NAME), now, max_age_s)
    return lines


def _real(obj: dict, key: str, low: float, high: float) -> Optional[float]:
    value = obj.get(key)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or not low <= value <= high:
        return None
    return float(value)


def spare_lines(config: NodeConfig, state_dir: str, alive: bool, now: float, max_age_s: float) -> List[str]:
    """The ``CoSchedSpare*`` lines (module docstring) from the agent's DIR/spare.json."""
    slot = config.spare_slot
    if slot is None:
        return []
    spare = _read_json(state_dir, "spare.json")
    values = None
    updated = _number(spare, "updated") if spare else None
    if not alive:
        problem = "the node agent is not alive"
    elif spare is None:
        problem = "the node agent publishes no spare capacity (no spare.json)"
    elif updated is None or not 0 <= now - updated <= max_age_s:
        problem = "the node agent's spare capacity is stale"
    else:
        values = (_real(spare, "cpus", 0, slot.cores), _number(spare, "memory_mb"),
                  _real(spare, "confidence", 0.5, 0.999999), _number(spare, "samples"))
        problem = None
        if any(v is None for v in values) or values[1] > slot.memory_mb or not isinstance(spare.get("usable"), bool):
            problem, values = "the node agent's spare.json holds invalid values", None
        elif spare["usable"] is not True:
            text = spare.get("problem")
            problem = SAFE_TEXT_RE.sub("", text)[:200] if isinstance(text, str) and text else "not usable"
    lines = [format_line("CoSchedSpareUsable", problem is None)]
    if problem is not None:
        lines.append(format_line("CoSchedSpareProblem", problem))
    cpus, memory_mb, confidence, samples = values if values and problem is None else (0.0, 0, None, None)
    lines += [format_line("CoSchedSpareCpus", float(cpus)), format_line("CoSchedSpareMemory", int(memory_mb))]
    if values is not None:
        lines += [format_line("CoSchedSpareConfidence", values[2]), format_line("CoSchedSpareSamples", values[3]),
                  format_line("CoSchedSpareUpdated", updated)]
        lines += spare_evict_lines(spare.get("evict"), slot.slot_id)
        lines += spare_vacated_lines(spare.get("vacated"))
    return lines


def spare_evict_lines(entries: object, spare_slot_id: int) -> List[str]:
    """``CoSchedSpareEvict_<slot> = "<job> <reason>"`` for each spare job the agent asks the
    startd to vacate: only dynamic slots of the spare slot, names the agent writes."""
    out: Dict[str, str] = {}
    for entry in entries[:256] if isinstance(entries, list) else []:
        if not isinstance(entry, dict):
            continue
        slot, job, reason = entry.get("slot"), entry.get("job"), entry.get("reason")
        match = SHORT_SLOT_RE.match(slot) if isinstance(slot, str) else None
        if not match or match.group(1) is None or not slot.startswith(f"slot{spare_slot_id}_") \
                or not isinstance(job, str) or not re.match(r"^\d{1,12}\.\d{1,9}$", job) or not isinstance(reason, str):
            continue
        out[slot] = f"{job} {SAFE_TEXT_RE.sub('', reason)[:200]}"
    return [format_line(f"CoSchedSpareEvict_{slot}", out[slot]) for slot in sorted(out)]


def spare_vacated_lines(entries: object) -> List[str]:
    """``CoSchedSpareVacated_<cluster>_<proc> = "<unix time> <reason>"`` for each eviction
    request whose claim has ended (the newest per job): valid job ids and times only."""
    out: Dict[str, str] = {}
    for entry in entries[-64:] if isinstance(entries, list) else []:
        if not isinstance(entry, dict):
            continue
        job, reason, when = entry.get("job"), entry.get("reason"), _real(entry, "time", 0, 1e11)
        if not isinstance(job, str) or not re.fullmatch(r"\d{1,12}\.\d{1,9}", job) or not isinstance(reason, str) \
                or when is None:
            continue
        out[job.replace(".", "_")] = f"{int(when)} {SAFE_TEXT_RE.sub('', reason)[:200]}"
    return [format_line(f"CoSchedSpareVacated_{job}", out[job]) for job in sorted(out)]


#: How long a stop stays published for the startd's hold policy (the agent kills a job not
#: held within its --hold-grace, 120 s by default; a record older than this is history).
OVER_LIMIT_PUBLISH_S = 3600.0
SHORT_SLOT_RE = re.compile(r"^slot\d{1,4}(_\d{1,6})?$")


def over_limit_lines(killed_dir: str, names: List[str], now: float) -> List[str]:
    """``CoSchedOverLimit_<slot> = "<job> <reason>"`` for each job the agent stopped over its
    memory in the last hour: the startd's policy (config.d/20) holds the job of that slot
    whose JobId starts the value, with the reason as its HoldReason. Only the agent's root-
    written records are read; the slot and job must be names the agent writes."""
    latest: Dict[str, dict] = {}
    for name in names:
        record = _read_json(killed_dir, name)
        when = _number(record, "time") if record else None
        slot, job, reason = (record or {}).get("slot"), (record or {}).get("job"), (record or {}).get("reason")
        if when is None or not 0 <= now - when <= OVER_LIMIT_PUBLISH_S or not isinstance(reason, str) \
                or not isinstance(slot, str) or not SHORT_SLOT_RE.match(slot) \
                or not isinstance(job, str) or not re.match(r"^\d{1,12}\.\d{1,9}$", job):
            continue
        if slot not in latest or when > latest[slot]["time"]:
            latest[slot] = {"time": when, "text": f"{job} {SAFE_TEXT_RE.sub('', reason)[:200]}"}
    return [format_line(f"CoSchedOverLimit_{slot}", latest[slot]["text"]) for slot in sorted(latest)]


def name_of(record: dict) -> str:
    job = record.get("job")
    return job if isinstance(job, str) and re.match(r"^\d{1,12}\.\d{1,9}$", job) else "?"


def main(argv: Optional[Sequence[str]] = None, stdout: Optional[TextIO] = None,
         micinfo_text: Optional[str] = "probe") -> int:
    stdout = sys.stdout if stdout is None else stdout
    parser = argparse.ArgumentParser(prog=PROGRAM, description=__doc__.split("\n")[0])
    parser.add_argument("--node-config", default=DEFAULT_NODE_CONFIG,
                        help=f"the node config (root-owned; default {DEFAULT_NODE_CONFIG})")
    parser.add_argument("--state-dir", help="the node agent's state dir (default: the config's)")
    parser.add_argument("--max-age", type=float, default=180.0, help="heartbeat age limit, seconds")
    try:
        args = parser.parse_args(argv)
        config = load_node_config(args.node_config)
        state_dir = state_dir_for(config, args.state_dir)
    except SystemExit as exc:
        return EXIT_BAD_CONFIG if exc.code else EXIT_OK
    except ConfigError as exc:
        log_line(None, PROGRAM, f"bad node config: {exc}")
        stdout.write(format_line("CoSchedNodeConfigOK", False) + "\n")
        return EXIT_BAD_CONFIG
    try:
        text = run_micinfo() if micinfo_text == "probe" else micinfo_text
        stdout.write("\n".join(facts(config, state_dir, text, args.max_age)) + "\n")
    except Exception as exc:  # a cron job never dies with a traceback
        log_line(None, PROGRAM, f"internal error {exc.__class__.__name__}: {exc}")
        stdout.write(format_line("CoSchedNodeConfigOK", True) + "\n")
        return EXIT_INTERNAL
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
