"""What an execute node has, read from its own files and tools (``cosched_describe_node.py``).

Every probe reads below a root directory (``/`` on a node, a fake tree in tests):

- physical cores and sockets: the distinct (physical package id, core id) pairs of the online
  CPUs in ``sys/devices/system/cpu/cpu*/topology``, else ``proc/cpuinfo``;
- each socket's L3 cache id (the resctrl schemata key): ``cpu*/cache/index*/id`` of level 3;
- memory: ``MemTotal`` of ``proc/meminfo`` in MiB, rounded down;
- LLC ways: the set bits of ``sys/fs/resctrl/info/L3/cbm_mask`` (0 when resctrl is not mounted);
- GPUs: ``nvidia-smi --query-gpu`` or saved ``condor_gpu_discovery -properties`` output;
- Xeon Phi cards: ``micinfo`` (run, or its saved output).

Garbage raises ``HardwareError`` naming the file or tool; nothing here writes anything.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Set, Tuple

from cosched_node import gpus as gpu_tools
from cosched_node.discover import NVIDIA_SMI_QUERY, parse_micinfo, run_micinfo
from cosched_node.rules import CACHE_ID_MAX, CBM_WIDTH_MAX

MAX_FILE_BYTES = 4_000_000
MAX_CPUS = 100_000
#: An option value that skips a tool (``--nvidia-smi none``, ``--micinfo none``).
SKIP = "none"
_CPU_DIR = re.compile(r"^cpu(\d{1,6})$")
_SMALL_INT = re.compile(r"^-?\d{1,9}$")

Warn = Callable[[str], None]


class HardwareError(ValueError):
    """A probe's file or tool output that cannot be trusted; names the file or tool."""


@dataclass(frozen=True)
class SocketInfo:
    """One physical package: its id, physical cores and L3 cache id (None: not found)."""
    package_id: int
    cores: int
    cache_id: Optional[int]


@dataclass(frozen=True)
class PhiCard:
    """One Xeon Phi card as micinfo reports it (threads: those offloads may use)."""
    name: str
    memory_mb: int
    hardware_threads: int


@dataclass(frozen=True)
class Hardware:
    cores: int
    memory_mb: int
    sockets: Tuple[SocketInfo, ...]
    llc_ways: int                           # of each L3 cache; 0: resctrl not mounted
    gpus: Tuple[gpu_tools.GpuInfo, ...] = ()
    phis: Tuple[PhiCard, ...] = ()


def _under(root: str, *parts: str) -> str:
    return os.path.join(root, *parts)


def _read(path: str) -> Optional[str]:
    """A file's text (at most MAX_FILE_BYTES), or None when it cannot be read."""
    try:
        with open(path, "rb") as handle:
            data = handle.read(MAX_FILE_BYTES)
    except OSError:
        return None
    if b"\x00" in data:
        raise HardwareError(f"{path}: contains a NUL byte")
    return data.decode("utf-8", errors="replace")


def _int_file(path: str) -> Optional[int]:
    text = _read(path)
    if text is None:
        return None
    if not _SMALL_INT.match(text.strip()):
        raise HardwareError(f"{path}: {text.strip()[:30]!r} is not an integer")
    return int(text.strip())


def _cpu_dirs(root: str) -> List[Tuple[int, str]]:
    """(number, directory) of every online CPU listed in sysfs."""
    base = _under(root, "sys", "devices", "system", "cpu")
    try:
        names = os.listdir(base)
    except OSError:
        return []
    cpus = []
    for name in names:
        match = _CPU_DIR.match(name)
        if match and _int_file(os.path.join(base, name, "online")) != 0:
            cpus.append((int(match.group(1)), os.path.join(base, name)))
    if len(cpus) > MAX_CPUS:
        raise HardwareError(f"{base}: more than {MAX_CPUS} CPUs")
    return sorted(cpus)


def _l3_cache_id(cpu_dir: str) -> Optional[int]:
    """The id of the level-3 cache of one CPU, or None."""
    cache = os.path.join(cpu_dir, "cache")
    try:
        indexes = sorted(n for n in os.listdir(cache) if re.match(r"^index\d{1,2}$", n))
    except OSError:
        return None
    for index in indexes:
        if _int_file(os.path.join(cache, index, "level")) == 3:
            cache_id = _int_file(os.path.join(cache, index, "id"))
            if cache_id is not None and not 0 <= cache_id <= CACHE_ID_MAX:
                raise HardwareError(f"{cache}/{index}/id: {cache_id} is not a cache id in [0, {CACHE_ID_MAX}]")
            return cache_id
    return None


def _cpus_from_sysfs(root: str) -> List[Tuple[int, int, Optional[int]]]:
    """(package id, core id, L3 cache id) of each online CPU with a topology directory."""
    found = []
    for _, cpu_dir in _cpu_dirs(root):
        package = _int_file(os.path.join(cpu_dir, "topology", "physical_package_id"))
        core = _int_file(os.path.join(cpu_dir, "topology", "core_id"))
        if package is None or core is None:
            continue   # offline on kernels that drop the topology of offline CPUs
        found.append((max(package, 0), core, _l3_cache_id(cpu_dir)))   # -1: the platform does not say
    return found


def _cpus_from_cpuinfo(root: str) -> List[Tuple[int, int, Optional[int]]]:
    """(physical id, core id, None) of each processor of /proc/cpuinfo; a processor with no
    core id (some virtual machines, ARM) is a core of its own."""
    path = _under(root, "proc", "cpuinfo")
    text = _read(path)
    if text is None:
        return []
    found = []
    for block in re.split(r"\n\s*\n", text):
        fields: Dict[str, str] = {}
        for line in block.splitlines():
            key, sep, value = line.partition(":")
            if sep:
                fields[key.strip().lower()] = value.strip()
        if "processor" not in fields:
            continue
        values = []
        for key, default in (("physical id", "0"), ("core id", fields["processor"])):
            value = fields.get(key, default)
            if not re.match(r"^\d{1,9}$", value):
                raise HardwareError(f"{path}: {key} {value[:30]!r} is not an integer")
            values.append(int(value))
        found.append((values[0], values[1], None))
    return found


def probe_cpus(root: str, warn: Warn) -> Tuple[int, Tuple[SocketInfo, ...]]:
    """The node's physical cores and its sockets (package id order)."""
    cpus = _cpus_from_sysfs(root) or _cpus_from_cpuinfo(root)
    if not cpus:
        raise HardwareError(f"no CPU found in {_under(root, 'sys/devices/system/cpu')} or "
                            f"{_under(root, 'proc/cpuinfo')}")
    cores: Dict[int, Set[int]] = {}
    caches: Dict[int, Set[int]] = {}
    for package, core, cache_id in cpus:
        cores.setdefault(package, set()).add(core)
        if cache_id is not None:
            caches.setdefault(package, set()).add(cache_id)
    sockets = []
    for package in sorted(cores):
        ids = sorted(caches.get(package, ()))
        if len(ids) > 1:
            warn(f"socket {package} has {len(ids)} L3 caches (ids {ids}); its socket slot's cache_id is "
                 f"{ids[0]}, so LLC ways are partitioned on that cache only")
        sockets.append(SocketInfo(package, len(cores[package]), ids[0] if ids else None))
    if len({s.cores for s in sockets}) > 1:
        warn("sockets have different core counts (" + ", ".join(f"{s.package_id}: {s.cores}" for s in sockets)
             + "); socket slots split the cores evenly")
    return sum(s.cores for s in sockets), tuple(sockets)


def probe_memory_mb(root: str) -> int:
    """MemTotal of /proc/meminfo in MiB, rounded down."""
    path = _under(root, "proc", "meminfo")
    text = _read(path)
    if text is None:
        raise HardwareError(f"{path}: cannot be read")
    match = re.search(r"^MemTotal:\s*(\d{1,15})\s*kB\s*$", text, re.MULTILINE)
    if not match or int(match.group(1)) < 1024:
        raise HardwareError(f"{path}: no MemTotal line of at least 1024 kB")
    return int(match.group(1)) // 1024


def probe_llc_ways(root: str) -> int:
    """Ways of each L3 cache from resctrl's full capacity bit mask; 0 when resctrl is not mounted."""
    path = _under(root, "sys", "fs", "resctrl", "info", "L3", "cbm_mask")
    text = _read(path)
    if text is None:
        return 0
    if not re.match(r"^[0-9a-fA-F]{1,16}$", text.strip()):
        raise HardwareError(f"{path}: {text.strip()[:30]!r} is not a hex bit mask")
    ways = bin(int(text.strip(), 16)).count("1")
    if not 1 <= ways <= CBM_WIDTH_MAX:
        raise HardwareError(f"{path}: {ways} ways, expected 1 to {CBM_WIDTH_MAX}")
    return ways


def _saved(option: Optional[str]) -> bool:
    """An option naming a file of saved output rather than an executable."""
    return bool(option) and option != SKIP and not shutil.which(option)


def probe_gpus(nvidia_smi: Optional[str], gpu_discovery: Optional[str], warn: Warn) -> Tuple[gpu_tools.GpuInfo, ...]:
    """The GPUs ``nvidia-smi`` reports (an executable, default from PATH, or a file of its
    saved ``--query-gpu`` output), else those of saved ``condor_gpu_discovery -properties``
    output, in index order. A named tool that fails is an error; nvidia-smi found on PATH
    that fails (no driver, no GPU) means no GPUs."""
    if nvidia_smi != SKIP:
        if _saved(nvidia_smi):
            text = _read(nvidia_smi)
            if text is None:
                raise HardwareError(f"--nvidia-smi {nvidia_smi}: neither an executable nor a readable file")
            return tuple(gpu_tools.parse_query_gpu(text))
        exe = shutil.which(nvidia_smi or "nvidia-smi")
        if exe:
            try:
                out = subprocess.run([exe, *NVIDIA_SMI_QUERY], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                     stderr=subprocess.DEVNULL, timeout=60, check=False)
            except (OSError, subprocess.TimeoutExpired) as exc:
                out, why = None, str(exc)
            else:
                why = f"exit status {out.returncode}"
            if out is not None and out.returncode == 0:
                return tuple(gpu_tools.parse_query_gpu(out.stdout[:MAX_FILE_BYTES].decode("utf-8", "replace")))
            if nvidia_smi:
                raise HardwareError(f"{exe} failed ({why})")
            warn(f"{exe} failed ({why}); no GPUs from it")
    if gpu_discovery:
        text = _read(gpu_discovery)
        if text is None:
            raise HardwareError(f"--gpu-discovery {gpu_discovery}: cannot be read")
        return tuple(gpu_tools.parse_gpu_discovery(text))
    return ()


def probe_phis(micinfo: Optional[str], warn: Warn) -> Tuple[PhiCard, ...]:
    """The Xeon Phi cards ``micinfo`` reports (an executable, default from PATH, or a file of
    its saved output), in card-number order; none without micinfo."""
    if micinfo == SKIP:
        return ()
    if _saved(micinfo):
        text = _read(micinfo)
        if text is None:
            raise HardwareError(f"--micinfo {micinfo}: neither an executable nor a readable file")
    else:
        exe = shutil.which(micinfo or "micinfo")
        text = run_micinfo(exe) if exe else None
        if text is None and micinfo:
            raise HardwareError(f"micinfo {micinfo} failed")
        if text is None and exe:
            warn(f"{exe} failed; no Xeon Phi cards from it")
    found = parse_micinfo(text or "")
    return tuple(PhiCard(name, d["device_memory_mb"], d["hardware_threads"])
                 for name, d in sorted(found.items(), key=lambda item: int(item[0][3:])))


def probe_hardware(root: str, nvidia_smi: Optional[str], gpu_discovery: Optional[str], micinfo: Optional[str],
                   warn: Warn) -> Hardware:
    """Everything the node config needs to know about the node below ``root``."""
    cores, sockets = probe_cpus(root, warn)
    return Hardware(cores, probe_memory_mb(root), sockets, probe_llc_ways(root),
                    probe_gpus(nvidia_smi, gpu_discovery, warn), probe_phis(micinfo, warn))
