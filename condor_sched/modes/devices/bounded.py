"""``bounded_run``: a device plan of ``BOUNDED_POLICIES`` on only the jobs that can matter,
equal to planning the whole queue (issue 11: 50k-job cycles), its rows kept per demand
shape from cycle to cycle (``cycle_cache.ShapeQueues``).
"""
from __future__ import annotations

from dataclasses import replace
from itertools import compress, repeat
from operator import and_, attrgetter, is_not, not_
from typing import Any, Mapping, Sequence

import numpy as np

from condor_sched.cycle_cache import (
    _NOT_YET_UNPLACED, PlanCache, ShapeQueues, _fifo, _last_unplaced, _record, _shape,
)
from condor_sched.model import JobKey, Plan, Slot, SlotKind, Unplaced
from condor_sched.modes.devices.capacity import Capacity, free_capacity, split_too_big
from condor_sched.modes.devices.capacity import _not_fitted_reason as not_fitted_reason
from condor_sched.modes.planning import PlanRequest, PlanSettings, Policy, run_policy
from condor_sched.modes.slot_mode import Waiting

_job_of, _reason_of = attrgetter("job"), attrgetter("reason")


#: Device policies whose plan depends, per demand shape, only on the shape's oldest and
#: longest-starving jobs, as many as the free capacity could hold (``bounded_run``):
#: ``knapsack`` (Fig. 4 takes each class's smallest-memory jobs, oldest first within a shape,
#: never more than a device's residual holds) and ``exclusive`` (FIFO: once a job of a shape
#: fits no empty device, no later job of that shape does). ``random`` draws over and
#: ``global`` solves over the whole queue: they always get it all.
BOUNDED_POLICIES = frozenset({"knapsack", "exclusive"})


def bounded_run(policy: Policy, request: PlanRequest, settings: PlanSettings, cache: PlanCache) -> Plan:
    """``run_policy`` for a policy of ``BOUNDED_POLICIES`` on a queue every job of which may use
    every slot, and equal to it, planning only the jobs that can matter. Of each demand shape,
    L = (the jobs of the shape each device's free capacity holds, summed over the devices) + 2,
    plus the number of devices when some job starves: the policy gets the shape's L oldest
    jobs and its L longest-starving ones. No plan places more of a shape or looks further down
    it (a device's candidates of a shape are at most what its residual holds, and residuals
    only shrink), and once a starving job of a shape can neither be placed nor reserve a
    device, no later one of its shape can. Each job left out is unplaced for the reason
    ``finish_plan`` gives its shape (too big, or why the final residuals cannot take it).
    The queue's rows are kept per shape from cycle to cycle (``ShapeQueues``)."""
    device_slots = [s for s in request.slots if s.kind is SlotKind.DEVICE]
    caps = [free_capacity(s, settings) for s in device_slots]
    if cache.queues is None:
        cache.queues = ShapeQueues()
    queues = cache.queues
    if len(queues.waiting) > 4096:  # reasons that name a cycle count grow without end
        queues.waiting = Waiting()
    continued = cache.covered.continued_from if cache.covered is not None else None
    queues.follow_first_seen(request.first_seen_cycle, request.cycle, continued)
    came = queues.update(request.idle, cache, settings)
    rows = queues.rows  # in FIFO order, with ``_GONE`` in the place of rows gone
    n_rows = len(queues.live)
    cache.forget_all_but(n_rows)
    cycle, first_seen, limit = request.cycle, request.first_seen_cycle, settings.age_limit_cycles
    starving: dict[Capacity, list[list]] = {}
    if first_seen and cycle - min(first_seen.values()) > limit:
        starving = queues.starving_rows(limit)
    extra = 2 + (len(device_slots) if starving else 0)
    shapes = list(queues.shape_rows)
    most = dict(zip(shapes, _most_per_shape(shapes, caps, device_slots, extra)))
    if policy.name == "knapsack" and not starving:
        _past_a_full_shape(most, queues.shape_rows)
    kept_rows = [r for need in shapes for r in queues.shape_rows[need][:most[need]]]
    if starving:
        kept_rows += [r for need, rows_ in starving.items() for r in rows_[:most[need]]]
        kept_rows = list({id(r): r for r in kept_rows}.values())
    if len(kept_rows) == n_rows:
        queues.shape_reason, queues.own = {}, []  # every row's reason is set afresh next time
        queues.told_valid = False
        return run_policy(policy, request, settings)
    kept_rows.sort(key=_fifo)
    plan = policy.plan(replace(request, idle=tuple(map(_record, kept_rows)), eligible={}), settings)
    said = {u.job: u.reason for u in plan.unplaced}
    need_of = {r[0].key: r[3] for r in kept_rows}
    reserved = set(plan.stats.get("reserved_devices", ()))
    open_caps = {s.name: list(c) for s, c in zip(device_slots, caps) if s.name not in reserved}
    for a in plan.assignments:
        if a.slot in open_caps:
            open_caps[a.slot] = [c - n for c, n in zip(open_caps[a.slot], need_of[a.job])]
    residual = np.array(list(open_caps.values()), dtype=np.int64).reshape(-1, len(Capacity._fields))
    hardware = np.array([s.total.device_threads for s in device_slots if s.name in open_caps], dtype=np.int64)
    totals = tuple(s.total for s in device_slots)
    if totals != cache.totals:  # the same records cycle after cycle: compared by identity
        cache.totals, cache.too_big = totals, {}
    shape_reason: dict[Capacity, str] = {}
    too_big: set[Capacity] = set()
    for need in shapes:
        first = queues.shape_rows[need][0][0]
        memo = (need, first.request.device_memory_mb)
        if memo not in cache.too_big:
            bad = split_too_big([first], device_slots, settings)[1]
            cache.too_big[memo] = bad[0].reason if bad else None
        if cache.too_big[memo] is not None:
            too_big.add(need)
        shape_reason[need] = cache.too_big[memo] or not_fitted_reason(need, residual, hardware)
    placed = set(map(_job_of, plan.assignments))
    _tell_rows(queues, kept_rows, came, shape_reason, placed, said)
    units = list(map(_last_unplaced, rows))
    present = list(map(is_not, units, repeat(_NOT_YET_UNPLACED))) if placed or queues.dead else None
    if too_big:
        is_big = list(map(too_big.__contains__, map(_shape, rows)))
        if present is None:
            present = [True] * len(rows)
        unplaced = (tuple(compress(units, map(and_, is_big, present)))
                    + tuple(compress(units, map(and_, map(not_, is_big), present))))
    else:
        unplaced = tuple(units) if present is None else tuple(compress(units, present))
    if not queues.told_valid:
        waiting = queues.waiting
        queues.told = dict(zip(map(_job_of, unplaced), map(waiting.__getitem__, map(_reason_of, unplaced))))
        queues.told_valid = True
    cache.whole_unplaced = unplaced
    return replace(plan, unplaced=unplaced, stats={**plan.stats, "jobs_considered": n_rows, "unplaced": len(unplaced)})


def _most_per_shape(shapes: Sequence[Capacity], caps: Sequence[Capacity], device_slots: Sequence[Slot],
                    extra: int) -> list[int]:
    """Per shape, how many of its jobs the devices' free ``caps`` hold, each device on its own
    (a device that has fewer hardware threads than a job asks holds none), summed, plus ``extra``."""
    if not shapes:
        return []
    need = np.array(shapes, dtype=np.int64)  # shapes x dimensions
    free = np.array(caps, dtype=np.int64).reshape(-1, len(Capacity._fields))  # devices x dimensions
    per_dim = np.where(need[None, :, :] > 0, free[:, None, :] // np.maximum(need[None, :, :], 1), 1 << 40)
    per_device = per_dim.min(axis=2)
    hardware = np.array([s.total.device_threads for s in device_slots], dtype=np.int64)
    per_device[hardware[:, None] < need[None, :, 1]] = 0
    return (per_device.sum(axis=0) + extra).tolist()


def _past_a_full_shape(most: dict[Capacity, int], shape_rows: Mapping[Capacity, list]) -> None:
    """Knapsack only, no job starving: a shape none of whose jobs any device can take, set to 0.
    Within a class (``ShapeClass``), a device's candidates are the smallest-memory shapes'
    jobs first (``JobPool.candidates``); once a shape has more jobs than all devices can take
    of it, each device's candidates stop at it (its jobs use up the class's count or the
    memory a bigger shape would need), and so do the jobs taken (``take_from_class``)."""
    by_class: dict[Any, list[Capacity]] = {}
    for need in most:
        by_class.setdefault(need.shape_class, []).append(need)
    for members in by_class.values():
        members.sort(key=attrgetter("device_memory_granules"))
        for i, need in enumerate(members):
            if len(shape_rows[need]) > most[need]:
                for later in members[i + 1:]:
                    most[later] = 0
                break


def _tell_rows(queues: ShapeQueues, kept_rows: list[list], came: list[list], shape_reason: Mapping[Capacity, str],
               placed: set[JobKey], said: Mapping[JobKey, str]) -> None:
    """Give each row its ``Unplaced`` for this cycle (placed rows: ``_NOT_YET_UNPLACED``),
    and its job what it is told, touching only rows whose reason may have changed (``ShapeQueues``)."""
    own = set(map(id, kept_rows))
    told, waiting = queues.told, queues.waiting
    for r in kept_rows:
        key = r[0].key
        if key in placed:
            r[4] = _NOT_YET_UNPLACED
            told.pop(key, None)
            continue
        if r[4].reason != said[key]:
            r[4] = Unplaced(key, said[key])
        told[key] = waiting[said[key]]
    live = queues.live
    redo = [r for r in queues.own if id(r) not in own and live.get(id(r[0])) is r]
    redo += [r for r in came if id(r) not in own]
    for need, reason in shape_reason.items():
        if queues.shape_reason.get(need) != reason:
            queues.shape_reason[need] = reason
            redo += [r for r in queues.shape_rows[need] if id(r) not in own]
    for r in redo:
        reason = shape_reason[r[3]]
        if r[4].reason != reason:
            r[4] = Unplaced(r[0].key, reason)
            told[r[0].key] = waiting[reason]
    for r in came:
        if id(r) not in own:
            told[r[0].key] = waiting[r[4].reason]
    queues.own = kept_rows
