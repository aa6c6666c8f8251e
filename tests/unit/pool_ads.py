"""Test support: a pool state written back as the ClassAds HTCondor would show for it, so
the same state can be read by the live adapter (``pool.ads_to_state``) and the snapshot
reader (``condor-sched plan``)."""
from __future__ import annotations

from pathlib import Path

import classad2

from condor_sched.classads import ads_to_json
from condor_sched.model import PIN_CLAUSE, Job, PoolState, Resources, Slot, SlotKind

#: The Requirements condor_submit writes for these jobs (the user's part).
USER_REQUIREMENTS = "(TARGET.Arch == \"X86_64\") && (TARGET.Memory >= RequestMemory) && (TARGET.Cpus >= RequestCpus)"


def job_ad(job: Job) -> classad2.ClassAd:
    r = job.request
    ad = classad2.ClassAd({
        "ClusterId": job.key.cluster, "ProcId": job.key.proc, "Owner": job.owner or "alice",
        "GlobalJobId": f"{job.key.schedd}#{job.key.job_id}#1", "JobStatus": int(job.status),
        "QDate": job.submitted_at_s, "Cmd": f"/bin/{job.program or 'sleep'}",
        "RequestCpus": r.cpus, "RequestMemory": r.memory_mb,
    })
    if r.device_memory_mb:
        ad["RequestPhiMemory"] = r.device_memory_mb
        ad["RequestPhiThreads"] = r.device_threads
    if r.llc_ways:
        ad["RequestLLCWays"] = r.llc_ways
    if r.mem_bw_gbs:
        ad["RequestMemBW"] = r.mem_bw_gbs
    if job.spread:
        ad["CoSchedProgram"] = job.program
        ad["CoSchedAlpha"] = job.slowdown_threshold
    if job.remote_slot:
        ad["RemoteHost"] = job.remote_slot
    if job.started_at_s is not None:
        ad["JobCurrentStartDate"] = job.started_at_s
    if job.pinned_slot is not None:
        ad["CoSchedPinSlot"] = job.pinned_slot
    if job.pinned_cycle is not None:
        ad["CoSchedPinCycle"] = job.pinned_cycle
    if job.has_pin_clause:
        ad["CoSchedPinOriginalRequirements"] = classad2.ExprTree(USER_REQUIREMENTS)
        ad["Requirements"] = classad2.ExprTree(f"({USER_REQUIREMENTS}) && {PIN_CLAUSE}")
    else:
        ad["Requirements"] = classad2.ExprTree(USER_REQUIREMENTS)
    return ad


def slot_ad(slot: Slot) -> classad2.ClassAd:
    ad = classad2.ClassAd({"Name": slot.name, "Machine": slot.machine, "PartitionableSlot": True,
                           "Arch": "X86_64", "LastHeardFrom": slot.updated_at_s})

    def amounts(prefix: str, res: Resources) -> None:
        ad[f"{prefix}Cpus"] = res.cpus
        ad[f"{prefix}Memory"] = res.memory_mb
        if slot.kind is SlotKind.DEVICE:
            ad[f"{prefix}PhiMemory"] = res.device_memory_mb
            ad[f"{prefix}PhiThreads"] = res.device_threads
        else:
            ad[f"{prefix}LLCWays"] = res.llc_ways
            ad[f"{prefix}MemBW"] = res.mem_bw_gbs

    amounts("TotalSlot", slot.total)
    amounts("", slot.free)
    if slot.device_name:
        ad["PhiDeviceName"] = slot.device_name
    if slot.cache_id is not None:
        ad["LLCCacheId"] = slot.cache_id
    if slot.children is not None:
        ad["ChildName"] = list(slot.children)
    return ad


def state_ads(state: PoolState) -> tuple[dict[str, list[classad2.ClassAd]], list[classad2.ClassAd]]:
    """Job ads per schedd and slot ads of ``state``."""
    jobs: dict[str, list[classad2.ClassAd]] = {}
    for job in state.jobs:
        jobs.setdefault(job.key.schedd, []).append(job_ad(job))
    return jobs, [slot_ad(s) for s in state.slots]


def write_snapshot(state: PoolState, directory: Path) -> tuple[Path, Path]:
    """``queue.json`` and ``machines.json`` of ``state``, as ``condor-sched snapshot`` writes them."""
    jobs, slots = state_ads(state)
    queue, machines = directory / "queue.json", directory / "machines.json"
    queue.write_text(ads_to_json(ad for ads in jobs.values() for ad in ads))
    machines.write_text(ads_to_json(slots))
    return queue, machines
