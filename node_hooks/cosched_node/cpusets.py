"""cgroup v2 cpusets of paper 001's mates and guests (issue 14), for the ROOT node agent.
Stdlib only, Python 3.9+.

A node-sharing node has a "node" slot (C cores) and an overlapping "guest" slot (config).
Every node-slot claim holds a core set of its ``Cpus`` cores, disjoint from the others'; a
guest claim takes k = min(floor(mate cores x SharingFactor), mate cores - 1) cores of the
node-slot claim its ``CoSchedPinMate`` names (its mate), which are taken out of the mate's
cgroup ``cpuset.cpus`` before the guest's cgroup is given them. When the guest ends its cores
go back to the mate (Listing 3 of paper 001); when the mate ends first the guest keeps them
("lent" cores, which no new node-slot claim may take until the guest ends).

Two halves:

- pure: cpu lists (``parse_cpu_list``, ``format_cpu_list``), which CPUs a claim gets
  (``node_cpus``, ``lowest_free``, ``guest_share``, ``guest_take``), what each claim's
  ``cpuset.cpus`` should hold (``desired``, ``lent``) and in which order to write them so that
  the written sets are pairwise disjoint after every single write (``ordered_writes``);
- files (``CgroupCpusets``): the cgroup root (``--cgroup-root``, default /sys/fs/cgroup, the
  cgroup2 mount point, since /proc/<pid>/cgroup paths are relative to it) is usable only when
  it is cgroup v2 (``cgroup.controllers`` lists ``cpuset``), writable, and its
  ``cpuset.cpus.effective`` lists at least the node slot's C CPUs. The node's CPUs are the
  root's ``cpuset.cpus.effective`` (what the kernel lets any cgroup use: online CPUs minus
  isolated ones), and the node slot's C cores are the first C of them in ascending order.
  A claim's cgroup is the one cgroup (``0::`` line of /proc/<pid>/cgroup) of all its job
  processes; it must lie under the root, not be the root nor its starter's own cgroup (or an
  ancestor of it), and it and every directory between it and the root must be root's and
  neither group- nor other-writable, as must its ``cpuset.cpus``: a job-owned or job-writable
  cgroup is refused, by name. Only ``cpuset.cpus`` is ever written.
"""

from __future__ import annotations

import math
import os
import re
import stat
from dataclasses import dataclass
from typing import Dict, FrozenSet, Iterable, List, Mapping, Optional, Sequence, Set, Tuple

MAX_CPU = 16383
MAX_LIST_CHARS = 65536
CPU_LIST_RE = re.compile(r"^(\d{1,5}(-\d{1,5})?)(,\d{1,5}(-\d{1,5})?)*$")
CGROUP_COMPONENT_RE = re.compile(r"^[A-Za-z0-9_.@:+=,\\-]{1,255}$")
MAX_CGROUP_DEPTH = 32
CPUS_FILE = "cpuset.cpus"
EFFECTIVE_FILE = "cpuset.cpus.effective"
CONTROLLERS_FILE = "cgroup.controllers"

Cpus = FrozenSet[int]


class CpusetError(ValueError):
    """A cpu list or cgroup path that cannot be honoured."""


# ---------------------------------------------------------------------------------------
# Pure: cpu lists, assignments, write order


def parse_cpu_list(text: str) -> Cpus:
    """The CPUs of a kernel cpu list (``0-3,8,10-11``; empty: none)."""
    if not isinstance(text, str) or len(text) > MAX_LIST_CHARS:
        raise CpusetError("cpu list is not a short string")
    text = text.strip()
    if not text:
        return frozenset()
    if not CPU_LIST_RE.match(text):
        raise CpusetError(f"{text[:40]!r} is not a cpu list")
    ranges = []
    for part in text.split(","):
        low, _, high = part.partition("-")
        first, last = int(low), int(high or low)
        if first > last or last > MAX_CPU:
            raise CpusetError(f"cpu range {part!r} is reversed or beyond cpu {MAX_CPU}")
        ranges.append((first, last))
    cpus: Set[int] = set()
    covered = -1          # each CPU added once, however often overlapping ranges repeat it
    for first, last in sorted(ranges):
        if last > covered:
            cpus.update(range(max(first, covered + 1), last + 1))
            covered = last
    return frozenset(cpus)


def format_cpu_list(cpus: Iterable[int]) -> str:
    """``0-3,8``: ascending, ranges merged."""
    ordered = sorted(set(cpus))
    parts: List[str] = []
    i = 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and ordered[j + 1] == ordered[j] + 1:
            j += 1
        parts.append(str(ordered[i]) if i == j else f"{ordered[i]}-{ordered[j]}")
        i = j + 1
    return ",".join(parts)


def node_cpus(effective: Iterable[int], cores: int) -> Optional[Tuple[int, ...]]:
    """The node slot's CPUs: the first ``cores`` of the root's effective CPUs (None: too few)."""
    ordered = sorted(set(effective))
    return tuple(ordered[:cores]) if cores >= 1 and len(ordered) >= cores else None


def lowest_free(node: Sequence[int], held: Iterable[int], count: int) -> Optional[Tuple[int, ...]]:
    """The ``count`` lowest CPUs of ``node`` nobody holds, or None when fewer are free."""
    taken = set(held)
    free = [c for c in sorted(node) if c not in taken]
    return tuple(free[:count]) if 1 <= count <= len(free) else None


def guest_share(mate_cores: int, sharing_factor: float) -> int:
    """k, the cores a guest takes of a mate of ``mate_cores``: floor(cores x SharingFactor),
    at most cores - 1 (as ``condor_sched.modes.mates.sd.guest_cores``)."""
    if mate_cores < 1:
        return 0
    return max(0, min(math.floor(mate_cores * sharing_factor), mate_cores - 1))


def guest_take(mate: Sequence[int], k: int) -> Tuple[int, ...]:
    """The guest's CPUs: the highest ``k`` of its mate's (the mate keeps its lowest)."""
    ordered = sorted(mate)
    return tuple(ordered[len(ordered) - k:]) if 1 <= k < len(ordered) else ()


@dataclass(frozen=True)
class Holder:
    """A claim holding CPUs: a node-slot claim (``mate`` None) or a guest (its mate's key)."""
    key: str
    cpus: Tuple[int, ...]
    mate: Optional[str] = None


def desired(holders: Iterable[Holder]) -> Dict[str, Cpus]:
    """What each holder's ``cpuset.cpus`` should hold: a guest its cores, a node-slot claim
    its cores minus those of its live guest."""
    holders = list(holders)
    lent_to: Dict[str, set] = {}
    for h in holders:
        if h.mate is not None:
            lent_to.setdefault(h.mate, set()).update(h.cpus)
    return {h.key: frozenset(h.cpus) if h.mate is not None else frozenset(h.cpus) - lent_to.get(h.key, set())
            for h in holders}


def lent(holders: Iterable[Holder]) -> Cpus:
    """CPUs guests keep after their mate ended (the mate is no holder any more)."""
    holders = list(holders)
    keys = {h.key for h in holders}
    return frozenset(c for h in holders if h.mate is not None and h.mate not in keys for c in h.cpus)


def overlap(sets: Mapping[str, Cpus]) -> Optional[Tuple[str, str, Cpus]]:
    """Two keys whose sets share CPUs (and what they share), or None when all are disjoint."""
    keys = sorted(sets)
    for i, a in enumerate(keys):
        for b in keys[i + 1:]:
            common = sets[a] & sets[b]
            if common:
                return a, b, common
    return None


def ordered_writes(current: Mapping[str, Cpus], wanted: Mapping[str, Cpus]
                   ) -> Tuple[List[Tuple[str, Cpus]], List[str]]:
    """The writes that take ``current`` to ``wanted`` (keys of ``wanted`` only), ordered so
    that no write makes two sets overlap: first every set that loses CPUs shrinks to what it
    keeps (shrinking the mate before widening its guest), then sets widen, each only once it
    is disjoint from every other set as it then stands. A set is never written empty (an
    empty ``cpuset.cpus`` means "all of the parent's"). Keys that cannot be written yet
    without an overlap are returned second (tried again later)."""
    state = {k: frozenset(v) for k, v in current.items()}
    writes: List[Tuple[str, Cpus]] = []
    for key in sorted(wanted):
        have, want = state.get(key, frozenset()), frozenset(wanted[key])
        if have - want and have & want:
            state[key] = have & want
            writes.append((key, state[key]))
    progress = True
    while progress:
        progress = False
        for key in sorted(wanted):
            want = frozenset(wanted[key])
            if not want or state.get(key, frozenset()) == want:
                continue
            if all(not (want & cpus) for other, cpus in state.items() if other != key):
                state[key] = want
                writes.append((key, want))
                progress = True
    deferred = [k for k in sorted(wanted) if wanted[k] and state.get(k, frozenset()) != frozenset(wanted[k])]
    return writes, deferred


# ---------------------------------------------------------------------------------------
# Files: the cgroup root, a claim's cgroup, its cpuset.cpus


def _read_text(path: str, limit: int = MAX_LIST_CHARS) -> str:
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    try:
        return os.read(fd, limit + 1)[:limit].decode("ascii", "replace")
    finally:
        os.close(fd)


def _root_only(info: os.stat_result) -> bool:
    return info.st_uid == os.geteuid() and not info.st_mode & 0o022


def group_path_problem(cgroup: str, base: str) -> Optional[str]:
    """Why ``cgroup`` (a /proc path such as ``/htcondor/slot1_1``) below the hierarchy ``base``
    may not be written, or None: plain names, under ``base`` but not ``base`` itself, and every
    directory down to it root's own and neither group- nor other-writable."""
    parts = cgroup.split("/")
    if not cgroup.startswith("/") or cgroup == "/" or len(parts) > MAX_CGROUP_DEPTH + 1 \
            or any(p in ("", ".", "..") or not CGROUP_COMPONENT_RE.match(p) for p in parts[1:]):
        return f"cgroup {cgroup[:80]!r} is not a plain cgroup under {base}"
    where = base
    for part in parts[1:]:
        where = os.path.join(where, part)
        try:
            info = os.lstat(where)
        except OSError:
            return f"cgroup {cgroup} is not under {base}"
        if not stat.S_ISDIR(info.st_mode):
            return f"cgroup {cgroup}: {where} is not a directory"
        if not _root_only(info):
            return (f"cgroup {cgroup} is job-owned or job-writable ({where}: uid {info.st_uid}, "
                    f"mode {stat.S_IMODE(info.st_mode):o})")
    return None


class CgroupCpusets:
    """``cpuset.cpus`` of job cgroups under one cgroup v2 root."""

    def __init__(self, root: str = "/sys/fs/cgroup", proc_root: str = "/proc") -> None:
        self.root = root.rstrip("/") or "/"
        self.proc_root = proc_root

    def probe(self) -> Tuple[Optional[Cpus], Optional[str]]:
        """(the root's effective CPUs, None) when usable, else (None, why not)."""
        if not os.path.isdir(self.root):
            return None, f"cgroup root {self.root} is missing"
        try:
            controllers = _read_text(os.path.join(self.root, CONTROLLERS_FILE), 4096).split()
        except OSError:
            return None, f"cgroup root {self.root} is not cgroup v2 (no {CONTROLLERS_FILE})"
        if "cpuset" not in controllers:
            return None, f"cgroup root {self.root}: the cpuset controller is not available ({CONTROLLERS_FILE})"
        if not os.access(self.root, os.W_OK | os.X_OK):
            return None, f"cgroup root {self.root} is not writable"
        try:
            effective = parse_cpu_list(_read_text(os.path.join(self.root, EFFECTIVE_FILE)))
        except (OSError, CpusetError) as exc:
            return None, f"cgroup root {self.root}: no readable {EFFECTIVE_FILE} ({getattr(exc, 'strerror', None) or exc})"
        if not effective:
            return None, f"cgroup root {self.root}: {EFFECTIVE_FILE} is empty"
        return effective, None

    def proc_cgroup(self, pid: int) -> Optional[str]:
        """The cgroup v2 path of ``pid`` (its ``0::`` line), or None."""
        try:
            text = _read_text(f"{self.proc_root}/{int(pid)}/cgroup", 1 << 16)
        except OSError:
            return None
        for line in text.splitlines():
            if line.startswith("0::"):
                return line[3:].strip()
        return None

    def path(self, cgroup: str) -> str:
        return self.root + cgroup if self.root != "/" else cgroup

    def check(self, cgroup: str) -> Optional[str]:
        """Why ``cgroup`` (a /proc path such as ``/htcondor/slot1_1``) may not be written, or
        None: under the root but not the root, plain names, root's own all the way down."""
        problem = group_path_problem(cgroup, self.root)
        if problem is not None:
            return problem
        where = os.path.join(self.root, *cgroup.split("/")[1:])
        try:
            info = os.lstat(os.path.join(where, CPUS_FILE))
        except OSError:
            return f"cgroup {cgroup} has no {CPUS_FILE} (cpuset controller not enabled for it)"
        if not stat.S_ISREG(info.st_mode) or not _root_only(info):
            return (f"cgroup {cgroup}: {CPUS_FILE} is job-owned or job-writable (uid {info.st_uid}, "
                    f"mode {stat.S_IMODE(info.st_mode):o})")
        return None

    def cgroup_of(self, pids: Sequence[int], starter_pid: int) -> Tuple[Optional[str], Optional[str]]:
        """(the one cgroup of a claim's job processes, None) or (None, why there is none)."""
        if not pids:
            return None, "no job process"
        found = {self.proc_cgroup(pid) for pid in pids}
        if None in found:
            return None, "a job process has no cgroup v2 entry"
        if len(found) != 1:
            return None, f"job processes in {len(found)} cgroups: {', '.join(sorted(f or '' for f in found))[:160]}"
        cgroup = found.pop() or ""
        problem = self.check(cgroup)
        if problem:
            return None, problem
        starter = self.proc_cgroup(starter_pid)
        if starter is not None and (starter == cgroup or starter.startswith(cgroup + "/")):
            return None, f"cgroup {cgroup} is its starter's own"
        return cgroup, None

    def read(self, cgroup: str) -> Cpus:
        return parse_cpu_list(_read_text(os.path.join(self.path(cgroup), CPUS_FILE)))

    def write(self, cgroup: str, cpus: Cpus) -> None:
        """Write ``cpuset.cpus`` (never empty; never following a symlink)."""
        if not cpus:
            raise CpusetError("an empty cpuset.cpus would mean all of the parent's CPUs")
        fd = os.open(os.path.join(self.path(cgroup), CPUS_FILE), os.O_WRONLY | os.O_TRUNC | os.O_NOFOLLOW)
        try:
            os.write(fd, (format_cpu_list(cpus) + "\n").encode("ascii"))
        finally:
            os.close(fd)
