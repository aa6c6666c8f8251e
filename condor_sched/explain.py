"""``condor-sched explain JOB``: why a job runs where it runs, or why it waits (pure).

The answer comes from the same state and decision a sidecar cycle would make: the job's
requests and status, what this cycle does with it (kept pin, new pin, unpin, hold, waiting
with the policy's reason), and each slot of its kind with why it can or cannot take it:
the slot takes no new job (draining, Owner, offline), the job's Requirements or the slot's
START refuse it, it is too small even when empty, or it lacks free room now (a spare slot's
room: what its node's agent publishes as spare, less what spare jobs hold there).
"""
from __future__ import annotations

from dataclasses import replace

from condor_sched.cycle import CycleDecision, free_after_pins
from condor_sched.model import Job, JobKey, JobStatus, PoolState, Resources, Slot, SlotKind
from condor_sched.modes.spare.mode import capped


class UnknownJob(LookupError):
    """No job in the state has the id asked for."""


def find_job(state: PoolState, job_id: str) -> Job:
    """The job named ``cluster.proc`` or ``schedd#cluster.proc`` (an id on two schedds needs the schedd)."""
    schedd, _, ident = job_id.rpartition("#")
    cluster, _, proc = ident.partition(".")
    try:
        wanted = (int(cluster), int(proc or 0))
    except ValueError:
        raise UnknownJob(f"{job_id!r} is not a job id (cluster.proc or schedd#cluster.proc)") from None
    found = [j for j in state.jobs if (j.key.cluster, j.key.proc) == wanted and (not schedd or j.key.schedd == schedd)]
    if len(found) > 1:
        raise UnknownJob(f"job {ident} is on several schedds ({', '.join(j.key.schedd for j in found)}): "
                         "name it as schedd#cluster.proc")
    if not found:
        skipped = [s for s in state.skipped if s.job is not None and (s.job.cluster, s.job.proc) == wanted]
        if skipped:
            return _skipped_job(skipped[0].job, skipped[0].reason)  # type: ignore[arg-type]
        raise UnknownJob(f"job {job_id} is not among the co-scheduled jobs read")
    return found[0]


def _skipped_job(key: JobKey, reason: str) -> Job:
    return Job(key, "", JobStatus.IDLE, Resources(), attributes={"skipped": reason})


def _amounts(r: Resources, kind: SlotKind) -> str:
    if kind is SlotKind.DEVICE:
        return f"{r.device_memory_mb} MB device memory, {r.device_threads} device threads, {r.cpus} cpus, {r.memory_mb} MB"
    if kind is SlotKind.SPARE:
        return f"{r.cpus} cpus, {r.memory_mb} MB"
    return f"{r.cpus} cpus, {r.memory_mb} MB, {r.llc_ways} LLC ways, {r.mem_bw_gbs:g} GB/s"


def _slot_verdict(job: Job, slot: Slot, free: Slot | None, eligible: frozenset[str] | None) -> str:
    dims = ("device_memory_mb", "device_threads", "cpus", "memory_mb") if slot.kind is SlotKind.DEVICE else ("cpus", "memory_mb")
    if slot.unavailable:
        return f"takes no new job: it {slot.unavailable}"
    short = [d for d in dims if getattr(job.request, d) > getattr(slot.total, d)]
    if short:
        return "too small even when empty: " + ", ".join(
            f"{d} {getattr(job.request, d)} > {getattr(slot.total, d)}" for d in short)
    if eligible is not None and slot.name not in eligible:
        return "refused: the job's Requirements or the slot's START do not accept it there"
    room = free.free if free is not None else slot.free
    short = [d for d in dims if getattr(job.request, d) > getattr(room, d)]
    if short:
        return "no room now: " + ", ".join(f"{d} {getattr(job.request, d)} > {max(0, getattr(room, d))} free" for d in short)
    return "could take it now"


def _spare_room(slot: Slot) -> Slot:
    """A spare slot as the spare mode plans it: its free amounts capped at what its node's agent
    publishes, or marked as taking no job (why) when it publishes nothing usable."""
    if slot.spare is None or slot.spare.problem is not None:
        why = slot.spare.problem if slot.spare else "its node agent publishes no CoSchedSpare* attributes"
        return replace(slot, unavailable=f"offers no spare capacity ({why})")
    return capped(slot, slot.spare)


def explain(state: PoolState, decision: CycleDecision, job: Job) -> list[str]:
    """Lines that explain ``job`` (module docstring)."""
    key = job.key
    if "skipped" in job.attributes:
        hold = next((h.reason for h in decision.holds if h.job == key), None)
        return [f"job {key}: its ad cannot be planned: {job.attributes['skipped']}",
                f"this cycle: held ({hold})" if hold else "this cycle: left untouched (not idle)"]
    lines = [f"job {key}: {job.status.name.lower()}, owner {job.owner or '?'}, submitter {job.submitter or job.owner or '?'}"]
    if job.gpu is not None:
        return lines + _gpu_lines(state, decision, job)
    spare = job.sharing_mode == "spare"
    if not (job.uses_device or job.wants_spread or spare):
        return lines + ["not co-scheduled (it requests no device memory, names no +CoSchedProgram and is no "
                        "+CoSchedSpare job): HTCondor matches it as usual"]
    kind = SlotKind.DEVICE if job.uses_device else SlotKind.SPARE if spare else SlotKind.SOCKET
    lines.append(f"requests {_amounts(job.request, kind)}")
    if job.pin_reason:
        lines.append(f"CoSchedPinReason: {job.pin_reason}")
    if not job.is_idle:
        where = f" on {job.remote_slot}" if job.remote_slot else ""
        return lines + [f"not idle{where}: the sidecar plans idle jobs only"]
    lines.append(f"this cycle ({decision.cycle}): {_this_cycle(decision, key)}")
    free = {s.name: s for s in free_after_pins(state, [a.job for a in decision.kept], decision.plans)}
    eligible = state.eligible.get(key)
    slots = [s for s in state.slots if s.kind is kind and (kind is not SlotKind.DEVICE or s.device_kind == job.device_kind
                                                           or job.device_kind is None or s.device_kind is None)]
    if spare:
        free = {s.name: _spare_room(free.get(s.name, s)) for s in slots}
    pinned = {a.slot for a in decision.kept if a.job == key} | {p.slot for p in decision.pins if p.job == key}
    lines.append(f"{len(slots)} {kind.value} slot(s):")
    lines += [f"  {s.name}: " + ("pinned here" if s.name in pinned else
                                 _slot_verdict(job, free[s.name] if spare else s, free.get(s.name), eligible))
              for s in sorted(slots, key=lambda s: s.name)]
    return lines


def _gpu_lines(state: PoolState, decision: CycleDecision, job: Job) -> list[str]:
    """What GPU sharing (the GPU mode, ``modes/gpus/``) does with a GPU job this cycle, and every GPU node's GPUs."""
    req, key, gpu = job.gpu, job.key, decision.gpu_sharing
    what = (f"{req.compute}/1000 of one GPU" if req.shares else f"{req.count} whole GPU(s)")  # type: ignore[union-attr]
    memory = f"{req.memory_mb} MB" if req.memory_mb is not None else "its share of the GPU's memory"  # type: ignore[union-attr]
    lines = [f"requests {what}, {memory} of each, {job.request.cpus} cpus, {job.request.memory_mb} MB"]
    if job.pin_reason:
        lines.append(f"CoSchedPinReason: {job.pin_reason}")
    if not job.is_idle:
        where = f" on {job.remote_slot}" if job.remote_slot else ""
        return lines + [f"not idle{where}: the sidecar plans idle jobs only"]
    parts = [f"unpinned: {r}" for k, r in gpu.unpins if k == key] + [f"held: {r}" for k, r in gpu.holds if k == key]
    if key in gpu.kept:
        parts.append(f"its pin to GPUs {','.join(map(str, job.pinned_gpus))} of {job.pinned_slot} is kept")
    elif key in decision.reasons:
        parts.append(decision.reasons[key])
    lines.append(f"this cycle ({decision.cycle}): {'; '.join(parts) or 'not planned (COSCHED_GPU_POLICY = none)'}")
    nodes = sorted((s for s in state.slots if s.kind is SlotKind.GPU_NODE), key=lambda s: s.name)
    lines.append(f"{len(nodes)} GPU node slot(s):")
    for slot in nodes:
        free = ", ".join(f"GPU {g.index} {g.model} {g.free_compute}/{g.compute} compute {g.free_memory_mb}/{g.memory_mb} MB"
                         for g in slot.gpus)
        lines.append(f"  {slot.name}: {slot.free.cpus} cpus, {slot.free.memory_mb} MB free; {free}"
                     + (f"; {slot.unavailable}" if slot.unavailable else ""))
    return lines


def _this_cycle(decision: CycleDecision, key: JobKey) -> str:
    kept = next((a.slot for a in decision.kept if a.job == key), None)
    if kept:
        return f"its pin to {kept} is kept (waiting for the negotiator to match it there)"
    parts = [f"unpinned: {u.reason}" for u in decision.unpins if u.job == key]
    parts += [f"held: {h.reason}" for h in decision.holds if h.job == key]
    pin = next((p for p in decision.pins if p.job == key), None)
    if pin:
        parts.append(f"pinned to {pin.slot}")
    elif key in decision.reasons:
        parts.append(decision.reasons[key])
    return "; ".join(parts) or "not planned"
