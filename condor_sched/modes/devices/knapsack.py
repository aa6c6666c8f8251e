"""MCCK, the greedy knapsack planner of paper 002 (Section IV-C, Eq. 1, Fig. 4).

Each device is a knapsack; devices are filled one after another in name order (Fig. 4),
each with an exact knapsack over the jobs still unplaced. A job's profit is
``COUNT_WEIGHT + VALUE_SCALE * v`` with v = 1 - (t/T)^2 (Eq. 1, T = the device's hardware
threads, which the paper hard-codes as 240): the planner maximises the number of jobs on
the device first and the Eq. 1 sum second. Paper 002 states its aim as concurrency ("as
many jobs as possible on each coprocessor") and uses Eq. 1 as its proxy; ranking count
first makes the aim explicit and gives a job with t = T a positive worth (the aging rule
in ``devices.py`` does the rest against starvation).

Threads (deviation from the paper). The paper's DP is over memory only and makes a
knapsack whose threads overflow worth zero; that rule is not a knapsack constraint and
would let a DP answer pack 8 x 240-thread jobs. Here threads are a hard second constraint:
the sum of t on a device is at most T * ``settings.thread_overcommit`` (default 1.0, i.e.
no oversubscription). COSMIC serialises offloads on the node, so an overcommit > 1 is a
setting for pools whose node side arbitrates offloads. Host cpus (and host memory) of the
device slot are constraints too.

Two exact solvers behind ``solve_knapsack`` (``settings.knapsack_solver``):

* ``"dp"``: a multi-constraint DP vectorised with numpy over (memory granules x threads /
  gcd x cpus ...), dimensions that cannot bind dropped, identical job shapes aggregated
  into a bounded knapsack by binary splitting. Exact while the state space is at most
  ``MAX_DP_CELLS`` cells (beyond that a dimension is coarsened conservatively: never
  oversubscribes, may miss the optimum; ``stats["dp_exact"]`` says so).
* ``"ortools"``: OR-Tools' ``KnapsackSolver`` with the multidimensional CP-SAT solver
  (branch and bound blows up beyond ~28 items, see FACTS.md) on the same integer profits.

Scale: within a *class* (jobs equal in every demand but device memory, hence equal in
value) an optimal packing may always use the class's smallest-memory jobs, so each device
only sees, per class, the few smallest jobs that could fit it; identical (capacity,
candidates) problems are solved once, and a device equal in free capacity to an earlier
one takes that one's exact answer (jobs per class) again while the jobs left allow it: it
is then still optimal, because jobs only leave the pool (``greedy_fill``). The job actually
placed from a class is then the smallest (ties: oldest, then key) so big jobs of a class
wait for the aging rule. These keep every plan the same as solving each device afresh.
"""
from __future__ import annotations

import math
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np

from condor_sched.model import Job, Plan
from condor_sched.modes.devices import capacity as dv
from condor_sched.modes.planning import PlanRequest, PlanSettings, PolicyKind

#: Largest DP table (cells) solved exactly.
MAX_DP_CELLS = 4_000_000


# --------------------------------------------------------------------------- solvers


def _binding_dims(weights: Sequence[Sequence[int]], counts: Sequence[int], caps: Sequence[int]) -> list[int]:
    """Dimensions that can bind: dimension d is dropped when the heaviest set of items that
    the dimensions still kept allow (by item count) fits d anyway. Dimensions are decided
    one at a time, a dropped one never bounds another."""
    n_dim = len(caps)
    live = [(w, c) for w, c in zip(weights, counts) if c > 0]

    def count_bound(d: int) -> int:
        if live and all(w[d] > 0 for w, _ in live):
            return caps[d] // min(w[d] for w, _ in live)
        return 1 << 62

    kept = list(range(n_dim))
    for d in range(n_dim):
        kmax = min([sum(c for _, c in live)] + [count_bound(e) for e in kept if e != d])
        left, heaviest = kmax, 0
        for w, c in sorted(live, key=lambda wc: -wc[0][d]):
            take = min(left, c)
            heaviest += take * w[d]
            left -= take
            if left == 0:
                break
        if heaviest <= caps[d]:
            kept.remove(d)
    return kept


def dp_bounded(
    profits: Sequence[int], weights: Sequence[Sequence[int]], counts: Sequence[int], caps: Sequence[int],
    max_cells: int = MAX_DP_CELLS,
) -> tuple[list[int], bool]:
    """Bounded multidimensional knapsack: item i (``weights[i][d]``) at most ``counts[i]``
    times. Returns how many of each to take and whether the answer is exact.

    Ties go to the items listed first."""
    n = len(profits)
    taken = [0] * n
    counts = [
        min([c] + [caps[d] // w[d] for d in range(len(caps)) if w[d] > 0]) if p > 0 else 0
        for p, w, c in zip(profits, weights, counts)
    ]
    live = [i for i in range(n) if counts[i] > 0]
    if not live:
        return taken, True
    binding = _binding_dims([weights[i] for i in live], [counts[i] for i in live], caps)
    if not binding:
        for i in live:
            taken[i] = counts[i]
        return taken, True
    units, cap_units = [], []
    for d in binding:
        g = 0
        for i in live:
            g = math.gcd(g, weights[i][d])
        g = max(g, 1)
        units.append(g)
        cap_units.append(caps[d] // g)
    w_units = {i: [-(-weights[i][d] // u) for d, u in zip(binding, units)] for i in live}
    exact = True
    while math.prod(c + 1 for c in cap_units) > max_cells:
        exact = False
        j = max(range(len(cap_units)), key=lambda k: cap_units[k])
        f = 2
        cap_units[j] //= f
        for i in live:
            w_units[i][j] = -(-w_units[i][j] // f)
    # the longest axis last (contiguous): numpy's inner loops run over it; same cells, same answer
    order = sorted(range(len(cap_units)), key=lambda k: cap_units[k])
    cap_units = [cap_units[k] for k in order]
    w_units = {i: [w[k] for k in order] for i, w in w_units.items()}
    pieces = []
    for i in live:
        k, left = 1, counts[i]
        while left > 0:
            m = min(k, left)
            w = [m * x for x in w_units[i]]
            if all(x <= c for x, c in zip(w, cap_units)):
                pieces.append((i, m, w, m * profits[i]))
            left -= m
            k *= 2
    shape = tuple(c + 1 for c in cap_units)
    # int32 halves the memory traffic; exact whenever no sum of profits can reach 2^31
    dtype = np.int32 if sum(p for _, _, _, p in pieces) < 2**31 - 1 else np.int64
    dp = np.zeros(shape, dtype=dtype)
    takes = []
    for _, _, w, p in pieces:
        dst = tuple(slice(x, None) for x in w)
        src = tuple(slice(0, s - x) for s, x in zip(shape, w))
        cand = dp[src] + p
        better = cand > dp[dst]
        np.copyto(dp[dst], cand, where=better)
        takes.append(better)
    state = list(cap_units)
    for (i, m, w, _), better in zip(reversed(pieces), reversed(takes)):
        idx = tuple(s - x for s, x in zip(state, w))
        if all(v >= 0 for v in idx) and better[idx]:
            taken[i] += m
            state = [s - x for s, x in zip(state, w)]
    return taken, exact


def ortools_01(profits: Sequence[int], weights_by_dim: Sequence[Sequence[int]], caps: Sequence[int], time_limit_s: float) -> tuple[list[int], bool]:
    """0-1 multidimensional knapsack with OR-Tools; chosen item indices and optimality."""
    from ortools.algorithms.python import knapsack_solver

    if not profits:
        return [], True
    kind = knapsack_solver.SolverType.KNAPSACK_MULTIDIMENSION_CP_SAT_SOLVER
    if len(caps) == 1:
        kind = knapsack_solver.SolverType.KNAPSACK_DYNAMIC_PROGRAMMING_SOLVER
    solver = knapsack_solver.KnapsackSolver(kind, "condor_sched_device")
    solver.set_time_limit(time_limit_s)
    solver.init(list(profits), [list(w) for w in weights_by_dim], list(caps))
    solver.solve()
    chosen = [i for i in range(len(profits)) if solver.best_solution_contains(i)]
    return chosen, bool(solver.is_solution_optimal())


def solve_knapsack(
    profits: Sequence[int],
    weights_by_dim: Sequence[Sequence[int]],
    capacities: Sequence[int],
    solver: str = "dp",
    time_limit_s: float = 10.0,
) -> list[int]:
    """Exact 0-1 multidimensional knapsack (weights given as ``weights[dim][item]``, as
    OR-Tools takes them): the indices of the chosen items. ``"dp"`` aggregates identical
    items; ``"ortools"`` uses OR-Tools' multidimensional CP-SAT knapsack solver."""
    n = len(profits)
    if solver == "ortools":
        return ortools_01(profits, weights_by_dim, capacities, time_limit_s)[0]
    groups: dict[tuple, list[int]] = {}
    for i in range(n):
        groups.setdefault((profits[i], tuple(w[i] for w in weights_by_dim)), []).append(i)
    keys = list(groups)
    taken, _ = dp_bounded([k[0] for k in keys], [k[1] for k in keys], [len(groups[k]) for k in keys], capacities)
    return sorted(i for k, t in zip(keys, taken) for i in groups[k][:t])


# --------------------------------------------------------------------------- job pool


@dataclass(slots=True)
class JobPool:
    """The jobs still unplaced, grouped into shapes (equal demand) and classes (equal
    demand but device memory), smallest memory first, oldest first within a shape."""

    shapes: dict[dv.Capacity, deque[Job]] = field(default_factory=dict)
    classes: dict[dv.ShapeClass, list[dv.Capacity]] = field(default_factory=dict)

    @classmethod
    def build(cls, jobs: Sequence[Job], settings: PlanSettings) -> JobPool:
        pool = cls()
        for job in jobs:  # already oldest first
            pool.shapes.setdefault(dv.demand(job, settings), deque()).append(job)
        for need in sorted(pool.shapes):
            pool.classes.setdefault(need.shape_class, []).append(need)
        for members in pool.classes.values():
            members.sort(key=lambda n: n.device_memory_granules)
        return pool

    def prune(self) -> None:
        for ck in list(self.classes):
            members = [n for n in self.classes[ck] if self.shapes[n]]
            if members:
                self.classes[ck] = members
            else:
                del self.classes[ck]

    def candidates(self, cap: Sequence[int], hardware_threads: int) -> list[tuple[dv.Capacity, int]]:
        """Per class, the smallest jobs that could all be on a device with ``cap`` left."""
        out = []
        for ck, members in self.classes.items():
            if ck.device_threads > hardware_threads:
                continue
            k = self._class_bound(cap, ck)
            mem_left = cap[dv.MEMORY]
            for need in members:
                if k <= 0 or need.device_memory_granules > mem_left:
                    break
                jobs = self.shapes[need]
                if not jobs:
                    continue
                take = min(k, len(jobs), mem_left // need.device_memory_granules)
                out.append((need, take))
                k -= take
                mem_left -= take * need.device_memory_granules
        return out

    def all_candidates(self, cap: Sequence[int], hardware_threads: int) -> list[tuple[dv.Capacity, int]]:
        """Every shape that fits ``cap``, each with how many of it could be there."""
        out = []
        for ck, members in self.classes.items():
            if ck.device_threads > hardware_threads:
                continue
            k = self._class_bound(cap, ck)
            for need in members:
                if need.device_memory_granules > cap[dv.MEMORY]:
                    break
                take = min(k, len(self.shapes[need]), cap[dv.MEMORY] // need.device_memory_granules)
                if take:
                    out.append((need, take))
        return out

    @staticmethod
    def _class_bound(cap: Sequence[int], ck: dv.ShapeClass) -> int:
        """How many jobs of class ``ck`` fit ``cap`` in every dimension but device memory."""
        return min([cap[col] // amount for col, amount in zip(dv.CLASS_COLUMNS, ck) if amount > 0], default=1 << 30)

    def class_counts_fit(self, per_class: dict[dv.ShapeClass, int], memory_granules: int) -> bool:
        """Whether each class still has ``per_class[ck]`` jobs and the smallest of them fit
        ``memory_granules`` of device memory together."""
        used = 0
        for ck, n in per_class.items():
            for need in self.classes.get(ck, ()):
                take = min(n, len(self.shapes[need]))
                used += take * need.device_memory_granules
                n -= take
                if n == 0:
                    break
            if n > 0 or used > memory_granules:
                return False
        return True

    def take_from_class(self, ck: dv.ShapeClass, n: int) -> list[Job]:
        """The ``n`` smallest-memory jobs of a class (oldest first within a shape)."""
        out = []
        for need in self.classes[ck]:
            jobs = self.shapes[need]
            while jobs and len(out) < n:
                out.append(jobs.popleft())
            if len(out) == n:
                break
        return out

    def take_shape(self, need: dv.Capacity, n: int) -> list[Job]:
        jobs = self.shapes[need]
        return [jobs.popleft() for _ in range(min(n, len(jobs)))]

    def size(self) -> int:
        return sum(len(q) for q in self.shapes.values())


# --------------------------------------------------------------------------- greedy (Fig. 4)


#: A job's integer profit in a device's knapsack from its demand and the device's hardware
#: threads; it must not depend on device memory (a class's jobs are equally worth).
Profit = Callable[[dv.Capacity, int], int]


def _solve_device(
    cands: list[tuple[dv.Capacity, int]],
    cap: Sequence[int],
    hardware_threads: int,
    settings: PlanSettings,
    tight: bool = False,
    max_cells: int = MAX_DP_CELLS,
    profit: Profit | None = None,
) -> tuple[list[int], bool]:
    if profit is None:
        weight = dv.count_weight(sum(c for _, c in cands))
        profits = [weight + dv.scaled_value(need.device_threads, hardware_threads) for need, _ in cands]
    else:
        profits = [profit(need, hardware_threads) for need, _ in cands]
    if tight:  # third criterion: most device memory used (best fit)
        scale = cap[dv.MEMORY] + 1
        profits = [p * scale + need.device_memory_granules for p, (need, _) in zip(profits, cands)]
    if settings.knapsack_solver == "ortools":
        items = [i for i, (_, c) in enumerate(cands) for _ in range(c)]
        chosen, optimal = ortools_01(
            [profits[i] for i in items],
            [[cands[i][0][d] for i in items] for d in range(dv.N_DIMENSIONS)],
            list(cap),
            settings.solver_time_limit_s,
        )
        taken = [0] * len(cands)
        for j in chosen:
            taken[items[j]] += 1
        return taken, optimal
    return dp_bounded(profits, [need for need, _ in cands], [c for _, c in cands], cap, max_cells)


def _take_classes(pool: JobPool, state: dv.DeviceState, slot, per_class: dict[dv.ShapeClass, int],
                  settings: PlanSettings) -> None:
    for ck, n in per_class.items():
        for job in pool.take_from_class(ck, n):
            state.assign(job, slot, dv.demand(job, settings))
    if per_class:
        pool.prune()


def greedy_fill(
    pool: JobPool, state: dv.DeviceState, settings: PlanSettings, tight: bool = False,
    deadline: float | None = None,
    max_cells: int = MAX_DP_CELLS,
    reuse_inexact: bool = False,
    reuse: bool = True,
    profit: Profit | None = None,
) -> dict[str, object]:
    """Fig. 4: fill each open device in turn with an exact knapsack over the jobs left.

    Returns solver stats; assignments go to ``state``. ``tight`` (used by ``global`` for a
    second starting plan) breaks ties between equal packings by the most device memory
    used, over every shape, instead of taking each class's smallest jobs. ``deadline`` (a
    ``time.perf_counter()`` value, ``global`` only) stops before the next device once
    passed, leaving a partial but valid plan; ``stats["completed"]`` says whether it did.

    Exact speed-up: the last exact answer (jobs per class) on a device with the same free
    capacity and hardware threads is taken again when the jobs left still allow it. It is
    then still optimal: jobs only leave the pool, so the smallest k jobs of a class only get
    bigger and every answer feasible now was feasible then (``reuse=False`` turns this off:
    the tests' plain MCCK). ``profit`` replaces paper 002's count-then-Eq. 1 profit (another
    policy's value function; the exact speed-up holds for any profit of the class alone).
    ``max_cells`` < ``MAX_DP_CELLS``
    and ``reuse_inexact`` (take the last answer again even when it was not exact) are
    ``lp-pack``'s options, which give up exactness for speed."""
    memo: dict[tuple, tuple[list[int], bool]] = {}
    last: dict[tuple, dict[dv.ShapeClass, int]] = {}  # (free capacity, T) -> last exact answer
    solves = hits = reuses = 0
    exact = True
    completed = True
    for slot in state.open_slots():
        if not pool.classes:
            break
        if deadline is not None and time.perf_counter() > deadline:
            completed = False
            break
        cap = state.residual[slot.name]
        hw = slot.total.device_threads
        same = (tuple(cap), hw)
        if reuse and not tight and same in last and pool.class_counts_fit(last[same], cap[dv.MEMORY]):
            reuses += 1
            _take_classes(pool, state, slot, last[same], settings)
            continue
        cands = pool.all_candidates(cap, hw) if tight else pool.candidates(cap, hw)
        if not cands:
            continue
        key = (tuple(cap), hw, tuple(cands))
        if key not in memo:
            memo[key] = _solve_device(cands, cap, hw, settings, tight, max_cells, profit)
            solves += 1
        else:
            hits += 1
        taken, ok = memo[key]
        exact = exact and ok
        if tight:
            for (need, _), t in zip(cands, taken):
                for job in pool.take_shape(need, t):
                    state.assign(job, slot, need)
            if any(taken):
                pool.prune()
            continue
        per_class: dict[dv.ShapeClass, int] = {}
        for (need, _), t in zip(cands, taken):
            if t:
                per_class[need.shape_class] = per_class.get(need.shape_class, 0) + t
        if ok or reuse_inexact:
            last[same] = per_class
        _take_classes(pool, state, slot, per_class, settings)
    stats: dict[str, object] = {"knapsack_solves": solves, "knapsack_cache_hits": hits,
                                "knapsack_reuses": reuses, "solver_exact": exact}
    if deadline is not None:
        stats["completed"] = completed
    return stats


def prepare(request: PlanRequest, settings: PlanSettings, aging: bool = True):
    """The common start of every device plan: select, drop too-big jobs, apply aging
    (unless the policy is starvation-free by itself, as FIFO ``exclusive`` is)."""
    dv.check_settings(settings)
    considered = dv.device_jobs(request.idle)
    dslots = dv.device_slots(request.slots)
    ok, too_big = dv.split_too_big(considered, dslots, settings)
    state = dv.DeviceState.start(dslots, settings)
    if aging:
        rest = dv.place_starving(ok, state, settings, {j.key: request.age_of(j.key) for j in ok})
    else:
        rest = sorted(ok, key=dv.job_order)
    return considered, dslots, too_big, state, rest


class KnapsackPolicy:
    """Paper 002's MCCK: greedy over devices, exact knapsack per device."""

    name = "knapsack"
    kind = PolicyKind.DEVICE

    def plan(self, request: PlanRequest, settings: PlanSettings) -> Plan:
        return greedy_plan(self.name, request, settings)


def greedy_plan(name: str, request: PlanRequest, settings: PlanSettings, profit: Profit | None = None) -> Plan:
    """Fig. 4 as a policy's plan: aging first, then ``greedy_fill`` with ``profit`` (None:
    paper 002's count-then-Eq. 1)."""
    t0 = time.perf_counter()
    considered, dslots, too_big, state, rest = prepare(request, settings)
    starving_placed = len(state.assignments)
    stats = greedy_fill(JobPool.build(rest, settings), state, settings, profit=profit)
    stats.update(solver=settings.knapsack_solver, starving_placed=starving_placed,
                 solve_time_s=round(time.perf_counter() - t0, 6))
    return dv.finish_plan(name, considered, dslots, state, too_big, settings, stats)
