"""The two offload models (issue 12): equal phases, and phases drawn per offload with the
same totals, so a policy's gain can be checked against the shape of offloads."""
from __future__ import annotations

import heapq
import itertools

import pytest

from condor_sched.simulate.offload import MODELS
from condor_sched.simulate.workloads import SimJob


class EventClock:
    """The engine's Clock reduced to an event queue (the device runtimes are the unit)."""

    def __init__(self) -> None:
        self.events: list = []
        self.order = itertools.count()
        self.finished: dict[int, float] = {}

    def schedule(self, time_s: float, action) -> None:
        heapq.heappush(self.events, (time_s, next(self.order), action))

    def job_finished(self, job: SimJob, time_s: float) -> None:
        self.finished[job.index] = time_s

    def run(self) -> None:
        while self.events:
            t, _, action = heapq.heappop(self.events)
            action(t)


def sim_job(i: int, threads: int = 240, runtime_s: float = 100.0, offloads: int = 10) -> SimJob:
    return SimJob(index=i, program="t", device_memory_mb=500, device_threads=threads,
                  exclusive_runtime_s=runtime_s, offload_fraction=0.8, offloads=offloads)


@pytest.mark.parametrize("model", sorted(MODELS))
def test_a_job_alone_takes_its_exclusive_run_time_and_offloads_its_fraction(model) -> None:
    clock = EventClock()
    device = MODELS[model]().device(240, clock, record=True)
    device.admit(sim_job(0), 0.0)
    clock.run()
    assert clock.finished[0] == pytest.approx(100.0)
    assert device.busy_thread_s == pytest.approx(0.8 * 100.0 * 240)
    assert len(device.busy_intervals) == 10


def test_drawn_offloads_differ_in_length_and_repeat_per_job() -> None:
    lengths = []
    for _ in range(2):
        clock = EventClock()
        device = MODELS["offload-drawn"]().device(240, clock, record=True)
        device.admit(sim_job(7), 0.0)
        clock.run()
        lengths.append([round(end - start, 9) for start, end, _ in device.busy_intervals])
    assert lengths[0] == lengths[1]
    assert max(lengths[0]) > 2 * min(lengths[0])


@pytest.mark.parametrize("model", sorted(MODELS))
def test_two_full_device_jobs_serialise_their_offloads(model) -> None:
    # Fig. 2: two 240-thread jobs share a device; an offload waits while the other's runs,
    # so together they take longer than one and less than both one after the other
    clock = EventClock()
    device = MODELS[model]().device(240, clock)
    device.admit(sim_job(0), 0.0)
    device.admit(sim_job(1), 0.0)
    clock.run()
    end = max(clock.finished.values())
    assert 160.0 <= end < 200.0 and device.offload_wait_s > 0
