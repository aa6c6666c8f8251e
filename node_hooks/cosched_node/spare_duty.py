"""The node agent's duty on a node with a spare slot (paper 003: spare-capacity jobs run in what
the primaries measurably leave idle). Every interval it

- samples each primary claim's CPU time and memory (anonymous + shared) from the claim's own
  cgroup, else from /proc of its job processes, and sums them to the node's samples (cores
  used over the interval, MB): the Insight Engine's input (Section III-A, ``insight``);
- estimates ``Q`` and ``xi`` of both streams (BLB, confidence 0.8);
- confines the spare claims (Section III-B): one cgroup per claim (its own, HTCondor's, when it
  has one, else ours ``cosched_spare/<slot>``; ``spare_cgroups``), a CPU cap of
  max(5% of C, C - max(Q + xi, live use)) in the idle class, memory hard
  max(5% of M, M - max(Q + xi, live use)) and soft max(5% of M, hard - xi), split among the
  spare claims by their Cpus, tightened the interval the primaries' use rises; memory is never
  lowered below what a spare job holds (its request, or its use when above; a start that the
  node cannot hold is refused): such a job is vacated through the startd instead
  (``CoSchedSpareEvict_<slot>``), largest first, until the rest fit; once the claim is gone
  the request is kept VACATED_KEPT_S as a record (``CoSchedSpareVacated_<cluster>_<proc>``),
  so the sidecar, a negotiation cycle or more later, can tell the job why it went back to idle;
- publishes DIR/spare.json for the startd cron (``CoSchedSpare*``).

Which claims are spare: their slot's id is the spare slot's in the root-owned node config,
never anything the job wrote. :class:`SpareDuty` is a part of
:class:`~cosched_node.agent.Agent`: it reads the agent's ``config``, ``records``,
``state_dir``, ``proc_root``, ``starter_uid`` and ``log``.
"""
from __future__ import annotations

import math
import os
import signal
import time
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

from cosched_node import insight, procs, state
from cosched_node.errors import EXIT_OVERSUBSCRIBED, Refused
from cosched_node.jobs import Running
from cosched_node.spare_cgroups import Limits, SpareCgroups, Usage

SPARE_NAME = "spare.json"
#: The agent's interval on a node with a spare slot ("every interval, 5 s by default").
SPARE_INTERVAL_S = 5.0
#: The share of the spare slot's cores and memory always left to spare jobs (Section IV-B).
FLOOR_SHARE = 0.05
MB = 1 << 20
#: How long a vacated spare job's record stays published after its claim ended, and how many
#: (the sidecar reads it within a negotiation cycle or two; the record never preempts).
VACATED_KEPT_S = 900.0
VACATED_KEPT = 32


@dataclass(frozen=True)
class NodeLimits:
    """What all spare claims together may use, and whether the primaries' live use was above
    their confident high (the cap was tightened this interval)."""
    cores: float
    memory_hard_mb: float
    memory_soft_mb: float
    tightened: bool


@dataclass(frozen=True)
class SpareUse:
    """A spare claim as the split sees it: its Cpus, its memory use now and its request (the
    dynamic slot's Memory), in bytes."""
    key: str
    cpus: int
    memory_bytes: int
    request_bytes: int = 0

    @property
    def held(self) -> int:
        """What the claim is entitled to keep: its request, or its use when above it."""
        return max(self.memory_bytes, self.request_bytes)


def node_limits(cores: int, memory_mb: int, cpu: Optional[insight.Estimate], memory: Optional[insight.Estimate],
                live_cores: float, live_memory_mb: float) -> NodeLimits:
    """The spare claims' CPU cap and memory limits on a spare slot of ``cores`` and
    ``memory_mb`` (Section III-B with Section IV-B's 5% floor). Without a CPU estimate the cap
    is the floor; without a memory estimate the primaries' live memory stands for Q + xi
    (xi 0), so an agent restart evicts nobody."""
    floor_cores, floor_mb = FLOOR_SHARE * cores, FLOOR_SHARE * memory_mb
    cpu_level = cpu.hard_limit if cpu is not None else float(cores)
    memory_level = memory.hard_limit if memory is not None else 0.0
    memory_xi = memory.xi if memory is not None else 0.0
    cap = max(floor_cores, cores - max(cpu_level, live_cores))
    hard = max(floor_mb, memory_mb - max(memory_level, live_memory_mb))
    soft = max(floor_mb, hard - memory_xi)
    return NodeLimits(cap, hard, min(soft, hard), live_cores > cpu_level or live_memory_mb > memory_level)


def spare_offer(total: float, estimate: Optional[insight.Estimate]) -> float:
    """What the primaries leave idle at the confidence: total - (Q + xi), within [0, total]
    (published; no floor here, the floor is the confinement cap's)."""
    return 0.0 if estimate is None else min(float(total), max(0.0, total - estimate.hard_limit))


def split(claims: Sequence[SpareUse], limits: NodeLimits) -> Tuple[Dict[str, Limits], List[str]]:
    """Each spare claim's limits and the claims to vacate. While what the claims hold (each its
    request, or its use when above it) is more than the node's hard limit, the largest goes (its
    limit is left as it is: never lowered below use). Each claim that stays gets what it holds
    plus the share of the slack its Cpus are of theirs (so a job within its request never meets
    the kernel's limit, and none is vacated while the node holds them all), its soft limit the
    same less its share of the soft band (never below what it uses); the CPU cap by Cpus share
    of every claim."""
    remaining, evicted = list(claims), []
    while remaining and sum(c.held for c in remaining) > limits.memory_hard_mb * MB:
        victim = max(remaining, key=lambda c: (c.held, c.key))
        remaining.remove(victim)
        evicted.append(victim.key)
    weight = sum(max(1, c.cpus) for c in remaining) or 1
    slack = max(0.0, limits.memory_hard_mb * MB - sum(c.held for c in remaining))
    band = max(0.0, (limits.memory_hard_mb - limits.memory_soft_mb) * MB)
    out: Dict[str, Limits] = {}
    all_weight = sum(max(1, c.cpus) for c in claims) or 1
    for c in claims:
        share = max(1, c.cpus) / weight
        hard = int(c.held + slack * share)
        out[c.key] = Limits(limits.cores * max(1, c.cpus) / all_weight,
                            max(c.memory_bytes, int(hard - band * share)), hard)
    return out, evicted


def admission(request_bytes: int, others: Sequence[SpareUse], limits: Optional[NodeLimits]) -> Optional[str]:
    """Why a spare claim asking ``request_bytes`` cannot start beside ``others`` (None: it can):
    the node has no estimate yet, or what the others hold plus the request passes the node's
    hard limit (started, it would be vacated at once, or the others would)."""
    if limits is None:
        return "the node has no estimate of its primaries yet"
    held = sum(c.held for c in others)
    if held + request_bytes > limits.memory_hard_mb * MB:
        return (f"the primaries leave spare jobs {limits.memory_hard_mb:.0f} MB now; spare jobs hold "
                f"{held / MB:.0f} MB and this one asks {request_bytes / MB:.0f} MB")
    return None


def proc_usage(pids: Sequence[int], proc_root: str = "/proc") -> Usage:
    """CPU seconds (utime + stime + cutime + cstime) and RssAnon + RssShmem of ``pids``."""
    ticks, kib = 0, 0
    for pid in pids:
        try:
            stat_text = state_text(f"{proc_root}/{int(pid)}/stat")
            status = state_text(f"{proc_root}/{int(pid)}/status")
        except OSError:
            continue
        fields = stat_text[stat_text.rfind(")") + 2:].split()
        if len(fields) >= 15 and all(f.isdigit() for f in fields[11:15]):
            ticks += sum(int(f) for f in fields[11:15])
        for line in status.splitlines():
            parts = line.split()
            if len(parts) >= 2 and parts[0] in ("RssAnon:", "RssShmem:") and parts[1].isdigit():
                kib += int(parts[1])
    return Usage(ticks / float(os.sysconf("SC_CLK_TCK")), kib * 1024)


def state_text(path: str) -> str:
    with open(path, "rb") as handle:
        return handle.read(16384).decode("utf-8", "replace")


class SpareDuty:
    """Sampling, estimating, confining and publishing on a node with a spare slot."""

    def init_spare(self, cgroups: Optional[SpareCgroups],
                   settings: insight.InsightSettings = insight.InsightSettings()) -> None:
        self.spare_cgroups = cgroups if self.config.spare_slot is not None else None
        self.spare_cpu = insight.UsageStream(settings)
        self.spare_memory = insight.UsageStream(settings)
        self.spare_estimates: Tuple[Optional[insight.Estimate], Optional[insight.Estimate]] = (None, None)
        self.spare_live: Tuple[float, float] = (0.0, 0.0)
        self.spare_limits: Optional[NodeLimits] = None
        self._spare_problem: Optional[str] = "not probed yet"
        self._spare_logged: Optional[str] = "not probed yet"
        self._spare_prev: Dict[str, Tuple[str, float, float]] = {}   # key -> (source, cpu_s, at)
        self._spare_written: Dict[str, Limits] = {}
        self._spare_used: Dict[str, int] = {}                        # claim key -> memory use last interval
        self._spare_evict: Dict[str, dict] = {}
        self._spare_vacated: List[dict] = []   # requests whose claims are gone, oldest first
        self._spare_leftover: Dict[str, Optional[int]] = {}          # our group -> its job's uid
        self._spare_once: Dict[str, str] = {}
        self._spare_tight = False
        self._spare_primaries: Optional[frozenset] = None   # the primary claims the streams describe

    def is_spare(self, record: Running) -> bool:
        slot = self.config.spare_slot
        return slot is not None and record.claim.slot_id == slot.slot_id

    def spare_probe(self) -> Optional[str]:
        """Why spare jobs cannot be confined here (None: they can); a change is logged once."""
        problem = "no cgroup root configured" if self.spare_cgroups is None else self.spare_cgroups.probe()
        self._spare_problem = problem
        if problem != self._spare_logged:
            self.log(f"spare capacity: cannot confine spare jobs: {problem}; their starts are refused" if problem
                     else f"spare capacity: cgroup v{self.spare_cgroups.version} under {self.spare_cgroups.root}")
            self._spare_logged = problem
        return problem

    def _spare_note(self, key: str, message: str) -> None:
        if self._spare_once.get(key) != message:
            self._spare_once[key] = message
            self.log(message)

    # -- the hook's question

    def start_spare(self, record: Running, table: Dict[int, procs.Proc]) -> None:
        """Confine a starting spare claim before its job runs: our group made, its limits
        written, its starter moved in (the job then inherits the group from its first
        instruction); Refused (code 3: back to Idle) where no cgroup is usable or the node cannot
        hold its request now (``admission``)."""
        claim = record.claim
        record.refused = None
        problem = self.spare_probe()
        cgroups = self.spare_cgroups
        try:
            if problem is not None or cgroups is None:
                raise Refused(EXIT_OVERSUBSCRIBED, f"no usable cgroup: {problem}")
            others = [SpareUse(r.key, r.claim.cpus, self._spare_used.get(r.key, 0), r.claim.memory_mb * MB)
                      for r in self.spare_records() if r.key != record.key]
            full = admission(claim.memory_mb * MB, others,
                             self.spare_limits if None not in self.spare_estimates else None)
            if full is not None:
                raise Refused(EXIT_OVERSUBSCRIBED, full)
            group = cgroups.ours(claim.slot)
            cgroups.create(group)
            record.cgroup = group
            record.spare_started = True
            self.confine_spare(table)
            cgroups.move(group, [record.starter_pid])
        except (Refused, OSError) as exc:
            record.refused, record.spare_started = str(exc), False
            raise Refused(EXIT_OVERSUBSCRIBED, f"spare-capacity start of {claim.job} on {self.config.node} "
                                               f"({claim.slot}) refused: {getattr(exc, 'strerror', None) or exc}",
                          claim.job) from None
        self.log(f"spare job {claim.job} started in {claim.slot} on {self.config.node}: group {group}")

    def spare_reply(self, record: Running) -> dict:
        return {"status": "ok", "kind": "spare", "slot": record.claim.slot, "cgroup": record.cgroup}

    # -- every interval

    def manage_spare(self, table: Dict[int, procs.Proc], now: float) -> None:
        """Sample, estimate, confine, publish (module docstring)."""
        if self.config.spare_slot is None:
            return
        self.spare_probe()
        self._remove_leftovers()
        live = set(self.records)
        for memo in (self._spare_prev, self._spare_used):
            for key in [k for k in memo if k not in live]:
                del memo[key]
        for key in sorted((k for k in self._spare_evict if k not in live), key=lambda k: self._spare_evict[k]["time"]):
            self._spare_vacated.append(self._spare_evict.pop(key))
        self._spare_vacated = [e for e in self._spare_vacated if now - e["time"] <= VACATED_KEPT_S][-VACATED_KEPT:]
        self.sample_primaries(table, now)
        self.spare_estimates = (self.spare_cpu.estimate(), self.spare_memory.estimate())
        slot = self.config.spare_slot
        self.spare_limits = node_limits(slot.cores, slot.memory_mb, *self.spare_estimates, *self.spare_live)
        if self.spare_limits.tightened and not self._spare_tight:   # logged when it begins
            self.log(f"spare capacity: primaries above their confident high (live {self.spare_live[0]:.2f} cores, "
                     f"{self.spare_live[1]:.0f} MB): spare cap {self.spare_limits.cores:.2f} cores, "
                     f"{self.spare_limits.memory_hard_mb:.0f} MB")
        self._spare_tight = self.spare_limits.tightened
        if self._spare_problem is None:
            self.confine_spare(table, now)
        self.publish_spare(now)

    def sample_primaries(self, table: Dict[int, procs.Proc], now: float) -> None:
        """One node-level sample: the primaries' cores used since the last interval and their
        memory now (MB). A claim first seen adds its memory, and its CPU from the next interval.

        The streams describe the primaries running now: when a primary claim starts or ends they
        start anew (the Insight Engine estimates the jobs it profiles from their start, Section
        III-A; a window that kept a finished job's busy phases, or an idle node's zeros under a
        new job, would describe jobs that are not there), and the interval of the change adds
        no sample (a new claim's CPU is known from the next one). Until ``insight.MIN_SAMPLES``
        samples hold again the node publishes no estimate and the cap is the floor."""
        cores, memory_bytes, complete = 0.0, 0, True
        primaries = []
        for record in self.records.values():
            if self.is_spare(record) or record.refused:
                continue
            source, usage = self._claim_usage(record, table)
            if usage is None:
                continue
            primaries.append(record.key)
            memory_bytes += usage.memory_bytes
            prev = self._spare_prev.get(record.key)
            if prev is not None and prev[0] == source and now > prev[2]:
                cores += max(0.0, usage.cpu_s - prev[1]) / (now - prev[2])
            else:
                complete = False
            self._spare_prev[record.key] = (source, usage.cpu_s, now)
        if not math.isfinite(cores):
            cores = 0.0
        self.spare_live = (cores, memory_bytes / MB)
        if frozenset(primaries) != self._spare_primaries:
            if self._spare_primaries is not None:
                self.spare_cpu = insight.UsageStream(self.spare_cpu.settings)
                self.spare_memory = insight.UsageStream(self.spare_memory.settings)
            self._spare_primaries = frozenset(primaries)
        if complete:
            self.spare_cpu.add(now, cores)
            self.spare_memory.add(now, memory_bytes / MB)

    def _claim_usage(self, record: Running, table: Dict[int, procs.Proc]) -> Tuple[str, Optional[Usage]]:
        members = procs.job_processes(record.starter_pid, record.starter_start, table)
        pids = [p.pid for p in members]
        if not pids:
            return "none", None
        if self.spare_cgroups is not None and self._spare_problem is None:
            group, _ = self.spare_cgroups.cgroup_of(pids, record.starter_pid)
            if group is not None:
                try:
                    return "cgroup:" + group, self.spare_cgroups.usage(group)
                except OSError:
                    pass
        return "proc", proc_usage(pids, self.proc_root)

    def spare_records(self) -> List[Running]:
        """The spare claims whose start the agent admitted (a claim whose hook has not asked yet
        runs nothing, and holds nothing until admitted)."""
        return [r for r in self.records.values() if self.is_spare(r) and r.spare_started and not r.refused]

    def confine_spare(self, table: Dict[int, procs.Proc], now: Optional[float] = None) -> None:
        """Every spare claim in a group (its own or ours, its job's processes moved in), its
        share of the limits written, and the claims that must go recorded for the startd."""
        cgroups = self.spare_cgroups
        if cgroups is None:
            return
        slot = self.config.spare_slot
        limits = self.spare_limits or node_limits(slot.cores, slot.memory_mb, *self.spare_estimates, *self.spare_live)
        uses: List[SpareUse] = []
        groups: Dict[str, str] = {}
        for record in self.spare_records():
            claim = record.claim
            members = procs.job_processes(record.starter_pid, record.starter_start, table)
            pids = [p.pid for p in members]
            try:
                own, _ = cgroups.cgroup_of(pids, record.starter_pid)
                group = own or cgroups.ours(claim.slot)
                if own is None:
                    cgroups.create(group)
                    if pids:
                        cgroups.move(group, pids)
                if members:
                    record.uid = members[0].uid
                record.cgroup = group
                used = cgroups.usage(group).memory_bytes
            except OSError as exc:
                self._spare_note(record.key, f"spare job {claim.job} ({claim.slot}) not confined: "
                                             f"{getattr(exc, 'strerror', None) or exc}")
                continue
            groups[record.key] = group
            self._spare_used[record.key] = used
            uses.append(SpareUse(record.key, claim.cpus, used, claim.memory_mb * MB))
        shares, evicted = split(uses, limits)
        now = time.time() if now is None else now
        for key in evicted:
            record = self.records[key]
            if key not in self._spare_evict:
                use = next(u for u in uses if u.key == key)
                reason = (f"spare capacity: the primaries need the memory back (spare jobs may use "
                          f"{limits.memory_hard_mb:.0f} MB; this job asked for {use.request_bytes / MB:.0f} MB "
                          f"and uses {use.memory_bytes / MB:.0f} MB)")
                self._spare_evict[key] = {"slot": record.claim.slot, "job": record.claim.job, "reason": reason,
                                          "time": now}
                self.log(f"spare job {record.claim.job} ({record.claim.slot}) to be vacated: {reason}")
        for key, group in groups.items():
            wanted = shares[key]
            if key in self._spare_evict:   # memory left as it is: never below use
                old = self._spare_written.get(group)
                wanted = Limits(wanted.cores, *(old.memory_soft_bytes, old.memory_hard_bytes) if old else (-1, -1))
            if self._spare_written.get(group) == wanted:
                continue
            try:
                skipped = self._write(group, wanted)
            except OSError as exc:
                self._spare_note(key, f"spare limits not written to {group}: {getattr(exc, 'strerror', None) or exc}")
                continue
            self._spare_written[group] = wanted
            if skipped:
                self._spare_note("skipped", f"spare capacity: {', '.join(skipped)} absent (kernel before 5.15?): "
                                            "spare jobs run without the idle class, at the least weight")

    def _write(self, group: str, limits: Limits) -> List[str]:
        assert self.spare_cgroups is not None
        return self.spare_cgroups.write_limits(group, limits, memory=limits.memory_hard_bytes >= 0)

    # -- a claim's end

    def spare_ended(self, record: Running) -> None:
        """Remove our group of an ended spare claim (its own cgroup is HTCondor's to remove)."""
        if not self.is_spare(record) or self.spare_cgroups is None or self.spare_cgroups.version is None:
            return
        try:
            group = self.spare_cgroups.ours(record.claim.slot)
        except OSError:
            return
        for known in (group, record.cgroup):   # a next claim of the slot gets its limits written afresh
            self._spare_written.pop(known or "", None)
        if any(r.claim.slot == record.claim.slot and r is not record for r in self.records.values()):
            return   # the slot runs its next job: the group is that one's now
        self._spare_leftover[group] = record.uid
        self._remove_leftovers()

    def _remove_leftovers(self) -> None:
        """rmdir our groups whose claims ended; what is left in one is killed first, but only
        processes of that claim's job (its user's, never root's or the starter's)."""
        cgroups = self.spare_cgroups
        if cgroups is None or cgroups.version is None:
            return
        for group, uid in list(self._spare_leftover.items()):
            if any(r.cgroup == group for r in self.records.values()):
                del self._spare_leftover[group]
                continue
            left = cgroups.procs(group)
            killed = []
            for pid in left:
                proc = procs.read_proc(pid, self.proc_root)
                if proc is None or proc.uid in (0, self.starter_uid) or proc.euid in (0, self.starter_uid) \
                        or uid is None or proc.uid != uid:
                    continue
                try:
                    os.kill(pid, signal.SIGKILL)
                    killed.append(pid)
                except (ProcessLookupError, PermissionError):
                    pass
            if killed:
                self.log(f"spare group {group}: killed what its ended job left (pids {killed})")
            problem = cgroups.remove(group) if not left or killed == [] else "processes being killed"
            if problem is None:
                del self._spare_leftover[group]
                self.log(f"spare group {group} removed")
            else:
                self._spare_note("rm" + group, f"spare group {group} not removed yet: {problem}")

    # -- DIR/spare.json

    def publish_spare(self, now: float) -> None:
        slot = self.config.spare_slot
        if slot is None:
            return
        cpu, memory = self.spare_estimates
        problem = self._spare_problem or (None if cpu is not None else
                                          f"no estimate yet: {len(self.spare_cpu)} of {insight.MIN_SAMPLES} samples")
        limits = self.spare_limits
        state.write_json_atomic(self.state_dir, SPARE_NAME, {
            "updated": now, "usable": problem is None, "problem": problem,
            "cgroup_version": self.spare_cgroups.version if self.spare_cgroups else None,
            "cpus": round(spare_offer(slot.cores, cpu), 3),
            "memory_mb": int(spare_offer(slot.memory_mb, memory)),
            "confidence": self.spare_cpu.settings.confidence, "samples": len(self.spare_cpu),
            "estimate": {name: None if e is None else {"q": round(e.q, 4), "xi": round(e.xi, 4)}
                         for name, e in (("cpus", cpu), ("memory_mb", memory))},
            "live": {"cpus": round(self.spare_live[0], 4), "memory_mb": round(self.spare_live[1], 1)},
            "limits": None if limits is None else {"cpus": round(limits.cores, 4),
                                                   "memory_hard_mb": round(limits.memory_hard_mb, 1),
                                                   "memory_soft_mb": round(limits.memory_soft_mb, 1)},
            "claims": [{"job": r.claim.job, "slot": r.claim.slot, "cgroup": r.cgroup} for r in self.spare_records()],
            "evict": sorted(self._spare_evict.values(), key=lambda e: e["slot"]),
            "vacated": self._spare_vacated})
