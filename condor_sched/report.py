"""Readable and JSON renderings of pool states and plans (pure)."""
from __future__ import annotations

from typing import Any

from condor_sched.cycle import CycleDecision
from condor_sched.model import PoolState, Resources, SlotKind


def _device_rows(state: PoolState, used: dict[str, Resources] | None = None) -> list[str]:
    rows = [f"{'device slot':<38} {'device':<7} {'free mem MB':>12} {'free threads':>12}"
            + ("  planned mem/threads" if used is not None else "")]
    for s in sorted(state.slots, key=lambda s: s.name):
        if s.kind is not SlotKind.DEVICE:
            continue
        row = (f"{s.name:<38} {s.device_name or '-':<7} {s.free.device_memory_mb:>5}/{s.total.device_memory_mb:<6}"
               f" {s.free.device_threads:>5}/{s.total.device_threads:<6}")
        if used is not None:
            u = used.get(s.name, Resources())
            row += f"  +{u.device_memory_mb} MB / +{u.device_threads}"
        rows.append(row)
    return rows


def state_text(state: PoolState) -> str:
    idle = state.idle_jobs()
    lines = [f"{len(idle)} idle jobs ({sum(j.uses_device for j in idle)} co-scheduled), "
             f"{len(state.jobs)} jobs in all, {len(state.slots)} partitionable slots", ""]
    lines.append(f"{'job':<28} {'owner':<10} {'cpus':>4} {'dev mem MB':>10} {'threads':>7}  pinned")
    for j in sorted(idle, key=lambda j: j.key):
        lines.append(f"{str(j.key):<28} {j.owner:<10} {j.request.cpus:>4} {j.request.device_memory_mb:>10}"
                     f" {j.request.device_threads:>7}  {j.pinned_slot or '-'}")
    lines += ["", *_device_rows(state)]
    lines += [f"skipped {s}" for s in state.skipped]
    return "\n".join(lines)


def state_json(state: PoolState) -> dict[str, Any]:
    return {
        "idle_jobs": [{"job": j.key.job_id, "schedd": j.key.schedd, "owner": j.owner,
                       "request_device_memory_mb": j.request.device_memory_mb,
                       "request_device_threads": j.request.device_threads,
                       "pinned_slot": j.pinned_slot} for j in sorted(state.idle_jobs(), key=lambda j: j.key)],
        "slots": [{"slot": s.name, "kind": s.kind.value, "device": s.device_name, "cache_id": s.cache_id,
                   "free_device_memory_mb": s.free.device_memory_mb, "free_device_threads": s.free.device_threads,
                   "total_device_memory_mb": s.total.device_memory_mb,
                   "total_device_threads": s.total.device_threads, "free_cpus": s.free.cpus,
                   "free_llc_ways": s.free.llc_ways, "free_mem_bw_gbs": s.free.mem_bw_gbs}
                  for s in sorted(state.slots, key=lambda s: s.name)],
        "skipped": [{"what": s.what, "reason": s.reason} for s in state.skipped],
    }


def decision_text(state: PoolState, decision: CycleDecision) -> str:
    """One cycle's decision: each policy's placements and unplaced jobs, what happens to pins,
    then the planned use of every device."""
    jobs = {j.key: j for j in state.jobs}
    used: dict[str, Resources] = {}
    lines = [f"cycle {decision.cycle}: {len(decision.kept)} pins kept, {len(decision.unpins)} to unpin, "
             f"{len(decision.enrolls)} to enroll"]
    lines += [f"{str(a.job):<28} kept on {a.slot}" for a in decision.kept]
    lines += [f"{str(u.job):<28} unpin: {u.reason}" for u in decision.unpins]
    for plan in decision.plans:
        lines += ["", f"policy {plan.policy}: {len(plan.assignments)} placed, {len(plan.unplaced)} unplaced", ""]
        lines.append(f"{'job':<28} {'slot':<38} {'dev mem MB':>10} {'threads':>7}")
        for a in sorted(plan.assignments, key=lambda a: (a.slot, a.job)):
            req = jobs[a.job].request if a.job in jobs else Resources()
            used[a.slot] = used.get(a.slot, Resources()) + req
            lines.append(f"{str(a.job):<28} {a.slot:<38} {req.device_memory_mb:>10} {req.device_threads:>7}")
        lines += [f"{str(u.job):<28} unplaced: {u.reason}" for u in plan.unplaced]
    sharing = decision.node_sharing
    if sharing.pins or sharing.unpins or sharing.kept or sharing.restore or sharing.plans:
        lines += ["", f"node sharing: {len(sharing.pins)} guests, {len(sharing.kept)} kept, "
                      f"{len(sharing.unpins)} to unpin, {len(sharing.restore)} mates restored"]
        lines += [f"{str(g.job):<28} guest on {g.slot} of mate {g.mate.job_id} (its limit +{g.increase_s} s)"
                  for g in sharing.pins]
        lines += [f"{str(k):<28} unpin guest: {why}" for k, why in sharing.unpins]
        lines += [f"{str(m.job):<28} mate restored: {m.why}" for m in sharing.restore]
        lines += [f"{str(u.job):<28} {u.reason}" for p in sharing.plans for u in p.unplaced]
    gpu = decision.gpu_sharing
    if gpu.plan is not None:
        lines += ["", f"GPU sharing ({gpu.plan.policy}): {len(gpu.pins)} pinned, {len(gpu.kept)} kept, "
                      f"{len(gpu.unpins)} to unpin, {len(gpu.holds)} to hold"]
        lines += [f"{str(p.job):<28} {p.slot} GPU {','.join(map(str, p.gpus))}: {p.compute}/1000 and {p.memory_mb} MB "
                  "of each" for p in gpu.pins]
        lines += [f"{str(k):<28} unpin: {why}" for k, why in gpu.unpins]
        lines += [f"{str(k):<28} hold: {why}" for k, why in gpu.holds]
        lines += [f"{str(u.job):<28} {u.reason}" for u in gpu.plan.unplaced]
    lines += ["", *_device_rows(state, used)]
    lines += [f"skipped {s}" for s in state.skipped]
    return "\n".join(lines)
