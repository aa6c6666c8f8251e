"""The GPU-share mode (paper 002 on MPS; FGD, Weng et al., USENIX ATC '23) and its fleet
planners by name; it runs the device mode's planners too, on one device slot per GPU."""
from condor_sched.modes.gpus import fgd, fgd_mem, fgd_mem_batch, fgd_pack
from condor_sched.modes.gpus.baselines import BASELINES
from condor_sched.modes.gpus.on_devices import DevicePolicyOnGpus
from condor_sched.modes.interface import SharingMode

GPUS = SharingMode(
    name="gpus",
    paper="paper 002 on MPS (GPU shares); FGD and its baselines (Weng et al., USENIX ATC '23)",
    planners={**BASELINES, "fgd": fgd.FgdPolicy, "fgd-pack": fgd_pack.FgdPackPolicy, "fgd-mem": fgd_mem.FgdMemPolicy,
              "fgd-mem-batch": fgd_mem_batch.FgdMemBatchPolicy},
    knob="COSCHED_GPU_POLICY",
    adopts=("devices", DevicePolicyOnGpus),
)
