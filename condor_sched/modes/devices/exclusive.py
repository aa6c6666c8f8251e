"""``exclusive``: paper 002's MC baseline (MPSS + Condor), one job per whole device.

A job goes only to a device with no running job (free device memory and threads equal to
the total) and each device takes at most one job per cycle; jobs in FIFO order (oldest
first), devices in name order, as HTCondor's matchmaking would without sharing. FIFO
already keeps any job from starving (the oldest job takes the next free device), so the
aging rule of the sharing policies, which may place a starving job on a busy device, is
not applied: it would break exclusivity.

Each assignment carries ``details["whole_device"] = True``: the sidecar marks such pins
(``CoSchedPinExclusive``) and the startd then starts the job only on a device with nothing
else on it, so exclusivity holds even when a slot ad the plan was made from is stale.
"""
from __future__ import annotations

import time

from condor_sched.model import Plan
from condor_sched.modes.devices import capacity as dv
from condor_sched.modes.planning import PlanRequest, PlanSettings, PolicyKind
from condor_sched.modes.devices.knapsack import prepare


class ExclusivePolicy:
    """MC: no sharing, a device holds one job at a time."""

    name = "exclusive"
    kind = PolicyKind.DEVICE

    def plan(self, request: PlanRequest, settings: PlanSettings) -> Plan:
        t0 = time.perf_counter()
        considered, dslots, too_big, state, rest = prepare(request, settings, aging=False)
        used = {a.slot for a in state.assignments}
        empty = [
            s
            for s in state.open_slots()
            if s.name not in used
            and s.free.device_memory_mb == s.total.device_memory_mb
            and s.free.device_threads == s.total.device_threads
        ]
        for job in rest:
            need = dv.demand(job, settings)
            for i, slot in enumerate(empty):
                if dv.fits_device(job, need, state.residual[slot.name], slot):
                    state.assign(job, slot, need, {"whole_device": True})
                    del empty[i]
                    break
            if not empty:
                break
        stats = {"solve_time_s": round(time.perf_counter() - t0, 6)}
        return dv.finish_plan(self.name, considered, dslots, state, too_big, settings, stats)
