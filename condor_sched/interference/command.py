"""The ``condor-sched interference`` commands: measure a dataset, evaluate the model on it."""
from __future__ import annotations

import json
import os
from pathlib import Path

import click

from condor_sched.options import SEED, BoundedFloat, bounded_int
from condor_sched.interference.measure import MeasureError, Timing, measure, write_dataset
from condor_sched.interference.suite import (
    BUBBLE_SIZES_KIB, FILLER, REPORTER, SMOKE_BUBBLE_SIZES_KIB, SMOKE_SUITE, SUITE, BuildError, build_kernels,
)


def _cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "condor-sched" / "kernels"


@click.group()
def interference() -> None:
    """Measure how programs slow each other, and predict which pairs must not share."""


@interference.command("measure")
@click.option("--out", "out", type=click.Path(dir_okay=False, path_type=Path), required=True,
              help="Dataset file to write (JSON; rewritten as the runs go, so an interrupted run keeps what it made).")
@click.option("--repeats", type=bounded_int(1, 50), default=3, show_default=True,
              help="Runs of each pair, probe and calibration, in each placement.")
@click.option("--alone-repeats", type=bounded_int(1, 50), default=5, show_default=True,
              help="Runs of each program alone (its dedicated speed is their median).")
@click.option("--window", "window_s", type=BoundedFloat(0.05, 60.0), default=Timing.window_s, show_default=True,
              help="Seconds measured in each run, after the warm-up.")
@click.option("--warmup", "warmup_s", type=BoundedFloat(0.0, 10.0), default=Timing.warmup_s, show_default=True,
              help="Seconds each run runs before its window opens.")
@click.option("--seed", type=SEED, default=0, show_default=True, help="Seed of the run order.")
@click.option("--smoke", is_flag=True, help="The two-kernel suite and two bubble sizes (a check that it all works).")
@click.option("--build-dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Where the kernels are compiled (default: ~/.cache/condor-sched/kernels).")
def measure_command(out: Path, repeats: int, alone_repeats: int, window_s: float, warmup_s: float, seed: int,
                    smoke: bool, build_dir: Path | None) -> None:
    """Run the suite alone, in pairs and beside Bubble-Up bubbles, on separate vCPUs and
    time-sharing one vCPU, and write the dataset. The full suite takes about half an hour on
    two vCPUs: run it on an otherwise idle node."""
    suite, bubbles = (SMOKE_SUITE, SMOKE_BUBBLE_SIZES_KIB) if smoke else (SUITE, BUBBLE_SIZES_KIB)
    if not out.parent.is_dir():
        raise click.BadParameter(f"{out.parent} is not a directory", param_hint="--out")
    try:
        binary = build_kernels(build_dir or _cache_dir())
        dataset = measure(binary, suite, bubbles, REPORTER, FILLER, repeats=repeats, alone_repeats=alone_repeats,
                          timing=Timing(warmup_s=warmup_s, window_s=window_s), seed=seed,
                          checkpoint=lambda d: write_dataset(d, out))
        write_dataset(dataset, out)
    except (BuildError, MeasureError) as e:
        raise click.ClickException(str(e)) from None
    except OSError as e:
        raise click.ClickException(f"{out}: cannot write the dataset: {e}") from None
    click.echo(f"{len(dataset['runs'])} runs written to {out}")


def _thresholds(values: tuple[str, ...]) -> dict[str, float]:
    """``--ev-threshold 0.2`` (every placement) or ``--ev-threshold shared=0.55`` (one), repeatable."""
    from condor_sched.interference.model import DEFAULT_EV_THRESHOLD

    out = dict(DEFAULT_EV_THRESHOLD)
    for value in values:
        placement, _, number = value.rpartition("=")
        try:
            t = float(number)
        except ValueError:
            raise click.BadParameter(f"{value!r}: a number, or PLACEMENT=NUMBER", param_hint="--ev-threshold") from None
        if not 0.0 <= t <= 10.0:
            raise click.BadParameter(f"{value!r}: t must lie in [0, 10]", param_hint="--ev-threshold")
        if placement and placement not in out:
            raise click.BadParameter(f"{value!r}: placement must be one of {sorted(out)}", param_hint="--ev-threshold")
        for name in ([placement] if placement else list(out)):
            out[name] = t
    return out


def _percent(x: float | None) -> str:
    return "n/a" if x is None else f"{100 * x:.1f}%"


def _score(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.3f}"


@interference.command("evaluate")
@click.argument("dataset", type=click.Path(dir_okay=False, path_type=Path), required=False)
@click.option("--folds", type=bounded_int(2, 20), default=3, show_default=True, help="Cross-validation folds.")
@click.option("--ev-threshold", "ev_thresholds", multiple=True, metavar="[PLACEMENT=]T",
              help="Threshold t of Ev (default: separate=0.1; shared=0.55, the paper's 0.5 plus a 10% bound).")
@click.option("--prob-cutoff", type=BoundedFloat(0.0, 1.0), default=0.5, show_default=True,
              help="Pr(Ev > t) above which a pair is ill-matched (0.3: conservative).")
@click.option("--features", type=click.Choice(["software", "probes", "all"]), default="all", show_default=True,
              help="Software signals only, Bubble-Up probes only, or both.")
@click.option("--seed", type=SEED, default=0, show_default=True, help="Seed of the folds and of k-means.")
@click.option("--against", "against_path", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Another measurement of the same suite (the same node type again, or another): score this "
                   "one's labels and the model fitted on it against that one's, and cross-validate on both pooled.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def evaluate_command(dataset: Path | None, folds: int, ev_thresholds: tuple[str, ...], prob_cutoff: float, features: str,
                     seed: int, against_path: Path | None, as_json: bool) -> None:
    """Cross-validate the interference model on a measured dataset (default: the one measured
    on our nodes, shipped with the package), beside its baselines."""
    from condor_sched.interference.dataset import DatasetError, load_dataset
    from condor_sched.interference.evaluate import evaluate_dataset
    from condor_sched.interference.report import default_dataset
    from condor_sched.interference.compare import compare_measurements

    thresholds = _thresholds(ev_thresholds)
    try:
        data = load_dataset(dataset or default_dataset())
        second = load_dataset(against_path) if against_path else None
    except DatasetError as e:
        raise click.ClickException(str(e)) from None
    try:
        result = evaluate_dataset(data, thresholds, prob_cutoff, folds, features=features, seed=seed)
    except ValueError as e:   # e.g. more folds than the dataset has pairs of a class
        raise click.ClickException(f"{data.path}: cannot cross-validate with {folds} folds: {e}") from None
    if second is not None:
        try:
            result["against"] = compare_measurements(data, second, thresholds, prob_cutoff, folds, features, seed)
            result["against_dataset"], result["against_host"] = second.path, second.header.get("host")
        except ValueError as e:   # another suite, or too few pairs of a class for the folds
            raise click.ClickException(f"--against: {e}") from None
    if as_json:
        click.echo(json.dumps(result, indent=1, sort_keys=True))
        return
    click.echo(f"{data.path}: {result['programs']} programs, {folds}-fold cross-validation, cut-off {prob_cutoff:g}, "
               f"features: {features}")
    if second is not None:
        click.echo(f"measured on: {_host(data.header)}; against: {_host(second.header)}")
    for placement in result["placements"]:
        r = result["by_placement"][placement]
        b = r["baselines"]
        click.echo(f"\n{placement} (t = {r['ev_threshold']:g}): {r['pairs']} pairs x {r['repeats']} repeats, "
                   f"noise cv {_percent(r['noise_cv'])}, ill-matched pairs {_percent(r['positive_share'])}")
        noise = r["label_noise"]
        if noise:
            click.echo(f"  repeats agree on {_percent(noise['repeat_agreement'])} of labels; one run's label scores "
                       f"{_score(noise['single_run_accuracy'])} against the median's")
        click.echo(f"  balanced accuracy {_score(r['accuracy'])} (folds {r['fold_accuracy']}), false negatives "
                   f"{_percent(r['false_negative_rate'])}; unseen programs {_score(r['unseen_programs_accuracy'])}")
        click.echo(f"  baselines: majority {_score(b['majority_class'])}, placement only "
                   f"{_score(b['placement_only'])}, Bubble-Up at t {_score(b['bubble_up'])}")
        w = r["within_threshold"]
        if w:
            click.echo(f"  within threshold: Ev {_percent(w['ev'])}, Eo {_percent(w['eo'])}, E < 1 {_percent(w['e'])}")
        if r["dangerous"]:
            click.echo(f"  dangerous: {', '.join(r['dangerous'])}")
        click.echo("  strongest features: " + ", ".join(f"{n} {w:+.2f}" for n, w in r["top_features"][:5]))
        if placement in result.get("against", {}):
            _echo_against(result["against"][placement], result["against_dataset"])


def _host(header: dict) -> str:
    host = header.get("host") or {}
    return f"{host.get('cpu_model', '?')}, {host.get('cpus', '?')} CPUs, {header.get('created', '?')}"


def _echo_against(r: dict, second: str) -> None:
    """The lines of ``--against`` for one placement."""
    labels, model, reverse, pooled = r["labels"], r["model"], r["model_reverse"], r["pooled"]
    click.echo(f"  against {second} ({r['records']} records, Ev correlation {_score(r['ev_correlation'])}): "
               f"its labels score {_score(labels['accuracy'])} ({_percent(labels['false_negative_rate'])} false "
               "negatives) against the second's")
    click.echo(f"    model fitted here, unseen pairs scored on the second: {_score(model['accuracy'])} "
               f"({_percent(model['false_negative_rate'])}); the other way {_score(reverse['accuracy'])} "
               f"({_percent(reverse['false_negative_rate'])})")
    click.echo(f"    both pooled ({pooled['repeats']} runs per record): {_score(pooled['accuracy'])} "
               f"({_percent(pooled['false_negative_rate'])} false negatives)")
