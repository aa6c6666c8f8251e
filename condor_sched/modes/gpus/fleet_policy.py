"""The fleet policy interface of issue 13 and the published GPU-sharing baselines by name.

A :class:`GpuPolicy` places the tasks of one batch (one negotiation cycle) on a
:class:`~condor_sched.modes.gpus.fleet.GpuFleet`, committing each placement. The six
policies of Weng et al., "Beware of Fragmentation: Scheduling GPU-Sharing Workloads with
Fragmentation Gradient Descent", USENIX ATC '23, follow the paper's published simulator
(hkust-adsl/kubernetes-scheduler-simulator, "the simulator" below) and the configuration of
its experiments (``experiments/run_scripts/generate_run_scripts.py``):

* ``random-fit``, ``best-fit``, ``dot-product``, ``gpu-packing``, ``gpu-clustering``:
  :mod:`condor_sched.modes.gpus.baselines`;
* ``fgd`` (fragmentation gradient descent): :mod:`condor_sched.modes.gpus.fgd`;
* ``fgd-pack`` (ours: FGD's score, ties to the fullest node): :mod:`condor_sched.modes.gpus.fgd_pack`;
* ``fgd-mem`` (ours: ``fgd-pack`` with host memory in FGD's fit of a class): :mod:`condor_sched.modes.gpus.fgd_mem`;
* ``fgd-mem-batch`` (ours: a batch planned by ``fgd-mem`` in the order leaving the least
  unplaced): :mod:`condor_sched.modes.gpus.fgd_mem_batch`;
* paper 002's device policies (``knapsack``, ``global``, ...), unchanged, on a view of one
  device slot per GPU: :mod:`condor_sched.modes.gpus.on_devices`.

What they share is here: the simulator's scheduler scores every feasible node with one score
plugin (integer scores, ``int64`` truncation included, since it makes ties), takes the
highest score and breaks ties by the lexicographically smallest node name
(``vendor/k8s.io/kubernetes/pkg/scheduler/core/generic_scheduler.go`` ``selectHost``, patched
there "for reproducibility"), then picks the GPUs with the policy's ``gpuSelMethod``
(``pkg/simulator/plugin/open_gpu_share.go``). The target workload of FGD is built by
:func:`typical_tasks` (``GetTypicalPods`` in ``pkg/utils/frag.go``).
"""
from __future__ import annotations

import weakref
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from condor_sched.modes.planning import PlanSettings
from condor_sched.modes.gpus.fleet import GpuFleet, GpuPlacement, GpuTask

#: Share of all tasks the typical task classes cover (the experiments' ``--pod-popularity-threshold 95``).
TYPICAL_POPULARITY_PCT = 95


@dataclass(frozen=True, slots=True)
class GpuPlanContext:
    """What a policy needs besides the fleet and the batch: randomness (random-fit), FGD's
    target workload, (task class, popularity) pairs whose popularities sum to 1, and the
    device policies' settings."""

    rng: np.random.Generator
    typical_tasks: tuple[tuple[GpuTask, float], ...] = ()
    #: The device policies' settings (``gpu_devices``: knapsack and global on GPUs).
    settings: PlanSettings = PlanSettings()


class GpuPolicy(Protocol):
    name: str

    def place(self, fleet: GpuFleet, tasks: Sequence[GpuTask], context: GpuPlanContext) -> list[GpuPlacement | None]:
        """Place the tasks of one batch in the given order, one at a time, COMMITTING each
        placement to ``fleet``; one entry per task (None: placed nowhere)."""
        ...


def typical_tasks(tasks: Sequence[GpuTask]) -> tuple[tuple[GpuTask, float], ...]:
    """FGD's target workload: the most popular task classes (CPU, per-GPU compute, GPU count,
    GPU models) that together hold 95% of the tasks, popularities renormalised to sum to 1
    (``GetTypicalPods`` in ``pkg/utils/frag.go`` with the experiments' settings: CPU-only
    tasks included, threshold 95, step 1, no GPU weight). Classes are ordered by count, ties
    by the larger (CPU, compute, GPUs, models) first, as the simulator's ``sort.Reverse``.
    Each class carries the median host memory of its tasks, which FGD ignores (the
    simulator's classes have none) and ``fgd-mem`` scores."""
    if not tasks:
        return ()
    counts = Counter(_task_class(t) for t in tasks)
    memory: dict[tuple[int, int, int, str], list[int]] = {}
    for t in tasks:
        memory.setdefault(_task_class(t), []).append(t.memory_mib)
    ranked = sorted(counts.items(), key=lambda kv: (kv[1], kv[0]), reverse=True)
    total = len(tasks)
    wanted = TYPICAL_POPULARITY_PCT * total / 100.0
    chosen, covered = [], 0
    for key, count in ranked:
        if covered >= wanted:
            break
        chosen.append((key, count))
        covered += count
    out = []
    for key, count in chosen:
        cpu, milli, gpus, models = key
        task = GpuTask(name=f"typical-{len(out)}", cpu_milli=cpu, memory_mib=int(np.median(memory[key])),
                       gpus=gpus, gpu_milli=milli,
                       models=frozenset(models.split("|")) if models else None)
        out.append((task, count / covered))
    return tuple(out)


def _task_class(task: GpuTask) -> tuple[int, int, int, str]:
    models = "|".join(sorted(task.models)) if task.models else ""
    return (task.cpu_milli, task.gpu_milli if task.gpus else 0, task.gpus, models)


# --- shared by the policies -----------------------------------------------------------------

#: Score given to nodes where the task does not fit (below every plugin's score).
INFEASIBLE = np.iinfo(np.int64).min // 4

_name_ranks: weakref.WeakKeyDictionary[GpuFleet, np.ndarray] = weakref.WeakKeyDictionary()


def name_rank(fleet: GpuFleet) -> np.ndarray:
    """Each node's rank in the lexicographic order of node names (ties go to the smallest)."""
    ranks = _name_ranks.get(fleet)
    if ranks is None or len(ranks) != len(fleet):
        ranks = np.empty(len(fleet), dtype=np.int64)
        ranks[np.argsort(np.array(fleet.names, dtype=object), kind="stable")] = np.arange(len(fleet))
        _name_ranks[fleet] = ranks
    return ranks


def best_node(scores: np.ndarray, feasible: np.ndarray, ranks: np.ndarray) -> int | None:
    """The feasible node with the highest integer score, ties to the smallest node name
    (``selectHost`` of the simulator's vendored scheduler); None when none is feasible."""
    candidates = np.flatnonzero(feasible)
    if candidates.size == 0:
        return None
    top = scores[candidates]
    tied = candidates[top == top.max()]
    return int(tied[np.argmin(ranks[tied])])


class NoRoom:
    """Task shapes that found no node while one batch is placed. The fleet only loses room
    while a batch is placed (commits, no releases), so a later task that asks at least as much
    of everything, under the same GPU rule (a share of one owner's GPUs, whole GPUs, none) and
    model constraint, finds no node either: it is refused without scanning the fleet."""

    def __init__(self) -> None:
        self._least: dict[tuple, list[tuple[int, ...]]] = {}

    @staticmethod
    def _shape(task: GpuTask) -> tuple[tuple, tuple[int, ...]]:
        if not task.gpus:
            return ("cpu",), (task.cpu_milli, task.memory_mib)
        if not task.shares_gpu:
            return ("whole", task.models), (task.cpu_milli, task.memory_mib, task.gpus)
        return (("share", task.owner, task.models, task.gpu_memory_mb is None),
                (task.cpu_milli, task.memory_mib, task.gpu_milli, task.gpu_memory_mb or 0))

    def covers(self, task: GpuTask) -> bool:
        """Whether a shape that found no node asked no more than ``task`` of anything."""
        rule, asks = self._shape(task)
        return any(all(a <= b for a, b in zip(least, asks)) for least in self._least.get(rule, ()))

    def add(self, task: GpuTask) -> None:
        """``task`` found no node."""
        rule, asks = self._shape(task)
        kept = [least for least in self._least.get(rule, ()) if not all(a <= b for a, b in zip(asks, least))]
        self._least[rule] = kept + [asks]


def free_gpu_milli(fleet: GpuFleet, nodes: np.ndarray | slice = slice(None)) -> np.ndarray:
    """Free compute of every GPU slot (n x width; of ``nodes`` only when given), 0 on absent slots."""
    return np.where(fleet.gpu_present[nodes], fleet.gpu_free_milli[nodes], 0)


def exclusive_gpus(fleet: GpuFleet, task: GpuTask, node: int) -> tuple[int, ...]:
    """The first idle GPUs of the node, by index (``AllocateExclusiveGpuId`` in
    ``pkg/type/resource.go``); for a share of a GPU use :func:`tightest_gpu` or another rule."""
    return tuple(int(g) for g in np.flatnonzero(fleet.gpu_fits(task, node))[:task.gpus])


def tightest_gpu(fleet: GpuFleet, task: GpuTask, node: int) -> tuple[int, ...]:
    """``gpuSelMethod: best``: a sharing task takes the fitting GPU with the least free
    compute, the first by index among equals (``allocateGpuIdBasedOnBestFit`` in
    ``open_gpu_share.go``); whole GPUs as :func:`exclusive_gpus`; no GPU for a CPU task."""
    if not task.shares_gpu:
        return exclusive_gpus(fleet, task, node)
    fits = fleet.gpu_fits(task, node)
    free = np.where(fits, fleet.gpu_free_milli[node], np.iinfo(np.int64).max)
    return (int(np.argmin(free)),)


def place_one_by_one(fleet: GpuFleet, tasks: Sequence[GpuTask],
                     choose: Callable[[GpuFleet, GpuTask, np.ndarray], GpuPlacement | None]
                     ) -> list[GpuPlacement | None]:
    """Place ``tasks`` in order: ``choose`` picks a placement among the feasible nodes (a
    bool mask), which is committed before the next task is planned."""
    placements: list[GpuPlacement | None] = []
    for task in tasks:
        feasible = fleet.node_fits(task)
        placement = choose(fleet, task, feasible) if feasible.any() else None
        if placement is not None:
            fleet.commit(task, placement)
        placements.append(placement)
    return placements
