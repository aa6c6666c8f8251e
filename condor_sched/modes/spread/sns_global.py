"""``sns-global``: SNS's scale and node choice for several queued jobs at once, with CP-SAT.

The greedy ``sns`` loop (Fig. 11 of paper 000) decides one job at a time. Here the first
``PlanSettings.sns_global_max_jobs`` (default 16) profiled, not-yet-aged jobs whose
procs ask one cpu each are planned jointly: for each job one scale option (k, n, w, b) or
none; n nodes; per socket a number of procs. Constraints: the job's cores split as evenly
as Section 4.3 asks (floor or ceil of P/n per node), per socket free cpus, ways (as
``Demand.ways_for``: at least min(w, 2) per socket the job uses and w * q / (P / (n * S))
for q of its procs there, the profiled layout's LLC per process) and bandwidth (procs * b).
Objective, maximised (integers):

    sum over placed jobs of  PLACE * (1 + age)  +  PERF * round(1000 * t(1) / t(k))
                             -  sum over its nodes of round(100 * (Co + Bo + BETA * Wo))

with Co, Bo, Wo the nodes' occupancy before this cycle (Section 4.4). The greedy plan is
the hint and the fallback: the CP-SAT plan is used only when its objective is strictly
higher than the greedy plan's (so never worse). Unknown programs (CE), procs of more than
one cpu and jobs beyond the model are placed by the greedy rules around the model; when
any job has reached the age limit the plan is the greedy one (the age rule is sequential).
CP-SAT runs under ``settings.solver_time_limit_s`` (``num_workers=1`` and
``max_deterministic_time`` when ``settings.deterministic``).
"""
from __future__ import annotations

import math
import time
from typing import Any, Sequence

from condor_sched.model import Assignment, Plan
from condor_sched.modes.planning import PlanRequest, PlanSettings, PolicyKind, cp_sat_solver
from condor_sched.modes.spread.sns import (
    BW_STEP_GBS,
    ClusterJob,
    NodePlacement,
    Option,
    SnsPlanner,
    bw_units,
    group_clusters,
)

PLACE = 10**9
PERF = 10**5
MAX_MODEL_VARS = 40_000


def _objective(planner: SnsPlanner, assignments: Sequence[Assignment], clusters: dict[tuple[str, int], ClusterJob],
               metric: dict[str, int]) -> int:
    total = 0
    seen: dict[tuple[str, int], set[str]] = {}
    scale: dict[tuple[str, int], int] = {}
    for a in assignments:
        key = (a.job.schedd, a.job.cluster)
        seen.setdefault(key, set()).add(a.details["machine"])
        scale[key] = a.details["scale_factor"]
    for key, machines in seen.items():
        job = clusters[key]
        profile = planner.store.get(job.program)
        k = scale[key]
        perf = round(1000 * profile.speedup(k)) if profile is not None and k in profile.runtime_s else 1000
        total += PLACE * (1 + job.age) + PERF * perf - sum(metric[m] for m in machines)
    return total


def _solve(planner: SnsPlanner, jobs: list[ClusterJob], settings: PlanSettings, metric: dict[str, int],
           hint: dict[tuple[int, int, int], int]) -> tuple[list[tuple[ClusterJob, Option, list[NodePlacement]]] | None, dict]:
    """CP-SAT over ``jobs`` on the planner's current free resources."""
    from ortools.sat.python import cp_model   # here: it loads pandas (0.3 s at every command's start)

    model = cp_model.CpModel()
    nodes = planner.nodes
    options = {j: planner.options(job) or [] for j, job in enumerate(jobs)}
    size = sum(len(o) for o in options.values()) * sum(len(nd.sockets) + 1 for nd in nodes)
    if size > MAX_MODEL_VARS:
        return None, {"status": "TOO_LARGE", "vars": size}
    y: dict[tuple[int, int], Any] = {}
    x: dict[tuple[int, int, int], Any] = {}
    q: dict[tuple[int, int, int, int], Any] = {}
    u: dict[tuple[int, int, int, int], Any] = {}
    ways_var: dict[tuple[int, int, int, int], Any] = {}
    cap_cpu: dict[tuple[int, int], list] = {}
    cap_ways: dict[tuple[int, int], list] = {}
    cap_bw: dict[tuple[int, int], list] = {}
    cap_memory: dict[tuple[int, int], list] = {}
    objective = []
    for j, job in enumerate(jobs):
        profile = planner.store.get(job.program)
        ys = []
        for o, opt in enumerate(options[j]):
            P, n = job.cores, opt.n
            lo, hi = P // n, math.ceil(P / n)
            bw_step = round(bw_units(opt.demand.bw_per_core) / BW_STEP_GBS)
            memory_mb = max(p.request.memory_mb for p in job.procs)  # procs are interchangeable in the model
            yv = model.new_bool_var(f"y{j}_{o}")
            y[j, o] = yv
            ys.append(yv)
            objective.append((PLACE * (1 + job.age) + PERF * round(1000 * profile.speedup(opt.k))) * yv)
            xs, qs_all = [], []
            for i, nd in enumerate(nodes):
                xv = model.new_bool_var("")
                x[j, o, i] = xv
                xs.append(xv)
                objective.append(-metric[nd.machine] * xv)
                qs = []
                for s, sock in enumerate(nd.sockets):
                    qv = model.new_int_var(0, min(hi, max(0, sock.cpus)), "")
                    uv = model.new_bool_var("")
                    q[j, o, i, s], u[j, o, i, s] = qv, uv
                    model.add(qv <= hi * uv)
                    model.add(qv >= uv)
                    model.add_implication(uv, xv)
                    cap_cpu.setdefault((i, s), []).append(qv)
                    # Demand.ways_for: at least min(w, 2) ways, and the profiled layout's LLC
                    # per process, ways >= w * q / (P / (n * S)), i.e. P * ways >= w * n * S * q
                    wv = model.new_int_var(0, max(0, sock.ways), "")
                    ways_var[j, o, i, s] = wv
                    model.add(wv >= min(opt.demand.ways, 2) * uv)
                    model.add(P * wv >= opt.demand.ways * n * len(nd.sockets) * qv)
                    cap_ways.setdefault((i, s), []).append(wv)
                    if bw_step:
                        cap_bw.setdefault((i, s), []).append(bw_step * qv)
                    if memory_mb:
                        cap_memory.setdefault((i, s), []).append(memory_mb * qv)
                    qs.append(qv)
                model.add(sum(qs) >= lo * xv)
                model.add(sum(qs) <= hi * xv)
                qs_all.extend(qs)
            model.add(sum(xs) == n * yv)
            model.add(sum(qs_all) == P * yv)
        if ys:
            model.add_at_most_one(ys)
    for (i, s), terms in cap_cpu.items():
        sock = nodes[i].sockets[s]
        model.add(sum(terms) <= max(0, sock.cpus))
        model.add(sum(cap_ways[i, s]) <= max(0, sock.ways))
        if (i, s) in cap_bw:
            model.add(sum(cap_bw[i, s]) <= math.floor(sock.bw_gbs / BW_STEP_GBS + 1e-6))
        if (i, s) in cap_memory:
            model.add(sum(cap_memory[i, s]) <= max(0, sock.memory_mb))
    model.maximize(sum(objective))
    for (j, o), var in y.items():
        model.add_hint(var, 1 if hint.get((j, o, -1)) else 0)
    for (j, o, i), var in x.items():
        model.add_hint(var, 1 if hint.get((j, o, i)) else 0)
    solver = cp_sat_solver(settings)
    status = solver.solve(model)
    info = {"status": solver.status_name(status), "vars": len(x) + len(q) + len(u) + len(y)}
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return None, info
    out = []
    for (j, o), var in y.items():
        if not solver.value(var):
            continue
        job, opt = jobs[j], options[j][o]
        procs = list(job.procs)
        pls = []
        for i, nd in enumerate(nodes):
            if not solver.value(x[j, o, i]):
                continue
            placed, ways = [], {}
            for s in range(len(nd.sockets)):
                m = solver.value(q[j, o, i, s])
                if m:
                    ways[s] = solver.value(ways_var[j, o, i, s])
                    placed.extend((procs.pop(0), s, bw_units(opt.demand.bw_per_core)) for _ in range(m))
            pls.append(NodePlacement(nd, placed, ways))
        out.append((job, opt, pls))
    return out, info


class SnsGlobalPolicy:
    """SNS with the scale and nodes of several jobs chosen jointly (CP-SAT), never worse
    than the greedy SNS plan on the objective above."""

    name = "sns-global"
    kind = PolicyKind.SPREAD

    def plan(self, request: PlanRequest, settings: PlanSettings) -> Plan:
        t0 = time.perf_counter()
        clusters, bad = group_clusters(request)
        by_key = {(c.schedd, c.cluster): c for c in clusters}
        greedy = SnsPlanner(request, settings)
        metric = {nd.machine: round(100 * nd.metric()) for nd in greedy.nodes}
        greedy.run(clusters)
        greedy_value = _objective(greedy, greedy.assignments, by_key, metric)
        stats: dict[str, Any] = {"greedy_objective": greedy_value}
        chosen = greedy
        if clusters and not any(c.age >= settings.spread_age_limit() for c in clusters):
            cp = SnsPlanner(request, settings)
            limit = settings.sns_global_max_jobs
            model_jobs = [c for c in clusters if cp.store.get(c.program) is not None
                          and all(p.request.cpus == 1 for p in c.procs)][:limit]
            in_model = {id(c) for c in model_jobs}
            for c in clusters:       # unknown programs first, as CE on whole idle nodes
                if cp.store.get(c.program) is None:
                    cp.plan_job(c)
            # the greedy plan of the model jobs on the same residual pool is the hint
            probe = SnsPlanner(request, settings)
            probe.nodes = [_copy_node(nd) for nd in cp.nodes]
            hint: dict[tuple[int, int, int], int] = {}
            node_index = {nd.machine: i for i, nd in enumerate(cp.nodes)}
            for j, c in enumerate(model_jobs):
                before = len(probe.assignments)
                if probe.plan_job(c):
                    new = probe.assignments[before:]
                    k = new[0].details["scale_factor"]
                    o = [opt.k for opt in probe.options(c)].index(k)
                    hint[j, o, -1] = 1
                    for a in new:
                        hint[j, o, node_index[a.details["machine"]]] = 1
            solution, info = _solve(cp, model_jobs, settings, metric, hint)
            stats.update({f"cpsat_{k}": v for k, v in info.items()})
            if solution is not None:
                for job, opt, pls in solution:
                    cp.place(job, opt, pls, relaxed=False)
                placed = {(a.job.schedd, a.job.cluster) for a in cp.assignments}
                for c in clusters:
                    if (c.schedd, c.cluster) in placed or cp.store.get(c.program) is None:
                        continue
                    if id(c) in in_model:
                        cp.delay(c, "delayed: not placed by the joint plan (no scale fits with the other jobs)")
                    else:
                        cp.plan_job(c)
                value = _objective(cp, cp.assignments, by_key, metric)
                stats["cpsat_objective"] = value
                if value > greedy_value:
                    chosen = cp
        stats.update({"solver": "cp-sat" if chosen is not greedy else "greedy",
                      "solve_time_s": round(time.perf_counter() - t0, 6), "jobs": len(clusters),
                      "placed_jobs": len({(a.job.schedd, a.job.cluster) for a in chosen.assignments})})
        return Plan(self.name, tuple(chosen.assignments), tuple(bad + chosen.unplaced), stats)


def _copy_node(nd):
    from condor_sched.modes.spread.sns import NodeState, SocketState

    return NodeState(nd.machine, [SocketState(s.slot, s.cpus, s.ways, s.bw_gbs, s.memory_mb) for s in nd.sockets])
