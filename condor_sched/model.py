"""The records every part of condor_sched shares: jobs, slots, plans.

The sidecar builds them from live ClassAds, the offline planner from snapshot files, the
simulator from workloads; the policies see only these records. All are immutable.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass, field, fields, replace
from typing import Any, Mapping, NamedTuple

#: Prefix of every job attribute the sidecar owns (and the only ones it writes besides
#: Requirements).
PIN_PREFIX = "CoSchedPin"
#: Job attribute naming the partitionable slot a job is pinned to (undefined: unpinned).
PIN_SLOT_ATTR = "CoSchedPinSlot"
#: Job attribute holding the negotiation cycle number at which the pin was written.
PIN_CYCLE_ATTR = "CoSchedPinCycle"
#: Job attribute holding the user's Requirements as submitted, before the pin clause.
PIN_ORIGINAL_ATTR = "CoSchedPinOriginalRequirements"
#: Job attributes the sidecar sets on a Spread-n-Share proc before pinning it; the schedd
#: transform makes RequestLLCWays / RequestMemBW refer to the first two.
PIN_LLC_WAYS_ATTR = "CoSchedPinLLCWays"
PIN_MEM_BW_ATTR = "CoSchedPinMemBW"
PIN_SCALE_ATTR = "CoSchedPinScale"
#: Job attribute set to 1 on a device pin that needs the whole device (policy ``exclusive``);
#: the startd's START expression then takes the job only on an idle device (config.d/20), so
#: HTCondor itself keeps one job per device whatever the sidecar's view of the pool.
PIN_EXCLUSIVE_ATTR = "CoSchedPinExclusive"
#: Job attribute holding the time (Unix seconds) the pin was written: a start the execute
#: node refused at or after it (config.d/20's START) is not tried again on that pin.
PIN_TIME_ATTR = "CoSchedPinTime"
#: Job attribute telling the user why the job waits, is pinned or was unpinned
#: (``condor_q -af CoSchedPinReason``).
PIN_REASON_ATTR = "CoSchedPinReason"
#: A job's opt-in to node sharing (paper 001): ``+CoSchedMalleable = true`` marks a job that
#: may be a mate (its cores shrunk for a guest) or a guest (started on a mate's cores). The
#: user's attribute; the sidecar never writes it.
MALLEABLE_ATTR = "CoSchedMalleable"
#: On a guest: the job id (``Cluster.Proc``) of the mate whose cores it runs on. The node agent
#: reads it from the guest's claim (STARTD_JOB_ATTRS) and shrinks that job's cpuset.
PIN_MATE_ATTR = "CoSchedPinMate"
#: On a guest: the seconds its mate's ``AllowedExecuteDuration`` grew by (Eq. 5/6's increase).
PIN_MATE_INCREASE_ATTR = "CoSchedPinMateIncrease"
#: On a mate: its ``AllowedExecuteDuration`` before the sidecar lengthened it, and its guest
#: (``schedd#Cluster.Proc``); a job serves as a mate once.
PIN_MATE_BASE_ATTR = "CoSchedPinMateBaseDuration"
PIN_GUEST_ATTR = "CoSchedPinGuest"
#: A job's opt-in to spare capacity (paper 003): ``+CoSchedSpare = true`` marks a job that may
#: run in what a node's primary jobs measurably leave idle, in the node's overlapping SPARE slot,
#: confined by the node agent and vacated when the primaries need the room back. The user's
#: attribute; the sidecar never writes it.
SPARE_ATTR = "CoSchedSpare"
#: A job's opt-in to overcommitting (paper 004, Section 3.3): ``+CoSchedOvercommit = true`` marks
#: a job that may time-share a core with another job on a node that counts each core
#: ``CoSchedMultiplicity`` times. The user's attribute; the sidecar never writes it.
OVERCOMMIT_ATTR = "CoSchedOvercommit"
#: An overcommitting node's slot ad: the jobs each core may hold (M, Section 3.3), its startd
#: counting every core M times (``NUM_CPUS``; docs/admin.md).
MULTIPLICITY_ATTR = "CoSchedMultiplicity"
#: A running job's use as HTCondor measures it (cores on average, MB): ``plan`` reads them on a
#: snapshot without spare-capacity estimates; the live sidecar never trusts them (user-editable).
USAGE_ATTRS = ("CpusUsage", "MemoryUsage")
#: The run-time limit the shadow enforces (hold code 47); the sidecar lengthens a mate's.
EXECUTE_DURATION_ATTR = "AllowedExecuteDuration"
#: The longest run-time limit the sidecar reads or writes (HTCondor keeps it in a 32-bit int).
MAX_EXECUTE_DURATION_S = 2**31 - 1


def duration_s(value: object) -> int | None:
    """``value`` as a run-time limit the sidecar may read or write back: a whole number of
    seconds in 1..``MAX_EXECUTE_DURATION_S`` (a real is truncated); None for anything else."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value:
        return None
    return int(value) if 1 <= value <= MAX_EXECUTE_DURATION_S else None
#: On a GPU job (issue 13): the GPUs of its pinned GPU node slot it takes ("0,3": indices), and
#: what it takes of each (MB, thousandths of a GPU). The schedd transform (config.d/10) turns
#: them into the claim's ``RequestCoSchedGPU<k>Memory`` / ``...Compute``, so HTCondor itself
#: accounts every GPU.
PIN_GPUS_ATTR = "CoSchedPinGPUs"
#: A GPU job's constraint on the GPU model, set by an ordinary submit file
#: (``My.CoSchedRequireGPUs = "Capability >= 9.0"``): condor_submit drops ``require_gpus``
#: without ``request_GPUs``, so a GPU share carries its constraint in an attribute of ours.
GPU_CONSTRAINT_ATTR = "CoSchedRequireGPUs"
#: The GPU properties such a constraint (and ``require_gpus``) may name, as HTCondor's
#: ``AvailableGPUs`` spells them; the execute node advertises each GPU's.
GPU_PROPERTIES = ("DeviceName", "Capability", "GlobalMemoryMb", "DeviceUuid")
PIN_GPU_MEMORY_ATTR = "CoSchedPinGPUMemory"
PIN_GPU_COMPUTE_ATTR = "CoSchedPinGPUCompute"
#: Compute of a whole GPU in a GPU request (thousandths).
WHOLE_GPU = 1000
#: The largest GPU compute overcommit a node may advertise (``gpu_compute_overcommit``: MPS
#: time-shares a GPU's SMs, so its compute is soft up to this many whole GPUs).
MAX_GPU_COMPUTE_OVERCOMMIT = 4.0
#: The clause that makes a co-scheduled job match only the slot its pin names.
PIN_CLAUSE = f"(TARGET.Name =?= MY.{PIN_SLOT_ATTR})"
#: A GPU job's clause (config.d/10's CoSchedGPU transform): the pin, or, for an unpinned job
#: of whole GPUs without a model constraint of ours, any slot that is not a condor_sched GPU
#: node: a GPU node left under HTCondor's own GPU allocation runs whole-GPU jobs as before.
#: A share (GPU memory or compute asked) matches only its pin.
GPU_PIN_CLAUSE = (f"(TARGET.Name =?= MY.{PIN_SLOT_ATTR} || (MY.{PIN_SLOT_ATTR} =?= undefined"
                  f" && (MY.RequestGPUMemory ?: 0) <= 0 && (MY.RequestGPUCompute ?: 0) <= 0"
                  f" && MY.{GPU_CONSTRAINT_ATTR} =?= undefined && TARGET.CoSchedGPUNode =!= true))")


def partitionable_slot_of(slot_name: str) -> str:
    """``slot2_7@node1@host`` (a dynamic slot) -> ``slot2@node1@host``, its partitionable slot."""
    head, at, rest = slot_name.partition("@")
    return head.split("_", 1)[0] + at + rest


class JobStatus(enum.IntEnum):
    """HTCondor's JobStatus codes."""

    IDLE = 1
    RUNNING = 2
    REMOVED = 3
    COMPLETED = 4
    HELD = 5
    TRANSFERRING_OUTPUT = 6
    SUSPENDED = 7


@dataclass(frozen=True, slots=True)
class Resources:
    """An amount of every resource condor_sched accounts, with units in the names.

    Device resources are those of one device (paper 002): its memory, and its compute in the
    unit of its kind (``device_kinds``: hardware threads for a Xeon Phi). LLC ways and memory
    bandwidth are those of one socket's last-level cache (paper 000).
    """

    cpus: int = 0
    memory_mb: int = 0
    device_memory_mb: int = 0
    device_threads: int = 0
    llc_ways: int = 0
    mem_bw_gbs: float = 0.0

    def fits_in(self, capacity: Resources) -> bool:
        """True when every amount here is at most the same amount in ``capacity``."""
        return all(getattr(self, f.name) <= getattr(capacity, f.name) for f in fields(self))

    def __add__(self, other: Resources) -> Resources:
        return Resources(**{f.name: getattr(self, f.name) + getattr(other, f.name) for f in fields(self)})

    def __sub__(self, other: Resources) -> Resources:
        return Resources(**{f.name: getattr(self, f.name) - getattr(other, f.name) for f in fields(self)})


class _JobKeyFields(NamedTuple):
    schedd: str
    cluster: int
    proc: int


class JobKey(_JobKeyFields):
    """A job's identity: ids repeat across schedds, so the schedd is part of it. A named
    tuple (immutable, ordered by schedd, cluster, proc): every cycle hashes and compares
    keys millions of times, and a tuple does both without running Python code."""

    __slots__ = ()

    @property
    def job_id(self) -> str:
        return f"{self.cluster}.{self.proc}"

    def __str__(self) -> str:
        return f"{self.schedd}#{self.job_id}"


@dataclass(frozen=True, slots=True)
class GpuRequest:
    """What a GPU job asks of each of its GPUs (issue 13): ``count`` GPUs of one node
    (``request_GPUs``; a share is one GPU), ``compute`` thousandths of each
    (``request_GPUCompute``; 1000 = whole), ``memory_mb`` of each (``request_GPUMemory``;
    None: the whole GPU's memory), and the GPU models its ``require_gpus`` accepts (None: any)."""

    count: int = 1
    compute: int = WHOLE_GPU
    memory_mb: int | None = None
    models: frozenset[str] | None = None

    @property
    def shares(self) -> bool:
        return self.count == 1 and self.compute < WHOLE_GPU


@dataclass(frozen=True, slots=True)
class Gpu:
    """One GPU of a GPU node slot, with what HTCondor's accounting has free of it
    (``CoSchedGPU<k>Memory`` / ``...Compute`` of the partitionable slot)."""

    index: int
    uuid: str
    model: str
    memory_mb: int
    free_memory_mb: int
    free_compute: int
    compute: int = WHOLE_GPU
    capability: float = 0.0


@dataclass(frozen=True, slots=True)
class GpuClaim:
    """A dynamic slot of a GPU node claimed for a job that has not started in it yet (the
    partitionable slot's ``Child*`` lists: State Claimed, Activity Idle): its name, its user
    (``RemoteOwner`` without the domain), when it entered the Claimed state and what it holds,
    (GPU index, memory MB, compute) per GPU. Its shares are already out of the free amounts."""

    name: str
    owner: str
    claimed_at_s: int
    shares: tuple[tuple[int, int, int], ...]


@dataclass(frozen=True, slots=True)
class Job:
    """A queued or running job, as the planners see it."""

    key: JobKey
    owner: str
    status: JobStatus
    request: Resources
    submitted_at_s: int = 0
    pinned_slot: str | None = None
    pinned_cycle: int | None = None
    has_pin_clause: bool = False
    program: str = ""
    spread: bool = False
    #: The device kind (``condor_sched.device_kinds``) whose memory the job requests; None for CPU jobs.
    device_kind: str | None = None
    slowdown_threshold: float = 0.9
    remote_slot: str | None = None
    started_at_s: int | None = None
    #: The run time the user asked for (``AllowedExecuteDuration``, which the shadow enforces).
    requested_runtime_s: int | None = None
    #: The run time a source knows or predicts (the simulator's workload); None on a live pool.
    expected_runtime_s: float | None = None
    #: Who the job's share is accounted to (the negotiator's submitter: ``AccountingGroup``,
    #: else ``User``, else the owner), and the user's own order of their jobs (``JobPrio``).
    submitter: str = ""
    job_prio: int = 0
    #: The sidecar's last word to the user (``CoSchedPinReason``), as the ad holds it.
    pin_reason: str | None = None
    #: Why the execute node refused to start the job on its current pin (the PREPARE_JOB hook
    #: sent it back to Idle after the pin was written); None when it did not.
    start_refused: str | None = None
    #: The PREPARE_JOB hook's reason when it last sent this idle job back to Idle, pinned or not.
    hook_refusal: str | None = None
    #: ``+CoSchedMalleable = true``: the job takes part in node sharing (paper 001).
    malleable: bool = False
    #: ``+CoSchedSpare = true``: the job runs in spare capacity (paper 003).
    spare: bool = False
    #: ``+CoSchedOvercommit = true``: the job may time-share a core (paper 004).
    overcommit: bool = False
    #: A GPU job's request (issue 13); None for other jobs.
    gpu: GpuRequest | None = None
    #: A GPU job's pinned GPUs (``CoSchedPinGPUs``), and a running one's GPUs.
    pinned_gpus: tuple[int, ...] = ()
    #: When the sidecar wrote the pin (``CoSchedPinTime``, Unix seconds); None when unknown.
    pinned_at_s: int | None = None
    #: The job's executable as its ad names it (``Cmd``): with its schedd and Owner, what the
    #: interference guard (paper 004) recognises a program by once a node agent has read the
    #: binary it runs; never trusted as the program itself.
    executable: str = ""
    attributes: Mapping[str, Any] = field(default_factory=dict, compare=False, repr=False)

    @property
    def uses_device(self) -> bool:
        """A job is co-scheduled on devices when it requests device memory (issue 3)."""
        return self.request.device_memory_mb > 0

    @property
    def wants_spread(self) -> bool:
        """A job is spread and shared by Spread-n-Share when it names its program
        (``+CoSchedProgram``) and requests neither device memory nor a GPU (issue 5)."""
        return self.spread and not self.uses_device and self.gpu is None

    @property
    def sharing_mode(self) -> str | None:
        """The one way condor_sched shares this job, whatever else its ad asks: device
        memory first (``devices``), then a GPU request (``gpus``), then a named program
        (``spread``), then ``+CoSchedMalleable`` (``mates``), then ``+CoSchedSpare``
        (``spare``), then ``+CoSchedOvercommit`` (``overcommit``); None for other jobs. Each
        part of a cycle plans only its own, so no job is pinned twice in one cycle."""
        if self.uses_device:
            return "devices"
        if self.gpu is not None:
            return "gpus"
        if self.spread:
            return "spread"
        if self.malleable:
            return "mates"
        if self.spare:
            return "spare"
        return "overcommit" if self.overcommit else None

    @property
    def is_idle(self) -> bool:
        return self.status is JobStatus.IDLE


#: Job states that hold a claim (a dynamic slot).
HOLDS_A_SLOT = frozenset({JobStatus.RUNNING, JobStatus.TRANSFERRING_OUTPUT, JobStatus.SUSPENDED})


class SlotKind(str, enum.Enum):
    DEVICE = "device"
    SOCKET = "socket"
    #: A whole CPU node of ``total.cpus`` cores, shared by node-sharing policies (paper 001).
    NODE = "node"
    #: A whole GPU node: all its cores and memory, and every GPU's memory and compute as
    #: custom resources HTCondor accounts (issue 13; ``Slot.gpus``).
    GPU_NODE = "gpu-node"
    #: A NODE slot's overlapping twin (paper 001's live mapping): it opens only to a pinned
    #: guest, which runs on cores its mate gives up. Never planned as capacity.
    GUEST = "guest"
    #: A node's overlapping twin of its primary slots (paper 003): it runs only pinned
    #: spare-capacity jobs, within what the node agent publishes as spare (``Slot.spare``).
    SPARE = "spare"
    #: An overcommitting node's slot (paper 004): its startd counts each core ``multiplicity``
    #: times; it runs the jobs pinned to it that opted in to overcommitting.
    OVERCOMMIT = "overcommit"


@dataclass(frozen=True, slots=True)
class SpareCapacity:
    """What a node's primary jobs leave idle, as its node agent publishes it (paper 003,
    Algorithm 1): ``cpus`` = C - (Q + xi) of its CPU use in cores, ``memory_mb`` the same of its
    memory, at ``confidence`` (the share of the window the primaries stayed at or under Q + xi),
    estimated from ``samples`` samples at ``updated_at_s``; ``problem`` says why the node takes
    no spare-capacity job now (None: it does)."""

    cpus: float
    memory_mb: int
    confidence: float = 0.8
    samples: int = 0
    updated_at_s: int = 0
    problem: str | None = None
    #: The spare jobs its agent asked the startd to vacate (``CoSchedSpareEvict_<slot>``):
    #: job id (``Cluster.Proc``) -> why.
    evictions: Mapping[str, str] = field(default_factory=dict)
    #: Such requests whose claims have ended, kept a while (``CoSchedSpareVacated_<c>_<p>``):
    #: job id -> (unix time of the request, why).
    vacated: Mapping[str, tuple[int, str]] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Slot:
    """One partitionable slot: a coprocessor, a socket, a whole node or a node's guest slot.

    ``total`` is what the slot was configured with, ``free`` what is left after the
    dynamic slots of running jobs (HTCondor's own accounting).
    """

    name: str
    machine: str
    kind: SlotKind
    total: Resources
    free: Resources
    device_name: str | None = None
    cache_id: int | None = None
    #: The device kind of a DEVICE slot (``condor_sched.device_kinds``).
    device_kind: str | None = None
    updated_at_s: int = 0
    #: Names of the dynamic slots already out of ``free`` (the ad's ``ChildName``); None when
    #: the ad does not say, and then only ``updated_at_s`` tells a stale ad.
    children: tuple[str, ...] | None = None
    #: Why the slot takes no new job now (draining, Owner state, offline); None when it does.
    unavailable: str | None = None
    #: A GPU_NODE slot's GPUs, by index.
    gpus: tuple[Gpu, ...] = ()
    #: A GPU node that runs every job under one execute account (``CoSchedGPUSingleAccount``):
    #: one MPS server serves every Owner there, so its GPUs may hold shares of several Owners.
    gpu_single_account: bool = False
    #: A SPARE slot's node: what its agent publishes as spare now (None: nothing published).
    spare: SpareCapacity | None = None
    #: A GPU_NODE slot's claims whose jobs have not started yet (an idle pinned job's own claim
    #: may be one: ``modes/gpus/live``); () when none, or when the ad's ``Child*`` lists do not read.
    waiting_gpu_claims: tuple[GpuClaim, ...] = ()
    #: The Owner and the sha256 of the binary of each job running on the slot's node, by
    #: ``Cluster.Proc``, as the node agent read them as root (``CoSchedJobExe_<cluster>_<proc>``,
    #: paper 004).
    running_exes: Mapping[str, tuple[str, str]] = field(default_factory=dict)
    #: An OVERCOMMIT slot's M: the jobs each of its cores may hold (its total counts each core
    #: M times); 1 for every other slot.
    multiplicity: int = 1

    def with_free(self, free: Resources) -> Slot:
        return replace(self, free=free)


@dataclass(frozen=True, slots=True)
class Skipped:
    """A job or slot left out of planning, and why (bad input never crashes a cycle)."""

    what: str
    reason: str
    job: JobKey | None = None
    pinned_slot: str | None = None
    #: An idle job (the sidecar holds it with ``reason``, or it would never run).
    idle: bool = False

    def __str__(self) -> str:
        return f"{self.what}: {self.reason}"


@dataclass(frozen=True, slots=True)
class Assignment:
    """One planned placement; ``details`` carries policy extras (e.g. SNS scale factor)."""

    job: JobKey
    slot: str
    details: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Unplaced:
    job: JobKey
    reason: str


@dataclass(frozen=True, slots=True)
class Plan:
    policy: str
    assignments: tuple[Assignment, ...]
    unplaced: tuple[Unplaced, ...] = ()
    stats: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class NodeMeasurements:
    """What a node agent measured on one node, published through a channel only root can
    write (no agent publishes one yet: the trust-nothing work adds the channel).
    ``jobs`` holds each running job's measured use."""

    node: str
    measured_at_s: int
    jobs: Mapping[JobKey, Resources] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class RunningJob:
    """A job holding a dynamic slot, as planners see it: where it runs, since when, how long
    it asked for and is expected to take, and what it was measured to use."""

    job: Job
    slot: str
    node: str
    started_at_s: int | None
    requested_runtime_s: int | None = None
    expected_runtime_s: float | None = None
    measured: Resources | None = None


@dataclass(frozen=True, slots=True)
class PoolState:
    """One observation of the pool, whatever its source (live pool, snapshot, simulator):
    jobs of every status, partitionable slots, node measurements and what was skipped.

    ``eligible`` maps a job to the slots its own Requirements accept (evaluated by the
    ClassAd adapter); a job missing from it may use every slot. ``exploration_scales`` is
    the piggyback-profiling scale of each unprofiled program (from the node agents' run
    records). ``unreachable_schedds`` names the schedds a live read could not see (gone
    from the collector or not answering): their jobs are missing from ``jobs``."""

    jobs: tuple[Job, ...]
    slots: tuple[Slot, ...]
    skipped: tuple[Skipped, ...] = ()
    eligible: Mapping[JobKey, frozenset[str]] = field(default_factory=dict)
    nodes: Mapping[str, NodeMeasurements] = field(default_factory=dict)
    exploration_scales: Mapping[str, int] = field(default_factory=dict)
    #: The negotiator's effective priority of each submitter (lower is better, HTCondor's
    #: convention); a submitter missing from it has the default, 0.5.
    user_priorities: Mapping[str, float] = field(default_factory=dict)
    #: Each job's ``Rank`` of the slots (higher preferred), for jobs whose Rank prefers some.
    ranks: Mapping[JobKey, Mapping[str, float]] = field(default_factory=dict)
    unreachable_schedds: tuple[str, ...] = ()
    #: When the source observed the pool (Unix seconds; None: a snapshot that does not say).
    observed_at_s: float | None = None
    #: Interference profiles (paper 004) the node agents recorded from exclusive runs, by
    #: (Owner, sha256 of the executable): each signal's median over the program's records.
    program_profiles: Mapping[tuple[str, str], Mapping[str, float]] = field(default_factory=dict)

    def idle_jobs(self) -> tuple[Job, ...]:
        return tuple(j for j in self.jobs if j.is_idle)
