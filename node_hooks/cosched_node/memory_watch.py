"""Device memory watch (COSMIC's memory limit, Section IV-D2 of paper 002): probes of each
device job's memory use, and the rule that stops a job over its allocation.

The limit is the memory HTCondor allocated to the job's dynamic slot (the slot view), never
a number the job could write. Probes: ``file`` reads ``<probe-dir>/<device>/<ClusterId>.<ProcId>``
(integer MB, root-written: the local pool's emulated devices); ``micsmc`` parses
``micsmc -f`` (device-wide use only: logged, never attributable, so it never stops a job);
``sysfs`` reads /sys/class/mic inventory (no use at all).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
from typing import Dict, Optional, Tuple

from cosched_node import rules
from cosched_node.errors import ConfigError
from cosched_node.state import read_small_file


class FileProbe:
    """Per-job device memory in ``<probe_dir>/<device>/<ClusterId>.<ProcId>`` (integer MB)."""
    name = "file"

    def __init__(self, probe_dir: str) -> None:
        self.probe_dir = probe_dir

    def job_usage_mb(self, device: str, cluster: int, proc: int) -> Optional[int]:
        if not rules.DEVICE_RE.match(device):
            return None
        try:
            data, _ = read_small_file(os.path.join(self.probe_dir, device), f"{int(cluster)}.{int(proc)}", 64)
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


def make_probe(kind: str, probe_dir: Optional[str], has_devices: bool = True):
    """The probe ``--probe`` names; ``auto`` picks ``micsmc`` when the node has devices and
    ``micsmc`` is on PATH, else ``sysfs`` (which measures nothing, so stops nothing)."""
    if kind == "auto":
        kind = "micsmc" if has_devices and shutil.which("micsmc") else "sysfs"
    if kind == "file":
        if not probe_dir:
            raise ConfigError("--probe file needs --probe-dir")
        return FileProbe(probe_dir)
    if kind == "micsmc":
        return MicsmcProbe()
    return SysfsProbe(probe_dir or "/sys/class/mic")


def over_limit(used_mb: Optional[int], allocated_mb: int) -> bool:
    """A job is stopped when its measured device memory exceeds its allocation."""
    return used_mb is not None and used_mb > allocated_mb
