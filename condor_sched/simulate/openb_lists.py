"""The GPU default on every task list the openb trace publishes (issue 31): runs, the paired
difference to FGD per list with its interval, and the section of docs/results.md.

The trace (alibaba/clusterdata, ``cluster-trace-gpu-v2023/csv``) publishes 24 task lists; six
of them are in ../shared/traces/openb, the lists our policies were tuned on
(``TUNING_LISTS``). The others are evaluation data only: nothing was chosen on them. A run is
the inflation protocol of :mod:`condor_sched.simulate.openb` (seed, batch size); a pair is one
list and seed under both policies, and its difference is ours minus FGD's unallocated GPU %
at 100% arrived (negative: we leave less unallocated). ``scripts/openb_every_list`` runs them
and writes the evaluation file; ``scripts/reproduce`` renders the committed one.
"""
from __future__ import annotations

import json
import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from scipy import stats

from condor_sched.resources import data_path
from condor_sched.simulate.openb_report import VARIANTS

#: The lists in ../shared/traces/openb, on which every GPU policy of ours was developed.
TUNING_LISTS = frozenset(VARIANTS)
#: The committed evaluation (``scripts/openb_every_list --out``).
EVALUATION = ("examples", "openb", "every-list.json")
CONFIDENCE = 0.95


def list_name(path: Path | str) -> str:
    """``openb_pod_list_default.csv`` -> ``default``."""
    name = Path(path).name
    if not (name.startswith("openb_pod_list_") and name.endswith(".csv")):
        raise ValueError(f"{name}: not an openb task list (openb_pod_list_<name>.csv)")
    return name[len("openb_pod_list_"):-len(".csv")]


@dataclass(frozen=True)
class Paired:
    """Ours against FGD on one list (or pooled): medians, the mean paired difference and its
    t-interval, and on how many seeds ours left less, as much, more."""

    name: str
    pairs: int
    ours_median: float
    fgd_median: float
    mean_difference: float
    low: float
    high: float
    wins: int
    ties: int
    losses: int

    @property
    def verdict(self) -> str:
        if self.high < 0:
            return "better"
        if self.low > 0:
            return "worse"
        return "no difference"


def paired(name: str, ours: Sequence[float], fgd: Sequence[float]) -> Paired:
    """The paired comparison of two equally long sequences of runs (same lists and seeds)."""
    if len(ours) != len(fgd) or not ours:
        raise ValueError(f"{name}: {len(ours)} runs of ours against {len(fgd)} of fgd")
    differences = [a - b for a, b in zip(ours, fgd)]
    mean = statistics.fmean(differences)
    if len(differences) < 2:
        half = math.inf   # one pair: no interval
    else:
        half = stats.t.ppf((1 + CONFIDENCE) / 2, len(differences) - 1) * stats.sem(differences)
    return Paired(name, len(differences), statistics.median(ours), statistics.median(fgd), mean, mean - half,
                  mean + half, sum(d < 0 for d in differences), sum(d == 0 for d in differences),
                  sum(d > 0 for d in differences))


def summarise(runs: Iterable[Mapping[str, Any]], ours: str, against: str = "fgd") -> list[Paired]:
    """Per list (in the order first seen), then the evaluation lists pooled, then all pooled.
    ``runs``: ``{"list", "policy", "seed", "unallocated"}``."""
    by: dict[tuple[str, str], dict[int, float]] = {}
    for run in runs:
        by.setdefault((run["list"], run["policy"]), {})[int(run["seed"])] = float(run["unallocated"])
    lists = list(dict.fromkeys(name for name, _ in by))
    rows, pooled = [], {"evaluation": ([], []), "all": ([], [])}
    for name in lists:
        mine, theirs = by.get((name, ours), {}), by.get((name, against), {})
        seeds = sorted(set(mine) & set(theirs))
        if not seeds:
            raise ValueError(f"list {name}: no seed run under both {ours} and {against}")
        a, b = [mine[s] for s in seeds], [theirs[s] for s in seeds]
        rows.append(paired(name, a, b))
        for group in ("all", "evaluation") if name not in TUNING_LISTS else ("all",):
            pooled[group][0].extend(a)
            pooled[group][1].extend(b)
    for group, label in (("evaluation", "evaluation lists pooled"), ("all", "every list pooled")):
        if pooled[group][0]:
            rows.append(paired(label, *pooled[group]))
    return rows


def load_evaluation(path: Path | None = None) -> dict[str, Any]:
    """The committed evaluation file; ValueError naming what is missing."""
    path = path or data_path(*EVALUATION)
    data = json.loads(Path(path).read_text())
    for key in ("ours", "against", "batch", "seeds", "source", "runs"):
        if key not in data:
            raise ValueError(f"{path}: no {key!r}")
    return data


def section(data: Mapping[str, Any]) -> list[str]:
    """The results.md section of an evaluation file."""
    rows = summarise(data["runs"], data["ours"], data["against"])
    per_list = [r for r in rows if "pooled" not in r.name]
    at_or_below = sum(r.ours_median <= r.fgd_median for r in per_list)
    seeds = data["seeds"]
    mode = "online (one task per cycle)" if data["batch"] == 1 else f"in {data['batch']}-task batches"
    lines = ["", f"### Every published list, {mode} (issue 31)", "",
             f"`scripts/openb_every_list` on the {len(per_list)} task lists of {data['source']}, with the "
             f"node list above, seeds {seeds[0]}-{seeds[-1]}, `{data['ours']}` against `{data['against']}`. "
             f"The six lists marked *tuning* are those of ../shared/traces/openb, on which our policies were "
             "developed; the others were never looked at before this evaluation. Difference: ours minus FGD's "
             f"unallocated GPU % on the same seed, mean with its {CONFIDENCE:.0%} t-interval; wins / ties / losses "
             "count seeds.", "",
             f"| list | `{data['against']}` median | `{data['ours']}` median | mean difference | "
             f"{CONFIDENCE:.0%} interval | wins / ties / losses | |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        tag = "tuning" if r.name in TUNING_LISTS else ("" if "pooled" in r.name else "evaluation")
        name = f"**{r.name}**" if "pooled" in r.name else f"{r.name} ({tag})"
        lines.append(f"| {name} | {r.fgd_median:.2f} | {r.ours_median:.2f} | {r.mean_difference:+.3f} | "
                     f"[{r.low:+.3f}, {r.high:+.3f}] | {r.wins} / {r.ties} / {r.losses} | {r.verdict} |")
    pooled = rows[-1]
    above = [f"{r.name} ({r.ours_median - r.fgd_median:+.3f})" for r in per_list if r.ours_median > r.fgd_median]
    worse = [r.name for r in per_list if r.verdict == "worse"]
    lines += ["", f"Median at or below FGD's on {at_or_below} of {len(per_list)} lists (goal: every list): "
              f"{'met' if not above else 'not met, above on ' + ', '.join(above)}; the paired difference's "
              f"interval lies above zero on {', '.join(worse) if worse else 'no list'}. Pooled over every list, "
              f"{pooled.mean_difference:+.3f} points, interval [{pooled.low:+.3f}, {pooled.high:+.3f}] (goal: below "
              f"zero): {'met' if pooled.high < 0 else 'not met'}."]
    return lines
