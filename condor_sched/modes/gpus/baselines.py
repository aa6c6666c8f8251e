"""Five GPU-sharing baselines of Weng et al. (USENIX ATC '23), as the paper's simulator
(hkust-adsl/kubernetes-scheduler-simulator) defines and its experiments configure them.

Each scores every feasible node at once (numpy over the fleet's rows) with the integer score
of its Go plugin, so that ties, which the truncation makes common, fall as in the simulator:
to the smallest node name (:func:`~condor_sched.modes.gpus.fleet_policy.best_node`). The GPU
of a sharing task is then chosen by the experiments' ``gpuSelMethod``: ``random`` for
random-fit, ``best`` (the tightest GPU) for the others, dot-product included
(``generate_config_and_run.py`` keeps ``best`` when ``dimExtMethod`` is ``merge``).
Constants: ``MaxSpecCpu = 128000``, ``MaxSpecGpu = 8000``, scores 0..100
(``pkg/type/open-gpu-share/utils/const.go``, ``framework.MaxNodeScore``).
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from condor_sched.modes.gpus.fleet import WHOLE_GPU_MILLI, GpuFleet, GpuPlacement, GpuTask, gpu_kind
from condor_sched.modes.gpus.fleet_policy import (
    GpuPlanContext,
    best_node,
    exclusive_gpus,
    free_gpu_milli,
    name_rank,
    place_one_by_one,
    tightest_gpu,
)

MAX_SPEC_CPU_MILLI = 128000
MAX_SPEC_GPU_MILLI = 8000
MAX_NODE_SCORE = 100


def _go_int(values: np.ndarray) -> np.ndarray:
    """Go's ``int64(float)``: truncation toward zero."""
    return np.trunc(values).astype(np.int64)


def _go_div(numerator: np.ndarray, denominator: int) -> np.ndarray:
    """Go's integer division (truncation toward zero)."""
    return np.sign(numerator) * (np.abs(numerator) // denominator)


@dataclass(frozen=True, slots=True)
class RandomFitPolicy:
    """A feasible node uniformly at random; a sharing task's GPU uniformly among the node's
    fitting GPUs, whole GPUs the first idle ones (``random_score.go`` PreScore,
    ``allocateGpuIdBasedOnRandomFit`` in ``open_gpu_share.go``). Go's ``math/rand`` stream is
    not reproduced: the draws come from ``context.rng``."""

    name: str = "random-fit"

    def place(self, fleet: GpuFleet, tasks: Sequence[GpuTask], context: GpuPlanContext) -> list[GpuPlacement | None]:
        def choose(fleet: GpuFleet, task: GpuTask, feasible: np.ndarray) -> GpuPlacement:
            node = int(context.rng.choice(np.flatnonzero(feasible)))
            if task.shares_gpu:
                gpus: tuple[int, ...] = (int(context.rng.choice(np.flatnonzero(fleet.gpu_fits(task, node)))),)
            else:
                gpus = exclusive_gpus(fleet, task, node)
            return GpuPlacement(node, gpus)
        return place_one_by_one(fleet, tasks, choose)


def best_fit_scores(fleet: GpuFleet, task: GpuTask) -> np.ndarray:
    """``getBestFitScore`` (``best_fit_score.go``): 100 x (1 - the mean of the CPU and GPU
    left after placing, each over its max spec), truncated; higher is tighter."""
    gpu_left = free_gpu_milli(fleet).sum(axis=1)
    score = np.zeros(len(fleet))
    score = score + (fleet.cpu_free_milli - task.cpu_milli) / float(MAX_SPEC_CPU_MILLI) * 0.5
    score = score + (gpu_left - task.gpu_milli_total) / float(MAX_SPEC_GPU_MILLI) * 0.5
    return _go_int((1.0 - score) * float(MAX_NODE_SCORE))


def dot_product_scores(fleet: GpuFleet, task: GpuTask) -> np.ndarray:
    """``calculateDotProductScore`` (``dot_product_score.go``) with the experiments'
    ``dimExtMethod: merge`` and ``normMethod: max``: the node's free (CPU, all GPU compute)
    and the task's request, each over the max spec, dot product over 2; score 100 x (1 - it),
    truncated (Tetris' alignment: the smaller the product, the better)."""
    gpu_left = free_gpu_milli(fleet).sum(axis=1)
    product = 0.0 + (fleet.cpu_free_milli / float(MAX_SPEC_CPU_MILLI)) * (task.cpu_milli / float(MAX_SPEC_CPU_MILLI))
    product = product + (gpu_left / float(MAX_SPEC_GPU_MILLI)) * (task.gpu_milli_total / float(MAX_SPEC_GPU_MILLI))
    return _go_int(float(MAX_NODE_SCORE) * (1.0 - product / 2.0))


def gpu_packing_scores(fleet: GpuFleet, task: GpuTask) -> np.ndarray:
    """``getPackingScore`` (``gpu_packing_score.go``): best a GPU some task already uses
    (100 - its free tenths / 10, at least 50), then idle GPUs of a used node (50 - idle GPUs
    taken, at least 33), last an idle node (33 - its GPUs, at least its GPUs); 0 for a CPU task."""
    n = len(fleet)
    if task.gpus == 0:
        return np.zeros(n, dtype=np.int64)
    free = free_gpu_milli(fleet)
    idle = ((free == WHOLE_GPU_MILLI) & fleet.gpu_present).sum(axis=1)
    idle_node = np.maximum(MAX_NODE_SCORE // 3 - idle, idle)
    if task.shares_gpu:
        fits = fleet.gpu_present & (free >= task.gpu_milli)
        tightest = np.where(fits, free, np.iinfo(np.int64).max).min(axis=1)
        shared = np.maximum(MAX_NODE_SCORE - (tightest * 100 // WHOLE_GPU_MILLI) // 10, MAX_NODE_SCORE // 2)
        used_node = np.where(tightest == WHOLE_GPU_MILLI, np.maximum(MAX_NODE_SCORE // 2 - 1, MAX_NODE_SCORE // 3),
                             shared)
    else:
        used_node = np.full(n, max(MAX_NODE_SCORE // 2 - task.gpus, MAX_NODE_SCORE // 3), dtype=np.int64)
    return np.where(idle == fleet.gpu_count, idle_node, used_node)


def gpu_clustering_scores(fleet: GpuFleet, task: GpuTask) -> np.ndarray:
    """``gpu_clustering_score.go``: nodes holding only tasks of the task's GPU kind (sharing,
    or its number of whole GPUs) score 75..100, nodes holding that kind among others 50..75,
    empty nodes 25..50, others 0..25; within a band, 25 x the node's used share of 8 GPUs
    (integer arithmetic, as the plugin); 0 for a CPU task."""
    n = len(fleet)
    if task.gpus == 0:
        return np.zeros(n, dtype=np.int64)
    kinds = fleet.tasks_by_gpu_kind
    gpu_left = free_gpu_milli(fleet).sum(axis=1)
    within = _go_div(MAX_NODE_SCORE // 4 * (MAX_SPEC_GPU_MILLI - gpu_left), MAX_SPEC_GPU_MILLI)
    kind = gpu_kind(task)
    has_kind = kinds[:, kind] > 0 if kind < kinds.shape[1] else np.zeros(n, dtype=bool)
    n_kinds = (kinds > 0).sum(axis=1)
    band = np.where(has_kind, np.where(n_kinds == 1, MAX_NODE_SCORE * 3 // 4, MAX_NODE_SCORE * 2 // 4),
                    np.where(n_kinds == 0, MAX_NODE_SCORE // 4, 0))
    return within + band


@dataclass(frozen=True, slots=True)
class ScoredPolicy:
    """A baseline that takes the best-scored feasible node and the tightest GPU there."""

    name: str
    scores: object  # Callable[[GpuFleet, GpuTask], np.ndarray]; object keeps the dataclass hashable

    def place(self, fleet: GpuFleet, tasks: Sequence[GpuTask], context: GpuPlanContext) -> list[GpuPlacement | None]:
        ranks = name_rank(fleet)

        def choose(fleet: GpuFleet, task: GpuTask, feasible: np.ndarray) -> GpuPlacement | None:
            node = best_node(self.scores(fleet, task), feasible, ranks)  # type: ignore[operator]
            return None if node is None else GpuPlacement(node, tightest_gpu(fleet, task, node))
        return place_one_by_one(fleet, tasks, choose)


def best_fit_policy() -> ScoredPolicy:
    """Best-fit (``best_fit_score.go``), GPU by ``gpuSelMethod: best``."""
    return ScoredPolicy("best-fit", best_fit_scores)


def dot_product_policy() -> ScoredPolicy:
    """Dot-product (``dot_product_score.go``, merge/max), GPU by ``gpuSelMethod: best``."""
    return ScoredPolicy("dot-product", dot_product_scores)


def gpu_packing_policy() -> ScoredPolicy:
    """GPU packing (``gpu_packing_score.go``), GPU by ``gpuSelMethod: best``."""
    return ScoredPolicy("gpu-packing", gpu_packing_scores)


def gpu_clustering_policy() -> ScoredPolicy:
    """GPU clustering (``gpu_clustering_score.go``), GPU by ``gpuSelMethod: best``."""
    return ScoredPolicy("gpu-clustering", gpu_clustering_scores)


BASELINES = {
    "random-fit": RandomFitPolicy,
    "best-fit": best_fit_policy,
    "dot-product": dot_product_policy,
    "gpu-packing": gpu_packing_policy,
    "gpu-clustering": gpu_clustering_policy,
}
