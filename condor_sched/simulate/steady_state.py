"""What a device policy can gain when it knows thread requests but not offload phases (issue 12).

Overcommitted, COSMIC serialises offloads first come first served (``offload.py``), so how
much of a device a *resident set* (the jobs a policy put on it) keeps busy depends on the
lengths of their offloads and host phases, which no submit file states. This module
measures it: :func:`resident_rates` runs one device under the offload model with a
resident set whose jobs are replaced, as each ends, by another job of the same thread
request from the workload, and returns each request's offload work per second in steady
state. Given those rates, an LP over resident sets (minimise the device time so that each
request's work W_s is done) is the makespan of the best steady mix of resident sets (no
tail, no negotiation cycles).

:func:`phase_blind_limit` compares two such mixes on a workload:

* ``oracle``: the best mix, chosen with the workload's own phase lengths;
* ``blind``: the best mix a planner that knows only thread requests can choose, i.e. the
  resident sets the LP picks when every job has the same phase structure (the synthetic
  jobs' ``SYNTHETIC_OFFLOADS`` offloads of the workload's mean run time), then run with the
  workload's own phases.

Where ``blind`` is far above ``oracle``, the gain left is in the programs' phase lengths,
which the issue's "without knowing run times" puts out of a policy's reach.
"""
from __future__ import annotations

import heapq
import itertools
import math
import random
from collections import defaultdict
from dataclasses import replace
from typing import Callable, Sequence

from condor_sched.modes.devices.configurations import configurations, covering_lp
from condor_sched.simulate.offload import OffloadDevice
from condor_sched.simulate.workloads import SYNTHETIC_OFFLOADS, SimJob

#: Simulated seconds per resident set; long against a job (about 26 s), so the rates settle.
HORIZON_S = 10_000.0


class _Clock:
    """The engine's side of one device: an event heap and the jobs that ended."""

    def __init__(self) -> None:
        self.heap: list = []
        self.ended: list[tuple[SimJob, float]] = []
        self._seq = itertools.count()

    def schedule(self, time_s: float, action: Callable[[float], None]) -> None:
        heapq.heappush(self.heap, (time_s, next(self._seq), action))

    def job_finished(self, job: SimJob, time_s: float) -> None:
        self.ended.append((job, time_s))


def resident_rates(resident: Sequence[int], jobs_by_threads: dict[int, Sequence[SimJob]], threads: int,
                   seed: int, horizon_s: float = HORIZON_S) -> dict[int, float]:
    """Offload thread-seconds done per second, per thread request, by one device of
    ``threads`` hardware threads that always holds ``resident`` (each ended job replaced by
    a random job of the same request from ``jobs_by_threads``)."""
    rng = random.Random(seed)
    clock = _Clock()
    device = OffloadDevice(threads, clock)
    index = itertools.count(10**9)
    work: dict[int, float] = defaultdict(float)

    def start(size: int, now: float) -> None:
        device.admit(replace(rng.choice(jobs_by_threads[size]), index=next(index)), now)

    for size in resident:
        start(size, 0.0)
    while clock.heap:
        now, _, action = heapq.heappop(clock.heap)
        if now > horizon_s:
            break
        action(now)
        while clock.ended:
            job, at = clock.ended.pop()
            work[job.device_threads] += job.device_thread_s
            start(job.device_threads, at)
    return {size: w / horizon_s for size, w in work.items()}


def best_mix_makespan(rates: Sequence[dict[int, float]], work: dict[int, float], devices: int,
                      allowed: set[int] | None = None) -> tuple[float, list[float]]:
    """The LP of the module docstring over the resident sets whose ``rates`` are given (only
    those in ``allowed`` when set): the makespan and each set's device time (inf when the
    sets cannot do the work)."""
    sizes = list(work)
    solved = covering_lp([work[s] / devices for s in sizes], [[r.get(s, 0.0) for s in sizes] for r in rates], allowed)
    return (math.inf, []) if solved is None else solved


def phase_blind_limit(jobs: Sequence[SimJob], devices: int, threads: int, overcommit: int,
                      seed: int) -> dict[str, object]:
    """``oracle`` and ``blind`` makespans (module docstring) and the resident sets ``blind``
    uses, for ``jobs`` on ``devices`` devices overcommitted ``overcommit`` times."""
    by_threads: dict[int, list[SimJob]] = defaultdict(list)
    work: dict[int, float] = defaultdict(float)
    for job in jobs:
        by_threads[job.device_threads].append(job)
        work[job.device_threads] += job.device_thread_s
    mean_runtime = sum(j.exclusive_runtime_s for j in jobs) / len(jobs)
    generic = {s: [replace(js[0], offloads=SYNTHETIC_OFFLOADS, exclusive_runtime_s=mean_runtime)]
               for s, js in by_threads.items()}
    sizes = sorted(by_threads)
    found = configurations(sizes, [len(by_threads[s]) for s in sizes], threads * overcommit) or []
    sets = [[s for s, k in zip(sizes, c) for _ in range(k)] for c in found]
    own = [resident_rates(r, by_threads, threads, seed) for r in sets]
    assumed = [resident_rates(r, generic, threads, seed) for r in sets]
    oracle, _ = best_mix_makespan(own, work, devices)
    _, chosen = best_mix_makespan(assumed, work, devices)
    support = {i for i, y in enumerate(chosen) if y > 1e-6}
    blind, _ = best_mix_makespan(own, work, devices, support)
    return {"oracle_s": oracle, "blind_s": blind, "blind_sets": [sets[i] for i in sorted(support)]}
