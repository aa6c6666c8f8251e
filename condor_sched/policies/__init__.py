"""Planners, one module per paper or baseline; importing this package registers them all."""
from condor_sched.policies.base import (
    PlanRequest, PlanSettings, Policy, PolicyError, PolicyKind, get_policy, policy_names, register, run_policy,
)

__all__ = ["PlanRequest", "PlanSettings", "Policy", "PolicyError", "PolicyKind", "get_policy", "policy_names",
           "register", "run_policy"]

# Each policy module registers itself on import (keep this list sorted).
from condor_sched.policies import backfill  # noqa: E402,F401
from condor_sched.policies import exclusive  # noqa: E402,F401
from condor_sched.policies import global_cpsat  # noqa: E402,F401
from condor_sched.policies import knapsack  # noqa: E402,F401
from condor_sched.policies import packed  # noqa: E402,F401
from condor_sched.policies import random_packing  # noqa: E402,F401
from condor_sched.policies import sd  # noqa: E402,F401
from condor_sched.policies import sns  # noqa: E402,F401
from condor_sched.policies import sns_global  # noqa: E402,F401
from condor_sched.policies import spread_baselines  # noqa: E402,F401
from condor_sched.policies import thread_fill  # noqa: E402,F401
