"""The configuration LP by column generation, rounded: ``global``'s start on large pools.

A *pattern* is what one device holds: a count per shape that fits the device's free
capacity in every dimension (threads, cpus, host memory, device memory) and its hardware
threads. The configuration LP (Gilmore and Gomory's cutting-stock LP) chooses, for every
group of equal devices (same free capacity and hardware threads), how many of them take
each pattern:

    maximise  sum_p |p| y_p
    s.t.      sum_p p_s y_p <= c_s                  for every shape s (its supply)
              sum_{p of g} y_p <= n_g               for every device group g
              y_p >= 0

Every device plan is an integer point of it, so it is the strongest LP over device patterns
(``bounds.py``). It has a column per pattern, far too many to write down; column generation
starts from the patterns of a known plan (``lp-pack``'s) plus one single-shape pattern per
(shape, group), solves the restricted LP with GLOP, and asks each group's *pricing problem*
for the pattern of largest reduced cost, |p| - sum_s pi_s p_s - mu_g with the LP's duals pi,
mu: a knapsack over one device, solved with CP-SAT on ``neighbourhood.count_model``. A pattern
of positive reduced cost joins the LP; with none the LP is optimal.

Rounding: each pattern goes to floor(y_p) devices of its group (largest y first, capped by
the shapes' supply left), which is a valid plan; the devices left over (at most about one
per fractional y_p) and the gaps are filled by ``lp-pack`` in ``global``. On large pools the
fractional part is a small share of the devices, so the plan lands within a fraction of a
percent of the LP: on the diverse queues of ``scripts/bench_plan`` (10k / 2k, seed 1) 8404
of a device-group LP bound of 8430 (99.7%), where ``lp-pack`` alone places 98.3% and the
neighbourhood search reached 99.2% in 30 s. On small pools one device's rounding loss is a
large share, so ``global`` uses this only from ``MIN_DEVICES`` devices up.

The LP counts jobs only; the Eq. 1 tie-break of ``global`` is left to the neighbourhood
search that follows. With ``settings.deterministic`` pricing runs under CP-SAT's
deterministic limit, one group after another, and the rounds are counted against a
deterministic budget, so no clock decides anything.
"""
from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Sequence


from condor_sched.model import Slot
from condor_sched.modes.devices import capacity as dv
from condor_sched.modes.planning import PlanSettings, cp_sat_solver
from condor_sched.modes.devices.bounds import per_device_count
from condor_sched.modes.devices.neighbourhood import Counts, count_model, step_limit

#: Pools with fewer devices are left to the neighbourhood search (rounding loses up to a
#: device's jobs per fractional pattern; on diverse 900 / 60 the rounded plan is far below
#: ``lp-pack``'s).
MIN_DEVICES = 200
#: More distinct (free capacity, hardware threads) groups than this: one pricing problem
#: each per round is too slow; ``global`` goes on without columns (a live pool of partly
#: used devices).
MAX_GROUPS = 16
#: Most time (wall or deterministic) one pricing problem may take.
PRICING_LIMIT_S = 0.3
#: A pricing problem is not started with less wall time than this left.
MIN_PRICING_S = 0.02
#: Duals are scaled to integers for CP-SAT's objective.
DUAL_SCALE = 10**5
#: A pattern joins the LP when its reduced cost exceeds this.
REDUCED_COST_EPS = 1e-6
#: Rounds at most in deterministic mode per deterministic second of budget.
DETERMINISTIC_ROUNDS_PER_S = 20


@dataclass
class ColumnPlan:
    """The rounded LP: per device given a pattern, its count per shape (other devices empty)."""

    on_device: dict[str, Counts]
    lp_value: float
    rounds: int
    columns: int


class _Master:
    """The restricted configuration LP over the patterns found so far (GLOP)."""

    def __init__(self, supply: Counts, groups: dict[tuple, list[str]]):
        from ortools.linear_solver import pywraplp

        self.solver = pywraplp.Solver.CreateSolver("GLOP")
        inf = self.solver.infinity()
        self.shape_rows = {need: self.solver.Constraint(-inf, float(n)) for need, n in supply.items()}
        self.group_rows = {g: self.solver.Constraint(-inf, float(len(names))) for g, names in groups.items()}
        self.objective = self.solver.Objective()
        self.objective.SetMaximization()
        self.columns: list[tuple[tuple, tuple[tuple[dv.Capacity, int], ...]]] = []
        self.variables: list = []
        self.seen: set = set()

    def add(self, group: tuple, pattern: Counts) -> bool:
        key = (group, tuple(sorted((need, n) for need, n in pattern.items() if n)))
        if not key[1] or key in self.seen:
            return False
        self.seen.add(key)
        var = self.solver.NumVar(0.0, self.solver.infinity(), "")
        for need, n in key[1]:
            self.shape_rows[need].SetCoefficient(var, float(n))
        self.group_rows[group].SetCoefficient(var, 1.0)
        self.objective.SetCoefficient(var, float(sum(n for _, n in key[1])))
        self.columns.append(key)
        self.variables.append(var)
        return True

    def solve(self) -> tuple[float, list[float], dict[dv.Capacity, float], dict[tuple, float]]:
        """The LP's value, each column's y, and the duals of the shape and group rows."""
        from ortools.linear_solver import pywraplp

        if self.solver.Solve() != pywraplp.Solver.OPTIMAL:  # pragma: no cover - y = 0 is feasible
            raise RuntimeError("configuration LP not solved to optimality")
        return (self.objective.Value(), [v.solution_value() for v in self.variables],
                {need: row.dual_value() for need, row in self.shape_rows.items()},
                {g: row.dual_value() for g, row in self.group_rows.items()})


def _price(name: str, supply: Counts, duals: dict[dv.Capacity, float], caps: dict[str, list[int]],
           hardware_threads: dict[str, int], settings: PlanSettings, limit_s: float) -> tuple[Counts, float, float]:
    """The pattern of one device (``name``, standing for its group) of largest value
    sum_s (1 - pi_s) p_s; its value, and CP-SAT's deterministic time."""
    from ortools.sat.python import cp_model

    gain = {need: 1.0 - duals[need] for need in supply}
    useful = {need: n for need, n in supply.items() if gain[need] > REDUCED_COST_EPS}
    if not useful:
        return {}, 0.0, 0.0
    model, x = count_model(useful, [name], caps, hardware_threads)
    if not x:
        return {}, 0.0, 0.0
    model.maximize(sum(round(DUAL_SCALE * gain[need]) * var for (need, _), var in x.items()))
    solver = cp_sat_solver(settings, limit_s)
    solver.parameters.num_workers = 1
    status = solver.solve(model)
    spent = solver.response_proto.deterministic_time
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return {}, 0.0, spent
    pattern = {need: int(solver.value(var)) for (need, _), var in x.items() if solver.value(var)}
    return pattern, sum(gain[need] * n for need, n in pattern.items()), spent


def _round(columns: list[tuple[tuple, tuple]], y: list[float], supply: Counts,
           groups: dict[tuple, list[str]]) -> dict[str, Counts]:
    """floor(y_p) devices per pattern, largest y first, within each shape's supply."""
    left = dict(supply)
    free = {g: list(reversed(names)) for g, names in groups.items()}  # popped in slot order
    out: dict[str, Counts] = {}
    for i in sorted(range(len(columns)), key=lambda i: (-y[i], i)):
        group, pattern = columns[i]
        n = min([int(y[i] + 1e-9), len(free[group])] + [left[need] // k for need, k in pattern])
        for _ in range(max(0, n)):
            out[free[group].pop()] = dict(pattern)
        for need, k in pattern:
            left[need] -= k * max(0, n)
    return out


def configuration_plan(start: dict[str, Counts], supply: Counts, slots: Sequence[Slot], caps: dict[str, list[int]],
                       settings: PlanSettings, deadline: float, budget_s: float, target: int) -> ColumnPlan | None:
    """Column generation from the patterns of ``start`` until ``deadline`` (in deterministic
    mode ``budget_s`` of deterministic time instead), the LP optimal, or its value at
    ``target`` (the device-group LP bound); then rounded (module docstring). None with more
    than ``MAX_GROUPS`` device groups."""
    groups: dict[tuple, list[str]] = {}
    for s in slots:
        groups.setdefault((tuple(caps[s.name]), s.total.device_threads), []).append(s.name)
    if len(groups) > MAX_GROUPS or not supply:
        return None
    hardware_threads = {s.name: s.total.device_threads for s in slots}
    group_of = {name: g for g, names in groups.items() for name in names}
    master = _Master(supply, groups)
    for name, counts in start.items():
        master.add(group_of[name], counts)
    for g, names in groups.items():
        cap, hw = caps[names[0]], hardware_threads[names[0]]
        for need, n in supply.items():
            k = min(n, per_device_count(need, cap, hw))
            if k > 0:
                master.add(g, {need: k})
    parallel = 1 if settings.deterministic else max(1, min(len(groups), os.cpu_count() or 1))
    max_rounds = max(1, int(budget_s * DETERMINISTIC_ROUNDS_PER_S))
    spent, rounds = 0.0, 0
    with ThreadPoolExecutor(parallel) if parallel > 1 else nullcontext() as pool:
        while True:
            value, y, duals, group_duals = master.solve()
            if value >= target - REDUCED_COST_EPS:
                break
            limit = step_limit(settings, spent, budget_s, rounds, max_rounds, deadline, PRICING_LIMIT_S, MIN_PRICING_S)
            if limit is None:
                break
            rounds += 1

            def price(g: tuple) -> tuple[Counts, float, float]:
                return _price(groups[g][0], supply, duals, caps, hardware_threads, settings, limit)

            added = 0
            for g, (pattern, gain, step_time) in zip(groups, (pool.map if pool is not None else map)(price, groups)):
                spent += step_time
                if gain > group_duals[g] + REDUCED_COST_EPS and master.add(g, pattern):
                    added += 1
            if not added:
                break
    return ColumnPlan(_round(master.columns[: len(y)], y, supply, groups), value, rounds, len(master.columns))
