"""The sidecar's settings: HTCondor knobs ``COSCHED_*`` (defaults in config.d/50-cosched-sidecar.conf)."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Mapping

from condor_sched import options
from condor_sched.device_kinds import device_kinds
from condor_sched.edits import CHUNK_JOBS, MAX_CHUNK_JOBS
from condor_sched.modes.planning import PlanSettings, PolicyKind
from condor_sched.modes.registry import policy_names
from condor_sched.modes.registry import gpu_policy_names


#: The GPU policy of a pool that sets no COSCHED_GPU_POLICY (issue 13; docs/results.md says why).
DEFAULT_GPU_POLICY = "fgd-mem-batch"
#: The node-sharing policy a live pool runs (paper 001's SD-Policy, ``condor_sched.modes.mates.live``).
LIVE_NODE_POLICY = "sd"


class SettingsError(ValueError):
    """A COSCHED_* knob with a value that cannot be used; names the knob."""


@dataclass(frozen=True, slots=True)
class SidecarSettings:
    policy: str = "lp-pack"  # fast at any queue size (issue 11); modes/devices/lp_pack.py says why
    spread_policy: str = "sns"
    node_policy: str = "sd"  # malleable jobs only (+CoSchedMalleable); "none" leaves them to HTCondor
    #: The policy of the ``gpu`` device kind (issue 13; modes/gpus/fleet_policy.py): ``simulate``
    #: uses it for openb workloads without ``--policy``.
    gpu_policy: str = DEFAULT_GPU_POLICY
    #: Spare-capacity jobs only (+CoSchedSpare, paper 003); "none" leaves them waiting.
    spare_policy: str = "spare-spread"
    #: Jobs that may time-share a core (+CoSchedOvercommit, paper 004); "none" leaves them waiting.
    overcommit_policy: str = "overcommit"
    profile_dir: str = ""
    profile_runs_dir: str = ""
    unpin_age_cycles: int = 3
    cycle_source: str = "negotiator"  # or "interval"
    interval_s: float = 60.0
    edit_chunk_jobs: int = CHUNK_JOBS
    plan: PlanSettings = PlanSettings()
    #: Paper 004: keep pairs the interference model predicts ill-matched off one node.
    interference: bool = False
    interference_cutoff: float = 0.5
    #: The measured dataset the model is fitted on (empty: the one condor_sched ships).
    interference_dataset: str = ""


def boolean(text: str) -> bool:
    """An HTCondor boolean knob (true/false, yes/no, 1/0; any case)."""
    value = {"true": True, "yes": True, "1": True, "false": False, "no": False, "0": False}.get(text.lower())
    if value is None:
        raise ValueError(text)
    return value


# knob -> (field of SidecarSettings or PlanSettings, parser)
_KNOBS: dict[str, tuple[str, Callable[[str], object]]] = {
    "COSCHED_POLICY": ("policy", str),
    "COSCHED_SPREAD_POLICY": ("spread_policy", str),
    "COSCHED_NODE_POLICY": ("node_policy", str),
    "COSCHED_GPU_POLICY": ("gpu_policy", str),
    "COSCHED_SPARE_POLICY": ("spare_policy", str),
    "COSCHED_OVERCOMMIT_POLICY": ("overcommit_policy", str),
    "COSCHED_PROFILE_DIR": ("profile_dir", str),
    "COSCHED_PROFILE_RUNS_DIR": ("profile_runs_dir", str),
    "COSCHED_UNPIN_AGE_CYCLES": ("unpin_age_cycles", int),
    "COSCHED_CYCLE_SOURCE": ("cycle_source", str),
    "COSCHED_INTERVAL": ("interval_s", float),
    "COSCHED_EDIT_CHUNK_JOBS": ("edit_chunk_jobs", int),
    "COSCHED_SOLVER_TIME_LIMIT": ("plan.solver_time_limit_s", float),
    "COSCHED_MEMORY_GRANULARITY_MB": ("plan.memory_granularity_mb", int),
    "COSCHED_KNAPSACK_SOLVER": ("plan.knapsack_solver", str),
    "COSCHED_THREAD_OVERCOMMIT": ("plan.thread_overcommit", float),
    "COSCHED_AGE_LIMIT_CYCLES": ("plan.age_limit_cycles", int),
    "COSCHED_SPREAD_AGE_LIMIT_CYCLES": ("plan.spread_age_limit_cycles", int),
    "COSCHED_INTERFERENCE": ("interference", boolean),
    "COSCHED_INTERFERENCE_CUTOFF": ("interference_cutoff", float),
    "COSCHED_INTERFERENCE_DATASET": ("interference_dataset", str),
}


#: The numeric knobs' ranges: those of the matching command-line options (options.py).
_RANGES: dict[str, tuple[float, float]] = {
    "COSCHED_UNPIN_AGE_CYCLES": (1, options.MAX_AGE_CYCLES),
    "COSCHED_AGE_LIMIT_CYCLES": (1, options.MAX_AGE_CYCLES),
    "COSCHED_SPREAD_AGE_LIMIT_CYCLES": (1, options.MAX_AGE_CYCLES),
    "COSCHED_INTERVAL": (0.1, 86400.0),
    "COSCHED_EDIT_CHUNK_JOBS": (1, MAX_CHUNK_JOBS),
    "COSCHED_SOLVER_TIME_LIMIT": (options.MIN_SOLVER_TIME_LIMIT_S, options.MAX_SOLVER_TIME_LIMIT_S),
    "COSCHED_MEMORY_GRANULARITY_MB": (1, options.MAX_GRANULARITY_MB),
    "COSCHED_THREAD_OVERCOMMIT": (1.0, options.MAX_THREAD_OVERCOMMIT),
    "COSCHED_INTERFERENCE_CUTOFF": (0.01, 0.99),
}


def settings_from_knobs(knobs: Mapping[str, str]) -> SidecarSettings:
    """Parse COSCHED_* knob values (a mapping like ``htcondor2.param``); unset ones keep defaults."""
    top: dict[str, object] = {}
    plan: dict[str, object] = {}
    for knob, (field, parse) in _KNOBS.items():
        raw = knobs.get(knob)
        if raw is None or str(raw).strip() == "":
            continue
        try:
            value = parse(str(raw).strip())
        except ValueError:
            raise SettingsError(f"{knob} = {raw!r} is not a valid {parse.__name__}") from None
        low, high = _RANGES.get(knob, (0, math.inf))
        if isinstance(value, (int, float)) and not isinstance(value, bool) and (not math.isfinite(value) or value <= 0 or not low <= value <= high):
            raise SettingsError(f"{knob} = {raw!r} must be a finite number in [{low:g}, {high:g}]"
                                if knob in _RANGES else f"{knob} = {raw!r} must be positive")
        if field.startswith("plan."):
            plan[field[5:]] = value
        else:
            top[field] = value
    settings = SidecarSettings(**top, plan=PlanSettings(**plan))  # type: ignore[arg-type]
    device = policy_names(PolicyKind.DEVICE)
    spread = policy_names(PolicyKind.SPREAD)
    if settings.policy not in device:
        raise SettingsError(f"COSCHED_POLICY = {settings.policy!r} is not a device policy; known: {', '.join(device)}")
    if settings.spread_policy != "none" and settings.spread_policy not in spread:
        raise SettingsError(f"COSCHED_SPREAD_POLICY = {settings.spread_policy!r} is not a spread policy; "
                            f"known: none, {', '.join(spread)}")
    if settings.node_policy not in ("none", LIVE_NODE_POLICY):
        raise SettingsError(f"COSCHED_NODE_POLICY = {settings.node_policy!r}: use {LIVE_NODE_POLICY} or none "
                            "(backfill is a simulator baseline: HTCondor holds no reservations)")
    gpu = gpu_policy_names()
    if settings.gpu_policy != "none" and settings.gpu_policy not in gpu:
        raise SettingsError(f"COSCHED_GPU_POLICY = {settings.gpu_policy!r} is not a GPU policy; known: none, "
                            f"{', '.join(gpu)}")
    spare = policy_names(PolicyKind.SPARE)
    if settings.spare_policy != "none" and settings.spare_policy not in spare:
        raise SettingsError(f"COSCHED_SPARE_POLICY = {settings.spare_policy!r} is not a spare-capacity policy; "
                            f"known: none, {', '.join(spare)}")
    overcommit = policy_names(PolicyKind.OVERCOMMIT)
    if settings.overcommit_policy != "none" and settings.overcommit_policy not in overcommit:
        raise SettingsError(f"COSCHED_OVERCOMMIT_POLICY = {settings.overcommit_policy!r} is not an overcommit "
                            f"policy; known: none, {', '.join(overcommit)}")
    if settings.cycle_source not in ("negotiator", "interval"):
        raise SettingsError(f"COSCHED_CYCLE_SOURCE = {settings.cycle_source!r}: use negotiator or interval")
    if settings.plan.thread_overcommit != 1.0:
        raise SettingsError(
            f"COSCHED_THREAD_OVERCOMMIT = {settings.plan.thread_overcommit:g}: a live pool accounts only the "
            f"device compute ({', '.join(k.compute_attr for k in device_kinds())}) its startds advertise, "
            "so pins planned beyond it could never match, and the "
            "PREPARE_JOB hook refuses starts beyond a device's hardware threads (there is no offload "
            "arbiter); keep it at 1.0: plan and simulate take --thread-overcommit for what-if studies")
    if settings.interference and not settings.profile_runs_dir:
        raise SettingsError("COSCHED_INTERFERENCE = true needs COSCHED_PROFILE_RUNS_DIR: the node agents record "
                            "the programs' interference profiles there (docs/admin.md, interference-aware placement)")
    if settings.plan.knapsack_solver not in ("dp", "ortools"):
        raise SettingsError(f"COSCHED_KNAPSACK_SOLVER = {settings.plan.knapsack_solver!r}: use dp or ortools")
    return settings


def settings_from_htcondor() -> SidecarSettings:
    import htcondor2

    return settings_from_knobs({k: htcondor2.param[k] for k in _KNOBS if k in htcondor2.param})


def knob_names() -> list[str]:
    return list(_KNOBS)
