"""``random``: paper 002's MCC baseline (MPSS + Condor + COSMIC), random sharing.

Jobs, in a random order, each go to a random device they fit; ``random.Random(seed)``
makes it reproducible. Paper 002's MCC checks device memory only and leaves threads to
COSMIC's node-side arbitration. Here a device slot accounts its threads, so HTCondor would
never match a job beyond them: threads are checked with ``settings.thread_overcommit``
(set it high to model MCC's node-side arbitration), as are host cpus and memory.
"""
from __future__ import annotations

import random
import time

import numpy as np

from condor_sched.model import Plan
from condor_sched.modes.devices import capacity as dv
from condor_sched.modes.planning import PlanRequest, PlanSettings, PolicyKind
from condor_sched.modes.devices.knapsack import prepare


class RandomPolicy:
    """MCC: random cluster-level packing."""

    name = "random"
    kind = PolicyKind.DEVICE

    def plan(self, request: PlanRequest, settings: PlanSettings) -> Plan:
        t0 = time.perf_counter()
        considered, dslots, too_big, state, rest = prepare(request, settings)
        rng = random.Random(settings.seed)
        order = list(rest)
        rng.shuffle(order)
        open_slots = state.open_slots()
        residual = np.array([state.residual[s.name] for s in open_slots], dtype=np.int64).reshape(-1, dv.N_DIMENSIONS)
        hardware_threads = np.array([s.total.device_threads for s in open_slots], dtype=np.int64)
        index = {s.name: i for i, s in enumerate(open_slots)}
        dead: set[dv.Capacity] = set()  # shapes no device fits any more (free only shrinks)
        for job in order:
            need = dv.demand(job, settings)
            if need in dead or not open_slots:
                continue
            chosen = None
            for _ in range(8):  # rejection sampling: uniform over the fitting devices
                s = open_slots[rng.randrange(len(open_slots))]
                if dv.fits_device(job, need, state.residual[s.name], s):
                    chosen = s
                    break
            if chosen is None:
                ok = (residual >= np.asarray(need)).all(axis=1) & (hardware_threads >= need.device_threads)
                fitting = np.flatnonzero(ok)
                if not len(fitting):
                    dead.add(need)
                    continue
                chosen = open_slots[int(fitting[rng.randrange(len(fitting))])]
            state.assign(job, chosen, need)
            residual[index[chosen.name]] -= need
        stats = {"seed": settings.seed, "solve_time_s": round(time.perf_counter() - t0, 6)}
        return dv.finish_plan(self.name, considered, dslots, state, too_big, settings, stats)
