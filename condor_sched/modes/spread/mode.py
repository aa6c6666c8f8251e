"""The Spread-n-Share mode (paper 000) and its planners by name."""
from condor_sched.modes.interface import SharingMode
from condor_sched.modes.planning import PolicyKind
from condor_sched.modes.spread.baselines import CompactExclusivePolicy, CompactSharePolicy
from condor_sched.modes.spread.sns import SnsPolicy
from condor_sched.modes.spread.sns_global import SnsGlobalPolicy

SPREAD = SharingMode(
    name="spread",
    paper="paper 000 (Sections 4.3-4.4): Spread-n-Share by LLC ways and memory bandwidth",
    planners={"sns": SnsPolicy, "sns-global": SnsGlobalPolicy, "ce": CompactExclusivePolicy,
              "cs": CompactSharePolicy},
    policy_kind=PolicyKind.SPREAD,
    knob="COSCHED_SPREAD_POLICY",
)
