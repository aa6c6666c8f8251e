"""How little GPU any policy could leave unallocated: a cutting-stock LP bound (issue 13).

When the arrived requests reach the capacity C = 1000 G (the inflation protocol's 100%
point, G GPUs), the unallocated compute is exactly what the tasks left unplaced request,
less the last arrival's overshoot past C. Placed tasks must fit G GPUs: a share (< 1000
thousandths) fits a GPU only beside shares summing to at most 1000, a whole-GPU task takes a
GPU alone. So with the arrived tasks' GPU requests as items (a share of size s, a whole GPU
of size 1000, a task of g whole GPUs as g items of 1000), any policy leaves at least

    min  sum_s s * d_s - overshoot
    s.t. sum_p a_sp * x_p >= n_s - d_s,   sum_p x_p <= G,   0 <= d_s <= n_s,  x_p >= 0

unallocated, where p runs over the packings of item sizes into one GPU (a_sp items of size
s), n_s counts the arrived items of size s and d_s those left unplaced. The LP relaxes every
other constraint (CPU, memory, GPU models, nodes, arrival order, a multi-GPU task's GPUs
staying together), so no policy, online or with every task known, leaves less.
"""
from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from condor_sched.modes.gpus.fleet import WHOLE_GPU_MILLI, GpuTask

#: Distinct request sizes the bound enumerates packings of (the openb lists have about 20).
MAX_SHARE_SIZES = 40


def one_gpu_packings(sizes: Sequence[int], capacity: int = WHOLE_GPU_MILLI) -> list[tuple[int, ...]]:
    """Every non-empty multiset of ``sizes`` (as counts per size) that fits one GPU."""
    out: list[tuple[int, ...]] = []
    counts: list[int] = []

    def extend(i: int, left: int) -> None:
        if i == len(sizes):
            if any(counts):
                out.append(tuple(counts))
            return
        for k in range(left // sizes[i] + 1):
            counts.append(k)
            extend(i + 1, left - k * sizes[i])
            counts.pop()

    extend(0, capacity)
    return out


def unallocated_lower_bound_milli(arrived: Sequence[GpuTask], capacity_milli: int) -> float:
    """The LP bound of the module docstring, in thousandths of a GPU, for the tasks that had
    arrived when the requests reached ``capacity_milli`` (1000 per GPU)."""
    from ortools.linear_solver import pywraplp

    items: Counter[int] = Counter()
    for task in arrived:
        if task.gpus:
            items[task.gpu_milli] += task.gpus if task.gpu_milli == WHOLE_GPU_MILLI else 1
    overshoot = max(0, sum(t.gpu_milli_total for t in arrived) - capacity_milli)
    if not items:
        return 0.0
    if len(items) > MAX_SHARE_SIZES:
        raise ValueError(f"{len(items)} distinct request sizes; the bound enumerates at most {MAX_SHARE_SIZES}")
    sizes = sorted(items, reverse=True)
    packings = one_gpu_packings(sizes)
    solver = pywraplp.Solver.CreateSolver("GLOP")
    used = [solver.NumVar(0, solver.infinity(), f"p{i}") for i in range(len(packings))]
    dropped = [solver.NumVar(0, items[s], f"d{s}") for s in sizes]
    for i, size in enumerate(sizes):
        solver.Add(sum(p[i] * x for p, x in zip(packings, used) if p[i]) >= items[size] - dropped[i])
    solver.Add(sum(used) <= capacity_milli / WHOLE_GPU_MILLI)
    solver.Minimize(sum(s * d for s, d in zip(sizes, dropped)) - overshoot)
    if solver.Solve() != pywraplp.Solver.OPTIMAL:
        raise RuntimeError("the packing bound's LP did not solve")
    return max(0.0, solver.Objective().Value())


def lower_bound_pct_at_100(tasks: Sequence[GpuTask], capacity_milli: int, seed: int, inflation_pct: float = 130) -> float:
    """The bound (% of capacity) for the arrivals of the inflation protocol with ``seed``
    (:func:`condor_sched.simulate.openb.inflate`, as ``run_inflation`` draws them) up to the
    first arrival that brings the requests to the capacity."""
    import numpy as np

    from condor_sched.simulate.openb import inflate

    arrivals = inflate(list(tasks), capacity_milli, np.random.default_rng(seed), inflation_pct)
    total, arrived = 0, []
    for task in arrivals:
        arrived.append(task)
        total += task.gpu_milli_total
        if total >= capacity_milli:
            break
    return unallocated_lower_bound_milli(arrived, capacity_milli) / capacity_milli * 100
