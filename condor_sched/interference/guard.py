"""Keeping pairs the interference model predicts ill-matched apart (paper 004, Sections 3.3 and
6.4), in every mode that pins a job (``COSCHED_INTERFERENCE = true``): the slot modes narrow and
admit whole plans, the GPU and mates modes :meth:`CycleGuard.claim` pin by pin. Pure.

What a program is: the job's Owner and the sha256 of the binary it runs. What runs on a node,
every claim's job whether a mode covers it or not, is what the node's agent read as root
(``Slot.running_exes``: owner and hash per running job); an idle job's program is the hash last
read for a running job of the same schedd, Owner and ``Cmd`` (``CycleMemory.exes``, learned
cycle by cycle): the ad's words choose which root observation applies, never what the program
is. A program without a profile (never run alone on a node, or not yet seen running) is allowed: the
model does not guess.

A job that started since its node last advertised (the startd cron runs every 30 s) is
known the way an idle job is, by its schedd, Owner and ``Cmd``.

The unit kept apart is the node: jobs on one node share its last-level cache and memory
bandwidth whatever device, socket or cores each holds, so the model is the ``separate``
placement's, fitted on the measured dataset from the software signals a node agent records
(no probes: a live job is never run beside a bubble). Before a mode plans, each idle job loses
the slots of every node where a running job or a pin (kept from an earlier cycle, or made this
cycle by a mode planned before) forms a pair the model judges ill-matched with it (a dangerous
program, or Pr(Ev > t) past the cut-off either way); after it plans, a pin that would form such
a pair with a pin made earlier in the same plan is taken back. The job's reason names the pair.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from condor_sched.interference.model import DEFAULT_EV_THRESHOLD, DEFAULT_PROB_CUTOFF, InterferenceModel, Verdict
from condor_sched.model import Job, JobKey, Plan, PoolState, RunningJob, Slot, Unplaced

PLACEMENT = "separate"
#: One core time-shared (the overcommit mode's jobs past one per core).
SHARED = "shared"
#: Idle jobs' executables remembered at most (the oldest observation goes first).
MAX_EXES = 10000
ExeKey = tuple[str, str, str]


@dataclass(frozen=True)
class InterferenceSetting:
    """``COSCHED_INTERFERENCE``: the fitted models of pairs on one node (``model``, separate
    vCPUs) and on one time-shared core (``shared``, for the overcommit mode), and their source."""

    model: InterferenceModel
    source: str
    shared: InterferenceModel | None = None

    @classmethod
    def from_dataset(cls, path: Path | str, prob_cutoff: float = DEFAULT_PROB_CUTOFF) -> InterferenceSetting:
        """Fit phase 1 and 2 on a measured dataset's pairs of each placement, software signals only."""
        from condor_sched.interference.dataset import load_dataset

        return cls.from_data(load_dataset(path), str(path), prob_cutoff)

    @classmethod
    def from_data(cls, data: Any, source: str, prob_cutoff: float = DEFAULT_PROB_CUTOFF) -> InterferenceSetting:
        """:meth:`from_dataset` on a dataset already loaded (``dataset.Dataset``)."""
        from condor_sched.interference.dataset import pair_records, program_features
        from condor_sched.interference.model import ModelSettings, fit_model

        signals = program_features(data)
        profiles = {name: signals[name] for name in data.programs if name in signals}
        records = pair_records(data)
        models = {}
        for placement in (PLACEMENT, SHARED):
            mine = [r for r in records if r.placement == placement]
            if mine:
                settings = ModelSettings(DEFAULT_EV_THRESHOLD[placement], prob_cutoff, features="software")
                models[placement] = fit_model(mine, profiles, placement, settings)
        if PLACEMENT not in models:
            raise ValueError(f"{source}: no pairs measured on separate vCPUs")
        return cls(models[PLACEMENT], source, models.get(SHARED))


def program_name(key: tuple[str, str]) -> str:
    owner, exe = key
    return f"{owner}/{exe[:12]}"


def running_exe(run: RunningJob, slots_of: Mapping[str, Sequence[Slot]]) -> str | None:
    """The hash the node's agent read for a running job of the sidecar's (None: not published,
    or published for another Owner: a job of another schedd with the same id)."""
    for slot in slots_of.get(run.node, ()):
        entry = slot.running_exes.get(run.job.key.job_id)
        if entry is not None and entry[0] == run.job.owner:
            return entry[1]
    return None


def learn_exes(known: Mapping[ExeKey, str], running: Iterable[RunningJob],
               slots_of: Mapping[str, Sequence[Slot]]) -> dict[ExeKey, str]:
    """``known`` with what this cycle's running jobs run, by (schedd, Owner, Cmd)."""
    out = dict(known)
    for run in running:
        exe = running_exe(run, slots_of)
        if exe is not None and run.job.executable:
            key = (run.job.key.schedd, run.job.owner, run.job.executable)
            out.pop(key, None)
            out[key] = exe
    while len(out) > MAX_EXES:
        del out[next(iter(out))]
    return out


class CycleGuard:
    """One cycle's view of which program runs or is pinned on each node, and the verdicts."""

    def __init__(self, setting: InterferenceSetting, state: PoolState, running: Sequence[RunningJob],
                 known_exes: Mapping[ExeKey, str]) -> None:
        self.profiles = set(state.program_profiles)
        named = {program_name(k): v for k, v in state.program_profiles.items()}
        self.model = setting.model.with_profiles(named)
        #: The time-shared model (None: the dataset measured no time-shared pairs).
        self.shared = setting.shared.with_profiles(named) if setting.shared is not None else None
        self.slots_of: dict[str, list[Slot]] = {}
        for slot in state.slots:
            self.slots_of.setdefault(slot.machine, []).append(slot)
        #: What idle jobs run, learned up to this cycle (the next cycle's ``CycleMemory.exes``).
        self.exes = learn_exes(known_exes, running, self.slots_of)
        self.machine_of = {slot.name: slot.machine for slot in state.slots}
        #: Per node, what runs or is pinned there: (who, program, its ClusterId).
        self.members: dict[str, list[tuple[str, str, int]]] = {}
        self._verdicts: dict[tuple[str, str, str], Verdict] = {}
        for node, slots in self.slots_of.items():
            running_there = {job: entry for slot in slots for job, entry in slot.running_exes.items()}
            for job, key in sorted(running_there.items()):
                if key in self.profiles:
                    self.members.setdefault(node, []).append((f"job {job}", program_name(key), int(job.split(".")[0])))
        for run in running:   # started since its node last advertised: known by its Cmd, as idle jobs
            if running_exe(run, self.slots_of) is None and (name := self.program_of(run.job)) is not None:
                self.members.setdefault(run.node, []).append((f"job {run.job.key.job_id}", name, run.job.key.cluster))

    def program_of(self, job: Job) -> str | None:
        """The job's program when it has a profile (module docstring), else None."""
        exe = self.exes.get((job.key.schedd, job.owner, job.executable)) if job.executable else None
        key = (job.owner, exe) if exe is not None else None
        return program_name(key) if key in self.profiles else None

    def note_pin(self, job: Job, slot: str) -> None:
        """A pin (kept or new) now holds ``job`` on ``slot``'s node."""
        name, node = self.program_of(job), self.machine_of.get(slot)
        if name is not None and node is not None:
            self.members.setdefault(node, []).append((f"job {job.key.job_id}", name, job.key.cluster))

    def refuses(self, job: Job, slot: str) -> str | None:
        """Why ``job`` may not join ``slot``'s node now (module docstring), or None."""
        name, node = self.program_of(job), self.machine_of.get(slot)
        return None if name is None or node is None else self.refusal(name, node, job.key.cluster)

    def claim(self, job: Job, slot: str) -> str | None:
        """For a mode that pins one job at a time (GPU shares, a mate's guest): why ``job`` may
        not be pinned to ``slot``, or None, and then the pin is noted on its node."""
        why = self.refuses(job, slot)
        if why is None:
            self.note_pin(job, slot)
        return why

    def displaced(self, job: Job) -> str | None:
        """Why an idle job's kept pin no longer stands: a job it is ill-matched with runs on the
        pinned slot's node now (started there outside condor_sched, or before its node
        advertised it); asked before any pin is noted, so only running jobs count."""
        return self.refuses(job, job.pinned_slot or "")

    def verdict(self, a: str, b: str, placement: str = PLACEMENT) -> Verdict:
        """The pair's verdict on separate vCPUs of a node, or time-sharing one (``SHARED``; the
        separate model's when no time-shared pairs were measured). Probabilities in the order
        asked."""
        key = (placement, a, b) if a <= b else (placement, b, a)
        if key not in self._verdicts:
            model = self.shared if placement == SHARED and self.shared is not None else self.model
            self._verdicts[key] = model.judge(*key[1:])
        v = self._verdicts[key]
        return v if a <= b else Verdict(v.ill_matched, v.reason, v.probability_ba, v.probability_ab)

    def refusal(self, name: str, node: str, cluster: int | None = None) -> str | None:
        """Why the program ``name`` may not join ``node`` (the first ill-matched pair), or None.
        The procs of one cluster (``cluster``) are one submission of one program and never
        refuse each other: a user who queues them together asks them to run together."""
        for label, other, their_cluster in self.members.get(node, ()):
            if their_cluster == cluster:
                continue
            verdict = self.verdict(name, other)
            if verdict.ill_matched:
                return f"the interference model keeps it off {node}, where {label} runs {other}: {verdict.reason}"
        return None

    def narrow(self, eligible: Mapping[JobKey, frozenset[str]], jobs: Sequence[Job],
               slots: Sequence[Slot]) -> tuple[Mapping[JobKey, frozenset[str]], dict[JobKey, str]]:
        """Each job's eligible slots without the nodes it may not join, and why for each job
        that lost one (the first such node's pair). Verdicts are taken once per program, cluster
        and node with members, so a queue of many jobs of few programs costs little."""
        offered: dict[str, list[str]] = {}
        for slot in slots:
            offered.setdefault(slot.machine, []).append(slot.name)
        crowded = [node for node in offered if node in self.members]
        out: dict[JobKey, frozenset[str]] | None = None
        why: dict[JobKey, str] = {}
        refused_for: dict[tuple[str, int], tuple[frozenset[str], dict[str, str]]] = {}
        all_names = frozenset(s.name for s in slots)
        for job in jobs:
            name = self.program_of(job)
            if name is None or not crowded:
                continue
            whose = (name, job.key.cluster)
            if whose not in refused_for:
                refusals = {node: r for node in crowded if (r := self.refusal(name, node, job.key.cluster)) is not None}
                refused_for[whose] = (frozenset(n for node in refusals for n in offered[node]), refusals)
            off, refusals = refused_for[whose]
            allowed = eligible.get(job.key, all_names)
            if off.isdisjoint(allowed):
                continue
            out = dict(eligible) if out is None else out
            out[job.key] = allowed - off
            why[job.key] = next(r for node, r in refusals.items() if not allowed.isdisjoint(offered[node]))
        return (eligible if out is None else out), why

    def admit(self, plan: Plan, jobs: Sequence[Job], gang: bool = False) -> tuple[Plan, dict[JobKey, str]]:
        """``plan`` without the pins that form an ill-matched pair with one made before them in
        it (those become unplaced, with why); the rest noted as their nodes' members. ``gang``:
        a cluster's procs are pinned together or not at all (a spread job starts whole), so a
        cluster losing one pin loses them all."""
        by_key = {job.key: job for job in jobs}
        before = {node: list(members) for node, members in self.members.items()}
        why: dict[JobKey, str] = {}
        for assignment in plan.assignments:
            job = by_key.get(assignment.job)
            name = self.program_of(job) if job is not None else None
            node = self.machine_of.get(assignment.slot)
            reason = self.refusal(name, node, assignment.job.cluster) if name is not None and node is not None else None
            if reason is not None:
                why[assignment.job] = reason
            elif job is not None:
                self.note_pin(job, assignment.slot)
        if not why:
            return plan, why
        if gang:
            lost = {(key.schedd, key.cluster): reason for key, reason in why.items()}
            for assignment in plan.assignments:
                cluster = (assignment.job.schedd, assignment.job.cluster)
                if cluster in lost and assignment.job not in why:
                    why[assignment.job] = f"another proc of its job was refused: {lost[cluster]}"
            self.members = before   # the noted pins of a lost cluster are not on their nodes
            for assignment in plan.assignments:
                if assignment.job not in why and (job := by_key.get(assignment.job)) is not None:
                    self.note_pin(job, assignment.slot)
        kept = tuple(a for a in plan.assignments if a.job not in why)
        dropped = tuple(Unplaced(key, f"waiting: {reason}") for key, reason in why.items())
        return replace(plan, assignments=kept, unplaced=(*plan.unplaced, *dropped)), why
