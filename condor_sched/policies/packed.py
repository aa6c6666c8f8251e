"""``lp-pack``: paper 002's aim (most jobs placed) by LP-guided packing, fast at any size.

MCCK (``knapsack``, Fig. 4 of paper 002) solves an exact knapsack per device in turn; on
queues of many shapes each knapsack costs tenths of a second and the greedy order is
myopic (the first devices take all the small jobs, later ones are left with big ones that
waste threads). This policy trades per-device exactness for a cluster-wide view:

1. *select*: the device-group LP of ``bounds.py``, with every group's capacity scaled by a
   fill factor f (f < 1 leaves slack for packing), says how many jobs of each shape to place
   on each group of equal devices;
2. *pack*, one of three ways: ``deal`` (each group's selected jobs, largest dominant share
   first, dealt one per device a round to the devices with most room left after them, so
   equal devices end near the LP's average load in every dimension); best-fit decreasing
   (``bfd``: the selection over all devices, each shape in one batch onto the fitting
   devices with least room left); or device by device (Fig. 4's order) the selected job
   best aligned with the device's free capacity (``dot``, largest dot product of shares);
3. *fill*: every job still unplaced, smallest dominant share first, best-fit onto any
   device it fits;
4. *repair* (a local search, one job more per move): an unplaced job gets room on a device
   by moving one of its jobs to another device, or by replacing one of its jobs with two
   unplaced ones; repaired are every candidate on small pools, the three best on large
   ones, within a fixed work budget.

A last candidate, on pools of up to ``MCCK_MAX_DEVICES`` devices, is Fig. 4's greedy itself
(``mcck``, exact MCCK there). The plan placing most jobs (then the larger Eq. 1 sum, then
the first candidate) is kept. Within a shape the oldest jobs go first.
Deviations from paper 002: the LP-guided candidates solve no per-device knapsack; Eq. 1 is
the ``mcck`` knapsacks' second criterion, as in ``knapsack``, and the tie-break between
candidates. The aging rule of ``devices.py`` runs first, as for every device policy. No
clock or randomness decides anything (the repair's budget counts work, not time).

Why it is the sidecar's default (``settings.SidecarSettings.policy``, issue 11): exact MCCK
takes seconds per cycle on shape-diverse queues (10k jobs on 2k devices: 4-5 s) and
places fewer jobs there; this plans them within 1 s and 100k jobs on 10k devices within
10 s, and on pools of up to 100 devices its ``mcck`` candidate *is* exact MCCK, so it never
places fewer jobs than ``knapsack`` there. ``knapsack`` stays registered
unchanged, for reproducing paper 002.
"""
from __future__ import annotations

import time
from collections import deque
from typing import Sequence

import numpy as np

from condor_sched.model import Job, Plan, Slot
from condor_sched.policies import devices as dv
from condor_sched.policies.base import PlanRequest, PlanSettings, PolicyKind, register
from condor_sched.policies.bounds import device_groups, group_lp
from condor_sched.policies.knapsack import MAX_DP_CELLS, JobPool, greedy_fill, prepare

#: (fill factor, packing) tried; ``dot`` only up to ``DOT_MAX_CELLS`` shapes x devices.
CANDIDATES: tuple[tuple[float, str], ...] = (
    (1.0, "deal"), (0.97, "deal"), (0.95, "deal"), (0.92, "bfd"), (0.0, "mcck"), (0.9, "dot"),
)
DOT_MAX_CELLS = 300_000
#: Work budget of the repair pass (device-fit checks, each a numpy pass over the devices
#: divided by ``REPAIR_ROWS_PER_CHECK`` rows): deterministic, whatever the machine.
REPAIR_BUDGET = 4_000_000
REPAIR_ROWS_PER_CHECK = 64
#: Devices the repair pass tries per unplaced shape (least missing room first).
REPAIR_DEVICES_PER_SHAPE = 24
#: Candidates repaired on large pools (best first); every one on small pools.
REPAIRED_CANDIDATES = 3
#: DP states per device knapsack of the ``mcck`` candidate: ``MCCK_CELL_BUDGET`` over the
#: devices, at least ``MCCK_MIN_CELLS``, at most ``knapsack.MAX_DP_CELLS`` (exact MCCK, the
#: ``knapsack`` plan itself, on pools of up to 100 devices).
MCCK_CELL_BUDGET = 400_000_000
#: The ``mcck`` candidate runs on pools of up to this many devices only (where it is exact
#: MCCK; beyond, the ``deal`` candidates placed more on every benchmark queue).
MCCK_MAX_DEVICES = 100
MCCK_MIN_CELLS = 200_000


def _best_fit_batch(
    need: Sequence[int], count: int, residual: np.ndarray, scale: np.ndarray, hardware_threads: np.ndarray
) -> list[tuple[int, int]]:
    """Up to ``count`` jobs of demand ``need`` best-fit onto the rows of ``residual``
    (updated in place): (row, jobs) pairs. Best fit = least scaled room left after one job."""
    a = np.asarray(need, dtype=np.int64)
    per = np.full(len(residual), 1 << 30, dtype=np.int64)
    for d in range(dv.N_DIMENSIONS):
        if a[d] > 0:
            per = np.minimum(per, residual[:, d] // a[d])
    per[hardware_threads < a[dv.THREADS]] = 0
    rows = np.flatnonzero(per > 0)
    if not len(rows) or count <= 0:
        return []
    room = ((residual[rows] - a) * scale[rows]).sum(axis=1)
    rows = rows[np.argsort(room, kind="stable")]
    takes = per[rows]
    cum = np.cumsum(takes)
    last = int(np.searchsorted(cum, count))
    if last < len(rows):
        takes = takes[: last + 1].copy()
        takes[-1] -= cum[last] - count
        rows = rows[: last + 1]
    out = []
    for r, t in zip(rows.tolist(), takes.tolist()):
        if t > 0:
            residual[r] -= a * t
            out.append((r, t))
    return out


def _worst_fit_batch(
    need: Sequence[int], count: int, residual: np.ndarray, scale: np.ndarray, hardware_threads: np.ndarray
) -> list[tuple[int, int]]:
    """Up to ``count`` jobs of demand ``need`` dealt at most one per device a round to the
    fitting rows of ``residual`` (updated in place) with the most room left after it (the
    least scaled free dimension): spreads a shape evenly over identical devices, so each ends
    near the LP's average load in every dimension. (row, jobs) pairs."""
    a = np.asarray(need, dtype=np.int64)
    taken = np.zeros(len(residual), dtype=np.int64)
    while count > 0:
        rows = np.flatnonzero((residual >= a).all(axis=1) & (hardware_threads >= a[dv.THREADS]))
        if not len(rows):
            break
        room = ((residual[rows] - a) * scale[rows]).min(axis=1)
        rows = rows[np.argsort(-room, kind="stable")][:count]
        residual[rows] -= a
        taken[rows] += 1
        count -= len(rows)
    return [(r, int(taken[r])) for r in np.flatnonzero(taken).tolist()]


def _dot_fill(
    shapes: list[dv.Capacity], counts: np.ndarray, residual: np.ndarray, scale: np.ndarray,
    hardware_threads: np.ndarray,
) -> list[tuple[int, int]]:
    """Device by device, the shape (with ``counts`` left) that fits and is best aligned with
    the device's free capacity, until none fits: (row, shape index) per job placed."""
    demand = np.array(shapes, dtype=np.int64).reshape(-1, dv.N_DIMENSIONS)
    out = []
    for i in range(len(residual)):
        r = residual[i]
        allowed = (counts > 0) & (demand[:, dv.THREADS] <= hardware_threads[i])
        while True:
            ok = allowed & (demand <= r).all(axis=1)
            idx = np.flatnonzero(ok)
            if not len(idx):
                break
            k = int(idx[np.argmax((demand[idx] * scale[i]) @ (r * scale[i]))])
            r -= demand[k]
            counts[k] -= 1
            if counts[k] == 0:
                allowed[k] = False
            out.append((i, k))
    return out


def _coarse_mcck(
    rest: Sequence[Job], slots: list[Slot], caps: dict[str, list[int]], settings: PlanSettings,
    deadline: float | None = None,
) -> list[tuple[Job, Slot, dv.Capacity]]:
    """Fig. 4's greedy with a per-device DP of at most ``MCCK_CELL_BUDGET / devices`` states
    (stopped at ``deadline`` with a partial plan, ``global`` only)."""
    state = dv.DeviceState(list(slots), {k: list(v) for k, v in caps.items()}, set(), [], {})
    cells = min(MAX_DP_CELLS, max(MCCK_MIN_CELLS, MCCK_CELL_BUDGET // max(1, len(slots))))
    greedy_fill(JobPool.build(rest, settings), state, settings, deadline=deadline, max_cells=cells,
                reuse_inexact=True)
    by_key = {j.key: j for j in rest}
    by_name = {s.name: s for s in slots}
    return [(by_key[a.job], by_name[a.slot], dv.demand(by_key[a.job], settings)) for a in state.assignments]


def _candidate(
    fill: float, packing: str, rest: Sequence[Job], slots: list[Slot], caps: dict[str, list[int]],
    settings: PlanSettings, deadline: float | None = None,
) -> list[tuple[Job, Slot, dv.Capacity]]:
    """One (fill, packing) plan of the module docstring over the open devices ``slots``."""
    if packing == "mcck":
        return _coarse_mcck(rest, slots, caps, settings, deadline)
    shapes: dict[dv.Capacity, deque[Job]] = {}
    for job in rest:  # oldest first
        shapes.setdefault(dv.demand(job, settings), deque()).append(job)
    groups = device_groups(slots, caps)
    lp = group_lp({k: len(v) for k, v in shapes.items()}, groups, fill)
    ordered = [s for g in groups.values() for s in g.members]
    if packing == "dot":
        ordered = sorted(ordered, key=lambda s: s.name)
    residual = np.array([caps[s.name] for s in ordered], dtype=np.int64).reshape(-1, dv.N_DIMENSIONS)
    hardware_threads = np.array([s.total.device_threads for s in ordered], dtype=np.int64)
    totals = np.maximum(residual, 1).astype(float)
    scale = 1.0 / totals
    grand = totals.sum(axis=0)
    out: list[tuple[Job, Slot, dv.Capacity]] = []

    def share(need: Sequence[int]) -> float:
        return max(a / c for a, c in zip(need, grand))

    selected: dict[dv.Capacity, int] = {}
    for (need, _), x in lp.counts.items():
        selected[need] = selected.get(need, 0) + x
    chosen = {n: min(len(shapes[n]), int(x + 1e-6)) for n, x in selected.items()}
    if packing == "deal":
        start = 0
        for key, group in groups.items():
            end = start + len(group.members)
            part = {need: min(len(shapes[need]), int(x + 1e-6)) for (need, k), x in lp.counts.items() if k == key}
            for need in sorted(part, key=lambda n: (-share(n), n)):
                for row, t in _worst_fit_batch(need, part[need], residual[start:end], scale[start:end],
                                               hardware_threads[start:end]):
                    out += [(shapes[need].popleft(), ordered[start + row], need) for _ in range(t)]
            start = end
    elif packing == "dot":
        names = sorted(chosen, key=lambda n: (share(n), n))
        counts = np.array([chosen[n] for n in names], dtype=np.int64)
        for row, k in _dot_fill(names, counts, residual, scale, hardware_threads):
            out.append((shapes[names[k]].popleft(), ordered[row], names[k]))
    else:
        for need in sorted(chosen, key=lambda n: (-share(n), n)):
            for row, t in _best_fit_batch(need, chosen[need], residual, scale, hardware_threads):
                out += [(shapes[need].popleft(), ordered[row], need) for _ in range(t)]
    for need in sorted((n for n, q in shapes.items() if q), key=lambda n: (share(n), n)):
        for row, t in _best_fit_batch(need, len(shapes[need]), residual, scale, hardware_threads):
            out += [(shapes[need].popleft(), ordered[row], need) for _ in range(t)]
    return out


def _repair(
    plan: list[tuple[Job, Slot, dv.Capacity]], rest: Sequence[Job], slots: list[Slot], caps: dict[str, list[int]],
    settings: PlanSettings, deadline: float | None = None,
) -> list[tuple[Job, Slot, dv.Capacity]]:
    """Local improvement of a plan, one job more per move (a multiple-knapsack neighbourhood):
    for each unplaced shape, smallest dominant share first, on the devices missing least room
    for it, a placed job j whose removal makes room either *moves* to another device it fits
    (best fit) or is *swapped* for two unplaced jobs (this one and the smallest other that
    fit). Work is capped by ``REPAIR_BUDGET`` (and by ``deadline``, ``global`` only: the moves
    made so far are kept). Jobs of a shape are interchangeable: the plan is rebuilt from the
    per-device shape counts, oldest jobs first."""
    row_of = {s.name: i for i, s in enumerate(slots)}
    residual = np.array([caps[s.name] for s in slots], dtype=np.int64).reshape(-1, dv.N_DIMENSIONS)
    scale = 1.0 / np.maximum(residual, 1)
    grand = np.maximum(residual.sum(axis=0), 1)
    hardware_threads = np.array([s.total.device_threads for s in slots], dtype=np.int64)
    on: list[dict[dv.Capacity, int]] = [{} for _ in slots]
    unplaced: dict[dv.Capacity, int] = {}
    for job in rest:
        need = dv.demand(job, settings)
        unplaced[need] = unplaced.get(need, 0) + 1
    for _, slot, need in plan:
        r = row_of[slot.name]
        on[r][need] = on[r].get(need, 0) + 1
        residual[r] -= need
        unplaced[need] -= 1

    share = {n: float(max(a / c for a, c in zip(n, grand))) for n in unplaced}
    order = sorted(unplaced, key=lambda n: (share[n], n))
    demand = np.array(order, dtype=np.int64).reshape(-1, dv.N_DIMENSIONS)
    left = np.array([unplaced[n] for n in order], dtype=np.int64)
    index = {n: i for i, n in enumerate(order)}
    budget = REPAIR_BUDGET
    check_cost = 1 + len(slots) // REPAIR_ROWS_PER_CHECK
    gained = 0
    #: shape -> ``gained`` when it last fitted no device: no residual has grown since.
    fits_nowhere: dict[dv.Capacity, int] = {}

    def fits_on(a: np.ndarray, r: int) -> bool:
        return bool((residual[r] >= a).all() and hardware_threads[r] >= a[dv.THREADS])

    def put(r: int, need: dv.Capacity, n: int) -> None:
        on[r][need] = on[r].get(need, 0) + n
        if not on[r][need]:
            del on[r][need]
        residual[r] -= np.asarray(need, dtype=np.int64) * n

    for u, a_u in zip(order, demand):
        if deadline is not None and time.perf_counter() > deadline:
            break
        while left[index[u]] > 0 and budget > 0 and (deadline is None or time.perf_counter() <= deadline):
            deficit = np.maximum(a_u - residual, 0)
            usable = np.flatnonzero(hardware_threads >= a_u[dv.THREADS])
            missing = (deficit[usable] * scale[usable]).sum(axis=1)
            if len(usable) > REPAIR_DEVICES_PER_SHAPE:
                nearest = np.argpartition(missing, REPAIR_DEVICES_PER_SHAPE)[:REPAIR_DEVICES_PER_SHAPE]
                usable, missing = usable[nearest], missing[nearest]
            tried = usable[np.lexsort((usable, missing))]
            done = False
            for d in tried.tolist():
                if not deficit[d].any():
                    put(d, u, 1)
                    done = True
                    break
                for j in sorted(on[d], key=lambda n: (share[n], n)):
                    a_j = np.asarray(j, dtype=np.int64)
                    if not (a_j >= deficit[d]).all():
                        continue
                    others = np.empty(0, dtype=np.int64)
                    if fits_nowhere.get(j) != gained:
                        budget -= check_cost
                        fits = (residual >= a_j).all(axis=1) & (hardware_threads >= a_j[dv.THREADS])
                        fits[d] = False
                        others = np.flatnonzero(fits)
                        if not len(others) and not fits_on(a_j, d):
                            fits_nowhere[j] = gained
                    if len(others):
                        e = int(others[np.argmin(((residual[others] - a_j) * scale[others]).sum(axis=1))])
                        put(d, j, -1)
                        put(e, j, 1)
                        put(d, u, 1)
                        done = True
                        break
                    room = residual[d] + a_j - a_u
                    avail = left.copy()
                    avail[index[u]] -= 1
                    ok = np.flatnonzero((avail > 0) & (demand <= room).all(axis=1)
                                        & (demand[:, dv.THREADS] <= hardware_threads[d]))
                    if len(ok):
                        second = order[int(ok[0])]
                        put(d, j, -1)
                        left[index[j]] += 1
                        put(d, u, 1)
                        put(d, second, 1)
                        left[index[second]] -= 1
                        done = True
                        break
                if done:
                    break
            if not done:
                break
            left[index[u]] -= 1
            gained += 1
    if not gained:
        return plan
    queues: dict[dv.Capacity, deque[Job]] = {}
    for job in rest:  # oldest first
        queues.setdefault(dv.demand(job, settings), deque()).append(job)
    return [(queues[need].popleft(), slot, need)
            for slot, counts in zip(slots, on) for need in sorted(counts) for _ in range(counts[need])]


def _score(plan: list[tuple[Job, Slot, dv.Capacity]]) -> tuple[int, int]:
    """Jobs placed, then the sum of their scaled Eq. 1 values."""
    return len(plan), sum(dv.scaled_value(j.request.device_threads, s.total.device_threads) for j, s, _ in plan)


def pack(rest: Sequence[Job], state: dv.DeviceState, settings: PlanSettings,
         deadline: float | None = None, repair_deadline: float | None = None) -> dict[str, object]:
    """Run the candidates of the module docstring, keep the best; assignments go to ``state``.
    ``deadline`` (``global`` only): no further candidate or repair starts once it has passed;
    a repair under way stops at ``repair_deadline`` (default ``deadline``)."""
    if repair_deadline is None:
        repair_deadline = deadline
    slots = state.open_slots()
    if not slots or not rest:
        return {"packing": None}
    caps = {s.name: list(state.residual[s.name]) for s in slots}
    n_shapes = len({dv.demand(j, settings) for j in rest})
    small = n_shapes * len(slots) <= DOT_MAX_CELLS
    ranked: list[tuple[tuple[int, int], int, list, str]] = []
    for position, (fill, packing) in enumerate(CANDIDATES):
        if (packing == "dot" and not small) or (packing == "mcck" and len(slots) > MCCK_MAX_DEVICES):
            continue
        if ranked and deadline is not None and time.perf_counter() > deadline:
            break
        plan = _candidate(fill, packing, rest, slots, caps, settings, deadline)
        ranked.append((_score(plan), -position, plan, packing if packing == "mcck" else f"{packing} f={fill}"))
    ranked.sort(key=lambda c: (c[0], c[1]), reverse=True)
    best = ranked[0]
    repaired = 0
    for score, position, plan, name in ranked[: len(ranked) if small else REPAIRED_CANDIDATES]:
        if deadline is not None and time.perf_counter() > deadline:
            break
        better = _repair(plan, rest, slots, caps, settings, repair_deadline)
        if (_score(better), position) > (best[0], best[1]):
            best, repaired = (_score(better), position, better, name), len(better) - len(plan)
    for job, slot, need in best[2]:
        state.assign(job, slot, need)
    return {"packing": best[3], "repaired": repaired}


@register("lp-pack")
class LpPackPolicy:
    """Most jobs placed by LP-guided packing (module docstring)."""

    name = "lp-pack"
    kind = PolicyKind.DEVICE

    def plan(self, request: PlanRequest, settings: PlanSettings) -> Plan:
        t0 = time.perf_counter()
        considered, dslots, too_big, state, rest = prepare(request, settings)
        starving_placed = len(state.assignments)
        stats = pack(rest, state, settings)
        stats.update(starving_placed=starving_placed, solve_time_s=round(time.perf_counter() - t0, 6))
        return dv.finish_plan(self.name, considered, dslots, state, too_big, settings, stats)
