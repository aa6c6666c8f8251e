"""The one policy interface: jobs and slots in, a Plan out, no I/O.

The sidecar, the offline planner and the simulator all find a policy by name through
``get_policy`` and call ``plan``; a new policy is one module that calls ``register``.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Protocol, Sequence

from condor_sched.model import Job, Plan, Slot


class PolicyError(ValueError):
    """An unknown policy name or an invalid policy setting."""


@dataclass(frozen=True, slots=True)
class PlanSettings:
    """Settings every policy may read; the sidecar fills them from COSCHED_* knobs.

    ``cycle`` is the current negotiation cycle number (for aging), ``seed`` makes random
    choices reproducible, ``deterministic`` asks CP-SAT for one worker and a
    deterministic time limit (the simulator's byte-identical runs).
    """

    memory_granularity_mb: int = 50
    knapsack_solver: str = "dp"
    thread_overcommit: float = 1.0
    solver_time_limit_s: float = 2.0
    age_limit_cycles: int = 10
    cycle: int = 0
    seed: int = 0
    deterministic: bool = False
    extra: Mapping[str, Any] = field(default_factory=dict)


class Policy(Protocol):
    name: str

    def plan(self, jobs: Sequence[Job], slots: Sequence[Slot], settings: PlanSettings) -> Plan:
        """Place idle ``jobs`` on the free resources of ``slots``."""
        ...


_REGISTRY: dict[str, Callable[[], Policy]] = {}


def register(name: str) -> Callable[[Callable[[], Policy]], Callable[[], Policy]]:
    """Class decorator: make a policy findable by ``name``."""

    def add(factory: Callable[[], Policy]) -> Callable[[], Policy]:
        if name in _REGISTRY:
            raise PolicyError(f"policy {name!r} registered twice")
        _REGISTRY[name] = factory
        return factory

    return add


def get_policy(name: str) -> Policy:
    from condor_sched import policies  # noqa: F401  (imports every policy module)

    try:
        return _REGISTRY[name]()
    except KeyError:
        raise PolicyError(f"unknown policy {name!r}; known: {', '.join(sorted(_REGISTRY))}") from None


def policy_names() -> list[str]:
    from condor_sched import policies  # noqa: F401

    return sorted(_REGISTRY)


def cp_sat_solver(settings: PlanSettings, time_limit_s: float | None = None):
    """A CP-SAT solver set up the same way for every policy: wall-clock limit and all cores
    normally; one worker and a deterministic limit when ``settings.deterministic`` (the
    simulator's byte-identical runs)."""
    import os

    from ortools.sat.python import cp_model

    limit = max(0.01, settings.solver_time_limit_s if time_limit_s is None else time_limit_s)
    solver = cp_model.CpSolver()
    params = solver.parameters
    params.random_seed = settings.seed
    if settings.deterministic:
        params.num_workers = 1
        params.max_deterministic_time = limit
    else:
        params.num_workers = max(1, min(8, os.cpu_count() or 1))
        params.max_time_in_seconds = limit
    return solver
