#!/usr/bin/python3
"""PREPARE_JOB hook: cap a device job's threads and pin it to hardware threads no co-runner holds.

Runs as the JOB'S USER before the job starts (``<KEYWORD>_HOOK_PREPARE_JOB``): job ad on
stdin, slot ad in ``$_CONDOR_MACHINE_AD``, node config in ``$COSCHED_NODE_CONFIG``.  For a
job on a device slot it places the job on as many of the device's compute units (Xeon Phi:
hardware threads) as it requests, disjoint from the live co-runners' (whole free cores
first, lowest first; they need not be contiguous: ``cosched_node.place_units``), prints an
``Environment`` line (the job's own variables kept) from the device kind's templates in the
node config (Xeon Phi: OMP_NUM_THREADS / MIC_OMP_NUM_THREADS = RequestPhiThreads and
``MIC_KMP_AFFINITY=granularity=fine,explicit,proclist=[...]`` on those threads' logical
CPUs), and records the allocation in the node agent's state dir (protocol: cosched_node's
docstring).  This is COSMIC's node-side role (Section IV-D2 of paper 002): no thread
oversubscription, thread affinity, and a refusal of any start that would oversubscribe the
device even if HTCondor's accounting was stale or forged.  It counts what the planner and
HTCondor count (threads and memory per device), so it refuses a start exactly when the
memory or the threads of the live co-runners plus this job exceed the device's.

Spread jobs (SNS, paper 000: a job ad with ``CoSchedProgram`` and no device memory request,
on a socket slot): prints an ``Environment`` line with OMP_NUM_THREADS = RequestCpus and,
when the sidecar pinned it (``CoSchedPinSlot``, ``CoSchedPinLLCWays`` (0 allowed: the proc
shares its job's group), ``CoSchedPinMemBW``, ``CoSchedPinScale``, optional
``CoSchedPinNodes``), writes a ``SpreadRequest`` (kind "spread") for the root node agent,
which puts the job's procs on a cache in one resctrl group and records its run for
piggyback profiling.  The pin must name this node and the socket slot the job runs in;
every value is range-checked.  Other jobs: prints nothing, exits 0.

A refused start prints ``HookStatusCode`` and ``HookStatusMessage`` (a short reason with no
unvalidated ad value) and nothing else; HTCondor 25 takes them over the exit status.  Codes
of 300 and more send the job back to Idle (VacateReasonCode 1007, VacateReasonSubCode = the
code, VacateReason = the message): the sidecar replans it, and config.d/20's START keeps it
off the pin it was refused on.  Lower codes hold it (HoldReasonCode 19, HoldReasonSubCode =
the code, HoldReason = the message).  Every start and refusal is also logged to
DIR/hooks.log (else stderr).

  exit  HookStatusCode  job      meaning
  0     (none)          runs     started (or not a co-scheduled job)
  1     1               held     unexpected internal error
  2     2               held     node config missing or invalid, or the slot is another node's
  3     303             idle     refused: the device's memory or compute would be oversubscribed
                                 by the live co-runners plus this job
  4     4               held     malformed, hostile or inconsistent job / machine ad
  5     305             idle     node agent state dir missing, unsafe or locked
"""

from __future__ import annotations

import os
import re
import stat
import sys
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, TextIO, Tuple

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import cosched_node as cn  # noqa: E402

PROGRAM = "cosched_prepare_job"
ENV_ANY_NAME_RE = re.compile(r"^[^=\s'\"]{1,256}$")


class Refusal(Exception):
    """A start a new plan can fix: the device is full given its live co-runners (the job
    goes back to Idle, HookStatusCode 303)."""


# ---------------------------------------------------------------------------------------
# Environment attribute (new-style "A=1 B='x y'" and old-style "A=1;B=2")

def parse_environment_v2(text: str) -> List[Tuple[str, str]]:
    """Split HTCondor's V2 environment: whitespace separated, '...' quotes, '' is a quote."""
    tokens: List[str] = []
    current: List[str] = []
    in_token = quoted = False
    i = 0
    while i < len(text):
        ch = text[i]
        if quoted:
            if ch == "'":
                if i + 1 < len(text) and text[i + 1] == "'":
                    current.append("'")
                    i += 2
                    continue
                quoted = False
            else:
                current.append(ch)
        elif ch == "'":
            quoted = in_token = True
        elif ch.isspace():
            if in_token:
                tokens.append("".join(current))
                current, in_token = [], False
        else:
            current.append(ch)
            in_token = True
        i += 1
    if quoted:
        raise ValueError("unbalanced single quote in Environment")
    if in_token:
        tokens.append("".join(current))
    return [_split_assignment(token) for token in tokens]


def parse_environment_v1(text: str) -> List[Tuple[str, str]]:
    """Old-style ``Env``: ``A=1;B=2``."""
    return [_split_assignment(item) for item in text.split(";") if item.strip()]


def _split_assignment(token: str) -> Tuple[str, str]:
    name, sep, value = token.partition("=")
    if not sep or not ENV_ANY_NAME_RE.match(name):
        raise ValueError("Environment entry is not NAME=value")
    return name, value


def format_environment_v2(pairs: Sequence[Tuple[str, str]]) -> str:
    parts = []
    for name, value in pairs:
        if value == "" or any(ch.isspace() or ch in "'\"" for ch in value):
            value = "'" + value.replace("'", "''") + "'"
        parts.append(f"{name}={value}")
    return " ".join(parts)


def merge_environment(job_ad: Dict[str, object], updates: Sequence[Tuple[str, str]]) -> str:
    """The job's Environment (or old Env) with ``updates`` set; existing entries kept in order."""
    existing = cn.ad_get(job_ad, "Environment")
    if isinstance(existing, str):
        pairs = parse_environment_v2(existing)
    elif existing is None and isinstance(cn.ad_get(job_ad, "Env"), str):
        pairs = parse_environment_v1(cn.ad_get(job_ad, "Env"))
    elif existing is None:
        pairs = []
    else:
        raise ValueError("Environment is not a string")
    wanted = dict(updates)
    merged = [(name, wanted.pop(name) if name in wanted else value) for name, value in pairs]
    merged.extend((name, value) for name, value in updates if name in wanted)
    return format_environment_v2(merged)


def device_environment(slot: cn.SlotConfig, device: str, threads: int, units: cn.Units) -> List[Tuple[str, str]]:
    """Compute cap and affinity for one job on a device, from its kind's templates (Xeon Phi:
    OpenMP thread caps and an explicit list of the logical CPUs of its hardware threads)."""
    return slot.device_kind.job_environment(device, threads, units)


# ---------------------------------------------------------------------------------------
# Pure decisions

def resolve_slot(machine_ad: Dict[str, object], config: cn.NodeConfig) -> Tuple[str, Optional[cn.SlotConfig]]:
    """(short dynamic slot name, its device slot config or None for a non-device slot)."""
    name = cn.ad_str(machine_ad, "Name", re.compile(r"^slot\d{1,4}(_\d{1,6})?@[A-Za-z0-9_.@-]{1,255}$"))
    match = cn.SLOT_NAME_RE.match(name or "")
    if not match:
        raise cn.AdError("machine ad Name is not slotN[_M]@...")
    short, slot_id = match.group(1), int(match.group(2))
    hosts = (name or "").split("@")[1:]
    if config.node not in (hosts[0], hosts[-1].split(".")[0]):
        raise cn.ConfigError(f"slot {name} is not on node {config.node}: wrong COSCHED_NODE_CONFIG?")
    slot = config.slot(slot_id)
    named, name_attr = None, ""
    for name_attr in sorted({d.device_kind.device_name_attr for d in config.devices}):
        named = cn.ad_str(machine_ad, name_attr, cn.DEVICE_RE, required=False)
        if named is not None:
            break
    if named is not None:
        by_name = config.device(named)
        if by_name is None or by_name.device_kind.device_name_attr != name_attr:
            raise cn.AdError(f"machine ad {name_attr} {named} is not a device of node {config.node}")
        if slot is not None and slot is not by_name:
            raise cn.AdError(f"slot {short} is slot id {slot_id} in the node config, "
                             f"but its ad names device {named}")
        return short, by_name
    if slot is None:
        raise cn.AdError(f"slot id {slot_id} of {short} is not in the node config of {config.node}")
    return short, slot if slot.kind == "device" else None


PIN_SLOT_RE = re.compile(r"^slot(\d{1,4})@([A-Za-z0-9_.@-]{1,255})$")


@dataclass(frozen=True)
class SpreadDemand:
    """What a spread job's ad asks for; ``pinned`` False when the sidecar set no pin."""
    program: str
    cpus: int
    pinned: bool
    slot_id: int = 0
    cache_id: int = 0
    llc_ways: int = 0
    mem_bw_gbs: float = 0.0
    scale: int = 0
    nodes: int = 0


def is_spread_job(job_ad: Dict[str, object], config: cn.NodeConfig) -> bool:
    """Names its program and requests the memory of none of the node's device kinds."""
    return cn.ad_get(job_ad, "CoSchedProgram") is not None and all(
        cn.ad_get(job_ad, "Request" + d.device_kind.memory_attr) is None for d in config.devices)


def check_pin_slot(pin: str, config: cn.NodeConfig, short_slot: str) -> cn.SlotConfig:
    """The socket slot config a ``CoSchedPinSlot`` value names; AdError unless it is the
    partitionable slot (``slotN@node@node.domain``) of this node the job runs in."""
    match = PIN_SLOT_RE.match(pin)
    if not match:
        raise cn.AdError("attribute CoSchedPinSlot is not slotN@host")
    hosts = match.group(2).split("@")
    mine = (config.node, f"{config.node}.{config.domain}")
    if len(hosts) > 2 or any(host not in mine for host in hosts):
        raise cn.AdError(f"attribute CoSchedPinSlot names another node, not {config.node}")
    slot_id = int(match.group(1))
    running = cn.SLOT_NAME_RE.match(short_slot + "@")
    if not running or int(running.group(2)) != slot_id:
        raise cn.AdError(f"attribute CoSchedPinSlot names slot{slot_id}, but the job runs in {short_slot}")
    slot = config.slot(slot_id)
    if slot is None or slot.kind != "socket":
        raise cn.AdError(f"attribute CoSchedPinSlot: slot{slot_id} is not a socket slot of {config.node}")
    if slot.cache_id is None:
        raise cn.ConfigError(f"socket slot {slot_id} of {config.node} has no cache_id")
    return slot


def spread_demand(job_ad: Dict[str, object], config: cn.NodeConfig, short_slot: str) -> SpreadDemand:
    """Validate a spread job's program, cpus and pin attributes (all hostile)."""
    program = cn.ad_str(job_ad, "CoSchedProgram", cn.PROGRAM_RE)
    if program is None:
        raise cn.AdError("attribute CoSchedProgram is missing")
    cpus = cn.ad_int(job_ad, "RequestCpus", 1, 100000, default=1)
    pin = cn.ad_get(job_ad, "CoSchedPinSlot")
    if pin is None:
        return SpreadDemand(program, cpus, False)
    if not isinstance(pin, str):
        raise cn.AdError("attribute CoSchedPinSlot is not a string")
    slot = check_pin_slot(pin, config, short_slot)
    if slot.cores and cpus > slot.cores:
        raise cn.AdError(f"RequestCpus {cpus} > the {slot.cores} cores of slot{slot.slot_id}")
    ways = cn.ad_int(job_ad, "CoSchedPinLLCWays", 0, slot.llc_ways or cn.CBM_WIDTH_MAX)
    bw = cn.ad_number(job_ad, "CoSchedPinMemBW", 0.0, slot.mem_bw_gbs or cn.MAX_BW_GBS)
    scale = cn.ad_int(job_ad, "CoSchedPinScale", 1, 8)
    if scale not in cn.SCALE_FACTORS:
        raise cn.AdError(f"attribute CoSchedPinScale={scale} is not one of {cn.SCALE_FACTORS}")
    nodes = cn.ad_int(job_ad, "CoSchedPinNodes", 1, 100000, default=0) \
        if cn.ad_get(job_ad, "CoSchedPinNodes") is not None else 0
    return SpreadDemand(program, cpus, True, slot.slot_id, slot.cache_id or 0, ways, bw, scale, nodes)


def job_identity(job_ad: Dict[str, object]) -> Tuple[int, int, str]:
    return (cn.ad_int(job_ad, "ClusterId", 0, 10 ** 12 - 1), cn.ad_int(job_ad, "ProcId", 0, 10 ** 9 - 1),
            cn.ad_str(job_ad, "Owner", cn.OWNER_RE) or "")


def device_demand(job_ad: Dict[str, object], machine_ad: Dict[str, object],
                  device: cn.SlotConfig) -> Optional[Tuple[int, int]]:
    """(compute, memory_mb) the job asks of the device (attributes of its kind: Xeon Phi
    RequestPhiThreads, RequestPhiMemory), None if it asks for nothing."""
    kind = device.device_kind
    compute_attr, memory_attr = "Request" + kind.compute_attr, "Request" + kind.memory_attr
    if cn.ad_get(job_ad, compute_attr) is None and cn.ad_get(job_ad, memory_attr) is None:
        return None
    threads = cn.ad_int(job_ad, compute_attr, 0, cn.MAX_INT)
    memory_mb = cn.ad_int(job_ad, memory_attr, 0, cn.MAX_INT, default=0)
    if threads == 0 and memory_mb == 0:
        return None
    if threads == 0:
        raise cn.AdError(f"{compute_attr} must be >= 1 for a job that requests device memory")
    for attr, asked in ((kind.compute_attr, threads), (kind.memory_attr, memory_mb)):
        if cn.ad_get(machine_ad, attr) is not None:
            allocated = cn.ad_int(machine_ad, attr, 0, cn.MAX_INT)
            if asked > allocated:
                raise cn.AdError(f"requests {asked} {attr} but its slot was allocated {allocated}")
    return threads, memory_mb


def place(device: cn.SlotConfig, threads: int, memory_mb: int, co_runners: Sequence[cn.Request]) -> cn.Units:
    """The compute units for the job, or Refusal exactly when the memory or compute of the
    live co-runners plus this job exceed the device's."""
    kind = device.device_kind
    used_mb = sum(r.memory_mb for r in co_runners)
    used_threads = sum(r.threads for r in co_runners)
    if used_mb + memory_mb > device.device_memory_mb:
        raise Refusal(f"device memory {used_mb}+{memory_mb} MB > {device.device_memory_mb} MB on {device.device}")
    if used_threads + threads > device.hardware_threads:
        raise Refusal(f"device {kind.compute_attr} {used_threads}+{threads} > {device.hardware_threads} "
                      f"on {device.device}")
    units = cn.place_units(device.hardware_threads, kind.compute_per_core,
                           [r for runner in co_runners for r in runner.units], threads)
    if units is None:  # unreachable: disjoint or not, held units never outnumber used_threads
        raise Refusal(f"no {threads} free {kind.compute_attr} on {device.device}")
    return units


# ---------------------------------------------------------------------------------------
# State dir

def check_state_dirs(state_dir: str) -> str:
    """The requests dir, after checking it is the agent's: real dir, sticky, root- or our-owned."""
    requests_dir = os.path.join(state_dir, "requests")
    for path, sticky in ((state_dir, False), (requests_dir, True)):
        try:
            info = os.lstat(path)
        except OSError as exc:
            raise cn.StateError(exc.errno or 0, f"{path}: {exc.strerror} (is the node agent running?)") from None
        if not stat.S_ISDIR(info.st_mode) or info.st_uid not in (0, os.geteuid()):
            raise cn.StateError(0, f"{path} is not a directory owned by root")
        if sticky and not info.st_mode & stat.S_ISVTX:
            raise cn.StateError(0, f"{path} lacks the sticky bit")
        if not sticky and info.st_mode & 0o022:
            raise cn.StateError(0, f"{path} is group/other-writable")
    return requests_dir


def reserve(state_dir: str, make_request, device: cn.SlotConfig, threads: int, memory_mb: int,
            proc_root: str = "/proc") -> cn.Request:
    """Under the state lock: read live co-runners, place the job, write its request file."""
    requests_dir = check_state_dirs(state_dir)
    with cn.StateLock(state_dir):
        mine = make_request(((0, threads),)).file_name
        co_runners = [r for r, _ in cn.read_requests(requests_dir, device.device)
                      if r.file_name != mine and cn.request_is_live(r, proc_root)]
        request = make_request(place(device, threads, memory_mb, co_runners))
        try:
            cn.write_json_atomic(requests_dir, request.file_name, request.to_json(), 0o644)
        except OSError as exc:
            raise cn.StateError(exc.errno or 0, f"cannot write request {request.file_name}: {exc.strerror}") from None
    return request


def scratch_dir(env: Dict[str, str], cwd: Optional[str]) -> str:
    scratch = env.get("_CONDOR_SCRATCH_DIR") or (cwd if cwd is not None else os.getcwd())
    if not cn.ABS_PATH_RE.match(scratch) or "/../" in scratch + "/":
        raise cn.AdError("scratch directory path has disallowed characters")
    return scratch


def starter(starter_pid: Optional[int]) -> Tuple[int, int]:
    """(pid, start time) of the starter: the hook's parent process."""
    parent = os.getppid() if starter_pid is None else starter_pid
    parent_start = cn.process_start_time(parent)
    if parent <= 1 or parent_start is None:
        raise cn.StateError(0, f"starter process {parent} not found in /proc")
    return parent, parent_start


def start_spread(job_ad: Dict[str, object], config: cn.NodeConfig, state_dir: str, short_slot: str,
                 cluster: int, proc: int, owner: str, env: Dict[str, str], stdout: TextIO,
                 starter_pid: Optional[int], cwd: Optional[str], log) -> int:
    """A spread job: thread cap, and (pinned) a request for the agent's resctrl group."""
    demand = spread_demand(job_ad, config, short_slot)
    environment = merge_environment(job_ad, [("OMP_NUM_THREADS", str(demand.cpus))])
    job = f"{cluster}.{proc}"
    if demand.pinned:
        scratch = scratch_dir(env, cwd)
        parent, parent_start = starter(starter_pid)
        request = cn.SpreadRequest(cluster, proc, short_slot, demand.slot_id, demand.cache_id,
                                   demand.llc_ways, demand.mem_bw_gbs, demand.program, demand.scale,
                                   demand.nodes, demand.cpus, parent, parent_start, scratch, owner)
        write_spread_request(state_dir, request)
        log(f"job {job} (program {demand.program}, scale {demand.scale}) started on {config.node} "
            f"slot {short_slot}: {demand.cpus} cpus, {demand.llc_ways} LLC ways on cache "
            f"{demand.cache_id}, {demand.mem_bw_gbs:g} GB/s")
    else:
        log(f"job {job} (program {demand.program}) on {config.node} slot {short_slot} has no "
            "CoSchedPinSlot: runs without a resctrl group")
    stdout.write(cn.format_line("Environment", environment) + "\n")
    stdout.flush()
    return cn.EXIT_OK


def write_spread_request(state_dir: str, request: cn.SpreadRequest) -> None:
    requests_dir = check_state_dirs(state_dir)
    with cn.StateLock(state_dir):
        try:
            cn.write_json_atomic(requests_dir, request.file_name, request.to_json(), 0o644)
        except OSError as exc:
            raise cn.StateError(exc.errno or 0, f"cannot write request {request.file_name}: {exc.strerror}") from None


def refuse(stdout: TextIO, exit_code: int, message: str) -> int:
    """Print the refusal HTCondor shows the user (HookStatusCode and HookStatusMessage, see
    the module docstring) and return the exit code (non-zero: fails closed should the
    status lines be lost)."""
    try:
        stdout.write(cn.format_line("HookStatusCode", cn.HOOK_STATUS[exit_code]) + "\n"
                     + cn.format_line("HookStatusMessage", cn.hook_message("condor_sched: " + message)) + "\n")
        stdout.flush()
    except (OSError, ValueError):
        pass
    return exit_code


def main(argv: Optional[Sequence[str]] = None, stdin: Optional[object] = None,
         stdout: Optional[TextIO] = None, env: Optional[Dict[str, str]] = None,
         starter_pid: Optional[int] = None, cwd: Optional[str] = None) -> int:
    env = dict(os.environ) if env is None else env
    stdout = sys.stdout if stdout is None else stdout
    stdin = sys.stdin.buffer if stdin is None else stdin
    log_path: Optional[str] = None
    job = "?"
    where = "this node"

    def log(message: str) -> None:
        cn.log_line(log_path, PROGRAM, message)

    try:
        config_path = env.get("COSCHED_NODE_CONFIG", "")
        if not config_path:
            raise cn.ConfigError("COSCHED_NODE_CONFIG is not set")
        config = cn.load_node_config(config_path)
        where = config.node
        state_dir = cn.state_dir_for(config, env)
        log_path = os.path.join(state_dir, "hooks.log")

        job_ad = cn.parse_classad(stdin.read(cn.MAX_AD_BYTES + 1), "job ad")
        cluster, proc, owner = job_identity(job_ad)
        job = f"{cluster}.{proc}"
        machine_ad_path = env.get("_CONDOR_MACHINE_AD", "")
        if not machine_ad_path:
            raise cn.AdError("_CONDOR_MACHINE_AD is not set")
        try:
            with open(machine_ad_path, "rb") as handle:
                machine_ad = cn.parse_classad(handle.read(cn.MAX_AD_BYTES + 1), "machine ad")
        except OSError as exc:
            raise cn.AdError(f"cannot read machine ad: {exc.strerror}") from None
        short_slot, device = resolve_slot(machine_ad, config)
        if device is None:
            if not is_spread_job(job_ad, config):
                return cn.EXIT_OK
            where = f"socket slot {config.node} ({short_slot})"
            return start_spread(job_ad, config, state_dir, short_slot, cluster, proc, owner, env,
                                stdout, starter_pid, cwd, log)
        where = f"device {config.node}/{device.device} ({short_slot})"
        demand = device_demand(job_ad, machine_ad, device)
        if demand is None:
            return cn.EXIT_OK
        threads, memory_mb = demand

        scratch = scratch_dir(env, cwd)
        parent, parent_start = starter(starter_pid)

        def make_request(units: cn.Units) -> cn.Request:
            return cn.Request(cluster, proc, short_slot, device.device or "", memory_mb, threads,
                              units, parent, parent_start, scratch, owner)

        def output(request: cn.Request) -> List[str]:
            environment = merge_environment(job_ad, device_environment(device, request.device, threads, request.units))
            return [cn.format_line("Environment", environment),
                    cn.format_line("CoSchedDevice", request.device),
                    cn.format_line("CoSchedDeviceCores", cn.format_ranges(
                        cn.core_ranges(request.units, device.device_kind.compute_per_core))),
                    cn.format_line("CoSchedDeviceUnits", cn.format_ranges(request.units))]

        output(make_request(((0, threads),)))  # a malformed Environment is refused before reserving
        request = reserve(state_dir, make_request, device, threads, memory_mb)
        lines = output(request)
        stdout.write("\n".join(lines) + "\n")
        stdout.flush()
        cores = cn.core_ranges(request.units, device.device_kind.compute_per_core)
        log(f"job {job} started on {config.node}/{request.device} slot {short_slot}: {threads} "
            f"{device.device_kind.compute_attr}, {memory_mb} MB, units {cn.format_ranges(request.units)} "
            f"(cores {cn.format_ranges(cores)})")
        return cn.EXIT_OK
    except Refusal as exc:
        log(f"job {job} refused on {where}: {exc}")
        return refuse(stdout, cn.EXIT_OVERSUBSCRIBED,
                      f"{where} is full: {exc} (running jobs + this one); back to idle for a new plan")
    except cn.ConfigError as exc:
        log(f"job {job}: bad node config: {exc}")
        return refuse(stdout, cn.EXIT_BAD_CONFIG, f"bad node config on {where}: {exc}")
    except ValueError as exc:  # cn.AdError included
        log(f"job {job}: malformed ad: {exc}")
        return refuse(stdout, cn.EXIT_BAD_AD, f"malformed job or machine ad: {exc}")
    except cn.StateError as exc:
        log(f"job {job}: node agent state unavailable: {exc.strerror or exc}")
        return refuse(stdout, cn.EXIT_NO_STATE, f"start refused on {where}: node agent state unavailable "
                      f"({exc.strerror or exc}); back to idle for a new plan")
    except Exception as exc:  # never a traceback: the hold must carry a logged reason
        log(f"job {job}: internal error {exc.__class__.__name__}: {exc}")
        return refuse(stdout, cn.EXIT_INTERNAL, f"internal error ({exc.__class__.__name__}) in the "
                      f"PREPARE_JOB hook on {where}; see hooks.log there")


if __name__ == "__main__":
    sys.exit(main())
