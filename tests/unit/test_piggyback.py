"""Piggyback profiling, planner side: unknown programs run exclusive at ever wider scales."""
import json

from condor_sched.cycle import CycleConfig
from condor_sched.inventory import default_inventory_path, load_inventory, node_slots
from condor_sched.model import Job, JobKey, JobStatus, PoolState, Resources
from condor_sched.piggyback import exploration_scales
from condor_sched.modes.registry import get_policy
from condor_sched.profiles import ProfileStore, default_profiles_dir
from condor_sched.settings import SidecarSettings
from condor_sched.sidecar import Sidecar


def record(tmp_path, program, k, runtime_s, job):
    d = tmp_path / "runs" / program
    d.mkdir(parents=True, exist_ok=True)
    (d / f"{job}.json").write_text(json.dumps({"program": program, "scale_factor": k, "runtime_s": runtime_s,
                                               "exclusive": True}))


def test_next_runs_try_wider_scales_until_spreading_stops_paying(tmp_path):
    assert exploration_scales(["NEWAPP"], tmp_path) == {"newapp": 1}
    record(tmp_path, "NEWAPP", 1, 100.0, "1.0")
    assert exploration_scales(["NEWAPP"], tmp_path) == {"newapp": 2}
    record(tmp_path, "NEWAPP", 2, 80.0, "2.0")
    assert exploration_scales(["NEWAPP"], tmp_path) == {"newapp": 4}
    record(tmp_path, "NEWAPP", 4, 79.0, "3.0")  # not > 5% faster than k = 2: stop, keep the best
    assert exploration_scales(["NEWAPP"], tmp_path) == {"newapp": 2}
    assert exploration_scales(["../etc"], tmp_path) == {}


def test_the_sidecar_runs_an_unknown_program_exclusive_at_the_next_scale(tmp_path):
    record(tmp_path, "NEWAPP", 1, 100.0, "1.0")
    slots = tuple(s for n in load_inventory(default_inventory_path()).nodes for s in node_slots(n, "cosched.test"))
    procs = tuple(Job(key=JobKey("s", 7, p), owner="u", status=JobStatus.IDLE,
                      request=Resources(cpus=1, memory_mb=64), has_pin_clause=True, program="NEWAPP", spread=True)
                  for p in range(4))
    settings = SidecarSettings(profile_runs_dir=str(tmp_path))
    config = CycleConfig(get_policy("knapsack"), get_policy("sns"),
                         profiles=ProfileStore.load_dir(default_profiles_dir()))
    sidecar = Sidecar(settings, config, lambda: PoolState(procs, slots), None)
    decision = sidecar.run_cycle().decision
    pins = decision.pins
    assert len(pins) == 4 and {p.scale_factor for p in pins} == {2}
    assert len({p.slot.split("@")[1] for p in pins}) == 2  # k * ceil(P/T) = 2 whole nodes
