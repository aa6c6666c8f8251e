"""Two measurements of the same suite side by side: how far one's labels and model predict the other's.

The second measurement is another run of ``interference measure``: on the same node type again
(another hour or day: a test-retest, the ceiling the noise sets, measured) or on another node
type (whether what was learned on one transfers). Per placement, over the directed records both
hold:

* ``labels``: the first measurement's label [Ev > t] as a predictor of the second's, and the
  correlation of their Ev. No model of the labels one measurement gives can expect to score
  much better against the other: what the two disagree on is not in the programs' profiles.
* ``model``: the model fitted on the first dataset's training pairs (folds grouped by pair, as
  ``evaluate.cross_validate``) judging the held-out pairs, scored against the *second* dataset's
  labels: unseen pairs and an unseen measurement, so nothing it is scored on was tuned on;
  ``model_reverse`` the other way round.
* ``pooled``: the model cross-validated on both measurements at once: each record's runs from
  both (twice the repeats), its label the median of them all, each program's profile the mean of
  its two.
"""
from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from condor_sched.interference.dataset import (
    Dataset, PairRecord, bubble_probes, pair_records, program_features,
)
from condor_sched.interference.evaluate import (
    balanced_accuracy, bubble_up_terms, cross_validate, false_negative_rate, finite_report, pair_splits,
    predicted_labels, profiles_for,
)
from condor_sched.interference.model import ModelSettings, fit_model

Key = tuple[str, str]


def _check_same_suite(first: Dataset, second: Dataset) -> None:
    if first.programs != second.programs:
        only = sorted(set(first.programs) ^ set(second.programs))
        raise ValueError(f"{first.path} and {second.path} measure different suites"
                         + (f" ({', '.join(only)} in one only)" if only else " (another order)"))
    if sorted(first.header["bubble_sizes_kib"]) != sorted(second.header["bubble_sizes_kib"]):
        raise ValueError(f"{first.path} and {second.path} use different bubble sizes")


def _by_key(records: Sequence[PairRecord], placement: str) -> dict[Key, PairRecord]:
    return {(r.victim, r.opponent): r for r in records if r.placement == placement}


def _scores(truth: Sequence[int], predicted: Sequence[int]) -> dict[str, float]:
    return {"accuracy": balanced_accuracy(truth, predicted),
            "false_negative_rate": false_negative_rate(truth, predicted),
            "agreement": float(np.mean(np.asarray(truth) == np.asarray(predicted))) if len(truth) else float("nan")}


@dataclass(frozen=True)
class Measurement:
    """One dataset and what every comparison reads of it, derived once."""

    data: Dataset
    records: list[PairRecord]
    signals: dict[str, dict[str, float]]
    probes: dict[str, dict[str, dict[str, float]]]

    @classmethod
    def of(cls, data: Dataset) -> Measurement:
        return cls(data, pair_records(data), program_features(data), bubble_probes(data))


def held_out_against(train: Measurement, test: Measurement, placement: str, settings: ModelSettings,
                     folds: int) -> dict[str, float]:
    """The model fitted on ``train``'s training pairs, each fold's held-out pairs judged and
    scored against ``test``'s labels of them."""
    probes = train.probes.get(placement, {})
    profiles, terms = profiles_for(train.data, train.signals, probes), bubble_up_terms(train.data, probes)
    mine, theirs = _by_key(train.records, placement), _by_key(test.records, placement)
    keys = sorted(k for k in mine if k in theirs and k[0] in profiles and k[1] in profiles)
    records = [mine[k] for k in keys]
    truth = [int(r.ev > settings.ev_threshold) for r in records]
    truth_test, predicted = [], []
    for train_index, test_index in pair_splits(records, truth, folds, settings.seed):
        model = fit_model([records[i] for i in train_index], profiles, placement, settings, terms)
        held = [records[i] for i in test_index]
        predicted += predicted_labels(model, held)
        truth_test += [int(theirs[(r.victim, r.opponent)].ev > settings.ev_threshold) for r in held]
    return _scores(truth_test, predicted)


def _mean_profiles(first: Mapping[str, Mapping[str, float]],
                   second: Mapping[str, Mapping[str, float]]) -> dict[str, dict[str, float]]:
    return {name: {k: (first[name][k] + second[name][k]) / 2 for k in first[name] if k in second[name]}
            for name in first if name in second}


def pooled_records(first: Sequence[PairRecord], second: Sequence[PairRecord]) -> list[PairRecord]:
    """The records both measurements hold, each with the runs of both: Ev the median of them all,
    Eo the mean of the two medians (a record keeps Eo's median only)."""
    theirs = {(r.placement, r.victim, r.opponent): r for r in second}
    out = []
    for r in first:
        other = theirs.get((r.placement, r.victim, r.opponent))
        if other is not None:
            runs = r.ev_runs + other.ev_runs
            out.append(PairRecord(r.placement, r.victim, r.opponent, statistics.median(runs), (r.eo + other.eo) / 2,
                                  runs))
    return out


def pooled(first: Measurement, second: Measurement, placement: str, settings: ModelSettings,
           folds: int) -> dict[str, float]:
    """``cross_validate`` on both measurements at once (module docstring)."""
    probes = _mean_profiles(first.probes.get(placement, {}), second.probes.get(placement, {}))
    profiles = profiles_for(first.data, _mean_profiles(first.signals, second.signals), probes)
    terms = bubble_up_terms(first.data, probes)
    records = [r for r in pooled_records(first.records, second.records) if r.placement == placement]
    result = cross_validate(records, profiles, placement, settings, folds, terms)
    truth = [int(r.ev > settings.ev_threshold) for r in records]
    return {"accuracy": result["accuracy"], "false_negative_rate": result["false_negative_rate"],
            "positive_record_share": float(np.mean(truth)) if truth else float("nan"),
            "repeats": min((len(r.ev_runs) for r in records), default=0)}


def compare_measurements(first: Dataset, second: Dataset, thresholds: Mapping[str, float], prob_cutoff: float,
                         folds: int, features: str = "all", seed: int = 0) -> dict[str, dict]:
    """Per placement both datasets measured: ``labels``, ``model`` (first to second), ``model_reverse``
    (second to first) and ``pooled`` (module docstring)."""
    _check_same_suite(first, second)
    one, other = Measurement.of(first), Measurement.of(second)
    out: dict[str, dict] = {}
    for placement in (p for p in first.placements if p in second.placements):
        t = thresholds[placement]
        settings = ModelSettings(ev_threshold=t, prob_cutoff=prob_cutoff, features=features, seed=seed)
        a, b = _by_key(one.records, placement), _by_key(other.records, placement)
        keys = sorted(set(a) & set(b))
        out[placement] = {
            "records": len(keys),
            "labels": _scores([int(b[k].ev > t) for k in keys], [int(a[k].ev > t) for k in keys]),
            "ev_correlation": float(np.corrcoef([a[k].ev for k in keys], [b[k].ev for k in keys])[0, 1])
            if len(keys) >= 2 else float("nan"),
            "model": held_out_against(one, other, placement, settings, folds),
            "model_reverse": held_out_against(other, one, placement, settings, folds),
            "pooled": pooled(one, other, placement, settings, folds),
        }
    return finite_report(out)
