"""Runs built from simulations: one run's metrics, footprints, seeded sequences.

Shared by the ``simulate`` command and ``scripts/reproduce``.
"""
from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from condor_sched.inventory import Inventory
from condor_sched.modes.planning import PlanSettings
from condor_sched.modes.registry import get_policy
from condor_sched.profiles import ProfileStore
from condor_sched.simulate.engine import DEFAULT_CYCLE_S, RunResult, first_nodes, phi_inventory, simulate, xeon_inventory
from condor_sched.simulate.metrics import mean_metrics, run_metrics
from condor_sched.simulate.offload import MODELS, RuntimeModel
from condor_sched.simulate.profile_model import ProfileDrivenModel
from condor_sched.simulate.workloads import SimJob, Workload, default_profiles, is_parallel_workload, load_workload


@dataclass(frozen=True, slots=True)
class RunSpec:
    """What one simulation needs besides the jobs and the number of nodes."""

    policy: str
    inventory: Inventory
    cycle_s: float = DEFAULT_CYCLE_S
    model: RuntimeModel | None = None
    settings: PlanSettings | None = None
    profiles: ProfileStore | None = None


def spec_for(workload: str, policy: str, cycle_s: float = DEFAULT_CYCLE_S, settings: PlanSettings | None = None,
             inventory: Inventory | None = None, nodes: int = 8, offload_model: str = "offload") -> RunSpec:
    """The default pool and model of a workload: ``sns-random`` runs the profile model on
    ``nodes`` Xeon nodes with the 12 bundled profiles; device workloads run the offload
    model named ``offload_model`` (``offload.MODELS``) on ``nodes`` one-Phi nodes."""
    settings = settings or PlanSettings()
    if offload_model not in MODELS:
        raise ValueError(f"unknown offload model {offload_model!r}; known: {', '.join(sorted(MODELS))}")
    if is_parallel_workload(workload):
        if offload_model != "offload":
            raise ValueError(f"{workload} runs parallel CPU jobs under the profile model, not {offload_model!r}")
        store = default_profiles()
        return RunSpec(policy, inventory or xeon_inventory(nodes), cycle_s, ProfileDrivenModel(store), settings, store)
    return RunSpec(policy, inventory or phi_inventory(nodes), cycle_s, MODELS[offload_model](), settings)


def run(jobs: Sequence[SimJob], spec: RunSpec, nodes: int | None, seed: int, *, record: bool = False,
        progress: Callable[[int], None] | None = None) -> tuple[dict[str, Any], RunResult]:
    result = simulate(jobs, first_nodes(spec.inventory, nodes), get_policy(spec.policy), seed=seed,
                      cycle_s=spec.cycle_s, model=spec.model, settings=spec.settings, profiles=spec.profiles,
                      record=record,
                      progress=progress)
    return run_metrics(result), result


def footprint(jobs: Sequence[SimJob], spec: RunSpec, nodes: int, target_makespan_s: float, seed: int,
              known: dict[int, float] | None = None) -> int | None:
    """The smallest node count at which ``spec.policy`` finishes within ``target_makespan_s``.

    Scans down from ``nodes`` and stops at the first count that misses (makespan is
    assumed to grow as nodes are removed); None when even ``nodes`` misses. ``known``
    holds makespans already simulated, by node count.
    """
    known = dict(known or {})
    best = None
    for k in range(nodes, 0, -1):
        if k not in known:
            known[k] = run(jobs, spec, k, seed)[0]["makespan_s"]
        if known[k] > target_makespan_s:
            break
        best = k
    return best


def sequence_seeds(seed: int, sequences: int) -> list[int]:
    """Independent seeds of ``sequences`` workload sequences, derived from ``seed``."""
    rng = random.Random(seed)
    return [rng.randrange(2**31) for _ in range(sequences)]


def one_sequence(workload: Workload, spec: RunSpec, nodes: int | None, seed: int,
                 footprint_against: str | None = None, record: bool = False,
                 progress: Callable[[int], None] | None = None) -> tuple[dict[str, Any], RunResult]:
    """Metrics of ``workload`` under ``spec``, with ``footprint_nodes`` when asked."""
    metrics, result = run(workload.jobs, spec, nodes, seed, record=record, progress=progress)
    metrics["seed"] = seed
    if footprint_against is not None:
        k = result.nodes
        base_spec = RunSpec(footprint_against, spec.inventory, spec.cycle_s, spec.model, spec.settings)
        baseline = run(workload.jobs, base_spec, k, seed)[0]["makespan_s"]
        metrics["footprint_against"] = footprint_against
        metrics["baseline_makespan_s"] = baseline
        metrics["footprint_nodes"] = footprint(workload.jobs, spec, k, baseline, seed,
                                               known={k: metrics["makespan_s"]})
    return metrics, result


def simulate_report(workload_name: str, jobs: int | None, spec: RunSpec, nodes: int | None, seed: int,
                    sequences: int | None = None, footprint_against: str | None = None,
                    record: bool = False,
                    progress: Callable[[int], None] | None = None) -> tuple[dict[str, Any], list[RunResult]]:
    """The ``simulate --json`` object, and the raw results (for plots)."""
    seeds = [seed] if sequences is None else sequence_seeds(seed, sequences)
    runs, results, skipped = [], [], 0
    for s in seeds:
        workload = load_workload(workload_name, jobs, s)
        skipped = len(workload.skipped)
        metrics, result = one_sequence(workload, spec, nodes, s, footprint_against, record, progress)
        runs.append(metrics)
        results.append(result)
    if sequences is None:
        report = dict(runs[0])
    else:
        report = {**{k: runs[0][k] for k in ("jobs", "nodes", "devices", "sockets", "policy", "cycle_s")
                     if k in runs[0]},
                  **mean_metrics(runs), "sequences": runs}
        if "alpha_violations" in runs[0]:
            report["alpha_violations_total"] = sum(r["alpha_violations"] for r in runs)
        if footprint_against is not None:
            found = [r["footprint_nodes"] for r in runs if r["footprint_nodes"] is not None]
            report["footprint_against"] = footprint_against
            report["footprint_nodes"] = sum(found) / len(found) if len(found) == len(runs) else None
    report.update(workload=workload_name, seed=seed, skipped_jobs=skipped, model=(spec.model.name if spec.model else "offload"))
    return report, results
