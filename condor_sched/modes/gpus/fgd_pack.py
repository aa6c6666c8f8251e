"""``fgd-pack``: FGD whose ties go to the fullest node and the tightest GPU (ours, issue 13).

FGD (:mod:`condor_sched.modes.gpus.fgd`, Weng et al., ATC '23) scores a node by the growth of
its fragmentation, as an integer from 0 to 100 (``int64(sigmoid(delta / 1000) * 100)``), and
the paper's scheduler breaks the many ties that truncation makes by node name, which picks
among equally scored nodes by an accident of naming. ``fgd-pack`` keeps FGD's score exactly
and changes only that choice:

* among the nodes with the best score, the one whose GPUs are the most used, as a share of
  its GPU compute (in thousandths; then the name): a near-tie of fragmentation goes to
  consolidation, which
  keeps idle GPUs together on idle nodes, where whole- and multi-GPU tasks and CPU-heavy
  tasks still fit (the fragmentation measure sees those classes only by their popularity);
* a sharing task takes, among the node's best-scored GPUs, the one with the least free
  compute (FGD takes the first by index).

The score and its resolution are FGD's. The tie rule was chosen among four (least free GPU
compute, least free share, least free CPU, and FGD's name order with the tightest GPU) on
seeds 0-3 of the default, cpu050 and gpuspec10 lists; docs/results.md has its figures beside
FGD's on every list with seeds 0-9, online and in negotiation-cycle batches, with the packing
bound that shows how far any policy could go.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from condor_sched.modes.gpus.fgd import FgdPolicy
from condor_sched.modes.gpus.fleet import GpuFleet
from condor_sched.modes.gpus.fleet_policy import free_gpu_milli


@dataclass(frozen=True, slots=True)
class FgdPackPolicy(FgdPolicy):
    """FGD's score; ties to the fullest node and the tightest GPU (module docstring)."""

    name: str = "fgd-pack"

    def tie_ranks(self, fleet: GpuFleet, names: np.ndarray, nodes: np.ndarray) -> np.ndarray:
        """The nodes by the share of their GPU compute still free (thousandths), then name."""
        free_share = free_gpu_milli(fleet, nodes).sum(axis=1) * 1000 // np.maximum(fleet.gpu_count[nodes] * 1000, 1)
        return free_share * (len(fleet) + 1) + names[nodes]

    def gpu_among(self, fleet: GpuFleet, node: int, gpu_scores: np.ndarray) -> int:
        """Among the best-scored GPUs, the one with the least free compute (then the first)."""
        best = np.flatnonzero(gpu_scores == gpu_scores.max())
        return int(best[np.argmin(fleet.gpu_free_milli[node][best])])
