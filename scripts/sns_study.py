#!/usr/bin/env python3
"""Where SNS's gain comes from on paper 000's random sequences (issue 12's investigation).

    PYTHONPATH=. python scripts/sns_study.py [--sequences 36] [--rows ce,cs,sns,sns@120] [--profiles DIR]

Rows are ``policy`` or ``policy@age_limit_cycles`` (``off`` = aging off). For each row it
prints throughput against ``ce`` and ``cs`` (geometric means over sequences), alpha
violations, mean wait and run times, core utilisation, and per program class the mean run
time / t(1), the mean scale k and the share of jobs that ran spread (k > 1). ``--bounds``
adds what cs's and sns's placements would reach if co-location cost nothing.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from collections import defaultdict
from pathlib import Path

from condor_sched.modes.planning import PlanSettings
from condor_sched.profiles import ProfileStore
from condor_sched.simulate.engine import xeon_inventory
from condor_sched.simulate import profile_model as pm
from condor_sched.simulate.profile_model import ProfileDrivenModel
from condor_sched.simulate.study import RunSpec, run, sequence_seeds
from condor_sched.simulate.workloads import default_profiles, sns_random_jobs

OFF = 10**9


def geo(xs: list[float]) -> float:
    return math.exp(sum(math.log(x) for x in xs) / len(xs))


def aging(age: int) -> PlanSettings:
    """Settings with the spread policies' aging limit at ``age`` cycles (the device limit too)."""
    if "spread_age_limit_cycles" in PlanSettings.__dataclass_fields__:
        return PlanSettings(age_limit_cycles=age, spread_age_limit_cycles=age)
    return PlanSettings(age_limit_cycles=age)  # before the separate spread limit


def parse_row(row: str) -> tuple[str, int]:
    policy, _, age = row.partition("@")
    return policy, (OFF if age in ("", "off") else int(age))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sequences", type=int, default=36)
    ap.add_argument("--seed", type=int, default=2019)
    ap.add_argument("--rows", default="ce,cs,sns")
    ap.add_argument("--profiles", default=None)
    ap.add_argument("--cycle-s", type=float, default=5.0)
    ap.add_argument("--json", default=None, help="write the per-row summary here")
    ap.add_argument("--bounds", action="store_true",
                    help="also run the placement bounds: cs and sns placements with no co-location "
                         "slowdown (every rate 1), at t(k) and at each program's best t(k)")
    args = ap.parse_args(argv)
    store = ProfileStore.load_dir(args.profiles) if args.profiles else default_profiles()
    if store.skipped:
        print("skipped:", store.skipped, file=sys.stderr)
    seeds = sequence_seeds(args.seed, args.sequences)
    rows = [parse_row(r) for r in args.rows.split(",")]
    model = ProfileDrivenModel(store)
    results: dict[tuple[str, int], list[dict]] = {}
    per_class: dict[tuple[str, int], dict[str, list[tuple[float, float]]]] = {}
    scaling_ratio: list[float] = []
    for policy, age in rows:
        spec = RunSpec(policy, xeon_inventory(8), args.cycle_s, model, aging(age), store)
        out, classes = [], defaultdict(list)
        for seed in seeds:
            jobs = sns_random_jobs(20, seed, store)
            if (policy, age) == rows[0]:
                ch = {j.index: j.procs * j.exclusive_runtime_s for j in jobs}
                sc = sum(ch[j.index] for j in jobs if store.get(j.program).program_class.value == "scaling")
                scaling_ratio.append(sc / sum(ch.values()))
            metrics, result = run(jobs, spec, 8, seed)
            out.append(metrics)
            for r in result.jobs:
                cls = store.get(r.job.program).program_class.value
                classes[cls].append(((r.end_s - r.start_s) / r.job.exclusive_runtime_s, r.scale,
                                     r.start_s - r.job.arrival_s))
                classes["prog:" + r.job.program].append(((r.end_s - r.start_s) / r.job.exclusive_runtime_s,
                                                         r.scale, r.start_s - r.job.arrival_s))
        results[(policy, age)] = out
        per_class[(policy, age)] = classes
    print(f"{len(seeds)} sequences from seed {args.seed}; scaling ratio (core-s of scaling jobs under CE) "
          f"min {min(scaling_ratio):.2f} mean {sum(scaling_ratio) / len(scaling_ratio):.2f} max {max(scaling_ratio):.2f}")
    base = {p: [m["throughput"] for m in results[(p, OFF)]] for p in ("ce", "cs") if (p, OFF) in results}
    summary = {}
    for key in rows:
        ms = results[key]
        tp = [m["throughput"] for m in ms]
        row: dict = {"row": f"{key[0]}@{'off' if key[1] == OFF else key[1]}"}
        for b, bt in base.items():
            rel = [a / c for a, c in zip(tp, bt)]
            row[f"vs_{b}"] = geo(rel) - 1
            row[f"best_vs_{b}"] = max(rel) - 1
            row[f"worst_vs_{b}"] = min(rel) - 1
            lost = [x for x in rel if x < 1 - 1e-9]
            row[f"loss_where_lost_vs_{b}"] = geo(lost) - 1 if lost else 0.0
            row[f"wins_vs_{b}"] = sum(x > 1 + 1e-9 for x in rel)
            won = [x for x in rel if x > 1 + 1e-9]
            row[f"gain_where_won_vs_{b}"] = geo(won) - 1 if won else 0.0
        row["violations"] = sum(m["alpha_violations"] for m in ms)
        for k in ("mean_wait_s", "mean_run_s", "core_utilization", "mean_scale", "makespan_s"):
            row[k] = sum(m[k] for m in ms) / len(ms)
        row["run_ratio_geo"] = geo([m["mean_run_ratio"] for m in ms])
        cls = {}
        for c, xs in sorted(per_class[key].items()):
            cls[c] = {"jobs": len(xs), "run_ratio": sum(x[0] for x in xs) / len(xs),
                      "k": sum(x[1] for x in xs) / len(xs), "spread": sum(x[1] > 1 for x in xs) / len(xs),
                      "wait": sum(x[2] for x in xs) / len(xs)}
        row["classes"] = cls
        summary[row["row"]] = row
        print(f"\n{row['row']}: " + ", ".join(
            f"{k} {v:+.1%}" if k.startswith(("vs_", "best", "worst", "gain", "loss")) else f"{k} {v:.3g}"
            for k, v in row.items() if k not in ("row", "classes")))
        for c, v in cls.items():
            print(f"   {c:12} jobs {v['jobs']:4d} run/t1 {v['run_ratio']:.3f} k {v['k']:.2f} "
                  f"spread {v['spread']:.0%} wait {v['wait']:.0f}")
    if args.bounds:
        summary["bounds"] = placement_bounds(seeds, store, model, args.cycle_s, base)
    if args.json:
        Path(args.json).write_text(json.dumps(summary, indent=1))
    return 0


def placement_bounds(seeds: list[int], store: ProfileStore, model: ProfileDrivenModel, cycle_s: float,
                     base: dict[str, list[float]]) -> dict[str, dict[str, float]]:
    """Throughput of cs's and sns's placements if co-location cost nothing (every job's
    rate 1), at the scale it ran (t(k)) and at its program's best exclusive time: what a
    policy placing as they do could at most reach under any runtime model."""
    out: dict[str, dict[str, float]] = {}
    saved_rates, saved_runtime = pm.PoolRuntime._rates, pm.exclusive_runtime_s
    try:
        pm.PoolRuntime._rates = lambda self: ({i: 1.0 for i in self._running}, 0)
        for best in (False, True):
            if best:
                pm.exclusive_runtime_s = lambda profile, k: min(
                    t for s, t in profile.runtime_s.items() if s <= profile.max_scale)
            for policy in ("cs", "sns"):
                spec = RunSpec(policy, xeon_inventory(8), cycle_s, model, aging(OFF), store)
                ms = [run(sns_random_jobs(20, s, store), spec, 8, s)[0] for s in seeds]
                tp = [m["throughput"] for m in ms]
                name = f"{policy} placements, no co-location cost, {'best t(k)' if best else 't(k)'}"
                out[name] = {f"vs_{b}": geo([a / c for a, c in zip(tp, bt)]) - 1 for b, bt in base.items()}
                out[name].update({k: sum(m[k] for m in ms) / len(ms) for k in ("mean_wait_s", "mean_run_s",
                                                                                 "core_utilization")})
                print(f"{name:48} " + ", ".join(f"{k} {v:+.1%}" if k.startswith("vs_") else f"{k} {v:.3g}"
                                                for k, v in out[name].items()))
    finally:
        pm.PoolRuntime._rates, pm.exclusive_runtime_s = saved_rates, saved_runtime
    return out


if __name__ == "__main__":
    sys.exit(main())
