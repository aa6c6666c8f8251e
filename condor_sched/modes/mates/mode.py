"""The running-mates mode (paper 001) and its planners by name."""
from __future__ import annotations

from condor_sched.edits import JobChange
from condor_sched.model import JobKey, Slot, SlotKind
from condor_sched.modes.interface import ModeContext, ModeJobs, SharingMode
from condor_sched.modes.mates.backfill import EasyBackfillPolicy, SlurmBackfillPolicy
from condor_sched.modes.mates.live import MatesView, guest_unpin_writes
from condor_sched.modes.mates.sd import SlowdownDrivenPolicy, SlurmSlowdownDrivenPolicy
from condor_sched.modes.planning import PolicyKind


class MatesMode(SharingMode):
    """A malleable whole-node job (``+CoSchedMalleable``) started early as a guest on a running
    mate's node (``CoSchedPinMate``), the mate's limit lengthened first (paper 001). A guest
    slot's START takes pinned guests without the pin clause, so nothing is enrolled."""

    name = "mates"
    paper = "paper 001 (Section 3.2, Listing 1): slowdown-driven co-scheduling with running mates"
    planners = {"sd": SlowdownDrivenPolicy, "slurm-sd": SlurmSlowdownDrivenPolicy, "backfill": EasyBackfillPolicy,
                "slurm-backfill": SlurmBackfillPolicy}
    policy_kind = PolicyKind.NODE
    knob = "COSCHED_NODE_POLICY"
    slot_words = "guest slot"
    pin_words = "guest pin"
    slot_kinds = frozenset({SlotKind.GUEST})
    enrolls = False

    def refusal(self, slot: Slot, reason: str) -> str:
        return f"{slot.machine} refused it as a guest: {reason}"

    def view(self, jobs: ModeJobs, context: ModeContext) -> MatesView:
        return MatesView(jobs, context)

    def unpin_change(self, job: JobKey) -> JobChange:
        """A guest's unpin clears its mate's name and increase too."""
        return JobChange(job, guest_unpin_writes())


MATES = MatesMode()
