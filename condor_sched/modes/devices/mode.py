"""The device-packing mode (paper 002) and its planners by name."""
from condor_sched.modes.devices.exclusive import ExclusivePolicy
from condor_sched.modes.devices.global_cpsat import GlobalPolicy
from condor_sched.modes.devices.knapsack import KnapsackPolicy
from condor_sched.modes.devices.lp_pack import LpPackPolicy
from condor_sched.modes.devices.random_packing import RandomPolicy
from condor_sched.modes.devices.thread_fill import ThreadFillPolicy
from condor_sched.modes.interface import SharingMode
from condor_sched.modes.planning import PolicyKind

DEVICES = SharingMode(
    name="devices",
    paper="paper 002 (Section IV-C, Eq. 1, Fig. 4): device knapsack packing",
    planners={"knapsack": KnapsackPolicy, "global": GlobalPolicy, "lp-pack": LpPackPolicy,
              "thread-fill": ThreadFillPolicy, "random": RandomPolicy, "exclusive": ExclusivePolicy},
    policy_kind=PolicyKind.DEVICE,
    knob="COSCHED_POLICY",
)
