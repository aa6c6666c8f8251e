"""The Insight Engine of paper 003 (Section III-A, Algorithm 1): what a node's primary jobs use,
estimated from its stream of utilisation samples with a Bag of Little Bootstraps (BLB, the
paper's [46]: Kleiner et al., JRSS-B 2014), as a mean ``Q`` and a width ``xi``. A spare-capacity
job's soft limit is ``Q``, its hard limit ``Q + xi`` (Algorithm 1's caption). Pure, standard
library: the node agent runs it every interval.

BLB, as Algorithm 1 runs it: draw ``s`` disjoint subsets of ``b`` samples (``b < n``) from the
window's ``n`` samples; for each subset, ``r`` times resample ``n`` points from it (multinomial
counts over its ``b`` points) and compute the estimator on that empirical distribution; average
each subset's results, then the subsets'.

Which width. Algorithm 1's ``xi`` is the bootstrap's empirical confidence of ``Q``: how well the
*mean* is known. It shrinks as 1/sqrt(n), so over a day of samples it bounds nothing the
primaries do next, and a hard limit of ``Q + xi`` would hand spare jobs the primaries' busy
phases. Fig. 3 reads ``xi`` as "the standard deviation added to the mean utilization ... the
expected range for the node utilization", assuming a Gaussian (Section III-A-1). We keep Fig. 3's
reading, a range the next samples fall in, and drop the Gaussian, which HPC use breaks (busy
and idle phases make it bimodal: mean + one standard deviation then lies between the modes and
covers only the idle share). Each little bootstrap's estimator is the empirical
``confidence``-quantile, so ``Q + xi`` is the BLB estimate of the level the primaries stay at or
under for a ``confidence`` share (0.8: the paper's 80%) of the window. Algorithm 1's width of the
mean is kept as ``mean_width`` (the half-width of its ``confidence`` interval).

Algorithm 1 adds resamples until that width is under a threshold; Section III-A-3 allows a time
bound instead ("bounded by either confidence or time limits"), which we take: ``s x r``
resamples, always. The settings the paper leaves open, and why:

- window ``W`` = 1800 s: the paper's "retention time" (Section III-A) against stale behaviour;
  half an hour holds several of an HPC job's compute/communication phases, and a rise in use is
  answered within one interval by the agent anyway, not by the window;
- ``b = ceil(n ** 0.7)``: Kleiner et al.'s recommended exponent range is 0.6 to 0.9; 0.7 keeps
  a subset's quantile meaningful (62 points of 360, 163 of a day's 1,440);
- ``s`` = 5 subsets and ``r`` = 30 resamples each: Kleiner et al. report a few subsets and a few
  tens of resamples converge for means and quantiles; 150 resamples of 1,440 points fit the
  issue's 50 ms per node per interval in pure Python (scripts/bench_insight).
"""
from __future__ import annotations

import math
import random
from collections import deque
from dataclasses import dataclass
from statistics import NormalDist
from typing import Deque, Optional, Sequence, Tuple

#: Fewer samples than this give no estimate (the agent then admits no spare-capacity job).
MIN_SAMPLES = 12


class InsightError(ValueError):
    """A setting or a sample the estimator cannot use; the message names it."""


@dataclass(frozen=True)
class InsightSettings:
    """The estimator's knobs (module docstring: the paper's and our choices)."""
    confidence: float = 0.8
    window_s: float = 1800.0
    subsets: int = 5
    subset_exponent: float = 0.7
    resamples: int = 30

    def __post_init__(self) -> None:
        checks = ((0.5 <= self.confidence < 1.0, "confidence must be in [0.5, 1)"),
                  (0 < self.window_s <= 7 * 86400, "window_s must be in (0, 7 days]"),
                  (1 <= self.subsets <= 100, "subsets must be 1 to 100"),
                  (0.5 <= self.subset_exponent < 1.0, "subset_exponent must be in [0.5, 1)"),
                  (2 <= self.resamples <= 1000, "resamples must be 2 to 1000"))
        for ok, message in checks:
            if not ok:
                raise InsightError(message)


@dataclass(frozen=True)
class Estimate:
    """One node's (or claim's) use: ``q`` the mean (soft limit), ``q + xi`` the level it stays at
    or under for a ``confidence`` share of the time (hard limit), ``mean_width`` Algorithm 1's
    confidence of ``q`` (interval half-width), over ``samples`` samples."""
    q: float
    xi: float
    mean_width: float
    samples: int
    confidence: float

    @property
    def hard_limit(self) -> float:
        return self.q + self.xi


def subset_size(n: int, exponent: float) -> int:
    """BLB's ``b = ceil(n ** exponent)``, at least 2 and below ``n``."""
    return max(2, min(n - 1, math.ceil(n ** exponent)))


def estimate(values: Sequence[float], settings: InsightSettings = InsightSettings(),
             rng: Optional[random.Random] = None) -> Optional[Estimate]:
    """The BLB estimate of ``values`` (one window's samples), None with fewer than
    :data:`MIN_SAMPLES`; InsightError for a value that is not a finite number >= 0."""
    data = [_checked(v) for v in values]
    n = len(data)
    if n < MIN_SAMPLES:
        return None
    rng = rng or random.Random(0)
    b = subset_size(n, settings.subset_exponent)
    s = min(settings.subsets, n // b)                 # disjoint subsets: at most n // b of them
    order = rng.sample(range(n), s * b)
    rank = math.ceil(settings.confidence * n)         # the quantile's rank among n resampled points
    means, quantiles, spreads = [], [], []
    indices = range(b)
    for j in range(s):
        subset = sorted(data[i] for i in order[j * b:(j + 1) * b])
        resample_means, resample_quantiles = [], []
        for _ in range(settings.resamples):
            counts = [0] * b
            for a in rng.choices(indices, k=n):       # n points drawn from the b (multinomial counts)
                counts[a] += 1
            resample_means.append(sum(c * x for c, x in zip(counts, subset)) / n)
            resample_quantiles.append(_weighted_quantile(subset, counts, rank))
        means.append(sum(resample_means) / len(resample_means))
        quantiles.append(sum(resample_quantiles) / len(resample_quantiles))
        spreads.append(_stdev(resample_means))
    q = sum(means) / s
    z = NormalDist().inv_cdf((1 + settings.confidence) / 2)
    return Estimate(q=q, xi=max(0.0, sum(quantiles) / s - q), mean_width=z * sum(spreads) / s,
                    samples=n, confidence=settings.confidence)


def _weighted_quantile(sorted_values: Sequence[float], counts: Sequence[int], rank: int) -> float:
    """The ``rank``-th smallest of the resample (``counts[i]`` copies of ``sorted_values[i]``)."""
    seen = 0
    for value, count in zip(sorted_values, counts):
        seen += count
        if seen >= rank:
            return value
    return sorted_values[-1]


def _stdev(values: Sequence[float]) -> float:
    mean = sum(values) / len(values)
    return math.sqrt(sum((v - mean) ** 2 for v in values) / max(1, len(values) - 1))


def _checked(value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise InsightError(f"a utilisation sample must be a finite number >= 0, got {value!r}"[:120])
    return float(value)


class UsageStream:
    """One node's (or claim's) samples of the last ``window_s`` seconds, oldest first."""

    def __init__(self, settings: InsightSettings = InsightSettings(), max_samples: int = 100_000) -> None:
        self.settings = settings
        self.max_samples = max_samples
        self._samples: Deque[Tuple[float, float]] = deque()

    def add(self, at_s: float, value: float) -> None:
        """Record a sample taken at ``at_s``; samples older than the window are dropped."""
        if self._samples and at_s < self._samples[-1][0]:
            raise InsightError(f"sample at {at_s} is older than the last one ({self._samples[-1][0]})")
        self._samples.append((at_s, _checked(value)))
        while self._samples and (self._samples[0][0] <= at_s - self.settings.window_s
                                 or len(self._samples) > self.max_samples):
            self._samples.popleft()

    def values(self) -> list[float]:
        return [v for _, v in self._samples]

    def __len__(self) -> int:
        return len(self._samples)

    def estimate(self, rng: Optional[random.Random] = None) -> Optional[Estimate]:
        return estimate(self.values(), self.settings, rng)
