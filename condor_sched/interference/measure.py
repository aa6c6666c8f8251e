"""Measure the suite alone, in pairs and beside Bubble-Up bubbles, in two placements.

Placements (what a pair shares):

* ``separate``: one vCPU each, on one node: they share the last-level cache and memory
  bandwidth, the placement every sharing mode here makes;
* ``shared``: both time-share one vCPU, the paper's overcommit (Section 3.2) with OS-level
  preemption instead of SMT, which our nodes do not expose.

Each run starts its programs together (each builds its working set, says "ready", and all
get "go" at once) and every program reports its units of work inside one common window, so
the speeds compared are speeds during full overlap, as the paper's repeated batch runs
(Section 5.1: "we have executed both the victim and the opponent repeatedly"). The runs of
all kinds are shuffled into one order, so a drift of the host spreads over every pair.
Pressure stall information (``/proc/pressure``) is read around every run; it is system-wide.

The result is a dataset of raw runs (``dataset.py`` derives Ev, Eo and features from it).
"""
from __future__ import annotations

import itertools
import json
import os
import platform
import random
import select
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from condor_sched.interference.suite import Program, bubble

DATASET_VERSION = 2
PLACEMENTS = ("separate", "shared")
#: Fields of a kernel's report kept in the dataset (the rest is recomputed or not used).
REPORT_FIELDS = ("units", "span_s", "busy_s", "elapsed_s", "user_s", "system_s", "max_rss_kib", "minor_faults",
                 "major_faults", "voluntary_switches", "involuntary_switches", "sched_run_ns", "sched_wait_ns",
                 "sched_timeslices")
PRESSURE_FILES = ("cpu", "memory", "io")


class MeasureError(RuntimeError):
    """A run could not be made (a program failed, hung, or the node lacks what it needs)."""


@dataclass(frozen=True)
class Timing:
    """How long each run lasts: ``warmup_s`` before the window, then ``window_s`` measured."""

    warmup_s: float = 0.15
    window_s: float = 0.8
    timeout_s: float = 60.0


@dataclass(frozen=True)
class Run:
    """One run to make: ``kind`` alone, pair, probe (a program beside a bubble), pressure (the
    reporter beside a program) or calibration (the reporter beside a bubble)."""

    kind: str
    placement: str
    programs: tuple[str, ...]


def plan_runs(suite: Sequence[Program], bubble_sizes_kib: Sequence[int], reporter: Program, repeats: int,
              alone_repeats: int, seed: int) -> list[Run]:
    """Every run of a measurement, shuffled: pairs (unordered, a program with itself too),
    probes, pressures and calibrations in both placements ``repeats`` times, and each program,
    bubble and the reporter alone ``alone_repeats`` times."""
    names = [p.name for p in suite]
    bubbles = [bubble(size).name for size in bubble_sizes_kib]
    runs: list[Run] = []
    for _ in range(alone_repeats):
        runs += [Run("alone", "alone", (name,)) for name in names + bubbles + [reporter.name]]
    for _ in range(repeats):
        for placement in PLACEMENTS:
            runs += [Run("pair", placement, pair) for pair in itertools.combinations_with_replacement(names, 2)]
            runs += [Run("probe", placement, (name, b)) for name in names for b in bubbles]
            runs += [Run("pressure", placement, (reporter.name, name)) for name in names]
            runs += [Run("calibration", placement, (reporter.name, b)) for b in bubbles]
    random.Random(seed).shuffle(runs)
    return runs


def pair_cpus() -> tuple[int, int]:
    """The two vCPUs runs use: the first two this process may run on."""
    allowed = sorted(os.sched_getaffinity(0))
    if len(allowed) < 2:
        raise MeasureError(f"the separate placement needs two CPUs; this process may use only {allowed}")
    return allowed[0], allowed[1]


def read_pressure() -> dict[str, float]:
    """``some total`` (µs) of each pressure file that exists (system-wide stall time)."""
    out: dict[str, float] = {}
    for name in PRESSURE_FILES:
        try:
            text = Path("/proc/pressure", name).read_text()
        except OSError:
            continue
        for line in text.splitlines():
            if line.startswith("some "):
                out[name] = float(line.rsplit("total=", 1)[1])
    return out


def _parse_report(line: str, program: Program) -> dict[str, float]:
    try:
        report = json.loads(line)
    except json.JSONDecodeError:
        raise MeasureError(f"{program.name}: not a report: {line[:200]!r}") from None
    if not isinstance(report, dict) or report.get("kernel") != program.kernel:
        raise MeasureError(f"{program.name}: report names another kernel: {line[:200]!r}")
    kept = {k: report[k] for k in REPORT_FIELDS if isinstance(report.get(k), (int, float))}
    kept.update({k: v for k, v in report.items() if k.startswith("perf_") and isinstance(v, (int, float))})
    if kept.get("units", 0) < 2 or kept.get("busy_s", 0) <= 0:
        raise MeasureError(f"{program.name}: finished too few units in the window ({kept.get('units')}); "
                           "lengthen the window")
    return kept


def run_together(binary: Path, programs: Sequence[Program], cpus: Sequence[int], timing: Timing) -> list[dict]:
    """Run programs together, each pinned to its CPU, and return their reports in order (a
    caller drops the filler's)."""
    procs: list[subprocess.Popen] = []
    try:
        for program, cpu in zip(programs, cpus):
            proc = subprocess.Popen(program.argv(binary, timing.warmup_s, timing.window_s), stdin=subprocess.PIPE,
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            procs.append(proc)
            os.sched_setaffinity(proc.pid, {cpu})
        for program, proc in zip(programs, procs):
            if not select.select([proc.stdout], [], [], timing.timeout_s)[0]:
                raise MeasureError(f"{program.name}: not ready after {timing.timeout_s} s")
            ready = proc.stdout.readline().strip()
            if ready != "ready":
                raise MeasureError(f"{program.name}: did not start: {ready!r} {proc.stderr.read()[:400]!r}")
        for proc in procs:
            proc.stdin.write("go\n")
            proc.stdin.flush()
        reports = []
        for program, proc in zip(programs, procs):
            out, err = proc.communicate(timeout=timing.timeout_s)
            if proc.returncode != 0:
                raise MeasureError(f"{program.name}: exit {proc.returncode}: {err.strip()[:400]}")
            reports.append(_parse_report(out.strip().splitlines()[-1] if out.strip() else "", program))
        return reports
    except subprocess.TimeoutExpired:
        raise MeasureError(f"{'+'.join(p.name for p in programs)}: still running after {timing.timeout_s} s") from None
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def host_description() -> dict[str, object]:
    model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    pmu = Path("/sys/bus/event_source/devices/cpu").exists()
    return {"cpu_model": model, "cpus": os.cpu_count(), "kernel": platform.release(), "hardware_pmu": pmu,
            "python": platform.python_version()}


def measure(binary: Path, suite: Sequence[Program], bubble_sizes_kib: Sequence[int], reporter: Program,
            filler: Program, *, repeats: int, alone_repeats: int, timing: Timing, seed: int,
            checkpoint: Callable[[dict], None] | None = None, progress=sys.stderr) -> dict:
    """Make every run of ``plan_runs`` and return the dataset (``checkpoint`` gets it every 25
    runs). The filler holds the second vCPU in runs alone and time-shared (suite.py)."""
    first, second = pair_cpus()
    cpus = {"alone": (first, second), "separate": (first, second), "shared": (first, first, second)}
    programs = {p.name: p for p in suite}
    programs.update({bubble(size).name: bubble(size) for size in bubble_sizes_kib})
    programs[reporter.name] = reporter
    runs = plan_runs(suite, bubble_sizes_kib, reporter, repeats, alone_repeats, seed)
    dataset: dict = {
        "version": DATASET_VERSION, "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "host": host_description(), "timing": asdict(timing), "seed": seed, "repeats": repeats,
        "alone_repeats": alone_repeats, "placements": list(PLACEMENTS),
        "suite": [asdict(p) for p in suite], "bubble_sizes_kib": list(bubble_sizes_kib),
        "reporter": asdict(reporter), "filler": asdict(filler), "runs": [],
    }
    started = time.monotonic()
    for index, run in enumerate(runs, 1):
        members = [programs[name] for name in run.programs]
        if run.placement in ("alone", "shared"):
            members.append(filler)
        before = read_pressure()
        t0 = time.monotonic()
        reports = run_together(binary, members, cpus[run.placement], timing)[:len(run.programs)]
        elapsed = time.monotonic() - t0
        after = read_pressure()
        pressure = {k: round((after[k] - before[k]) / elapsed, 3) for k in after if k in before}
        dataset["runs"].append({**asdict(run), "programs": list(run.programs), "reports": reports,
                                "pressure_us_per_s": pressure})
        if index % 25 == 0 or index == len(runs):
            if checkpoint is not None:
                checkpoint(dataset)
            if progress is not None:
                rate = (time.monotonic() - started) / index
                print(f"interference measure: {index}/{len(runs)} runs, about "
                      f"{rate * (len(runs) - index) / 60:.0f} min left", file=progress, flush=True)
    return dataset


def write_dataset(dataset: dict, path: Path) -> None:
    """Write the dataset atomically (one run per line, so a diff shows what changed)."""
    head = {k: v for k, v in dataset.items() if k != "runs"}
    lines = [json.dumps(run, sort_keys=True, separators=(",", ":")) for run in dataset.get("runs", [])]
    text = json.dumps(head, indent=1, sort_keys=True)[:-2] + ',\n "runs": [\n' + ",\n".join(lines) + "\n ]\n}\n"
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)
