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
    NoRoom,
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


@dataclass(frozen=True, slots=True)
class GpuClassCounts:
    """What FGD's measure reads of k nodes' GPUs for each task class, exact integers: whether
    each GPU has the class's per-GPU compute free (``enough``, k x width x classes), its free
    compute where it has less (``small_terms``, else 0), their sums per node (``count``,
    ``small``: k x classes) and the node's free compute (``total``: k)."""

    enough: np.ndarray
    small_terms: np.ndarray
    count: np.ndarray
    small: np.ndarray
    total: np.ndarray

    @classmethod
    def of(cls, gpu_free_milli: np.ndarray, target: TargetWorkload) -> GpuClassCounts:
        free = gpu_free_milli[:, :, None]
        enough = free >= target.gpu_milli
        small_terms = np.where(enough, 0, free)
        return cls(enough, small_terms, enough.sum(axis=1), small_terms.sum(axis=1), gpu_free_milli.sum(axis=1))

    def fragmentation(self, node_fits_class: np.ndarray, target: TargetWorkload) -> np.ndarray:
        """:func:`fragmentation` of the nodes, ``node_fits_class`` (k x classes) being all of
        "the class fits the node" but the GPU count."""
        fits = node_fits_class & (self.count >= target.gpus)
        return np.where(fits, self.small, self.total[:, None]) @ target.popularity

    def after_share(self, gpu_free_milli: np.ndarray, share_milli: int, node_fits_class: np.ndarray,
                    target: TargetWorkload) -> np.ndarray:
        """The fragmentation of each node after a share of ``share_milli`` goes to each of its
        GPUs in turn: (k, width); ``node_fits_class`` as in :meth:`fragmentation`, after the
        share's CPU (and memory) are taken."""
        return self.unusable_after_share(gpu_free_milli, share_milli, node_fits_class, target) @ target.popularity

    def unusable_after_share(self, gpu_free_milli: np.ndarray, share_milli: int, node_fits_class: np.ndarray,
                             target: TargetWorkload) -> np.ndarray:
        """F_p after the share on each GPU (k, width, classes): the integers :func:`unusable_milli`
        gives on the k x width states the share leaves (one GPU less by ``share_milli`` each),
        in k x width x classes instead of k x width x width x classes, since taking from GPU g
        changes only g's terms."""
        after = gpu_free_milli[:, :, None] - share_milli
        enough_after = after >= target.gpu_milli
        count = self.count[:, None, :] - self.enough + enough_after
        small = self.small[:, None, :] - self.small_terms + np.where(enough_after, 0, after)
        total = (self.total - share_milli)[:, None, None]
        fits = node_fits_class[:, None, :] & (count >= target.gpus)
        return np.where(fits, small, total)


class NodeClassCounts:
    """:class:`GpuClassCounts` of every node of a fleet, kept while a node's memo version is
    unchanged (its GPUs' free compute cannot have moved): a node is counted once per change,
    not once per task shape scored on it."""

    def __init__(self, n: int, width: int, target: TargetWorkload) -> None:
        classes = len(target.popularity)
        self.target = target
        self.all = GpuClassCounts(np.zeros((n, width, classes), dtype=bool),
                                  np.zeros((n, width, classes), dtype=np.int64), np.zeros((n, classes), dtype=np.int64),
                                  np.zeros((n, classes), dtype=np.int64), np.zeros(n, dtype=np.int64))
        self.version = np.full(n, -1, dtype=np.int64)

    def rows(self, fleet: GpuFleet, nodes: np.ndarray, version: np.ndarray) -> GpuClassCounts:
        """The counts of ``nodes``, recounting those whose ``version`` moved since."""
        stale = nodes[self.version[nodes] != version[nodes]]
        if stale.size:
            fresh = GpuClassCounts.of(free_gpu_milli(fleet, stale), self.target)
            for name in GpuClassCounts.__slots__:
                getattr(self.all, name)[stale] = getattr(fresh, name)
            self.version[stale] = version[stale]
        return GpuClassCounts(*(getattr(self.all, name)[nodes] for name in GpuClassCounts.__slots__))


def fgd_scores(delta_milli: np.ndarray) -> np.ndarray:
    """``int64(sigmoid(delta / 1000) * MaxNodeScore)`` of ``fgd_score.go``."""
    return np.trunc(1.0 / (1.0 + np.exp(-(delta_milli / 1000.0))) * MAX_NODE_SCORE).astype(np.int64)


def node_scores(fleet: GpuFleet, task: GpuTask, nodes: np.ndarray, target: TargetWorkload,
                counts: GpuClassCounts | None = None) -> np.ndarray:
    """FGD scores of ``task`` on ``nodes`` (indexes): (len(nodes), width) for a sharing task
    (one score per GPU, INFEASIBLE where its compute does not fit), (len(nodes),) otherwise.
    ``counts``: the nodes' :class:`GpuClassCounts` when already at hand."""
    free = free_gpu_milli(fleet, nodes)
    counts = GpuClassCounts.of(free, target) if counts is None else counts
    cpu = fleet.cpu_free_milli[nodes]
    model_ok = target.model_ok[fleet.model_of_node[nodes]] & (target.gpus > 0)
    before = counts.fragmentation(model_ok & (cpu[:, None] >= target.cpu_milli), target)
    cpu_after = cpu - task.cpu_milli
    if task.shares_gpu:
        fits_class = model_ok & (cpu_after[:, None] >= target.cpu_milli)
        scores = fgd_scores(before[:, None] - counts.after_share(free, task.gpu_milli, fits_class, target))
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


#: Nodes scored at once from which it pays to look for nodes in the same state first.
DISTINCT_FROM = 64


def distinct_nodes(fleet: GpuFleet, nodes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``nodes`` with one node per state (free CPU, memory and per-GPU compute, GPU model: all
    a node's score depends on), and for each of ``nodes`` its representative's index. A fleet's
    nodes start alike, so a task shape first scored on a large fleet scores a few states."""
    if nodes.size < DISTINCT_FROM:
        return nodes, np.arange(nodes.size)
    state = np.column_stack([fleet.cpu_free_milli[nodes], fleet.memory_free_mib[nodes],
                             fleet.model_of_node[nodes], fleet.gpu_free_milli[nodes]])
    _, first, inverse = np.unique(state, axis=0, return_index=True, return_inverse=True)
    if first.size * 2 > nodes.size:
        return nodes, np.arange(nodes.size)
    return nodes[first], inverse.reshape(-1)


@dataclass(slots=True)
class _Memo:
    """FGD scores per task class and node, valid while the node's version is unchanged."""

    typical: tuple[tuple[GpuTask, float], ...]
    target: TargetWorkload
    cpu_free_milli: np.ndarray
    gpu_free_milli: np.ndarray
    version: np.ndarray
    counts: NodeClassCounts
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
        target = TargetWorkload.of(fleet, typical)
        memo = _Memo(typical=typical, target=target,
                     cpu_free_milli=fleet.cpu_free_milli.copy(), gpu_free_milli=fleet.gpu_free_milli.copy(),
                     version=np.zeros(len(fleet), dtype=np.int64),
                     counts=NodeClassCounts(len(fleet), fleet.width, target))
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
        no_room = NoRoom()
        for task in tasks:
            if no_room.covers(task):
                placements.append(None)
                continue
            feasible, gpu_fit = fleet.fits(task)
            candidates = np.flatnonzero(feasible)
            if candidates.size == 0:
                no_room.add(task)
                placements.append(None)
                continue
            scores = self.scores(fleet, task, feasible, memo)
            if task.shares_gpu:
                gpu_scores = np.where(gpu_fit[candidates], scores[candidates], INFEASIBLE)  # type: ignore[index]
                best = gpu_scores.max(axis=1)
            else:
                best = scores[candidates]
            tied = np.flatnonzero(best == best.max())
            pick = int(tied[0]) if tied.size == 1 else \
                int(tied[np.argmin(self.tie_ranks(fleet, names, candidates[tied]))])
            node = int(candidates[pick])
            gpus = (self.gpu_among(fleet, node, gpu_scores[pick]),) if task.shares_gpu else \
                exclusive_gpus(fleet, task, node)
            placement = GpuPlacement(node, gpus)
            fleet.commit(task, placement)
            memo.touch(fleet, node)
            placements.append(placement)
        return placements

    def memo_of(self, fleet: GpuFleet, typical: tuple[tuple[GpuTask, float], ...]) -> _Memo:
        """The scores kept on ``fleet`` for this target workload (with ``touch`` and ``scores``
        they are what a variant of FGD's score overrides)."""
        return _memo(fleet, typical)

    def tie_ranks(self, fleet: GpuFleet, names: np.ndarray, nodes: np.ndarray) -> np.ndarray:
        """The rank of each of ``nodes`` (tied on the best score) among them (lowest wins): the
        node name's, as the simulator's ``selectHost``."""
        return names[nodes]

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
            scored, inverse = distinct_nodes(fleet, stale)
            counts = memo.counts.rows(fleet, scored, memo.version)
            scores[stale] = self.score_nodes(fleet, task, scored, memo.target, counts)[inverse]
            version[stale] = memo.version[stale]
        return scores

    @staticmethod
    def score_key(task: GpuTask) -> tuple:
        """What a task's scores depend on (tasks equal in it share them)."""
        return (task.cpu_milli, task.gpus, task.gpu_milli)

    @staticmethod
    def score_nodes(fleet: GpuFleet, task: GpuTask, nodes: np.ndarray, target, counts: GpuClassCounts) -> np.ndarray:
        return node_scores(fleet, task, nodes, target, counts)
