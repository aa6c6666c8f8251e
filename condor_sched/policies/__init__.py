"""Planners, one module per paper or baseline; importing this package registers them all."""
from condor_sched.policies.base import PlanSettings, Policy, PolicyError, get_policy, policy_names, register

__all__ = ["PlanSettings", "Policy", "PolicyError", "get_policy", "policy_names", "register"]

# Each policy module registers itself on import (keep this list sorted).
from condor_sched.policies import exclusive  # noqa: E402,F401
from condor_sched.policies import global_cpsat  # noqa: E402,F401
from condor_sched.policies import knapsack  # noqa: E402,F401
from condor_sched.policies import random_packing  # noqa: E402,F401
from condor_sched.policies import sns  # noqa: E402,F401
from condor_sched.policies import sns_global  # noqa: E402,F401
from condor_sched.policies import spread_baselines  # noqa: E402,F401
