"""A simulation always ends: jobs no cycle will ever start end the run with an error naming them."""
from __future__ import annotations

import subprocess
import sys

import pytest

from condor_sched.inventory import Inventory, Node, Socket
from condor_sched.model import Assignment, Plan, SlotKind
from condor_sched.modes.planning import PlanSettings
from condor_sched.modes.registry import get_policy
from condor_sched.simulate.engine import Simulation, SimulationError, phi_inventory
from condor_sched.simulate.profile_model import ProfileDrivenModel
from condor_sched.simulate.workloads import SimJob, default_profiles


def small_node() -> Inventory:
    """One 8-core node: a 16- or 28-proc parallel job fits it at no scale."""
    return Inventory((Node("tiny", 8, 65536, (Socket(0, 20, 59.0),)),))


def test_parallel_job_that_fits_no_node_ends_with_an_error_naming_it():
    store = default_profiles()
    mg = store.get("MG")
    jobs = [SimJob(0, "MG", 0, 0, mg.runtime_s[1], procs=16)]
    sim = Simulation(jobs, small_node(), get_policy("knapsack"), model=ProfileDrivenModel(store),
                     profiles=store, cycle_s=60.0)
    with pytest.raises(SimulationError, match=r"can place none of the 1 idle jobs.*sim#2\.0.*16 procs of MG"):
        sim.advance(until_s=1e5)


def test_pins_refused_forever_on_an_empty_pool_end_with_an_error():
    class PinsTooLarge:
        """A broken policy: pins every job to the first device, whatever its size."""

        name = "test-pins-too-large"

        def plan(self, request, settings):
            device = next(s for s in request.slots if s.kind is SlotKind.DEVICE)
            return Plan(self.name, tuple(Assignment(j.key, device.name) for j in request.idle))

    sim = Simulation([SimJob(0, "t", 100_000, 60, 1.0)], phi_inventory(1), PinsTooLarge(), cycle_s=5.0,
                     settings=PlanSettings(age_limit_cycles=3))
    with pytest.raises(SimulationError, match=r"can place none of the 1 idle jobs"):
        sim.advance(until_s=1e5)


def test_sns_random_on_one_node_under_knapsack_finishes():
    """Issue 10's reproduction: it looped for ever (aging never reached a parallel job)."""
    done = subprocess.run([sys.executable, "-m", "condor_sched", "simulate", "--workload", "sns-random",
                           "--policy", "knapsack", "--jobs", "2", "--nodes", "1", "--json"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert '"jobs": 2' in done.stdout
