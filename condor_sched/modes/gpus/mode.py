"""The GPU-share mode (paper 002 on MPS; FGD, Weng et al., USENIX ATC '23) and its fleet
planners by name; it runs the device mode's planners too, on one device slot per GPU."""
from __future__ import annotations

from condor_sched.model import SlotKind
from condor_sched.modes.gpus import fgd, fgd_mem, fgd_mem_batch, fgd_pack
from condor_sched.modes.gpus.baselines import BASELINES
from condor_sched.modes.gpus.live import GpuView
from condor_sched.modes.gpus.on_devices import DevicePolicyOnGpus
from condor_sched.modes.interface import ModeContext, ModeJobs, SharingMode


class GpuMode(SharingMode):
    """A job asking for GPUs (``request_GPUs``, a share through ``request_GPUCompute`` and
    ``request_GPUMemory``) pinned to GPUs of one GPU node slot (``CoSchedPinGPUs`` and the
    shares of each, then ``CoSchedPinSlot``)."""

    name = "gpus"
    paper = "paper 002 on MPS (GPU shares); FGD and its baselines (Weng et al., USENIX ATC '23)"
    planners = {**BASELINES, "fgd": fgd.FgdPolicy, "fgd-pack": fgd_pack.FgdPackPolicy, "fgd-mem": fgd_mem.FgdMemPolicy,
                "fgd-mem-batch": fgd_mem_batch.FgdMemBatchPolicy}
    knob = "COSCHED_GPU_POLICY"
    adopts = ("devices", DevicePolicyOnGpus)
    slot_words = "GPU node slot"
    slot_kinds = frozenset({SlotKind.GPU_NODE})

    def view(self, jobs: ModeJobs, context: ModeContext) -> GpuView:
        return GpuView(jobs, context)


GPUS = GpuMode()
