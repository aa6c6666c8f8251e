"""``global``: all devices packed jointly with OR-Tools CP-SAT, within its time limit.

Paper 002 fills devices one by one (Fig. 4); this policy solves the multiple knapsack over
all devices at once with the same objective as ``knapsack.py``: most jobs placed, ties
broken by the sum of Eq. 1 values (``COUNT_WEIGHT + scaled v`` per job). Threads and host
cpus/memory are hard constraints as there. The aging rule of ``devices.py`` runs first.

Model size (FACTS.md: a flat x[job, device] model is hopeless at 2000 x 200):
* jobs are aggregated into shapes (equal demand): one integer count per (shape, device);
* within a class (equal demand but device memory) an optimal packing may use the class's
  smallest jobs only, so each class is cut to the most jobs the devices could hold;
* identical devices are aggregated first (on any pool with more than one device): a small
  CP-SAT model picks how many devices of each group (equal free capacity and hardware
  threads) take each *pattern* (a count per class that fits threads, cpus and host
  memory), whatever the pool size; each class's smallest jobs are then dealt biggest first
  to the device with most memory left, and a greedy pass places what did not fit. This
  fixes Fig. 4's myopia (filling early devices with 4 x 60-thread jobs and leaving the
  later ones one 180-thread job each);
* on pools of ``columns.MIN_DEVICES`` devices or more, with ``MIN_COLUMN_S`` left, the
  configuration LP (how many devices of each group take each pattern) is solved by column
  generation from the best start's patterns and rounded to whole devices, ``lp-pack``
  filling the rest (``columns.py``); that plan replaces the start when it places more (on
  diverse 100k / 10k in 30 s: 99.5% of the bound, where the search alone reached 98.2%);
* pools of up to ``neighbourhood.NEIGHBOURHOOD_DEVICES`` devices are then solved as one
  exact model; larger ones are improved by a large-neighbourhood search (``neighbourhood.py``:
  a few devices re-packed exactly at a time) until the limit or the device-group LP bound
  (``bounds.py``). One exact model of the whole pool (cut into blocks when large) was the
  design before issue 11's third round: on the shape-diverse queues of ``scripts/bench_plan`` with 10 to 60
  devices it placed fewer jobs within 2 s than the search (e.g. 600 / 40, seed 1: 286
  against 287), and on 900 / 60 none over the hint even in 30 s (README, Benchmarks).

Time limit: ``settings.solver_time_limit_s`` bounds the whole call (issue 11), not only
CP-SAT. The starting plans come first: ``lp-pack`` and the greedy MCCK plan, which stops
at ``GREEDY_SHARE`` of the limit with a partial (valid) plan; a best-fit variant (up to
``TIGHT_HINT_MAX_DEVICES`` devices) and the pattern plan only while time is left. The best
of them is the hint (``add_hint``) and the fallback when time runs out. The exact model's
answer replaces it only when it places at least as many jobs with at least the same
objective, and the search returns the best plan it passed through, never worse than its
start, so ``global`` never places fewer jobs than ``knapsack`` whenever the greedy completed (``stats["greedy_completed"]``; always in deterministic mode). With
``settings.deterministic`` CP-SAT runs one worker under ``max_deterministic_time`` and no
wall clock decides anything (byte-identical plans for the simulator).
"""
from __future__ import annotations

import heapq
import time
from collections import Counter
from typing import Sequence

from condor_sched.model import Job, Plan, Slot
from condor_sched.modes.devices import columns as cg
from condor_sched.modes.devices import capacity as dv
from condor_sched.modes.devices import neighbourhood as nb
from condor_sched.modes.planning import PlanRequest, PlanSettings, PolicyKind, cp_sat_solver
from condor_sched.modes.devices.bounds import device_groups, group_lp
from condor_sched.modes.devices.knapsack import JobPool, greedy_fill, prepare
from condor_sched.modes.devices.lp_pack import pack

#: Pattern stage limits: distinct device groups, patterns per group.
MAX_PATTERN_GROUPS = 50
MAX_PATTERNS = 2000
#: Wall time kept back from the solver for building models and the plan.
BUILD_MARGIN_S = 0.1
#: Share of the solver time limit the pattern model may use on large pools.
PATTERN_SHARE = 0.25
#: Share of the time limit the starting plans (lp-pack, the MCCK greedy) may use; the
#: greedy stops there with a partial plan (wall clock only, not in deterministic mode).
GREEDY_SHARE = 0.6
#: Time kept back per job considered for assembling the Plan after the last solve.
FINISH_S_PER_JOB = 1e-5
#: The exact model is not started with less time than this left for it.
MIN_EXACT_S = 0.05
#: Up to this many devices a second, best-fit greedy plan competes for the hint.
TIGHT_HINT_MAX_DEVICES = 500


def _restricted_supply(pool: JobPool, slots: Sequence[Slot], caps: dict[str, list[int]]) -> dict[dv.Capacity, int]:
    """Per shape, how many of its jobs a model needs: each class cut to the smallest jobs
    the given devices could hold in total."""
    bound: dict[dv.ShapeClass, int] = {}
    for slot in slots:
        for need, n in pool.candidates(caps[slot.name], slot.total.device_threads):
            bound[need.shape_class] = bound.get(need.shape_class, 0) + n
    supply: dict[dv.Capacity, int] = {}
    for ck, members in pool.classes.items():
        left = bound.get(ck, 0)
        for need in members:
            if left <= 0:
                break
            n = min(left, len(pool.shapes[need]))
            if n:
                supply[need] = n
                left -= n
    return supply


def _solve_exact(
    supply: dict[dv.Capacity, int],
    slots: Sequence[Slot],
    caps: dict[str, list[int]],
    hint: dict[tuple[dv.Capacity, str], int],
    settings: PlanSettings,
    time_limit_s: float,
) -> tuple[dict[tuple[dv.Capacity, str], int] | None, dict[str, object]]:
    """The exact model of the pool (small pools); the counts per (shape, device) or None."""
    from ortools.sat.python import cp_model

    weight = dv.count_weight(sum(supply.values()))
    hw = {slot.name: slot.total.device_threads for slot in slots}
    model, x = nb.count_model(supply, [slot.name for slot in slots], caps, hw)
    if not x:
        return None, {"status": "EMPTY"}
    objective = [(weight + dv.scaled_value(need.device_threads, hw[name])) * var for (need, name), var in x.items()]
    model.maximize(sum(objective))
    for key, var in x.items():
        model.add_hint(var, hint.get(key, 0))
    solver = cp_sat_solver(settings, time_limit_s)
    status = solver.solve(model)
    info = {"status": solver.status_name(status), "vars": len(x), "bound": solver.best_objective_bound, "weight": weight}
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return None, info
    return {k: int(solver.value(v)) for k, v in x.items() if solver.value(v)}, info


def _patterns(classes, cap: Sequence[int], hw: int, min_mem: dict, limit: int) -> list[tuple[int, ...]] | None:
    """Every multiset of classes (count per class) that fits ``cap`` in threads, cpus and
    host memory, with each class's smallest job for device memory (an optimistic bound)."""
    usable = [i for i, ck in enumerate(classes) if ck.device_threads <= hw]
    out: list[tuple[int, ...]] = []
    counts = [0] * len(classes)

    def dfs(pos: int, used: list[int]) -> bool:
        if pos == len(usable):
            if any(counts):
                out.append(tuple(counts))
            return len(out) <= limit
        i = usable[pos]
        ck = classes[i]
        need = dv.Capacity(min_mem[ck], *ck)
        k = 0
        while True:
            if not dfs(pos + 1, used):
                return False
            nxt = [u + n for u, n in zip(used, need)]
            if not all(u <= c for u, c in zip(nxt, cap)):
                break
            k += 1
            counts[i] = k
            used = nxt
        counts[i] = 0
        return True

    return out if dfs(0, [0] * dv.N_DIMENSIONS) else None


def _pattern_plan(
    rest: Sequence[Job], open_slots: Sequence[Slot], caps: dict[str, list[int]], settings: PlanSettings, time_limit_s: float
) -> dict[str, list[Job]] | None:
    """Identical devices aggregated: choose how many devices of each group take each class
    pattern (a small CP-SAT model whatever the pool size), then fill devices in order with
    each class's smallest jobs; jobs that overflow device memory are left for a greedy pass.
    None when the pattern space is too large."""
    from ortools.sat.python import cp_model

    pool = JobPool.build(rest, settings)
    classes = sorted(pool.classes)
    if not classes:
        return None
    supply = {ck: sum(len(pool.shapes[n]) for n in pool.classes[ck]) for ck in classes}
    min_mem = {ck: pool.classes[ck][0].device_memory_granules for ck in classes}
    groups: dict[tuple, list[Slot]] = {}
    for s in open_slots:
        groups.setdefault((tuple(caps[s.name]), s.total.device_threads), []).append(s)
    if len(groups) > MAX_PATTERN_GROUPS:
        return None
    model = cp_model.CpModel()
    per_class: dict[tuple, list] = {ck: [] for ck in classes}
    objective = []
    chosen: list[tuple[tuple, tuple[int, ...], cp_model.IntVar]] = []
    weight = dv.count_weight(len(open_slots) * 64)
    for (cap, hw), members in groups.items():
        pats = _patterns(classes, cap, hw, min_mem, MAX_PATTERNS)
        if pats is None:
            return None
        vars_ = []
        for pat in pats:
            y = model.new_int_var(0, len(members), "")
            vars_.append(y)
            chosen.append(((cap, hw), pat, y))
            gain = sum(k * (weight + dv.scaled_value(ck.device_threads, hw)) for ck, k in zip(classes, pat))
            objective.append(gain * y)
            for ck, k in zip(classes, pat):
                if k:
                    per_class[ck].append(k * y)
        if vars_:
            model.add(sum(vars_) <= len(members))
    for ck, terms in per_class.items():
        if terms:
            model.add(sum(terms) <= supply[ck])
    if not objective:
        return None
    model.maximize(sum(objective))
    solver = cp_sat_solver(settings, time_limit_s)
    if solver.solve(model) not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return None
    per_group: dict[tuple, list[tuple[int, ...]]] = {}
    for g, pat, y in chosen:
        per_group.setdefault(g, []).extend([pat] * int(solver.value(y)))
    out: dict[str, list[Job]] = {}
    for g, members in groups.items():
        pats = sorted(per_group.get(g, []), key=lambda pt: (-sum(pt), pt))
        devs = list(zip(members, pats))
        mem_left = [caps[slot.name][dv.MEMORY] for slot, _ in devs]
        for slot, _ in devs:
            out[slot.name] = []
        for ci in sorted(range(len(classes)), key=lambda i: -classes[i].device_threads):
            slots_left = [pat[ci] for _, pat in devs]
            total = sum(slots_left)
            if not total:
                continue
            # the class's smallest jobs, biggest first, each to the device with most memory left
            heap = [(-mem_left[i], i) for i in range(len(devs)) if slots_left[i]]
            heapq.heapify(heap)
            for job in sorted(pool.take_from_class(classes[ci], total), key=lambda j: -j.request.device_memory_mb):
                need = dv.demand(job, settings)
                if not heap or -heap[0][0] < need.device_memory_granules:
                    pool.shapes[need].appendleft(job)  # left for the greedy pass
                    continue
                _, i = heapq.heappop(heap)
                out[devs[i][0].name].append(job)
                mem_left[i] -= need.device_memory_granules
                slots_left[i] -= 1
                if slots_left[i]:
                    heapq.heappush(heap, (-mem_left[i], i))
    return out


def _flat(by_device: dict[str, nb.Counts]) -> dict[tuple[dv.Capacity, str], int]:
    """Counts per device and shape as counts per (shape, device)."""
    return {(need, name): n for name, counts in by_device.items() for need, n in counts.items()}


def _counts_by_device(jobs_on: dict[str, list[Job]], settings: PlanSettings) -> dict[str, nb.Counts]:
    """A plan as, per device, its count per shape."""
    return {name: dict(Counter(dv.demand(j, settings) for j in jobs)) for name, jobs in jobs_on.items()}


def _jobs_for(counts: dict[tuple[dv.Capacity, str], int], pool: JobPool, slots: Sequence[Slot]) -> dict[str, list[Job]]:
    """Counts per (shape, device) made jobs: each shape's oldest jobs, devices in slot order."""
    out: dict[str, list[Job]] = {s.name: [] for s in slots}
    for (need, name), n in sorted(counts.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        out[name].extend(pool.take_shape(need, n))
    return out


def _objective(counts: dict[tuple[dv.Capacity, str], int], hw: dict[str, int]) -> tuple[int, int]:
    placed = sum(counts.values())
    value = sum(n * dv.scaled_value(need.device_threads, hw[name]) for (need, name), n in counts.items())
    return placed, value


#: Share of the time left after the starting plans that column generation may take (the
#: neighbourhood search gets the rest, and all of it once the LP is optimal).
COLUMN_SHARE = 0.75
#: Column generation only runs with at least this much wall time left: on diverse 10k / 2k
#: its first second of rounds (about 0.15 s each) placed no job over ``lp-pack``'s start,
#: where the search adds a few.
MIN_COLUMN_S = 2.0


class GlobalPolicy:
    """All devices jointly with CP-SAT, hinted with and never worse than MCCK."""

    name = "global"
    kind = PolicyKind.DEVICE

    def plan(self, request: PlanRequest, settings: PlanSettings) -> Plan:
        t0 = time.perf_counter()
        considered, dslots, too_big, state, rest = prepare(request, settings)
        base_assignments = list(state.assignments)
        open_slots = state.open_slots()
        caps = {s.name: list(state.residual[s.name]) for s in open_slots}
        hw = {s.name: s.total.device_threads for s in open_slots}

        deadline = t0 + settings.solver_time_limit_s - BUILD_MARGIN_S - FINISH_S_PER_JOB * len(considered)
        fill_deadline = None
        if not settings.deterministic:
            fill_deadline = min(deadline, t0 + settings.solver_time_limit_s * GREEDY_SHARE)

        def out_of_time() -> bool:
            return not settings.deterministic and time.perf_counter() >= deadline

        def fresh() -> dv.DeviceState:
            """An empty plan over the devices as the aging rule left them."""
            return dv.DeviceState(list(dslots), {k: list(v) for k, v in state.residual.items()},
                                  set(state.reserved), [], {})

        def run_greedy(tight: bool, start: dict[str, list[Job]] | None = None) -> dv.DeviceState:
            """A greedy plan, optionally completing a partial one (``start``); stopped at
            the greedy share of the limit (still a valid plan)."""
            out = fresh()
            done: set = set()
            for s in open_slots:
                for job in (start or {}).get(s.name, []):
                    out.assign(job, s, dv.demand(job, settings))
                    done.add(job.key)
            left = [j for j in rest if j.key not in done]
            info = greedy_fill(JobPool.build(left, settings), out, settings, tight=tight, deadline=fill_deadline)
            completed.append(bool(info.get("completed", True)))
            return out

        def score(st: dv.DeviceState) -> tuple[int, int]:
            return len(st.assignments), sum(
                dv.scaled_value(by_key[a.job].request.device_threads, hw[a.slot]) for a in st.assignments
            )

        by_key = {j.key: j for j in rest}
        completed: list[bool] = []
        packed_plan = fresh()
        pack(rest, packed_plan, settings, deadline=fill_deadline,
             repair_deadline=None if settings.deterministic else deadline)
        greedy, hint_name = packed_plan, "lp-pack"
        mcck: dv.DeviceState | None = None
        mcck_completed = False
        if settings.deterministic or time.perf_counter() < fill_deadline:
            mcck = run_greedy(False)
            mcck_completed = completed[-1]
            if score(mcck) >= score(greedy):
                greedy, hint_name = mcck, "mcck greedy"
        if len(open_slots) <= TIGHT_HINT_MAX_DEVICES and not out_of_time():
            tight = run_greedy(True)
            if score(tight) > score(greedy):
                greedy, hint_name = tight, "best-fit greedy"
        if len(open_slots) > 1 and not out_of_time():
            budget = min(settings.solver_time_limit_s * PATTERN_SHARE, deadline - time.perf_counter())
            pattern = _pattern_plan(rest, open_slots, caps, settings, budget) if budget > 0.05 else None
            if pattern is not None:
                cand = run_greedy(False, pattern)
                if score(cand) > score(greedy):
                    greedy, hint_name = cand, "pattern model"
        target: int | None = None
        columns: cg.ColumnPlan | None = None
        if len(open_slots) > nb.NEIGHBOURHOOD_DEVICES and len(greedy.assignments) < len(rest) and not out_of_time():
            shape_supply = dict(Counter(dv.demand(j, settings) for j in rest))
            target = group_lp(shape_supply, device_groups(open_slots, caps)).bound
        if (target is not None and len(open_slots) >= cg.MIN_DEVICES and len(greedy.assignments) < target
                and (settings.deterministic or deadline - time.perf_counter() >= MIN_COLUMN_S)):
            columns, candidate = self._columns(greedy, rest, shape_supply, by_key, open_slots, caps, settings, deadline,
                                               target, fresh())
            if candidate is not None and score(candidate) > score(greedy):
                greedy, hint_name = candidate, "configuration LP"
        greedy_jobs: dict[str, list[Job]] = {s.name: [] for s in open_slots}
        for a in greedy.assignments:
            greedy_jobs[a.slot].append(by_key[a.job])
        placed_keys = {a.job for a in greedy.assignments}
        leftover = [j for j in rest if j.key not in placed_keys]

        final: dict[str, list[Job]] = dict(greedy_jobs)
        statuses: list[str] = []
        bound_total: int | None = None
        improved = 0
        search: nb.SearchResult | None = None
        on_device = _counts_by_device(greedy_jobs, settings)
        if leftover and len(open_slots) <= nb.NEIGHBOURHOOD_DEVICES:
            budget = settings.solver_time_limit_s if settings.deterministic else deadline - time.perf_counter()
            if settings.deterministic or budget >= MIN_EXACT_S:
                pool = JobPool.build(sorted(rest, key=dv.job_order), settings)
                supply = _restricted_supply(pool, open_slots, caps)
                hint = _flat(on_device)
                counts, info = _solve_exact(supply, open_slots, caps, hint, settings, budget)
                statuses.append(str(info["status"]))
                if "bound" in info:
                    bound_total = int(info["bound"] // info["weight"])
                if counts is not None and _objective(counts, hw) >= _objective(hint, hw):
                    improved = int(_objective(counts, hw) > _objective(hint, hw))
                    final = _jobs_for(counts, pool, open_slots)
        elif leftover and target is not None:
            bound_total = target
            unplaced = Counter(dv.demand(j, settings) for j in leftover)
            search = nb.improve(on_device, unplaced, open_slots, caps, settings, deadline, target)
            if search.accepted:
                improved = 1
                pool = JobPool.build(sorted(rest, key=dv.job_order), settings)
                final = _jobs_for(_flat(search.on_device), pool, open_slots)

        state.assignments = list(base_assignments)
        slot_by_name = {s.name: s for s in open_slots}
        for s in open_slots:
            for job in final.get(s.name, []):
                state.assign(job, slot_by_name[s.name], dv.demand(job, settings))
        greedy_placed = len(mcck.assignments) if mcck is not None else 0
        placed = len(state.assignments) - len(base_assignments)
        stats = {
            "solver": "cp-sat",
            "exact_model": bool(statuses),
            "improved_hint": bool(improved),
            "cp_sat_status": statuses,
            "column_rounds": columns.rounds if columns else 0,
            "column_lp_value": round(columns.lp_value, 3) if columns else None,
            "search_steps": search.steps if search else 0,
            "search_accepted": search.accepted if search else 0,
            "greedy_placed": greedy_placed + len(base_assignments),
            "hint": hint_name,
            "greedy_completed": mcck_completed,
            "extra_over_greedy": placed - greedy_placed,
            "starving_placed": len(base_assignments),
            "placed_upper_bound": bound_total + len(base_assignments) if bound_total is not None else None,
            "solve_time_s": round(time.perf_counter() - t0, 6),
        }
        return dv.finish_plan(self.name, considered, dslots, state, too_big, settings, stats)

    @staticmethod
    def _columns(start: dv.DeviceState, rest: Sequence[Job], supply: nb.Counts, by_key: dict,
                 open_slots: Sequence[Slot], caps: dict[str, list[int]], settings: PlanSettings, deadline: float,
                 target: int, out: dv.DeviceState) -> tuple[cg.ColumnPlan | None, dv.DeviceState | None]:
        """The rounded configuration LP (``columns.py``) from ``start``'s patterns, its gaps
        and left-over devices filled by ``lp-pack`` into the empty plan ``out``: the LP's
        answer and that plan."""
        on_device: dict[str, list[Job]] = {s.name: [] for s in open_slots}
        for a in start.assignments:
            on_device[a.slot].append(by_key[a.job])
        budget = settings.solver_time_limit_s * COLUMN_SHARE
        if not settings.deterministic:
            budget = (deadline - time.perf_counter()) * COLUMN_SHARE
        columns = cg.configuration_plan(_counts_by_device(on_device, settings), supply, open_slots, caps, settings,
                                        time.perf_counter() + budget, budget, target)
        if columns is None:
            return None, None
        pool = JobPool.build(sorted(rest, key=dv.job_order), settings)
        slot_by_name = {s.name: s for s in open_slots}
        done: set = set()
        for name, jobs in _jobs_for(_flat(columns.on_device), pool, open_slots).items():
            for job in jobs:
                out.assign(job, slot_by_name[name], dv.demand(job, settings))
                done.add(job.key)
        pack([j for j in rest if j.key not in done], out, settings,
             deadline=None if settings.deterministic else deadline)
        return columns, out
