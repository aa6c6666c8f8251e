"""The overcommit mode (paper 004, Section 3.3) and its planners by name."""
from __future__ import annotations

from condor_sched.model import Slot, SlotKind
from condor_sched.modes.overcommit.live import NaiveOvercommitPolicy, OvercommitPolicy
from condor_sched.modes.planning import PolicyKind
from condor_sched.modes.slot_mode import SlotMode


class OvercommitMode(SlotMode):
    """Paper 004's overcommitting: a job with ``+CoSchedOvercommit = true`` is pinned to an
    overcommitting node's slot (``CoSchedMultiplicity``), where it may time-share a core."""

    name = "overcommit"
    paper = "paper 004 (Section 3.3): overcommitting scheduling, M jobs per core"
    planners = {"overcommit": OvercommitPolicy, "naive-overcommit": NaiveOvercommitPolicy}
    default_planner = "overcommit"
    policy_kind = PolicyKind.OVERCOMMIT
    knob = "COSCHED_OVERCOMMIT_POLICY"
    slot_kind = SlotKind.OVERCOMMIT
    slot_words = "overcommitting slot"
    slot_kinds = frozenset({SlotKind.OVERCOMMIT})

    def refusal(self, slot: Slot, reason: str) -> str:
        return f"{slot.machine} refused it as an overcommitted job: {reason}"


OVERCOMMIT = OvercommitMode()
