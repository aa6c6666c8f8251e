"""Large-neighbourhood search over a device plan: a few devices re-packed exactly at a time.

``global`` (issue 11) ends with this on pools of more than ``NEIGHBOURHOOD_DEVICES``
devices, where one exact CP-SAT model of the whole pool finds little within a limit. A *step* takes ``NEIGHBOURHOOD_DEVICES`` devices, frees
their jobs, and lets CP-SAT choose the most jobs those devices can hold from the freed jobs
and every unplaced one (a count per shape and device; threads, cpus, host memory and
device memory hard, as in the full model). The devices are drawn with probability
proportional to their unused shares of device memory and threads (where a job is lost),
from a generator seeded with ``settings.seed`` (on the diverse queues of
``scripts/bench_plan`` in 10 s this placed 0-2 jobs more than drawing all but the first
device uniformly).

A step's answer replaces the devices' jobs when it holds more jobs, or as many jobs that
are larger (the summed shares of device memory and threads of the devices they are on).
The second rule is what makes the search go on past the first local optimum: among plans
placing equally many jobs, the one whose devices hold the large jobs leaves the small ones
unplaced, and a small unplaced job fits the room another step frees (measured on the
diverse 900 / 60 queue of ``scripts/bench_plan``, seed 1: accepting on the count alone
stops at 446 of a bound of 452 in 90 s; with larger-jobs moves it reached 448). Those
sideways moves may lower the Eq. 1 tie-break, so the plan returned is the best by (jobs
placed, Eq. 1 sum) among those the search passed through, never worse than its start.

In wall-clock mode up to ``MAX_PARALLEL_STEPS`` steps (one per core) run side by side on
disjoint devices, each from the same unplaced jobs; their answers are applied in turn, and
one that would take an unplaced job an earlier one took is dropped.

No time is lost on a plan that is already optimal: the search stops at ``target`` (the
device-group LP bound), or after ``STALL_ROUNDS`` rounds of steps without an accepted one
(a local optimum of these neighbourhoods; the simulator's Table I pools end there). With
``settings.deterministic`` each step has a deterministic CP-SAT limit and the steps are
counted against the deterministic budget, so no clock decides anything.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import itertools
import os
import random
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Sequence


from condor_sched.model import Slot
from condor_sched.modes.devices import capacity as dv
from condor_sched.modes.planning import PlanSettings, cp_sat_solver

if TYPE_CHECKING:  # imported where used: ortools.sat loads pandas (0.3 s at every command's start)
    from ortools.sat.python import cp_model

#: Devices re-packed together per step (3 was best of 2, 3, 4, 5 and 8 on diverse 900 / 60).
NEIGHBOURHOOD_DEVICES = 3
#: Most time (wall or deterministic) a step's CP-SAT may take.
STEP_LIMIT_S = 0.05
#: A step is not started with less wall time than this left.
MIN_STEP_S = 0.02
#: A job's share of a device (memory plus threads, at most 2) in the step objective's units.
SIZE_SCALE = 100
#: CP-SAT workers per step: a step's model is small, and one worker solves it fastest.
STEP_WORKERS = 1
#: Steps solved side by side (threads; CP-SAT releases the GIL) on disjoint devices, at
#: most one per core; one in deterministic mode.
MAX_PARALLEL_STEPS = 4
#: Steps at most in deterministic mode per deterministic second of budget (a floor for
#: steps that report no deterministic time).
DETERMINISTIC_STEPS_PER_S = 200
#: The search stops after this many rounds (steps covering every device once on average)
#: in a row without an accepted step: the plan is a local optimum of the neighbourhoods.
STALL_ROUNDS = 3
#: Weighted draws per device of a step before the rest are drawn uniformly.
DRAWS_PER_DEVICE = 8
#: Weight of a device with no unused room in the draws.
FULL_DEVICE_WEIGHT = 1e-3

Counts = dict[dv.Capacity, int]


@dataclass
class SearchResult:
    """The best plan the search passed through, per device its count per shape."""

    on_device: dict[str, Counts]
    steps: int = 0
    accepted: int = 0
    gained: int = 0


def _share(need: Sequence[int], cap: Sequence[int]) -> float:
    """A job's size on a device: its shares of the device's memory and threads."""
    return sum(need[d] / cap[d] for d in (dv.MEMORY, dv.THREADS) if cap[d] > 0)


def _slack(counts: Counts, cap: Sequence[int]) -> float:
    """A device's unused shares of memory and threads (the draw's weight)."""
    used = [0] * dv.N_DIMENSIONS
    for need, n in counts.items():
        for d in range(dv.N_DIMENSIONS):
            used[d] += n * need[d]
    return FULL_DEVICE_WEIGHT + sum((cap[d] - used[d]) / cap[d] for d in (dv.MEMORY, dv.THREADS) if cap[d] > 0)


def _eq1_sum(on_device: dict[str, Counts], hardware_threads: dict[str, int]) -> int:
    return sum(n * dv.scaled_value(need.device_threads, hardware_threads[name])
               for name, counts in on_device.items() for need, n in counts.items())


def _useful_unplaced(names: Sequence[str], unplaced: Counts, caps: dict[str, list[int]],
                     hardware_threads: dict[str, int]) -> Counts:
    """The unplaced jobs a step may need: per class (equal demand but device memory), the
    smallest-memory ones, as many as the devices could hold of that class. A plan using a
    larger job of a class where a smaller one is left can swap them, so nothing is lost
    for the count, and the model is a fraction of the size (same argument as
    ``global_cpsat._restricted_supply``)."""
    by_class: dict[dv.ShapeClass, list[dv.Capacity]] = {}
    for need, n in unplaced.items():
        if n:
            by_class.setdefault(need.shape_class, []).append(need)
    out: Counts = {}
    for members in by_class.values():
        members.sort()
        smallest = members[0]
        room = 0
        for name in names:
            if smallest.device_threads <= hardware_threads[name]:
                room += min([caps[name][d] // smallest[d] for d in range(dv.N_DIMENSIONS) if smallest[d] > 0],
                            default=0)
        for need in members:
            if room <= 0:
                break
            take = min(room, unplaced[need])
            out[need] = take
            room -= take
    return out


def count_model(supply: Counts, names: Sequence[str], caps: dict[str, list[int]], hardware_threads: dict[str, int]
                ) -> tuple[cp_model.CpModel, dict[tuple[dv.Capacity, str], cp_model.IntVar]]:
    """A device plan as CP-SAT sees it: a count per (shape, device), each device's free
    capacity in every dimension and its hardware threads, each shape's supply; no objective."""
    from ortools.sat.python import cp_model

    model = cp_model.CpModel()
    x: dict[tuple[dv.Capacity, str], cp_model.IntVar] = {}
    per_shape: dict[dv.Capacity, list] = {}
    for name in names:
        cap = caps[name]
        rows: list[list] = [[] for _ in range(dv.N_DIMENSIONS)]
        for need, n in supply.items():
            if need.device_threads > hardware_threads[name]:
                continue
            most = min([n] + [cap[d] // need[d] for d in range(dv.N_DIMENSIONS) if need[d] > 0])
            if most <= 0:
                continue
            var = model.new_int_var(0, most, "")
            x[need, name] = var
            per_shape.setdefault(need, []).append(var)
            for d in range(dv.N_DIMENSIONS):
                if need[d]:
                    rows[d].append(need[d] * var)
        for d in range(dv.N_DIMENSIONS):
            if rows[d]:
                model.add(sum(rows[d]) <= cap[d])
    for need, vars_ in per_shape.items():
        if len(vars_) > 1:
            model.add(sum(vars_) <= supply[need])
    return model, x


def _repack(names: Sequence[str], on_device: dict[str, Counts], unplaced: Counts, caps: dict[str, list[int]],
            hardware_threads: dict[str, int], settings: PlanSettings, limit_s: float
            ) -> tuple[dict[str, Counts] | None, float]:
    """The most jobs ``names`` can hold from their own and the unplaced ones, at least as
    many as now (hinted with the current plan); None if CP-SAT found nothing in time. Also
    the step's deterministic time."""
    from ortools.sat.python import cp_model

    supply = _useful_unplaced(names, unplaced, caps, hardware_threads)
    for name in names:
        for need, n in on_device[name].items():
            supply[need] = supply.get(need, 0) + n
    model, x = count_model(supply, names, caps, hardware_threads)
    for (need, name), var in x.items():
        model.add_hint(var, on_device[name].get(need, 0))
    count = sum(x.values())
    model.add(count >= sum(sum(on_device[name].values()) for name in names))
    # most jobs first; among those, the largest (module docstring)
    most = sum(v.proto.domain[-1] for v in x.values()) + 1
    model.maximize(most * SIZE_SCALE * 2 * count
                   + sum(round(SIZE_SCALE * _share(need, caps[name])) * var for (need, name), var in x.items()))
    solver = cp_sat_solver(settings, limit_s)
    solver.parameters.num_workers = STEP_WORKERS
    status = solver.solve(model)
    spent = solver.response_proto.deterministic_time
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return None, spent
    out: dict[str, Counts] = {name: {} for name in names}
    for (need, name), var in x.items():
        n = int(solver.value(var))
        if n:
            out[name][need] = n
    return out, spent


def step_limit(settings: PlanSettings, spent: float, budget: float, steps: int, max_steps: int, deadline: float,
               most: float, least_wall: float) -> float | None:
    """The CP-SAT limit of a search's next step, at most ``most``: in deterministic mode
    what is left of ``budget`` after ``spent`` (None once it or ``max_steps`` is used up),
    else the wall time left to ``deadline`` (None below ``least_wall``)."""
    if settings.deterministic:
        if spent >= budget or steps >= max_steps:
            return None
        return min(most, budget - spent)
    left = deadline - time.perf_counter()
    return None if left < least_wall else min(most, left)


def _draw(rng: random.Random, weights: list[float], k: int) -> list[int]:
    """``k`` distinct indices drawn by weight (uniformly once the draws keep repeating)."""
    cum = list(itertools.accumulate(weights))
    picked: list[int] = []
    for i in rng.choices(range(len(weights)), cum_weights=cum, k=DRAWS_PER_DEVICE * k):
        if i not in picked:
            picked.append(i)
            if len(picked) == k:
                return picked
    rest = [i for i in range(len(weights)) if i not in picked]
    return picked + rng.sample(rest, k - len(picked))


def improve(on_device: dict[str, Counts], unplaced: Counts, slots: Sequence[Slot], caps: dict[str, list[int]],
            settings: PlanSettings, deadline: float, target: int) -> SearchResult:
    """Search from ``on_device`` (per device name, count per shape; ``unplaced`` the shapes
    left) until ``deadline`` (``time.perf_counter``; in deterministic mode the budget is
    ``settings.solver_time_limit_s`` of deterministic time instead) or ``target`` jobs placed."""
    names = [s.name for s in slots]
    hardware_threads = {s.name: s.total.device_threads for s in slots}
    current = {name: dict(on_device.get(name, {})) for name in names}
    unplaced = {need: n for need, n in unplaced.items() if n}
    start = placed = sum(sum(c.values()) for c in current.values())
    value = _eq1_sum(current, hardware_threads)
    result = SearchResult(current)
    if len(names) < 2 or placed >= target or not unplaced:
        return result
    best_key = (placed, value)
    undo: list[tuple[str, Counts]] = []  # devices' counts before each move since the best plan
    rng = random.Random(settings.seed)
    weights = [_slack(current[name], caps[name]) for name in names]
    index = {name: i for i, name in enumerate(names)}
    k = min(NEIGHBOURHOOD_DEVICES, len(names))
    parallel = 1 if settings.deterministic else max(1, min(MAX_PARALLEL_STEPS, os.cpu_count() or 1, len(names) // k))
    budget = settings.solver_time_limit_s
    max_steps = max(1, int(budget * DETERMINISTIC_STEPS_PER_S))
    spent = 0.0
    stall_limit = STALL_ROUNDS * -(-len(names) // k)
    since_accepted = 0

    def accept(chosen: list[str], answer: dict[str, Counts]) -> bool:
        """Apply a step's answer if it is a better or larger-jobs plan of its devices and
        the unplaced jobs it takes are still unplaced (a parallel step may have taken them)."""
        nonlocal placed, value
        before = sum(sum(current[n].values()) for n in chosen)
        after = sum(sum(answer[n].values()) for n in chosen)
        if after == before:
            size_before = sum(c * _share(need, caps[n]) for n in chosen for need, c in current[n].items())
            size_after = sum(c * _share(need, caps[n]) for n in chosen for need, c in answer[n].items())
            if size_after <= size_before + 1e-9:
                return False
        taken: Counts = {}
        for name in chosen:
            for need, n in answer[name].items():
                taken[need] = taken.get(need, 0) + n
            for need, n in current[name].items():
                taken[need] = taken.get(need, 0) - n
        if any(n > unplaced.get(need, 0) for need, n in taken.items()):
            return False
        for need, n in taken.items():
            left = unplaced.get(need, 0) - n
            if left:
                unplaced[need] = left
            else:
                unplaced.pop(need, None)
        for name in chosen:
            value += _eq1_sum({name: answer[name]}, hardware_threads) - _eq1_sum({name: current[name]}, hardware_threads)
            undo.append((name, current[name]))
            current[name] = answer[name]
            weights[index[name]] = _slack(answer[name], caps[name])
        placed += after - before
        return True

    def step(chosen: list[str]) -> tuple[dict[str, Counts] | None, float]:
        return _repack(chosen, current, unplaced, caps, hardware_threads, settings, limit)

    with ThreadPoolExecutor(parallel) if parallel > 1 else nullcontext() as pool:
        while placed < target and unplaced and since_accepted < stall_limit:
            limit = step_limit(settings, spent, budget, result.steps, max_steps, deadline, STEP_LIMIT_S, MIN_STEP_S)
            if limit is None:
                break
            drawn = [names[i] for i in _draw(rng, weights, k * parallel)]
            steps = [drawn[j : j + k] for j in range(0, len(drawn), k)]
            answers = list((pool.map if pool is not None else map)(step, steps))
            for chosen, (answer, step_time) in zip(steps, answers):
                result.steps += 1
                since_accepted += 1
                spent += step_time
                if answer is not None and accept(chosen, answer):
                    result.accepted += 1
                    since_accepted = 0
                    if (placed, value) > best_key:
                        best_key = (placed, value)
                        undo.clear()
    for name, counts in reversed(undo):  # back to the best plan passed through
        current[name] = counts
    result.gained = best_key[0] - start
    return result
