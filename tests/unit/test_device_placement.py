"""Planner, HTCondor and the node agent count the same thing (issue 9, item 2).

The planners and HTCondor account a device's memory and compute (hardware threads for a Xeon
Phi) as sums: a job fits while the running jobs' amounts plus its own fit the device's
(``Resources.fits_in``; HTCondor's ``PhiMemory``/``PhiThreads`` of the partitionable slot).
The node agent must agree: it places every start whose claim fits so, on units disjoint from
its co-runners', and refuses every start that does not. No contiguous core range is needed,
so no planned job is ever refused for fragmentation.
"""
from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest
from cosched_node import agent, config, errors, jobs, placement, procs, slots
from cosched_node.config import DeviceKindConfig, NodeConfig, SlotConfig
from hypothesis import given, settings
from hypothesis import strategies as st
from test_node_harness import FakeView, device_ad

from condor_sched.model import Resources


pytestmark = pytest.mark.usefixtures("fake_pids_are_not_ours")


def device_slot(hardware_threads: int, per_core: int, memory_mb: int) -> SlotConfig:
    kind = DeviceKindConfig("phi" if per_core == 4 else "dummy", "PhiMemory", "PhiThreads", "PhiDeviceName",
                            per_core, (), cpu_offset=1 if per_core == 4 else 0)
    return SlotConfig(2, "device", 4, 1024, "mic0", memory_mb, hardware_threads, device_kind=kind)


def node_with(device: SlotConfig) -> NodeConfig:
    return NodeConfig("node1", "cosched.test", 8, 4096, (device,))


@st.composite
def device_and_events(draw, max_events: int = 40):
    per_core = draw(st.sampled_from([1, 2, 4, 8]))
    hardware_threads = draw(st.integers(per_core, 64 * per_core))
    memory_mb = draw(st.integers(1, 16384))
    start = st.tuples(st.just("start"), st.integers(1, hardware_threads), st.integers(1, memory_mb))
    end = st.tuples(st.just("end"), st.integers(0, 10 ** 6), st.just(0))
    restart = st.tuples(st.just("restart"), st.just(0), st.just(0))
    events = draw(st.lists(st.one_of(start, start, end, restart), max_size=max_events))
    return device_slot(hardware_threads, per_core, memory_mb), events


def fits(device: SlotConfig, running: list, threads: int, memory_mb: int) -> bool:
    """The planners' (and HTCondor's) rule: the sums fit the device."""
    used = Resources(device_memory_mb=sum(c.device_memory_mb for c, _ in running) + memory_mb,
                     device_threads=sum(c.compute for c, _ in running) + threads)
    return used.fits_in(Resources(device_memory_mb=device.device_memory_mb, device_threads=device.hardware_threads))


def check_placement(device: SlotConfig, running: list, units: placement.Units, threads: int) -> None:
    assert placement.units_count(units) == threads
    assert placement.parse_units([list(r) for r in units], threads) == units      # canonical
    assert 0 <= units[0][0] and units[-1][1] <= device.hardware_threads
    mine = {u for a, b in units for u in range(a, b)}
    for _, other in running:
        assert not mine & {u for a, b in other for u in range(a, b)}


def claim(n: int, device: SlotConfig, threads: int, memory_mb: int) -> slots.Claim:
    return slots.Claim(f"slot2_{n + 1}", 2, f"{n}.0", 1000 + n, "alice", 1, 512, device.device, memory_mb, threads,
                       0, 0.0, None, False, 0, 0)


@settings(max_examples=400, deadline=None)
@given(device_and_events())
def test_the_agent_places_exactly_the_starts_that_fit_the_device(case):
    device, events = case
    with tempfile.TemporaryDirectory() as tmp:
        brain = agent.Agent(node_with(device), tmp, FakeView(node_with(device)), None, lambda m: None)
        running: list = []
        for n, (what, threads, memory_mb) in enumerate(events):
            if what == "end":
                if running:
                    ended, _ = running.pop(threads % len(running))
                    del brain.records[f"{ended.starter_pid}:0"]
                continue
            if what == "restart":              # nothing to restart here: see the next test
                continue
            record = jobs.Running(1000 + n, 0, claim(n, device, threads, memory_mb), 0.0)
            brain.records[record.key] = record
            try:
                units = brain.place(record)
            except agent.Refused as refused:
                assert refused.code == errors.EXIT_OVERSUBSCRIBED
                assert not fits(device, running, threads, memory_mb)
                del brain.records[record.key]       # a refused start's starter exits
                continue
            assert fits(device, running, threads, memory_mb)
            check_placement(device, running, units, threads)
            record.units = units
            running.append((record.claim, units))


def fake_proc(proc_root: Path, pid: int, ppid: int, comm: str, uid: int, start: int) -> None:
    """/proc/<pid>/stat and status as Linux lays them out (field 22: the start time)."""
    (proc_root / str(pid)).mkdir(parents=True)
    (proc_root / str(pid) / "stat").write_text(f"{pid} ({comm}) S {ppid} {pid} {pid} " + "0 " * 15 + f"{start} 0\n")
    (proc_root / str(pid) / "status").write_text(f"Name:\t{comm}\nUid:\t{uid}\t{uid}\t{uid}\t{uid}\n")


@settings(max_examples=60, deadline=None)
@given(device_and_events(max_events=20))
def test_through_the_hooks_question_every_fitting_start_is_placed_and_the_rest_refused(case):
    """The same through ``Agent.answer``: claims from the slot view, starters and hooks in a
    /proc laid out like the real one (starter pid 1000+n, its hook 5000+n), records saved and
    read back by an agent restarted at random points."""
    device, events = case
    tmp = tempfile.mkdtemp()
    try:
        state_dir, proc_root = os.path.join(tmp, "state"), Path(tmp, "proc")
        proc_root.mkdir()
        cfg = node_with(device)
        view = FakeView(cfg)

        def new_agent() -> agent.Agent:
            return agent.Agent(cfg, state_dir, view, None, lambda m: None, proc_root=str(proc_root),
                               starter_uid=0)

        os.makedirs(state_dir)
        brain = new_agent()
        running: list = []
        for n, (what, threads, memory_mb) in enumerate(events):
            if what == "restart":
                brain = new_agent()
                continue
            if what == "end":
                if running:
                    ended, _ = running.pop(threads % len(running))
                    shutil.rmtree(proc_root / str(ended.starter_pid))       # its starter exited
                    view.drop(ended.job)
                continue
            fake_proc(proc_root, 1000 + n, 1, "condor_starter", 0, 4242 + n)
            fake_proc(proc_root, 5000 + n, 1000 + n, "python3", 2001, 4243 + n)
            view.ads.append(device_ad(f"slot2_{n + 1}", f"{n}.0", 1000 + n, memory_mb, threads))
            reply = brain.answer(5000 + n, 2001)
            if reply["status"] == "refused":
                assert reply["code"] == errors.EXIT_OVERSUBSCRIBED
                assert not fits(device, running, threads, memory_mb)
                shutil.rmtree(proc_root / str(1000 + n))
                view.drop(f"{n}.0")
                continue
            assert fits(device, running, threads, memory_mb)
            units = placement.parse_units(reply["units"], threads)
            check_placement(device, running, units, threads)
            running.append((brain.records[f"{1000 + n}:{4242 + n}"].claim, units))
        restarted = new_agent()                     # what it saved is what runs, once ended starters go
        restarted.reconcile(None, procs.process_table(str(proc_root)), 0.0)
        assert {r.claim.job: r.units for r in restarted.records.values()} == {c.job: u for c, u in running}
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def test_issue_9_fragmented_device_now_places_the_planned_job():
    """hooks.log of issue 9: "no 45 contiguous free cores on mic0 (held: [(30, 45)])": 45
    free cores in two pieces, a 180-thread job planned on them."""
    device = device_slot(240, 4, 8192)
    units = placement.place_units(device.hardware_threads, 4, [(120, 180)], 180)
    assert units == ((0, 120), (180, 240))
    assert device.device_kind.job_environment("mic0", 180, units) == []    # this test kind has no templates
    env = dict(config.PHI_KIND.job_environment("mic0", 180, units))
    assert env["MIC_KMP_AFFINITY"] == "granularity=fine,explicit,proclist=[1-120,181-240]"
    assert env["COSCHED_DEVICE_CORES"] == "0-29,45-59" and env["MIC_OMP_NUM_THREADS"] == "180"


@pytest.mark.parametrize("threads, expected", [(4, ((0, 4),)), (6, ((0, 6),)), (240, ((0, 240),))])
def test_an_idle_device_is_filled_from_core_0(threads, expected):
    assert placement.place_units(240, 4, [], threads) == expected
