"""Node agent: COSMIC's enforcement on one execute node (Section IV-D2 of paper 002), and
Spread-n-Share's cache and bandwidth groups (Section 4.4 of paper 000).

Runs as ROOT under the execute node's condor_master (SIGTERM stops it). It trusts only what
no job can write: the startd's claims (``slots``: each dynamic slot's allocated device
memory, compute, LLC ways and bandwidth, its job id and starter pid), /proc, and its own
root-only state dir (``state``). It

- answers the PREPARE_JOB hook on DIR/agent.sock (``channel``; ``hook_server`` serves every
  caller at once, none longer than a short total deadline): the caller's parent must be
  the starter of a claim; a device job is placed on compute units its live co-runners do
  not hold, or refused when their allocations plus its own exceed the device;
- every interval, stops a device job whose measured memory exceeds its allocation
  (``memory_watch``), keeps one resctrl group per spread job (``resctrl``), writes a run
  record when a spread job ends (``runs``), and publishes DIR/devices/<dev>.json and a
  heartbeat for the startd cron;
- on a node-sharing node (issue 14, paper 001's mates and guests: a "node" slot and an
  overlapping "guest" slot), gives every node-slot claim its own CPUs and a guest k of its
  mate's, in the claims' cgroup v2 ``cpuset.cpus`` (``cpusets``, ``cpuset_duty``), at the
  hook's question and every interval, and publishes DIR/cpusets.json (whether it can, and the
  lent CPUs);
- on a GPU node (issue 13) lets a GPU claim's job start only when its GPUs' memory holds the
  claims of the jobs already started there and they are all one Owner's (MPS runs one server
  per Linux user) unless the node runs every job under one execute account, keeps the MPS
  control daemon running, and stops a job whose processes use more memory on a GPU than its
  claim holds there (nvidia-smi's per-process memory; ``gpu_watch``);
- on a node with a spare slot (paper 003), samples the primaries' use, estimates it
  (``insight``), confines every spare claim in a cgroup v1 or v2 group (``spare_duty``,
  ``spare_cgroups``), refuses a spare start where it cannot, and publishes DIR/spare.json.

Exit codes: 0 stopped by SIGTERM/SIGINT or --once done; 2 bad arguments or node config;
5 state dir unsafe, or another agent holds its lock.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from typing import Any, Callable, Dict, List, Optional, Sequence

from cosched_node import (channel, cpusets, gpu_watch, jobs, memory_watch, placement, procs, resctrl, rules, runs,
                          state)
from cosched_node.config import DEFAULT_NODE_CONFIG, NodeConfig, load_node_config, plain_absolute_path, state_dir_for
from cosched_node.cpuset_duty import CpusetDuty
from cosched_node.errors import (EXIT_BAD_AD, EXIT_BAD_CONFIG, EXIT_NO_STATE, EXIT_OK, EXIT_OVERSUBSCRIBED, ConfigError,
                                 Refused, StateError)
from cosched_node.hook_server import serve
from cosched_node.interference_duty import InterferenceDuty
from cosched_node.jobs import Running
from cosched_node.perf import PerfSampler, make_perf
from cosched_node.slots import Claim, SlotView
from cosched_node.spare_cgroups import SpareCgroups
from cosched_node.spare_duty import SPARE_INTERVAL_S, SpareDuty

PROGRAM = "cosched_node_agent"
STARTER_COMM = "condor_starter"
Log = Callable[[str], None]


def device_problem(config: NodeConfig, claim: Claim) -> Optional[str]:
    """Why a device claim's allocation breaks the request rules the planner applies too
    (``rules.device_request``), or None."""
    slot = config.slot(claim.slot_id)
    kind = slot.device_kind if slot is not None else None
    try:
        if kind is not None and rules.device_request("Request" + kind.memory_attr, claim.device_memory_mb,
                                                     "Request" + kind.compute_attr, claim.compute) is None:
            return f"Request{kind.memory_attr} is 0: not a device job, but it runs on device {claim.device}"
    except rules.RuleError as exc:
        return f"attribute {exc}"
    return None


class Agent(CpusetDuty, SpareDuty, InterferenceDuty):
    """The agent's state between intervals: its job records and its mechanisms (node-sharing
    cpusets: :class:`~cosched_node.cpuset_duty.CpusetDuty`; spare capacity:
    :class:`~cosched_node.spare_duty.SpareDuty`)."""

    def __init__(self, config: NodeConfig, state_dir: str, view: SlotView, probe, log: Log,
                 manager: Optional[resctrl.ResctrlManager] = None, profile_dir: Optional[str] = None,
                 perf: Optional[PerfSampler] = None, kill_grace_s: float = 5.0, interval_s: float = 10.0,
                 proc_root: str = "/proc", starter_uid: int = 0,
                 cgroups: Optional[cpusets.CgroupCpusets] = None, nvidia_smi: Optional[gpu_watch.NvidiaSmi] = None,
                 mps: Optional[gpu_watch.MpsControl] = None, hold_grace_s: float = 120.0,
                 spare_cgroups: Optional[SpareCgroups] = None) -> None:
        self.config, self.state_dir, self.view, self.probe, self.log = config, state_dir, view, probe, log
        self.cgroups = cgroups if config.node_slot is not None else None
        self._cpuset_problem: Optional[str] = "not probed yet"
        self._cpuset_logged: Optional[str] = "not probed yet"   # the first probe is always logged
        self._cgroup_problems: Dict[str, str] = {}
        self.manager, self.profile_dir, self.perf = manager, profile_dir, perf
        self.kill_grace_s, self.interval_s, self.proc_root = kill_grace_s, interval_s, proc_root
        self.hold_grace_s = hold_grace_s   # how long a stopped job waits for the startd's hold
        self.starter_uid = starter_uid   # a starter runs with real uid root; tests run their own
        self.nvidia_smi, self.mps = nvidia_smi, mps   # GPU nodes (issue 13)
        self.records, problems = jobs.load(state_dir)
        for problem in problems:
            log(problem)
        self._view_error: Optional[str] = None
        self.init_spare(spare_cgroups)
        self.init_interference()

    # -- the startd's claims, matched to live starters

    def claims(self) -> Optional[List[Claim]]:
        """The startd's running claims; None (logged once per cause) when it does not answer."""
        try:
            claims, problems = self.view.read()
        except StateError as exc:
            if self._view_error != str(exc):
                self.log(f"slot view unavailable: {exc.strerror or exc}; enforcing the last known claims")
            self._view_error = str(exc)
            return None
        self._view_error = None
        for problem in problems:
            self.log(f"slot ad ignored: {problem}")
        return claims

    def _starter(self, pid: int, table: Dict[int, procs.Proc]) -> Optional[procs.Proc]:
        """The process ``pid`` when it is a condor_starter run by root (no job can make one)."""
        starter = table.get(pid)
        ok = starter is not None and starter.comm == STARTER_COMM and starter.uid == self.starter_uid
        return starter if ok else None

    def reconcile(self, claims: Optional[List[Claim]], table: Dict[int, procs.Proc], now: float) -> None:
        """Add a record for every new claim with a live starter; end those whose starter died."""
        for claim in claims or []:
            starter = self._starter(claim.starter_pid, table)
            if starter is not None and f"{starter.pid}:{starter.start}" not in self.records:
                record = Running(starter.pid, starter.start, claim, now, last_seen=now)
                self.records[record.key] = record
        for key, record in list(self.records.items()):
            starter = table.get(record.starter_pid)
            if starter is None or starter.start != record.starter_start:
                del self.records[key]
                self.ended(record, now)

    def ended(self, record: Running, now: float) -> None:
        claim = record.claim
        self.spare_ended(record)
        where = f"{claim.device or claim.slot}"
        self.log(f"job {claim.job} on {where} ended" + (f": units {placement.format_ranges(record.units)} released"
                                                         if record.units else ""))
        self.interference_ended(record)
        if not record.is_spread or not self.profile_dir:
            return
        slot = self.config.slot(claim.slot_id)
        record_json = runs.run_record(self.config.node, record, slot.cache_id or 0 if slot else 0, now,
                                      procs.wall_start(record.starter_start, self.proc_root),
                                      3 * self.interval_s + 5)
        try:
            path = runs.write_run_record(self.profile_dir, record_json)
            self.log(f"job {claim.job}: run record {path} (scale {record_json['scale_factor']}, "
                     f"{record_json['runtime_s']} s, exclusive {record_json['exclusive']})")
        except (OSError, ValueError) as exc:
            self.log(f"job {claim.job}: run record not written: {getattr(exc, 'strerror', None) or exc}")

    # -- the hook's question: where does the job starting under my starter run?

    def answer(self, peer_pid: int, peer_uid: int) -> Dict[str, Any]:
        try:
            return self.start(peer_pid, peer_uid)
        except Refused as exc:
            self.log(f"{'job ' + exc.job + ': ' if exc.job else ''}start refused (caller pid {peer_pid}, "
                     f"uid {peer_uid}): {exc}")
            return {"status": "refused", "code": exc.code, "message": str(exc)}

    def start(self, peer_pid: int, peer_uid: int) -> Dict[str, Any]:
        caller = procs.read_proc(peer_pid, self.proc_root)   # two reads, no /proc scan, for a caller that is no hook
        parent = procs.read_proc(caller.ppid, self.proc_root) if caller else None
        starter = self._starter(parent.pid, {parent.pid: parent}) if parent else None
        if starter is None:
            raise Refused(EXIT_NO_STATE, "the caller is not a job's PREPARE_JOB hook (its parent is no starter)")
        table = procs.process_table(self.proc_root)
        key = f"{starter.pid}:{starter.start}"
        for attempt in range(3):   # the startd may report a claim's starter a moment late
            self.reconcile(self.claims(), table, time.time())
            if key in self.records:
                break
            if attempt < 2:
                time.sleep(0.3)
                table = procs.process_table(self.proc_root)
        record = self.records.get(key)
        if record is None:
            raise Refused(EXIT_NO_STATE, f"the startd reports no claim for starter {starter.pid}")
        record.uid = peer_uid if peer_uid != 0 else record.uid
        if record.is_device and record.units is None:
            problem = device_problem(self.config, record.claim)
            if problem:
                raise Refused(EXIT_BAD_AD, problem, record.claim.job)
            try:
                record.units = self.place(record)
            except Refused as exc:
                record.refused = str(exc)   # holds nothing: a refused start is no co-runner
                raise Refused(exc.code, f"device {self.config.node}/{record.claim.device} ({record.claim.slot}) "
                                        f"is full: {exc}", record.claim.job) from None
            self.save()
            self.log(f"job {record.claim.job} started on {self.config.node}/{record.claim.device} slot "
                     f"{record.claim.slot}: {record.claim.compute} compute units, {record.claim.device_memory_mb} MB, "
                     f"units {placement.format_ranges(record.units)}")
        elif record.is_gpu:
            if record.refused is None and not record.gpu_started:
                # co-runners: the GPU jobs this agent let start (first come, first started)
                others = [r.claim for r in self.records.values() if r is not record and r.gpu_started]
                problem = gpu_watch.start_problem(self.config, record.claim, others)
                if problem:
                    record.refused = problem
                    raise Refused(EXIT_OVERSUBSCRIBED, f"GPU node {self.config.node} ({record.claim.slot}): {problem}",
                                  record.claim.job)
                record.gpu_started = True
            elif record.refused is not None:
                raise Refused(EXIT_OVERSUBSCRIBED, f"GPU node {self.config.node} ({record.claim.slot}): "
                                                   f"{record.refused}", record.claim.job)
            self.save()
            self.log(f"job {record.claim.job} ({record.claim.remote_user[:60]}) started on GPU node "
                     f"{self.config.node} slot {record.claim.slot}: GPUs " + ", ".join(
                         f"{g.index} ({g.memory_mb} MB, compute {g.compute})" for g in record.claim.gpus))
        elif self.shared_kind(record) is not None:
            if record.cpus is None:
                self.start_shared(record, table)
            self.save()
        elif self.is_spare(record):
            self.start_spare(record, table)   # Refused where no cgroup can confine it
            self.save()
        elif not record.is_device:
            self.save()
        return self.reply(record)

    def place(self, record: Running) -> placement.Units:
        """Compute units for a device job, or Refused exactly when the allocations of the
        device's live co-runners plus this job's exceed the device's memory or compute."""
        claim = record.claim
        device = self.config.device(claim.device or "")
        if device is None:
            raise Refused(EXIT_NO_STATE, f"device {claim.device} is not in the node config")
        others = [r for r in self.records.values()
                  if r is not record and r.claim.device == claim.device and not r.refused]
        used_mb = sum(r.claim.device_memory_mb for r in others)
        used = sum(r.claim.compute for r in others)
        if used_mb + claim.device_memory_mb > device.device_memory_mb:
            raise Refused(EXIT_OVERSUBSCRIBED, f"device memory {used_mb}+{claim.device_memory_mb} MB > "
                                               f"{device.device_memory_mb} MB on {claim.device}")
        if used + claim.compute > device.hardware_threads or claim.compute < 1:
            raise Refused(EXIT_OVERSUBSCRIBED, f"device {device.device_kind.compute_attr} {used}+{claim.compute} > "
                                               f"{device.hardware_threads} on {claim.device}")
        units = placement.place_units(device.hardware_threads, device.device_kind.compute_per_core,
                                      [u for r in others for u in (r.units or ())], claim.compute)
        if units is None:  # co-runners placed before an agent restart lost nothing: cannot happen
            raise Refused(EXIT_OVERSUBSCRIBED, f"no {claim.compute} free compute units on {claim.device}")
        return units

    def reply(self, record: Running) -> Dict[str, Any]:
        claim = record.claim
        kind = self.shared_kind(record)
        if kind is not None:
            cpus = cpusets.format_cpu_list(record.cpus) if record.cpus else None
            return {"status": "ok", "kind": kind, "slot": claim.slot, "cpus": cpus,
                    "threads": len(record.cpus) if record.cpus else None}
        if self.is_spare(record):
            return self.spare_reply(record)
        if record.is_gpu:
            return {"status": "ok", "kind": "gpu", "slot": claim.slot,
                    "gpus": [[g.index, g.memory_mb, g.compute] for g in claim.gpus]}
        if record.is_device:
            return {"status": "ok", "kind": "device", "device": claim.device, "slot": claim.slot,
                    "memory_mb": claim.device_memory_mb, "compute": claim.compute,
                    "units": [list(r) for r in record.units or ()]}
        slot = self.config.slot(claim.slot_id)
        return {"status": "ok", "kind": "socket" if slot and slot.kind == "socket" else "other",
                "slot": claim.slot, "llc_ways": claim.llc_ways, "mem_bw_gbs": claim.mem_bw_gbs}

    # -- every interval

    def tick(self) -> Dict[str, dict]:
        now = time.time()
        table = procs.process_table(self.proc_root)
        claims = self.claims()
        self.reconcile(claims, table, now)
        try:
            self.manage_cpusets(table)
        except Exception as exc:   # the memory watch below runs whatever happens here
            self.log(f"cpusets not managed this interval: {exc.__class__.__name__}: {exc}")
        used = self.watch_memory()
        self.finish_stops(now, claims)
        try:
            self.watch_gpus(table)
        except Exception as exc:   # one bad interval never stops the agent
            self.log(f"GPUs not watched this interval: {exc.__class__.__name__}: {exc}")
        try:
            self.watch_spread(table, now)
        except (OSError, StateError) as exc:
            self.log(f"spread jobs not managed this interval: {exc.strerror or exc}")
        try:
            self.watch_interference(table, now)
        except Exception as exc:   # one bad interval never stops the agent
            self.log(f"interference profiles not sampled this interval: {exc.__class__.__name__}: {exc}")
        try:
            self.manage_spare(table, now)
        except Exception as exc:   # one bad interval never stops the agent
            self.log(f"spare capacity not managed this interval: {exc.__class__.__name__}: {exc}")
        published = self.publish(now, used)
        self.publish_cpusets(now)
        self.save()
        state.write_json_atomic(self.state_dir, state.HEARTBEAT_NAME, {"time": now, "pid": os.getpid()})
        return published

    def watch_memory(self) -> Dict[str, Optional[int]]:
        """Read each device job's memory once; stop those over their allocation. The readings,
        by record key."""
        readings: Dict[str, Optional[int]] = {}
        for record in [r for r in self.records.values() if r.is_device]:
            claim = record.claim
            used = readings[record.key] = self.probe.job_usage_mb(claim.device, claim.cluster, claim.proc)
            if not record.killed and memory_watch.over_limit(used, claim.device_memory_mb):
                self.stop_over_limit(record, claim.device or "", f"device memory use {used} MB on {claim.device} "
                                                               f"exceeds its allocation of {claim.device_memory_mb} MB")
        return readings

    def stop_over_limit(self, record: Running, device: str, reason: str) -> None:
        """Stop a job over its memory allocation at once (SIGSTOP: it runs and allocates no
        more) and record why in DIR/killed/<job>.json, which the startd cron publishes as
        ``CoSchedOverLimit_<slot>``: the startd's policy (config.d/20) then holds the job with
        that reason. ``finish_stops`` kills it should no hold come."""
        claim = record.claim
        pids = procs.signal_job(record.starter_pid, record.starter_start, signal.SIGSTOP, self.proc_root)
        if not pids:   # no process of the job yet (or any more): tried again next interval
            self.log(f"job {claim.job}: over its allocation, but no process of it to stop")
            return
        record.killed, record.stopped_at = reason, time.time()
        state.write_json_atomic(os.path.join(self.state_dir, "killed"), f"{claim.job}.json",
                                {"job": claim.job, "device": device, "slot": claim.slot, "reason": reason,
                                 "pids": sorted(pids), "time": record.stopped_at})
        self.log(f"job {claim.job} stopped: {reason} (signalled pids {sorted(pids)}); the startd holds it, "
                 f"else it is killed in {self.hold_grace_s:g} s")

    def finish_stops(self, now: float, claims: Optional[List[Claim]]) -> None:
        """End a stopped job once the startd let go of its claim (it is holding the job: its
        starter's SIGTERM waits while the job is stopped), or once ``hold_grace_s`` passed
        without a hold (a node without config.d/20's over-limit policy): SIGTERM, SIGCONT so
        the job acts on it, then SIGKILL what remains."""
        claimed = None if claims is None else {c.job for c in claims}
        for record in self.records.values():
            if not record.stopped_at or record.kill_sent:
                continue
            released = claimed is not None and record.claim.job not in claimed
            if not released and now - record.stopped_at < self.hold_grace_s:
                continue
            pids = procs.signal_job(record.starter_pid, record.starter_start, signal.SIGTERM, self.proc_root)
            procs.signal_job(record.starter_pid, record.starter_start, signal.SIGCONT, self.proc_root)
            pids += procs.stop_job(record.starter_pid, record.starter_start, self.kill_grace_s, self.proc_root)
            record.kill_sent = True
            why = "its claim released (the startd holds it)" if released else (
                f"not held within {self.hold_grace_s:g} s of its stop (is config.d/20-cosched-startd.conf installed?)")
            self.log(f"job {record.claim.job}: {why}: ended (signalled pids {sorted(set(pids))})")

    def watch_gpus(self, table: Dict[int, procs.Proc]) -> None:
        """GPU nodes: keep the MPS control daemon running, and stop a job whose processes use
        more memory on a GPU than its claim holds there (nvidia-smi's per-process memory; a
        GPU the claim does not hold allows none). The stop is recorded as the device memory
        stop's is (DIR/killed/<job>.json)."""
        if not self.config.gpus:
            return
        if self.mps is not None:
            self.mps.ensure(table)
        watched = [r for r in self.records.values() if not r.killed and not r.refused]
        if self.nvidia_smi is None or not watched:
            return
        apps = self.nvidia_smi.apps()
        if apps is None:
            return
        uuids = [g.uuid for g in self.config.gpus]
        for record in watched:
            claim = record.claim
            members = procs.job_processes(record.starter_pid, record.starter_start, table)
            used = gpu_watch.gpus.memory_by_gpu(apps, [p.pid for p in members])
            reason = gpu_watch.stop_reason(used, gpu_watch.allowed_by_uuid(self.config, claim), uuids)
            if reason is None:
                continue
            self.stop_over_limit(record, "gpu", reason)

    def watch_spread(self, table: Dict[int, procs.Proc], now: float) -> None:
        """Co-runners and perf samples of each spread job; its resctrl group."""
        clusters_on: Dict[int, set] = {}
        for record in self.records.values():
            clusters_on.setdefault(record.claim.slot_id, set()).add(record.claim.cluster)
        shares: List[resctrl.ProcShare] = []
        tasks: Dict[str, List[int]] = {}
        node_jobs = {r.claim.job for r in self.records.values()}
        for record in [r for r in self.records.values() if r.is_spread]:
            claim = record.claim
            members = procs.job_processes(record.starter_pid, record.starter_start, table)
            others = sorted(c for c in clusters_on.get(claim.slot_id, ()) if c != claim.cluster)
            if others:
                record.shared = True
                record.co_runners = sorted(set(record.co_runners) | {str(c) for c in others})[:64]
            record.last_seen = now
            if not members:
                continue
            record.verified = True
            record.uid = members[0].uid
            pids = [p.pid for p in members]
            if self.perf is not None and not record.shared:
                sample = self.perf.sample(pids, node_wide=node_jobs == {claim.job})
                if sample:
                    record.samples += 1
                    for name in jobs.WATCH_KEYS:
                        record.perf[name] = record.perf.get(name, 0.0) + sample.get(name, 0.0)
            slot = self.config.slot(claim.slot_id)
            if slot is None or slot.kind != "socket" or slot.cache_id is None:
                continue
            group = f"{claim.cluster}-uid{record.uid}"
            shares.append(resctrl.ProcShare(group, slot.cache_id, claim.llc_ways, claim.mem_bw_gbs,
                                            slot.llc_ways, slot.mem_bw_gbs))
            tasks.setdefault(group, []).extend(procs.task_ids(pids, self.proc_root))
        desired, percents = resctrl.group_shares(shares)
        if self.manager is not None:
            try:
                self.manager.sync(desired, {g: t for g, t in tasks.items() if g in desired}, percents)
            except (OSError, resctrl.ResctrlError) as exc:
                self.log(f"resctrl sync failed: {getattr(exc, 'strerror', None) or exc}")

    def publish(self, now: float, used: Dict[str, Optional[int]]) -> Dict[str, dict]:
        published: Dict[str, dict] = {}
        for device in self.config.devices:
            name = device.device or ""
            mine = [r for r in self.records.values() if r.claim.device == name]
            entries = [{"job": r.claim.job, "slot": r.claim.slot, "memory_mb": r.claim.device_memory_mb,
                        "threads": r.claim.compute, "units": [list(u) for u in r.units or ()],
                        "used_mb": used.get(r.key),
                        "killed": r.killed} for r in mine]
            per_job = [e["used_mb"] for e in entries if e["used_mb"] is not None]
            device_used = self.probe.device_usage_mb(name)
            if device_used is not None and device_used > device.device_memory_mb:
                self.log(f"device {name}: measured {device_used} MB exceeds its {device.device_memory_mb} MB")
            published[name] = {
                "device": name, "updated": now, "probe": self.probe.name, "jobs": entries,
                "allocated_mb": sum(e["memory_mb"] for e in entries),
                "allocated_threads": sum(e["threads"] for e in entries),
                "busy_cores": placement.units_count(placement.core_ranges(
                    [u for r in mine for u in r.units or ()], device.device_kind.compute_per_core)),
                "used_mb": device_used if device_used is not None else (sum(per_job) if per_job else None),
                "device_memory_mb": device.device_memory_mb, "hardware_threads": device.hardware_threads}
            state.write_json_atomic(os.path.join(self.state_dir, "devices"), f"{name}.json", published[name])
        return published

    def save(self) -> None:
        jobs.save(self.state_dir, self.records)


def parse_args(argv: Optional[Sequence[str]]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog=PROGRAM, description=__doc__.split("\n")[0])
    parser.add_argument("--node-config", default=DEFAULT_NODE_CONFIG,
                        help=f"the node config (root-owned; default {DEFAULT_NODE_CONFIG})")
    parser.add_argument("--state-dir", help="state dir (default: the config's, else /var/lib/condor_sched/<node>)")
    parser.add_argument("--startd-address-file", required=True,
                        help="the startd's address file (STARTD_ADDRESS_FILE): how the agent asks for its claims")
    parser.add_argument("--condor-status", default="condor_status", help="condor_status binary")
    parser.add_argument("--probe", choices=("auto", "file", "sysfs", "micsmc"), default="auto",
                        help="device memory probe (auto: micsmc when the node has devices and it is on PATH)")
    parser.add_argument("--probe-dir")
    parser.add_argument("--interval", type=float, default=None,
                        help=f"seconds between intervals (default {SPARE_INTERVAL_S:g} on a node with a spare slot, "
                             "else 10)")
    parser.add_argument("--kill-grace", type=float, default=5.0)
    parser.add_argument("--hold-grace", type=float, default=120.0,
                        help="seconds a job stopped over its memory waits for the startd to hold it before it is killed")
    parser.add_argument("--resctrl-root", default="/sys/fs/resctrl",
                        help="resctrl mount point (a directory laid out as resctrl in tests)")
    parser.add_argument("--cgroup-root", default="/sys/fs/cgroup",
                        help="cgroup root: v2 mount point (cpusets of node-slot claims and guests), or v1 hierarchies' "
                             "parent (spare-capacity groups)")
    parser.add_argument("--profile-dir", default=None,
                        help="profile store: run records go to DIR/runs/<program>/<job>.json")
    parser.add_argument("--perf", default="auto",
                        help="perf binary for IPC/bandwidth samples ('auto': look it up, '': none)")
    parser.add_argument("--perf-sample", type=float, default=1.0, help="seconds per perf sample")
    parser.add_argument("--nvidia-smi", default="auto",
                        help="GPU nodes: nvidia-smi for per-process GPU memory ('auto': from PATH, '': none)")
    parser.add_argument("--mps-control", default="auto",
                        help="GPU nodes: nvidia-cuda-mps-control ('auto': from PATH, '': no MPS daemon)")
    parser.add_argument("--once", action="store_true")
    return parser.parse_args(argv)


def build(args: argparse.Namespace, config: NodeConfig, state_dir: str, log: Log) -> Agent:
    """The agent its arguments describe, on ``config`` and ``state_dir``; ConfigError for a bad one."""
    if args.interval is None:
        args.interval = SPARE_INTERVAL_S if config.spare_slot is not None else 10.0
    if not 0.1 <= args.interval <= 3600 or not 0 <= args.kill_grace <= 300 or not 0.01 <= args.perf_sample <= 60 \
            or not 0 <= args.hold_grace <= 3600:
        raise ConfigError("--interval must be in [0.1, 3600] s, --kill-grace in [0, 300] s, --hold-grace in "
                          "[0, 3600] s and --perf-sample in [0.01, 60] s")
    for option, value in (("--resctrl-root", args.resctrl_root), ("--profile-dir", args.profile_dir),
                          ("--cgroup-root", args.cgroup_root),
                          ("--startd-address-file", args.startd_address_file)):
        if value is not None and not plain_absolute_path(value):
            raise ConfigError(f"{option} must be a plain absolute path")
    probe = memory_watch.make_probe(args.probe, args.probe_dir, bool(config.devices))
    manager = None
    if config.sockets:
        try:
            manager = resctrl.ResctrlManager(args.resctrl_root, log=log)
        except (OSError, resctrl.ResctrlError) as exc:
            log(f"resctrl at {args.resctrl_root} unusable ({getattr(exc, 'strerror', None) or exc}): "
                "spread jobs run ungrouped")
        manager = manager if manager is not None and manager.available else None
    if args.profile_dir:
        try:
            os.makedirs(args.profile_dir, mode=0o755, exist_ok=True)
        except OSError as exc:
            log(f"profile dir {args.profile_dir}: {exc.strerror}: run records will fail")
    view = SlotView(config, args.startd_address_file, args.condor_status)
    cgroups = cpusets.CgroupCpusets(args.cgroup_root) if config.node_slot is not None else None
    nvidia_smi = mps = None
    if config.gpus:
        for option, value in (("--nvidia-smi", args.nvidia_smi), ("--mps-control", args.mps_control)):
            if value not in ("", "auto") and not plain_absolute_path(value):
                raise ConfigError(f"{option} must be 'auto', '' or a plain absolute path")
        smi = gpu_watch.find_command(args.nvidia_smi, "nvidia-smi")
        nvidia_smi = gpu_watch.NvidiaSmi(smi, log) if smi else None
        control = gpu_watch.find_command(args.mps_control, gpu_watch.MPS_CONTROL)
        mps = gpu_watch.MpsControl(control, config.mps_pipe_directory, config.mps_log_directory, log) \
            if control else None
        log(f"GPU node: {len(config.gpus)} GPUs, nvidia-smi {smi or 'absent: GPU memory not watched'}, "
            f"MPS control {control or 'absent'}")
    return Agent(config, state_dir, view, probe, log, manager, args.profile_dir,
                 make_perf(args.perf, args.perf_sample, log), args.kill_grace, args.interval, cgroups=cgroups,
                 nvidia_smi=nvidia_smi, mps=mps, hold_grace_s=args.hold_grace,
                 spare_cgroups=SpareCgroups(args.cgroup_root) if config.spare_slot is not None else None)


def main(argv: Optional[Sequence[str]] = None) -> int:
    try:
        args = parse_args(argv)
    except SystemExit as exc:
        return EXIT_BAD_CONFIG if exc.code else EXIT_OK
    log_path: List[Optional[str]] = [None]

    def log(message: str) -> None:
        state.log_line(log_path[0], PROGRAM, message)

    try:
        config = load_node_config(args.node_config)
        state_dir = state_dir_for(config, args.state_dir)
        state.prepare_state_dir(state_dir)
        lock = state.AgentLock(state_dir)
        lock.acquire()
    except ConfigError as exc:
        log(f"bad configuration: {exc}")
        return EXIT_BAD_CONFIG
    except OSError as exc:
        log(f"state dir unusable: {exc.strerror or exc}")
        return EXIT_NO_STATE
    log_path[0] = os.path.join(state_dir, state.LOG_NAME)
    try:
        agent = build(args, config, state_dir, log)
        server = channel.listen(state_dir)
    except ConfigError as exc:
        lock.release()
        log(f"bad configuration: {exc}")
        return EXIT_BAD_CONFIG
    except OSError as exc:
        lock.release()
        log(f"cannot listen on {state_dir}/{state.SOCKET_NAME}: {exc.strerror or exc}")
        return EXIT_NO_STATE
    stopping: List[int] = []
    if not args.once:
        signal.signal(signal.SIGTERM, lambda signum, frame: stopping.append(signum))
        signal.signal(signal.SIGINT, lambda signum, frame: stopping.append(signum))
        # condor_reconfig makes the master send SIGHUP; the settings are the arguments.
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
    log(f"started for node {config.node}, state {state_dir}, probe {agent.probe.name}, resctrl "
        f"{args.resctrl_root if agent.manager else 'absent'}, profiles {args.profile_dir or 'off'}, cpusets "
        f"{args.cgroup_root if agent.cgroups else 'off (no node slot)'}")
    serve(agent, server, stopping, args.once)
    server.close()
    lock.release()
    log("stopped")
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
