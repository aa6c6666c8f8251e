"""What ``COSCHED_INTERFERENCE`` costs the device and spread modes (paper 004, issue 30): the
same jobs run twice through the sidecar's own cycle, with the guard off and on, and the two
makespans are compared (``simulate --interference-guard``).

What the simulated jobs run. The simulator's programs (Table I's, paper 000's twelve profiles)
were never measured beside our kernels, so each is given one kernel of the shipped dataset,
drawn per seed: every job of one program runs one binary, as a user's repeated submissions
do. The node agent's part is played as the live pool's: a running job's slot advertises its
owner and the kernel's hash (``Slot.running_exes``), the kernel's profile is its software
signals alone (``PoolState.program_profiles``), and the cycle learns idle jobs' programs by
``Cmd`` (``CycleMemory.exes``), so the guard runs exactly as ``guard.py`` does live.

Each device job is its own submission here (its own cluster): the engine's device jobs are
the procs of one cluster, and the guard never keeps a cluster's procs apart.

The runtime models know nothing of interference, so the figure is the guard's price alone
(jobs waiting for a node with no ill-matched neighbour), not its gain. Beside it, the share of
co-running time on a node spent in pairs whose *measured* label is ill-matched (Ev > 0.1 either
way, ``pair_table``), with the guard off and on. The guard's verdicts there come from the model
fitted on every measured pair, those pairs included, as the live guard's do: that share says
what the guard keeps apart, not how well the model predicts unseen pairs (``evaluate`` does).
"""
from __future__ import annotations

import hashlib
import random
import statistics
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Callable

from condor_sched.cycle import CycleDecision, CycleMemory, decide_cycle
from condor_sched.interference.guard import PLACEMENT, InterferenceSetting, program_name
from condor_sched.interference.model import Verdict
from condor_sched.model import JobKey, PoolState, partitionable_slot_of
from condor_sched.modes.planning import PlanSettings, PolicyKind
from condor_sched.modes.registry import policy_names
from condor_sched.simulate.engine import RunResult, Simulation, first_nodes
from condor_sched.simulate.offload import OffloadDevice, OffloadModel
from condor_sched.simulate.workloads import MAX_WORKLOAD_JOBS, PARALLEL_CLUSTER_OFFSET, SIM_SCHEDD, SimJob

#: The owner every simulated job has (``SimJob.to_jobs``).
OWNER = "sim"
#: Device job i is cluster i + this: clear of the parallel jobs' clusters.
DEVICE_CLUSTER_OFFSET = MAX_WORKLOAD_JOBS + PARALLEL_CLUSTER_OFFSET
#: The negotiation interval of the guard's runs: the reproduction's for both workloads (Table
#: II's calibration, paper 000's Section 6.2). A job shorter than the interval is never seen
#: running, so its program is never learned: at 60 s most of Table I's jobs are (the live
#: pool's limit too: the node agent hashes what runs when its cron fires).
GUARD_CYCLE_S = 5.0
#: The slowest a measured speed is taken to be (a pair measured at zero would never finish).
MIN_SPEED = 1e-3
#: Words every reason the guard gives contains (``guard.CycleGuard.refusal``).
GUARD_WORDS = "the interference model keeps it off"


@dataclass(frozen=True, slots=True)
class SubmittedJob(SimJob):
    """A simulated job that is its own submission: a device job has a cluster of its own."""

    @property
    def key(self) -> JobKey:
        return JobKey(SIM_SCHEDD, self.index + DEVICE_CLUSTER_OFFSET, 0)


def command_of(program: str) -> str:
    """The ``Cmd`` of a simulated program's jobs."""
    return f"/sim/bin/{program}"


def sha_of(kernel: str) -> str:
    """The hash a node agent would read for a kernel's binary (any stable one will do)."""
    return hashlib.sha256(kernel.encode()).hexdigest()


def kernels_for(programs: Sequence[str], kernels: Sequence[str], seed: int) -> dict[str, str]:
    """One measured kernel per simulated program, drawn with ``seed`` (module docstring)."""
    rng = random.Random(seed)
    return {program: rng.choice(sorted(kernels)) for program in sorted(set(programs))}


class GuardedSimulation(Simulation):
    """The engine with the node agent's interference records, and the guard on or off."""

    def __init__(self, jobs: Sequence[SimJob], inventory: Any, policy: Any, *, setting: InterferenceSetting | None,
                 kernel_of: Mapping[str, str], signals: Mapping[str, Mapping[str, float]], **options: Any) -> None:
        super().__init__(jobs, inventory, policy, **options)
        self.config = replace(self.config, interference=setting)
        self.exe_of = {program: sha_of(kernel) for program, kernel in kernel_of.items()}
        self.program_profiles = {(OWNER, sha_of(k)): signals[k] for k in set(kernel_of.values()) if k in signals}
        self.exes: Mapping[tuple[str, str, str], str] = {}
        #: Jobs told at least once that they wait because of the guard.
        self.made_to_wait: set[JobKey] = set()

    def _arrive(self, job: SimJob, now: float) -> None:
        super()._arrive(job, now)
        procs = tuple(replace(p, executable=command_of(job.program)) for p in self.proc_records[job.index])
        self.proc_records[job.index] = procs
        for proc in procs:
            self.idle_procs[proc.key] = proc

    def pool_state(self) -> PoolState:
        """The engine's state, each slot advertising what its running jobs run."""
        state = super().pool_state()
        exes: dict[str, dict[str, tuple[str, str]]] = defaultdict(dict)
        for index, procs in self.running_records.items():
            sha = self.exe_of[self.records[index].job.program]
            for proc in procs:
                exes[partitionable_slot_of(proc.remote_slot)][proc.key.job_id] = (OWNER, sha)  # type: ignore[arg-type]
        slots = tuple(replace(s, running_exes=exes[s.name]) if s.name in exes else s for s in state.slots)
        return replace(state, slots=slots, program_profiles=self.program_profiles)

    def decide(self, memory: CycleMemory) -> CycleDecision:
        decision = decide_cycle(self.pool_state(), replace(memory, exes=self.exes), self.config)
        self.exes = decision.exes
        self.made_to_wait.update(key for key, why in decision.reasons.items() if GUARD_WORDS in why)
        return decision


def job_nodes(result: RunResult, slots: Mapping[str, str]) -> list[tuple[SimJob, str, float, float]]:
    """(job, node, start, end) of each ran job on each node it held."""
    out = []
    for rec in result.jobs:
        if rec.start_s is None or rec.end_s is None:
            continue
        names = [rec.slot] if rec.slot is not None else [slot for slot, _ in rec.allocations]
        for node in sorted({slots[name] for name in names}):
            out.append((rec.job, node, rec.start_s, rec.end_s))
    return out


def ill_matched_share(result: RunResult, slots: Mapping[str, str], kernel_of: Mapping[str, str],
                      ill_matched: Mapping[tuple[str, str], bool]) -> float:
    """The share of co-running time (summed over pairs of jobs on one node) spent in pairs whose
    measured label is ill-matched; pairs of one job's procs are one program's and not counted."""
    by_node: dict[str, list[tuple[SimJob, float, float]]] = defaultdict(list)
    for job, node, start, end in job_nodes(result, slots):
        by_node[node].append((job, start, end))
    together = bad = 0.0
    for runs in by_node.values():
        runs.sort(key=lambda r: r[1])
        for i, (a, start_a, end_a) in enumerate(runs):
            for b, start_b, end_b in runs[i + 1:]:
                if start_b >= end_a:
                    break
                overlap = min(end_a, end_b) - start_b
                together += overlap
                pair = tuple(sorted((kernel_of[a.program], kernel_of[b.program])))
                bad += overlap if ill_matched.get(pair, False) else 0.0   # type: ignore[arg-type]
    return bad / together if together else 0.0


@dataclass(slots=True)
class InterferingDevice(OffloadDevice):
    """An offload device whose jobs slow each other as the measured kernels they run do on
    separate vCPUs of one node: each host phase and offload lasts its exclusive length over the
    job's speed when it starts, the product of its measured speeds beside each other resident
    (beside one, measured; beside more, the product is the overcommit simulator's stand-in)."""

    speed_of: Callable[[SimJob, list[SimJob]], float] | None = None
    residents: dict[int, SimJob] = field(default_factory=dict)

    def admit(self, job: SimJob, now: float) -> None:
        self.residents[job.index] = job
        OffloadDevice.admit(self, job, now)

    def _phase_lengths(self, job: SimJob) -> tuple[float, float]:
        host_s, offload_s = OffloadDevice._phase_lengths(self, job)
        assert self.speed_of is not None
        speed = self.speed_of(job, [j for i, j in self.residents.items() if i != job.index])
        return host_s / speed, offload_s / speed

    def _end_offload(self, o: Any, start_s: float, now: float) -> None:
        OffloadDevice._end_offload(self, o, start_s, now)
        if o.job.index not in self._done_offloads:   # its last offload: it left the device
            self.residents.pop(o.job.index, None)


@dataclass(frozen=True)
class InterferingModel:
    """The offload model with the measured slowdowns of :class:`InterferingDevice`."""

    table: Any
    kernel_of: Mapping[str, str]
    name: str = "offload-measured-slowdowns"

    def speed_of(self, job: SimJob, others: list[SimJob]) -> float:
        speed = 1.0
        for other in others:
            measured = self.table.speed(PLACEMENT, self.kernel_of[job.program], self.kernel_of[other.program])
            speed *= max(measured, MIN_SPEED) if measured is not None else 1.0
        return speed

    def device(self, hardware_threads: int, clock: Any, record: bool = False) -> InterferingDevice:
        return InterferingDevice(hardware_threads, clock, record, speed_of=self.speed_of)


@dataclass(frozen=True)
class MeasuredVerdicts:
    """The guard's model replaced by the measured labels (Ev > 0.1 either way on separate
    vCPUs): what keeping the truly ill-matched pairs apart costs, the model's false alarms
    aside. A yardstick, never a setting: live programs have no measured pairs."""

    labels: Mapping[tuple[str, str], bool]

    def with_profiles(self, profiles: Mapping[str, Mapping[str, float]]) -> MeasuredVerdicts:
        return self

    def judge(self, a: str, b: str) -> Verdict:
        ill = bool(self.labels.get((a, b) if a <= b else (b, a), False))
        return Verdict(ill, f"{a} beside {b}: measured Ev > 0.1 ({PLACEMENT})" if ill else "", float(ill), float(ill))


def measured_setting(labels: Mapping[tuple[str, str], bool], kernel_of: Mapping[str, str]) -> InterferenceSetting:
    """:class:`MeasuredVerdicts` on the guard's program names of the simulated kernels."""
    name = {k: program_name((OWNER, sha_of(k))) for k in set(kernel_of.values())}
    by_name = {tuple(sorted((name[a], name[b]))): ill for (a, b), ill in labels.items() if a in name and b in name}
    return InterferenceSetting(MeasuredVerdicts(by_name), "measured labels")  # type: ignore[arg-type]


def guard_cost(jobs: Sequence[SimJob], inventory: Any, policy: Any, setting: InterferenceSetting,
               measured: Any, seed: int, **options: Any) -> dict[str, Any]:
    """One seed's run with the guard off and on: makespans, the loss, the jobs made to wait
    and the measured ill-matched share of co-running time each way; device jobs also under the
    measured slowdowns (keys prefixed ``measured_``). ``measured``: the dataset's
    ``pair_table.PairTable`` and its software signals, as ``measured_inputs`` gives them."""
    table, signals = measured
    kernels = sorted({k for _, a, b in table.labels for k in (a, b)} & set(signals))
    submitted = [SubmittedJob(**{f: getattr(j, f) for f in SimJob.__dataclass_fields__}) for j in jobs]
    kernel_of = kernels_for([j.program for j in submitted], kernels, seed)
    ill = {(a, b): v for (placement, a, b), v in table.labels.items() if placement == PLACEMENT}
    out: dict[str, Any] = {"seed": seed, "kernels": dict(sorted(kernel_of.items()))}
    blind = options.pop("model", None)
    runtimes = [("", blind, (("off", None), ("on", setting), ("oracle", measured_setting(ill, kernel_of))))]
    if not any(j.is_parallel for j in submitted) and isinstance(blind, (OffloadModel, type(None))):
        runtimes.append(("measured_", InterferingModel(table, kernel_of), (("off", None), ("on", setting))))
    for prefix, model, guards in runtimes:
        for label, guard in guards:
            sim = GuardedSimulation(submitted, inventory, policy, setting=guard, kernel_of=kernel_of, signals=signals,
                                    seed=seed, model=model, **options)
            result = sim.run()
            slots = {name: slot.machine for name, slot in sim.slots.items()}
            out[f"{prefix}makespan_{label}_s"] = result.makespan_s
            out[f"{prefix}mean_wait_{label}_s"] = statistics.fmean(r.start_s - r.job.arrival_s for r in result.jobs)
            out[f"{prefix}ill_matched_share_{label}"] = ill_matched_share(result, slots, kernel_of, ill)
            out[f"{prefix}jobs_made_to_wait_{label}"] = len({(k.schedd, k.cluster) for k in sim.made_to_wait})
        out[f"{prefix}makespan_loss"] = out[f"{prefix}makespan_on_s"] / out[f"{prefix}makespan_off_s"] - 1.0
    out["oracle_makespan_loss"] = out["makespan_oracle_s"] / out["makespan_off_s"] - 1.0
    return out


def guard_inputs(dataset: str) -> tuple[InterferenceSetting, tuple[Any, dict[str, dict[str, float]]]]:
    """The guard's setting fitted on ``dataset`` and what it measured (:func:`measured_inputs`),
    the file read once."""
    from condor_sched.interference.dataset import load_dataset

    data = load_dataset(dataset)
    return InterferenceSetting.from_data(data, dataset), measured_inputs(data)


def measured_inputs(data: Any) -> tuple[Any, dict[str, dict[str, float]]]:
    """A loaded dataset's measured pair labels and each kernel's software signals alone."""
    from condor_sched.interference.dataset import program_features
    from condor_sched.interference.model import DEFAULT_EV_THRESHOLD
    from condor_sched.interference.pair_table import pair_table

    signals = program_features(data)
    return pair_table(data, DEFAULT_EV_THRESHOLD), {k: v for k, v in signals.items() if k in data.programs}


def guard_cost_summary(workload: str, policy: str, nodes: int, seeds: Sequence[int], dataset: str,
                      jobs: int | None = None, cycle_s: float = GUARD_CYCLE_S,
                      settings: PlanSettings | None = None) -> dict[str, Any]:
    """``simulate --interference-guard --json``: :func:`guard_cost` per seed, the means and the worst losses."""
    from condor_sched.modes.registry import get_policy
    from condor_sched.simulate.study import spec_for
    from condor_sched.simulate.workloads import is_parallel_workload, load_workload

    kind = PolicyKind.SPREAD if is_parallel_workload(workload) else PolicyKind.DEVICE
    if getattr(get_policy(policy), "kind", PolicyKind.DEVICE) is not kind:
        raise ValueError(f"--interference-guard on {workload} takes a {kind.value} policy "
                         f"({', '.join(policy_names(kind))}), not {policy!r}")
    setting, measured = guard_inputs(dataset)
    spec = spec_for(workload, policy, cycle_s, settings, nodes=nodes)
    runs = []
    for seed in seeds:
        work = load_workload(workload, jobs, seed)
        runs.append(guard_cost(work.jobs, first_nodes(spec.inventory, nodes), get_policy(policy), setting, measured,
                               seed, cycle_s=spec.cycle_s, model=spec.model, settings=spec.settings,
                               profiles=spec.profiles))
    keys = [k for k, v in runs[0].items() if isinstance(v, (int, float)) and k != "seed"]
    means = {k: statistics.fmean(r[k] for r in runs) for k in keys}
    worst = {f"max_{k}": max(r[k] for r in runs) for k in keys if k.endswith("makespan_loss")}
    return {"workload": workload, "policy": policy, "nodes": nodes, "cycle_s": cycle_s, "dataset": dataset, **means,
            **worst, "seeds": runs}
