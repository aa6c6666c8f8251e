"""GPU nodes as arrays: what the GPU-sharing policies plan on (issue 13).

A GPU node has CPU (milli-cores), host memory (MiB) and up to ``width`` GPUs; each GPU has
compute (thousandths of a GPU, 1000 = whole; ``compute_capacity`` may exceed 1000 when an
admin overcommits MPS time-sharing) and memory (MB, always hard). A GPU that holds
sharing tasks belongs to their owner until it empties: MPS runs one server per Linux user,
and another user's client waits until that server's clients have all exited (FACTS.md), so
a GPU is shared only among the tasks of one owner, except on a node whose jobs all run under
one execute account (``single_account``).

A task asks for CPU, host memory and either nothing of a GPU, a share of one GPU
(``gpus == 1`` and ``gpu_milli < 1000``), or ``gpus`` whole GPUs of one node. Its GPU
memory is ``gpu_memory_mb`` per GPU, or, when None (the openb trace gives none), its
``gpu_milli`` share of the memory of the GPU it lands on. ``models`` restricts the node's
GPU model (a hard constraint, as the trace's ``gpu_spec``).

Arrays, not objects: the FGD family scores every node for every task (1213 nodes in the
openb cluster), which numpy does at once. The same fleet serves the simulator and the
sidecar's GPU policies (built from slots there), so both run the very same placement code.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

#: Compute of a whole GPU, in thousandths.
WHOLE_GPU_MILLI = 1000
#: A GPU no sharing task holds has no owner.
NO_OWNER = -1


@dataclass(frozen=True, slots=True)
class GpuTask:
    """What one task (a job) asks of a GPU node (module docstring)."""

    name: str
    cpu_milli: int
    memory_mib: int
    gpus: int = 0
    gpu_milli: int = 0
    gpu_memory_mb: int | None = None
    models: frozenset[str] | None = None
    owner: int = 0

    def __post_init__(self) -> None:
        if self.cpu_milli < 0 or self.memory_mib < 0 or self.gpus < 0:
            raise ValueError(f"task {self.name}: negative request")
        if self.gpus == 0 and self.gpu_milli:
            raise ValueError(f"task {self.name}: gpu_milli {self.gpu_milli} without a GPU")
        if self.gpus > 1 and self.gpu_milli != WHOLE_GPU_MILLI:
            raise ValueError(f"task {self.name}: {self.gpus} GPUs must be whole (gpu_milli 1000)")
        if self.gpus == 1 and not 0 < self.gpu_milli <= WHOLE_GPU_MILLI:
            raise ValueError(f"task {self.name}: gpu_milli {self.gpu_milli} not in 1..1000")
        if self.gpu_memory_mb is not None and self.gpu_memory_mb < 0:
            raise ValueError(f"task {self.name}: negative GPU memory")

    @property
    def shares_gpu(self) -> bool:
        """A share of one GPU (the GPU may hold other tasks of its owner)."""
        return self.gpus == 1 and self.gpu_milli < WHOLE_GPU_MILLI

    @property
    def gpu_milli_total(self) -> int:
        """The GPU compute the task takes in all (thousandths of a GPU)."""
        return self.gpus * self.gpu_milli


@dataclass(frozen=True, slots=True)
class GpuPlacement:
    """A task's node (row of the fleet) and the GPUs (columns) it takes there."""

    node: int
    gpus: tuple[int, ...] = ()


class GpuFleet:
    """Mutable free amounts of every node and GPU; :meth:`commit` and :meth:`release` keep
    them consistent (module docstring)."""

    def __init__(self, names: list[str], models: list[str], cpu_milli: list[int], memory_mib: list[int],
                 gpu_memory_mb: list[list[int]], compute_capacity: int = WHOLE_GPU_MILLI) -> None:
        n = len(names)
        if not (len(models) == len(cpu_milli) == len(memory_mib) == len(gpu_memory_mb) == n):
            raise ValueError("fleet columns differ in length")
        if compute_capacity < WHOLE_GPU_MILLI:
            raise ValueError(f"compute capacity {compute_capacity} below a whole GPU ({WHOLE_GPU_MILLI})")
        self.names = list(names)
        self.model_names = sorted(set(models))
        self.model_of_node = np.array([self.model_names.index(m) for m in models], dtype=np.int16)
        self.width = max((len(g) for g in gpu_memory_mb), default=0) or 1
        self.gpu_count = np.array([len(g) for g in gpu_memory_mb], dtype=np.int64)
        self.cpu_total_milli = np.array(cpu_milli, dtype=np.int64)
        self.memory_total_mib = np.array(memory_mib, dtype=np.int64)
        present = np.arange(self.width)[None, :] < self.gpu_count[:, None]
        self.gpu_present = present
        self.gpu_memory_total_mb = np.zeros((n, self.width), dtype=np.int64)
        for row, gpus in enumerate(gpu_memory_mb):
            self.gpu_memory_total_mb[row, :len(gpus)] = gpus
        self.compute_capacity = compute_capacity
        self.gpu_capacity_milli = np.where(present, compute_capacity, 0).astype(np.int64)
        # Free amounts; an absent GPU has -1 free so that nothing ever fits it.
        self.cpu_free_milli = self.cpu_total_milli.copy()
        self.memory_free_mib = self.memory_total_mib.copy()
        self.gpu_free_milli = np.where(present, compute_capacity, -1).astype(np.int64)
        self.gpu_memory_free_mb = np.where(present, self.gpu_memory_total_mb, -1).astype(np.int64)
        self.gpu_owner = np.full((n, self.width), NO_OWNER, dtype=np.int64)
        # Nodes whose jobs all run under one execute account: one MPS server serves every owner.
        self.single_account = np.zeros(n, dtype=bool)
        # Tasks on each node by GPU kind (column 0: sharing tasks, column g: tasks of g whole
        # GPUs), the node's "GPU affinity" that the gpu-clustering baseline scores.
        self.tasks_by_gpu_kind = np.zeros((n, self.width + 1), dtype=np.int64)

    def __len__(self) -> int:
        return len(self.names)

    def copy(self) -> GpuFleet:
        other = object.__new__(GpuFleet)
        for name, value in vars(self).items():
            setattr(other, name, value.copy() if isinstance(value, (np.ndarray, list)) else value)
        return other

    def adopt(self, planned: GpuFleet) -> None:
        """Take the state of ``planned``, a :meth:`copy` of this fleet that a plan was committed
        to (the plan's commits, without replaying them); ``planned`` is not used afterwards."""
        if planned.names != self.names:
            raise ValueError("adopt: not a copy of this fleet")
        vars(self).update(vars(planned))

    @property
    def total_gpu_milli(self) -> int:
        """Every GPU's whole compute (thousandths), the measure of the unallocated share."""
        return int(self.gpu_count.sum()) * WHOLE_GPU_MILLI

    def allocated_gpu_milli(self) -> int:
        return int((self.gpu_capacity_milli - np.maximum(self.gpu_free_milli, 0)).sum())

    def model_mask(self, task: GpuTask) -> np.ndarray:
        """Nodes whose GPU model the task accepts."""
        if task.models is None or task.gpus == 0:
            return np.ones(len(self), dtype=bool)
        allowed = [i for i, m in enumerate(self.model_names) if m in task.models]
        return np.isin(self.model_of_node, allowed)

    def gpu_memory_needed(self, task: GpuTask, rows: slice | int = slice(None)) -> np.ndarray:
        """MB of GPU memory the task needs on each GPU of each node (n x width; of ``rows``
        only when given)."""
        total = self.gpu_memory_total_mb[rows]
        if task.gpus == 0:
            return np.zeros_like(total)
        if task.gpu_memory_mb is not None:
            return np.full_like(total, task.gpu_memory_mb)
        return -(-total * task.gpu_milli // WHOLE_GPU_MILLI)

    def gpu_fits(self, task: GpuTask, rows: slice | int = slice(None)) -> np.ndarray:
        """GPUs (n x width; of ``rows`` only when given) that could take the task's per-GPU
        share now: whole and idle for a whole-GPU task; enough free compute and memory, and no
        other owner, for a share."""
        free, memory_free = self.gpu_free_milli[rows], self.gpu_memory_free_mb[rows]
        if task.gpus == 0:
            return np.zeros_like(self.gpu_present[rows])
        if not task.shares_gpu:
            return ((free == self.gpu_capacity_milli[rows]) & self.gpu_present[rows]
                    & (memory_free == self.gpu_memory_total_mb[rows]))
        need = self.gpu_memory_needed(task, rows)
        owner = self.gpu_owner[rows]
        return ((free >= task.gpu_milli) & (memory_free >= need)
                & ((owner == NO_OWNER) | (owner == task.owner) | self.single_account[rows, None]))

    def node_fits(self, task: GpuTask) -> np.ndarray:
        """Nodes (bool, n) where the task fits now: CPU, host memory, GPU model and GPUs."""
        return self.fits(task)[0]

    def fits(self, task: GpuTask) -> tuple[np.ndarray, np.ndarray | None]:
        """:meth:`node_fits` and, for a GPU task, :meth:`gpu_fits` (None for a CPU-only task),
        computed once."""
        nodes = (self.cpu_free_milli >= task.cpu_milli) & (self.memory_free_mib >= task.memory_mib)
        if task.models is not None and task.gpus:
            nodes &= self.model_mask(task)
        if not task.gpus:
            return nodes, None
        gpus = self.gpu_fits(task)
        nodes &= gpus.sum(axis=1) >= task.gpus
        return nodes, gpus

    def commit(self, task: GpuTask, placement: GpuPlacement) -> None:
        """Take the task's resources on ``placement``; ValueError (nothing changed) when
        they do not fit there."""
        node, gpus = placement.node, placement.gpus
        if len(gpus) != task.gpus or len(set(gpus)) != len(gpus):
            raise ValueError(f"task {task.name}: placement names {len(gpus)} GPUs, it asks for {task.gpus}")
        model_ok = task.models is None or not task.gpus or self.model_names[self.model_of_node[node]] in task.models
        if not (self.cpu_free_milli[node] >= task.cpu_milli and self.memory_free_mib[node] >= task.memory_mib
                and model_ok):
            raise ValueError(f"task {task.name} does not fit node {self.names[node]}")
        fits = self.gpu_fits(task, node)
        if not all(0 <= g < self.width and fits[g] for g in gpus):
            raise ValueError(f"task {task.name} does not fit GPUs {gpus} of node {self.names[node]}")
        need = self.gpu_memory_needed(task, node)
        self.cpu_free_milli[node] -= task.cpu_milli
        self.memory_free_mib[node] -= task.memory_mib
        for g in gpus:
            self.gpu_free_milli[node, g] -= task.gpu_milli
            self.gpu_memory_free_mb[node, g] -= need[g]
            if task.shares_gpu:
                self.gpu_owner[node, g] = task.owner
        if task.gpus:
            self.tasks_by_gpu_kind[node, gpu_kind(task)] += 1

    def release(self, task: GpuTask, placement: GpuPlacement) -> None:
        """Give back what :meth:`commit` took for the same task and placement."""
        node = placement.node
        need = self.gpu_memory_needed(task)
        self.cpu_free_milli[node] += task.cpu_milli
        self.memory_free_mib[node] += task.memory_mib
        for g in placement.gpus:
            self.gpu_free_milli[node, g] += task.gpu_milli
            self.gpu_memory_free_mb[node, g] += need[node, g]
            if self.gpu_free_milli[node, g] == self.gpu_capacity_milli[node, g]:
                self.gpu_owner[node, g] = NO_OWNER
        if task.gpus:
            self.tasks_by_gpu_kind[node, gpu_kind(task)] -= 1


def gpu_kind(task: GpuTask) -> int:
    """Column of :attr:`GpuFleet.tasks_by_gpu_kind` a GPU task counts in: 0 for a share of one
    GPU, else its number of whole GPUs."""
    return 0 if task.shares_gpu else task.gpus
