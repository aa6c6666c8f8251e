"""Planners, one module per paper or baseline; importing this package registers them all."""
from condor_sched.policies.base import PlanSettings, Policy, PolicyError, get_policy, policy_names, register

__all__ = ["PlanSettings", "Policy", "PolicyError", "get_policy", "policy_names", "register"]

# Each policy module registers itself on import (keep this list sorted).
from condor_sched.policies import knapsack  # noqa: E402,F401
