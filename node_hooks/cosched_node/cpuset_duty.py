"""The node agent's duty on a node-sharing node (paper 001's mates and guests, issue 14): a
"node" slot and an overlapping "guest" slot; every node-slot claim gets its own CPUs and a
guest k of its mate's, in the claims' cgroup v2 ``cpuset.cpus`` (``cpusets``), at the hook's
question and every interval; DIR/cpusets.json says whether the agent can, and the lent CPUs.

:class:`CpusetDuty` is a part of :class:`~cosched_node.agent.Agent` (which inherits it): it
reads the agent's ``config``, ``records``, ``cgroups``, ``state_dir`` and ``log``.
"""
from __future__ import annotations

import time
from typing import Dict, FrozenSet, List, Optional, Tuple

from cosched_node import cpusets, procs, state
from cosched_node.errors import EXIT_OVERSUBSCRIBED, Refused
from cosched_node.jobs import Running

CPUSETS_NAME = "cpusets.json"
#: How long after a claim appears the agent looks for its cgroup between intervals.
PENDING_WINDOW_S = 60.0


class CpusetDuty:
    """The CPUs of node-slot claims and their guests (module docstring)."""

    def shared_kind(self, record: Running) -> Optional[str]:
        """"node" or "guest" for a claim of a node-sharing node's node or guest slot."""
        slot = self.config.slot(record.claim.slot_id)
        return slot.kind if slot is not None and slot.kind in ("node", "guest") else None

    def cpuset_state(self) -> Tuple[Optional[Tuple[int, ...]], Optional[str]]:
        """(the node slot's CPUs, None) when the agent can set cpusets, else (None, why not);
        a change is logged once."""
        node_slot = self.config.node_slot
        if node_slot is None:
            return None, "no node slot"
        if self.cgroups is None:
            problem: Optional[str] = "no cgroup root configured"
            cpus = None
        else:
            effective, problem = self.cgroups.probe()
            cpus = cpusets.node_cpus(effective or (), node_slot.cores) if problem is None else None
            if problem is None and cpus is None:
                problem = (f"cgroup root {self.cgroups.root}: {cpusets.EFFECTIVE_FILE} lists "
                           f"{len(effective or ())} CPUs, fewer than the node slot's {node_slot.cores}")
        self._cpuset_problem = problem
        if problem != self._cpuset_logged:
            self.log(f"cpusets unusable: {problem}; guests are refused" if problem else
                     f"cpusets usable under {self.cgroups.root if self.cgroups else '?'}: node slot CPUs "
                     f"{cpusets.format_cpu_list(cpus or ())}")
            self._cpuset_logged = problem
        return cpus, problem

    def holders(self) -> List[Running]:
        """Live node-slot and guest claims that hold CPUs."""
        return [r for r in self.records.values()
                if r.cpus and not r.refused and self.shared_kind(r) is not None]

    def _holder(self, record: Running) -> cpusets.Holder:
        return cpusets.Holder(record.key, tuple(record.cpus or ()),
                              record.mate_key if self.shared_kind(record) == "guest" else None)

    def lent_cpus(self) -> FrozenSet[int]:
        return cpusets.lent(self._holder(r) for r in self.holders())

    def start_shared(self, record: Running, table: Dict[int, procs.Proc]) -> None:
        """Give a starting node-slot or guest claim its CPUs, or Refused (code 3: back to Idle)."""
        claim = record.claim
        record.refused = None           # asked again: placed afresh
        node_cpus, problem = self.cpuset_state()
        try:
            if self.shared_kind(record) == "node":
                if node_cpus is None or claim.cpus < 1:   # an ordinary start, no CPUs of its own
                    self.log(f"job {claim.job} started in {claim.slot} without a cpuset "
                             f"({problem or 'the claim has no Cpus'})")
                    return
                record.cpus = self.node_start(record, node_cpus)
                self.log(f"job {claim.job} started in {claim.slot} on {self.config.node}: "
                         f"CPUs {cpusets.format_cpu_list(record.cpus)}")
            else:
                if node_cpus is None:
                    raise Refused(EXIT_OVERSUBSCRIBED, f"cpusets unusable on {self.config.node}: {problem}")
                self.guest_start(record, table)
        except Refused as exc:
            record.refused = str(exc)   # holds nothing: a refused start is no co-runner
            where = f"{'guest' if self.shared_kind(record) == 'guest' else 'node-slot'} start of {claim.job} " \
                    f"on {self.config.node} ({claim.slot})"
            raise Refused(exc.code, f"{where} refused: {exc}", claim.job) from None
        self.sync_cpusets(table)

    def node_start(self, record: Running, node_cpus: Tuple[int, ...]) -> Tuple[int, ...]:
        """The lowest free CPUs of the node slot for a node-slot claim of ``Cpus`` cores."""
        holders = [r for r in self.holders() if r is not record]
        held = {c for r in holders for c in r.cpus or ()}
        wanted = record.claim.cpus
        cpus = cpusets.lowest_free(node_cpus, held, wanted)
        if cpus is None:
            free = len([c for c in node_cpus if c not in held])
            lent = len(cpusets.lent(self._holder(r) for r in holders))
            raise Refused(EXIT_OVERSUBSCRIBED, f"{wanted} cores needed, {free} of the node slot's "
                                               f"{len(node_cpus)} free ({lent} lent to guests whose mates ended)")
        return cpus

    def guest_start(self, record: Running, table: Dict[int, procs.Proc]) -> None:
        """Take k of the mate's CPUs for a guest: the mate's cpuset is shrunk (and read back)
        before the guest is given them."""
        claim = record.claim
        node_slot, guest_slot = self.config.node_slot, self.config.guest_slot
        assert node_slot is not None and guest_slot is not None and self.cgroups is not None
        if claim.mate is None:
            raise Refused(EXIT_OVERSUBSCRIBED, "CoSchedPinMate names no job (missing or not Cluster.Proc)")
        mates = [r for r in self.records.values() if r.claim.job == claim.mate and not r.refused
                 and self.shared_kind(r) == "node" and r.cpus]
        if not mates:
            raise Refused(EXIT_OVERSUBSCRIBED, f"mate {claim.mate} is not a running node-slot claim of "
                                               f"{self.config.node}")
        mate = mates[0]
        if not mate.claim.malleable:
            raise Refused(EXIT_OVERSUBSCRIBED, f"mate {claim.mate} did not opt in (CoSchedMalleable)")
        hosted = [r.claim.job for r in self.holders() if r is not record and r.mate_key == mate.key]
        if hosted:
            raise Refused(EXIT_OVERSUBSCRIBED, f"mate {claim.mate} already hosts guest {hosted[0]}")
        sharing = [r for r in self.records.values() if not r.refused and self.shared_kind(r) is not None]
        memory = sum(r.claim.memory_mb for r in sharing)
        if memory > node_slot.memory_mb:
            raise Refused(EXIT_OVERSUBSCRIBED, f"memory {memory - claim.memory_mb}+{claim.memory_mb} MB > "
                                               f"{node_slot.memory_mb} MB of the node slot")
        k = cpusets.guest_share(len(mate.cpus or ()), guest_slot.sharing_factor)
        if k < 1:
            raise Refused(EXIT_OVERSUBSCRIBED, f"mate {claim.mate} has {len(mate.cpus or ())} cores: none to "
                                               f"share at SharingFactor {guest_slot.sharing_factor:g}")
        members = procs.job_processes(mate.starter_pid, mate.starter_start, table)
        cgroup, problem = self.cgroups.cgroup_of([p.pid for p in members], mate.starter_pid)
        if cgroup is None:
            raise Refused(EXIT_OVERSUBSCRIBED, f"mate {claim.mate}'s cgroup cannot be shrunk: {problem}")
        mate.cgroup = cgroup
        record.cpus, record.mate_key = cpusets.guest_take(mate.cpus or (), k), mate.key
        shrunk = cpusets.desired(self._holder(r) for r in self.holders())[mate.key]
        self.sync_cpusets(table)
        try:
            now = self.cgroups.read(cgroup)
        except (OSError, cpusets.CpusetError) as exc:
            now, error = None, getattr(exc, "strerror", None) or str(exc)
        else:
            error = f"its cpuset.cpus reads {cpusets.format_cpu_list(now)}"
        if now != shrunk:
            record.cpus, record.mate_key = None, None
            self.sync_cpusets(table)
            raise Refused(EXIT_OVERSUBSCRIBED, f"mate {claim.mate}'s cgroup {cgroup} was not shrunk to "
                                               f"{cpusets.format_cpu_list(shrunk)} ({error})")
        self.log(f"guest {claim.job} started in {claim.slot} on {self.config.node}: {k} of mate {claim.mate}'s "
                 f"CPUs, {cpusets.format_cpu_list(record.cpus)} (SharingFactor {guest_slot.sharing_factor:g})")

    def manage_cpusets(self, table: Dict[int, procs.Proc]) -> None:
        """Every interval: CPUs for node-slot claims that have none yet (started before the
        agent could place them), then the cgroups brought to the plan."""
        live = set(self.records)
        self._cgroup_problems = {k: v for k, v in self._cgroup_problems.items() if k.split("+")[0] in live}
        node_cpus, problem = self.cpuset_state()
        if node_cpus is None:
            return
        for record in self.records.values():
            if self.shared_kind(record) != "node" or record.cpus or record.refused or record.claim.cpus < 1:
                continue
            try:
                record.cpus = self.node_start(record, node_cpus)
                self.log(f"job {record.claim.job} in {record.claim.slot}: CPUs {cpusets.format_cpu_list(record.cpus)}")
                self._cgroup_problems.pop(record.key + "+place", None)
            except Refused as exc:
                self._once(record.key + "+place", f"job {record.claim.job} in {record.claim.slot} runs without a "
                                                  f"cpuset: {exc}")
        self.sync_cpusets(table)

    def _once(self, key: str, message: str) -> None:
        if self._cgroup_problems.get(key) != message:
            self._cgroup_problems[key] = message
            self.log(message)

    def sync_cpusets(self, table: Dict[int, procs.Proc]) -> None:
        """Bring the cgroups of the claims that hold CPUs to the plan, in an order that keeps
        the written sets disjoint after every single write (``cpusets.ordered_writes``)."""
        if self.cgroups is None or self._cpuset_problem is not None:
            return
        holders = self.holders()
        plan = cpusets.desired(self._holder(r) for r in holders)
        # every live claim of the node and guest slots: those holding no CPUs of the plan (a
        # claim that started while cpusets were unusable) count with what their cgroup holds
        claims = [r for r in self.records.values() if not r.refused and self.shared_kind(r) is not None]
        by_key = {r.key: r for r in claims}
        current: Dict[str, FrozenSet[int]] = {}
        wanted: Dict[str, FrozenSet[int]] = {}
        owner: Dict[str, str] = {}
        for record in sorted(claims, key=lambda r: r.key not in plan):
            members = procs.job_processes(record.starter_pid, record.starter_start, table)
            cgroup, problem = self.cgroups.cgroup_of([p.pid for p in members], record.starter_pid)
            if cgroup is not None and cgroup in owner:
                cgroup, problem = None, f"cgroup {cgroup} is also job {by_key[owner[cgroup]].claim.job}'s"
            if cgroup is None:
                cgroup = record.cgroup    # known from before: its CPUs count, it is not written
                if problem and "no job process" not in problem and "starter's own" not in problem:
                    self._once(record.key, f"job {record.claim.job} ({record.claim.slot}): cpuset not set: {problem}")
                if cgroup is None or cgroup in owner or self.cgroups.check(cgroup) is not None:
                    continue
                writable = False
            else:
                writable = True
                self._cgroup_problems.pop(record.key, None)
            try:
                current[record.key] = self.cgroups.read(cgroup)
            except (OSError, cpusets.CpusetError):
                continue
            owner[cgroup] = record.key
            record.cgroup = cgroup
            if writable and record.key in plan:
                wanted[record.key] = plan[record.key]
        writes, deferred = cpusets.ordered_writes(current, wanted)
        for key, cpus in writes:
            record = by_key[key]
            before = cpusets.format_cpu_list(current[key]) or "(parent's)"
            try:
                self.cgroups.write(record.cgroup or "", cpus)
            except (OSError, cpusets.CpusetError) as exc:
                self.log(f"cpuset write failed: job {record.claim.job} ({record.claim.slot}) {record.cgroup} "
                         f"cpuset.cpus {cpusets.format_cpu_list(cpus)}: {getattr(exc, 'strerror', None) or exc}; "
                         "later writes of this round skipped")
                break
            current[key] = cpus
            self.log(f"cpuset: job {record.claim.job} ({record.claim.slot}) {record.cgroup} cpuset.cpus "
                     f"{before} -> {cpusets.format_cpu_list(cpus)}")
        for key in deferred:
            self._once(key + "+deferred", f"job {by_key[key].claim.job} ({by_key[key].claim.slot}): cpuset "
                                          f"{cpusets.format_cpu_list(plan[key])} deferred: it would overlap another "
                                          "claim's")

    def pending_cpusets(self) -> bool:
        """A claim that started less than PENDING_WINDOW_S ago holds CPUs its cgroup has not
        been found for yet (its job is starting)."""
        now = time.time()
        return self._cpuset_problem is None and any(r.cgroup is None and now - r.first_seen < PENDING_WINDOW_S
                                                    for r in self.holders())

    def publish_cpusets(self, now: float) -> None:
        if self.config.node_slot is None:
            return
        holders = self.holders()
        plan = cpusets.desired(self._holder(r) for r in holders)
        state.write_json_atomic(self.state_dir, CPUSETS_NAME, {
            "updated": now, "usable": self._cpuset_problem is None, "problem": self._cpuset_problem,
            "lent_cpus": len(self.lent_cpus()),
            "claims": [{"job": r.claim.job, "slot": r.claim.slot, "kind": self.shared_kind(r),
                        "cpus": cpusets.format_cpu_list(r.cpus or ()), "cpuset": cpusets.format_cpu_list(plan[r.key]),
                        "mate": r.claim.mate if self.shared_kind(r) == "guest" else None, "cgroup": r.cgroup}
                       for r in holders]})
