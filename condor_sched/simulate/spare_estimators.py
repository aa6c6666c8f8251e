"""Estimators of what a node's primary jobs will use, each giving the spare capacity the spare
mode plans over (paper 003 against the field). Pure; all read the node agent's CPU samples
(cores): the node's primaries' summed use over each of its 5 s intervals. What each does when
the node's primaries change is its field's own (the simulator, ``hybrid003``, applies it):
``hybrid``'s stream starts anew, as the agent's (``SpareDuty.sample_primaries``);
``koordinator``'s 300 s mean slides across the change; ``autopilot``'s histograms are per
primary, so they come and go with their primaries.

- ``hybrid``: paper 003's Insight Engine (Algorithm 1, ``cosched_node.insight``, the very code
  the node agent runs, with its settings and its fresh ``random.Random(0)`` per estimate):
  used = Q + xi at confidence 0.8 over the agent's sliding window (``InsightSettings.window_s``).
- ``koordinator``: Koordinator's batch capacity (v1.6 era, the slo-controller's
  ``calculateBatchResourceByPolicy`` "usage" policy): batch = Total - SafetyMargin -
  max(SystemUsed, Reserved) - sum of the high-priority pods' usage, usage a 300 s mean,
  SafetyMargin = Total x (100 - threshold) / 100, threshold 60 (CPU) and 65 (memory).
- ``autopilot``: Google Autopilot's recommender (Rzadca et al., EuroSys 2020, Section 3.2):
  a histogram of the samples, each weighted 2^(-age / half-life) (half-life 12 h for CPU),
  its 95th percentile plus a 10% margin. Autopilot keeps one per job (its limit is a job's),
  so the simulator feeds it each primary's share of the node's samples (the agent measures
  each primary claim before summing them) and sums the running primaries' limits.
"""
from __future__ import annotations

import math
from collections import deque
from typing import Deque, Optional, Protocol

from cosched_node import insight, spare_duty

KOORD_CPU_THRESHOLD_PCT = 60.0
KOORD_MEMORY_THRESHOLD_PCT = 65.0
KOORD_WINDOW_S = 300.0
AUTOPILOT_HALF_LIFE_S = 12 * 3600.0
AUTOPILOT_PERCENTILE = 0.95
AUTOPILOT_MARGIN = 0.10


def koordinator_batch(total: float, used_mean: float, threshold_pct: float = KOORD_CPU_THRESHOLD_PCT,
                      system_used: float = 0.0, reserved: float = 0.0) -> float:
    """Koordinator's batch capacity of one resource, at least 0: Total - SafetyMargin -
    max(SystemUsed, Reserved) - the high-priority pods' mean usage."""
    safety_margin = total * (100.0 - threshold_pct) / 100.0
    return max(0.0, total - safety_margin - max(system_used, reserved) - used_mean)


class DecayingHistogram:
    """Autopilot's exponentially decaying histogram: buckets of ``bucket`` wide, each sample's
    weight 2^((t - t0) / half_life) (growing weights rather than decaying ones: the same ratios,
    no rescaling of old buckets)."""

    def __init__(self, bucket: float, half_life_s: float = AUTOPILOT_HALF_LIFE_S) -> None:
        if not bucket > 0 or not half_life_s > 0:
            raise ValueError("bucket and half_life_s must be positive")
        self.bucket = bucket
        self.half_life_s = half_life_s
        self.weights: dict[int, float] = {}
        self.t0: Optional[float] = None

    def add(self, at_s: float, value: float) -> None:
        if self.t0 is None:
            self.t0 = at_s
        k = int(math.floor(max(0.0, value) / self.bucket + 1e-9))
        self.weights[k] = self.weights.get(k, 0.0) + 2.0 ** ((at_s - self.t0) / self.half_life_s)

    def percentile(self, p: float) -> Optional[float]:
        """The upper edge of the bucket where the weighted share ``p`` is reached (Autopilot
        rounds up to the bucket's top); None when empty."""
        total = sum(self.weights.values())
        if total <= 0:
            return None
        seen = 0.0
        for k in sorted(self.weights):
            seen += self.weights[k]
            if seen >= p * total - 1e-12:
                return (k + 1) * self.bucket
        return (max(self.weights) + 1) * self.bucket


def autopilot_limit(hist: DecayingHistogram, percentile: float = AUTOPILOT_PERCENTILE,
                    margin: float = AUTOPILOT_MARGIN) -> Optional[float]:
    """Autopilot's recommended limit: the histogram's percentile x (1 + margin)."""
    value = hist.percentile(percentile)
    return None if value is None else value * (1.0 + margin)


class UseEstimator(Protocol):
    """What one node's primaries will use (cores), from the node's samples (None: no estimate
    yet, under ``insight.MIN_SAMPLES`` samples in its stream)."""

    def observe(self, at_s: float, used: float) -> None: ...

    def used(self) -> Optional[float]: ...


class BlbEstimator:
    """Paper 003: Q + xi of the node agent's ``insight.UsageStream`` (None under MIN_SAMPLES).
    ``UsageStream.estimate()`` without an rng, as ``spare_duty`` calls it: each estimate draws
    from a fresh ``random.Random(0)``, so it is a function of the window's samples alone; the
    last one is kept and returned again while the window holds the same values (an idle
    node's zeros), which changes no result."""

    def __init__(self, settings: insight.InsightSettings = insight.InsightSettings()) -> None:
        self.stream = insight.UsageStream(settings)
        self._last: Optional[tuple[list[float], Optional[float]]] = None

    def observe(self, at_s: float, used: float) -> None:
        self.stream.add(at_s, used)

    def __len__(self) -> int:
        return len(self.stream)

    def used(self) -> Optional[float]:
        values = self.stream.values()
        if self._last is not None and self._last[0] == values:
            return self._last[1]
        est = self.stream.estimate()
        used = None if est is None else est.hard_limit
        self._last = (values, used)
        return used


class KoordinatorEstimator:
    """Koordinator: the capacity less its batch capacity, i.e. the safety margin plus the
    primaries' 300 s mean use (None under ``insight.MIN_SAMPLES`` samples, as the others)."""

    def __init__(self, capacity: float, window_s: float = KOORD_WINDOW_S) -> None:
        self.capacity = capacity
        self.window_s = window_s
        self.samples: Deque[tuple[float, float]] = deque()
        self.count = 0

    def observe(self, at_s: float, used: float) -> None:
        self.samples.append((at_s, used))
        self.count += 1
        while self.samples and self.samples[0][0] <= at_s - self.window_s:
            self.samples.popleft()

    def __len__(self) -> int:
        return self.count

    def used(self) -> Optional[float]:
        if self.count < insight.MIN_SAMPLES:
            return None
        mean = sum(v for _, v in self.samples) / len(self.samples)
        return self.capacity - koordinator_batch(self.capacity, mean)


class AutopilotEstimator:
    """Autopilot: p95 of a decaying histogram of the samples plus 10% (None under
    ``min_samples``)."""

    def __init__(self, bucket: float, min_samples: int = insight.MIN_SAMPLES) -> None:
        self.hist = DecayingHistogram(bucket)
        self.count = 0
        self.min_samples = min_samples

    def observe(self, at_s: float, used: float) -> None:
        self.hist.add(at_s, used)
        self.count += 1

    def __len__(self) -> int:
        return self.count

    def used(self) -> Optional[float]:
        return autopilot_limit(self.hist) if self.count >= self.min_samples else None


def _level(used: Optional[float]) -> Optional[insight.Estimate]:
    """An estimated use as the node agent's functions take it: the level Q + xi (xi 0)."""
    return None if used is None else insight.Estimate(q=used, xi=0.0, mean_width=0.0, samples=0, confidence=0.0)


def spare_cap(capacity: float, estimated_use: Optional[float], live_use: float) -> float:
    """The CPU cap of a node's spare-capacity jobs together: the node agent's own rule
    (``spare_duty.node_limits``), max(FLOOR_SHARE x C, C - max(estimated use, live use)); with
    no estimate yet, the floor."""
    return spare_duty.node_limits(capacity, 0, _level(estimated_use), None, live_use, 0.0).cores


def spare_offer(capacity: float, estimated_use: Optional[float]) -> float:
    """What the node publishes as spare (``spare_duty.spare_offer``): C - estimated use, within
    [0, C]; 0 with no estimate (the node then publishes itself not usable)."""
    return spare_duty.spare_offer(capacity, _level(estimated_use))
