"""``ce`` and ``cs``: paper 000's baselines (Section 3.2, Fig. 8) for the SNS planner.

* ``ce`` (Compact-n-Exclusive): a job of P cores takes ceil(P/T) whole idle nodes (T: cores
  of the largest node), procs spread evenly over them and over their sockets; its procs claim all LLC ways and
  bandwidth of the sockets they use, so no job shares those sockets.
* ``cs`` (Compact-n-Share): the fewest nodes whose free cores hold the job (a single node
  when one can: the one with the fewest free cores that suffice; else the nodes with most
  free cores, the last one best-fit), ignoring cache and bandwidth (procs request 0 ways
  and 0 GB/s); on a node, procs go to the socket with most free cores (MPI's by-socket
  mapping), not one socket first. "CS prefers but not forces 1x" (Fig. 8); a program whose profile has
  ``max_scale: 1`` (GAN, RNN: "unable to run on multiple nodes", Section 6.1) stays on one
  node under CS too.

Jobs are grouped and ordered as in ``sns`` (oldest first); a job that does not fit is
skipped (first fit), all-or-nothing.
"""
from __future__ import annotations

import math
import time
from typing import Sequence

from condor_sched.model import Plan
from condor_sched.modes.planning import PlanRequest, PlanSettings, PolicyKind
from condor_sched.modes.spread.sns import (
    ClusterJob,
    Demand,
    NodePlacement,
    NodeState,
    Option,
    SnsPlanner,
    fit_on_node,
    group_clusters,
    place_ce,
)


def _plan(name: str, request: PlanRequest, settings: PlanSettings, compact_share: bool) -> Plan:
    t0 = time.perf_counter()
    clusters, bad = group_clusters(request)
    planner = SnsPlanner(request, settings)
    for job in clusters:
        if planner.cores_per_node <= 0:
            planner.delay(job, "no SOCKET slots")
            continue
        profile = planner.store.get(job.program)
        one_node = profile is not None and profile.max_scale == 1
        pls = (place_cs(job, planner.nodes, one_node) if compact_share
               else place_ce(job, planner.nodes, planner.cores_per_node))
        if pls is None:
            planner.delay(job, "no room: " + ("not enough free cores" if compact_share else
                                              f"needs {math.ceil(job.cores / planner.cores_per_node)} idle whole node(s)"))
            continue
        base_nodes = math.ceil(job.cores / planner.cores_per_node)
        k = max(1, math.ceil(len(pls) / base_nodes))
        planner.place(job, Option(k, len(pls), Demand(0, 0.0)), pls, mode="CS" if compact_share else "CE")
    stats = {"solve_time_s": round(time.perf_counter() - t0, 6), "jobs": len(clusters),
             "placed_jobs": len({(a.job.schedd, a.job.cluster) for a in planner.assignments})}
    return Plan(name, tuple(planner.assignments), tuple(bad + planner.unplaced), stats)


def place_cs(job: ClusterJob, nodes: Sequence[NodeState], one_node: bool = False) -> list[NodePlacement] | None:
    """Fewest nodes with enough free cores (Compact-n-Share), cache and bandwidth ignored.
    ``one_node``: the program cannot run on more than one node (a profile with
    ``max_scale: 1``, GAN and RNN: "unable to run on multiple nodes", Section 6.1), so CS
    may not spread it either; it waits for one node with enough free cores."""
    demand = Demand(0, 0.0, relaxed=True, balanced=True)
    single = sorted((nd for nd in nodes if nd.free_cpus >= job.cores), key=lambda nd: (nd.free_cpus, nd.machine))
    for nd in single:
        pl = fit_on_node(nd, job.procs, demand)
        if pl is not None:
            return [pl]
    if one_node:
        return None
    by_free = sorted((nd for nd in nodes if nd.free_cpus > 0), key=lambda nd: (-nd.free_cpus, nd.machine))
    out: list[NodePlacement] = []
    left = sorted(job.procs, key=lambda p: (-p.request.cpus, p.key))
    for i, nd in enumerate(by_free):
        rest = sum(p.request.cpus for p in left)
        fits_rest = [x for x in by_free[i:] if x.free_cpus >= rest]
        if fits_rest:
            best = min(fits_rest, key=lambda x: (x.free_cpus, x.machine))
            pl = fit_on_node(best, left, demand)
            if pl is not None:
                return out + [pl]
        take, room = [], nd.free_cpus
        for p in left:
            if p.request.cpus <= room:
                take.append(p)
                room -= p.request.cpus
        pl = fit_on_node(nd, take, demand) if take else None
        if pl is None:
            continue
        out.append(pl)
        left = [p for p in left if p not in take]
        if not left:
            return out
    return None


class CompactExclusivePolicy:
    """CE: whole idle nodes, the minimum node footprint (Section 3.2)."""

    name = "ce"
    kind = PolicyKind.SPREAD

    def plan(self, request: PlanRequest, settings: PlanSettings) -> Plan:
        return _plan(self.name, request, settings, compact_share=False)


class CompactSharePolicy:
    """CS: the fewest nodes with free cores, sharing nodes, blind to cache and bandwidth."""

    name = "cs"
    kind = PolicyKind.SPREAD

    def plan(self, request: PlanRequest, settings: PlanSettings) -> Plan:
        return _plan(self.name, request, settings, compact_share=True)

