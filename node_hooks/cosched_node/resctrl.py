"""resctrl manager: SNS's LLC way and memory bandwidth allocation on one node (Section 4.4
of paper 000), for the ROOT node agent. Stdlib only, Python 3.9+.

One resctrl group per job (``<root>/cosched_<job>``) with, per cache id it runs on, a
contiguous mask of its w ways (``L3:<id>=<hex>``) and, where MBA exists, a bandwidth
percentage (``MB:<id>=<pct>``, rounded up to min + N * granularity). Ways no job asked for
are given away in equal shares to the jobs of that cache id and reclaimed when a new job
arrives (masks are recomputed from the requests every time; :func:`contiguous_masks` is
the pure computation). The default group's schemata is never changed.

Hostile inputs: job names must match ``JOB_NAME`` (no ``/``, no ``..``), pids, cache ids,
ways and percentages are bounded integers; anything else raises :class:`ResctrlError`.
When resctrl is absent, or the hardware has no CLOSID left, the job runs ungrouped and the
reason is logged (``add_job`` returns False).

The node agent calls :meth:`ResctrlManager.sync` every interval with the live jobs: it is
stateless (the groups on disk and the jobs given are the whole truth), so an agent restart
or a job ending between intervals needs nothing special. :func:`group_shares` sizes each
job's group from the ways and bandwidth HTCondor allocated to its procs' dynamic slots.
"""

from __future__ import annotations

import errno
import json
import os
import re
import math
import sys
from dataclasses import dataclass
from typing import Callable, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

from cosched_node.procs import PID_MAX
from cosched_node.rules import CACHE_ID_MAX, CBM_WIDTH_MAX

JOB_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.@#-]{0,95}$")
GROUP_PREFIX = "cosched_"
RESERVED = {"info", "mon_groups", "mon_data"}

Log = Callable[[str], None]


class ResctrlError(ValueError):
    """A request that cannot be honoured (bad value, oversubscribed ways, no CLOSID)."""


class ClosidsExhausted(ResctrlError):
    """No CLOSID left for another group."""


def _stderr(message: str) -> None:
    sys.stderr.write("cosched_resctrl: %s\n" % message)


# ---------------------------------------------------------------------------------------
# Pure computations


def _int(what: str, value: object, lo: int, hi: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise ResctrlError("%s must be an integer in [%d, %d], got %r" % (what, lo, hi, value))
    return value


def check_job_name(name: object) -> str:
    if not isinstance(name, str) or not JOB_NAME.match(name) or ".." in name or name in RESERVED:
        raise ResctrlError("job name %r refused (must match %s, no '..')" % (name, JOB_NAME.pattern))
    return name


def cbm_width(cbm_mask_hex: str) -> Tuple[int, int]:
    """(width, lowest bit) of a contiguous ``cbm_mask`` such as ``fffff``."""
    text = cbm_mask_hex.strip()
    if not re.match(r"^[0-9a-fA-F]{1,16}$", text):
        raise ResctrlError("cbm_mask %r is not a hex mask" % cbm_mask_hex)
    value = int(text, 16)
    if value == 0:
        raise ResctrlError("cbm_mask is empty")
    low = (value & -value).bit_length() - 1
    width = bin(value).count("1")
    if value != ((1 << width) - 1) << low:
        raise ResctrlError("cbm_mask %r is not contiguous" % cbm_mask_hex)
    return width, low


def contiguous_masks(requests: Mapping[str, int], width: int, min_bits: int = 1, low_bit: int = 0,
                     give_away: bool = True) -> Dict[str, int]:
    """Disjoint contiguous masks for one cache id: job -> mask of ``requests[job]`` ways
    (at least ``min_bits``), laid out in job-name order from ``low_bit``; the ways nobody
    asked for are shared equally (remainder to the first jobs) when ``give_away``."""
    width = _int("cbm width", width, 1, CBM_WIDTH_MAX)
    min_bits = _int("min_cbm_bits", min_bits, 1, width)
    jobs = sorted(requests)
    ways = {j: max(min_bits, _int("ways of %s" % j, requests[j], 1, width)) for j in jobs}
    total = sum(ways.values())
    if total > width:
        raise ResctrlError("ways requested (%d) exceed the %d ways of the cache" % (total, width))
    if give_away and jobs:
        spare = width - total
        for i, j in enumerate(jobs):
            ways[j] += spare // len(jobs) + (1 if i < spare % len(jobs) else 0)
    masks, bit = {}, low_bit
    for j in jobs:
        masks[j] = ((1 << ways[j]) - 1) << bit
        bit += ways[j]
    return masks


def mba_percent(percent: int, min_bandwidth: int, granularity: int) -> int:
    """A bandwidth percentage rounded UP to min + N * granularity, capped at 100."""
    percent = _int("MB percent", percent, 1, 100)
    if percent <= min_bandwidth:
        return min_bandwidth
    steps = -(-(percent - min_bandwidth) // max(1, granularity))
    return min(100, min_bandwidth + steps * max(1, granularity))


def render_schemata(l3: Mapping[int, int], mb: Mapping[int, int]) -> str:
    lines = ["L3:" + ";".join("%d=%x" % (c, l3[c]) for c in sorted(l3))]
    if mb:
        lines.append("MB:" + ";".join("%d=%d" % (c, mb[c]) for c in sorted(mb)))
    return "\n".join(lines) + "\n"


def cache_ids_of(schemata_text: str) -> List[int]:
    """Cache ids named on the ``L3:`` line of a schemata file."""
    for line in schemata_text.splitlines():
        line = line.strip()
        if line.startswith("L3:"):
            ids = []
            for part in line[3:].split(";"):
                key = part.split("=", 1)[0].strip()
                if key.isdigit():
                    ids.append(int(key))
            return sorted(ids)
    return []


# ---------------------------------------------------------------------------------------
# The manager


class ResctrlManager:
    """Groups, masks and tasks under one resctrl root (``/sys/fs/resctrl`` on a node)."""

    def __init__(self, root: str = "/sys/fs/resctrl", log: Log = _stderr, state_file: Optional[str] = None) -> None:
        self.root = root
        self.log = log
        self.state_file = state_file
        self.requests: Dict[str, Dict[int, int]] = {}
        self.mb_requests: Dict[str, Dict[int, int]] = {}
        self._told: Dict[str, str] = {}   # job -> reason last logged for running ungrouped
        self._told_no_mba = False
        self.available = os.path.isfile(os.path.join(root, "info", "L3", "cbm_mask")) and os.path.isfile(
            os.path.join(root, "schemata"))
        if not self.available:
            self.log("resctrl absent at %s (no info/L3/cbm_mask): jobs run ungrouped" % root)
            return
        self.width, self.low_bit = cbm_width(self._read("info/L3/cbm_mask"))
        self.min_bits = self._read_int("info/L3/min_cbm_bits", 1)
        self.num_closids = self._read_int("info/L3/num_closids", 1)
        self.cache_ids = cache_ids_of(self._read("schemata"))
        self.mba = os.path.isfile(os.path.join(root, "info", "MB", "min_bandwidth"))
        self.mb_min = self._read_int("info/MB/min_bandwidth", 10) if self.mba else 0
        self.mb_gran = self._read_int("info/MB/bandwidth_gran", 10) if self.mba else 0
        self._load_state()

    # -- file helpers
    def _read(self, rel: str) -> str:
        with open(os.path.join(self.root, rel), encoding="ascii", errors="replace") as f:   # a kernel file: ASCII
            return f.read(4096)

    def _read_int(self, rel: str, default: int) -> int:
        try:
            text = self._read(rel).strip()
        except OSError:
            return default
        return int(text) if text.isdigit() and len(text) < 8 else default

    def group_dir(self, job: str) -> str:
        return os.path.join(self.root, GROUP_PREFIX + check_job_name(job))

    def our_groups(self) -> List[str]:
        return sorted(d[len(GROUP_PREFIX):] for d in os.listdir(self.root)
                      if d.startswith(GROUP_PREFIX) and os.path.isdir(os.path.join(self.root, d)))

    def _groups_in_use(self) -> int:
        return sum(1 for d in os.listdir(self.root)
                   if d not in RESERVED and os.path.isdir(os.path.join(self.root, d)))

    def _load_state(self) -> None:
        if not self.state_file or not os.path.isfile(self.state_file):
            return
        try:
            with open(self.state_file) as f:
                raw = json.load(f)
            existing = set(self.our_groups())
            for job, req in raw.get("requests", {}).items():
                if job in existing:
                    self.requests[check_job_name(job)] = {_int("cache id", int(c), 0, CACHE_ID_MAX):
                                                          _int("ways", w, 1, self.width) for c, w in req.items()}
            for job, req in raw.get("mb", {}).items():
                if job in self.requests:
                    self.mb_requests[job] = {int(c): _int("MB percent", p, 1, 100) for c, p in req.items()}
        except (OSError, ValueError, AttributeError, TypeError) as e:
            self.log("state file %s unusable (%s): starting empty" % (self.state_file, e))

    def _save_state(self) -> None:
        if not self.state_file:
            return
        tmp = self.state_file + ".tmp"
        with open(tmp, "w") as f:
            json.dump({"requests": {j: {str(c): w for c, w in r.items()} for j, r in self.requests.items()},
                       "mb": {j: {str(c): p for c, p in r.items()} for j, r in self.mb_requests.items()}}, f)
        os.replace(tmp, self.state_file)

    # -- the lifecycle
    def validate(self, job: str, ways: Mapping[int, int], pids: Iterable[int],
                 mb_percent: Optional[Mapping[int, int]]) -> Tuple[Dict[int, int], List[int], Dict[int, int]]:
        check_job_name(job)
        if not ways:
            raise ResctrlError("job %s: no ways requested" % job)
        width = self.width if self.available else CBM_WIDTH_MAX
        w = {_int("cache id", c, 0, CACHE_ID_MAX): _int("ways of %s" % job, n, 1, width) for c, n in ways.items()}
        if self.available:
            unknown = sorted(set(w) - set(self.cache_ids))
            if unknown:
                raise ResctrlError("job %s: cache id(s) %s not in schemata %s" % (job, unknown, self.cache_ids))
        p = [_int("pid", x, 2, PID_MAX) for x in pids]
        mb = {_int("cache id", c, 0, CACHE_ID_MAX): _int("MB percent", x, 1, 100) for c, x in (mb_percent or {}).items()}
        return w, p, mb

    def add_job(self, job: str, ways: Mapping[int, int], pids: Iterable[int] = (),
                mb_percent: Optional[Mapping[int, int]] = None) -> bool:
        """Create the job's group with its masks (reclaiming given-away ways from the other
        jobs), move ``pids`` in; False (logged) when the job must run ungrouped."""
        w, p, mb = self.validate(job, ways, pids, mb_percent)
        if not self.available:
            self.log("job %s runs ungrouped: resctrl absent at %s" % (job, self.root))
            return False
        trial = dict(self.requests)
        trial[job] = w
        try:
            masks = self._masks(trial)
        except ResctrlError as e:
            self.log("job %s runs ungrouped: %s" % (job, e))
            return False
        path = self.group_dir(job)
        if not os.path.isdir(path):
            if self._groups_in_use() >= self.num_closids - 1:
                self.log("job %s runs ungrouped: no CLOSID left (%d, the default group included)" % (job, self.num_closids))
                return False
            try:
                os.mkdir(path, 0o755)
            except OSError as e:
                why = "no CLOSID left" if e.errno == errno.ENOSPC else "cannot create its group"
                self.log("job %s runs ungrouped: %s (mkdir %s: %s)" % (job, why, path, e.strerror))
                return False
        self.requests[job] = w
        if mb:
            self.mb_requests[job] = mb
        self._write_all(masks)
        self.add_pids(job, p)
        self._save_state()
        return True

    def add_pids(self, job: str, pids: Iterable[int]) -> int:
        """Move processes into the job's group; vanished ones are logged. Returns how many moved."""
        tasks = os.path.join(self.group_dir(job), "tasks")
        moved = 0
        for pid in pids:
            pid = _int("pid", pid, 2, PID_MAX)
            try:
                with open(tasks, "a") as f:
                    f.write("%d\n" % pid)
                moved += 1
            except OSError as e:
                self.log("job %s: pid %d not moved: %s" % (job, pid, e.strerror))
        return moved

    def remove_job(self, job: str) -> None:
        """Remove the job's group (its tasks fall back to the default group) and give its
        ways away to the remaining jobs."""
        self.requests.pop(job, None)
        self.mb_requests.pop(job, None)
        self._remove_group(job)
        if self.available and self.requests:
            self._write_all(self._masks(self.requests))
        self._save_state()

    def _remove_group(self, job: str) -> None:
        path = self.group_dir(job)
        if self.available and os.path.isdir(path) and not os.path.islink(path):
            try:
                os.rmdir(path)
            except OSError:
                # A directory-based test root holds real files; resctrl's rmdir does not care.
                for name in os.listdir(path):
                    os.unlink(os.path.join(path, name))
                os.rmdir(path)

    def set_tasks(self, job: str, tids: Iterable[int]) -> int:
        """Write to the group's ``tasks`` the task ids it does not list yet; how many moved."""
        try:
            with open(os.path.join(self.group_dir(job), "tasks")) as f:
                present = {int(x) for x in f.read(1 << 20).split() if x.isdigit()}
        except OSError:
            present = set()
        return self.add_pids(job, sorted({_int("pid", t, 2, PID_MAX) for t in tids} - present))

    def _drop_group(self, job: str, why: str) -> None:
        try:
            self._remove_group(job)
            self.log("job %s: resctrl group %s%s removed (%s)" % (job, GROUP_PREFIX, job, why))
        except (OSError, ResctrlError) as e:
            self.log("job %s: cannot remove resctrl group: %s" % (job, getattr(e, "strerror", None) or e))

    def _tell(self, result: Mapping[str, Optional[str]]) -> None:
        for job in sorted(result):
            reason = result[job]
            if reason is None:
                if self._told.pop(job, None) is not None:
                    self.log("job %s: now in resctrl group %s%s" % (job, GROUP_PREFIX, job))
            elif self._told.get(job) != reason:
                self._told[job] = reason
                self.log("job %s runs ungrouped: %s" % (job, reason))
        for job in [j for j in self._told if j not in result]:
            del self._told[job]

    def sync(self, desired: Mapping[str, Mapping[int, int]],
             tasks: Optional[Mapping[str, Iterable[int]]] = None,
             mb_percent: Optional[Mapping[str, Mapping[int, int]]] = None) -> Dict[str, Optional[str]]:
        """Make our groups match ``desired`` (job -> {cache id: ways}, every live job).

        Removes the groups of jobs no longer given (ended: their ways go to the others),
        creates the groups of new ones (reclaiming given-away ways; jobs that already have a
        group keep it first, new jobs are admitted in name order while ways and CLOSIDs
        last), rewrites every group's masks and adds each job's missing ``tasks``.  Returns
        job -> None when grouped, else the reason it runs ungrouped (logged once per job and
        reason).  A job's bad values make it ungrouped, never an exception.
        """
        tasks = tasks or {}
        result: Dict[str, Optional[str]] = {}
        valid: Dict[str, Tuple[Dict[int, int], Dict[int, int]]] = {}
        for job in sorted(desired):
            try:
                w, _, mb = self.validate(job, desired[job], (), (mb_percent or {}).get(job))
            except ResctrlError as e:
                result[str(job)[:100]] = "refused: %s" % e
                continue
            valid[job] = (w, mb)
        if not self.available:   # logged once, when the manager was made
            self._tell(result)   # the refused ones
            for job in valid:
                result[job] = "resctrl absent at %s" % self.root
            return result
        existing = set(self.our_groups())
        for job in sorted(existing - set(valid)):   # ended: free their CLOSIDs first
            self._drop_group(job, "job ended")
        existing &= set(valid)
        accepted: Dict[str, Dict[int, int]] = {}
        for job in sorted(valid, key=lambda j: (j not in existing, j)):
            trial = dict(accepted)
            trial[job] = valid[job][0]
            try:
                self._masks(trial)
            except ResctrlError as e:
                result[job] = str(e)
                continue
            if job not in existing:
                if self._groups_in_use() >= self.num_closids - 1:
                    result[job] = "no CLOSID left (%d, the default group included)" % self.num_closids
                    continue
                try:
                    os.mkdir(self.group_dir(job), 0o755)
                except OSError as e:
                    why = "no CLOSID left" if e.errno == errno.ENOSPC else "cannot create its group"
                    result[job] = "%s (mkdir: %s)" % (why, e.strerror)
                    continue
                self.log("job %s: resctrl group %s%s created" % (job, GROUP_PREFIX, job))
            accepted[job] = valid[job][0]
            result[job] = None
        for job in sorted(existing - set(accepted)):
            self._drop_group(job, "job runs ungrouped")
        self.requests = accepted
        self.mb_requests = {j: valid[j][1] for j in accepted if valid[j][1]} if self.mba else {}
        if not self.mba and any(valid[j][1] for j in accepted) and not self._told_no_mba:
            self._told_no_mba = True
            self.log("no MBA at %s: memory bandwidth shares are not enforced" % self.root)
        if accepted:
            try:
                self._write_all(self._masks(accepted))
            except OSError as e:
                self.log("cannot write resctrl schemata: %s" % e.strerror)
        for job in accepted:
            try:
                self.set_tasks(job, tasks.get(job, ()))
            except ResctrlError as e:
                self.log("job %s: tasks not moved: %s" % (job, e))
        self._tell(result)
        self._save_state()
        return result

    def _masks(self, requests: Mapping[str, Mapping[int, int]]) -> Dict[str, Dict[int, int]]:
        out: Dict[str, Dict[int, int]] = {j: {} for j in requests}
        for cid in self.cache_ids:
            here = {j: r[cid] for j, r in requests.items() if cid in r}
            for j, mask in contiguous_masks(here, self.width, self.min_bits, self.low_bit).items():
                out[j][cid] = mask
        for j, per in out.items():
            for cid in self.cache_ids:
                # A cache id the job does not run on gets the smallest mask at the top ways.
                per.setdefault(cid, ((1 << self.min_bits) - 1) << (self.low_bit + self.width - self.min_bits))
        return out

    def _write_all(self, masks: Mapping[str, Mapping[int, int]]) -> None:
        for job, per in masks.items():
            mb = {}
            if self.mba:
                mb = {c: mba_percent(p, self.mb_min, self.mb_gran) for c, p in self.mb_requests.get(job, {}).items()}
            elif self.mb_requests.get(job):
                self.log("job %s: no MBA on this node, bandwidth not enforced" % job)
            with open(os.path.join(self.group_dir(job), "schemata"), "w") as f:
                f.write(render_schemata(per, mb))

    def schemata(self, job: str) -> str:
        return self._read(os.path.join(GROUP_PREFIX + check_job_name(job), "schemata"))


@dataclass(frozen=True)
class ProcShare:
    """One spread proc on this node: its job's group, its cache, and what its dynamic slot
    was allocated (``LLCWays``, ``MemBW``) and the socket's totals (0: unknown)."""
    group: str
    cache_id: int
    llc_ways: int
    mem_bw_gbs: float
    socket_ways: int
    socket_bw_gbs: float


def mb_percent(mem_bw_gbs: float, socket_bw_gbs: float) -> Optional[int]:
    """A bandwidth share as a percentage of its socket's peak (MBA ``MB:`` line)."""
    if not socket_bw_gbs or mem_bw_gbs <= 0:
        return None
    return max(1, min(100, math.ceil(100.0 * mem_bw_gbs / socket_bw_gbs)))


def group_shares(procs: Sequence[ProcShare]) -> Tuple[Dict[str, Dict[int, int]], Dict[str, Dict[int, int]]]:
    """(ways, MBA percent) per group and cache id.

    A job's procs on one cache share its group there, so the group's ways are the SUM of
    their shares (Spread-n-Share splits the job's w ways over its procs on a socket, some
    possibly 0, and HTCondor accounts each share as the proc's LLCWays), bounded by the
    socket's ways; its bandwidth likewise. A group with 0 ways on a cache has no mask
    there; one with 0 ways everywhere is left out (its procs run ungrouped)."""
    sums: Dict[Tuple[str, int], List[float]] = {}
    for proc in procs:
        entry = sums.setdefault((proc.group, proc.cache_id), [0, 0.0, proc.socket_ways, proc.socket_bw_gbs])
        entry[0] += proc.llc_ways
        entry[1] += proc.mem_bw_gbs
    ways_of: Dict[str, Dict[int, int]] = {}
    percent_of: Dict[str, Dict[int, int]] = {}
    for (group, cache_id), (ways, bw, socket_ways, socket_bw) in sums.items():
        ways = min(int(ways), int(socket_ways)) if socket_ways else int(ways)
        if ways > 0:
            ways_of.setdefault(group, {})[cache_id] = ways
            percent = mb_percent(bw, socket_bw)
            if percent:
                percent_of.setdefault(group, {})[cache_id] = percent
    return ways_of, percent_of
