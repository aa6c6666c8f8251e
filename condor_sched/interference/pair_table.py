"""The measured pairs as a table a simulator runs on, and the model's verdicts on unseen pairs.

* ``speed``: a program's work per wall-clock second beside another, over its own alone (units
  per span in the overlap window, medians over repeats, over the median alone). For a batch
  program (busy through the window) this is 1 - Ev of Eq. 1; for an interactive opponent Eq.
  1 divides by the opponent's shorter execution time, so 1 - Ev is not a speed there and the
  simulator takes the measured speed Ev was derived from, as the issue's "speed 1 - Ev during
  overlap" means for batch pairs.
* ``ill_matched``: the measured label of an unordered pair in a placement. Time-shared:
  E = Ev + Eo >= 1 (Section 4.3) with a batch program as the victim (the paper defines Eq.
  1-2 with a batch victim; two interactive programs: either direction). Separate cores:
  Ev > t either way.
* :func:`out_of_fold_verdicts`: for every pair, the verdict of a model fitted without that
  pair's measurements (the folds of ``evaluate.cross_validate``), so a simulator that consults
  the model is never scored on pairs the model was trained on.
"""
from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass

from condor_sched.interference.dataset import (
    Dataset, bubble_probes, pair_records, program_features,
)
from condor_sched.interference.model import ModelSettings, Verdict

#: A pair's label key: (placement, first program, second program), the programs sorted.
PairKey = tuple[str, str, str]


def _wall_rate(report: Mapping) -> float:
    return float(report["units"]) / float(report["span_s"])


@dataclass(frozen=True)
class PairTable:
    """What a dataset measured of each pair: speeds beside each other and the labels."""

    speeds: Mapping[tuple[str, str, str], float]
    labels: Mapping[PairKey, bool]
    interactive: frozenset[str]

    def speed(self, placement: str, victim: str, opponent: str) -> float | None:
        return self.speeds.get((placement, victim, opponent))

    def ill_matched(self, placement: str, a: str, b: str) -> bool | None:
        return self.labels.get((placement, *sorted((a, b))))


def pair_table(data: Dataset, thresholds: Mapping[str, float]) -> PairTable:
    """The speeds and labels of every measured pair (module docstring)."""
    alone: dict[str, list[float]] = defaultdict(list)
    for run in data.runs:
        if run["kind"] == "alone":
            alone[run["programs"][0]].append(_wall_rate(run["reports"][0]))
    dedicated = {name: statistics.median(v) for name, v in alone.items()}
    beside: dict[tuple[str, str, str], list[float]] = defaultdict(list)
    for run in data.runs:
        if run["kind"] != "pair":
            continue
        (a, b), (ra, rb) = run["programs"], run["reports"]
        if a in dedicated and b in dedicated:
            beside[(run["placement"], a, b)].append(_wall_rate(ra) / dedicated[a])
            beside[(run["placement"], b, a)].append(_wall_rate(rb) / dedicated[b])
    speeds = {key: statistics.median(v) for key, v in beside.items()}
    interactive = frozenset(p["name"] for p in data.header["suite"] if float(p.get("think_ms", 0)) > 0)
    by_pair: dict[PairKey, list[bool]] = defaultdict(list)
    for r in pair_records(data):
        key = (r.placement, *r.pair)
        if r.placement == "shared":
            batch_victim = r.victim not in interactive or {r.victim, r.opponent} <= interactive
            if batch_victim:
                by_pair[key].append(r.ev + r.eo >= 1.0)
        else:
            by_pair[key].append(r.ev > thresholds[r.placement])
    labels = {key: any(v) for key, v in by_pair.items()}
    return PairTable(speeds, labels, interactive)


def out_of_fold_verdicts(data: Dataset, thresholds: Mapping[str, float], prob_cutoff: float, folds: int,
                         seed: int = 0, features: str = "all") -> dict[PairKey, Verdict]:
    """Each measured pair's verdict per placement from the fold model that never saw it."""
    from condor_sched.interference.evaluate import bubble_up_terms, pair_splits, profiles_for
    from condor_sched.interference.model import fit_model

    records, signals, probes = pair_records(data), program_features(data), bubble_probes(data)
    out: dict[PairKey, Verdict] = {}
    for placement in data.placements:
        settings = ModelSettings(thresholds[placement], prob_cutoff, features=features, seed=seed)
        profiles = profiles_for(data, signals, probes.get(placement, {}))
        mine = [r for r in records if r.placement == placement and r.victim in profiles and r.opponent in profiles]
        terms = bubble_up_terms(data, probes.get(placement, {}))
        truth = [int(r.ev > settings.ev_threshold) for r in mine]
        for train, test in pair_splits(mine, truth, folds, seed):
            model = fit_model([mine[i] for i in train], profiles, placement, settings, terms)
            for pair in {mine[i].pair for i in test}:
                out[(placement, *pair)] = model.judge(*pair)
    return out
