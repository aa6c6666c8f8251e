"""One cycle, three sources: the sidecar (live ads), ``plan`` (snapshot files) and the
simulator decide the same on the same pool state.

Without memory of earlier cycles each path takes what the state holds in its place
(``CycleMemory.fresh``: cycle numbers after the newest ``CoSchedPinCycle``, every age 0);
policies run seeded and single-worker (``--deterministic``)."""
from __future__ import annotations

import json
import tempfile
from dataclasses import replace
from pathlib import Path

from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings as hsettings, strategies as st, target

from condor_sched import pool
from condor_sched.cli import main
from condor_sched.cycle import CycleConfig, CycleMemory, decide_cycle
from condor_sched.model import Job, JobKey, JobStatus, PoolState, Resources, Slot, SlotKind
from condor_sched.modes.planning import PlanSettings
from condor_sched.modes.registry import get_policy
from condor_sched.profiles import ProfileStore, default_profiles_dir
from condor_sched.settings import SidecarSettings
from condor_sched.sidecar import Sidecar
from condor_sched.simulate.engine import Simulation, phi_inventory, xeon_inventory
from condor_sched.simulate.profile_model import ProfileDrivenModel
from condor_sched.simulate.workloads import SimJob, default_profiles

from pool_ads import state_ads, write_snapshot

SEED = 3
TIME_LIMIT_S = 0.5
SETTINGS = PlanSettings(seed=SEED, deterministic=True, solver_time_limit_s=TIME_LIMIT_S)
UNPIN_AGE = 3


def config(device: str, spread: str) -> CycleConfig:
    return CycleConfig(get_policy(device), get_policy(spread), SETTINGS, UNPIN_AGE, default_profiles())


def comparable(decision: dict) -> dict:
    """A decision's JSON without the solver statistics (wall-clock times)."""
    return {k: v for k, v in decision.items() if k != "stats"}


def sidecar_decision(state: PoolState, cycle_config: CycleConfig) -> dict:
    """The sidecar's first cycle on the live ads of ``state`` (dry run)."""
    jobs, slots = state_ads(state)
    sidecar = Sidecar(SidecarSettings(), cycle_config, lambda: pool.ads_to_state(pool.LiveAds(jobs, slots)), None)
    return comparable(sidecar.run_cycle().decision.to_json())


def plan_decision(state: PoolState, device: str, spread: str) -> dict:
    """``condor-sched plan --json`` on snapshot files of ``state``."""
    with tempfile.TemporaryDirectory() as tmp:
        queue, machines = write_snapshot(state, Path(tmp))
        result = CliRunner().invoke(main, [
            "plan", "--json", "--queue", str(queue), "--machines", str(machines), "--policy", device,
            "--spread-policy", spread, "--seed", str(SEED), "--deterministic", "--time-limit", str(TIME_LIMIT_S),
            "--unpin-age-cycles", str(UNPIN_AGE), "--profiles", str(default_profiles_dir())])
    assert result.exit_code == 0, result.output
    return comparable(json.loads(result.output))


device_jobs = st.lists(st.builds(
    lambda mem, threads, runtime, arrival: (mem, threads, runtime, arrival),
    st.sampled_from([300, 1250, 2500, 3400, 5000]), st.sampled_from([60, 120, 180, 240]),
    st.floats(5, 200), st.floats(0, 100)), min_size=1, max_size=24)
spread_jobs = st.lists(st.builds(
    lambda program, procs, arrival: (program, procs, arrival),
    st.sampled_from(["MG", "CG", "EP", "BFS", "NEWAPP"]), st.sampled_from([4, 14, 28, 40]), st.floats(0, 60)),
    min_size=1, max_size=8)


@given(jobs=device_jobs, nodes=st.integers(1, 3), policy=st.sampled_from(["knapsack", "global", "exclusive", "random"]),
       until_s=st.floats(0, 150), cycle_s=st.sampled_from([5.0, 60.0]))
@hsettings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_device_cycles_decide_the_same_from_the_simulator_a_snapshot_and_the_live_ads(jobs, nodes, policy, until_s,
                                                                                     cycle_s):
    sim_jobs = [SimJob(i, "t", mem, threads, runtime, arrival_s=arrival)
                for i, (mem, threads, runtime, arrival) in enumerate(jobs)]
    sim = Simulation(sim_jobs, phi_inventory(nodes), get_policy(policy), seed=SEED, cycle_s=cycle_s,
                     settings=SETTINGS, unpin_age_cycles=UNPIN_AGE, profiles=default_profiles())
    sim.advance(until_s)
    state = sim.pool_state()
    simulated = comparable(sim.decide(CycleMemory.fresh(state)).to_json())
    target(float(len(simulated["assignments"])))  # steer towards states where the cycle places jobs
    assert sidecar_decision(state, config(policy, "sns")) == simulated
    assert plan_decision(state, policy, "sns") == simulated


@given(jobs=spread_jobs, nodes=st.integers(1, 4), policy=st.sampled_from(["sns", "sns-global", "ce", "cs"]),
       until_s=st.floats(0, 120), cycle_s=st.sampled_from([5.0, 60.0]))
@hsettings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_spread_cycles_decide_the_same_from_the_simulator_a_snapshot_and_the_live_ads(jobs, nodes, policy, until_s,
                                                                                     cycle_s):
    store = default_profiles()
    # NEWAPP has no profile the planners know (they run it compact-exclusive); the runtime
    # model runs it as MG runs.
    truth = ProfileStore.of([*store.profiles.values(), replace(store.get("MG"), program="NEWAPP")])
    sim_jobs = [SimJob(i, program, 0, 0, truth.get(program).runtime_s[1], arrival_s=arrival, procs=procs)
                for i, (program, procs, arrival) in enumerate(jobs)]
    sim = Simulation(sim_jobs, xeon_inventory(nodes), get_policy(policy), seed=SEED, cycle_s=cycle_s,
                     model=ProfileDrivenModel(truth), settings=SETTINGS, unpin_age_cycles=UNPIN_AGE, profiles=store)
    sim.advance(until_s)
    state = sim.pool_state()
    simulated = comparable(sim.decide(CycleMemory.fresh(state)).to_json())
    target(float(len(simulated["assignments"])))  # steer towards states where the cycle places jobs
    assert sidecar_decision(state, config("knapsack", policy)) == simulated
    assert plan_decision(state, "knapsack", policy) == simulated


DEVICE = Resources(cpus=8, memory_mb=4096, device_memory_mb=8192, device_threads=240)


def device_slot(i: int, free: Resources = DEVICE, children: tuple[str, ...] | None = ()) -> Slot:
    return Slot(f"slot{i + 1}@node{i + 1}@node{i + 1}.cosched.test", f"node{i + 1}.cosched.test", SlotKind.DEVICE,
                DEVICE, free, device_name="mic0", updated_at_s=1000, children=children)


@st.composite
def pinned_states(draw) -> PoolState:
    """Device slots, running jobs (counted by their slot's ad or not yet), and idle jobs that
    are unpinned, freshly pinned, stale, pinned to a vanished slot or submitted before the
    schedd transform."""
    n_slots = draw(st.integers(1, 4))
    slots = [device_slot(i) for i in range(n_slots)]
    room = [DEVICE] * n_slots
    jobs: list[Job] = []
    for proc in range(draw(st.integers(0, 6))):
        i = draw(st.integers(0, n_slots - 1))
        request = Resources(cpus=1, memory_mb=64, device_memory_mb=draw(st.sampled_from([1000, 3000])),
                            device_threads=draw(st.sampled_from([60, 120])))
        if not request.fits_in(room[i]):
            continue  # a device never holds more than it has, counted by its ad or not
        room[i] = room[i] - request
        dynamic = f"slot{i + 1}_{proc + 1}@node{i + 1}@node{i + 1}.cosched.test"
        counted = draw(st.booleans())
        if counted:
            slots[i] = Slot(slots[i].name, slots[i].machine, SlotKind.DEVICE, DEVICE, slots[i].free - request,
                            "mic0", updated_at_s=1000, children=(*slots[i].children, dynamic))
        jobs.append(Job(JobKey("schedd1", 1, proc), "alice", JobStatus.RUNNING, request, submitted_at_s=10,
                        remote_slot=dynamic, started_at_s=990, has_pin_clause=True))
    names = [s.name for s in slots]
    for proc in range(draw(st.integers(1, 10))):
        pin = draw(st.sampled_from([None, None, *names, "slot9@gone@gone.cosched.test"]))
        jobs.append(Job(JobKey(draw(st.sampled_from(["schedd1", "schedd2"])), 2, proc), "bob", JobStatus.IDLE,
                        Resources(cpus=1, memory_mb=64, device_memory_mb=draw(st.sampled_from([500, 2500, 6000])),
                                  device_threads=draw(st.sampled_from([30, 60, 180]))),
                        submitted_at_s=draw(st.integers(0, 50)), pinned_slot=pin,
                        pinned_cycle=draw(st.integers(1, 9)) if pin else None,
                        has_pin_clause=draw(st.booleans()) or pin is not None))
    return PoolState(tuple(jobs), tuple(slots))


@given(state=pinned_states(), policy=st.sampled_from(["knapsack", "global", "exclusive", "random"]))
@hsettings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_pins_are_kept_unpinned_and_reserved_alike_by_the_sidecar_and_plan(state, policy):
    """Pins waiting for a match appear only on a live pool or in its snapshot (the simulated
    negotiator starts a pin in the cycle that writes it), so this property has two paths."""
    direct = comparable(decide_cycle(state, CycleMemory.fresh(state), config(policy, "sns")).to_json())
    assert sidecar_decision(state, config(policy, "sns")) == direct
    assert plan_decision(state, policy, "sns") == direct


def test_plan_keeps_fresh_pins_and_replans_only_the_rest():
    # Five 1500 MB jobs pinned to slot1 at cycle 7 (fresh: the snapshot's cycle is 8) fill
    # 7500 of its 8192 MB; three new ones can only go to slot2.
    slots = (device_slot(0), device_slot(1))
    pinned = [Job(JobKey("s", 1, p), "alice", JobStatus.IDLE,
                  Resources(cpus=1, memory_mb=64, device_memory_mb=1500, device_threads=30),
                  pinned_slot=slots[0].name, pinned_cycle=7, has_pin_clause=True) for p in range(5)]
    new = [Job(JobKey("s", 2, p), "alice", JobStatus.IDLE,
               Resources(cpus=1, memory_mb=64, device_memory_mb=1500, device_threads=30),
               submitted_at_s=5, has_pin_clause=True) for p in range(3)]
    out = plan_decision(PoolState((*pinned, *new), slots), "knapsack", "sns")
    assert out["cycle"] == 8 and out["unpins"] == []
    assert sorted((k["job"], k["slot"]) for k in out["kept"]) == [(f"1.{p}", slots[0].name) for p in range(5)]
    assert sorted((a["job"], a["slot"]) for a in out["assignments"]) == [(f"2.{p}", slots[1].name) for p in range(3)]
