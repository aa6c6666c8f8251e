"""Where one job goes among the cores of the nodes (pure): the overcommitting planners.

Paper 004, Section 3.3, step 3: "the scheduler scans running jobs on compute nodes and predicts
the mutual performance degradation if job 0 is added on each node. The scheduler chooses a
node, on which performance degradation is smallest", and (for interactive jobs) avoids nodes
where dangerous jobs run. A core holds at most ``multiplicity`` jobs (M, Section 3.3: "M
multiplicity"; 2, as the paper's SMT measurements). A job beside another on its core shares
it time-sliced (placement ``shared``); beside one on another core of its node it shares the
node's cache and memory bandwidth (``separate``). The candidate's predicted degradation is the
largest Pr(Ev > t) of the pairs it would form, both ways; a candidate where any pair is judged
ill-matched (a dangerous program, or a probability past the cut-off) is refused, and a job no
candidate takes waits with the first refusal as its reason.

* ``overcommit``: a free core while one passes the model (Section 3.2: a core is overcommitted
  only "when demands for processor cores are larger than physical cores"), else a core below
  M; among those, the least predicted degradation, then the emptiest core and node, then order;
* ``naive``: the emptiest core below M, no model (the paper's motivation: sharing
  blind to job characteristics);
* ``exclusive``: the emptiest core with no job (M = 1), no model; HTCondor's default of one
  job per core.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from condor_sched.interference.model import Verdict

DEFAULT_MULTIPLICITY = 2


@dataclass(frozen=True)
class Core:
    """One core (vCPU) of a node and the programs of the jobs it runs now."""

    node: str
    index: int
    programs: tuple[str, ...] = ()

    @property
    def label(self) -> str:
        return f"{self.node} cpu {self.index}"


class Judge(Protocol):
    """The model's verdict on two programs sharing in a placement (``shared`` or ``separate``)."""

    def __call__(self, a: str, b: str, placement: str) -> Verdict: ...


@dataclass(frozen=True)
class Choice:
    """A core for the job, or None and why it waits."""

    core: Core | None
    reason: str
    predicted: float = 0.0


def node_cores(cores: Sequence[Core]) -> dict[str, list[Core]]:
    by_node: dict[str, list[Core]] = {}
    for core in cores:
        by_node.setdefault(core.node, []).append(core)
    return by_node


def _load(core: Core, by_node: Mapping[str, Sequence[Core]]) -> tuple[int, int]:
    return len(core.programs), sum(len(c.programs) for c in by_node[core.node])


def choose_blind(cores: Sequence[Core], multiplicity: int) -> Choice:
    """The emptiest core (then node, then order) holding fewer than ``multiplicity`` jobs."""
    by_node = node_cores(cores)
    open_cores = [c for c in cores if len(c.programs) < multiplicity]
    if not open_cores:
        return Choice(None, f"waiting: every core runs {multiplicity} job{'s' if multiplicity > 1 else ''}")
    return Choice(min(open_cores, key=lambda c: _load(c, by_node)), "")


def choose_core(program: str, cores: Sequence[Core], multiplicity: int, judge: Judge) -> Choice:
    """Section 3.3's step 3 for one job running ``program`` (module docstring)."""
    by_node = node_cores(cores)
    best: tuple | None = None
    first_refusal = ""
    refused = 0
    for core in cores:
        if len(core.programs) >= multiplicity:
            continue
        worst, why = 0.0, ""
        for other in by_node[core.node]:
            placement = "shared" if other is core else "separate"
            for opponent in other.programs:
                verdict = judge(program, opponent, placement)
                if verdict.ill_matched:
                    why = f"beside {opponent} on {core.label}: {verdict.reason}"
                    break
                worst = max(worst, verdict.probability_ab, verdict.probability_ba)
            if why:
                break
        if why:
            refused += 1
            first_refusal = first_refusal or why
            continue
        key = (bool(core.programs), worst, *_load(core, by_node))
        if best is None or key < best[0]:
            best = (key, core)
    if best is not None:
        return Choice(best[1], "", best[0][1])
    if not first_refusal:
        return Choice(None, f"waiting: every core runs {multiplicity} jobs")
    more = f" (and {refused - 1} more cores refused)" if refused > 1 else ""
    return Choice(None, f"waiting: interference model refuses {first_refusal}{more}")


POLICIES = ("exclusive", "naive", "overcommit")


def place(policy: str, program: str, cores: Sequence[Core], judge: Judge,
          multiplicity: int = DEFAULT_MULTIPLICITY) -> Choice:
    """The core ``policy`` gives a job running ``program`` (module docstring)."""
    if policy == "exclusive":
        return choose_blind(cores, 1)
    if policy == "naive":
        return choose_blind(cores, multiplicity)
    if policy == "overcommit":
        return choose_core(program, cores, multiplicity, judge)
    raise ValueError(f"unknown overcommit policy {policy!r}: one of {', '.join(POLICIES)}")
