"""An upper bound on how many jobs any device plan can place (benchmarks, ``packed``).

The *device-group LP bound*: devices equal in free capacity and hardware threads form a
group g of n_g devices; jobs equal in demand form a shape s with supply c_s. The LP

    maximise  sum_{s,g} x_{s,g}
    s.t.      sum_s a_{s,d} x_{s,g} <= n_g * C_{g,d}     for every group g, dimension d
              sum_g x_{s,g} <= c_s                      for every shape s
              0 <= x_{s,g} <= n_g * k_{s,g}

(k_{s,g}: how many jobs of shape s one device of g holds alone, 0 where s does not fit it,
e.g. more threads than the device has) is a relaxation of every device plan: the counts of
a plan satisfy all of it. With more than ``MAX_EXACT_GROUPS`` distinct free capacities
(partly used devices) a group is a device type instead, n_g C_{g,d} its summed free
capacity and k_{s,g} taken at its largest free amounts: a looser relaxation, still a bound. Its optimum, rounded down, therefore bounds the number of jobs
any plan places. It is at most the aggregate bound (jobs smallest-first in each dimension
against the sum of all devices' capacities) and often well below it, because a shape only
counts against the groups it fits.

How tight it is (issue 11): the *configuration LP*, a column per device group and feasible
device pattern (a count per shape that fits one device), is the strongest LP of this
kind, since every plan is one of its integer points. On the diverse queue of
``scripts/bench_plan`` with 900 jobs / 60 devices (seed 1) the device-group LP's value is
452.3425, and a column-generation run of the configuration LP (CP-SAT pricing, dual
smoothing; a one-off experiment, not in the code) reached a restricted-master value of
452.3397: the configuration LP lies in [452.3397, 452.3425], so no LP over device patterns
gives a bound below 452 there. CP-SAT on the exact model proves
nothing lower either (``scripts/bench_plan --gap``). The gap between plans and this bound
on such queues is integrality (the last job of each device that does not fit), which no
cheap relaxation closes; ``global``'s neighbourhood search finds plans of 449 / 448 / 426
jobs on seeds 1-3 (bounds 452 / 451 / 429), so there the bound is within 0.7% of the
optimum. On the large pools ``global`` now solves the configuration LP itself
(``columns.py``) and rounds it; its plans of 30-60 s reach 8413 of 8430 (10k / 2k) and
64027 of 64128 (100k / 10k): within 0.2%.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from condor_sched.model import Job, Slot
from condor_sched.modes.devices import capacity as dv
from condor_sched.modes.planning import PlanSettings

#: Slack for the LP solver's tolerance before rounding down (never lowers a true bound
#: by a job: the optimum of an integral plan is an integer).
LP_TOLERANCE = 1e-6
#: Most distinct (free capacity, hardware threads) groups before devices are grouped by
#: their totals (keeps the LP small on a live pool of partly used devices).
MAX_EXACT_GROUPS = 64


@dataclass(frozen=True, slots=True)
class GroupLP:
    """The device-group LP's optimum: the bound, and per (shape, group key) the LP's counts."""

    bound: int
    value: float
    counts: dict[tuple[dv.Capacity, tuple], float]


@dataclass(frozen=True, slots=True)
class DeviceGroup:
    """Devices one LP column set stands for: their summed free capacity, the largest free
    amount of any of them in each dimension, and their hardware threads."""

    members: list[Slot]
    capacity_sum: tuple[int, ...]
    capacity_max: tuple[int, ...]
    hardware_threads: int


def device_groups(slots: Sequence[Slot], caps: dict[str, Sequence[int]],
                  max_groups: int = MAX_EXACT_GROUPS) -> dict[tuple, DeviceGroup]:
    """Devices keyed by (free capacity, hardware threads), in slot order within a group. With
    more than ``max_groups`` such keys (a live pool's partly used devices) they are grouped
    by (total capacity, hardware threads) instead: still a relaxation (a group's rows hold
    its summed free capacity, a job counts as fitting it if it fits the largest amounts)."""
    keyed: dict[tuple, list[Slot]] = {}
    for s in slots:
        keyed.setdefault((tuple(caps[s.name]), s.total.device_threads), []).append(s)
    if len(keyed) > max_groups:
        keyed = {}
        for s in slots:
            keyed.setdefault((s.total, s.total.device_threads), []).append(s)
    out = {}
    for key, members in keyed.items():
        rows = [caps[s.name] for s in members]
        out[key] = DeviceGroup(members, tuple(map(sum, zip(*rows))), tuple(map(max, zip(*rows))),
                               members[0].total.device_threads)
    return out


def per_device_count(need: Sequence[int], cap: Sequence[int], hardware_threads: int) -> int:
    """How many jobs of demand ``need`` one device with ``cap`` left holds on its own."""
    if need[dv.THREADS] > hardware_threads:
        return 0
    return min([cap[d] // need[d] for d in range(dv.N_DIMENSIONS) if need[d] > 0], default=1 << 30)


def group_lp(supply: dict[dv.Capacity, int], groups: dict[tuple, DeviceGroup], fill: float = 1.0) -> GroupLP:
    """Solve the device-group LP (module docstring) with GLOP; ``fill`` < 1 scales every
    group's capacity down (``lp-pack`` selects with slack for packing; not a bound then)."""
    from ortools.linear_solver import pywraplp

    solver = pywraplp.Solver.CreateSolver("GLOP")
    x: dict[tuple[dv.Capacity, tuple], object] = {}
    per_shape: dict[dv.Capacity, list] = {}
    for key, g in groups.items():
        rows: list[list] = [[] for _ in range(dv.N_DIMENSIONS)]
        for need, c in supply.items():
            k = per_device_count(need, g.capacity_max, g.hardware_threads)
            if k <= 0 or c <= 0:
                continue
            var = solver.NumVar(0.0, float(min(c, k * len(g.members))), "")
            x[need, key] = var
            per_shape.setdefault(need, []).append(var)
            for d in range(dv.N_DIMENSIONS):
                if need[d]:
                    rows[d].append((need[d], var))
        for d in range(dv.N_DIMENSIONS):
            if rows[d]:
                ct = solver.Constraint(-solver.infinity(), fill * float(g.capacity_sum[d]))
                for a, var in rows[d]:
                    ct.SetCoefficient(var, float(a))
    if not x:
        return GroupLP(0, 0.0, {})
    for need, vars_ in per_shape.items():
        if len(vars_) > 1:
            ct = solver.Constraint(-solver.infinity(), float(supply[need]))
            for var in vars_:
                ct.SetCoefficient(var, 1.0)
    objective = solver.Objective()
    for var in x.values():
        objective.SetCoefficient(var, 1.0)
    objective.SetMaximization()
    if solver.Solve() != pywraplp.Solver.OPTIMAL:  # pragma: no cover - a bounded LP with 0 feasible
        raise RuntimeError("device-group LP not solved to optimality")
    value = objective.Value()
    return GroupLP(int(value + LP_TOLERANCE), value, {k: v.solution_value() for k, v in x.items()})


def placed_upper_bound(jobs: Sequence[Job], slots: Sequence[Slot], settings: PlanSettings) -> int:
    """The device-group LP bound (module docstring) on the jobs any plan places on the free
    capacity of ``slots``: idle device jobs, device slots, as the device policies see them."""
    considered = dv.device_jobs(jobs)
    dslots = dv.device_slots(slots)
    caps = {s.name: list(dv.free_capacity(s, settings)) for s in dslots}
    supply: dict[dv.Capacity, int] = {}
    for job in considered:
        need = dv.demand(job, settings)
        supply[need] = supply.get(need, 0) + 1
    return group_lp(supply, device_groups(dslots, caps)).bound


def aggregate_upper_bound(jobs: Sequence[Job], slots: Sequence[Slot], settings: PlanSettings) -> int:
    """The weaker aggregate bound: in each dimension, how many jobs fit the sum of all free
    capacities taking the smallest demands first; the least over dimensions (a job fitting
    no device is not counted)."""
    considered = dv.device_jobs(jobs)
    dslots = dv.device_slots(slots)
    caps = [dv.free_capacity(s, settings) for s in dslots]
    kinds = {(tuple(c), s.total.device_threads) for c, s in zip(caps, dslots)}
    needs = [dv.demand(j, settings) for j in considered]
    needs = [n for n in needs if any(per_device_count(n, c, hw) > 0 for c, hw in kinds)]
    best = len(needs)
    for d in range(dv.N_DIMENSIONS):
        room, count = sum(c[d] for c in caps), 0
        for a in sorted(n[d] for n in needs):
            if a > room:
                break
            room -= a
            count += 1
        best = min(best, count)
    return best
