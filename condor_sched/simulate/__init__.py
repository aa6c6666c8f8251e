"""A discrete-event simulator of an HTCondor pool that runs the real policies.

``engine.py`` (time, cycles, placements), ``offload.py`` and ``profile_model.py`` (runtime
models: paper 002's offloads, paper 000's profile-driven contention), ``workloads.py``
(Table I, Section V-B, SWF, YAML, ``sns-random``), ``metrics.py``, ``study.py``
(footprints, sequences), ``calibrate.py`` (the baseline fit), ``command.py`` (click).
"""
from condor_sched.simulate.engine import SimulationError, phi_inventory, simulate, xeon_inventory
from condor_sched.simulate.workloads import SimJob, Workload, WorkloadError, load_workload

__all__ = ["SimJob", "SimulationError", "Workload", "WorkloadError", "load_workload", "phi_inventory", "simulate",
           "xeon_inventory"]
