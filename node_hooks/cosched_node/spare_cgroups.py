"""cgroup files of paper 003's spare capacity (Section III-B: soft and hard limits per spare
job), for the ROOT node agent. Stdlib only.

The cgroup root (``--cgroup-root``, default /sys/fs/cgroup) is either

- cgroup v2: ``cgroup.controllers`` lists ``cpu`` and ``memory``; our groups are
  ``<root>/cosched_spare/<slot>``, ``+cpu +memory`` enabled in ``cgroup.subtree_control`` of
  the root and of ``cosched_spare`` as needed; or
- cgroup v1 (one hierarchy per controller, e.g. ``<root>/cpu``, ``<root>/cpuacct``,
  ``<root>/memory``, or ``cpu,cpuacct`` co-mounted): our groups are
  ``<hierarchy>/cosched_spare/<slot>`` in each of the cpu, cpuacct and memory hierarchies.

A group is named by its path below the hierarchies' roots (``/cosched_spare/slot3_1``), as
/proc/<pid>/cgroup names it. A claim's own cgroup (one HTCondor made) is accepted only when all
its job processes are in it (in every hierarchy we use), it is not the root, not the starter's
own, not ours, and it, every directory up to the root and every file we write are root's and
neither group- nor other-writable (as ``cpusets.CgroupCpusets.check``): a job-owned or
job-writable cgroup is refused, by name.

Files (docs/spare-capacity.md, "Node side", has the table): v2 ``cpu.max``, ``cpu.weight``,
``cpu.idle``, ``memory.high``, ``memory.max``; v1 ``cpu.cfs_period_us``, ``cpu.cfs_quota_us``,
``cpu.shares``, ``cpu.idle``, ``memory.soft_limit_in_bytes``, ``memory.limit_in_bytes``. Use is
read as HTCondor does: CPU from ``cpu.stat`` ``usage_usec`` (v2) or ``cpuacct.usage`` (v1),
memory as anonymous plus shared memory from ``memory.stat`` (v2 ``anon`` + ``shmem``, v1
``total_rss`` + ``total_shmem``), never page cache.
"""

from __future__ import annotations

import errno
import os
import stat
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

from cosched_node.cpusets import CGROUP_COMPONENT_RE, _root_only, group_path_problem
from cosched_node.cpusets import _read_text as read_text

SPARE_PARENT = "cosched_spare"
CFS_PERIOD_US = 100_000
MIN_QUOTA_US = 1_000            # the kernel's least cfs quota
V2_WEIGHT = 1                   # cpu.weight's least value (weight low; cpu.idle does the rest)
V1_SHARES = 2                   # cpu.shares' least value
V1_CPU_NAMES = ("cpu,cpuacct", "cpuacct,cpu", "cpu")
V1_CONTROLLERS = ("cpu", "cpuacct", "memory")


class SpareCgroupError(OSError):
    """A cgroup that may not be written, or a file that does not read as the kernel writes it."""


@dataclass(frozen=True)
class Usage:
    """A group's use so far: CPU seconds (cumulative) and anonymous + shared memory, bytes."""
    cpu_s: float
    memory_bytes: int


@dataclass(frozen=True)
class Limits:
    """What one spare group may use: cores (the CFS quota) and memory soft / hard, bytes."""
    cores: float
    memory_soft_bytes: int
    memory_hard_bytes: int


def write_text(path: str, text: str) -> None:
    """Write a cgroup file (never following a symlink, never creating one)."""
    fd = os.open(path, os.O_WRONLY | os.O_TRUNC | os.O_NOFOLLOW)
    try:
        os.write(fd, text.encode("ascii"))
    finally:
        os.close(fd)


def parse_stat(text: str) -> Dict[str, int]:
    """``key value`` lines (memory.stat, cpu.stat) as integers; other lines are skipped."""
    out: Dict[str, int] = {}
    for line in text.splitlines()[:512]:
        parts = line.split()
        if len(parts) == 2 and parts[1].isdigit() and len(parts[1]) < 21:
            out[parts[0]] = int(parts[1])
    return out


def quota_us(cores: float, period_us: int = CFS_PERIOD_US) -> int:
    """The CFS quota of ``cores`` cores per ``period_us``, at least the kernel's 1 ms."""
    return max(MIN_QUOTA_US, int(round(cores * period_us)))


class SpareCgroups:
    """Our spare groups and the claims' own cgroups under one cgroup root (v1 or v2)."""

    def __init__(self, root: str = "/sys/fs/cgroup", proc_root: str = "/proc", parent: str = SPARE_PARENT) -> None:
        self.root = root.rstrip("/") or "/"
        self.proc_root = proc_root
        self.parent = parent
        self.version: Optional[int] = None
        self.hierarchies: Dict[str, str] = {}     # v1: controller -> hierarchy dir; v2: "" -> root

    # -- the root

    def probe(self) -> Optional[str]:
        """None when spare groups can be made and written here, else why not (named)."""
        self.version, self.hierarchies = None, {}
        if not os.path.isdir(self.root):
            return f"cgroup root {self.root} is missing"
        controllers_file = os.path.join(self.root, "cgroup.controllers")
        if os.path.exists(controllers_file):
            try:
                controllers = read_text(controllers_file).split()
            except OSError as exc:
                return f"cgroup root {self.root}: cgroup.controllers unreadable ({exc.strerror})"
            missing = [c for c in ("cpu", "memory") if c not in controllers]
            if missing:
                return f"cgroup root {self.root} is cgroup v2 without the {' and '.join(missing)} controller"
            if not os.access(self.root, os.W_OK | os.X_OK):
                return f"cgroup root {self.root} is not writable"
            self.version, self.hierarchies = 2, {"": self.root}
            return None
        found: Dict[str, str] = {}
        for name in V1_CPU_NAMES:
            path = os.path.join(self.root, name)
            if "cpu" not in found and os.path.isfile(os.path.join(path, "cpu.cfs_quota_us")):
                found["cpu"] = path
            if "cpuacct" not in found and os.path.isfile(os.path.join(path, "cpuacct.usage")):
                found["cpuacct"] = path
        if "cpuacct" not in found and os.path.isfile(os.path.join(self.root, "cpuacct", "cpuacct.usage")):
            found["cpuacct"] = os.path.join(self.root, "cpuacct")
        if os.path.isfile(os.path.join(self.root, "memory", "memory.limit_in_bytes")):
            found["memory"] = os.path.join(self.root, "memory")
        missing = [c for c in V1_CONTROLLERS if c not in found]
        if missing:
            return (f"cgroup root {self.root} is neither cgroup v2 (no cgroup.controllers) nor cgroup v1 with "
                    f"the cpu, cpuacct and memory controllers (missing {', '.join(missing)})")
        for controller, path in found.items():
            if not os.access(path, os.W_OK | os.X_OK):
                return f"cgroup v1 hierarchy {path} ({controller}) is not writable"
        self.version, self.hierarchies = 1, found
        return None

    def _dirs(self, group: str) -> List[str]:
        """The directories of ``group`` (one per distinct hierarchy)."""
        bases = dict.fromkeys(self.hierarchies.values())
        return [base + group for base in bases]

    def _dir(self, controller: str, group: str) -> str:
        base = self.hierarchies.get(controller) if self.version == 1 else self.hierarchies.get("")
        if base is None:
            raise SpareCgroupError(errno.ENOENT, f"no {controller or 'cgroup'} hierarchy probed")
        return base + group

    # -- our groups

    def ours(self, slot: str) -> str:
        """Our group of a spare claim's dynamic slot (``/cosched_spare/slot3_1``)."""
        if not CGROUP_COMPONENT_RE.match(slot) or slot in (".", ".."):
            raise SpareCgroupError(errno.EINVAL, f"slot name {slot[:40]!r} cannot name a cgroup")
        return f"/{self.parent}/{slot}"

    def is_ours(self, group: str) -> bool:
        return group.startswith(f"/{self.parent}/")

    def create(self, group: str) -> None:
        """Make ``group`` (and our parent) in every hierarchy, root's, mode 0755; v2 enables
        ``+cpu +memory`` for the children of the root and of the parent first."""
        if not self.is_ours(group):
            raise SpareCgroupError(errno.EPERM, f"{group} is not one of our spare groups")
        if self.version == 2:
            self._enable(self.root)
        for path in self._dirs(f"/{self.parent}"):
            self._mkdir(path)
        self._idle_parent()
        if self.version == 2:
            self._enable(self.root + f"/{self.parent}")
        for path in self._dirs(group):
            self._mkdir(path)
        if self.version == 1:   # v1 charges a moved process's memory to its old group unless told
            try:
                write_text(os.path.join(self._dir("memory", group), "memory.move_charge_at_immigrate"), "3")
            except OSError:
                pass
        problem = self.check(group)
        if problem:
            raise SpareCgroupError(errno.EPERM, problem)

    def _idle_parent(self) -> None:
        """Our parent group in the idle class at the least weight: CPU weight is shared out
        level by level, so a spare group idle only among its siblings would still weigh, through
        a parent of the default weight, as much as every primary together (measured on the pool:
        a primary's busy phases took twice as long). A kernel without ``cpu.idle`` keeps the
        least weight."""
        cpu = self._dir("" if self.version == 2 else "cpu", f"/{self.parent}")
        weight = os.path.join(cpu, "cpu.weight" if self.version == 2 else "cpu.shares")
        if not self._idle(weight):
            write_text(weight, str(V2_WEIGHT if self.version == 2 else V1_SHARES))
        if os.path.exists(os.path.join(cpu, "cpu.idle")):
            write_text(os.path.join(cpu, "cpu.idle"), "1")

    @staticmethod
    def _mkdir(path: str) -> None:
        try:
            os.mkdir(path, 0o755)
        except FileExistsError:
            pass

    @staticmethod
    def _enable(path: str) -> None:
        control = os.path.join(path, "cgroup.subtree_control")
        have = read_text(control).split()
        wanted = [c for c in ("cpu", "memory") if c not in have]
        if wanted:
            write_text(control, " ".join("+" + c for c in wanted))

    def remove(self, group: str) -> Optional[str]:
        """rmdir our ``group`` in every hierarchy: None when gone, else why it stays (busy)."""
        if not self.is_ours(group):
            return f"{group} is not one of our spare groups"
        problem = None
        for path in self._dirs(group):
            try:
                os.rmdir(path)
            except FileNotFoundError:
                continue
            except OSError as exc:
                problem = f"{path}: {exc.strerror}"
        return problem

    def procs(self, group: str) -> List[int]:
        """The pids in ``group`` (every hierarchy)."""
        pids = set()
        for path in self._dirs(group):
            try:
                text = read_text(os.path.join(path, "cgroup.procs"), 1 << 20)
            except OSError:
                continue
            pids.update(int(p) for p in text.split() if p.isdigit() and len(p) < 8)
        return sorted(pids)

    def move(self, group: str, pids: Sequence[int]) -> List[int]:
        """Move ``pids`` into ``group`` (every hierarchy); the pids moved (an exited one is not)."""
        moved = []
        for pid in pids:
            try:
                for path in self._dirs(group):
                    write_text(os.path.join(path, "cgroup.procs"), str(int(pid)))
                moved.append(pid)
            except ProcessLookupError:
                continue
            except OSError as exc:
                if exc.errno != errno.ESRCH:
                    raise
        return moved

    # -- a claim's own cgroup

    def proc_groups(self, pid: int) -> Optional[Dict[str, str]]:
        """``pid``'s cgroup per controller we use (v2: key ""), or None."""
        try:
            text = read_text(f"{self.proc_root}/{int(pid)}/cgroup")
        except OSError:
            return None
        out: Dict[str, str] = {}
        for line in text.splitlines():
            parts = line.split(":", 2)
            if len(parts) != 3:
                continue
            if self.version == 2 and parts[0] == "0" and parts[1] == "":
                out[""] = parts[2].strip()
            elif self.version == 1:
                for controller in parts[1].split(","):
                    if controller in V1_CONTROLLERS:
                        out[controller] = parts[2].strip()
        wanted = ("",) if self.version == 2 else V1_CONTROLLERS
        return out if all(c in out for c in wanted) else None

    def cgroup_of(self, pids: Sequence[int], starter_pid: int) -> Tuple[Optional[str], Optional[str]]:
        """(the one cgroup all of a claim's job processes are in, in every hierarchy we use,
        None) or (None, why there is none). Ours never counts as the claim's own."""
        if not pids:
            return None, "no job process"
        found = set()
        for pid in pids:
            groups = self.proc_groups(pid)
            if groups is None:
                return None, f"job process {pid} has no cgroup entry for every controller"
            found.update(groups.values())
        if len(found) != 1:
            return None, f"job processes in {len(found)} cgroups: {', '.join(sorted(found))[:160]}"
        group = found.pop()
        if self.is_ours(group):
            return None, f"cgroup {group} is ours"
        problem = self.check(group)
        if problem:
            return None, problem
        starter = self.proc_groups(starter_pid) or {}
        if any(s == group or s.startswith(group + "/") for s in starter.values()):
            return None, f"cgroup {group} is its starter's own"
        return group, None

    def check(self, group: str) -> Optional[str]:
        """Why ``group`` may not be written, or None: a plain path under the root, not the
        root, root's own and neither group- nor other-writable all the way down, as are the
        limit files in it."""
        for base in dict.fromkeys(self.hierarchies.values()):
            problem = group_path_problem(group, base)
            if problem is not None:
                return problem
            where = os.path.join(base, *group.split("/")[1:])
            for name in os.listdir(where) if os.path.isdir(where) else ():
                if name.startswith(("cpu.", "memory.", "cgroup.procs")):
                    info = os.lstat(os.path.join(where, name))
                    if not stat.S_ISREG(info.st_mode) or not _root_only(info):
                        return (f"cgroup {group}: {name} is job-owned or job-writable (uid {info.st_uid}, "
                                f"mode {stat.S_IMODE(info.st_mode):o})")
        return None

    # -- use and limits

    def usage(self, group: str) -> Usage:
        """CPU seconds so far and anonymous + shared memory now (OSError / SpareCgroupError
        when a file is missing or malformed)."""
        if self.version == 2:
            cpu = parse_stat(read_text(os.path.join(self._dir("", group), "cpu.stat")))
            memory = parse_stat(read_text(os.path.join(self._dir("", group), "memory.stat")))
            keys, cpu_key, scale = ("anon", "shmem"), "usage_usec", 1e-6
        else:
            text = read_text(os.path.join(self._dir("cpuacct", group), "cpuacct.usage")).strip()
            cpu = {"usage": int(text)} if text.isdigit() and len(text) < 21 else {}
            memory = parse_stat(read_text(os.path.join(self._dir("memory", group), "memory.stat")))
            keys, cpu_key, scale = ("total_rss", "total_shmem"), "usage", 1e-9
        if cpu_key not in cpu or any(k not in memory for k in keys):
            raise SpareCgroupError(errno.EINVAL, f"cgroup {group}: no {cpu_key} or no {'+'.join(keys)} in its stats")
        return Usage(cpu[cpu_key] * scale, sum(memory[k] for k in keys))

    def limit_files(self, limits: Limits) -> List[Tuple[str, str, str]]:
        """(controller, file, value) to write for ``limits``, in order (docs table)."""
        quota = quota_us(limits.cores)
        soft, hard = str(max(0, limits.memory_soft_bytes)), str(max(0, limits.memory_hard_bytes))
        if self.version == 2:
            return [("", "cpu.max", f"{quota} {CFS_PERIOD_US}"), ("", "cpu.weight", str(V2_WEIGHT)),
                    ("", "cpu.idle", "1"), ("", "memory.max", hard), ("", "memory.high", soft)]
        return [("cpu", "cpu.cfs_period_us", str(CFS_PERIOD_US)), ("cpu", "cpu.cfs_quota_us", str(quota)),
                ("cpu", "cpu.shares", str(V1_SHARES)), ("cpu", "cpu.idle", "1"),
                ("memory", "memory.limit_in_bytes", hard), ("memory", "memory.soft_limit_in_bytes", soft)]

    def write_limits(self, group: str, limits: Limits, memory: bool = True) -> List[str]:
        """Write ``limits`` into ``group`` (the CPU files only when not ``memory``); the files
        missing here (``cpu.idle`` before Linux 5.15) are returned, every other failure raised."""
        skipped = []
        for controller, name, value in self.limit_files(limits):
            if not memory and name.startswith("memory."):
                continue
            path = os.path.join(self._dir(controller, group), name)
            if name == "cpu.idle" and not os.path.exists(path):
                skipped.append(name)
                continue
            if name in ("cpu.shares", "cpu.weight") and self._idle(path):
                continue    # the kernel refuses a weight for an idle group, whose weight is the least
            try:
                write_text(path, value)
            except OSError as exc:
                raise SpareCgroupError(exc.errno or errno.EIO, f"{path} = {value}: {exc.strerror or exc}") from None
        return skipped

    @staticmethod
    def _idle(weight_path: str) -> bool:
        try:
            return read_text(os.path.join(os.path.dirname(weight_path), "cpu.idle")).strip() == "1"
        except OSError:
            return False

    def read_limit(self, group: str, name: str) -> str:
        controller = "" if self.version == 2 else ("memory" if name.startswith("memory.") else "cpu")
        return read_text(os.path.join(self._dir(controller, group), name)).strip()
