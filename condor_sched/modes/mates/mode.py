"""The running-mates mode (paper 001) and its planners by name."""
from condor_sched.modes.interface import SharingMode
from condor_sched.modes.mates.backfill import EasyBackfillPolicy, SlurmBackfillPolicy
from condor_sched.modes.mates.sd import SlowdownDrivenPolicy, SlurmSlowdownDrivenPolicy
from condor_sched.modes.planning import PolicyKind

MATES = SharingMode(
    name="mates",
    paper="paper 001 (Section 3.2, Listing 1): slowdown-driven co-scheduling with running mates",
    planners={"sd": SlowdownDrivenPolicy, "slurm-sd": SlurmSlowdownDrivenPolicy, "backfill": EasyBackfillPolicy,
              "slurm-backfill": SlurmBackfillPolicy},
    policy_kind=PolicyKind.NODE,
    knob="COSCHED_NODE_POLICY",
)
