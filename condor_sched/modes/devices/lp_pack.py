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
4. *repair* (a local search): *moves*, one job more each: an unplaced job gets room on a
   device by moving one of its jobs to another device, or by replacing one of its jobs with
   two unplaced ones; repaired so are every candidate on small pools, the three best on
   large ones. The best repaired plan then gets up to ``UPGRADE_ROUNDS`` rounds of
   *upgrades* and moves: on each device, one placed job (the smallest that can be) is
   swapped for the largest unplaced job containing it (at least as large in every
   dimension) that fits there. That places no job more, but fills the devices and leaves
   small jobs unplaced instead of large ones, and small ones are what the moves can fit in
   (moves alone stop where room would need a cycle of three jobs moving, e.g. a job to d1
   whose job goes to d0 whose job goes to d1). On the shape-diverse queue of 100k jobs on
   10k devices of ``scripts/bench_plan`` (seed 1), upgrades take the best repaired plan
   from 97.1% to 97.8% of the LP bound. Each plan's repair has a fixed work budget.

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
from collections import Counter, deque
from typing import Sequence

import numpy as np

from condor_sched.model import Job, Plan, Slot
from condor_sched.modes.devices import capacity as dv
from condor_sched.modes.planning import PlanRequest, PlanSettings, PolicyKind
from condor_sched.modes.devices.bounds import device_groups, group_lp
from condor_sched.modes.devices.knapsack import MAX_DP_CELLS, JobPool, greedy_fill, prepare

#: (fill factor, packing) tried; ``dot`` only up to ``DOT_MAX_CELLS`` shapes x devices. How
#: well a fill factor packs depends on the queue (the LP's vertex), hence several close ones.
CANDIDATES: tuple[tuple[float, str], ...] = (
    (1.0, "deal"), (0.99, "deal"), (0.97, "deal"), (0.95, "deal"), (0.92, "bfd"), (0.0, "mcck"), (0.9, "dot"),
)
DOT_MAX_CELLS = 300_000
#: Work budget of one plan's repair (moves and upgrades): each numpy pass over the devices
#: or shapes costs its rows divided by ``REPAIR_ROWS_PER_CHECK``, each job inspected one:
#: deterministic, whatever the machine. (The diverse 100k jobs / 10k devices use a fifth.)
REPAIR_BUDGET = 4_000_000
REPAIR_ROWS_PER_CHECK = 64
#: Devices the repair pass tries per unplaced shape (least missing room first).
REPAIR_DEVICES_PER_SHAPE = 24
#: Shape x device cells per numpy block when counting the devices each shape fits.
FIT_COUNT_CELLS = 1 << 20
#: Candidates repaired on large pools (best first); every one on small pools.
REPAIRED_CANDIDATES = 3
#: (Upgrade pass, move pass) rounds on the best repaired plan, stopping after one that
#: gains nothing (diverse 100k / 10k, seed 1: 62077 jobs, 62634 after one, 62725 after two,
#: 62729 after three).
UPGRADE_ROUNDS = 2
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


def _by_shape(rest: Sequence[Job], needs: Sequence[dv.Capacity]) -> dict[dv.Capacity, deque[Job]]:
    """The jobs of each shape, in the order of ``rest`` (oldest first)."""
    shapes: dict[dv.Capacity, deque[Job]] = {}
    for job, need in zip(rest, needs):
        shapes.setdefault(need, deque()).append(job)
    return shapes


def _candidate(
    fill: float, packing: str, rest: Sequence[Job], slots: list[Slot], caps: dict[str, list[int]],
    settings: PlanSettings, deadline: float | None = None, needs: Sequence[dv.Capacity] | None = None,
) -> list[tuple[Job, Slot, dv.Capacity]]:
    """One (fill, packing) plan of the module docstring over the open devices ``slots``
    (``needs``: each job's demand, if already known)."""
    if packing == "mcck":
        return _coarse_mcck(rest, slots, caps, settings, deadline)
    shapes = _by_shape(rest, needs if needs is not None else [dv.demand(j, settings) for j in rest])
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


def _fit_counts(demand: np.ndarray, residual: np.ndarray, hardware_threads: np.ndarray) -> np.ndarray:
    """Per shape (row of ``demand``), how many rows of ``residual`` it fits."""
    counts = np.zeros(len(demand), dtype=np.int64)
    step = max(1, FIT_COUNT_CELLS // max(1, len(demand)))
    for lo in range(0, len(residual), step):
        r, h = residual[lo:lo + step], hardware_threads[lo:lo + step]
        fits = (demand[:, None, :] <= r[None, :, :]).all(axis=2) & (demand[:, None, dv.THREADS] <= h[None, :])
        counts += fits.sum(axis=1)
    return counts


class _LocalSearch:
    """The repair pass (step 4 of the module docstring) on one plan, kept as per-device shape
    counts: jobs of a shape are interchangeable, so ``plan()`` rebuilds the assignments from
    the counts, oldest jobs first.

    ``move_pass``: for each unplaced shape u, smallest dominant share first, on the devices d
    missing least room for it, a placed job j whose removal makes room either *moves* to
    another device it fits (best fit) or is *swapped* for two unplaced jobs (u and the
    smallest other that fit): one job more per move. ``upgrade_pass``: on each device in
    turn, its job of smallest dominant share that can be is swapped for the unplaced job of
    largest dominant share that contains it (at least as large in every dimension) and fits
    there: as many jobs placed, the device fuller, and the job taken off smaller than the one
    put on, so the next ``move_pass`` may fit it (or use it in a two-for-one swap) where
    the larger one fitted nowhere. Every upgrade grows the placed demand, so passes end.

    Per shape, how many devices it fits is kept up to date, so asking whether a job fits
    elsewhere costs no pass over the devices. Work is capped by ``budget`` (numpy passes over
    the devices or shapes, counted in blocks of ``REPAIR_ROWS_PER_CHECK`` rows, and jobs
    inspected; deterministic, whatever the machine) and by ``deadline`` (``global`` only: the
    moves made so far are kept)."""

    def __init__(self, plan: list[tuple[Job, Slot, dv.Capacity]], rest: Sequence[Job], slots: list[Slot],
                 caps: dict[str, list[int]], settings: PlanSettings, deadline: float | None = None,
                 needs: Sequence[dv.Capacity] | None = None) -> None:
        self.plan_in, self.rest, self.slots, self.deadline = plan, rest, slots, deadline
        self.needs = needs if needs is not None else [dv.demand(j, settings) for j in rest]
        row_of = {s.name: i for i, s in enumerate(slots)}
        self.residual = np.array([caps[s.name] for s in slots], dtype=np.int64).reshape(-1, dv.N_DIMENSIONS)
        self.scale = 1.0 / np.maximum(self.residual, 1)
        grand = np.maximum(self.residual.sum(axis=0), 1)
        self.hardware_threads = np.array([s.total.device_threads for s in slots], dtype=np.int64)
        self.on: list[dict[dv.Capacity, int]] = [{} for _ in slots]
        unplaced: dict[dv.Capacity, int] = {}
        for need in self.needs:
            unplaced[need] = unplaced.get(need, 0) + 1
        for _, slot, need in plan:
            r = row_of[slot.name]
            self.on[r][need] = self.on[r].get(need, 0) + 1
            self.residual[r] -= need
            unplaced[need] -= 1
        self.share = {n: float(max(a / c for a, c in zip(n, grand))) for n in unplaced}
        self.order = sorted(unplaced, key=lambda n: (self.share[n], n))
        self.demand = np.array(self.order, dtype=np.int64).reshape(-1, dv.N_DIMENSIONS)
        self.left = np.array([unplaced[n] for n in self.order], dtype=np.int64)
        self.index = {n: i for i, n in enumerate(self.order)}
        self.check_cost = 1 + len(slots) // REPAIR_ROWS_PER_CHECK
        self.shape_cost = 1 + len(self.order) // REPAIR_ROWS_PER_CHECK
        self.budget = REPAIR_BUDGET - len(self.order) * self.check_cost
        self.fit_count = _fit_counts(self.demand, self.residual, self.hardware_threads)
        #: Per hardware-thread count, the shapes a device of it can hold at all.
        self.thread_fit = {t: self.demand[:, dv.THREADS] <= t for t in set(self.hardware_threads.tolist())}
        self.gained = 0
        #: Bumped whenever a residual changes (the ``nearest`` lists expire).
        self.version = 0
        self.near_cache: dict[dv.Capacity, tuple[int, list[int]]] = {}
        #: Per shape, the other shapes containing it, largest dominant share first.
        self.containing: dict[dv.Capacity, np.ndarray] = {}

    def out_of_time(self) -> bool:
        return self.budget <= 0 or (self.deadline is not None and time.perf_counter() > self.deadline)

    def fits_mask(self, r: int) -> np.ndarray:
        return (self.demand <= self.residual[r]).all(axis=1) & self.thread_fit[int(self.hardware_threads[r])]

    def fits_on(self, need: dv.Capacity, r: int) -> bool:
        return need[dv.THREADS] <= self.hardware_threads[r] and all(
            a <= c for a, c in zip(need, self.residual[r].tolist()))

    def put(self, r: int, need: dv.Capacity, n: int) -> None:
        """``n`` jobs of shape ``need`` more on device ``r`` (negative: fewer)."""
        self.version += 1
        self.fit_count -= self.fits_mask(r)
        on = self.on[r]
        on[need] = on.get(need, 0) + n
        if not on[need]:
            del on[need]
        self.residual[r] -= np.asarray(need, dtype=np.int64) * n
        self.fit_count += self.fits_mask(r)

    def best_fit(self, a: np.ndarray, exclude: int) -> int:
        """The device other than ``exclude`` that ``a`` fits with least scaled room left."""
        self.budget -= self.check_cost
        fits = (self.residual >= a).all(axis=1) & (self.hardware_threads >= a[dv.THREADS])
        fits[exclude] = False
        others = np.flatnonzero(fits)
        return int(others[np.argmin(((self.residual[others] - a) * self.scale[others]).sum(axis=1))])

    def nearest(self, need: dv.Capacity) -> list[int]:
        """Up to ``REPAIR_DEVICES_PER_SHAPE`` devices missing least scaled room for ``need``
        (ties: lower row); a shape's list is kept until a residual changes."""
        cached = self.near_cache.get(need)
        if cached is None or cached[0] != self.version:
            self.budget -= self.check_cost
            deficit = np.subtract(need, self.residual, dtype=np.float64)
            np.maximum(deficit, 0.0, out=deficit)
            missing = np.einsum("ij,ij->i", deficit, self.scale)
            missing[self.hardware_threads < need[dv.THREADS]] = np.inf
            rows = np.arange(len(missing))
            if len(missing) > REPAIR_DEVICES_PER_SHAPE:
                rows = np.argpartition(missing, REPAIR_DEVICES_PER_SHAPE)[:REPAIR_DEVICES_PER_SHAPE]
            rows = rows[np.isfinite(missing[rows])]
            cached = (self.version, rows[np.lexsort((rows, missing[rows]))].tolist())
            self.near_cache[need] = cached
        return cached[1]

    def by_share(self, d: int) -> list[dv.Capacity]:
        return sorted(self.on[d], key=lambda n: (self.share[n], n))

    def move_or_swap(self, u: dv.Capacity, a_u: np.ndarray, d: int) -> bool:
        """Room for one u on d by a move or a two-for-one swap of one of its jobs."""
        deficit = [max(a - r, 0) for a, r in zip(u, self.residual[d].tolist())]
        if not any(deficit):
            self.put(d, u, 1)
            return True
        for j in self.by_share(d):
            self.budget -= 1
            if any(a < b for a, b in zip(j, deficit)):
                continue
            a_j = np.asarray(j, dtype=np.int64)
            if self.fit_count[self.index[j]] > self.fits_on(j, d):
                e = self.best_fit(a_j, d)
                self.put(d, j, -1)
                self.put(e, j, 1)
                self.put(d, u, 1)
                return True
            room = self.residual[d] + a_j - a_u
            avail = self.left.copy()
            avail[self.index[u]] -= 1
            self.budget -= self.shape_cost
            ok = np.flatnonzero((avail > 0) & (self.demand <= room).all(axis=1)
                                & (self.demand[:, dv.THREADS] <= self.hardware_threads[d]))
            if len(ok):
                second = self.order[int(ok[0])]
                self.put(d, j, -1)
                self.left[self.index[j]] += 1
                self.put(d, u, 1)
                self.put(d, second, 1)
                self.left[self.index[second]] -= 1
                return True
        return False

    def move_pass(self) -> None:
        for u, a_u in zip(self.order, self.demand):
            i = self.index[u]
            while self.left[i] > 0 and not self.out_of_time():
                if not any(self.move_or_swap(u, a_u, d) for d in self.nearest(u)):
                    break
                self.left[i] -= 1
                self.gained += 1

    def upgrade(self, d: int) -> bool:
        """Swap the job of smallest dominant share on d that can be for the largest unplaced
        job containing it that fits d."""
        room = self.residual[d]
        for j in self.by_share(d):
            self.budget -= 1
            larger = self.containing.get(j)
            if larger is None:
                self.budget -= self.shape_cost
                larger = np.flatnonzero((self.demand >= j).all(axis=1))[::-1]
                self.containing[j] = larger = larger[larger != self.index[j]]
            larger = larger[self.left[larger] > 0]
            if not len(larger):
                continue
            larger = larger[(self.demand[larger] <= np.add(j, room)).all(axis=1)
                            & (self.demand[larger, dv.THREADS] <= self.hardware_threads[d])]
            if len(larger):
                v = int(larger[0])
                self.put(d, j, -1)
                self.left[self.index[j]] += 1
                self.put(d, self.order[v], 1)
                self.left[v] -= 1
                return True
        return False

    def upgrade_pass(self) -> None:
        for d in range(len(self.slots)):
            if self.out_of_time():
                return
            self.upgrade(d)

    def plan(self) -> list[tuple[Job, Slot, dv.Capacity]]:
        if not self.gained:
            return self.plan_in
        queues = _by_shape(self.rest, self.needs)
        return [(queues[need].popleft(), slot, need)
                for slot, counts in zip(self.slots, self.on) for need in sorted(counts) for _ in range(counts[need])]


def _repair(
    plan: list[tuple[Job, Slot, dv.Capacity]], rest: Sequence[Job], slots: list[Slot], caps: dict[str, list[int]],
    settings: PlanSettings, deadline: float | None = None, upgrade_rounds: int = 0,
) -> list[tuple[Job, Slot, dv.Capacity]]:
    """``plan`` after a move pass and ``upgrade_rounds`` (upgrade pass, move pass) rounds
    (``_LocalSearch``)."""
    search = _LocalSearch(plan, rest, slots, caps, settings, deadline)
    search.move_pass()
    for _ in range(upgrade_rounds):
        search.upgrade_pass()
        search.move_pass()
    return search.plan()


def _score(plan: list[tuple[Job, Slot, dv.Capacity]]) -> tuple[int, int]:
    """Jobs placed, then the sum of their scaled Eq. 1 values."""
    pairs = Counter((j.request.device_threads, s.total.device_threads) for j, s, _ in plan)
    return len(plan), sum(n * dv.scaled_value(t, hardware) for (t, hardware), n in pairs.items())


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
    needs = [dv.demand(j, settings) for j in rest]
    n_shapes = len(set(needs))
    small = n_shapes * len(slots) <= DOT_MAX_CELLS
    ranked: list[tuple[tuple[int, int], int, list, str]] = []
    for position, (fill, packing) in enumerate(CANDIDATES):
        if (packing == "dot" and not small) or (packing == "mcck" and len(slots) > MCCK_MAX_DEVICES):
            continue
        if ranked and deadline is not None and time.perf_counter() > deadline:
            break
        plan = _candidate(fill, packing, rest, slots, caps, settings, deadline, needs)
        ranked.append((_score(plan), -position, plan, packing if packing == "mcck" else f"{packing} f={fill}"))
    ranked.sort(key=lambda c: (c[0], c[1]), reverse=True)
    best = ranked[0]
    repaired = 0
    best_search: _LocalSearch | None = None
    for score, position, plan, name in ranked[: len(ranked) if small else REPAIRED_CANDIDATES]:
        if len(best[2]) == len(rest) or (deadline is not None and time.perf_counter() > deadline):
            break
        search = _LocalSearch(plan, rest, slots, caps, settings, repair_deadline, needs)
        search.move_pass()
        better = search.plan()
        if (_score(better), position) >= (best[0], best[1]):
            best, repaired, best_search = (_score(better), position, better, name), len(better) - len(plan), search
    for _ in range(UPGRADE_ROUNDS if best_search is not None else 0):
        if deadline is not None and time.perf_counter() > deadline:
            break
        before = best_search.gained
        best_search.upgrade_pass()
        best_search.move_pass()
        if best_search.gained == before:
            break
        better = best_search.plan()
        best, repaired = (_score(better), best[1], better, best[3]), repaired + best_search.gained - before
    for job, slot, need in best[2]:
        state.assign(job, slot, need)
    return {"packing": best[3], "repaired": repaired}


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
