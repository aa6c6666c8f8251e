"""Runtime models: how a job runs on a device once a policy has placed it there.

The engine owns time, arrivals, negotiation cycles and placements; a runtime model owns
what happens on one device between a job's start and its end. A model is a factory of
:class:`DeviceRuntime` objects, one per device, that schedule their own events through
the engine's :class:`Clock` and report each finished job back to it.

:class:`OffloadModel` is the offload model of paper 002 (Figs. 2 and 3) with COSMIC's
node-level offload scheduling: a job alternates host phases and offloads of its requested
threads; offloads on one device share the device's hardware threads; an offload that
would oversubscribe them waits, first come first served, until enough threads are free
(no slowdown from sharing otherwise: COSMIC gives each offload its own cores).

Calibration (the paper gives no run times; see ``calibrate.py`` and docs/results.md):
only the baseline is fitted. Under MC (the ``exclusive`` policy), 1000 Table I jobs on 8
devices take 3568 s at about 50% average device-core utilisation (Section III), with
negotiation cycles every :data:`CALIBRATION_CYCLE_S` seconds. The exclusive makespan does
not depend on the offload fraction, so two one-dimensional fits suffice:
``MEAN_EXCLUSIVE_RUNTIME_S`` by bisection on the simulated MC makespan, then
``OFFLOAD_FRACTION`` = 0.5 / (utilisation simulated with fraction 1). The shared
configurations (random, knapsack, global) are then predictions, not fits.

Parallel CPU jobs (Spread-n-Share, paper 000) run under the profile-driven model of
``profile_model.py`` instead, with co-runner-dependent speeds.
"""
from __future__ import annotations

import random
from collections import deque
from dataclasses import dataclass, field
from typing import Callable, Protocol


class SimJob(Protocol):
    """What the offload models read of a simulated job (``workloads.SimJob`` has it)."""

    index: int
    exclusive_runtime_s: float
    offload_fraction: float
    offloads: int
    device_threads: int

#: Fitted by ``python -m condor_sched.simulate.calibrate`` (documented in docs/results.md).
MEAN_EXCLUSIVE_RUNTIME_S = 25.83
#: Fraction of a job's exclusive run time spent in offloads (the rest on the host).
OFFLOAD_FRACTION = 0.859
#: The negotiation interval the calibration assumed (and scripts/reproduce uses): HTCondor's
#: NEGOTIATOR_MIN_INTERVAL. With 8 devices and ~28.5 s per job, the default 60 s interval
#: would idle each device ~30 s per job and could not give 3568 s at any run time.
CALIBRATION_CYCLE_S = 5.0
#: Section III: measured MC makespan (s) and device-core utilisation the fit targets.
TARGET_MC_MAKESPAN_S = 3568.0
TARGET_MC_UTILIZATION = 0.50


class Clock(Protocol):
    """What the engine offers a device runtime."""

    def schedule(self, time_s: float, action: Callable[[float], None]) -> None:
        """Call ``action(time_s)`` at simulated time ``time_s`` (>= now)."""
        ...

    def job_finished(self, job: SimJob, time_s: float) -> None:
        """The job has ended at ``time_s``; the engine frees its slot resources."""
        ...


class DeviceRuntime(Protocol):
    """One device's execution of the jobs placed on it."""

    #: Device-thread-seconds spent in offloads so far (for utilisation and work checks).
    busy_thread_s: float
    #: Seconds offloads spent waiting for threads (COSMIC serialisation), summed over jobs.
    offload_wait_s: float
    #: (start_s, end_s, threads) of every finished offload, when recording is on.
    busy_intervals: list[tuple[float, float, int]]

    def admit(self, job: SimJob, now: float) -> None:
        """The job starts on this device at ``now``."""
        ...


class RuntimeModel(Protocol):
    name: str

    def device(self, hardware_threads: int, clock: Clock, record: bool = False) -> DeviceRuntime:
        ...


@dataclass(slots=True)
class _Offload:
    job: SimJob
    threads: int
    requested_at_s: float


@dataclass(slots=True)
class OffloadDevice:
    """A device under COSMIC: offloads run when their threads fit, else queue FIFO. Every
    offload of a job lasts the same (and every host phase): run time x fraction / offloads."""

    hardware_threads: int
    clock: Clock
    record: bool = False
    free_threads: int = 0
    busy_thread_s: float = 0.0
    offload_wait_s: float = 0.0
    busy_intervals: list[tuple[float, float, int]] = field(default_factory=list)
    _queue: deque = field(default_factory=deque)
    _done_offloads: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.free_threads = self.hardware_threads

    def admit(self, job: SimJob, now: float) -> None:
        self._done_offloads[job.index] = 0
        self._host_phase(job, now)

    def _phase_lengths(self, job: SimJob) -> tuple[float, float]:
        """The job's next host phase and offload, in seconds."""
        host_s = job.exclusive_runtime_s * (1.0 - job.offload_fraction) / job.offloads
        offload_s = job.exclusive_runtime_s * job.offload_fraction / job.offloads
        return host_s, offload_s

    def _host_phase(self, job: SimJob, now: float) -> None:
        host_s, _ = self._phase_lengths(job)
        self.clock.schedule(now + host_s, lambda t, job=job: self._request_offload(job, t))

    def _request_offload(self, job: SimJob, now: float) -> None:
        # An offload never asks for more than the device has (it would wait forever).
        self._queue.append(_Offload(job, min(job.device_threads, self.hardware_threads), now))
        self._start_queued(now)

    def _start_queued(self, now: float) -> None:
        while self._queue and self._queue[0].threads <= self.free_threads:
            o = self._queue.popleft()
            self.free_threads -= o.threads
            self.offload_wait_s += now - o.requested_at_s
            _, offload_s = self._phase_lengths(o.job)
            self.clock.schedule(now + offload_s, lambda t, o=o, start=now: self._end_offload(o, start, t))

    def _end_offload(self, o: _Offload, start_s: float, now: float) -> None:
        self.free_threads += o.threads
        self.busy_thread_s += (now - start_s) * o.threads
        if self.record:
            self.busy_intervals.append((start_s, now, o.threads))
        job = o.job
        self._done_offloads[job.index] += 1
        if self._done_offloads[job.index] >= job.offloads:
            del self._done_offloads[job.index]
            self.clock.job_finished(job, now)
        else:
            self._host_phase(job, now)
        self._start_queued(now)


@dataclass(slots=True)
class DrawnOffloadDevice(OffloadDevice):
    """The same device with each phase's length drawn (issue 12: is a policy's gain an
    artefact of equal offloads?). A job's offload time, run time x fraction, is split over
    its offloads in shares drawn from a flat Dirichlet (i.i.d. exponential weights,
    normalised), and its host time likewise, so its exclusive run time and offload fraction
    are those of the fixed model (the calibration holds) while one offload may be many times
    another. Draws are seeded by the job's index, so runs stay byte-identical."""

    _phases: dict = field(default_factory=dict)

    def admit(self, job: SimJob, now: float) -> None:
        rng = random.Random(job.index)
        hosts = [rng.expovariate(1.0) for _ in range(job.offloads)]
        offloads = [rng.expovariate(1.0) for _ in range(job.offloads)]
        host_s = job.exclusive_runtime_s * (1.0 - job.offload_fraction)
        offload_s = job.exclusive_runtime_s * job.offload_fraction
        self._phases[job.index] = [(host_s * h / sum(hosts), offload_s * o / sum(offloads))
                                   for h, o in zip(hosts, offloads)]
        OffloadDevice.admit(self, job, now)

    def _phase_lengths(self, job: SimJob) -> tuple[float, float]:
        return self._phases[job.index][self._done_offloads[job.index]]


@dataclass(frozen=True, slots=True)
class DrawnOffloadModel:
    """Paper 002's offload model with phase lengths drawn per offload (``DrawnOffloadDevice``)."""

    name: str = "offload-drawn"

    def device(self, hardware_threads: int, clock: Clock, record: bool = False) -> DrawnOffloadDevice:
        return DrawnOffloadDevice(hardware_threads, clock, record)


@dataclass(frozen=True, slots=True)
class OffloadModel:
    """Paper 002's offload model (Figs. 2-3) with COSMIC's FIFO thread guard."""

    name: str = "offload"

    def device(self, hardware_threads: int, clock: Clock, record: bool = False) -> OffloadDevice:
        return OffloadDevice(hardware_threads, clock, record)


MODELS: dict[str, Callable[[], RuntimeModel]] = {"offload": OffloadModel, "offload-drawn": DrawnOffloadModel}
