"""Bounded click parameter types and the bounds of the CLI's numeric options.

Every number the command line takes has a minimum and a maximum, so a typo (``1e308``,
``inf``, ``nan``) is a usage error (exit 2) naming the option, never a traceback or a run
that cannot end. Bounds that belong to a reader or the simulator live there
(``MAX_WORKLOAD_JOBS``, ``MAX_NODES``, ``MIN_CYCLE_S``/``MAX_CYCLE_S``) and are used here.
"""
from __future__ import annotations

import math
from typing import Any

import click

#: Seeds are 31-bit: CP-SAT's random_seed is a 32-bit signed integer.
MAX_SEED = 2**31 - 1
#: A plan's device threads as a multiple of each device's threads (what-if studies).
MAX_THREAD_OVERCOMMIT = 16.0
#: The knapsack's device-memory step, MB.
MAX_GRANULARITY_MB = 65536
#: CP-SAT's time limit of one global plan, s.
MIN_SOLVER_TIME_LIMIT_S, MAX_SOLVER_TIME_LIMIT_S = 0.01, 3600.0
#: Ages and unpin ages, in negotiation cycles.
MAX_AGE_CYCLES = 100_000
#: Independently seeded sequences of one ``simulate`` run.
MAX_SEQUENCES = 1000


class BoundedFloat(click.FloatRange):
    """A closed float range that also refuses nan and the infinities (click's FloatRange
    lets nan through, and inf when there is no maximum)."""

    def __init__(self, minimum: float, maximum: float, *, min_open: bool = False) -> None:
        super().__init__(min=minimum, max=maximum, min_open=min_open)

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        number = click.FLOAT.convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"{number!r} is not a finite number.", param, ctx)
        return super().convert(number, param, ctx)


def bounded_int(minimum: int, maximum: int) -> click.IntRange:
    """An integer option from ``minimum`` to ``maximum``, both included."""
    return click.IntRange(min=minimum, max=maximum)


SEED = bounded_int(0, MAX_SEED)
THREAD_OVERCOMMIT = BoundedFloat(1.0, MAX_THREAD_OVERCOMMIT)
AGE_CYCLES = bounded_int(0, MAX_AGE_CYCLES)
