"""Adding a sharing mode is one package plus one registry line: a toy mode defined in this file,
registered through the registry's API, is planned by ``plan``, by the sidecar's cycle and by the
simulator, with no other file edited (docs/architecture.md walks through it)."""
from __future__ import annotations

import json
from dataclasses import replace

import pytest
from click.testing import CliRunner

from condor_sched.cli import DEFAULT_SNAPSHOT, main
from condor_sched.cycle import CycleConfig, CycleMemory, decide_cycle
from condor_sched.model import Assignment, Job, JobKey, JobStatus, Plan, PoolState, Resources, Slot, SlotKind, Unplaced
from condor_sched.modes import registry
from condor_sched.modes.planning import PlanRequest, PlanSettings, PolicyError, PolicyKind
from condor_sched.modes.slot_mode import SlotMode
from condor_sched.settings import SidecarSettings
from condor_sched.sidecar import Sidecar
from condor_sched.simulate.engine import Simulation, phi_inventory
from condor_sched.simulate.workloads import table1_jobs
from condor_sched.snapshot import load_snapshot


class FirstFitPolicy:
    """The toy's one planner: each job, oldest first, on the first slot (by name) it fits."""

    name = "toy-first-fit"
    kind = PolicyKind.DEVICE

    def plan(self, request: PlanRequest, settings: PlanSettings) -> Plan:
        free = {s.name: s.free for s in request.slots}
        threads = {s.name: s.total.device_threads for s in request.slots}
        placed, waiting = [], []
        for job in sorted(request.idle, key=lambda j: (j.submitted_at_s, j.key)):
            where = next((n for n in sorted(free) if job.request.fits_in(free[n])
                          and job.request.device_threads <= threads[n]), None)
            if where is None:
                waiting.append(Unplaced(job.key, "no slot fits it first"))
                continue
            free[where] = free[where] - job.request
            placed.append(Assignment(job.key, where))
        return Plan(self.name, tuple(placed), tuple(waiting), {"first_fits": len(placed)})


class ToyMode(SlotMode):
    """Device jobs, each pinned whole to the first device slot it fits (no paper: a toy)."""

    name = "toy"
    paper = "no paper: the worked example of docs/architecture.md"
    planners = {"toy-first-fit": FirstFitPolicy}
    default_planner = "toy-first-fit"
    policy_kind = PolicyKind.DEVICE
    slot_kind = SlotKind.DEVICE

    def covers(self, job: Job) -> bool:
        return job.uses_device


@pytest.fixture
def toy():
    mode = ToyMode()
    registry.register_mode(mode, before="devices")  # a job goes to the first mode that covers it
    yield mode
    registry.unregister_mode("toy")


DEVICE = Resources(cpus=4, memory_mb=4096, device_memory_mb=8192, device_threads=240)


def _state() -> PoolState:
    slots = tuple(Slot(f"slot{i}@n1", "n1", SlotKind.DEVICE, DEVICE, DEVICE) for i in (1, 2))
    jobs = tuple(Job(JobKey("s", 1, p), "alice", JobStatus.IDLE,
                     Resources(cpus=1, memory_mb=64, device_memory_mb=3000, device_threads=60),
                     submitted_at_s=p, attributes={"Requirements": "true"}) for p in range(6))
    return PoolState(jobs, slots)


def test_the_toy_is_found_by_name_and_takes_the_jobs_it_covers(toy):
    assert registry.get_mode("toy") is toy and "toy-first-fit" in registry.policy_names(PolicyKind.DEVICE)
    assert registry.get_policy("toy-first-fit").name == "toy-first-fit"
    job = _state().jobs[0]
    mode_of = registry.mode_of_job()
    assert mode_of is not None and mode_of(job) is toy  # ahead of the device mode, which covers it too
    with pytest.raises(PolicyError, match="registered twice"):
        registry.register_mode(ToyMode())


def test_the_registry_is_as_it_was_once_the_toy_is_gone(toy):
    registry.unregister_mode("toy")
    assert registry.mode_of_job() is None and "toy-first-fit" not in registry.policy_names()
    registry.register_mode(toy, before="devices")  # the fixture takes it out again


def test_plan_plans_the_toys_jobs(toy):
    out = json.loads(CliRunner().invoke(main, ["plan", "--json", "--policy", "knapsack"], catch_exceptions=False).output)
    placed = out["assignments"]
    assert placed and out["stats"]["toy-first-fit"]["first_fits"] == len(placed)
    assert out["policy"] == "knapsack" and out["stats"]["knapsack"]["jobs_considered"] == 0  # the toy took them
    # First fit, oldest job first: the first slot by name that takes jobs takes the first one.
    state = load_snapshot(DEFAULT_SNAPSHOT / "queue.json", DEFAULT_SNAPSHOT / "machines.json")
    open_slots = sorted(s.name for s in state.slots if s.kind is SlotKind.DEVICE and s.unavailable is None)
    assert placed[0]["slot"] == open_slots[0]


def test_the_sidecar_pins_what_the_toy_places(toy):
    from test_sidecar import RecordingEditor

    editor = RecordingEditor()
    sidecar = Sidecar(SidecarSettings(), CycleConfig(registry.get_policy("knapsack"), None), _state, editor)
    done = sidecar.run_cycle()
    assert [p.policy for p in done.decision.plans] == ["toy-first-fit", "knapsack"]
    assert done.outcome.pinned == 4  # two 3000 MB jobs a device, first fit
    pinned = {k.proc: a["CoSchedPinSlot"] for k, a in editor.attrs.items() if "CoSchedPinSlot" in a}
    assert pinned == {0: "slot1@n1", 1: "slot1@n1", 2: "slot2@n1", 3: "slot2@n1"}
    assert all("Requirements" in editor.attrs[JobKey("s", 1, p)] for p in range(6))  # enrolled
    # One mode per job, by rule: the device mode, which covers these jobs too, plans none of them.
    told = [set(p.reasons) | {pin.job for pin in p.pins} for p in done.decision.parts]
    assert [p.mode for p in done.decision.parts][:2] == ["toy", "devices"] and told[0] and not told[1]


def test_the_simulator_runs_the_toys_plans_to_the_end(toy):
    jobs = table1_jobs(30, 3)
    placed: list[JobKey] = []

    class Counted(FirstFitPolicy):
        def plan(self, request, settings):
            out = super().plan(request, settings)
            placed.extend(a.job for a in out.assignments)
            return out

    config_planners = {"toy": Counted()}
    sim = Simulation(jobs, phi_inventory(2), registry.get_policy("knapsack"), seed=1, cycle_s=5.0)
    sim.config = replace(sim.config, planners=config_planners)
    result = sim.run()
    assert all(r.end_s is not None for r in result.jobs)
    # Every job started where the toy pinned it: each placed once (pins are kept, never re-planned).
    assert sorted(placed) == sorted(k for j in jobs for k in j.proc_keys())


class EvenFirstFit(FirstFitPolicy):
    name = "toy-even-first-fit"


class EvenToy(ToyMode):
    """The device jobs of even proc ids only: the device mode plans the others on the same slots."""

    name = "toy-even"
    planners = {"toy-even-first-fit": EvenFirstFit}
    default_planner = "toy-even-first-fit"

    def covers(self, job: Job) -> bool:
        return job.uses_device and job.key.proc % 2 == 0


def test_two_modes_on_the_same_slots_never_book_the_same_room():
    registry.register_mode(EvenToy(), before="devices")
    try:
        state = _state()
        decision = decide_cycle(state, CycleMemory(1), CycleConfig(registry.get_policy("knapsack"), None))
    finally:
        registry.unregister_mode("toy-even")
    by_mode = {p.mode: {pin.job.proc for pin in p.pins} for p in decision.parts}
    assert by_mode["toy-even"] and by_mode["devices"]  # both planned, each its own jobs
    assert all(k % 2 == 0 for k in by_mode["toy-even"]) and all(k % 2 == 1 for k in by_mode["devices"])
    used: dict[str, int] = {}
    for pin in decision.pins:
        used[pin.slot] = used.get(pin.slot, 0) + 3000
    assert len(decision.pins) == 4 and all(mb <= DEVICE.device_memory_mb for mb in used.values())
