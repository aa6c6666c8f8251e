"""``fgd-mem-batch``: a negotiation cycle's batch planned by ``fgd-mem`` in several orders (ours, issue 13).

Online, FGD (Weng et al., USENIX ATC '23) places each task as it arrives. A batch planner
sees the whole cycle, and a task that fits nowhere after its batch's plan fails for good,
so a plan that leaves fewer GPUs' worth of tasks unplaced is strictly better now. The batch
is planned first in arrival order with :mod:`condor_sched.modes.gpus.fgd_mem`; only when some
task is left unplaced it is planned again, each time on a copy of the fleet:

* with the tasks unplaced in the previous attempt moved to the front (iterated greedy, as
  the restarts of Ruiz and Stuetzle's iterated greedy for scheduling, EJOR 2007);
* whole- and multi-GPU tasks first, then the rest in arrival order;
* CPU-only tasks last;
* the largest GPU request first (GPUs, then compute per GPU).

The plan kept is the one leaving the least GPU compute unplaced (then fewer tasks, then the
earliest attempt). The attempts after the first are bounded by the work they may do,
``REPLAN_BUDGET`` task-node pairs in all: a negotiation cycle's batch of the openb trace (128
tasks on 1213 nodes, up to six more attempts) replans in full; a batch of thousands of jobs on
hundreds of nodes, where a full fleet leaves most of it unplaced whatever the order, keeps the
arrival (fair-share) order and is planned once, in seconds (issue 31); replanning it would
keep the plan that runs the largest requests first, not the fair-share one.

Every batch that fits whole keeps the arrival order: planning every batch largest first
leaves far more unallocated on the openb trace (docs/gpu-batch-findings.md). No future batch
is seen.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from condor_sched.modes.gpus.fgd_mem import FgdMemPolicy, adopt_scores, copy_with_scores
from condor_sched.modes.gpus.fleet import GpuFleet, GpuPlacement, GpuTask
from condor_sched.modes.gpus.fleet_policy import GpuPlanContext

#: Attempts with the last attempt's unplaced tasks moved to the front.
FAILED_FIRST_ROUNDS = 3
#: Tasks times nodes that the attempts after the first may plan in all (module docstring):
#: six attempts of a 128-task batch on the openb fleet are 0.93 M.
REPLAN_BUDGET = 2_000_000

Plan = list[GpuPlacement | None]


def _fixed_orders() -> tuple[Callable[[GpuTask], int | tuple[int, int]], ...]:
    return (lambda t: 0 if t.gpus and not t.shares_gpu else 1,
            lambda t: 1 if t.gpus == 0 else 0,
            lambda t: (-t.gpus, -t.gpu_milli))


@dataclass(frozen=True, slots=True)
class FgdMemBatchPolicy:
    """``fgd-mem`` on the batch in the order that leaves the least unplaced (module docstring)."""

    name: str = "fgd-mem-batch"
    failed_first_rounds: int = FAILED_FIRST_ROUNDS
    replan_budget: int = REPLAN_BUDGET

    def place(self, fleet: GpuFleet, tasks: Sequence[GpuTask], context: GpuPlanContext) -> Plan:
        planner = FgdMemPolicy()
        order = list(range(len(tasks)))
        best_key, best_plan, best_fleet = None, None, fleet
        attempts = [order] + [sorted(order, key=lambda i, k=key: k(tasks[i])) for key in _fixed_orders()]
        tried: set[tuple[int, ...]] = set()
        rounds, replan_cost, budget = 0, len(tasks) * len(fleet), self.replan_budget
        while attempts:
            order = attempts.pop(0)
            if tuple(order) in tried:
                continue
            if tried:   # a replan: within the budget
                if budget < replan_cost:
                    break
                budget -= replan_cost
            tried.add(tuple(order))
            trial = copy_with_scores(fleet)
            plan: Plan = [None] * len(tasks)
            for i, placement in zip(order, planner.place(trial, [tasks[i] for i in order], context)):
                plan[i] = placement
            unplaced = [i for i in order if plan[i] is None]
            key = (sum(tasks[i].gpu_milli_total for i in unplaced), len(unplaced))
            if best_key is None or key < best_key:
                best_key, best_plan, best_fleet = key, plan, trial
            if not unplaced:
                break
            if rounds < self.failed_first_rounds:
                rounds += 1
                attempts.insert(0, unplaced + [i for i in order if plan[i] is not None])
        assert best_plan is not None
        fleet.adopt(best_fleet)
        adopt_scores(fleet, best_fleet)
        return best_plan
