"""FGD, fragmentation gradient descent (Weng et al., USENIX ATC '23, Section 4), as the
paper's simulator defines it (``pkg/utils/frag.go``, ``pkg/simulator/plugin/fgd_score.go``).

Fragmentation of a node w.r.t. the target workload (typical task classes p with popularity
f_p) is ``sum_p f_p * F_p``: F_p is the node's free GPU compute that a task of class p
cannot use. When p fits the node (GPU model accepted, enough CPU, enough GPUs each with at
least p's per-GPU compute free) F_p is the free compute of the GPUs with less than p's
compute free; otherwise (p does not fit, or p needs no GPU) it is all the node's free
compute (``NodeGpuShareFragAmount``: every class except "Q3 satisfied" counts whole).
FGD places a task where the fragmentation grows least: node score
``int64(sigmoid((frag_before - frag_after) / 1000) * 100)``, the highest score wins (ties to
the smallest node name); a sharing task tries each GPU with enough compute free and keeps
the first best one (``calculateGpuShareFragExtendScore``); whole GPUs are the first idle
ones, which does not change the fragmentation (idle GPUs are interchangeable).

Host memory and GPU memory do not enter the score (the simulator's ``NodeResource`` has
neither); they are feasibility constraints of the fleet, as the simulator's filters.

Speed: the fragmentation of every node and every candidate GPU is one numpy expression
(n x width x classes, exact integers before the weighting, so that equal states score
bit-equal as in Go). Scores are kept per node and task class and recomputed only for nodes
whose free CPU or GPU compute changed since (a memo per fleet, checked against the fleet's
arrays at every call, so that releases or commits made elsewhere are seen).
"""
from __future__ import annotations

import weakref
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from condor_sched.modes.gpus.fleet import GpuFleet, GpuPlacement, GpuTask
from condor_sched.modes.gpus.fleet_policy import (
    INFEASIBLE,
    GpuPlanContext,
    best_node,
    exclusive_gpus,
    free_gpu_milli,
    name_rank,
    typical_tasks,
)

MAX_NODE_SCORE = 100


@dataclass(frozen=True, slots=True)
class TargetWorkload:
    """Typical task classes as arrays (one entry per class)."""

    cpu_milli: np.ndarray
    gpu_milli: np.ndarray
    gpus: np.ndarray
    popularity: np.ndarray
    model_ok: np.ndarray  # (fleet models x classes): the class accepts the model

    @classmethod
    def of(cls, fleet: GpuFleet, typical: Sequence[tuple[GpuTask, float]]) -> TargetWorkload:
        tasks = [t for t, _ in typical]
        model_ok = np.array([[t.models is None or model in t.models for t in tasks] for model in fleet.model_names],
                            dtype=bool).reshape(len(fleet.model_names), len(tasks))
        return cls(cpu_milli=np.array([t.cpu_milli for t in tasks], dtype=np.int64),
                   gpu_milli=np.array([t.gpu_milli if t.gpus else 0 for t in tasks], dtype=np.int64),
                   gpus=np.array([t.gpus for t in tasks], dtype=np.int64),
                   popularity=np.array([p for _, p in typical], dtype=np.float64), model_ok=model_ok)


def fragmentation(cpu_free_milli: np.ndarray, gpu_free_milli: np.ndarray, model_ok: np.ndarray,
                  target: TargetWorkload) -> np.ndarray:
    """Fragmentation (GPU milli) of nodes w.r.t. the target workload (module docstring;
    ``NodeGpuShareFragAmountScore`` in ``frag.go``). ``gpu_free_milli`` is (..., width), 0 on
    absent GPUs; ``cpu_free_milli`` and ``model_ok`` (..., classes) broadcast to it."""
    return unusable_milli(cpu_free_milli, gpu_free_milli, model_ok, target) @ target.popularity


def unusable_milli(cpu_free_milli: np.ndarray, gpu_free_milli: np.ndarray, model_ok: np.ndarray,
                   target: TargetWorkload) -> np.ndarray:
    """F_p of every node and class (..., classes), exact integers."""
    free = gpu_free_milli[..., :, None]
    enough = free >= target.gpu_milli
    count = enough.sum(axis=-2)
    small = np.where(enough, 0, free).sum(axis=-2)
    total = gpu_free_milli.sum(axis=-1)[..., None]
    fits = model_ok & (count >= target.gpus) & (cpu_free_milli[..., None] >= target.cpu_milli) & (target.gpus > 0)
    return np.where(fits, small, total)


def fgd_scores(delta_milli: np.ndarray) -> np.ndarray:
    """``int64(sigmoid(delta / 1000) * MaxNodeScore)`` of ``fgd_score.go``."""
    return np.trunc(1.0 / (1.0 + np.exp(-(delta_milli / 1000.0))) * MAX_NODE_SCORE).astype(np.int64)


def node_scores(fleet: GpuFleet, task: GpuTask, nodes: np.ndarray, target: TargetWorkload) -> np.ndarray:
    """FGD scores of ``task`` on ``nodes`` (indexes): (len(nodes), width) for a sharing task
    (one score per GPU, INFEASIBLE where its compute does not fit), (len(nodes),) otherwise."""
    free = free_gpu_milli(fleet)[nodes]
    cpu = fleet.cpu_free_milli[nodes]
    model_ok = target.model_ok[fleet.model_of_node[nodes]]
    before = fragmentation(cpu, free, model_ok, target)
    cpu_after = cpu - task.cpu_milli
    if task.shares_gpu:
        width = free.shape[1]
        after_free = np.repeat(free[:, None, :], width, axis=1)
        diagonal = np.arange(width)
        after_free[:, diagonal, diagonal] -= task.gpu_milli
        after = fragmentation(cpu_after[:, None], after_free, model_ok[:, None, :], target)
        scores = fgd_scores(before[:, None] - after)
        fits = fleet.gpu_present[nodes] & (free >= task.gpu_milli)
        return np.where(fits, scores, INFEASIBLE)
    after_free = free.copy()
    if task.gpus:
        # The first idle GPUs (any idle ones give the same fragmentation).
        idle_rank = np.cumsum(free == fleet.compute_capacity, axis=1)
        taken = (free == fleet.compute_capacity) & (idle_rank <= task.gpus)
        after_free[taken] -= task.gpu_milli
    after = fragmentation(cpu_after, after_free, model_ok, target)
    return fgd_scores(before - after)


@dataclass(slots=True)
class _Memo:
    """FGD scores per task class and node, valid while the node's version is unchanged."""

    typical: tuple[tuple[GpuTask, float], ...]
    target: TargetWorkload
    cpu_free_milli: np.ndarray
    gpu_free_milli: np.ndarray
    version: np.ndarray
    scores: dict[tuple, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)

    def sync(self, fleet: GpuFleet) -> None:
        """Bump the version of nodes whose free CPU or GPU compute changed since last seen."""
        changed = (self.cpu_free_milli != fleet.cpu_free_milli) | (self.gpu_free_milli != fleet.gpu_free_milli).any(axis=1)
        if changed.any():
            self.version[changed] += 1
            self.cpu_free_milli[changed] = fleet.cpu_free_milli[changed]
            self.gpu_free_milli[changed] = fleet.gpu_free_milli[changed]

    def touch(self, fleet: GpuFleet, node: int) -> None:
        self.version[node] += 1
        self.cpu_free_milli[node] = fleet.cpu_free_milli[node]
        self.gpu_free_milli[node] = fleet.gpu_free_milli[node]


_memos: weakref.WeakKeyDictionary[GpuFleet, _Memo] = weakref.WeakKeyDictionary()


def _memo(fleet: GpuFleet, typical: tuple[tuple[GpuTask, float], ...]) -> _Memo:
    memo = _memos.get(fleet)
    if memo is None or len(memo.version) != len(fleet) or not (memo.typical is typical or memo.typical == typical):
        memo = _Memo(typical=typical, target=TargetWorkload.of(fleet, typical),
                     cpu_free_milli=fleet.cpu_free_milli.copy(), gpu_free_milli=fleet.gpu_free_milli.copy(),
                     version=np.zeros(len(fleet), dtype=np.int64))
        _memos[fleet] = memo
    else:
        memo.sync(fleet)
    return memo


@dataclass(frozen=True, slots=True)
class FgdPolicy:
    """Fragmentation gradient descent (module docstring; ``fgd_score.go``). The target
    workload is ``context.typical_tasks``, or, when empty, :func:`typical_tasks` of the batch."""

    name: str = "fgd"

    def place(self, fleet: GpuFleet, tasks: Sequence[GpuTask], context: GpuPlanContext) -> list[GpuPlacement | None]:
        typical = context.typical_tasks or typical_tasks(tasks)
        memo = self.memo_of(fleet, typical)
        names = name_rank(fleet)
        placements: list[GpuPlacement | None] = []
        for task in tasks:
            feasible = fleet.node_fits(task)
            if not feasible.any():
                placements.append(None)
                continue
            scores = self.scores(fleet, task, feasible, memo)
            ranks = self.tie_ranks(fleet, names)
            if task.shares_gpu:
                gpu_scores = np.where(fleet.gpu_fits(task), scores, INFEASIBLE)
                node = best_node(gpu_scores.max(axis=1), feasible, ranks)
                assert node is not None
                gpus: tuple[int, ...] = (self.gpu_among(fleet, node, gpu_scores[node]),)
            else:
                node = best_node(scores, feasible, ranks)
                assert node is not None
                gpus = exclusive_gpus(fleet, task, node)
            placement = GpuPlacement(node, gpus)
            fleet.commit(task, placement)
            memo.touch(fleet, node)
            placements.append(placement)
        return placements

    def memo_of(self, fleet: GpuFleet, typical: tuple[tuple[GpuTask, float], ...]) -> _Memo:
        """The scores kept on ``fleet`` for this target workload (with ``touch`` and ``scores``
        they are what a variant of FGD's score overrides)."""
        return _memo(fleet, typical)

    def tie_ranks(self, fleet: GpuFleet, names: np.ndarray) -> np.ndarray:
        """Each node's rank among nodes of equal score (lowest wins): the node name's, as
        the simulator's ``selectHost``."""
        return names

    def gpu_among(self, fleet: GpuFleet, node: int, gpu_scores: np.ndarray) -> int:
        """The GPU a share takes on ``node``: the first best-scored one
        (``calculateGpuShareFragExtendScore``)."""
        return int(np.argmax(gpu_scores))

    def scores(self, fleet: GpuFleet, task: GpuTask, feasible: np.ndarray, memo: _Memo) -> np.ndarray:
        """The task's scores on every feasible node (per GPU for a share), from ``memo`` where
        the node is unchanged since they were computed."""
        key = self.score_key(task)
        cached = memo.scores.get(key)
        if cached is None:
            shape = (len(fleet), fleet.width) if task.shares_gpu else (len(fleet),)
            cached = (np.full(shape, INFEASIBLE, dtype=np.int64), np.full(len(fleet), -1, dtype=np.int64))
            memo.scores[key] = cached
        scores, version = cached
        stale = np.flatnonzero(feasible & (version != memo.version))
        if stale.size:
            scores[stale] = self.score_nodes(fleet, task, stale, memo.target)
            version[stale] = memo.version[stale]
        return scores

    @staticmethod
    def score_key(task: GpuTask) -> tuple:
        """What a task's scores depend on (tasks equal in it share them)."""
        return (task.cpu_milli, task.gpus, task.gpu_milli)

    @staticmethod
    def score_nodes(fleet: GpuFleet, task: GpuTask, nodes: np.ndarray, target) -> np.ndarray:
        return node_scores(fleet, task, nodes, target)
