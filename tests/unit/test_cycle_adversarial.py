"""The whole cycle on adversarial snapshots (issue 10): duplicate slot Names and job ids,
stale and contradictory ads, free amounts above totals, malformed values, pins to missing
slots. States are read from ClassAd files by the functions ``condor-sched plan`` uses.

Whatever the input: no slot is planned beyond its totals (kept and new pins together, every
dimension, socket slots too), no job is assigned twice, and every input job is accounted
for (pinned, kept, told why it waits, held, skipped with a reason, or not idle)."""
from __future__ import annotations

import json
import tempfile
from dataclasses import fields
from pathlib import Path

from hypothesis import HealthCheck, event, given, settings as hsettings, strategies as st, target

from condor_sched.cycle import CycleConfig, CycleMemory, decide_cycle
from condor_sched.model import Resources
from condor_sched.modes.planning import PlanSettings, assigned_request
from condor_sched.modes.registry import get_policy
from condor_sched.simulate.workloads import default_profiles
from condor_sched.snapshot import load_snapshot

PROFILES = default_profiles()
SLOT_NAMES = [f"slot{i}@node{n}@node{n}.t" for n in (1, 2) for i in (1, 2, 3)]
#: Malformed values a careless or hostile ad may hold.
BAD = st.sampled_from(["abc", -5, 2.5, 10**13, None, True, "/Expr(1 / 0)/", "/Expr(undefinedAttr * 2)/"])


def amount(good: st.SearchStrategy) -> st.SearchStrategy:
    return st.one_of(*[good] * 8, BAD)


@st.composite
def slot_ad(draw) -> dict:
    name = draw(st.sampled_from(SLOT_NAMES))
    machine = name.split("@", 2)[2]
    device = name.startswith("slot3")
    total = {"Cpus": draw(st.integers(1, 8)), "Memory": draw(st.sampled_from([1024, 4096]))}
    if device:
        total |= {"PhiMemory": draw(st.sampled_from([4096, 8192])), "PhiThreads": draw(st.sampled_from([120, 240]))}
    else:
        total |= {"LLCWays": 20, "MemBW": 50}
    ad = {"Name": name, "Machine": machine, "PartitionableSlot": draw(st.sampled_from([True] * 7 + [False])),
          "LastHeardFrom": draw(st.integers(900, 1100)), "LLCCacheId": int(name[4]) - 1}
    for attr, value in total.items():
        ad[f"TotalSlot{attr}"] = value
        # free: anything from nothing to well above the total, or malformed
        ad[attr] = draw(amount(st.one_of(st.just(value), st.just(value), st.integers(0, 2 * value))))
    if device:
        ad["PhiDeviceName"] = draw(st.sampled_from(["mic0"] * 4 + ["../x"]))
    ad["State"] = draw(st.sampled_from(["Unclaimed"] * 6 + ["Owner", "Drained"]))
    return {k: v for k, v in ad.items() if v is not None}


@st.composite
def job_ad(draw) -> dict:
    cluster = draw(st.one_of(*[st.integers(1, 3)] * 8, st.sampled_from([2.5, "x", None])))
    proc = draw(st.one_of(*[st.integers(0, 5)] * 8, st.sampled_from([0.5, -1])))
    status = draw(st.sampled_from([1, 1, 1, 2, 5, 9]))
    ad = {"ClusterId": cluster, "ProcId": proc, "JobStatus": status, "Owner": draw(st.sampled_from(["alice", "jürgen"])),
          "GlobalJobId": f"schedA#{cluster}.{proc}#1", "QDate": draw(st.integers(0, 100)),
          "RequestCpus": draw(amount(st.integers(1, 4))), "RequestMemory": draw(amount(st.sampled_from([64, 1500, 5000])))}
    if draw(st.booleans()):
        ad["RequestPhiMemory"] = draw(amount(st.sampled_from([500, 3000, "/Expr(1000 + 24)/"])))
        ad["RequestPhiThreads"] = draw(amount(st.sampled_from([60, 180, 60, 0])))
    else:
        ad["CoSchedProgram"] = draw(st.sampled_from(["MG", "CG", "NEWAPP", "../x"]))
    if draw(st.booleans()):
        ad["CoSchedPinSlot"] = draw(st.sampled_from([*SLOT_NAMES, "slot9@gone@gone.t"]))
        ad["CoSchedPinCycle"] = draw(st.integers(0, 12))
    if status == 2 and draw(st.booleans()):
        pslot = draw(st.sampled_from(SLOT_NAMES))
        ad["RemoteHost"] = pslot.replace("@", "_1@", 1)
        ad["JobCurrentStartDate"] = draw(st.integers(900, 1100))
    return {k: v for k, v in ad.items() if v is not None}


def within(used: Resources, total: Resources) -> bool:
    return all(getattr(used, f.name) <= getattr(total, f.name) + 1e-6 for f in fields(Resources))


@given(jobs=st.lists(job_ad(), min_size=1, max_size=16), slots=st.lists(slot_ad(), min_size=1, max_size=10),
       device=st.sampled_from(["knapsack", "global", "exclusive", "random"]),
       spread=st.sampled_from(["sns", "sns-global", "ce", "cs"]))
@hsettings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_no_slot_beyond_its_totals_no_job_twice_and_no_job_lost(jobs, slots, device, spread):
    with tempfile.TemporaryDirectory() as tmp:
        queue, machines = Path(tmp) / "q.json", Path(tmp) / "m.json"
        queue.write_text(json.dumps(jobs, ensure_ascii=False), encoding="utf-8")
        machines.write_text(json.dumps(slots), encoding="utf-8")
        state = load_snapshot(queue, machines)
    config = CycleConfig(get_policy(device), get_policy(spread),
                         PlanSettings(seed=1, deterministic=True, solver_time_limit_s=0.2), 3, PROFILES)
    decision = decide_cycle(state, CycleMemory.fresh(state), config)

    assigned = [p.job for p in decision.pins] + [a.job for a in decision.kept]
    target(float(len(assigned)))  # steer towards crowded slots
    event("pins written" if decision.pins else "nothing pinned")
    assert len(assigned) == len(set(assigned)), "a job is assigned twice"

    by_key = {j.key: j for j in state.jobs}
    totals = {s.name: s.total for s in state.slots}
    used: dict[str, Resources] = {}
    for a in decision.kept:
        used[a.slot] = used.get(a.slot, Resources()) + by_key[a.job].request
    for plan in decision.plans:
        for a in plan.assignments:
            used[a.slot] = used.get(a.slot, Resources()) + assigned_request(by_key[a.job], a)
    for name, amount_used in used.items():
        assert within(amount_used, totals[name]), f"{name}: {amount_used} beyond {totals[name]}"

    # every job ad is a job of the state or a skipped record with its reason ...
    assert len(state.jobs) + sum(s.what.startswith("job ") for s in state.skipped) == len(jobs)
    # ... and every idle job the sidecar covers is pinned, kept, held or told why it waits
    told = set(decision.reasons) | {a.job for a in decision.kept} | {h.job for h in decision.holds}
    for job in state.jobs:
        if job.is_idle and (job.uses_device or job.wants_spread):
            assert job.key in told, f"{job.key} vanished from the decision"
