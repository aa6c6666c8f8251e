"""``fgd-pack``: FGD whose ties go to the fullest node and the tightest GPU (ours, issue 13).

FGD (:mod:`condor_sched.policies.fgd`, Weng et al., ATC '23) scores a node by the growth of
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

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from condor_sched.policies.fgd import FgdPolicy, _memo
from condor_sched.policies.gpu_fleet import GpuFleet, GpuPlacement, GpuTask
from condor_sched.policies.gpu_policies import (
    INFEASIBLE, GpuPlanContext, best_node, exclusive_gpus, free_gpu_milli, name_rank, typical_tasks,
)


@dataclass(frozen=True, slots=True)
class FgdPackPolicy(FgdPolicy):
    """FGD's score; ties to the fullest node and the tightest GPU (module docstring)."""

    name: str = "fgd-pack"

    def place(self, fleet: GpuFleet, tasks: Sequence[GpuTask], context: GpuPlanContext) -> list[GpuPlacement | None]:
        typical = context.typical_tasks or typical_tasks(tasks)
        memo = _memo(fleet, typical)
        names = name_rank(fleet)
        span = len(fleet) + 1
        placements: list[GpuPlacement | None] = []
        for task in tasks:
            feasible = fleet.node_fits(task)
            if not feasible.any():
                placements.append(None)
                continue
            scores = self._scores(fleet, task, feasible, memo)
            free_share = free_gpu_milli(fleet).sum(axis=1) * 1000 // np.maximum(fleet.gpu_count * 1000, 1)
            fullest = free_share * span + names
            if task.shares_gpu:
                gpu_scores = np.where(fleet.gpu_fits(task), scores, INFEASIBLE)
                node = best_node(gpu_scores.max(axis=1), feasible, fullest)
                assert node is not None
                row = gpu_scores[node]
                best = np.flatnonzero(row == row.max())
                gpus: tuple[int, ...] = (int(best[np.argmin(fleet.gpu_free_milli[node][best])]),)
            else:
                node = best_node(scores, feasible, fullest)
                assert node is not None
                gpus = exclusive_gpus(fleet, task, node)
            placement = GpuPlacement(node, gpus)
            fleet.commit(task, placement)
            memo.touch(fleet, node)
            placements.append(placement)
        return placements
