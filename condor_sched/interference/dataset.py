"""A measured interference dataset: its runs checked, and Ev, Eo and features derived from them.

Degradation (paper 004, Section 4.3, Eq. 1-2), from speeds during full overlap: a program's
speed s is its units of work per second of its execution periods, over its dedicated speed
(the median of its runs alone). The victim loses ``busy_v * (1 - s_v)`` seconds while the
opponent executes for ``busy_o`` seconds, so

    Ev = busy_v * (1 - s_v) / busy_o        (Eq. 1: (Tv,OC - Tv,Ded) / To,OC)
    Eo = 1 - s_o                            (Eq. 2: (To,OC - To,Ded) / To,OC)

For two batch programs (``busy`` = the window) Ev = 1 - s_v; perfect time sharing of one core
gives Ev = Eo = 0.5 (Eq. 3-6), and a pair is well-matched when E = Ev + Eo < 1.

Features of a program come from its exclusive runs only (what a profile of a job can hold):
software signals normalised per second (CPU share in user and system mode, page faults,
voluntary and involuntary switches, scheduler run delay and timeslices from
``/proc/<pid>/schedstat``, perf software events, peak resident memory, system-wide pressure
stall time), plus Bubble-Up probes per placement: its slowdown beside each bubble size
(sensitivity), the reporter's slowdown beside it, and the bubble size that slowdown equals.
"""
from __future__ import annotations

import json
import math
import statistics
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from condor_sched.interference.measure import DATASET_VERSION, PLACEMENTS
from condor_sched.interference.suite import bubble

MAX_DATASET_BYTES = 256 << 20
RUN_KINDS = ("alone", "pair", "probe", "pressure", "calibration")


class DatasetError(ValueError):
    """A dataset file that cannot be used; the message names the file and what is wrong."""


@dataclass(frozen=True)
class PairRecord:
    """One directed record: ``victim`` beside ``opponent`` in a placement (medians of the runs)."""

    placement: str
    victim: str
    opponent: str
    ev: float
    eo: float
    ev_runs: tuple[float, ...]

    @property
    def pair(self) -> tuple[str, str]:
        a, b = sorted((self.victim, self.opponent))
        return a, b


@dataclass(frozen=True)
class Dataset:
    """A loaded dataset: its header, its runs, and the derived tables."""

    path: str
    header: Mapping[str, object]
    runs: tuple[Mapping, ...]

    @property
    def programs(self) -> tuple[str, ...]:
        return tuple(p["name"] for p in self.header["suite"])

    @property
    def placements(self) -> tuple[str, ...]:
        return tuple(self.header["placements"])


def _fail(path: str, what: str) -> DatasetError:
    return DatasetError(f"{path}: {what}")


def load_dataset(path: Path | str) -> Dataset:
    """Read and check a dataset file (``interference measure`` writes them)."""
    name = str(path)
    try:
        size = Path(path).stat().st_size
        if size > MAX_DATASET_BYTES:
            raise _fail(name, f"{size} bytes, more than a dataset may hold ({MAX_DATASET_BYTES})")
        obj = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise _fail(name, f"not a readable JSON dataset: {e}") from None
    return check_dataset(obj, name)


def _number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def check_dataset(obj: object, name: str = "dataset") -> Dataset:
    """The dataset with every field a derivation reads checked; an error names the first bad one."""
    if not isinstance(obj, dict):
        raise _fail(name, "not a JSON object")
    if obj.get("version") != DATASET_VERSION:
        raise _fail(name, f"version {obj.get('version')!r}, this reader knows {DATASET_VERSION}")
    suite = obj.get("suite")
    if not isinstance(suite, list) or not suite or not all(isinstance(p, dict) and isinstance(p.get("name"), str)
                                                           for p in suite):
        raise _fail(name, "'suite' must be a non-empty list of programs with a name")
    if len({p["name"] for p in suite}) != len(suite):
        raise _fail(name, "'suite' names a program twice")
    placements = obj.get("placements")
    if not isinstance(placements, list) or not placements or not set(placements) <= set(PLACEMENTS):
        raise _fail(name, f"'placements' must list some of {list(PLACEMENTS)}")
    sizes = obj.get("bubble_sizes_kib")
    if not isinstance(sizes, list) or len(sizes) < 2 or not all(isinstance(s, int) and s > 0 for s in sizes):
        raise _fail(name, "'bubble_sizes_kib' must list at least two positive sizes")
    reporter = obj.get("reporter")
    if not isinstance(reporter, dict) or not isinstance(reporter.get("name"), str):
        raise _fail(name, "'reporter' must be a program with a name")
    known = {p["name"] for p in suite} | {bubble(s).name for s in sizes} | {reporter["name"]}
    runs = obj.get("runs")
    if not isinstance(runs, list) or not runs:
        raise _fail(name, "'runs' must be a non-empty list")
    for index, run in enumerate(runs):
        where = f"runs[{index}]"
        if not isinstance(run, dict) or run.get("kind") not in RUN_KINDS:
            raise _fail(name, f"{where}: 'kind' must be one of {list(RUN_KINDS)}")
        programs, reports = run.get("programs"), run.get("reports")
        width = 1 if run["kind"] == "alone" else 2
        if not isinstance(programs, list) or len(programs) != width or not set(programs) <= known:
            raise _fail(name, f"{where}: 'programs' must name {width} program(s) of the suite or bubbles")
        if run["kind"] != "alone" and run.get("placement") not in placements:
            raise _fail(name, f"{where}: 'placement' {run.get('placement')!r} is not one of {placements}")
        if not isinstance(reports, list) or len(reports) != width:
            raise _fail(name, f"{where}: 'reports' must hold {width} report(s)")
        for report in reports:
            if not isinstance(report, dict):
                raise _fail(name, f"{where}: a report must be an object")
            for key in ("units", "busy_s", "elapsed_s"):
                value = report.get(key)
                if not _number(value) or value <= 0:
                    raise _fail(name, f"{where}: report field {key!r} must be a positive number, not {value!r}")
            for key, value in report.items():   # every other reading a derivation may divide or log
                if not _number(value) or value < 0:
                    raise _fail(name, f"{where}: report field {key!r} must be a number >= 0, not {value!r}")
        pressure = run.get("pressure_us_per_s", {})
        if not isinstance(pressure, dict) or not all(_number(v) for v in pressure.values()):
            raise _fail(name, f"{where}: 'pressure_us_per_s' must map names to numbers")
    names = [p["name"] for p in suite]
    alone = {r["programs"][0] for r in runs if r["kind"] == "alone"}
    missing = sorted(set(names) - alone)
    if missing:
        raise _fail(name, f"no run alone of {missing}: their dedicated speed is unknown")
    return Dataset(name, {k: v for k, v in obj.items() if k != "runs"}, tuple(runs))


def rate(report: Mapping) -> float:
    """Units of work per second of execution periods."""
    return float(report["units"]) / float(report["busy_s"])


def _alone_rates(data: Dataset) -> dict[str, list[float]]:
    rates: dict[str, list[float]] = defaultdict(list)
    for run in data.runs:
        if run["kind"] == "alone":
            rates[run["programs"][0]].append(rate(run["reports"][0]))
    return rates


def dedicated_rates(data: Dataset) -> dict[str, float]:
    """Each program's dedicated speed: the median of its rates alone."""
    return {name: statistics.median(values) for name, values in _alone_rates(data).items()}


def alone_cv(data: Dataset) -> dict[str, float]:
    """Each program's coefficient of variation of its rates alone (how much the host moves it)."""
    return {name: statistics.pstdev(v) / statistics.fmean(v)
            for name, v in sorted(_alone_rates(data).items()) if len(v) >= 2}


def degradation(victim: Mapping, opponent: Mapping, victim_rate: float, opponent_rate: float) -> tuple[float, float]:
    """(Ev, Eo) of one run (Eq. 1-2, over speeds during the overlap; module docstring)."""
    s_v = rate(victim) / victim_rate
    s_o = rate(opponent) / opponent_rate
    return float(victim["busy_s"]) * (1.0 - s_v) / float(opponent["busy_s"]), 1.0 - s_o


def pair_records(data: Dataset, kind: str = "pair") -> list[PairRecord]:
    """Directed records of every pair run (both ways; a program beside itself once), medians
    over repeats; the other kinds give their first program as the victim only (``probe``: a
    program beside a bubble; ``pressure``: the reporter beside a program; ``calibration``:
    the reporter beside a bubble)."""
    rates = dedicated_rates(data)
    grouped: dict[tuple[str, str, str], list[tuple[float, float]]] = defaultdict(list)
    for run in data.runs:
        if run["kind"] != kind:
            continue
        (a, b), (ra, rb) = run["programs"], run["reports"]
        if a not in rates or b not in rates:
            continue
        ways = [(a, b, ra, rb)] if kind != "pair" else [(a, b, ra, rb), (b, a, rb, ra)]
        if a == b and kind == "pair":   # a program beside itself: one record, both readings averaged
            first, second = degradation(ra, rb, rates[a], rates[b]), degradation(rb, ra, rates[b], rates[a])
            grouped[(run["placement"], a, b)].append(((first[0] + second[0]) / 2, (first[1] + second[1]) / 2))
            continue
        for victim, opponent, rv, ro in ways:
            grouped[(run["placement"], victim, opponent)].append(degradation(rv, ro, rates[victim], rates[opponent]))
    return [PairRecord(placement, victim, opponent, statistics.median(e[0] for e in values),
                       statistics.median(e[1] for e in values), tuple(round(e[0], 4) for e in values))
            for (placement, victim, opponent), values in sorted(grouped.items())]


def noise_cv(data: Dataset, placement: str) -> float:
    """Median coefficient of variation of repeated run rates (each program of each pair run)."""
    rates: dict[tuple, list[float]] = defaultdict(list)
    for run in data.runs:
        if run["kind"] == "pair" and run["placement"] == placement:
            for slot, (name, report) in enumerate(zip(run["programs"], run["reports"])):
                rates[(tuple(run["programs"]), slot, name)].append(rate(report))
    cvs = [statistics.pstdev(v) / statistics.fmean(v) for v in rates.values() if len(v) >= 2]
    return statistics.median(cvs) if cvs else float("nan")


def repeats(data: Dataset, placement: str) -> int:
    """The fewest runs any pair has in a placement."""
    counts: dict[tuple[str, ...], int] = defaultdict(int)
    for run in data.runs:
        if run["kind"] == "pair" and run["placement"] == placement:
            counts[tuple(sorted(run["programs"]))] += 1
    return min(counts.values()) if counts else 0


SOFTWARE_SIGNALS = ("user_share", "system_share", "minor_faults_per_s", "major_faults_per_s",
                    "voluntary_switches_per_s", "involuntary_switches_per_s", "sched_wait_share",
                    "sched_timeslices_per_s", "perf_context_switches_per_s", "perf_cpu_migrations_per_s",
                    "perf_page_faults_per_s", "log2_peak_rss_mib", "pressure_cpu", "pressure_memory",
                    "pressure_io")
HARDWARE_SIGNALS = ("perf_hw_cycles_per_s", "perf_hw_instructions_per_s", "perf_hw_cache_misses_per_s",
                    "perf_hw_branch_misses_per_s")


def _software_signals(run: Mapping) -> dict[str, float]:
    report = run["reports"][0]
    elapsed = float(report["elapsed_s"])
    out = {
        "user_share": report.get("user_s", 0.0) / elapsed,
        "system_share": report.get("system_s", 0.0) / elapsed,
        "minor_faults_per_s": report.get("minor_faults", 0) / elapsed,
        "major_faults_per_s": report.get("major_faults", 0) / elapsed,
        "voluntary_switches_per_s": report.get("voluntary_switches", 0) / elapsed,
        "involuntary_switches_per_s": report.get("involuntary_switches", 0) / elapsed,
        "sched_wait_share": report.get("sched_wait_ns", 0) / 1e9 / elapsed,
        "sched_timeslices_per_s": report.get("sched_timeslices", 0) / elapsed,
        "log2_peak_rss_mib": math.log2(max(report.get("max_rss_kib", 1024), 1) / 1024),
    }
    for key in ("context_switches", "cpu_migrations", "page_faults", "hw_cycles", "hw_instructions",
                "hw_cache_misses", "hw_branch_misses"):
        if f"perf_{key}" in report:
            out[f"perf_{key}_per_s"] = report[f"perf_{key}"] / elapsed
    pressure = run.get("pressure_us_per_s") or {}
    for name in ("cpu", "memory", "io"):
        out[f"pressure_{name}"] = float(pressure.get(name, 0.0)) / 1e6
    return out


def program_features(data: Dataset) -> dict[str, dict[str, float]]:
    """Each program's (and bubble's) software signals alone: medians over its exclusive runs."""
    per_run: dict[str, list[dict[str, float]]] = defaultdict(list)
    for run in data.runs:
        if run["kind"] == "alone":
            per_run[run["programs"][0]].append(_software_signals(run))
    out: dict[str, dict[str, float]] = {}
    for name, rows in per_run.items():
        keys = set.intersection(*(set(r) for r in rows))
        out[name] = {k: statistics.median(r[k] for r in rows) for k in sorted(keys)}
    return out


def sensitivity_key(size_kib: int) -> str:
    return "sensitivity_" + bubble(size_kib).name.removeprefix("bubble-")


def bubble_probes(data: Dataset) -> dict[str, dict[str, dict[str, float]]]:
    """Bubble-Up probes per placement and program: ``sensitivity_<size>`` (the program's Ev
    beside the bubble of that size), ``reporter_slowdown`` (the reporter's Ev beside the
    program) and ``log2_bubble_mib`` (the bubble size that reporter slowdown equals, read off
    the reporter's calibration curve, made monotone)."""
    sizes = sorted(data.header["bubble_sizes_kib"])
    reporter = data.header["reporter"]["name"]
    probes = pair_records(data, kind="probe")
    pressures = pair_records(data, kind="pressure")
    calibration = pair_records(data, kind="calibration")
    programs = set(data.programs)
    out: dict[str, dict[str, dict[str, float]]] = {}
    for placement in data.placements:
        curve = {r.opponent: r.ev for r in calibration if r.placement == placement and r.victim == reporter}
        xs = [math.log2(s / 1024) for s in sizes if bubble(s).name in curve]
        ys = np.maximum.accumulate([curve[bubble(s).name] for s in sizes if bubble(s).name in curve]).tolist()
        table: dict[str, dict[str, float]] = defaultdict(dict)
        for record in probes:
            size_kib = next((s for s in sizes if bubble(s).name == record.opponent), None)
            if record.placement == placement and record.victim in programs and size_kib is not None:
                table[record.victim][sensitivity_key(size_kib)] = record.ev
        for record in pressures:
            if record.placement == placement and record.opponent in programs:
                table[record.opponent]["reporter_slowdown"] = record.ev
        for values in table.values():
            if "reporter_slowdown" in values and len(xs) >= 2:
                values["log2_bubble_mib"] = float(np.interp(values["reporter_slowdown"], ys, xs)) \
                    if ys[-1] > ys[0] else xs[0]
        out[placement] = dict(table)
    return out


def bubble_up_prediction(probes: Mapping[str, Mapping[str, float]], victim: str, opponent: str,
                         sizes_kib: Sequence[int]) -> float | None:
    """Bubble-Up's own prediction of Ev: the victim's sensitivity curve read at the bubble
    size the opponent equals (None when a probe is missing)."""
    v, o = probes.get(victim), probes.get(opponent)
    if not v or not o or "log2_bubble_mib" not in o:
        return None
    points = [(math.log2(s / 1024), v.get(sensitivity_key(s))) for s in sorted(sizes_kib)]
    points = [(x, y) for x, y in points if y is not None]
    if len(points) < 2:
        return None
    return float(np.interp(o["log2_bubble_mib"], [x for x, _ in points], [y for _, y in points]))
