"""Shared helpers for condor_sched's execute-node programs (standard library only).

These run with the execute node's system ``python3`` (3.9+), outside the condor_sched
package: the PREPARE_JOB hook (as the job's user), the STARTD_CRON job (as condor) and the
node agent (as root, under condor_master).  Every job-ad value is hostile: ads are parsed
without ``eval``, every number is range-checked, every name matched against a regex before
it becomes part of a file name or an attribute name.

State-dir protocol shared by the hook and the agent (``/var/lib/condor_sched/<node>``,
or ``state_dir`` in the node config, or ``$COSCHED_STATE_DIR``)::

    DIR/                 root, 0755   created by the agent; refused if not ours or group/other-writable
    DIR/lock             root, 0644   flock()ed (LOCK_EX) around every read-modify-write of requests/
    DIR/requests/        root, 1777   world-writable + sticky: one file per running device or
                          spread job
        <Cluster>.<Proc>.<slotN_M>.json   written by the hook as the job's user: tmp file +
                          rename under the lock; the sticky bit stops users replacing or deleting
                          each other's files.  Content: see ``Request`` (device job, no "kind" or
                          kind "device") and ``SpreadRequest`` (kind "spread").
    DIR/devices/<dev>.json  root, 0644   written only by the agent: validated allocations and
                          measured device-memory use, read by the startd cron.
    DIR/killed/<Cluster>.<Proc>.json  root, 0644  why the agent stopped a job.
    DIR/spread/<request file name>  root, 0644  the agent's watch of a running spread job
                          (co-runners seen on its socket slot, perf samples) for its run record.
    DIR/agent.heartbeat  root, 0644   rewritten every agent interval (the cron checks its age).
    DIR/hooks.log        root, 0622   the hook appends every start and refusal here (the job
                          sees a refusal's short reason in HoldReason / VacateReason).
    DIR/agent.log        root, 0644   the agent's own log.

A request is live while its starter (the hook's parent process) is alive with the start
time recorded in the request; pid reuse therefore never keeps a dead allocation alive.
"""

from __future__ import annotations

import datetime
import errno
import fcntl
import json
import math
import os
import re
import stat
import sys
import time
from dataclasses import dataclass
from typing import Any, Dict, Iterable, List, Optional, Tuple

# ---------------------------------------------------------------------------------------
# Exit codes (documented), and the HookStatusCode the PREPARE_JOB hook prints with each.
# HTCondor 25 takes HookStatusCode from the hook's stdout over its exit status: 1-299 hold
# the job (HoldReasonCode 19, HoldReasonSubCode = the code), 300 or more send it back to
# Idle (VacateReasonCode 1007, VacateReasonSubCode = the code); HookStatusMessage becomes
# the HoldReason / VacateReason and goes to the job's event log.
EXIT_OK = 0
EXIT_INTERNAL = 1          # unexpected error (logged without traceback)
EXIT_BAD_CONFIG = 2        # node config missing / invalid, or bad command line
EXIT_OVERSUBSCRIBED = 3    # start refused: device memory or compute would be oversubscribed
EXIT_BAD_AD = 4            # job ad or machine ad malformed / hostile
EXIT_NO_STATE = 5          # the agent's state dir is missing, unsafe, locked or unwritable

#: The hook's HookStatusCode for each exit code: a refusal a new plan can fix (the device
#: is full given its live co-runners; the agent's state is unavailable) sends the job back to
#: Idle (>= 300); one no plan fixes holds it with the exit code as HoldReasonSubCode.
HOOK_IDLE_MIN = 300
HOOK_STATUS = {EXIT_INTERNAL: EXIT_INTERNAL, EXIT_BAD_CONFIG: EXIT_BAD_CONFIG, EXIT_BAD_AD: EXIT_BAD_AD,
               EXIT_OVERSUBSCRIBED: HOOK_IDLE_MIN + EXIT_OVERSUBSCRIBED,
               EXIT_NO_STATE: HOOK_IDLE_MIN + EXIT_NO_STATE}
#: HTCondor's VacateReasonCode when a PREPARE_JOB hook sends a job back to Idle
#: (CONDOR_HOLD_CODE::StarterError; config.d/20-cosched-startd.conf matches on it).
VACATE_CODE_STARTER_ERROR = 1007
MAX_HOOK_MESSAGE = 240

THREADS_PER_PHI_CORE = 4
MAX_AD_BYTES = 1 << 20
MAX_REQUEST_BYTES = 1 << 16  # a device request lists its units as ranges
MAX_UNITS = 100000           # compute units (hardware threads) of one device, at most
MAX_INT = 10 ** 12

DEFAULT_STATE_ROOT = "/var/lib/condor_sched"

ATTR_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")
NODE_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9-]{0,62}$")
DOMAIN_RE = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9-]{0,62})(\.[A-Za-z0-9][A-Za-z0-9-]{0,62})*$")
DEVICE_RE = re.compile(r"^[A-Za-z][A-Za-z0-9_]{0,31}$")
SLOT_NAME_RE = re.compile(r"^(slot(\d{1,4})(?:_(\d{1,6}))?)@")
SHORT_SLOT_RE = re.compile(r"^slot\d{1,4}(?:_\d{1,6})?$")
ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")
ABS_PATH_RE = re.compile(r"^/[A-Za-z0-9_./@+-]{1,4000}$")
REQUEST_NAME_RE = re.compile(r"^(\d{1,12})\.(\d{1,9})\.(slot\d{1,4}(?:_\d{1,6})?)\.json$")
# A program name becomes a directory name of the profile store: no '/', no leading '.'.
PROGRAM_RE = re.compile(r"^(?!\.)[A-Za-z0-9_.+-]{1,64}$")
SCALE_FACTORS = (1, 2, 4, 8)
CBM_WIDTH_MAX = 64
CACHE_ID_MAX = 4095
MAX_BW_GBS = 100000.0


class AdError(ValueError):
    """A ClassAd (job or machine) is malformed or carries a hostile value; names the attribute."""


class ConfigError(ValueError):
    """The node config JSON is missing or invalid."""


class StateError(OSError):
    """The shared state dir is missing, unsafe or unusable."""


@dataclass(frozen=True)
class Expr:
    """An unparsed ClassAd expression (lists, records, references): never evaluated."""
    text: str


# ---------------------------------------------------------------------------------------
# Old-syntax ClassAd text <-> Python values

_INT_RE = re.compile(r"^[+-]?\d{1,40}$")
_REAL_RE = re.compile(r"^[+-]?(\d{1,40}\.\d{0,40}|\.\d{1,40}|\d{1,40})([eE][+-]?\d{1,4})?$")
_LINE_RE = re.compile(r"^\s*([A-Za-z_][A-Za-z0-9_.]*)\s*=\s*(.*?)\s*$")


def _parse_string(text: str, attr: str) -> str:
    """An old-syntax quoted string: ``\\"`` is a quote, other backslashes are literal."""
    out: List[str] = []
    i = 1
    while i < len(text):
        ch = text[i]
        if ch == "\\" and i + 1 < len(text) and text[i + 1] == '"':
            out.append('"')
            i += 2
            continue
        if ch == '"':
            if i != len(text) - 1:
                raise AdError(f"attribute {attr}: text after closing quote")
            return "".join(out)
        out.append(ch)
        i += 1
    raise AdError(f"attribute {attr}: unterminated string")


def parse_value(text: str, attr: str = "?") -> Any:
    """One ClassAd value: int, float, bool, str, None (undefined) or ``Expr`` for the rest."""
    if text == "":
        raise AdError(f"attribute {attr}: empty value")
    if text.startswith('"'):
        return _parse_string(text, attr)
    low = text.lower()
    if low == "true":
        return True
    if low == "false":
        return False
    if low == "undefined":
        return None
    if _INT_RE.match(text):
        return int(text)
    if _REAL_RE.match(text):
        value = float(text)
        if not math.isfinite(value):
            raise AdError(f"attribute {attr}: non-finite number")
        return value
    return Expr(text)


def parse_classad(data: "bytes | str", what: str = "ad") -> Dict[str, Any]:
    """Parse old-format ``Attr = value`` lines into a dict keyed by attribute name.

    Attribute names are case-insensitive in ClassAds, so keys are stored as given and looked
    up with :func:`ad_get`.  Raises ``AdError`` on non-UTF-8 input, oversized input, NUL
    bytes or a line that is not ``Name = value``.
    """
    if isinstance(data, bytes):
        if len(data) > MAX_AD_BYTES:
            raise AdError(f"{what}: larger than {MAX_AD_BYTES} bytes")
        try:
            data = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise AdError(f"{what}: not UTF-8 (byte offset {exc.start})") from None
    if "\x00" in data:
        raise AdError(f"{what}: contains a NUL byte")
    ad: Dict[str, Any] = {}
    for number, line in enumerate(data.splitlines(), 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        match = _LINE_RE.match(line)
        if not match:
            raise AdError(f"{what}: line {number} is not 'Attr = value'")
        name, value = match.group(1), match.group(2)
        if not ATTR_RE.match(name):
            raise AdError(f"{what}: line {number}: bad attribute name")
        ad[name.lower()] = (name, parse_value(value, name))
    return {key: value for key, (_, value) in ad.items()}


def ad_get(ad: Dict[str, Any], attr: str, default: Any = None) -> Any:
    return ad.get(attr.lower(), default)


def ad_int(ad: Dict[str, Any], attr: str, low: int, high: int,
           default: Optional[int] = None) -> int:
    """An integer attribute within [low, high]; a missing one gives ``default`` or AdError."""
    value = ad_get(ad, attr)
    if value is None:
        if default is None:
            raise AdError(f"attribute {attr} is missing")
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise AdError(f"attribute {attr} is not an integer")
    if isinstance(value, float):
        if not value.is_integer():
            raise AdError(f"attribute {attr} is not an integer")
        value = int(value)
    if not low <= value <= high:
        raise AdError(f"attribute {attr}={value if abs(value) < MAX_INT else 'huge'} "
                      f"is outside [{low}, {high}]")
    return value


def ad_number(ad: Dict[str, Any], attr: str, low: float, high: float) -> float:
    """A finite number attribute (int or real) within [low, high]; missing gives AdError."""
    value = ad_get(ad, attr)
    if value is None:
        raise AdError(f"attribute {attr} is missing")
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise AdError(f"attribute {attr} is not a number")
    value = float(value)
    if not math.isfinite(value) or not low <= value <= high:
        raise AdError(f"attribute {attr}={value if abs(value) < MAX_INT else 'huge'} "
                      f"is outside [{low:g}, {high:g}]")
    return value


def ad_str(ad: Dict[str, Any], attr: str, pattern: "re.Pattern[str]",
           required: bool = True) -> Optional[str]:
    value = ad_get(ad, attr)
    if value is None and not required:
        return None
    if not isinstance(value, str):
        raise AdError(f"attribute {attr} is {'missing' if value is None else 'not a string'}")
    if not pattern.match(value):
        raise AdError(f"attribute {attr} has a disallowed value")
    return value


def quote_string(value: str) -> str:
    """Quote a string for an old-syntax ``Attr = "value"`` line the starter will parse."""
    if any(ord(ch) < 32 or ord(ch) == 127 for ch in value):
        raise ValueError("control character in ClassAd string")
    if value.endswith("\\") or '\\"' in value:
        raise ValueError("backslash before a quote in ClassAd string")
    return '"' + value.replace('"', '\\"') + '"'


def format_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError("non-finite number")
        return repr(value)
    if isinstance(value, str):
        return quote_string(value)
    raise TypeError(f"cannot format {type(value).__name__} as a ClassAd value")


def hook_message(text: str) -> str:
    """``text`` made fit for a ``HookStatusMessage`` users read in HoldReason / VacateReason:
    printable ASCII without backslashes (quotes are escaped by :func:`format_line`), short."""
    safe = "".join(ch if 32 <= ord(ch) < 127 and ch != "\\" else "?" for ch in text)
    return safe if len(safe) <= MAX_HOOK_MESSAGE else safe[:MAX_HOOK_MESSAGE - 3] + "..."


def format_line(attr: str, value: Any) -> str:
    if not ATTR_RE.match(attr):
        raise ValueError(f"bad attribute name {attr!r}")
    return f"{attr} = {format_value(value)}"


# ---------------------------------------------------------------------------------------
# Node config

KIND_NAME_RE = re.compile(r"^[a-z][a-z0-9-]{0,31}$")
KIND_ATTR_RE = re.compile(r"^[A-Za-z][A-Za-z0-9]{0,63}$")
TEMPLATE_RE = re.compile(r"^[\x20-\x7e]{0,256}$")
TEMPLATE_FIELDS = frozenset({"compute", "cores", "core_list", "unit_list", "cpu_list", "compute_per_core",
                             "device", "device_index"})


@dataclass(frozen=True)
class DeviceKindConfig:
    """A device kind's record as the node config carries it (``condor_sched.device_kinds``):
    the attributes naming its memory, compute and device, its compute units per core, the
    device OS's logical CPU number of compute unit 0 (``cpu_offset``), and the environment
    templates the PREPARE_JOB hook fills."""
    name: str
    memory_attr: str
    compute_attr: str
    device_name_attr: str
    compute_per_core: int
    environment: Tuple[Tuple[str, str], ...]
    discovery: str = "inventory"
    cpu_offset: int = 0

    def job_environment(self, device: str, compute: int, units: "Units") -> List[Tuple[str, str]]:
        """The filled templates for a job placed on ``units`` (sorted half-open ranges of the
        device's compute units; unit u is thread u % compute_per_core of core
        u // compute_per_core, logical CPU cpu_offset + u of the device's OS).  Fields:
        ``{compute}`` units, ``{cores}`` cores touched, ``{core_list}``, ``{unit_list}``,
        ``{cpu_list}`` as ``a-b,c`` lists, ``{compute_per_core}``, ``{device}``,
        ``{device_index}``.  A variable whose template needs a device index the device name
        does not end with is left out."""
        index = re.search(r"(\d{1,6})$", device)
        cores = core_ranges(units, self.compute_per_core)
        values = {"compute": compute, "cores": units_count(cores), "core_list": format_ranges(cores),
                  "unit_list": format_ranges(units), "cpu_list": format_ranges(units, self.cpu_offset),
                  "compute_per_core": self.compute_per_core, "device": device,
                  "device_index": index.group(1) if index else None}
        out = []
        for name, template in self.environment:
            fields = set(re.findall(r"{(\w*)}", template))
            if any(values[f] is None for f in fields):
                continue
            out.append((name, template.format(**{f: values[f] for f in fields})))
        return out


#: The kind of a device slot whose node config names none (configs written before kinds).
#: Xeon Phi (KNC): logical CPU 0 and the last three sit on the last core, which the card's OS
#: keeps for itself; threads 0-3 of core c are logical CPUs 1+4c .. 4+4c, so cpu_offset is 1.
#: Offloaded OpenMP threads are bound one per listed logical CPU (``explicit`` affinity,
#: ``MIC_`` variables forwarded to the card without the prefix).
PHI_KIND = DeviceKindConfig(
    "phi", "PhiMemory", "PhiThreads", "PhiDeviceName", THREADS_PER_PHI_CORE,
    (("OMP_NUM_THREADS", "{compute}"), ("MIC_ENV_PREFIX", "MIC"), ("MIC_OMP_NUM_THREADS", "{compute}"),
     ("MIC_KMP_AFFINITY", "granularity=fine,explicit,proclist=[{cpu_list}]"), ("COSCHED_DEVICE", "{device}"),
     ("COSCHED_DEVICE_CORES", "{core_list}"), ("COSCHED_DEVICE_THREADS", "{unit_list}"),
     ("OFFLOAD_DEVICES", "{device_index}")), "micinfo", 1)


def parse_device_kind(raw: Any, where: str) -> DeviceKindConfig:
    """Validate a node config's ``device_kind`` object (absent: the Xeon Phi kind)."""
    if raw is None:
        return PHI_KIND
    if not isinstance(raw, dict):
        raise ConfigError(f"{where}: 'device_kind' is not an object")
    name = raw.get("name")
    if not isinstance(name, str) or not KIND_NAME_RE.match(name):
        raise ConfigError(f"{where}: device_kind 'name' is not a valid kind name")
    attrs = [raw.get(key) for key in ("memory_attr", "compute_attr", "device_name_attr")]
    if not all(isinstance(a, str) and KIND_ATTR_RE.match(a) for a in attrs) or len(set(attrs)) != 3:
        raise ConfigError(f"{where}: device_kind attributes must be three distinct attribute names")
    environment = raw.get("environment", [])
    if not isinstance(environment, list) or len(environment) > 32:
        raise ConfigError(f"{where}: device_kind 'environment' must be a list of [name, template]")
    pairs = []
    for entry in environment:
        if not (isinstance(entry, list) and len(entry) == 2 and all(isinstance(x, str) for x in entry)
                and ENV_NAME_RE.match(entry[0]) and TEMPLATE_RE.match(entry[1])
                and set(re.findall(r"{(\w*)}", entry[1])) <= TEMPLATE_FIELDS
                and "{" not in re.sub(r"{\w*}", "", entry[1]) and "}" not in re.sub(r"{\w*}", "", entry[1])):
            raise ConfigError(f"{where}: device_kind environment entry {entry!r} is not [NAME, template] "
                              f"with fields from {sorted(TEMPLATE_FIELDS)}")
        pairs.append((entry[0], entry[1]))
    discovery = raw.get("discovery", "inventory")
    if not isinstance(discovery, str) or not KIND_NAME_RE.match(discovery):
        raise ConfigError(f"{where}: device_kind 'discovery' is not a valid name")
    cpu_offset = _cfg_int(raw, "cpu_offset", 0, 1024, where) if "cpu_offset" in raw else 0
    return DeviceKindConfig(name, attrs[0], attrs[1], attrs[2], _cfg_int(raw, "compute_per_core", 1, 1024, where),
                            tuple(pairs), discovery, cpu_offset)


@dataclass(frozen=True)
class SlotConfig:
    slot_id: int
    kind: str
    cores: int
    memory_mb: int
    device: Optional[str] = None
    device_memory_mb: int = 0
    hardware_threads: int = 0
    cache_id: Optional[int] = None     # socket slots: the L3 cache id (resctrl schemata key)
    llc_ways: int = 0                  # socket slots: LLC ways of that cache (0: unknown)
    mem_bw_gbs: float = 0.0            # socket slots: peak memory bandwidth, GB/s (0: unknown)
    device_kind: DeviceKindConfig = PHI_KIND  # device slots: the device's kind

    @property
    def device_cores(self) -> int:
        return self.hardware_threads // self.device_kind.compute_per_core


@dataclass(frozen=True)
class NodeConfig:
    node: str
    domain: str
    cores: int
    memory_mb: int
    slots: Tuple[SlotConfig, ...]
    state_dir: Optional[str] = None

    def slot(self, slot_id: int) -> Optional[SlotConfig]:
        for slot in self.slots:
            if slot.slot_id == slot_id:
                return slot
        return None

    def device(self, name: str) -> Optional[SlotConfig]:
        for slot in self.slots:
            if slot.kind == "device" and slot.device == name:
                return slot
        return None

    @property
    def devices(self) -> Tuple[SlotConfig, ...]:
        return tuple(s for s in self.slots if s.kind == "device")

    @property
    def sockets(self) -> Tuple[SlotConfig, ...]:
        return tuple(s for s in self.slots if s.kind == "socket")


def _cfg_int(obj: Dict[str, Any], key: str, low: int, high: int, where: str) -> int:
    value = obj.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ConfigError(f"{where}: '{key}' must be an integer in [{low}, {high}]")
    return value


def parse_node_config(obj: Any) -> NodeConfig:
    """Validate the JSON written by ``condor_sched.inventory.node_config``."""
    if not isinstance(obj, dict):
        raise ConfigError("node config: top level is not an object")
    node, domain = obj.get("node"), obj.get("domain")
    if not isinstance(node, str) or not NODE_RE.match(node):
        raise ConfigError("node config: 'node' is not a valid host name")
    if not isinstance(domain, str) or not DOMAIN_RE.match(domain):
        raise ConfigError("node config: 'domain' is not a valid domain")
    state_dir = obj.get("state_dir")
    if state_dir is not None and (not isinstance(state_dir, str) or not ABS_PATH_RE.match(state_dir)
                                  or "/../" in state_dir + "/"):
        raise ConfigError("node config: 'state_dir' must be an absolute path")
    raw_slots = obj.get("slots")
    if not isinstance(raw_slots, list) or len(raw_slots) > 256:
        raise ConfigError("node config: 'slots' must be a list")
    slots: List[SlotConfig] = []
    for index, raw in enumerate(raw_slots):
        where = f"node config slot #{index}"
        if not isinstance(raw, dict):
            raise ConfigError(f"{where}: not an object")
        kind = raw.get("kind")
        slot_id = _cfg_int(raw, "slot_id", 1, 9999, where)
        cores = _cfg_int(raw, "cores", 0, 100000, where)
        memory_mb = _cfg_int(raw, "memory_mb", 0, MAX_INT, where)
        if kind == "device":
            device = raw.get("device")
            if not isinstance(device, str) or not DEVICE_RE.match(device):
                raise ConfigError(f"{where}: 'device' is not a valid device name")
            device_kind = parse_device_kind(raw.get("device_kind"), where)
            slots.append(SlotConfig(slot_id, kind, cores, memory_mb, device,
                                    _cfg_int(raw, "device_memory_mb", 1, MAX_INT, where),
                                    _cfg_int(raw, "hardware_threads", device_kind.compute_per_core, MAX_UNITS, where),
                                    device_kind=device_kind))
        elif kind == "socket":
            cache_id = _cfg_int(raw, "cache_id", 0, CACHE_ID_MAX, where) if "cache_id" in raw else None
            llc_ways = _cfg_int(raw, "llc_ways", 1, CBM_WIDTH_MAX, where) if "llc_ways" in raw else 0
            mem_bw = raw.get("mem_bw_gbs", 0.0)
            if isinstance(mem_bw, bool) or not isinstance(mem_bw, (int, float)) \
                    or not math.isfinite(mem_bw) or not 0 <= mem_bw <= MAX_BW_GBS:
                raise ConfigError(f"{where}: 'mem_bw_gbs' must be a number in [0, {MAX_BW_GBS:g}]")
            slots.append(SlotConfig(slot_id, kind, cores, memory_mb, cache_id=cache_id,
                                    llc_ways=llc_ways, mem_bw_gbs=float(mem_bw)))
        else:
            raise ConfigError(f"{where}: unknown kind")
    ids = [s.slot_id for s in slots]
    names = [s.device for s in slots if s.device]
    cache_ids = [s.cache_id for s in slots if s.cache_id is not None]
    if len(set(ids)) != len(ids) or len(set(names)) != len(names) or len(set(cache_ids)) != len(cache_ids):
        raise ConfigError("node config: duplicate slot id, device name or cache id")
    return NodeConfig(node, domain, _cfg_int(obj, "cores", 0, 100000, "node config"),
                      _cfg_int(obj, "memory_mb", 0, MAX_INT, "node config"), tuple(slots), state_dir)


def load_node_config(path: str) -> NodeConfig:
    try:
        with open(path, "rb") as handle:
            data = handle.read(MAX_AD_BYTES + 1)
    except OSError as exc:
        raise ConfigError(f"node config {path}: {exc.strerror}") from None
    if len(data) > MAX_AD_BYTES:
        raise ConfigError(f"node config {path}: too large")
    try:
        obj = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise ConfigError(f"node config {path}: not valid JSON ({exc.__class__.__name__})") from None
    return parse_node_config(obj)


def state_dir_for(config: NodeConfig, env: Optional[Dict[str, str]] = None,
                  override: Optional[str] = None) -> str:
    """The state dir: explicit override, else $COSCHED_STATE_DIR, else config, else default."""
    env = os.environ if env is None else env
    for candidate in (override, env.get("COSCHED_STATE_DIR"), config.state_dir):
        if candidate:
            if not ABS_PATH_RE.match(candidate) or "/../" in candidate + "/":
                raise ConfigError("state dir must be a plain absolute path")
            return candidate.rstrip("/") or "/"
    return os.path.join(DEFAULT_STATE_ROOT, config.node)


# ---------------------------------------------------------------------------------------
# Requests (one per running device job), shared by hook and agent

class _JobFile:
    """The job id and request file name shared by device and spread requests."""

    cluster: int
    proc: int
    slot: str

    @property
    def job(self) -> str:
        return f"{self.cluster}.{self.proc}"

    @property
    def file_name(self) -> str:
        return f"{self.cluster}.{self.proc}.{self.slot}.json"


@dataclass(frozen=True)
class Request(_JobFile):
    """One device job's allocation, as written by the hook and checked by the agent.

    ``units`` are the device's compute units (Xeon Phi: hardware threads) the job is placed
    on: sorted, disjoint, non-adjacent half-open ranges whose lengths sum to ``threads``
    (unit u is thread u % compute_per_core of core u // compute_per_core)."""
    cluster: int
    proc: int
    slot: str               # node-unique short dynamic slot name, e.g. slot2_1
    device: str
    memory_mb: int
    threads: int            # compute units requested (RequestPhiThreads for a Xeon Phi)
    units: "Units"
    starter_pid: int
    starter_start: int      # field 22 of /proc/<pid>/stat: guards against pid reuse
    scratch_dir: str        # $_CONDOR_SCRATCH_DIR of the job: how the agent finds its processes
    owner: str

    def to_json(self) -> Dict[str, Any]:
        return {"job": self.job, "cluster": self.cluster, "proc": self.proc, "slot": self.slot,
                "device": self.device, "memory_mb": self.memory_mb, "threads": self.threads,
                "units": [list(r) for r in self.units],
                "starter_pid": self.starter_pid, "starter_start": self.starter_start,
                "scratch_dir": self.scratch_dir, "owner": self.owner}


OWNER_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}$")


@dataclass(frozen=True)
class SpreadRequest(_JobFile):
    """One spread (SNS) job on a socket slot, as written by the hook and checked by the agent.

    ``llc_ways`` is this proc's share of its job's resctrl group on ``cache_id`` (the group
    is the sum of the shares of the job's procs there; a share may be 0 when the job has
    more procs on the cache than ways); ``mem_bw_gbs`` its memory bandwidth share; ``scale``
    its scale factor k; ``nodes`` its node count when the sidecar said (0: unknown);
    ``cpus`` its RequestCpus (= OMP_NUM_THREADS).
    """
    cluster: int
    proc: int
    slot: str               # node-unique short dynamic slot name, e.g. slot1_3
    slot_id: int            # the partitionable socket slot's id (the N of slotN_M)
    cache_id: int
    llc_ways: int
    mem_bw_gbs: float
    program: str
    scale: int
    nodes: int
    cpus: int
    starter_pid: int
    starter_start: int
    scratch_dir: str
    owner: str
    kind: str = "spread"

    def to_json(self) -> Dict[str, Any]:
        return {"kind": "spread", "job": self.job, "cluster": self.cluster, "proc": self.proc,
                "slot": self.slot, "slot_id": self.slot_id, "cache_id": self.cache_id,
                "llc_ways": self.llc_ways, "mem_bw_gbs": self.mem_bw_gbs, "program": self.program,
                "scale": self.scale, "nodes": self.nodes, "cpus": self.cpus,
                "starter_pid": self.starter_pid, "starter_start": self.starter_start,
                "scratch_dir": self.scratch_dir, "owner": self.owner}




def request_from_json(obj: Any, file_name: str) -> "Request | SpreadRequest":
    """Validate a request file's content (hostile: written by a job's user)."""
    match = REQUEST_NAME_RE.match(file_name)
    if not match or not isinstance(obj, dict):
        raise ValueError("bad request file name or content")

    def num(key: str, low: int, high: int) -> int:
        value = obj.get(key)
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            raise ValueError(f"bad '{key}'")
        return value

    def text(key: str, pattern: "re.Pattern[str]") -> str:
        value = obj.get(key)
        if not isinstance(value, str) or not pattern.match(value):
            raise ValueError(f"bad '{key}'")
        return value

    kind = obj.get("kind", "device")
    if kind == "spread":
        bw = obj.get("mem_bw_gbs")
        if isinstance(bw, bool) or not isinstance(bw, (int, float)) or not math.isfinite(bw) \
                or not 0 <= bw <= MAX_BW_GBS:
            raise ValueError("bad 'mem_bw_gbs'")
        scale = num("scale", 1, 8)
        if scale not in SCALE_FACTORS:
            raise ValueError("bad 'scale'")
        request: Any = SpreadRequest(
            num("cluster", 0, 10 ** 12 - 1), num("proc", 0, 10 ** 9 - 1), text("slot", SHORT_SLOT_RE),
            num("slot_id", 1, 9999), num("cache_id", 0, CACHE_ID_MAX), num("llc_ways", 0, CBM_WIDTH_MAX),
            float(bw), text("program", PROGRAM_RE), scale, num("nodes", 0, 100000), num("cpus", 1, 100000),
            num("starter_pid", 2, 2 ** 22), num("starter_start", 0, 2 ** 62),
            text("scratch_dir", ABS_PATH_RE), text("owner", OWNER_RE))
        slot_match = SLOT_NAME_RE.match(request.slot + "@")
        if not slot_match or int(slot_match.group(2)) != request.slot_id:
            raise ValueError("'slot' is not a dynamic slot of 'slot_id'")
    elif kind == "device":
        request = Request(num("cluster", 0, 10 ** 12 - 1), num("proc", 0, 10 ** 9 - 1),
                          text("slot", SHORT_SLOT_RE), text("device", DEVICE_RE),
                          num("memory_mb", 0, MAX_INT), num("threads", 1, MAX_UNITS),
                          parse_units(obj.get("units"), obj.get("threads")),
                          num("starter_pid", 2, 2 ** 22), num("starter_start", 0, 2 ** 62),
                          text("scratch_dir", ABS_PATH_RE), text("owner", OWNER_RE))
    else:
        raise ValueError("bad 'kind'")
    if "/../" in request.scratch_dir + "/" or request.file_name != file_name:
        raise ValueError("request content does not match its file name")
    return request


def read_small_file(directory: str, name: str, limit: int = MAX_REQUEST_BYTES) -> Tuple[bytes, os.stat_result]:
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


def process_start_time(pid: int, proc_root: str = "/proc") -> Optional[int]:
    """Start time (clock ticks since boot) of a live, non-zombie process, else None."""
    try:
        with open(f"{proc_root}/{int(pid)}/stat", "rb") as handle:
            data = handle.read(4096).decode("ascii", "replace")
    except OSError:
        return None
    fields = data[data.rfind(")") + 2:].split()
    if len(fields) < 20 or fields[0] in ("Z", "X"):
        return None
    try:
        return int(fields[19])
    except ValueError:
        return None


def request_is_live(request: "Request | SpreadRequest", proc_root: str = "/proc") -> bool:
    return process_start_time(request.starter_pid, proc_root) == request.starter_start


def read_requests(requests_dir: str, device: Optional[str] = None,
                  errors: Optional[List[Tuple[str, str]]] = None) -> List[Tuple[Any, os.stat_result]]:
    """All well-formed request files, device (``Request``) and spread (``SpreadRequest``);
    with ``device``, only the device requests of that device.  Bad ones go to ``errors``."""
    found: List[Tuple[Any, os.stat_result]] = []
    for name in sorted(os.listdir(requests_dir)):
        if not REQUEST_NAME_RE.match(name):
            if errors is not None and not name.startswith("."):
                errors.append((name, "unexpected file name"))
            continue
        try:
            data, info = read_small_file(requests_dir, name)
            request = request_from_json(json.loads(data.decode("utf-8")), name)
        except (OSError, ValueError) as exc:
            if errors is not None:
                errors.append((name, str(exc) if isinstance(exc, ValueError) else exc.strerror or "unreadable"))
            continue
        if device is None or (isinstance(request, Request) and request.device == device):
            found.append((request, info))
    return found


class StateLock:
    """``flock`` on DIR/lock, with a timeout so a user holding it cannot block us forever."""

    def __init__(self, state_dir: str, timeout_s: float = 10.0) -> None:
        self.path = os.path.join(state_dir, "lock")
        self.timeout_s = timeout_s
        self.fd = -1

    def __enter__(self) -> "StateLock":
        try:
            self.fd = os.open(self.path, os.O_RDONLY | os.O_NOFOLLOW)
        except OSError as exc:
            raise StateError(exc.errno or errno.EIO, f"cannot open {self.path}: {exc.strerror}") from None
        deadline = time.monotonic() + self.timeout_s
        while True:
            try:
                fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return self
            except OSError as exc:
                if exc.errno not in (errno.EAGAIN, errno.EACCES) or time.monotonic() > deadline:
                    os.close(self.fd)
                    raise StateError(errno.ETIMEDOUT, f"cannot lock {self.path}") from None
                time.sleep(0.05)

    def __exit__(self, *exc: Any) -> None:
        os.close(self.fd)  # closing releases the flock


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


# ---------------------------------------------------------------------------------------
# Logging: a line per event; the log file when writable, else stderr.

def log_line(path: Optional[str], program: str, message: str) -> None:
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    safe = "".join(ch if 32 <= ord(ch) < 127 else "?" for ch in message)[:2000]
    line = f"{stamp} {program}[{os.getpid()}] {safe}\n"
    if path:
        try:
            fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_NOFOLLOW)
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


# ---------------------------------------------------------------------------------------
# Placement on a device's compute units (Section IV-D2 of paper 002: co-runners on disjoint
# hardware threads), and the ``a-b,c`` lists the environment templates use.

Units = Tuple[Tuple[int, int], ...]


def units_count(ranges: Iterable[Tuple[int, int]]) -> int:
    return sum(b - a for a, b in ranges)


def to_ranges(units: Iterable[int]) -> Units:
    """Sorted distinct unit numbers -> canonical half-open ranges (sorted, non-adjacent)."""
    out: List[List[int]] = []
    for u in sorted(set(units)):
        if out and out[-1][1] == u:
            out[-1][1] = u + 1
        else:
            out.append([u, u + 1])
    return tuple((a, b) for a, b in out)


def parse_units(raw: Any, threads: Any) -> Units:
    """Validate a request's ``units``: a non-empty list of [start, end) pairs of integers in
    [0, MAX_UNITS], sorted and non-adjacent, whose lengths sum to ``threads``."""
    if not isinstance(raw, list) or not raw or len(raw) > MAX_UNITS:
        raise ValueError("bad 'units'")
    out: List[Tuple[int, int]] = []
    previous_end = -1
    for pair in raw:
        if not (isinstance(pair, list) and len(pair) == 2
                and all(isinstance(x, int) and not isinstance(x, bool) for x in pair)):
            raise ValueError("bad 'units'")
        start, end = pair
        if not 0 <= start < end <= MAX_UNITS or start <= previous_end:
            raise ValueError("bad 'units'")
        out.append((start, end))
        previous_end = end
    if units_count(out) != threads:
        raise ValueError("'units' do not add up to 'threads'")
    return tuple(out)


def format_ranges(ranges: Iterable[Tuple[int, int]], offset: int = 0) -> str:
    """``((0, 60), (64, 66))`` -> ``"0-59,64-65"``; each number shifted by ``offset``."""
    return ",".join(f"{a + offset}" if b - a == 1 else f"{a + offset}-{b - 1 + offset}" for a, b in ranges)


def core_ranges(units: Iterable[Tuple[int, int]], per_core: int) -> Units:
    """The cores the units touch, as ranges."""
    return to_ranges(c for a, b in units for c in range(a // per_core, (b - 1) // per_core + 1))


def place_units(capacity: int, per_core: int, held: Iterable[Tuple[int, int]], wanted: int) -> Optional[Units]:
    """``wanted`` free compute units of a device of ``capacity`` units, as ranges, disjoint
    from the ``held`` ranges of its co-runners; None only when fewer than ``wanted`` are free.

    Whole free cores first, lowest first (a job of 4k units on an idle device gets cores
    0..k-1, as a contiguous core range did); what is left (fewer units than a core) goes to
    the partly used core it fits most tightly, else to the lowest free core, so whole cores
    stay whole; only when no core has room for it alone is it spread over the cores with the
    most free units.  No contiguity is needed: any set of free units is a placement, so a job
    is placed whenever the device's free units (its threads less its co-runners') suffice.
    """
    if wanted <= 0 or capacity <= 0 or per_core <= 0:
        return None
    free = [True] * capacity
    for a, b in held:
        for u in range(max(0, a), min(capacity, b)):
            free[u] = False
    if sum(free) < wanted:
        return None
    cores = [(lo, min(lo + per_core, capacity)) for lo in range(0, capacity, per_core)]
    chosen: List[int] = []

    def take(units: List[int]) -> None:
        for u in units:
            free[u] = False
        chosen.extend(units)

    need = wanted
    for lo, hi in cores:
        if hi - lo <= need and all(free[lo:hi]):
            take(list(range(lo, hi)))
            need -= hi - lo
    while need > 0:
        free_of = [[u for u in range(lo, hi) if free[u]] for lo, hi in cores]
        fits = [c for c, units in enumerate(free_of) if len(units) >= need]
        if fits:
            best = min(fits, key=lambda c: (len(free_of[c]) == cores[c][1] - cores[c][0], len(free_of[c]), c))
            take(free_of[best][:need])
            need = 0
        else:
            best = max((c for c, units in enumerate(free_of) if units), key=lambda c: (len(free_of[c]), -c))
            take(free_of[best])
            need -= len(free_of[best])
    return to_ranges(chosen)
