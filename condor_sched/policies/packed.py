"""``lp-pack``: paper 002's aim (most jobs placed) by LP-guided packing, fast at any size.

MCCK (``knapsack``, Fig. 4 of paper 002) solves an exact knapsack per device in turn; on
queues of many shapes each knapsack costs tenths of a second and the greedy order is
myopic (the first devices take all the small jobs, later ones are left with big ones that
waste threads). This policy trades per-device exactness for a cluster-wide view:

1. *select*: the device-group LP of ``bounds.py``, with every group's capacity scaled by a
   fill factor f < 1 (slack for packing), says how many jobs of each shape to place;
2. *pack*, one of two ways: best-fit decreasing (largest dominant share first, each shape
   in one batch onto the fitting devices with least room left, as one-by-one best fit
   would do), or device by device (Fig. 4's order) the selected job best aligned with the
   device's free capacity (largest dot product of shares, a vector bin-packing rule);
3. *fill*: every job still unplaced, smallest dominant share first, best-fit onto any
   device it fits.

A third candidate is Fig. 4's greedy itself (``mcck``) with each device's DP limited to
``MCCK_CELL_BUDGET / devices`` states (exact up to 100 devices, coarser beyond: demands
round up, so never oversubscribed) and the last answer on an equal device taken again
while it fits. The candidates run in turn (``CANDIDATES``) and the plan placing most jobs
(then the larger Eq. 1 sum, then the first) is kept. Within a shape the oldest jobs go first.
Deviations from paper 002: the LP-guided candidates solve no per-device knapsack and the
``mcck`` candidate's is coarser beyond 100 devices; Eq. 1 is the ``mcck`` knapsacks'
second criterion, as in ``knapsack``, and the tie-break between candidates. The aging rule of
``devices.py`` runs first, as for every device policy. No clock or randomness decides
anything.

Why it is the sidecar's default (``settings.SidecarSettings.policy``, issue 11): exact MCCK
takes seconds per cycle on shape-diverse queues (10k jobs on 2k devices: 4-5 s) and
places fewer jobs there; this plans them in well under 1 s and 100k jobs on 10k devices in a
few seconds, and on pools of up to 100 devices its ``mcck`` candidate *is* exact MCCK, so
it never places fewer jobs than ``knapsack`` there. ``knapsack`` stays registered
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
CANDIDATES: tuple[tuple[float, str], ...] = ((0.92, "bfd"), (0.0, "mcck"), (0.9, "dot"))
DOT_MAX_CELLS = 300_000
#: DP states per device knapsack of the ``mcck`` candidate: ``MCCK_CELL_BUDGET`` over the
#: devices, at least ``MCCK_MIN_CELLS``, at most ``knapsack.MAX_DP_CELLS`` (exact MCCK, the
#: ``knapsack`` plan itself, on pools of up to 100 devices).
MCCK_CELL_BUDGET = 400_000_000
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
    if packing == "dot":
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


def pack(rest: Sequence[Job], state: dv.DeviceState, settings: PlanSettings,
         deadline: float | None = None) -> dict[str, object]:
    """Run the candidates of the module docstring, keep the best; assignments go to ``state``.
    ``deadline`` (``global`` only): no further candidate starts once it has passed."""
    slots = state.open_slots()
    if not slots or not rest:
        return {"packing": None}
    caps = {s.name: list(state.residual[s.name]) for s in slots}
    n_shapes = len({dv.demand(j, settings) for j in rest})
    best: tuple[tuple[int, int], list, str] | None = None
    for fill, packing in CANDIDATES:
        if packing == "dot" and n_shapes * len(slots) > DOT_MAX_CELLS:
            continue
        if best is not None and deadline is not None and time.perf_counter() > deadline:
            break
        plan = _candidate(fill, packing, rest, slots, caps, settings, deadline)
        score = (len(plan), sum(dv.scaled_value(j.request.device_threads, s.total.device_threads) for j, s, _ in plan))
        if best is None or score > best[0]:
            best = (score, plan, packing if packing == "mcck" else f"{packing} f={fill}")
    assert best is not None
    for job, slot, need in best[1]:
        state.assign(job, slot, need)
    return {"packing": best[2]}


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
