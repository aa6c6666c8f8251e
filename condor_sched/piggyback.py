"""Piggyback profiling, planner side (paper 000 Section 4.1): the scale factor the next run
of a not-yet-profiled program tries, from the run records the node agents write.

The rule and the record format live in the node-side, standard-library module
``cosched_node.runs`` (node_hooks/cosched_node/runs.py; one implementation for both sides).
"""
from __future__ import annotations

import logging
from pathlib import Path
from typing import Iterable

from cosched_node import runs as rec

log = logging.getLogger("condor_sched.piggyback")


def _settled_scale(runtimes: dict[int, float], min_gain: float) -> int | None:
    """Once profiling is done: the smallest scale within ``min_gain`` (5%) of the fastest,
    since a wider spread that does not pay more than that only takes nodes from others."""
    if not runtimes:
        return None
    best = min(runtimes.values())
    return min(k for k, t in runtimes.items() if t <= best * (1 + min_gain))


def exploration_scales(programs: Iterable[str], runs_dir: str | Path | None) -> dict[str, int]:
    """Program -> scale factor for its next compact-exclusive run: the next of 1, 2, 4, 8
    while spreading keeps paying (> 5% faster), then the settled one."""
    scales: dict[str, int] = {}
    if not runs_dir:
        return scales
    for program in sorted(set(programs)):
        try:
            records = rec.load_records(str(runs_dir), program)
        except (ValueError, OSError) as e:
            log.warning("no run records for program %r: %s", program, e)
            continue
        k = rec.next_scale_to_try(records)
        if k is None:
            k = _settled_scale(rec.scale_runtimes(records), rec.MIN_GAIN)
        if k is not None:
            scales[program.lower()] = int(k)
    return scales
