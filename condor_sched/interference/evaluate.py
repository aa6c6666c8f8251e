"""How well the model predicts a measured dataset: k-fold cross-validation and baselines.

Folds are stratified by label and grouped by unordered pair, so both directions of a pair are
tested together and never seen in training (the paper's Table 8 uses 3 folds over records).
Beside the model: a majority-class predictor, a placement-only predictor (the majority of the
training records of the placement), Bubble-Up's own prediction thresholded at t (no training),
and the model on programs it never saw (folds grouped by program). Balanced accuracy is the
mean of the true-positive and true-negative rates; a false negative is an ill-matched record
(Ev > t) predicted safe.
"""
from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence

import numpy as np

from condor_sched.interference.dataset import (
    Dataset, PairRecord, alone_cv, bubble_probes, bubble_up_prediction, noise_cv, pair_records, program_features, repeats,
)
from condor_sched.interference.model import InterferenceModel, ModelSettings, coefficients, fit_model


def balanced_accuracy(truth: Sequence[int], predicted: Sequence[int]) -> float:
    y, p = np.asarray(truth, dtype=bool), np.asarray(predicted, dtype=bool)
    rates = [np.mean(p[y]) if y.any() else None, np.mean(~p[~y]) if (~y).any() else None]
    known = [r for r in rates if r is not None]
    return float(np.mean(known)) if known else float("nan")


def false_negative_rate(truth: Sequence[int], predicted: Sequence[int]) -> float:
    y, p = np.asarray(truth, dtype=bool), np.asarray(predicted, dtype=bool)
    return float(np.mean(~p[y])) if y.any() else 0.0


def profiles_for(data: Dataset, signals: Mapping[str, Mapping[str, float]],
                 probes: Mapping[str, Mapping[str, float]]) -> dict[str, dict[str, float]]:
    """Each suite program's profile for a placement: its software signals and its Bubble-Up
    probes there (``program_features`` and one placement of ``bubble_probes``)."""
    return {name: {**signals[name], **probes.get(name, {})} for name in data.programs if name in signals}


def bubble_up_terms(data: Dataset, probes: Mapping[str, Mapping[str, float]]) -> dict[tuple[str, str], float]:
    """Bubble-Up's prediction of every ordered pair from one placement's probes."""
    sizes = data.header["bubble_sizes_kib"]
    out = {}
    for victim in data.programs:
        for opponent in data.programs:
            value = bubble_up_prediction(probes, victim, opponent, sizes)
            if value is not None:
                out[(victim, opponent)] = value
    return out


def predicted_labels(model: InterferenceModel, records: Sequence[PairRecord]) -> list[int]:
    """The model's label of each record: its probability past the cut-off."""
    cutoff = model.settings.prob_cutoff
    return [int(model.probability(r.victim, r.opponent) > cutoff) for r in records]


def _pair_level(records: Sequence[PairRecord], truth: Sequence[int], predicted: Sequence[int]) -> tuple[list, list]:
    """Pair verdicts: ill-matched when either direction is (truth), or predicted so."""
    by_pair: dict[tuple[str, str], list[tuple[int, int]]] = {}
    for record, y, p in zip(records, truth, predicted):
        by_pair.setdefault(record.pair, []).append((y, p))
    return ([int(any(y for y, _ in v)) for v in by_pair.values()],
            [int(any(p for _, p in v)) for v in by_pair.values()])


def pair_splits(records: Sequence[PairRecord], truth: Sequence[int], folds: int, seed: int) -> list:
    """(train, test) index lists, stratified by label and grouped by unordered pair (both
    directions of a pair fall in one fold)."""
    from sklearn.model_selection import StratifiedGroupKFold

    pairs = {pair: i for i, pair in enumerate(sorted({r.pair for r in records}))}
    groups = [pairs[r.pair] for r in records]
    return list(StratifiedGroupKFold(n_splits=folds, shuffle=True, random_state=seed).split(
        np.zeros(len(records)), truth, groups))


def cross_validate(records: Sequence[PairRecord], profiles: Mapping[str, Mapping[str, float]], placement: str,
                   settings: ModelSettings, folds: int, bubble_up: Mapping[tuple[str, str], float],
                   group_by: str = "pair") -> dict:
    """Out-of-fold predictions of the model (``group_by`` pair: unseen pairs; program: unseen programs)."""
    records = [r for r in records if r.victim in profiles and r.opponent in profiles]
    truth = [int(r.ev > settings.ev_threshold) for r in records]
    predicted = [0] * len(records)
    tested = [False] * len(records)
    fold_accuracy = []
    if group_by == "pair":
        splits = pair_splits(records, truth, folds, settings.seed)
    else:
        programs = sorted(profiles)
        held = [set(programs[i::folds]) for i in range(folds)]
        splits = []
        for out in held:
            train = [i for i, r in enumerate(records) if r.victim not in out and r.opponent not in out]
            test = [i for i, r in enumerate(records) if r.victim in out or r.opponent in out]
            splits.append((train, test))
    for train, test in splits:
        if len(test) == 0 or len(train) == 0:   # more folds than programs: nothing to hold out
            continue
        train_records = [records[i] for i in train]
        test_records = [records[i] for i in test]
        model = fit_model(train_records, profiles, placement, settings, bubble_up)
        fold_predicted = predicted_labels(model, test_records)
        for i, p in zip(test, fold_predicted):
            predicted[i] = p
            tested[i] = True
        fold_accuracy.append(balanced_accuracy([truth[i] for i in test], fold_predicted))
    y = [t for t, seen in zip(truth, tested) if seen]
    p = [q for q, seen in zip(predicted, tested) if seen]
    pair_truth, pair_predicted = _pair_level([r for r, seen in zip(records, tested) if seen], y, p)
    return {"accuracy": balanced_accuracy(y, p), "false_negative_rate": false_negative_rate(y, p),
            "fold_accuracy": [round(a, 4) for a in fold_accuracy],
            "pair_accuracy": balanced_accuracy(pair_truth, pair_predicted),
            "pair_false_negative_rate": false_negative_rate(pair_truth, pair_predicted)}


def _baselines(all_records: Sequence[PairRecord], placement: str, thresholds: Mapping[str, float],
               bubble_up: Mapping[tuple[str, str], float], folds: int, seed: int) -> dict[str, float]:
    """Majority class, placement only (both fit per fold), and Bubble-Up's prediction at t."""
    from sklearn.model_selection import StratifiedKFold

    mine = [r for r in all_records if r.placement == placement]
    truth = np.array([int(r.ev > thresholds[placement]) for r in mine])
    others = np.array([int(r.ev > thresholds[r.placement]) for r in all_records if r.placement != placement])
    majority, by_placement = np.zeros_like(truth), np.zeros_like(truth)
    splits = min(folds, int(truth.sum()), int(len(truth) - truth.sum()))
    if splits < 2:   # one class only: every constant predictor scores what it scores
        return {"majority_class": balanced_accuracy(truth, majority), "placement_only": balanced_accuracy(truth, majority),
                "bubble_up": float("nan"), "bubble_up_false_negative_rate": float("nan")}
    for train, test in StratifiedKFold(n_splits=splits, shuffle=True, random_state=seed).split(mine, truth):
        majority[test] = int(np.mean(np.concatenate([truth[train], others])) >= 0.5)
        by_placement[test] = int(np.mean(truth[train]) >= 0.5)
    bubble = np.array([int(bubble_up.get((r.victim, r.opponent), 0.0) > thresholds[placement]) for r in mine])
    return {"majority_class": balanced_accuracy(truth, majority), "placement_only": balanced_accuracy(truth, by_placement),
            "bubble_up": balanced_accuracy(truth, bubble), "bubble_up_false_negative_rate": false_negative_rate(truth, bubble)}


def label_noise(records: Sequence[PairRecord], threshold: float) -> dict[str, float]:
    """How far the noise lets any predictor go: the share of records whose repeated runs all
    agree on the label, and the balanced accuracy of one run's label against the median's."""
    agree, truth, single = [], [], []
    for record in records:
        labels = [e > threshold for e in record.ev_runs]
        if len(labels) < 2:
            continue
        agree.append(len(set(labels)) == 1)
        truth += [int(record.ev > threshold)] * len(labels)
        single += [int(x) for x in labels]
    if not agree:
        return {}
    return {"repeat_agreement": float(np.mean(agree)), "single_run_accuracy": balanced_accuracy(truth, single)}


def within_threshold_shares(records: Sequence[PairRecord], threshold: float) -> dict[str, float]:
    """Tables 4-5: shares of records with Ev <= t, Eo <= t and E = Ev + Eo < 1."""
    if not records:
        return {}
    return {"ev": float(np.mean([r.ev <= threshold for r in records])),
            "eo": float(np.mean([r.eo <= threshold for r in records])),
            "e": float(np.mean([r.ev + r.eo < 1.0 for r in records]))}


def evaluate_dataset(data: Dataset, thresholds: Mapping[str, float], prob_cutoff: float, folds: int,
                     features: str = "all", seed: int = 0) -> dict:
    """Everything ``interference evaluate`` reports, per placement."""
    records, signals, all_probes = pair_records(data), program_features(data), bubble_probes(data)
    out: dict = {"dataset": data.path, "host": data.header.get("host"), "created": data.header.get("created"),
                 "placements": list(data.placements), "programs": len(data.programs),
                 "folds": folds, "prob_cutoff": prob_cutoff, "features": features,
                 "alone_cv": {name: round(cv, 4) for name, cv in alone_cv(data).items()}}
    per: dict[str, dict] = {}
    for placement in data.placements:
        mine = [r for r in records if r.placement == placement]
        settings = ModelSettings(ev_threshold=thresholds[placement], prob_cutoff=prob_cutoff, features=features,
                                 seed=seed)
        probes = all_probes.get(placement, {})
        profiles, terms = profiles_for(data, signals, probes), bubble_up_terms(data, probes)
        pair_truth, _ = _pair_level(mine, [int(r.ev > settings.ev_threshold) for r in mine], [0] * len(mine))
        seen_pairs = cross_validate(mine, profiles, placement, settings, folds, terms)
        seen_programs = cross_validate(mine, profiles, placement, settings, folds, terms, group_by="program")
        full = fit_model(mine, profiles, placement, settings, terms)
        per[placement] = {
            "ev_threshold": settings.ev_threshold, "pairs": len(pair_truth), "records": len(mine),
            "repeats": repeats(data, placement), "noise_cv": noise_cv(data, placement),
            "positive_share": float(np.mean(pair_truth)) if pair_truth else 0.0,
            "positive_record_share": float(np.mean([r.ev > settings.ev_threshold for r in mine])) if mine else 0.0,
            **seen_pairs,
            "unseen_programs_accuracy": seen_programs["accuracy"],
            "unseen_programs_false_negative_rate": seen_programs["false_negative_rate"],
            "baselines": _baselines(records, placement, thresholds, terms, folds, seed),
            "within_threshold": within_threshold_shares(mine, settings.ev_threshold),
            "label_noise": label_noise(mine, settings.ev_threshold),
            "median_ev": statistics.median(r.ev for r in mine) if mine else float("nan"),
            "dangerous": sorted(full.dangerous),
            "top_features": [[name, round(weight, 3)] for name, weight in coefficients(full)[:8]],
        }
    for key in ("pairs", "repeats", "noise_cv", "accuracy", "false_negative_rate", "positive_share"):
        out[key] = {placement: per[placement][key] for placement in data.placements}
    out["by_placement"] = per
    return finite_report(out)


def finite_report(value):
    """The report with every NaN (a measure a tiny dataset leaves undefined) as null, so the
    JSON is JSON."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: finite_report(v) for k, v in value.items()}
    if isinstance(value, list):
        return [finite_report(v) for v in value]
    return value
