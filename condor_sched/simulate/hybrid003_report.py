"""The "Spare capacity (paper 003)" section of docs/results.md, for ``scripts/reproduce``.

Each run is one task of the reproduction's process pool: ``(nodes, policy, seed)``. The
published figures are paper 003's Tables I and II (Section IV-C).
"""
from __future__ import annotations

import statistics
from functools import lru_cache
from typing import Any

from cosched_node import insight
from condor_sched.simulate import hybrid003_settings
from condor_sched.simulate.hybrid003_settings import signed_pct
from condor_sched.simulate.hybrid003 import (
    PLAN_S,
    POLICIES,
    SPARE_POLICIES,
    STEP_S,
    RunResult,
    metrics,
    run_policy,
    walltime,
)
from condor_sched.simulate.hybrid003_model import ModelSettings, calibrate
from condor_sched.simulate.hybrid003_workload import APPS, ARRIVALS, HPC_JOBS, SIZES

SEEDS = tuple(range(1, 11))
QUICK_SEEDS = tuple(range(1, 4))
#: Table II (paper 003): makespan (s), CPU utilisation, missed deadlines.
PAPER_II = {"vanilla": (12972, 0.69, 0.0), "collocated": (21652, 0.90, 0.43), "hybrid": (11380, 0.84, 0.0)}
#: Table I's HPC walltime against vanilla (its HPC rows, +14%) and the text's (+9%).
PAPER_HPC_WALLTIME = "+14% (Table I's HPC rows), +13% (its Average row), +9% (Section IV-C's text)"
GOAL_MAKESPAN_OF_VANILLA = 0.85
GOAL_UTILIZATION = 0.84
GOAL_HPC_WALLTIME = 0.05
GOAL_GUEST_OVER_KOORD = 1.2
#: ``hybrid`` at 16 nodes, seeds 1-10, before its stream restarted on a change of a node's
#: primaries (one sliding window per node for the run): the "node's stream" paragraph's before.
WINDOW_KEPT_16 = {"makespan_of_vanilla": 1.020, "cpu_utilization": 0.585, "missed_deadlines": 0.141,
                  "di_turnaround_s": 6356, "reclaimed_core_hours": 94.18, "primary_slowdown": 0.123,
                  "hpc_killed": 5.8}


def tasks(quick: bool) -> list[tuple[int, str, int]]:
    seeds = QUICK_SEEDS if quick else SEEDS
    return [(n, p, s) for n in SIZES for p in POLICIES for s in seeds]


@lru_cache(maxsize=None)
def _vanilla(nodes: int, seed: int, model: ModelSettings) -> RunResult:
    return run_policy(nodes, "vanilla", seed, model)


def run(task: tuple) -> tuple[tuple, dict[str, Any]]:
    """One run's ``--json`` keys and what the section adds: HPC walltime against vanilla as
    Table I compares it (mean over mean), reclaimed core-hours (DI CPU on nodes that held a
    primary), DI mean turnaround, HPC jobs killed (or past their limits), each application's
    mean walltime. ``task``: ``(nodes, policy, seed)`` at the default settings, or with a
    ``ModelSettings`` after the seed (``hybrid003_settings``)."""
    nodes, policy, seed, *given = task
    model = given[0] if given else ModelSettings()
    vanilla = _vanilla(nodes, seed, model)
    result = vanilla if policy == "vanilla" else run_policy(nodes, policy, seed, model)
    out: dict[str, Any] = dict(metrics(result, vanilla))
    hpc = [j for j in result.jobs if j.hpc]
    di = [j for j in result.jobs if not j.hpc]
    out["hpc_walltime_ratio"] = (sum(walltime(result, j.index) for j in hpc)
                                 / sum(walltime(vanilla, j.index) for j in hpc) - 1)
    out["reclaimed_core_hours"] = sum(result.outcomes[j.index].reclaimed_s for j in di) / 3600
    out["di_turnaround_s"] = statistics.mean(result.outcomes[j.index].ended_s - j.arrival_s for j in di)
    out["hpc_killed"] = sum(result.outcomes[j.index].missed for j in hpc)
    out["app_walltime_s"] = {a: [walltime(result, j.index) for j in result.jobs if j.app == a] for a in APPS}
    return task, out


def _stat(results: dict, nodes: int, policy: str, key: str, seeds) -> tuple[float, float]:
    xs = [results[(nodes, policy, s)][key] for s in seeds]
    return statistics.mean(xs), (statistics.stdev(xs) if len(xs) > 1 else 0.0)


def _fmt(mean_sd: tuple[float, float], form: str) -> str:
    m, sd = mean_sd
    if form == "pct":
        return f"{m:.0%} ± {sd:.0%}"
    if form == "spct":
        return f"{m:+.1%} ± {sd:.1%}"
    return f"{m:.0f} ± {sd:.0f}" if form == "int" else f"{m:.2f} ± {sd:.2f}"


def section(results: dict, quick: bool) -> list[str]:
    """The section's lines: the paper's numbers beside ours, means ± standard deviations over seeds."""
    seeds = QUICK_SEEDS if quick else SEEDS
    st = lambda n, p, k: _stat(results, n, p, k, seeds)  # noqa: E731
    k = calibrate()
    L = ["## Spare capacity (paper 003)\n"]
    L.append(f"`condor-sched simulate --workload hybrid-003 --nodes 4|8|16 --policy {'|'.join(POLICIES)} --seed S "
             f"--json`, seeds {seeds[0]}-{seeds[-1]}{' (quick mode: the full run has 10)' if quick else ''}; "
             "means ± standard deviations over the seeds. Clusters of 4, 8 and 16 nodes of 32 cores with "
             f"{', '.join(str(ARRIVALS[n]) for n in SIZES)} arrivals, of them "
             f"{', '.join(str(HPC_JOBS[n]) for n in SIZES)} HPC (Montage, NEK5000, BLAST) and the rest data-intensive "
             "(Statistics, Synthetic), as Section IV-A; run times from Table I's vanilla walltimes, requested times "
             "rounded up to the half-hour (Section IV), time steps of 5 s.\n")
    L.append("Stand-ins for what the text leaves open (each documented in `condor_sched/simulate/hybrid003_workload.py`): "
             "Poisson arrivals at twice the rate the cluster serves them (for the Cirne model with Argonne's pattern), "
             "job sizes weighted 1 / cores (for its small-job bias: Table II's vanilla row implies about 60 cores per job), "
             "run times Table I's mean x U(0.95, 1.05) (each application ran one input, so its run time hardly varies), each application's CPU stages (busy parallel and one-core "
             "sequential stages) and memory. Interference (`hybrid003_model.py`): fair CPU shares without control, the "
             "idle class under the spare mode, and a shared-resource factor 1 / (1 + k x own share x co-runner's share) "
             "with k per application calibrated to Table I's collocated / vanilla walltimes (never to its hybrid column): "
             + ", ".join(f"{a} {v:.2f}" for a, v in k.items())
             + ". Where k is 0 the fair CPU share alone already slows that application more than Table I says.\n")
    L.append("The spare policies run the spare mode's default planner (`spare-spread`) over SPARE slots capped by the "
             "mode's own `capped`; a DI job of N cores is ceil(N / 32) tasks, each requesting 2 cores (the paper's 5% "
             "floor) and using up to its width within the node's cap max(5% C, C - max(estimate, live use)), the "
             "estimate `hybrid`: Q + xi of `cosched_node.insight` (Algorithm 1, the node agent's code), `koordinator`: "
             "its safety margin (40% of CPU) plus the primaries' 300 s mean, `autopilot`: p95 of each primary's "
             "decaying histogram (half-life 12 h) + 10%.\n")
    L.append("The estimators are fed as the live node agent (`cosched_node.spare_duty`) feeds the Insight Engine: "
             f"a sample every {STEP_S:.0f} s (the agent's interval), the node's primaries' CPU over it (a primary "
             "from its second interval), the same samples for all three; each treats a change of the node's "
             "primaries (one starting or ending there) as its field does. `hybrid` keeps the agent's stream "
             f"({insight.InsightSettings().window_s:.0f} s window, {insight.InsightSettings().window_s / STEP_S:.0f} "
             "samples, its settings), which describes the primaries running now: when they change it starts anew "
             "and the step of the change adds no sample (an idle node keeps one stream of zeros). `koordinator` "
             "reads the samples as a 300 s mean that slides across a change (a finished primary's samples weigh "
             "in for up to 5 minutes); `autopilot` puts each primary's part in that primary's histogram, which "
             "goes with it (a primary not sampled yet counts at its cores, Autopilot's first limit). With no "
             f"estimate (under {insight.MIN_SAMPLES} samples: the run's first minute on every node, under `hybrid` "
             "also the minute after each change of its primaries) a node, as the live one, offers nothing "
             "(published not usable) and caps spare tasks at the 5% floor. The estimates are refreshed every "
             f"{PLAN_S:.0f} s, before each planning cycle (the agent: every 5 s; a BLB over "
             f"{insight.InsightSettings().window_s / STEP_S:.0f} samples costs about 5 ms, every 5 s on every node "
             "a run would take minutes), and at the change and the sample that brings a restarted stream back to "
             f"{insight.MIN_SAMPLES}, as the agent; the cap's live term every 5 s.\n")
    L.append("### Table II, 16 nodes\n")
    L.append("| Queue | makespan (s) ours | paper | CPU utilisation ours | paper | missed deadlines ours | paper |")
    L.append("|---|---|---|---|---|---|---|")
    for p in POLICIES:
        paper = PAPER_II.get(p)
        L.append(f"| {p} | {_fmt(st(16, p, 'makespan_s'), 'int')} | {paper[0] if paper else '-'} | "
                 f"{_fmt(st(16, p, 'cpu_utilization'), 'pct')} | {f'{paper[1]:.0%}' if paper else '-'} | "
                 f"{_fmt(st(16, p, 'missed_deadlines'), 'pct')} | {f'{paper[2]:.0%}' if paper else '-'} |")
    L.append("")
    L.append("Table II's caption says its makespans are averages over queues; we read them as the 16-node "
             "figures. Every size:\n")
    L.append("| nodes | policy | makespan (s) | vs vanilla | CPU utilisation | missed deadlines | HPC walltime vs vanilla "
             "| primary_slowdown | mean wait (s) |")
    L.append("|---|---|---|---|---|---|---|---|---|")
    for n in SIZES:
        base = st(n, "vanilla", "makespan_s")[0]
        for p in POLICIES:
            ms = st(n, p, "makespan_s")
            L.append(f"| {n} | {p} | {_fmt(ms, 'int')} | {ms[0] / base - 1:+.1%} | {_fmt(st(n, p, 'cpu_utilization'), 'pct')} "
                     f"| {_fmt(st(n, p, 'missed_deadlines'), 'pct')} | {_fmt(st(n, p, 'hpc_walltime_ratio'), 'spct')} "
                     f"| {_fmt(st(n, p, 'primary_slowdown'), 'spct')} | {_fmt(st(n, p, 'mean_wait_s'), 'int')} |")
    L.append("")
    L.append(f"Paper: HPC walltime against vanilla {PAPER_HPC_WALLTIME}; collocated +67% makespan, 43% missed.\n")
    L.append("### Per application, 16 nodes: mean walltime (s) over all seeds\n")
    L.append("| application | vanilla ours | paper | collocated ours | paper | hybrid ours | paper |")
    L.append("|---|---|---|---|---|---|---|")
    for a, app in APPS.items():
        cells = []
        for p, paper in (("vanilla", app.vanilla_s), ("collocated", app.collocated_s), ("hybrid", app.hybrid_s)):
            xs = [w for s in seeds for w in results[(16, p, s)]["app_walltime_s"][a]]
            cells.append(f"{statistics.mean(xs):.0f} | {paper:.0f}")
        L.append(f"| {a} | " + " | ".join(cells) + " |")
    L.append("")
    L.append("A job killed at its requested time counts its requested time as walltime; Table I's collocated walltimes "
             "(e.g. NEK5000 13005 s) exceed any requested time Section IV's rounding gives, so the paper's collocated "
             "jobs were not all stopped at their limits.\n")
    L.append("### The estimators on the same spare mode\n")
    L.append("`guest_core_hours` counts every CPU-second of the DI jobs; as every DI job completes under every policy "
             "it is the same for all (the DI work is fixed). What an estimator reclaims shows in the CPU the DI tasks "
             "got on nodes that held a primary job (reclaimed core-hours) and in the DI jobs' turnaround.\n")
    L.append("| nodes | policy | guest_core_hours | reclaimed core-hours | DI mean turnaround (s) | primary_slowdown "
             "| HPC jobs killed (per run) | makespan (s) |")
    L.append("|---|---|---|---|---|---|---|---|")
    for n in SIZES:
        for p in ("vanilla", *SPARE_POLICIES):
            L.append(f"| {n} | {p} | {_fmt(st(n, p, 'guest_core_hours'), 'f')} | "
                     f"{_fmt(st(n, p, 'reclaimed_core_hours'), 'f')} | {_fmt(st(n, p, 'di_turnaround_s'), 'int')} | "
                     f"{_fmt(st(n, p, 'primary_slowdown'), 'spct')} | {_fmt(st(n, p, 'hpc_killed'), 'f')} | "
                     f"{_fmt(st(n, p, 'makespan_s'), 'int')} |")
    L.append("")
    L.extend(hybrid003_settings.section(results, quick))
    other = hybrid003_settings.goal_clauses(results, quick)
    L.extend(_goals(st, other))
    L.extend(_why(st, other, seeds == SEEDS))
    return L


def _why(st, other: dict[str, Any], seeds_full: bool) -> list[str]:
    """What the numbers say about the model and the goals (``other``: the settings' figures)."""
    util = {p: st(16, p, "cpu_utilization")[0] for p in POLICIES}
    slow = {p: st(16, p, "primary_slowdown")[0] for p in SPARE_POLICIES}
    reclaim = {p: st(16, p, "reclaimed_core_hours")[0] for p in SPARE_POLICIES}
    turn = {p: st(16, p, "di_turnaround_s")[0] for p in ("vanilla", *SPARE_POLICIES)}
    k = calibrate()
    prev = WINDOW_KEPT_16
    now = {"makespan_of_vanilla": st(16, "hybrid", "makespan_s")[0] / st(16, "vanilla", "makespan_s")[0],
           **{key: st(16, "hybrid", key)[0] for key in prev if key != "makespan_of_vanilla"}}
    return [
        "### Where we land, and why\n",
        f"- Utilisation. Our vanilla uses {util['vanilla']:.0%} of the CPU against the paper's 69%: the stand-in "
        "stages give the HPC jobs a mean use of 47% (Montage) to 80% (NEK5000) of their cores, and the text gives "
        f"no figure to set them by. Hybrid adds {(util['hybrid'] - util['vanilla']) * 100:+.0f} points (the paper +15). "
        f"Primaries busy enough for the paper's vanilla (parallel_idle {other['busiest'][0]:g}: vanilla "
        f"{other['busiest'][1]:.0%}) leave the DI jobs too little to finish early (hybrid {other['busiest'][2]:.3f} x "
        f"vanilla's makespan, {other['busiest'][3]:.0%}); no setting of what the text leaves open gives more than "
        f"{other['utilisation'][0]:.0%}. The paper's 84% with its 0.877 makespan needs a vanilla near 69% and DI jobs "
        "done in the primaries' leftovers at nearly their own pace (its hybrid Statistics and Synthetic walltimes are "
        "+5% and +24% of vanilla's), which a model that gives spare tasks only what the primaries leave does not "
        "give at once.",
        "- HPC walltime and deadlines. The CPU cap protects the primaries' CPU (the spare tasks are in the idle "
        "class and capped at C - max(Q + xi, live use)); what slows them is shared caches, bandwidth and network, "
        f"which Table I's collocated column says are severe for Montage and NEK5000 (k {k['montage']:.1f} and "
        f"{k['nek5000']:.1f}): a spare task using the 30% of a node Montage leaves idle in its parallel stages "
        f"slows it {1 + k['montage'] * 0.7 * 0.3:.2f}x (1 + k x 0.7 x 0.3) while both run. Our hybrid Montage and NEK5000 walltimes come out near the "
        "paper's hybrid column (which we never fit), BLAST's below it (its k is 0: Table I's collocated BLAST is "
        "slowed less than a fair CPU share predicts). A multi-node HPC job runs at its slowest node's pace, and "
        "those slowed past their half-hour slack are killed: the paper reports none, with a +9% to +14% walltime. "
        "Under the other reading, `time-slicing` (Table I's slowdown beyond the fair CPU share is the co-runner's "
        "time-slicing, which the idle class removes), no HPC job is slowed or killed: "
        + ", ".join(f"{n} nodes {signed_pct(w)}, {other['missed_time_slicing'][n]:.0%} missed"
                    for n, w in other["hpc_walltime"].items())
        + ". The text cannot tell the two apart; Table I's hybrid column, never fitted, against the two (mean "
        "walltime at 16 nodes, time-slicing / paper / shared): "
        + ", ".join(f"{a} {t:.0f} / {p:.0f} / {s:.0f} s" for a, (t, p, s) in other["hpc_apps"].items())
        + ". The default stays `shared`, the reading that errs toward the primaries. Within it, the +5% "
        "goal would need a cap that also answers the primaries' sensitivity to interference, which Algorithm 1 "
        "(CPU utilisation only) does not measure (paper 004's model, issue 30).",
        "- Collocated. Our collocated Slurm is faster than vanilla, not 67% slower: a job killed at its limit "
        "stops taking the node, and the calibration assumes a job shares its node all its life, which the "
        "two-jobs-per-node rule gives only part of the time. The paper's collocated walltimes exceed any "
        "requested time its rounding gives, so its jobs ran past their limits; the text does not say how. "
        f"Letting them run on (`--deadlines overrun`) gives {other['collocated'][0]:+.1%} makespan and "
        f"{other['collocated'][1]:.0%} missed, still far from the paper's +67%: that needs each HPC job beside a "
        "DI job all its life (Table I's collocated walltimes, to which k is calibrated, are such lives), and DI "
        "jobs are 39% of the arrivals (33 of 85), so most HPC jobs run alone most of the time.",
        f"- The estimators. At 16 nodes `hybrid` gives the DI tasks {reclaim['hybrid'] / reclaim['koordinator']:.2f}x "
        f"Koordinator's CPU on busy nodes and {reclaim['hybrid'] / reclaim['autopilot']:.2f}x Autopilot's, "
        f"and a DI turnaround of {turn['hybrid']:.0f} s against {turn['koordinator']:.0f} s and "
        f"{turn['autopilot']:.0f} s (vanilla, whole nodes: {turn['vanilla']:.0f} s), at a primary slowdown of "
        f"{slow['hybrid']:+.1%} against {slow['koordinator']:+.1%} and {slow['autopilot']:+.1%}. Koordinator's "
        "40% safety margin leaves most of a busy node's idle CPU unused; Autopilot's p95 + 10% per primary is "
        "near the busy level for any job that is busy more than 5% of its time. What Q + xi (the 80% level) "
        "reclaims beyond them lies in the primaries' busy stages' leftovers, where the interference is paid. "
        "`guest_core_hours` as defined counts all of the DI jobs' fixed work, so it is equal across policies "
        "and cannot show the difference; the reclaimed core-hours do. Under `time-slicing` no estimator slows a "
        "primary, and what each reclaims is its whole difference: "
        + ", ".join(f"{p} {h:.1f}" for p, h in other["reclaimed_time_slicing"].items()) + " core-hours.",
        "- The node's stream. `hybrid`'s stream describes the primaries running now, as the live agent's "
        "(`SpareDuty.sample_primaries`): when a node's primaries change it starts anew, and the node offers "
        f"nothing, its spare tasks at the 5% floor, for the {insight.MIN_SAMPLES} samples (a minute) it takes to "
        "estimate again. The window it replaces, one per node kept across changes, described jobs no longer "
        "there: a finished job's busy phases kept a node it had left from offering its cores for up to 30 "
        "minutes, and an idle node's zeros under a new busy primary let its spare neighbours be capped by its "
        "live use alone. At 16 nodes, seeds 1-10, that window gave a makespan of "
        f"{prev['makespan_of_vanilla']:.3f} x vanilla, {prev['cpu_utilization']:.1%} utilisation, a DI "
        f"turnaround of {prev['di_turnaround_s']:.0f} s, {prev['reclaimed_core_hours']:.2f} reclaimed core-hours, "
        f"a primary slowdown of {prev['primary_slowdown']:+.1%} and {prev['hpc_killed']:.1f} HPC jobs killed per "
        f"run ({prev['missed_deadlines']:.1%} missed); the restarted stream gives {now['makespan_of_vanilla']:.3f}, "
        f"{now['cpu_utilization']:.1%}, {now['di_turnaround_s']:.0f} s, {now['reclaimed_core_hours']:.2f}, "
        f"{now['primary_slowdown']:+.1%} and {now['hpc_killed']:.1f} ({now['missed_deadlines']:.1%})"
        f"{'' if seeds_full else ' (here over the quick seeds)'}. The reset changes when a node's cores are "
        "offered, not the interference a spare task causes beside a busy primary. Koordinator's 300 s mean "
        "slides across a change and Autopilot's histograms are per primary (a node it frees offers all its "
        "cores at the next cycle); neither changed.",
        "",
    ]


def _goals(st, other: dict[str, Any]) -> list[str]:
    """Each goal at the defaults, then under the other settings (``hybrid003_settings``)."""
    L = ["### Goals\n", "At the defaults, then the best of the other settings where it differs:\n"]
    ratio = st(16, "hybrid", "makespan_s")[0] / st(16, "vanilla", "makespan_s")[0]
    util = st(16, "hybrid", "cpu_utilization")[0]
    missed = st(16, "hybrid", "missed_deadlines")[0]
    met = lambda ok: "met" if ok else "not met"  # noqa: E731
    best = other["makespan"], other["utilisation"], other["missed"]
    L.append(f"- hybrid makespan <= {GOAL_MAKESPAN_OF_VANILLA} x vanilla at 16 nodes (paper 0.877): {ratio:.3f}, "
             f"{met(ratio <= GOAL_MAKESPAN_OF_VANILLA)}; best {best[0][0]:.3f} ({best[0][1]}), "
             f"{met(best[0][0] <= GOAL_MAKESPAN_OF_VANILLA)}.")
    L.append(f"- hybrid utilisation >= {GOAL_UTILIZATION:.0%} (paper 84%): {util:.1%}, {met(util >= GOAL_UTILIZATION)}; "
             f"best {best[1][0]:.1%} ({best[1][1]}), {met(best[1][0] >= GOAL_UTILIZATION)}.")
    L.append(f"- hybrid 0 missed deadlines (paper 0): {missed:.1%}, {met(missed == 0)}; best {best[2][0]:.1%} "
             f"({best[2][1]}), {met(best[2][0] == 0)}.")
    col_ms = st(16, "collocated", "makespan_s")[0] / st(16, "vanilla", "makespan_s")[0] - 1
    col_missed = st(16, "collocated", "missed_deadlines")[0]
    over = other["collocated"]
    L.append(f"- collocated in the paper's direction (+67% makespan, 43% missed: longer than vanilla, more missed "
             f"than hybrid): {col_ms:+.1%} makespan, {col_missed:.1%} missed, {met(col_ms > 0 and col_missed > missed)}; "
             f"jobs past their limits running on: {over[0]:+.1%}, {over[1]:.1%} missed, "
             f"{met(over[0] > 0 and over[1] > missed)}.")
    walls = {n: st(n, "hybrid", "hpc_walltime_ratio")[0] for n in SIZES}
    L.append(f"- HPC walltime <= +{GOAL_HPC_WALLTIME:.0%} against vanilla at every size (paper +9% to +14%): "
             + ", ".join(f"{n} nodes {w:+.1%}" for n, w in walls.items())
             + f", {met(all(w <= GOAL_HPC_WALLTIME for w in walls.values()))}; time-slicing: "
             + ", ".join(f"{n} nodes {signed_pct(w)}" for n, w in other["hpc_walltime"].items())
             + f", {met(all(w <= GOAL_HPC_WALLTIME for w in other['hpc_walltime'].values()))}.")
    for n in SIZES:
        g_h, g_k = st(n, "hybrid", "guest_core_hours")[0], st(n, "koordinator", "guest_core_hours")[0]
        r_h, r_k = st(n, "hybrid", "reclaimed_core_hours")[0], st(n, "koordinator", "reclaimed_core_hours")[0]
        s_h, s_k = st(n, "hybrid", "primary_slowdown")[0], st(n, "koordinator", "primary_slowdown")[0]
        ok = (g_h >= GOAL_GUEST_OVER_KOORD * g_k and s_h <= s_k) or (g_h >= g_k and s_h <= s_k / 2)
        line = (f"- {n} nodes, hybrid against koordinator: guest_core_hours x{g_h / g_k:.2f}, reclaimed core-hours "
                f"x{r_h / r_k:.2f}, primary_slowdown {s_h:+.1%} against {s_k:+.1%}: {met(ok)} "
                "(>= 1.2x at no higher slowdown, or >= 1x at half of it)")
        if n in other["koordinator"]:
            rh, sh, rk, sk = other["koordinator"][n]
            ok = (rh >= GOAL_GUEST_OVER_KOORD * rk and sh <= sk) or (rh >= rk and sh <= sk / 2)
            line += (f"; time-slicing, reclaimed core-hours x{rh / rk:.2f}, primary_slowdown {signed_pct(sh)} against "
                     f"{signed_pct(sk)}: {met(ok)} on the reclaimed core-hours")
        L.append(line + ".")
    L.append("")
    return L
