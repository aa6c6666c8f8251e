"""What a sharing mode declares: the jobs it covers (``Job.sharing_mode``), the paper it
implements and its planners by name (STYLE.md: a mode reads like a dask-jobqueue backend,
a few declarations and its planners). The registry (``modes/registry.py``) lists the modes.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from condor_sched.modes.planning import PolicyKind


@dataclass(frozen=True, slots=True)
class SharingMode:
    """One way of sharing. ``name`` is the ``Job.sharing_mode`` of the jobs it covers;
    ``planners`` makes each planner by name. Planners of ``policy_kind`` follow the planner
    interface (``planning.Policy``: ``plan(request, settings)``) and are found by
    ``registry.get_policy``; a mode whose planners have their own interface (GPU fleet
    policies) leaves it None. ``adopts``: another mode whose planners this mode runs too,
    each wrapped by the adapter (called with the planner's name and a maker of it)."""

    name: str
    paper: str
    planners: Mapping[str, Callable[[], Any]]
    policy_kind: PolicyKind | None = None
    #: The COSCHED_* knob that picks the mode's planner.
    knob: str = ""
    adopts: tuple[str, Callable[[str, Callable[[], Any]], Any]] | None = field(default=None)
