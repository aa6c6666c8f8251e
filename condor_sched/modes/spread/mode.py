"""The Spread-n-Share mode (paper 000): a spread job's procs pinned to socket slots with the
LLC ways and memory bandwidth its plan gives each, and its planners by name."""
from __future__ import annotations

from condor_sched.model import SlotKind
from condor_sched.modes.planning import PlanSettings, PolicyKind
from condor_sched.modes.slot_mode import SlotMode
from condor_sched.modes.spread.baselines import CompactExclusivePolicy, CompactSharePolicy
from condor_sched.modes.spread.sns import SnsPolicy
from condor_sched.modes.spread.sns_global import SnsGlobalPolicy


class SpreadMode(SlotMode):
    """Paper 000's Spread-n-Share: a job naming its program (``+CoSchedProgram``) and asking no
    device is spread over socket slots (``CoSchedPinLLCWays``, ``CoSchedPinMemBW``)."""

    name = "spread"
    paper = "paper 000 (Sections 4.3-4.4): Spread-n-Share by LLC ways and memory bandwidth"
    planners = {"sns": SnsPolicy, "sns-global": SnsGlobalPolicy, "ce": CompactExclusivePolicy,
                "cs": CompactSharePolicy}
    default_planner = "sns"
    policy_kind = PolicyKind.SPREAD
    knob = "COSCHED_SPREAD_POLICY"
    slot_kind = SlotKind.SOCKET
    gang = True

    def age_limit(self, settings: PlanSettings) -> int:
        """The spread planners' own aging limit (``PlanSettings.spread_age_limit``)."""
        return settings.spread_age_limit()


SPREAD = SpreadMode()
