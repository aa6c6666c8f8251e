"""The GPU mode's part of a cycle (``GpuView``), pure: which GPU jobs to pin to which GPUs.

A GPU node is one partitionable slot (``SlotKind.GPU_NODE``) whose every GPU's memory and
compute are custom resources HTCondor accounts (docs/gpu-sharing.md). A GPU job asks for a
share of one GPU (``request_GPUCompute`` < 1000, ``request_GPUMemory``) or whole GPUs
(``request_GPUs``). Each cycle, for the GPU jobs only (the shared mechanics of
``mode_cycle.py`` with what this view says of GPUs):

* an idle job's pin is kept unless it went stale (slot gone or unavailable, the node refused
  the start, not matched within ``unpin_age_cycles``, GPUs the slot does not have), and kept
  pins are checked together against each GPU's totals (older pins first), but for a pin whose
  claim the slot's ad shows already (matched, not started: ``GpuView.claim_of``);
* an idle job that no GPU node could hold even empty is held with the reason; others are
  enrolled (the pin clause) and planned by the GPU policy (``COSCHED_GPU_POLICY``,
  ``modes/gpus/mode.py``) on a :class:`GpuFleet` built from the slots' free amounts,
  less what kept pins and jobs the ads do not show yet hold;
* a GPU that runs (or is pinned to) a share of one Owner takes shares of that Owner only:
  MPS runs one server per Linux user, and another user's client waits until that server's
  clients have all exited (FACTS.md);
* with ``COSCHED_INTERFERENCE``, a placement on a node where a program the job is ill-matched
  with runs or is pinned goes back to the policy with the refused nodes taking nothing, and the
  job waits, its reason naming the pair, when no node is left (``_kept_apart``).

A pin writes ``CoSchedPinGPUs``, ``CoSchedPinGPUMemory`` and ``CoSchedPinGPUCompute`` before
``CoSchedPinSlot``; the schedd transform makes the claim request exactly those GPUs' shares.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import AbstractSet, Any, Mapping, Sequence

import classad2
import numpy as np

from condor_sched.model import (
    GPU_CONSTRAINT_ATTR, GPU_PROPERTIES, HOLDS_A_SLOT, PIN_CYCLE_ATTR, PIN_GPU_COMPUTE_ATTR, PIN_GPU_MEMORY_ATTR, PIN_GPUS_ATTR, PIN_SLOT_ATTR,
    PIN_TIME_ATTR, WHOLE_GPU, Gpu, GpuClaim, Job, JobKey, Plan, Slot, SlotKind, Unplaced,
    partitionable_slot_of,
)
from condor_sched.consistency import claim_not_yet_in_ad
from condor_sched.device_kinds import GPU
from condor_sched.edits import JobChange
from condor_sched.modes.interface import ModeContext, ModeJobs, ModePlan
from condor_sched.modes.gpus.fleet import GpuFleet, GpuPlacement, GpuTask
from condor_sched.modes.gpus.fleet_policy import GpuPlanContext, GpuPolicy, typical_tasks


@dataclass(frozen=True, slots=True)
class GpuPin:
    """Pin ``job`` to GPUs ``gpus`` of GPU node slot ``slot``, taking ``memory_mb`` and
    ``compute`` (thousandths) of each."""

    job: JobKey
    slot: str
    gpus: tuple[int, ...]
    memory_mb: int
    compute: int

    def change(self, cycle: int, now_s: float) -> JobChange:
        """The pin's writes: what it takes first (alone it matches nothing), the slot last."""
        return JobChange(self.job, ((PIN_CYCLE_ATTR, str(cycle)), (PIN_TIME_ATTR, str(int(now_s))),
                                    (PIN_GPU_MEMORY_ATTR, str(self.memory_mb)),
                                    (PIN_GPU_COMPUTE_ATTR, str(self.compute)),
                                    (PIN_GPUS_ATTR, classad2.quote(",".join(map(str, self.gpus)))),
                                    (PIN_SLOT_ATTR, classad2.quote(self.slot))))

    def describe(self) -> str:
        return f"GPUs {','.join(map(str, self.gpus))} of {self.slot}"


@dataclass(frozen=True, slots=True)
class GpuSharingDecision:
    """What a cycle decides for GPU jobs: pins kept, unpins (key, reason), jobs to enroll (key,
    their Requirements), holds (key, reason), new pins, each idle GPU job's reason, the plan."""

    kept: tuple[JobKey, ...] = ()
    unpins: tuple[tuple[JobKey, str], ...] = ()
    enrolls: tuple[tuple[JobKey, str | None], ...] = ()
    holds: tuple[tuple[JobKey, str], ...] = ()
    pins: tuple[GpuPin, ...] = ()
    reasons: Mapping[JobKey, str] = field(default_factory=dict)
    plan: Plan | None = None


def _properties(gpu: Gpu) -> classad2.ClassAd:
    """A GPU as ``require_gpus`` sees it (HTCondor's GPU property names, ``GPU_PROPERTIES``)."""
    return classad2.ClassAd(dict(zip(GPU_PROPERTIES, (gpu.model, gpu.capability, gpu.memory_mb, gpu.uuid))))


def accepted_models(require: str | None, gpus: Sequence[Gpu], cache: dict) -> frozenset[str] | None:
    """The GPU models whose properties satisfy ``require`` (``require_gpus`` and / or
    ``CoSchedRequireGPUs``); None: any. A GPU of a model is taken as the model's first GPU
    (one model, one set of properties)."""
    if require is None:
        return None
    if require not in cache:
        expr = classad2.ExprTree(require)
        models = set()
        for gpu in {g.model: g for g in reversed(gpus)}.values():
            try:
                if expr.eval(_properties(gpu)) is True:
                    models.add(gpu.model)
            except Exception:  # noqa: BLE001 - a job's expression that does not evaluate accepts nothing
                pass
        cache[require] = frozenset(models)
    return cache[require]


class _Fleet:
    """The GPU node slots as a :class:`GpuFleet`, with their names, GPUs and owners."""

    def __init__(self, slots: Sequence[Slot], owner_code: Mapping[str, int]) -> None:
        self.slots = list(slots)
        self.fleet = GpuFleet([s.name for s in slots], [s.gpus[0].model for s in slots],
                              [s.total.cpus * 1000 for s in slots], [s.total.memory_mb for s in slots],
                              [[g.memory_mb for g in s.gpus] for s in slots],
                              compute_capacity=max((g.compute for s in slots for g in s.gpus), default=WHOLE_GPU))
        f = self.fleet
        for row, slot in enumerate(slots):
            f.cpu_free_milli[row] = slot.free.cpus * 1000
            f.memory_free_mib[row] = slot.free.memory_mb
            for g in slot.gpus:
                f.gpu_capacity_milli[row, g.index] = g.compute
                f.gpu_free_milli[row, g.index] = g.free_compute
                f.gpu_memory_free_mb[row, g.index] = g.free_memory_mb
            f.single_account[row] = slot.gpu_single_account
        self.row = {s.name: i for i, s in enumerate(slots)}
        self.owner_code = owner_code

    def take(self, job: Job, slot: str, gpus: Sequence[int]) -> None:
        """Take what ``job`` holds on ``gpus`` of ``slot`` out of the free amounts (a job the
        slot's ad does not show yet, a kept pin), and mark the GPUs its Owner's."""
        row, f, req = self.row[slot], self.fleet, job.gpu
        f.cpu_free_milli[row] -= job.request.cpus * 1000
        f.memory_free_mib[row] -= job.request.memory_mb
        for g in gpus:
            f.gpu_free_milli[row, g] -= req.compute  # type: ignore[union-attr]
            f.gpu_memory_free_mb[row, g] -= memory_per_gpu(job, self.slots[row].gpus[g])

    def mark_owner(self, job: Job, slot: str, gpus: Sequence[int]) -> None:
        if job.gpu is not None and job.gpu.shares:
            for g in gpus:
                self.fleet.gpu_owner[self.row[slot], g] = self.owner_code[job.owner]


def memory_per_gpu(job: Job, gpu: Gpu) -> int:
    """What ``job`` takes of ``gpu``'s memory: its request, else its compute share of the GPU's."""
    req = job.gpu
    if req is None:
        return 0
    return req.memory_mb if req.memory_mb is not None else -(-gpu.memory_mb * req.compute // WHOLE_GPU)


def _task(job: Job, owner: int, models: frozenset[str] | None) -> GpuTask:
    req = job.gpu
    return GpuTask(str(job.key), job.request.cpus * 1000, job.request.memory_mb, req.count,  # type: ignore[union-attr]
                   req.compute, req.memory_mb, models, owner)  # type: ignore[union-attr]


@dataclass(frozen=True)
class GpuNodeLimits:
    """The most any GPU node slot holds, even empty: what :meth:`never_fits` compares a job
    with (read once per cycle, not once per job)."""

    most_gpus: int = 0
    most_compute: int = 0
    largest_memory_mb: int = 0
    #: The distinct (cores, memory MB) of the slots: a job fits one of them or no slot.
    shapes: frozenset[tuple[int, int]] = frozenset()

    @classmethod
    def of(cls, slots: Sequence[Slot]) -> GpuNodeLimits:
        gpus = [g for s in slots for g in s.gpus]
        return cls(max((len(s.gpus) for s in slots), default=0), max((g.compute for g in gpus), default=0),
                   max((g.memory_mb for g in gpus), default=0),
                   frozenset((s.total.cpus, s.total.memory_mb) for s in slots))

    def never_fits(self, job: Job) -> str | None:
        """Why no GPU node slot could hold ``job`` even empty, or None (no slot at all: None)."""
        req = job.gpu
        assert req is not None
        if not self.shapes:
            return None
        if req.count > self.most_gpus:
            return f"request_GPUs = {req.count}: no GPU node has more than {self.most_gpus} GPUs"
        if req.compute > self.most_compute:
            return f"request_GPUCompute = {req.compute}: more than a GPU has"
        if req.memory_mb is not None and req.memory_mb > self.largest_memory_mb:
            return f"request_GPUMemory = {req.memory_mb} MB: the largest GPU has {self.largest_memory_mb} MB"
        if not any(job.request.cpus <= cpus and job.request.memory_mb <= memory for cpus, memory in self.shapes):
            return (f"request_cpus = {job.request.cpus}, request_memory = {job.request.memory_mb}: no GPU node has "
                    "that many cores and that much memory")
        return None


def _fair_order(jobs: Sequence[Job], running: Sequence[Job], priorities: Mapping[str, float]) -> list[Job]:
    """Idle GPU jobs in the order the negotiator's shares would serve them: each submitter's
    jobs by JobPrio, then submit order, interleaved by GPU compute held so far over the
    submitter's weight (1 / effective priority, HTCondor's convention)."""
    held: dict[str, float] = {}
    for job in running:
        held[job.submitter] = held.get(job.submitter, 0.0) + job.gpu.count * job.gpu.compute  # type: ignore[union-attr]
    keyed = []
    for job in sorted(jobs, key=lambda j: (j.submitter, -j.job_prio, j.submitted_at_s, j.key)):
        held[job.submitter] = held.get(job.submitter, 0.0) + job.gpu.count * job.gpu.compute  # type: ignore[union-attr]
        weight = 1.0 / max(1e-9, priorities.get(job.submitter, 0.5))
        keyed.append((held[job.submitter] / weight, job.submitted_at_s, job.key, job))
    return [k[-1] for k in sorted(keyed, key=lambda t: t[:3])]


class GpuView:
    """The GPU mode's view of one cycle (module docstring): the GPU node slots as a fleet,
    with what running jobs, claims the ads do not show yet and kept pins hold."""

    def __init__(self, jobs: ModeJobs, context: ModeContext) -> None:
        state = context.state
        self.context = context
        self.slots = {s.name: s for s in state.slots}
        self.gpu_slots = [s for s in state.slots if s.kind is SlotKind.GPU_NODE and s.gpus]
        self.mixed = {s.name for s in self.gpu_slots if len({g.model for g in s.gpus}) > 1}
        self.limits = GpuNodeLimits.of(self.gpu_slots)
        self.any_jobs = bool(jobs.all)
        self.owner_code = {o: i for i, o in enumerate(sorted({j.owner for j in jobs.all}))}
        self.usable = [s for s in self.gpu_slots if s.unavailable is None and s.name not in self.mixed]
        self.live = _Fleet(self.usable, self.owner_code)
        self.running = [j for j in jobs.all if j.status in HOLDS_A_SLOT]
        self.claims_vouched: set[tuple[str, str]] = set()
        live, slots = self.live, self.slots
        for job in self.running:  # who holds which GPU, and claims the ads may not show yet
            name = partitionable_slot_of(job.remote_slot) if job.remote_slot else job.pinned_slot
            if name not in live.row or not job.pinned_gpus or any(g >= len(slots[name].gpus) for g in job.pinned_gpus):
                continue
            live.mark_owner(job, name, job.pinned_gpus)
            if claim_not_yet_in_ad(job, slots) == name:
                live.take(job, name, job.pinned_gpus)

    def slot(self, name: str | None) -> Slot | None:
        return self.slots.get(name) if name is not None else None

    def pin_problem(self, job: Job, slot: Slot) -> str | None:
        if len(job.pinned_gpus) != job.gpu.count or any(g >= len(slot.gpus) for g in job.pinned_gpus):  # type: ignore[union-attr]
            return f"its pin names GPUs {job.pinned_gpus or '(none)'} that {slot.name} does not hold for it"
        return None

    def keep_order(self, job: Job) -> tuple:
        return (job.pinned_cycle or 0, job.key)

    def keep(self, job: Job) -> str | None:
        """A kept pin's shares committed to its GPUs, unless the slot's ad already shows its
        claim (``claim_of``); a node of mixed models is not planned."""
        if job.pinned_slot in self.mixed:
            return f"{job.pinned_slot} holds GPUs of more than one model, which GPU sharing does not plan"
        if self.claim_of(job) is not None:
            self.live.mark_owner(job, job.pinned_slot, job.pinned_gpus)  # type: ignore[arg-type]
            return None
        task = _task(job, self.owner_code[job.owner], None)
        try:
            self.live.fleet.commit(task, GpuPlacement(self.live.row[job.pinned_slot], job.pinned_gpus))  # type: ignore[index]
        except ValueError:
            return f"pinned slot {job.pinned_slot} cannot hold it with the pins kept before it"
        return None

    def claim_of(self, job: Job) -> GpuClaim | None:
        """The claim the slot's ad shows for this idle pinned job, if any: one of the slot's
        claims not started yet, of the job's Owner, made at or after its pin, holding exactly
        its pin's shares (each claim vouches for one job). The negotiator matched the pin and
        the schedd claimed the slot; the job shows Idle until its shadow starts. Its shares are
        out of the ad's free amounts already: counted again, a full GPU would crowd the pin
        out, and a new pin would describe GPUs its claim does not hold (the PREPARE_JOB hook
        refuses such a start)."""
        slot = self.slots.get(job.pinned_slot or "")
        if slot is None or job.pinned_at_s is None or not slot.waiting_gpu_claims:
            return None
        memory = max(memory_per_gpu(job, slot.gpus[g]) for g in job.pinned_gpus)
        shares = tuple((g, memory, job.gpu.compute) for g in sorted(job.pinned_gpus))  # type: ignore[union-attr]
        for claim in slot.waiting_gpu_claims:
            if (claim.owner == job.owner and claim.claimed_at_s >= job.pinned_at_s and claim.shares == shares
                    and (slot.name, claim.name) not in self.claims_vouched):
                self.claims_vouched.add((slot.name, claim.name))
                return claim
        return None

    def never_fits(self, job: Job) -> str | None:
        why = self.limits.never_fits(job)
        return None if why is None else f"GPU sharing can never place it: {why}"

    def plan(self, policy: GpuPolicy, jobs: list[Job], refused: Mapping[JobKey, str]) -> ModePlan:
        """The GPU policy on a batch in fair-share order; each placement a pin to its GPUs."""
        if not self.any_jobs:
            return ModePlan()
        context, live, usable, owner_code = self.context, self.live, self.usable, self.owner_code
        cycle, settings = context.cycle, context.settings
        every_gpu = [g for s in self.gpu_slots for g in s.gpus]
        cache: dict = {}
        ordered = _fair_order(jobs, self.running, context.state.user_priorities)
        tasks = [_task(j, owner_code[j.owner], accepted_models(j.attributes.get(GPU.match_request_attr), every_gpu, cache))
                 for j in ordered]
        plan_context = GpuPlanContext(
            rng=np.random.default_rng([settings.seed, cycle]),
            typical_tasks=typical_tasks(tasks + [_task(j, owner_code[j.owner], None) for j in self.running]),
            settings=settings)
        placements = policy.place(live.fleet, tasks, plan_context) if usable and tasks else [None] * len(tasks)
        pins, unplaced, reasons = [], [], {}
        guard = context.interference
        for job, task, where in zip(ordered, tasks, placements):
            kept_off = None
            if where is not None and guard is not None:
                where, kept_off = _kept_apart(guard, job, task, where, usable, policy, live.fleet, plan_context)
            if where is None:
                why = f"waiting: {kept_off or _unplaced_reason(job, task, self.gpu_slots, usable, live.fleet, self.mixed)}"
                reasons[job.key] = why
                unplaced.append(Unplaced(job.key, why))
                continue
            slot = usable[where.node]
            memory = max(memory_per_gpu(job, slot.gpus[g]) for g in where.gpus)
            pins.append(GpuPin(job.key, slot.name, tuple(sorted(where.gpus)), memory, job.gpu.compute))  # type: ignore[union-attr]
            reasons[job.key] = (f"pinned to GPU {','.join(map(str, sorted(where.gpus)))} of {slot.name} in cycle "
                                f"{cycle} ({job.gpu.compute}/1000 of each, {memory} MB)")  # type: ignore[union-attr]
        plan = Plan(policy.name, (), tuple(unplaced), {"gpu_pins": len(pins), "gpu_nodes": len(usable)})
        return ModePlan(tuple(pins), (plan,), reasons)


def _kept_apart(guard: Any, job: Job, task: GpuTask, where: GpuPlacement, usable: Sequence[Slot], policy: GpuPolicy,
                fleet: GpuFleet, plan_context: GpuPlanContext) -> tuple[GpuPlacement | None, str | None]:
    """COSCHED_INTERFERENCE (``interference/guard.py``): ``where`` when the job may join its
    node; else the policy's choice among the nodes the guard leaves it (the others take nothing
    meanwhile), or None and why, naming the pair its first choice would have formed."""
    why = guard.claim(job, usable[where.node].name)
    if why is None:
        return where, None
    fleet.release(task, where)
    blocked = [i for i, slot in enumerate(usable) if guard.refuses(job, slot.name) is not None]
    saved = fleet.cpu_free_milli[blocked].copy()
    fleet.cpu_free_milli[blocked] = -1
    try:
        again = policy.place(fleet, [task], plan_context)[0]
    finally:
        fleet.cpu_free_milli[blocked] = saved
    if again is None:
        return None, why
    if guard.claim(job, usable[again.node].name) is not None:   # the policy ignored the block: not pinned
        fleet.release(task, again)
        return None, why
    return again, None


def _unplaced_reason(job: Job, task: GpuTask, gpu_slots: Sequence[Slot], usable: Sequence[Slot],
                     fleet: GpuFleet, mixed: AbstractSet[str] = frozenset()) -> str:
    """Why a GPU job waits, naming the rule that blocks it: no GPU node, none usable (a node of
    GPUs of several models is never planned: the fleet holds one model per node), its model
    constraint, the one-Owner-per-GPU rule of MPS, or no room (``fleet``: after this cycle's pins)."""
    if not gpu_slots:
        return "no GPU node slot in the pool (CoSchedGPUNode)"
    if not usable and mixed:
        return (f"no GPU node slot takes jobs now; {', '.join(sorted(mixed))} "
                "hold GPUs of several models, which condor_sched does not plan (one model per node)")[:300]
    if not usable:
        return "no GPU node slot takes jobs now"
    if task.models is not None and not any(s.gpus[0].model in task.models for s in usable):
        return (f"no usable GPU node has a GPU its model constraint accepts "
                f"(require_gpus / {GPU_CONSTRAINT_ATTR}: {job.attributes.get(GPU.match_request_attr)})"[:300])
    want = ("a whole GPU" if job.gpu.count == 1 else f"{job.gpu.count} whole GPUs") if not job.gpu.shares else \
        f"{job.gpu.compute}/1000 of a GPU"  # type: ignore[union-attr]
    if task.shares_gpu and _held_by_other_owners(fleet, task):
        return (f"every GPU with {want} and {task.gpu_memory_mb or 0} MB free holds another Owner's jobs: MPS "
                "shares a GPU among one Owner's jobs only (one MPS server per user), except on a node that runs "
                "every job under one account (CoSchedGPUSingleAccount)")
    return f"no GPU node has {want} with its cores and memory free now"


def _held_by_other_owners(fleet: GpuFleet, task: GpuTask) -> bool:
    """A share that would fit some GPU's free compute and memory (and its node's cores, memory
    and model) were it not for that GPU's other Owner."""
    node_ok = ((fleet.cpu_free_milli >= task.cpu_milli) & (fleet.memory_free_mib >= task.memory_mib)
               & fleet.model_mask(task))
    room = (fleet.gpu_free_milli >= task.gpu_milli) & (fleet.gpu_memory_free_mb >= fleet.gpu_memory_needed(task))
    return bool((room & node_ok[:, None]).any()) and not bool(fleet.node_fits(task).any())


def gpu_pin_details(pin: GpuPin) -> dict[str, object]:
    """A pin as ``plan --json`` shows it."""
    return {"gpus": list(pin.gpus), "gpu_memory_mb": pin.memory_mb, "gpu_compute": pin.compute}

