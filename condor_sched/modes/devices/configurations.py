"""Device configurations of thread requests and the LP that mixes them (issue 12).

A *configuration* is a multiset of thread requests that fits one device's hardware threads
T (the offloads that can run side by side). Given how much device time each request needs,
the configuration LP

    minimise  sum_c y_c   s.t.  sum_c n_s(c) y_c >= W_s,  y >= 0

says which configurations, and how much of each, tile the work best. The makespan bound
(``simulate/makespan_bound.py``) reads its value; ``thread-fill`` reads its solution as the
mix of configurations to give the devices. Pure: no HTCondor, no clock.
"""
from __future__ import annotations

from typing import Sequence

#: Distinct thread requests and configurations beyond which no LP is set up.
MAX_SIZES = 16
MAX_CONFIGURATIONS = 50_000

Configuration = tuple[int, ...]


def configurations(sizes: Sequence[int], max_counts: Sequence[int], threads: int) -> list[Configuration] | None:
    """Every non-empty count vector over ``sizes`` whose threads fit ``threads``, at most
    ``max_counts[i]`` of size i; None when there are more than ``MAX_CONFIGURATIONS`` (or
    more than ``MAX_SIZES`` sizes)."""
    if len(sizes) > MAX_SIZES:
        return None
    out: list[Configuration] = []
    counts = [0] * len(sizes)

    def extend(i: int, left: int) -> bool:
        if i == len(sizes):
            if any(counts):
                out.append(tuple(counts))
            return len(out) <= MAX_CONFIGURATIONS
        for k in range(min(left // sizes[i], max_counts[i]) + 1):
            counts[i] = k
            if not extend(i + 1, left - k * sizes[i]):
                return False
        counts[i] = 0
        return True

    return out if extend(0, threads) else None


def covering_lp(demand: Sequence[float], columns: Sequence[Sequence[float]],
                allowed: set[int] | None = None) -> tuple[float, list[float]] | None:
    """minimise sum_j y_j  s.t.  sum_j columns[j][i] y_j >= demand[i],  y >= 0 (y_j = 0 for
    a column not in ``allowed``, when given): the value and y, or None when infeasible."""
    from ortools.linear_solver import pywraplp

    solver = pywraplp.Solver.CreateSolver("GLOP")
    y = [solver.NumVar(0.0, solver.infinity() if allowed is None or j in allowed else 0.0, "")
         for j in range(len(columns))]
    for i, d in enumerate(demand):
        row = solver.Constraint(d, solver.infinity())
        for var, column in zip(y, columns):
            if column[i]:
                row.SetCoefficient(var, float(column[i]))
    objective = solver.Objective()
    for var in y:
        objective.SetCoefficient(var, 1.0)
    objective.SetMinimization()
    if solver.Solve() != pywraplp.Solver.OPTIMAL:
        return None
    return objective.Value(), [var.solution_value() for var in y]


def configuration_lp(work: Sequence[float], configs: Sequence[Configuration]) -> tuple[float, list[float]]:
    """The LP of the module docstring: its value and y_c per configuration (``work[i]`` is
    W of size i, in the configurations' column order)."""
    solved = covering_lp(work, configs)
    if solved is None:  # pragma: no cover - always feasible: each size has its own configuration
        raise RuntimeError("configuration LP not solved")
    return solved
