"""The one list of sharing modes, and every lookup by name (modes, planners, GPU planners).

Adding a mode is its package plus one line in ``_MODES`` (or :func:`register_mode` at run
time). Modes use each other only through here, by name: the GPU mode runs the device mode's
planners because it ``adopts`` them, and this module hands them over.
"""
from __future__ import annotations

from typing import Any, Callable

from condor_sched.modes.devices.mode import DEVICES
from condor_sched.modes.gpus.mode import GPUS
from condor_sched.model import Job
from condor_sched.modes.interface import SharingMode
from condor_sched.modes.mates.mode import MATES
from condor_sched.modes.overcommit.mode import OVERCOMMIT
from condor_sched.modes.planning import Policy, PolicyError, PolicyKind
from condor_sched.modes.spare.mode import SPARE
from condor_sched.modes.spread.mode import SPREAD

#: Every sharing mode, one line each: a job goes to the first mode that covers it.
_MODES: list[SharingMode] = [
    DEVICES,
    SPREAD,
    MATES,
    GPUS,
    SPARE,
    OVERCOMMIT,
]
_BUILT_IN = [m.name for m in _MODES]


def register_mode(mode: SharingMode, before: str | None = None) -> None:
    """Add ``mode`` at the end, or ``before`` the mode of that name (a job goes to the first
    mode that covers it); PolicyError when its name or one of its planners' is taken."""
    if any(m.name == mode.name for m in _MODES):
        raise PolicyError(f"sharing mode {mode.name!r} registered twice")
    taken = {n for m in _MODES for n in m.planners} & set(mode.planners)
    if taken:
        raise PolicyError(f"planner {sorted(taken)[0]!r} registered twice")
    at = len(_MODES) if before is None else [m.name for m in _MODES].index(get_mode(before).name)
    _MODES.insert(at, mode)


def unregister_mode(name: str) -> None:
    """Take the mode ``name`` out (a test's own mode, after the test)."""
    _MODES[:] = [m for m in _MODES if m.name != name]


def mode_of_job() -> Callable[[Job], SharingMode | None] | None:
    """The rule that gives each job to one mode: the first registered mode that covers it.
    None while only the built-in modes are registered: then ``Job.sharing_mode`` is the rule
    (each built-in mode covers the jobs of its name), and the cycle takes its fast path."""
    if [m.name for m in _MODES] == _BUILT_IN:
        return None
    listed = tuple(_MODES)

    def mode_of(job: Job) -> SharingMode | None:
        return next((m for m in listed if m.covers(job)), None)

    return mode_of


def modes() -> tuple[SharingMode, ...]:
    """The registered modes, in registration order."""
    return tuple(_MODES)


def get_mode(name: str) -> SharingMode:
    for mode in _MODES:
        if mode.name == name:
            return mode
    raise PolicyError(f"unknown sharing mode {name!r}; known: {', '.join(m.name for m in _MODES)}")


def _policies() -> dict[str, Any]:
    """Every planner of the planner interface (``planning.Policy``), by name."""
    return {n: f for m in _MODES if m.policy_kind is not None for n, f in m.planners.items()}


def get_policy(name: str) -> Policy:
    """The planner ``name`` of any mode of the planner interface."""
    found = _policies()
    if name not in found:
        raise PolicyError(f"unknown policy {name!r}; known: {', '.join(sorted(found))}")
    return found[name]()


def policy_names(kind: PolicyKind | None = None) -> list[str]:
    """Registered planner names, all or those of one ``kind``."""
    return sorted(n for n, factory in _policies().items() if kind is None or factory.kind is kind)


def device_policy_names() -> list[str]:
    """The device planners a GPU pool may use through ``gpus/on_devices.py``."""
    return policy_names(PolicyKind.DEVICE)


def _gpu_planners(adopted: bool = True) -> dict[str, Any]:
    """The GPU mode's planners, and (``adopted``) the planners it runs of the mode it adopts."""
    own = dict(GPUS.planners)
    if not adopted or GPUS.adopts is None:
        return own
    other, adapter = GPUS.adopts
    lent = get_mode(other).planners
    return {**{n: (lambda n=n, f=f: adapter(n, f)) for n, f in lent.items()}, **own}


def gpu_policy(name: str) -> Any:
    """The GPU policy registered as ``name``; PolicyError naming the known ones otherwise."""
    found = _gpu_planners()
    if name not in found:
        raise PolicyError(f"unknown GPU policy {name!r}; known: {', '.join(sorted(found))}")
    return found[name]()


def gpu_policy_names(device_policies: bool = True) -> list[str]:
    """The GPU policies by name: the fleet policies and (``device_policies``) paper 002's
    device policies, which plan GPUs through ``gpus/on_devices.py``'s view."""
    return sorted(_gpu_planners(device_policies))
