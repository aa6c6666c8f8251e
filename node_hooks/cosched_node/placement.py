"""Placement on a device's compute units (Section IV-D2 of paper 002: co-runners on disjoint
hardware threads), and the ``a-b,c`` lists the environment templates use. Pure."""

from __future__ import annotations

from typing import Any, Iterable, List, Optional, Tuple

from cosched_node.rules import MAX_UNITS

Units = Tuple[Tuple[int, int], ...]


def units_count(ranges: Iterable[Tuple[int, int]]) -> int:
    return sum(b - a for a, b in ranges)


def to_ranges(units: Iterable[int]) -> Units:
    """Sorted distinct unit numbers -> canonical half-open ranges (sorted, non-adjacent)."""
    out: List[List[int]] = []
    for u in sorted(set(units)):
        if out and out[-1][1] == u:
            out[-1][1] = u + 1
        else:
            out.append([u, u + 1])
    return tuple((a, b) for a, b in out)


def parse_units(raw: Any, threads: Any) -> Units:
    """Validate a request's ``units``: a non-empty list of [start, end) pairs of integers in
    [0, MAX_UNITS], sorted and non-adjacent, whose lengths sum to ``threads``."""
    if not isinstance(raw, list) or not raw or len(raw) > MAX_UNITS:
        raise ValueError("bad 'units'")
    out: List[Tuple[int, int]] = []
    previous_end = -1
    for pair in raw:
        if not (isinstance(pair, list) and len(pair) == 2
                and all(isinstance(x, int) and not isinstance(x, bool) for x in pair)):
            raise ValueError("bad 'units'")
        start, end = pair
        if not 0 <= start < end <= MAX_UNITS or start <= previous_end:
            raise ValueError("bad 'units'")
        out.append((start, end))
        previous_end = end
    if units_count(out) != threads:
        raise ValueError("'units' do not add up to 'threads'")
    return tuple(out)


def format_ranges(ranges: Iterable[Tuple[int, int]], offset: int = 0) -> str:
    """``((0, 60), (64, 66))`` -> ``"0-59,64-65"``; each number shifted by ``offset``."""
    return ",".join(f"{a + offset}" if b - a == 1 else f"{a + offset}-{b - 1 + offset}" for a, b in ranges)


def core_ranges(units: Iterable[Tuple[int, int]], per_core: int) -> Units:
    """The cores the units touch, as ranges."""
    return to_ranges(c for a, b in units for c in range(a // per_core, (b - 1) // per_core + 1))


def place_units(capacity: int, per_core: int, held: Iterable[Tuple[int, int]], wanted: int) -> Optional[Units]:
    """``wanted`` free compute units of a device of ``capacity`` units, as ranges, disjoint
    from the ``held`` ranges of its co-runners; None only when fewer than ``wanted`` are free.

    Whole free cores first, lowest first (a job of 4k units on an idle device gets cores
    0..k-1, as a contiguous core range did); what is left (fewer units than a core) goes to
    the partly used core it fits most tightly, else to the lowest free core, so whole cores
    stay whole; only when no core has room for it alone is it spread over the cores with the
    most free units.  No contiguity is needed: any set of free units is a placement, so a job
    is placed whenever the device's free units (its threads less its co-runners') suffice.
    """
    if wanted <= 0 or capacity <= 0 or per_core <= 0:
        return None
    free = [True] * capacity
    for a, b in held:
        for u in range(max(0, a), min(capacity, b)):
            free[u] = False
    if sum(free) < wanted:
        return None
    cores = [(lo, min(lo + per_core, capacity)) for lo in range(0, capacity, per_core)]
    chosen: List[int] = []

    def take(units: List[int]) -> None:
        for u in units:
            free[u] = False
        chosen.extend(units)

    need = wanted
    for lo, hi in cores:
        if hi - lo <= need and all(free[lo:hi]):
            take(list(range(lo, hi)))
            need -= hi - lo
    while need > 0:
        free_of = [[u for u in range(lo, hi) if free[u]] for lo, hi in cores]
        fits = [c for c, units in enumerate(free_of) if len(units) >= need]
        if fits:
            best = min(fits, key=lambda c: (len(free_of[c]) == cores[c][1] - cores[c][0], len(free_of[c]), c))
            take(free_of[best][:need])
            need = 0
        else:
            best = max((c for c, units in enumerate(free_of) if units), key=lambda c: (len(free_of[c]), -c))
            take(free_of[best])
            need -= len(free_of[best])
    return to_ranges(chosen)
