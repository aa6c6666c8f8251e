"""The metrics of a simulation run, and its plots.

All floats are rounded to :data:`DIGITS` significant digits and JSON is written with sorted keys, so
the same seed gives byte-identical output.
"""
from __future__ import annotations

import json
import math
from collections import defaultdict
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from condor_sched.simulate.engine import RunResult

#: Floats are written with this many significant digits.
DIGITS = 6
#: The metrics every run of device jobs reports (and that ``--sequences`` averages).
MEAN_KEYS = ("makespan_s", "mean_wait_s", "mean_turnaround_s", "mean_slowdown", "throughput",
             "device_utilization", "memory_oversubscriptions", "thread_oversubscribed_s",
             "mean_offload_wait_s", "mean_concurrency")
#: The same for runs of parallel CPU jobs (paper 000).
PARALLEL_MEAN_KEYS = ("makespan_s", "mean_wait_s", "mean_turnaround_s", "mean_slowdown", "throughput",
                      "mean_run_s", "mean_run_ratio", "max_run_ratio", "alpha_violations",
                      "core_utilization", "bw_oversubscribed_s", "mean_scale")


def rounded(value: Any) -> Any:
    """``value`` with every float rounded to DIGITS significant digits (recursively)."""
    if isinstance(value, float):
        r = float(f"{value:.{DIGITS}g}")
        return 0.0 if r == 0 else r
    if isinstance(value, Mapping):
        return {k: rounded(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [rounded(v) for v in value]
    return value


def to_json(obj: Any) -> str:
    return json.dumps(rounded(obj), sort_keys=True)


def run_metrics(result: RunResult) -> dict[str, Any]:
    """The documented metrics of one run (device jobs here, parallel jobs below).

    ``mean_slowdown`` is the mean over jobs of turnaround / exclusive run time;
    ``throughput`` is 1 / mean turnaround (per second); ``device_utilization`` is busy
    device-thread-seconds over the devices' hardware threads times the makespan;
    ``thread_oversubscribed_s`` sums, over devices, the time their resident jobs requested
    more threads than the device has (time COSMIC had to serialise offloads);
    ``mean_concurrency`` is the time-average number of jobs resident on a device.
    """
    jobs = result.jobs
    if result.pool is not None:
        return parallel_metrics(result)
    n = len(jobs)
    waits = [r.start_s - r.job.arrival_s for r in jobs]
    turnarounds = [r.end_s - r.job.arrival_s for r in jobs]
    slowdowns = [t / r.job.exclusive_runtime_s for t, r in zip(turnarounds, jobs)]
    makespan = result.makespan_s
    busy = sum(d.runtime.busy_thread_s for d in result.devices)
    capacity = sum(d.slot.total.device_threads for d in result.devices) * makespan
    resident_s = sum(c * s for d in result.devices for c, s in d.concurrency_s.items())
    mean_turnaround = sum(turnarounds) / n
    return {
        "jobs": n,
        "nodes": result.nodes,
        "devices": len(result.devices),
        "policy": result.policy,
        "cycle_s": result.cycle_s,
        "makespan_s": makespan,
        "mean_wait_s": sum(waits) / n,
        "mean_turnaround_s": mean_turnaround,
        "mean_slowdown": sum(slowdowns) / n,
        "throughput": 1.0 / mean_turnaround if mean_turnaround > 0 else 0.0,
        "device_utilization": busy / capacity if capacity > 0 else 0.0,
        "memory_oversubscriptions": result.memory_oversubscriptions,
        "thread_oversubscribed_s": sum(d.thread_oversubscribed_s for d in result.devices),
        "mean_offload_wait_s": sum(d.runtime.offload_wait_s for d in result.devices) / n,
        "mean_concurrency": resident_s / (len(result.devices) * makespan) if makespan > 0 else 0.0,
        "refused_starts": result.refused_starts,
        "invalid_assignments": result.invalid_assignments,
        "pins_kept": result.pins_kept,
        "unpins": result.unpins,
        "cycles": result.cycles,
        "plans": result.plans,
    }


def parallel_metrics(result: RunResult) -> dict[str, Any]:
    """The metrics of a run of parallel CPU jobs (paper 000).

    ``throughput`` is 1 / mean turnaround, the reciprocal of the average submit-to-finish
    time (Section 6.2); ``mean_run_s`` the mean start-to-finish time; ``mean_run_ratio``
    the geometric mean, and ``max_run_ratio`` the maximum, over jobs of run time / the
    profile's compact-exclusive (k = 1) run time (Fig. 16 normalises to CE); ``alpha_violations``
    counts jobs whose run time exceeded that exclusive time / alpha (Section 6.2: 136 of
    720 beyond 1.1); ``core_utilization`` busy proc-seconds over the pool's cores times
    the makespan; ``bw_oversubscribed_s`` socket-seconds with bandwidth demand over the
    socket's peak; ``mean_scale`` the mean scale factor k the jobs ran at.
    """
    jobs = result.jobs
    n = len(jobs)
    waits = [r.start_s - r.job.arrival_s for r in jobs]
    turnarounds = [r.end_s - r.job.arrival_s for r in jobs]
    runs = [r.end_s - r.start_s for r in jobs]
    ratios = [run / r.job.exclusive_runtime_s for run, r in zip(runs, jobs)]
    violations = sum(run > r.job.exclusive_runtime_s / r.job.alpha * (1 + 1e-9) for run, r in zip(runs, jobs))
    makespan = result.makespan_s
    cores = sum(s.slot.total.cpus for s in result.sockets)
    busy = sum(run * r.job.procs for run, r in zip(runs, jobs))
    mean_turnaround = sum(turnarounds) / n
    return {
        "jobs": n,
        "nodes": result.nodes,
        "sockets": len(result.sockets),
        "procs": sum(r.job.procs for r in jobs),
        "policy": result.policy,
        "cycle_s": result.cycle_s,
        "makespan_s": makespan,
        "mean_wait_s": sum(waits) / n,
        "mean_turnaround_s": mean_turnaround,
        "mean_slowdown": sum(t / r.job.exclusive_runtime_s for t, r in zip(turnarounds, jobs)) / n,
        "throughput": 1.0 / mean_turnaround if mean_turnaround > 0 else 0.0,
        "mean_run_s": sum(runs) / n,
        "mean_run_ratio": math.exp(sum(math.log(x) for x in ratios) / n),
        "max_run_ratio": max(ratios),
        "alpha_violations": violations,
        "core_utilization": busy / (cores * makespan) if cores and makespan > 0 else 0.0,
        "bw_oversubscribed_s": result.pool.bw_oversubscribed_s,
        "mean_scale": sum(r.scale for r in jobs) / n,
        "refused_starts": result.refused_starts,
        "invalid_assignments": result.invalid_assignments,
        "pins_kept": result.pins_kept,
        "unpins": result.unpins,
        "cycles": result.cycles,
        "plans": result.plans,
    }


def mean_metrics(runs: Sequence[Mapping[str, Any]]) -> dict[str, float]:
    keys = PARALLEL_MEAN_KEYS if "alpha_violations" in runs[0] else MEAN_KEYS
    return {k: sum(float(r[k]) for r in runs) / len(runs) for k in keys}


def concurrency_histogram(result: RunResult) -> dict[int, float]:
    """Device-seconds spent with k resident jobs, summed over devices."""
    hist: dict[int, float] = defaultdict(float)
    for d in result.devices:
        for k, s in d.concurrency_s.items():
            hist[k] += s
    return dict(sorted(hist.items()))


def utilization_series(result: RunResult, bin_s: float | None = None) -> tuple[list[float], list[float]]:
    """(bin start times, busy fraction of all device threads) from recorded offloads."""
    makespan = result.makespan_s
    if makespan <= 0:
        return [], []
    bin_s = bin_s or max(1.0, makespan / 200)
    bins = int(makespan // bin_s) + 1
    busy = [0.0] * bins
    for d in result.devices:
        for start, end, threads in d.runtime.busy_intervals:
            b = int(start // bin_s)
            while start < end and b < bins:
                edge = min(end, (b + 1) * bin_s)
                busy[b] += (edge - start) * threads
                start, b = edge, b + 1
    capacity = sum(d.slot.total.device_threads for d in result.devices) * bin_s
    return [i * bin_s for i in range(bins)], [x / capacity for x in busy]


class PlotError(RuntimeError):
    """Plotting was asked for but matplotlib is not installed."""


def write_plots(results: Iterable[tuple[str, RunResult]], directory: str | Path, prefix: str = "") -> list[Path]:
    """Write utilisation-over-time, concurrency-histogram and makespan-by-policy PNGs; return
    their paths. Legends go under the axes so they never hide the data."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise PlotError("--plot needs matplotlib: pip install 'condor-sched[plot]'") from None
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    results = list(results)
    paths = []
    fig, ax = plt.subplots(figsize=(8, 5))
    for label, result in results:
        xs, ys = utilization_series(result)
        ax.plot(xs, ys, label=label, linewidth=1)
    ax.set_xlabel("time (s)")
    ax.set_ylabel("device thread utilisation")
    ax.set_ylim(0, 1.05)
    _legend_below(ax, len(results))
    fig.tight_layout()
    paths.append(directory / f"{prefix}utilization.png")
    fig.savefig(paths[-1], dpi=100, metadata={"Software": None})
    plt.close(fig)
    fig, ax = plt.subplots(figsize=(8, 5))
    width = 0.8 / max(1, len(results))
    for i, (label, result) in enumerate(results):
        hist = concurrency_histogram(result)
        total = sum(hist.values()) or 1.0
        ax.bar([k + i * width for k in hist], [v / total for v in hist.values()], width=width, label=label)
    ax.set_xlabel("jobs resident on a device")
    ax.set_ylabel("fraction of device time")
    _legend_below(ax, len(results))
    fig.tight_layout()
    paths.append(directory / f"{prefix}concurrency.png")
    fig.savefig(paths[-1], dpi=100, metadata={"Software": None})
    plt.close(fig)
    fig, ax = plt.subplots(figsize=(7, 0.6 + 0.45 * len(results)))
    labels = [label for label, _ in results]
    spans = [result.makespan_s for _, result in results]
    ax.barh(range(len(results)), spans, color="tab:blue")
    ax.set_yticks(range(len(results)), labels)
    ax.invert_yaxis()
    for i, span in enumerate(spans):
        ax.text(span, i, f" {span:.0f} s", va="center")
    ax.set_xlabel("makespan (s)")
    ax.set_xlim(0, max(spans, default=1) * 1.15)
    fig.tight_layout()
    paths.append(directory / f"{prefix}makespan.png")
    fig.savefig(paths[-1], dpi=100, metadata={"Software": None})
    plt.close(fig)
    return paths


def _legend_below(ax, entries: int) -> None:
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.22), ncol=2 if entries > 3 else entries,
              fontsize="small", frameon=False)
