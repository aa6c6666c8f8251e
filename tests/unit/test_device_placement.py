"""Planner, HTCondor and the PREPARE_JOB hook count the same thing (issue 9, item 2).

The planners and HTCondor account a device's memory and compute (hardware threads for a Xeon
Phi) as sums: a job fits while the running jobs' amounts plus its own fit the device's
(``Resources.fits_in``; HTCondor's ``PhiMemory``/``PhiThreads`` of the partitionable slot).
The hook must agree: it places every start that fits so, on units disjoint from its
co-runners', and refuses every start that does not. No contiguous core range is needed, so
no planned job is ever refused for fragmentation.
"""
from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

import pytest
from hypothesis import given, settings, strategies as st

from condor_sched.model import Resources

HOOKS = Path(__file__).resolve().parents[2] / "node_hooks"
sys.path.insert(0, str(HOOKS))

import cosched_node as cn  # noqa: E402
import cosched_node_agent as agent  # noqa: E402
import cosched_prepare_job as hook  # noqa: E402


def device_slot(hardware_threads: int, per_core: int, memory_mb: int) -> cn.SlotConfig:
    kind = cn.DeviceKindConfig("phi" if per_core == 4 else "dummy", "PhiMemory", "PhiThreads", "PhiDeviceName",
                               per_core, (), cpu_offset=1 if per_core == 4 else 0)
    return cn.SlotConfig(2, "device", 4, 1024, "mic0", memory_mb, hardware_threads, device_kind=kind)


@st.composite
def device_and_events(draw, max_events: int = 40):
    per_core = draw(st.sampled_from([1, 2, 4, 8]))
    hardware_threads = draw(st.integers(per_core, 64 * per_core))
    memory_mb = draw(st.integers(1, 16384))
    start = st.tuples(st.just("start"), st.integers(1, hardware_threads), st.integers(0, memory_mb))
    end = st.tuples(st.just("end"), st.integers(0, 10 ** 6), st.just(0))
    events = draw(st.lists(st.one_of(start, start, end), max_size=max_events))
    return device_slot(hardware_threads, per_core, memory_mb), events


def fits(device: cn.SlotConfig, running: list[cn.Request], threads: int, memory_mb: int) -> bool:
    """The planners' (and HTCondor's) rule: the sums fit the device."""
    used = Resources(device_memory_mb=sum(r.memory_mb for r in running) + memory_mb,
                     device_threads=sum(r.threads for r in running) + threads)
    return used.fits_in(Resources(device_memory_mb=device.device_memory_mb, device_threads=device.hardware_threads))


def check_placement(device: cn.SlotConfig, running: list[cn.Request], units: cn.Units, threads: int) -> None:
    assert cn.units_count(units) == threads
    assert cn.parse_units([list(r) for r in units], threads) == units      # canonical: what the agent accepts
    assert 0 <= units[0][0] and units[-1][1] <= device.hardware_threads
    mine = {u for a, b in units for u in range(a, b)}
    for other in running:
        assert not mine & {u for a, b in other.units for u in range(a, b)}


def request(n: int, device: cn.SlotConfig, threads: int, memory_mb: int, units: cn.Units) -> cn.Request:
    return cn.Request(n, 0, f"slot2_{n + 1}", device.device or "", memory_mb, threads, units, 1000 + n, 4242,
                      "/scratch", "alice")


@settings(max_examples=400, deadline=None)
@given(device_and_events())
def test_the_hook_places_exactly_the_starts_that_fit_the_device(case):
    device, events = case
    running: list[cn.Request] = []
    for n, (what, threads, memory_mb) in enumerate(events):
        if what == "end":
            if running:
                running.pop(threads % len(running))
            continue
        try:
            units = hook.place(device, threads, memory_mb, running)
        except hook.Refusal:
            assert not fits(device, running, threads, memory_mb)
            continue
        assert fits(device, running, threads, memory_mb)
        check_placement(device, running, units, threads)
        running.append(request(n, device, threads, memory_mb, units))


@settings(max_examples=60, deadline=None)
@given(device_and_events(max_events=20))
def test_through_the_state_dir_every_fitting_start_is_placed_and_the_rest_refused(case):
    """The same, through the hook's reserve (state lock, request files read back and
    validated, liveness of each co-runner's starter from a /proc laid out like the real one)."""
    device, events = case
    with tempfile.TemporaryDirectory() as tmp:
        state, proc_root = os.path.join(tmp, "state"), Path(tmp, "proc")
        agent.prepare_state_dir(state)
        running: list[cn.Request] = []
        for n, (what, threads, memory_mb) in enumerate(events):
            if what == "end":
                if running:
                    ended = running.pop(threads % len(running))
                    os.remove(proc_root / str(ended.starter_pid) / "stat")   # its starter exited
                continue
            pid = 1000 + n
            (proc_root / str(pid)).mkdir(parents=True)
            (proc_root / str(pid) / "stat").write_text(f"{pid} (condor_starter) S " + "0 " * 18 + "4242\n")

            def make(units: cn.Units, n: int = n, threads: int = threads, memory_mb: int = memory_mb) -> cn.Request:
                return request(n, device, threads, memory_mb, units)

            try:
                placed = hook.reserve(state, make, device, threads, memory_mb, proc_root=str(proc_root))
            except hook.Refusal:
                assert not fits(device, running, threads, memory_mb)
                continue
            assert fits(device, running, threads, memory_mb)
            check_placement(device, running, placed.units, threads)
            running.append(placed)
        on_disk = {r.file_name for r, _ in cn.read_requests(os.path.join(state, "requests"), "mic0")}
        assert {r.file_name for r in running} <= on_disk


def test_issue_9_fragmented_device_now_places_the_planned_job():
    """hooks.log of issue 9: "no 45 contiguous free cores on mic0 (held: [(30, 45)])": 45
    free cores in two pieces, a 180-thread job planned on them."""
    device = device_slot(240, 4, 8192)
    co_runner = request(0, device, 60, 1000, ((120, 180),))
    units = hook.place(device, 180, 1000, [co_runner])
    assert units == ((0, 120), (180, 240))
    env = dict(device.device_kind.job_environment("mic0", 180, units))
    assert env == {}                       # this test kind has no templates; the Xeon Phi's:
    env = dict(cn.PHI_KIND.job_environment("mic0", 180, units))
    assert env["MIC_KMP_AFFINITY"] == "granularity=fine,explicit,proclist=[1-120,181-240]"
    assert env["COSCHED_DEVICE_CORES"] == "0-29,45-59" and env["MIC_OMP_NUM_THREADS"] == "180"


@pytest.mark.parametrize("threads, expected", [(4, ((0, 4),)), (6, ((0, 6),)), (240, ((0, 240),))])
def test_an_idle_device_is_filled_from_core_0(threads, expected):
    assert hook.place(device_slot(240, 4, 8192), threads, 0, []) == expected
