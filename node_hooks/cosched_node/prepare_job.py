"""PREPARE_JOB hook: cap a job's threads and bind a device job to the compute units the
node agent placed it on.

Runs as the JOB'S USER before the job starts (``<KEYWORD>_HOOK_PREPARE_JOB``): job ad on
stdin, slot ad in ``$_CONDOR_MACHINE_AD``, the node config from ``--node-config PATH`` (in
``<KEYWORD>_HOOK_PREPARE_JOB_ARGS``; default /etc/condor_sched/node.json, root-owned) and
the agent's state dir from ``--state-dir`` (default: the config's). It
validates the job ad (the same ``rules`` as the planner), then asks the root node agent
over its socket (``channel``) where the job runs: the agent answers from the startd's claim
of this hook's starter, never from anything the job wrote, and places a device job on
compute units no live co-runner holds, or refuses it when the device is full. The hook then
prints an ``Environment`` line (the job's own variables kept, every variable once: a copy
the job wrote of one the hook sets is dropped, ``environment``) from the device kind's
templates (Xeon Phi: OMP_NUM_THREADS / MIC_OMP_NUM_THREADS and
``MIC_KMP_AFFINITY=granularity=fine,explicit,proclist=[...]``), and ``CoSchedDevice*``.
Spread jobs (``CoSchedProgram``, no device memory) get OMP_NUM_THREADS = RequestCpus; a
pinned one is announced to the agent, which groups its procs in resctrl. On a node-sharing
node (issue 14) a job of the node slot gets ``COSCHED_CPUS`` (the CPUs the agent gave it,
which its cgroup's cpuset holds) and a guest of the guest slot ``OMP_NUM_THREADS=k`` and
``COSCHED_CPUS`` (the k CPUs it takes of its mate's), both also as ``CoSchedCpus``; the
agent refuses a guest whose mate is not running here, already hosts a guest, or would
oversubscribe memory, and a node-slot job that needs CPUs lent to a guest (exit 3). A node-slot
job whose agent is unreachable starts without a cpuset (it opted into nothing). A job of a spare
slot (paper 003) starts only once the agent confined its starter in a cgroup (refused, exit 3,
where no cgroup is usable; exit 5 when the agent is unreachable). On a GPU node
(issue 13) a job holding GPUs gets CUDA_VISIBLE_DEVICES (their uuids), CUDA_MPS_PIPE_DIRECTORY,
CUDA_MPS_ACTIVE_THREAD_PERCENTAGE and CUDA_MPS_PINNED_DEVICE_MEM_LIMIT from its dynamic slot's
CoSchedGPU<k>Memory / Compute, once the agent lets it start (refused, exit 3: a GPU's memory
or a second Owner on a GPU, or a claim that is not the GPUs and shares the job's ad pins now),
and ``CoSchedGPUs``; a job holding none gets
CUDA_VISIBLE_DEVICES=10000, as HTCondor's ``use feature:GPUs`` gives a job with no GPU. Other
jobs: exit 0, nothing printed.

A refused start prints ``HookStatusCode`` and ``HookStatusMessage`` (a short reason; a value
it quotes is cut to 40 characters, and the message to 240 printable ASCII characters with no
backslash, so the starter parses exactly two attributes) and nothing else; HTCondor 25 takes them over the exit status: 300
and more send the job back to Idle (VacateReasonCode 1007; the sidecar replans it and
config.d/20 keeps it off the pin it was refused on), lower codes hold it (HoldReasonCode 19,
HoldReasonSubCode = the code).

  exit  HookStatusCode  job      meaning
  0     (none)          runs     started (or not a co-scheduled job)
  1     1               held     unexpected internal error
  2     2               held     node config missing or invalid, or the slot is another node's
  3     303             idle     refused: the device's memory or compute would be oversubscribed
                                 by the live co-runners plus this job; a guest or node-slot start
                                 the node agent cannot give CPUs; a GPU claim that is not the
                                 job's current pin (see above)
  4     4               held     malformed, hostile or inconsistent job / machine ad
  5     305             idle     the node agent is unreachable or does not know this start
"""

from __future__ import annotations

import os
import re
import sys
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, TextIO, Tuple

from cosched_node import channel, cpusets, gpus, rules
from cosched_node.ads import MAX_AD_BYTES, Expr, ad_get, ad_int, ad_str, format_line, hook_message, parse_classad
from cosched_node.config import DEFAULT_NODE_CONFIG, NodeConfig, SlotConfig, load_node_config, state_dir_for
from cosched_node.environment import merge_environment
from cosched_node.errors import (EXIT_BAD_AD, EXIT_BAD_CONFIG, EXIT_INTERNAL, EXIT_NO_STATE, EXIT_OK,
                                 EXIT_OVERSUBSCRIBED, AdError, ConfigError, StateError)
from cosched_node.placement import core_ranges, format_ranges, parse_units

PROGRAM = "cosched_prepare_job"
#: The HookStatusCode for each exit code: a refusal a new plan can fix sends the job back to
#: Idle (>= 300); one no plan fixes holds it with the exit code as HoldReasonSubCode.
HOOK_IDLE_MIN = 300
HOOK_STATUS = {EXIT_INTERNAL: EXIT_INTERNAL, EXIT_BAD_CONFIG: EXIT_BAD_CONFIG, EXIT_BAD_AD: EXIT_BAD_AD,
               EXIT_OVERSUBSCRIBED: HOOK_IDLE_MIN + EXIT_OVERSUBSCRIBED,
               EXIT_NO_STATE: HOOK_IDLE_MIN + EXIT_NO_STATE}


class Refusal(Exception):
    """The node agent refused the start; ``code`` is the exit code (3 full, 5 retry)."""

    def __init__(self, code: int, message: str, tail: str = " (running jobs + this one)") -> None:
        super().__init__(message)
        self.code = code
        self.tail = tail   # appended to a code-3 refusal's message


def resolve_slot(machine_ad: Dict[str, object], config: NodeConfig) -> Tuple[str, Optional[SlotConfig]]:
    """(short dynamic slot name, its device slot config or None for a non-device slot)."""
    name = ad_str(machine_ad, "Name", re.compile(r"^slot\d{1,4}(_\d{1,6})?@[A-Za-z0-9_.@-]{1,255}$"))
    match = rules.SLOT_NAME_RE.match(name or "")
    if not match:
        raise AdError("machine ad Name is not slotN[_M]@...")
    short, slot_id = match.group(1), int(match.group(2))
    hosts = (name or "").split("@")[1:]
    if config.node not in (hosts[0], hosts[-1].split(".")[0]):
        raise ConfigError(f"slot {name} is not on node {config.node}: wrong --node-config in the hook's ARGS?")
    slot = config.slot(slot_id)
    named, name_attr = None, ""
    for name_attr in sorted({d.device_kind.device_name_attr for d in config.devices}):
        named = ad_str(machine_ad, name_attr, rules.DEVICE_RE, required=False)
        if named is not None:
            break
    if named is not None:
        by_name = config.device(named)
        if by_name is None or by_name.device_kind.device_name_attr != name_attr:
            raise AdError(f"machine ad {name_attr} {named} is not a device of node {config.node}")
        if slot is not None and slot is not by_name:
            raise AdError(f"slot {short} is slot id {slot_id} in the node config, "
                             f"but its ad names device {named}")
        return short, by_name
    if slot is None:
        raise AdError(f"slot id {slot_id} of {short} is not in the node config of {config.node}")
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


def is_spread_job(job_ad: Dict[str, object], config: NodeConfig) -> bool:
    """Names its program and requests the memory of none of the node's device kinds."""
    return ad_get(job_ad, "CoSchedProgram") is not None and all(
        ad_get(job_ad, "Request" + d.device_kind.memory_attr) is None for d in config.devices)


def check_pin_slot(pin: str, config: NodeConfig, short_slot: str) -> SlotConfig:
    """The socket slot config a ``CoSchedPinSlot`` value names; AdError unless it is the
    partitionable slot (``slotN@node@node.domain``) of this node the job runs in."""
    match = PIN_SLOT_RE.match(pin)
    if not match:
        raise AdError("attribute CoSchedPinSlot is not slotN@host")
    hosts = match.group(2).split("@")
    mine = (config.node, f"{config.node}.{config.domain}")
    if len(hosts) > 2 or any(host not in mine for host in hosts):
        raise AdError(f"attribute CoSchedPinSlot names another node, not {config.node}")
    slot_id = int(match.group(1))
    running = rules.SLOT_NAME_RE.match(short_slot + "@")
    if not running or int(running.group(2)) != slot_id:
        raise AdError(f"attribute CoSchedPinSlot names slot{slot_id}, but the job runs in {short_slot}")
    slot = config.slot(slot_id)
    if slot is None or slot.kind != "socket":
        raise AdError(f"attribute CoSchedPinSlot: slot{slot_id} is not a socket slot of {config.node}")
    if slot.cache_id is None:
        raise ConfigError(f"socket slot {slot_id} of {config.node} has no cache_id")
    return slot


def _checked(rule, value: object, attr: str, *args: object):
    try:
        return rule(value, attr, *args)
    except rules.RuleError as exc:
        raise AdError(f"attribute {exc}") from None


def spread_demand(job_ad: Dict[str, object], config: NodeConfig, short_slot: str) -> SpreadDemand:
    """Validate a spread job's program, cpus and pin attributes (all hostile; ``rules``)."""
    program = _checked(rules.program_name, ad_get(job_ad, "CoSchedProgram"), "CoSchedProgram")
    cpus = ad_int(job_ad, "RequestCpus", 1, 100000, default=1)
    pin = ad_get(job_ad, "CoSchedPinSlot")
    if pin is None:
        return SpreadDemand(program, cpus, False)
    if not isinstance(pin, str):
        raise AdError("attribute CoSchedPinSlot is not a string")
    slot = check_pin_slot(pin, config, short_slot)
    if slot.cores and cpus > slot.cores:
        raise AdError(f"RequestCpus {cpus} > the {slot.cores} cores of slot{slot.slot_id}")
    ways = _checked(rules.llc_ways, ad_get(job_ad, "CoSchedPinLLCWays"), "CoSchedPinLLCWays",
                    slot.llc_ways or rules.CBM_WIDTH_MAX)
    bw = _checked(rules.mem_bw_gbs, ad_get(job_ad, "CoSchedPinMemBW"), "CoSchedPinMemBW",
                  slot.mem_bw_gbs or rules.MAX_BW_GBS)
    scale = _checked(rules.scale_factor, ad_get(job_ad, "CoSchedPinScale"), "CoSchedPinScale")
    nodes = ad_int(job_ad, "CoSchedPinNodes", 1, 100000, default=0) \
        if ad_get(job_ad, "CoSchedPinNodes") is not None else 0
    return SpreadDemand(program, cpus, True, slot.slot_id, slot.cache_id or 0, ways, bw, scale, nodes)


def job_identity(job_ad: Dict[str, object]) -> Tuple[int, int]:
    try:
        return rules.job_id(ad_get(job_ad, "ClusterId"), ad_get(job_ad, "ProcId"))
    except rules.RuleError as exc:
        raise AdError(f"attribute {exc}") from None


#: ``device_demand`` of a request written as an expression: the agent checks the allocation.
EVALUATED_BY_THE_STARTD = (-1, -1)


def device_demand(job_ad: Dict[str, object], device: SlotConfig) -> Optional[Tuple[int, int]]:
    """(memory_mb, compute) the job asks of the device (its kind's attributes, Xeon Phi
    RequestPhiMemory and RequestPhiThreads), None when it asks no device memory: the very
    rule the planner applies (``rules.device_request``)."""
    kind = device.device_kind
    memory_attr, compute_attr = "Request" + kind.memory_attr, "Request" + kind.compute_attr
    memory, compute = ad_get(job_ad, memory_attr), ad_get(job_ad, compute_attr)
    if isinstance(memory, Expr) or isinstance(compute, Expr):
        # An expression the hook cannot evaluate: the startd evaluated it into the claim's
        # allocation, which the agent checks by the same rules.
        return EVALUATED_BY_THE_STARTD
    try:
        return rules.device_request(memory_attr, memory, compute_attr, compute)
    except rules.RuleError as exc:
        raise AdError(f"attribute {exc}") from None


def ask_agent(state_dir: str, ask=channel.ask) -> Dict[str, Any]:
    reply = ask(state_dir)
    if reply.get("status") != "ok":
        code = reply.get("code")
        message = reply.get("message")
        if code == EXIT_BAD_AD:
            raise AdError(message if isinstance(message, str) else "the node agent refused the request")
        raise Refusal(code if code in (EXIT_OVERSUBSCRIBED, EXIT_NO_STATE) else EXIT_NO_STATE,
                      message if isinstance(message, str) else "refused by the node agent")
    return reply


def device_lines(job_ad: Dict[str, object], device: SlotConfig, reply: Dict[str, Any]) -> List[str]:
    """What the hook prints for a device job the agent placed (``reply``)."""
    if reply.get("kind") != "device" or reply.get("device") != device.device:
        raise Refusal(EXIT_NO_STATE, f"the node agent does not know this start as one on {device.device}")
    compute = rules.count("compute", reply.get("compute"), 1, rules.MAX_UNITS)
    units = parse_units(reply.get("units"), compute)
    kind = device.device_kind
    environment = merge_environment(job_ad, kind.job_environment(device.device or "", compute, units))
    return [format_line("Environment", environment), format_line("CoSchedDevice", device.device),
            format_line("CoSchedDeviceCores", format_ranges(core_ranges(units, kind.compute_per_core))),
            format_line("CoSchedDeviceUnits", format_ranges(units))]


def shared_lines(job_ad: Dict[str, object], slot: SlotConfig, state_dir: str, ask) -> List[str]:
    """What the hook prints for a job of a node-sharing node's node or guest slot: the CPUs
    the agent gave it (and a guest's thread count), or nothing when the node has no cpusets."""
    merge_environment(job_ad, [])   # a malformed Environment is refused before the agent places it
    try:
        reply = ask_agent(state_dir, ask)
    except StateError:
        if slot.kind == "node":     # an ordinary job: it starts, without a cpuset
            return []
        raise
    except Refusal as exc:
        raise Refusal(exc.code, str(exc), "") from None
    if reply.get("kind") != slot.kind:
        raise Refusal(EXIT_NO_STATE, f"the node agent does not know this start as one in the {slot.kind} slot")
    text = reply.get("cpus")
    if text is None:
        if slot.kind == "guest":
            raise Refusal(EXIT_NO_STATE, "the node agent gave this guest no CPUs")
        return []
    try:
        cpus = cpusets.parse_cpu_list(text)
    except cpusets.CpusetError:
        raise Refusal(EXIT_NO_STATE, "the node agent's CPU list is malformed") from None
    if not cpus:
        raise Refusal(EXIT_NO_STATE, "the node agent's CPU list is empty")
    listed = cpusets.format_cpu_list(cpus)
    updates = [("COSCHED_CPUS", listed)]
    if slot.kind == "guest":
        threads = rules.count("threads", reply.get("threads"), 1, len(cpus))
        updates = [("OMP_NUM_THREADS", str(threads))] + updates
    return [format_line("Environment", merge_environment(job_ad, updates)), format_line("CoSchedCpus", listed)]


def gpu_lines(job_ad: Dict[str, object], machine_ad: Dict[str, object], config: NodeConfig, state_dir: str,
              ask) -> List[str]:
    """What the hook prints for a job on a GPU node (issue 13): CUDA_VISIBLE_DEVICES (uuids)
    and the MPS variables for the GPUs its DYNAMIC SLOT holds (``CoSchedGPU<k>Compute > 0`` in
    the machine ad, never the job ad), once the node agent, from the startd's own claim,
    agrees and lets it start (it refuses a GPU whose memory the co-runners' claims would
    exceed, or a second Owner on a GPU). A claim that is not the job's current GPU pin (the
    sidecar pinned it again after the match: ``gpus.pin_disagreement``) is refused before the
    agent hears of it. A job holding no GPU gets CUDA_VISIBLE_DEVICES=10000."""
    try:
        shares = gpus.claim_shares(machine_ad, len(config.gpus), config.gpu_compute)
    except gpus.GpuError as exc:
        raise AdError(str(exc)) from None
    merge_environment(job_ad, [])   # a malformed Environment is refused before the agent is asked
    stale = gpus.pin_disagreement(shares, ad_get(job_ad, "CoSchedPinGPUs"), ad_get(job_ad, "CoSchedPinGPUCompute"),
                                  ad_get(job_ad, "CoSchedPinGPUMemory"))
    if stale is not None:
        raise Refusal(EXIT_OVERSUBSCRIBED, f"GPU node {config.node}: {stale}", "")
    if shares:
        try:
            reply = ask_agent(state_dir, ask)
        except Refusal as exc:
            raise Refusal(exc.code, str(exc), "") from None
        if reply.get("kind") != "gpu" or reply.get("gpus") != [[g.index, g.memory_mb, g.compute] for g in shares]:
            raise Refusal(EXIT_NO_STATE, "the node agent does not know this start with the GPUs of its slot ad")
    variables = gpus.mps_environment(shares, [g.uuid for g in config.gpus], config.mps_pipe_directory)
    lines = [format_line("Environment", merge_environment(job_ad, variables))]
    if shares:
        lines.append(format_line("CoSchedGPUs", ",".join(str(g.index) for g in shares)))
    return lines


def refuse(stdout: TextIO, exit_code: int, message: str) -> int:
    """Print the refusal HTCondor shows the user and return the exit code (non-zero: fails
    closed should the status lines be lost)."""
    try:
        stdout.write(format_line("HookStatusCode", HOOK_STATUS[exit_code]) + "\n"
                     + format_line("HookStatusMessage", hook_message("condor_sched: " + message)) + "\n")
        stdout.flush()
    except (OSError, ValueError):
        pass
    return exit_code


def hook_arguments(argv: Sequence[str]) -> Tuple[str, Optional[str]]:
    """``--node-config PATH`` and ``--state-dir PATH`` from the hook's ``_ARGS`` knob (the
    admin's, never the job's); anything else is a ConfigError naming it."""
    values: Dict[str, Optional[str]] = {"--node-config": DEFAULT_NODE_CONFIG, "--state-dir": None}
    rest = list(argv)
    while rest:
        option = rest.pop(0)
        name, _, inline = option.partition("=")
        if name not in values:
            raise ConfigError(f"unknown hook argument {option[:40]!r} (PREPARE_JOB_ARGS takes --node-config "
                              "and --state-dir)")
        if not inline and not rest:
            raise ConfigError(f"hook argument {name} needs a value")
        values[name] = inline or rest.pop(0)
    return values["--node-config"] or DEFAULT_NODE_CONFIG, values["--state-dir"]


def prepare(argv: Sequence[str], env: Dict[str, str], stdin, ask) -> Tuple[List[str], str]:
    """The lines to print for this job and where it runs; raises what ``main`` reports."""
    config_path, state_override = hook_arguments(argv)
    config = load_node_config(config_path)
    state_dir = state_dir_for(config, state_override)
    job_ad = parse_classad(stdin.read(MAX_AD_BYTES + 1), "job ad")
    job_identity(job_ad)
    machine_ad_path = env.get("_CONDOR_MACHINE_AD", "")
    if not machine_ad_path:
        raise AdError("_CONDOR_MACHINE_AD is not set")
    try:
        with open(machine_ad_path, "rb") as handle:
            machine_ad = parse_classad(handle.read(MAX_AD_BYTES + 1), "machine ad")
    except OSError as exc:
        raise AdError(f"cannot read machine ad: {exc.strerror}") from None
    short_slot, device = resolve_slot(machine_ad, config)
    slot = config.slot(int(rules.SLOT_NAME_RE.match(short_slot + "@").group(2)))  # resolve_slot matched it
    if slot is not None and slot.kind == "gpu-node":
        return gpu_lines(job_ad, machine_ad, config, state_dir, ask), f"GPU node {config.node} ({short_slot})"
    if device is None and slot is not None and slot.kind == "spare":
        merge_environment(job_ad, [])
        try:
            reply = ask_agent(state_dir, ask)     # unreachable (StateError): refused, never unconfined
        except Refusal as exc:
            raise Refusal(exc.code, str(exc), "") from None
        if reply.get("kind") != "spare":
            raise Refusal(EXIT_NO_STATE, "the node agent does not know this start as one in the spare slot")
        return [], f"spare slot {config.node} ({short_slot})"
    if device is None and slot is not None and slot.kind in ("node", "guest"):
        return shared_lines(job_ad, slot, state_dir, ask), f"{slot.kind} slot {config.node} ({short_slot})"
    if device is None:
        if not is_spread_job(job_ad, config):
            return [], config.node
        demand = spread_demand(job_ad, config, short_slot)
        lines = [format_line("Environment", merge_environment(job_ad, [("OMP_NUM_THREADS", str(demand.cpus))]))]
        if demand.pinned:
            ask_agent(state_dir, ask)
        return lines, f"socket slot {config.node} ({short_slot})"
    where = f"device {config.node}/{device.device} ({short_slot})"
    if device_demand(job_ad, device) is None:
        return [], where
    merge_environment(job_ad, [])   # a malformed Environment is refused before the agent places it
    return device_lines(job_ad, device, ask_agent(state_dir, ask)), where


def main(argv: Optional[Sequence[str]] = None, stdin: Optional[object] = None,
         stdout: Optional[TextIO] = None, env: Optional[Dict[str, str]] = None, ask=channel.ask) -> int:
    env = dict(os.environ) if env is None else env
    argv = sys.argv[1:] if argv is None else argv
    stdout = sys.stdout if stdout is None else stdout
    stdin = sys.stdin.buffer if stdin is None else stdin
    try:
        lines, _ = prepare(argv, env, stdin, ask)
        if lines:
            stdout.write("\n".join(lines) + "\n")
            stdout.flush()
        return EXIT_OK
    except Refusal as exc:
        if exc.code == EXIT_OVERSUBSCRIBED:
            return refuse(stdout, exc.code, f"{exc}{exc.tail}; back to idle for a new plan")
        return refuse(stdout, exc.code, f"start refused: {exc}; back to idle for a new plan")
    except ConfigError as exc:
        return refuse(stdout, EXIT_BAD_CONFIG, f"bad node config: {exc}")
    except StateError as exc:
        return refuse(stdout, EXIT_NO_STATE, f"start refused: node agent unavailable ({exc.strerror or exc}); "
                                             "back to idle for a new plan")
    except (ValueError, rules.RuleError) as exc:  # AdError included
        return refuse(stdout, EXIT_BAD_AD, f"malformed job or machine ad: {exc}")
    except Exception as exc:  # never a traceback: the hold must carry a reason
        return refuse(stdout, EXIT_INTERNAL, f"internal error ({exc.__class__.__name__}) in the PREPARE_JOB hook")


if __name__ == "__main__":
    sys.exit(main())
