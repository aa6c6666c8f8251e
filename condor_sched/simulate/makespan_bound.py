"""A lower bound on the makespan any device policy can reach on a workload (issue 12).

Under the offload model (``offload.py``) a job never slows down by sharing: its offloads
run on their own threads. What limits a policy is how the jobs' thread requests tile a
device. Let a *configuration* be a multiset of thread requests that fits one device's
hardware threads T, and W_s the device time jobs of request s must be given:

* threads a hard limit (``thread_overcommit`` 1): a job holds its threads from start to end,
  so W_s is the summed exclusive run time of the jobs requesting s;
* threads overcommitted (COSMIC serialises offloads): only offloads hold threads, so W_s is
  the summed offload time (run time x offload fraction).

Every schedule spends, in each configuration c, some device time y_c with
sum_c n_s(c) y_c >= W_s for every s and sum_c y_c <= devices x makespan, so the LP

    minimise  sum_c y_c   s.t.  sum_c n_s(c) y_c >= W_s,  y >= 0

divided by the devices bounds the makespan from below; a configuration holds at most as
many jobs of a request as there are. It is a preemptive relaxation (a job's time may be
split between configurations, as if jobs could pause and move), and device memory,
negotiation cycles and the tail are left out, so no policy reaches it. The longest job
bounds the makespan too.
"""
from __future__ import annotations

from collections import defaultdict
from typing import Sequence

from condor_sched.simulate.workloads import SimJob

#: Distinct thread requests and configurations beyond which no bound is computed.
MAX_SIZES = 16
MAX_CONFIGURATIONS = 50_000


def _configurations(sizes: Sequence[int], jobs_of: Sequence[int], threads: int) -> list[tuple[int, ...]] | None:
    """Every non-empty count vector over ``sizes`` whose threads fit ``threads``, at most
    ``jobs_of[i]`` of size i."""
    out: list[tuple[int, ...]] = []
    counts = [0] * len(sizes)

    def extend(i: int, left: int) -> bool:
        if i == len(sizes):
            if any(counts):
                out.append(tuple(counts))
            return len(out) <= MAX_CONFIGURATIONS
        for k in range(min(left // sizes[i], jobs_of[i]) + 1):
            counts[i] = k
            if not extend(i + 1, left - k * sizes[i]):
                return False
        counts[i] = 0
        return True

    return out if extend(0, threads) else None


def makespan_lower_bound(jobs: Sequence[SimJob], devices: int, hardware_threads: int,
                         thread_overcommit: float = 1.0) -> float | None:
    """The bound of the module docstring (seconds), or None when the jobs have too many
    distinct thread requests to enumerate the configurations."""
    from ortools.linear_solver import pywraplp

    if not jobs or devices <= 0:
        return 0.0
    work: dict[int, float] = defaultdict(float)
    count: dict[int, int] = defaultdict(int)
    for job in jobs:
        share = 1.0 if thread_overcommit <= 1.0 else job.offload_fraction
        work[min(job.device_threads, hardware_threads)] += job.exclusive_runtime_s * share
        count[min(job.device_threads, hardware_threads)] += 1
    sizes = sorted(s for s in work if s > 0)
    if len(sizes) > MAX_SIZES:
        return None
    configurations = _configurations(sizes, [count[s] for s in sizes], hardware_threads)
    if configurations is None:
        return None
    solver = pywraplp.Solver.CreateSolver("GLOP")
    y = [solver.NumVar(0.0, solver.infinity(), "") for _ in configurations]
    for i, s in enumerate(sizes):
        row = solver.Constraint(work[s], solver.infinity())
        for var, c in zip(y, configurations):
            if c[i]:
                row.SetCoefficient(var, float(c[i]))
    objective = solver.Objective()
    for var in y:
        objective.SetCoefficient(var, 1.0)
    objective.SetMinimization()
    if solver.Solve() != pywraplp.Solver.OPTIMAL:  # pragma: no cover - always feasible
        raise RuntimeError("makespan bound LP not solved")
    return max(objective.Value() / devices, max(job.exclusive_runtime_s for job in jobs))
