"""Paper 002's device policies (``knapsack``, ``global``, ``exclusive``, ``random``, ...) on
GPUs, unchanged: every GPU of a GPU node is shown to them as one device slot of the ``gpu``
kind (``condor_sched.device_kinds.GPU``), and their plan is committed to the fleet.

The view, per GPU: device memory = the GPU's (free) memory, device threads = its (free)
compute in thousandths (the kind's unit; 1000 = whole, more where the node overcommits),
host cpus = the node's (free) cpus in milli-cores and host memory = the node's (free) memory.
A task that takes a share of one GPU or one whole GPU is a device job asking for its compute,
its GPU memory (its compute share of the GPU's memory when it names none) and its cpus and
memory. The policy plans the GPUs of one memory size at a time, the largest first, so that
a share's memory is exact, and accounts GPU memory to the MB (``memory_granularity_mb`` 1:
a whole GPU's memory must fit its GPU); compute is hard in the view (the node's advertised
compute already holds its overcommit). What the view cannot say is enforced by committing
the plan, in the plan's order, to the :class:`GpuFleet`, which refuses what does not fit:

* a GPU node's cpus and memory are shared by its GPUs, so two device slots of a node may
  both count them; the commit takes them once;
* a whole-GPU task needs an idle GPU (the view only asks for 1000 free);
* a GPU holds shares of one Owner (MPS, ``gpu_fleet``): the policy plans one owner's tasks
  at a time (owners in the order of their first task in the batch), each on the GPUs with
  no owner or its own (the request's ``eligible`` slots, which ``run_policy`` honours), and
  the plan is committed before the next owner's;
* ``require_gpus``: each task may use only the GPUs of the models it accepts (``eligible``).

A task the commit refuses is planned again, in a next round, with what is left; rounds stop
when one places nothing. The calls of a batch share one solver budget,
``settings.solver_time_limit_s`` (what ``global`` gets for one call elsewhere), split over
the calls still to come (at least ``MIN_CALL_S`` each), so a cycle with many owners and GPU
sizes stays within a few limits. Tasks no device slot can show (CPU-only tasks, and
``gpus > 1`` whole GPUs of one node) are placed first, in order, by ``best-fit``
(:mod:`~condor_sched.modes.gpus.baselines`): a deviation by design, since a device
policy places a job on one device.
"""
from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import numpy as np

from condor_sched.device_kinds import GPU
from condor_sched.model import Job, JobKey, JobStatus, Resources, Slot, SlotKind
from condor_sched.modes.planning import PlanRequest, PlanSettings, Policy, run_policy
from condor_sched.modes.gpus.fleet import NO_OWNER, WHOLE_GPU_MILLI, GpuFleet, GpuPlacement, GpuTask
from condor_sched.modes.gpus.fleet_policy import GpuPlanContext

#: Rounds of plan-then-commit before the tasks left wait for the next batch.
MAX_ROUNDS = 8
#: The least solver time (s) one policy call gets once the batch's budget is spent.
MIN_CALL_S = 0.1
_SCHEDD = "gpu-view"


def _slot_name(fleet: GpuFleet, row: int, gpu: int) -> str:
    return f"{fleet.names[row]}#gpu{gpu}"


@dataclass(frozen=True, slots=True)
class DevicePolicyOnGpus:
    """A device policy (``name``, made by ``make_policy``: the registry hands it over, so the
    GPU mode names the device mode's planners without importing them) planning GPU tasks
    through the device view (module docstring)."""

    name: str
    make_policy: Callable[[], Policy]

    def place(self, fleet: GpuFleet, tasks: Sequence[GpuTask], context: GpuPlanContext) -> list[GpuPlacement | None]:
        from condor_sched.modes.gpus.baselines import best_fit_policy

        policy = self.make_policy()
        placements: list[GpuPlacement | None] = [None] * len(tasks)
        on_one_gpu = [i for i, t in enumerate(tasks) if t.gpus == 1]
        others = [i for i, t in enumerate(tasks) if t.gpus != 1]
        for i, where in zip(others, best_fit_policy().place(fleet, [tasks[i] for i in others], context)):
            placements[i] = where
        left = on_one_gpu
        deadline = time.perf_counter() + context.settings.solver_time_limit_s
        for _ in range(MAX_ROUNDS):
            placed_now = 0
            sizes = _memory_sizes(fleet)
            for si, size in enumerate(sizes):  # a share's memory depends on its GPU's size
                groups = _by_owner(tasks, left)
                for gi, owned in enumerate(groups):  # a GPU takes one owner's shares
                    calls_left = len(groups) - gi + len(sizes) - si - 1
                    limit = max(MIN_CALL_S, (deadline - time.perf_counter()) / calls_left)
                    settings = replace(context.settings, thread_overcommit=1.0, memory_granularity_mb=1,
                                       solver_time_limit_s=min(context.settings.solver_time_limit_s, limit))
                    for i, (row, gpu) in self._plan_on(policy, fleet, tasks, owned, size, settings):
                        try:
                            fleet.commit(tasks[i], GpuPlacement(row, (gpu,)))
                        except ValueError:
                            continue
                        placements[i] = GpuPlacement(row, (gpu,))
                        placed_now += 1
                left = [i for i in left if placements[i] is None]
            if placed_now == 0 or not left:
                break
        return placements

    def _plan_on(self, policy, fleet: GpuFleet, tasks: Sequence[GpuTask], todo: Sequence[int], memory_mb: int,
                 settings: PlanSettings) -> list[tuple[int, tuple[int, int]]]:
        """One plan of the device policy on the view of the GPUs of ``memory_mb`` with compute
        free: (task index, (row, GPU)) in plan order."""
        rows, cols = np.nonzero(fleet.gpu_present & (fleet.gpu_free_milli > 0)
                                & (fleet.gpu_memory_total_mb == memory_mb))
        if rows.size == 0 or not todo:
            return []
        names = [_slot_name(fleet, row, gpu) for row, gpu in zip(rows.tolist(), cols.tolist())]
        where = dict(zip(names, zip(rows.tolist(), cols.tolist())))
        slots = tuple(_device_slot(fleet, row, gpu, name) for name, (row, gpu) in where.items())
        owners, single = fleet.gpu_owner[rows, cols], fleet.single_account[rows]
        shared: dict[tuple, frozenset[str] | None] = {}  # one eligible set per (owner, models)
        jobs, eligible = [], {}
        for order, i in enumerate(todo):
            task = tasks[i]
            key = JobKey(_SCHEDD, i, 0)
            memory = task.gpu_memory_mb if task.gpu_memory_mb is not None else \
                -(-memory_mb * task.gpu_milli // WHOLE_GPU_MILLI)
            jobs.append(Job(key, f"owner{task.owner}", JobStatus.IDLE,
                            Resources(cpus=task.cpu_milli, memory_mb=task.memory_mib, device_memory_mb=max(1, memory),
                                      device_threads=task.gpu_milli),
                            submitted_at_s=order, has_pin_clause=True, device_kind=GPU.name))
            group = (task.owner, task.models)
            if group not in shared:
                ok = (owners == NO_OWNER) | (owners == task.owner) | single
                if task.models is not None:
                    ok &= np.isin(fleet.model_of_node[rows],
                                  [m for m, name in enumerate(fleet.model_names) if name in task.models])
                shared[group] = None if ok.all() else frozenset(n for n, good in zip(names, ok.tolist()) if good)
            if shared[group] is not None:
                eligible[key] = shared[group]
        plan = run_policy(policy, PlanRequest(tuple(jobs), slots, eligible=eligible), settings)
        return [(a.job.cluster, where[a.slot]) for a in plan.assignments if a.slot in where]


def _by_owner(tasks: Sequence[GpuTask], todo: Sequence[int]) -> list[list[int]]:
    """``todo`` split by owner, owners in the order of their first task."""
    groups: dict[int, list[int]] = {}
    for i in todo:
        groups.setdefault(tasks[i].owner, []).append(i)
    return list(groups.values())


def _memory_sizes(fleet: GpuFleet) -> list[int]:
    """The fleet's GPU memory sizes, the largest first."""
    return sorted({int(m) for m in fleet.gpu_memory_total_mb[fleet.gpu_present]}, reverse=True)


def _device_slot(fleet: GpuFleet, row: int, gpu: int, name: str) -> Slot:
    total = Resources(cpus=int(fleet.cpu_total_milli[row]), memory_mb=int(fleet.memory_total_mib[row]),
                      device_memory_mb=int(fleet.gpu_memory_total_mb[row, gpu]),
                      device_threads=int(fleet.gpu_capacity_milli[row, gpu]))
    free = Resources(cpus=max(0, int(fleet.cpu_free_milli[row])), memory_mb=max(0, int(fleet.memory_free_mib[row])),
                     device_memory_mb=max(0, int(fleet.gpu_memory_free_mb[row, gpu])),
                     device_threads=max(0, int(fleet.gpu_free_milli[row, gpu])))
    return Slot(name=name, machine=fleet.names[row], kind=SlotKind.DEVICE, total=total, free=free,
                device_name=f"gpu{gpu}", device_kind=GPU.name)
