"""``fgd-mem``: FGD whose fragmentation also sees host memory (ours, issue 13).

FGD (:mod:`condor_sched.modes.gpus.fgd`, Weng et al., USENIX ATC '23, Section 4) counts a
node's free GPU compute as fragmented for a typical task class when the class does not fit
the node: too few GPUs with enough compute free, the wrong model, or too little free CPU.
Host memory is only a filter there (the simulator's ``NodeResource`` has none). On the openb
trace it binds: a G2 node has 48 GiB of memory per GPU and a one-GPU task asks 41 GiB on
average, a CPU-only task 48 GiB, so FGD strands GPUs on nodes whose memory is gone: tasks
failing on memory alone carry 3.1 of FGD's 4.96 unallocated points on the default list
(docs/gpu-batch-findings.md).

``fgd-mem`` keeps FGD's measure, score and resolution and adds one condition to "the class
fits the node": free host memory at least the class's memory (the median memory of the
class's tasks, which :func:`~condor_sched.modes.gpus.fleet_policy.typical_tasks` attaches from
the same task list FGD's target workload is built from). Ties go as in
:mod:`condor_sched.modes.gpus.fgd_pack`: the fullest node, the tightest GPU. With typical tasks
of no memory it is ``fgd-pack``.
"""
from __future__ import annotations

import weakref
from collections.abc import Sequence
from dataclasses import dataclass, field, fields

import numpy as np

from condor_sched.modes.gpus.fgd import GpuClassCounts, NodeClassCounts, TargetWorkload, fgd_scores
from condor_sched.modes.gpus.fgd_pack import FgdPackPolicy
from condor_sched.modes.gpus.fleet import GpuFleet, GpuTask
from condor_sched.modes.gpus.fleet_policy import INFEASIBLE, free_gpu_milli


@dataclass(frozen=True, slots=True)
class MemoryTarget(TargetWorkload):
    """FGD's typical task classes as arrays, with each class's host memory (MiB)."""

    memory_mib: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))

    @classmethod
    def of(cls, fleet: GpuFleet, typical: Sequence[tuple[GpuTask, float]]) -> MemoryTarget:
        base = TargetWorkload.of(fleet, typical)
        return cls(**{f.name: getattr(base, f.name) for f in fields(TargetWorkload)},
                   memory_mib=np.array([t.memory_mib for t, _ in typical], dtype=np.int64))


def fragmentation(cpu_free_milli: np.ndarray, memory_free_mib: np.ndarray, gpu_free_milli: np.ndarray,
                  model_ok: np.ndarray, target: MemoryTarget) -> np.ndarray:
    """FGD's fragmentation (:func:`condor_sched.modes.gpus.fgd.unusable_milli` weighted by
    popularity), a class fitting only where its memory fits too. Shapes as there."""
    free = gpu_free_milli[..., :, None]
    enough = free >= target.gpu_milli
    count = enough.sum(axis=-2)
    small = np.where(enough, 0, free).sum(axis=-2)
    total = gpu_free_milli.sum(axis=-1)[..., None]
    fits = (model_ok & (count >= target.gpus) & (cpu_free_milli[..., None] >= target.cpu_milli)
            & (memory_free_mib[..., None] >= target.memory_mib) & (target.gpus > 0))
    return np.where(fits, small, total) @ target.popularity


def node_scores(fleet: GpuFleet, task: GpuTask, nodes: np.ndarray, target: MemoryTarget,
                counts: GpuClassCounts | None = None) -> np.ndarray:
    """FGD scores of ``task`` on ``nodes``, as :func:`condor_sched.modes.gpus.fgd.node_scores`."""
    free = free_gpu_milli(fleet, nodes)
    counts = GpuClassCounts.of(free, target) if counts is None else counts
    cpu = fleet.cpu_free_milli[nodes]
    memory = fleet.memory_free_mib[nodes]
    model_ok = target.model_ok[fleet.model_of_node[nodes]] & (target.gpus > 0)
    before = counts.fragmentation(model_ok & (cpu[:, None] >= target.cpu_milli)
                                  & (memory[:, None] >= target.memory_mib), target)
    cpu_after, memory_after = cpu - task.cpu_milli, memory - task.memory_mib
    if task.shares_gpu:
        fits_class = (model_ok & (cpu_after[:, None] >= target.cpu_milli)
                      & (memory_after[:, None] >= target.memory_mib))
        scores = fgd_scores(before[:, None] - counts.after_share(free, task.gpu_milli, fits_class, target))
        fits = fleet.gpu_present[nodes] & (free >= task.gpu_milli)
        return np.where(fits, scores, INFEASIBLE)
    after_free = free.copy()
    if task.gpus:
        idle = free == fleet.compute_capacity
        after_free[idle & (np.cumsum(idle, axis=1) <= task.gpus)] -= task.gpu_milli
    return fgd_scores(before - fragmentation(cpu_after, memory_after, after_free, model_ok, target))


@dataclass(slots=True)
class _Memo:
    """Scores per task shape and node, valid while the node's free amounts are unchanged."""

    typical: tuple[tuple[GpuTask, float], ...]
    target: MemoryTarget
    seen: np.ndarray  # (n, width + 2): free CPU, memory and GPU compute when last scored
    version: np.ndarray
    counts: NodeClassCounts
    scores: dict[tuple, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)

    def touch(self, fleet: GpuFleet, node: int) -> None:
        self.version[node] += 1
        self.seen[node, :2] = fleet.cpu_free_milli[node], fleet.memory_free_mib[node]
        self.seen[node, 2:] = fleet.gpu_free_milli[node]

    def sync(self, fleet: GpuFleet) -> None:
        now = _free_state(fleet)
        changed = (now != self.seen).any(axis=1)
        if changed.any():
            self.version[changed] += 1
            self.seen[changed] = now[changed]


def _free_state(fleet: GpuFleet) -> np.ndarray:
    return np.column_stack([fleet.cpu_free_milli, fleet.memory_free_mib, fleet.gpu_free_milli])


_memos: weakref.WeakKeyDictionary[GpuFleet, _Memo] = weakref.WeakKeyDictionary()


def _memo(fleet: GpuFleet, typical: tuple[tuple[GpuTask, float], ...]) -> _Memo:
    memo = _memos.get(fleet)
    if memo is None or len(memo.version) != len(fleet) or not (memo.typical is typical or memo.typical == typical):
        target = MemoryTarget.of(fleet, typical)
        memo = _Memo(typical=typical, target=target, seen=_free_state(fleet),
                     version=np.zeros(len(fleet), dtype=np.int64),
                     counts=NodeClassCounts(len(fleet), fleet.width, target))
        _memos[fleet] = memo
    else:
        memo.sync(fleet)
    return memo


def copy_with_scores(fleet: GpuFleet) -> GpuFleet:
    """A copy of ``fleet`` that shares the scores already computed on it (to plan alternatives
    of one batch without scoring every node again). Shared, not copied: every call re-checks
    each node's free amounts against those last seen (``_Memo.sync``), so the scores of a node
    whose state differs between the copies are computed again, never trusted."""
    other = fleet.copy()
    memo = _memos.get(fleet)
    if memo is not None:
        _memos[other] = memo
    return other


def adopt_scores(fleet: GpuFleet, planned: GpuFleet) -> None:
    """Let ``fleet`` keep the scores computed on ``planned``, a copy of it brought to the same
    state (the plan made on the copy committed to ``fleet``)."""
    memo = _memos.get(planned)
    if memo is not None:
        _memos[fleet] = memo


@dataclass(frozen=True, slots=True)
class FgdMemPolicy(FgdPackPolicy):
    """FGD's score with host memory in the fit of a class; ties as ``fgd-pack`` (module
    docstring). The target workload is ``context.typical_tasks``, or, when empty,
    :func:`~condor_sched.modes.gpus.fleet_policy.typical_tasks` of the batch."""

    name: str = "fgd-mem"

    def memo_of(self, fleet: GpuFleet, typical: tuple[tuple[GpuTask, float], ...]) -> _Memo:  # type: ignore[override]
        return _memo(fleet, typical)

    @staticmethod
    def score_key(task: GpuTask) -> tuple:
        return (task.cpu_milli, task.memory_mib, task.gpus, task.gpu_milli)

    @staticmethod
    def score_nodes(fleet: GpuFleet, task: GpuTask, nodes: np.ndarray, target: MemoryTarget,
                    counts: GpuClassCounts) -> np.ndarray:
        return node_scores(fleet, task, nodes, target, counts)
