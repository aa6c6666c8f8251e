"""The agent's record of each running job it knows, one per starter, kept in DIR/jobs.json.

Everything in a record comes from the slot view (the startd's claim) and /proc, plus what
the agent itself decided (the device compute units it placed the job on, the CPUs of a
node-slot or guest claim, a guest's mate, the cgroup it found for the claim) and saw (its
watch of a spread job's co-runners and perf samples). No job can write any of it. Records
of a starter that ended are dropped (a spread job's run record is written first), so an
agent restart resumes with the placements of the jobs still running.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

from cosched_node import rules
from cosched_node.gpus import MAX_GPU_COMPUTE, MAX_GPUS_PER_NODE, GpuShare
from cosched_node.placement import Units, parse_units
from cosched_node.slots import Claim
from cosched_node.state import JOBS_NAME, read_json, write_json_atomic

WATCH_KEYS = ("instructions", "cycles", "imc_bytes", "imc_seconds")
KEY_RE = re.compile(r"^\d{1,7}:\d{1,19}$")
MAX_CPU = 16383
MAX_CPUS = MAX_CPU + 1


@dataclass
class Running:
    """A running job on this node, keyed by its starter (pid and start time)."""
    starter_pid: int
    starter_start: int
    claim: Claim
    first_seen: float
    units: Optional[Units] = None          # device jobs: the compute units the agent placed
    uid: Optional[int] = None              # the job's processes' uid, once seen
    shared: bool = False                   # spread jobs: another job ran on its socket slot
    co_runners: List[str] = field(default_factory=list)
    verified: bool = False                 # its processes were seen
    last_seen: float = 0.0
    samples: int = 0
    perf: Dict[str, float] = field(default_factory=dict)
    killed: Optional[str] = None
    refused: Optional[str] = None          # device, node and guest jobs: why the agent refused its start
    cpus: Optional[Tuple[int, ...]] = None  # node-slot and guest claims: the CPUs the agent gave it
    mate_key: Optional[str] = None         # guests: the record key of the node-slot claim it shares cores of
    cgroup: Optional[str] = None           # node-slot and guest claims: its cgroup, once found and checked
    gpu_started: bool = False              # GPU claims: the agent let its job start (a co-runner on its GPUs)
    spare_started: bool = False            # spare claims: the agent admitted its start (then confines it)
    stopped_at: float = 0.0                # over its memory: when the agent stopped it (SIGSTOP), for the startd to hold
    kill_sent: bool = False                # not held in time: the agent killed it

    @property
    def key(self) -> str:
        return f"{self.starter_pid}:{self.starter_start}"

    @property
    def is_device(self) -> bool:
        return self.claim.device is not None

    @property
    def is_gpu(self) -> bool:
        """A claim holding some GPU of a GPU node (issue 13)."""
        return bool(self.claim.gpus)

    @property
    def is_spread(self) -> bool:
        return self.claim.device is None and self.claim.pinned and self.claim.program is not None

    def to_json(self) -> Dict[str, Any]:
        out = dataclasses.asdict(self)
        out["units"] = [list(r) for r in self.units] if self.units is not None else None
        out["cpus"] = list(self.cpus) if self.cpus is not None else None
        return out


def _from_json(obj: Any) -> Running:
    if not isinstance(obj, dict) or not isinstance(obj.get("claim"), dict):
        raise ValueError("not a record")
    fields = dict(obj["claim"])
    gpus = fields.pop("gpus", [])
    if not isinstance(gpus, list) or len(gpus) > MAX_GPUS_PER_NODE or not all(isinstance(g, dict) for g in gpus):
        raise ValueError("claim gpus is not a list of GPU shares")
    claim = Claim(**fields, gpus=tuple(GpuShare(rules.count("gpu index", g.get("index"), 0, MAX_GPUS_PER_NODE - 1),
                                                rules.count("gpu memory", g.get("memory_mb"), 0, rules.MAX_INT),
                                                rules.count("gpu compute", g.get("compute"), 1, MAX_GPU_COMPUTE))
                                       for g in gpus))
    units = obj.get("units")
    record = Running(
        starter_pid=rules.count("starter_pid", obj.get("starter_pid"), 2, 2 ** 22),
        starter_start=rules.count("starter_start", obj.get("starter_start"), 0, 2 ** 62),
        claim=claim, first_seen=rules.number("first_seen", obj.get("first_seen"), 0, 1e11),
        units=None if units is None else parse_units(units, claim.compute))
    for name in ("uid", "shared", "co_runners", "verified", "last_seen", "samples", "perf", "killed", "refused",
                 "gpu_started", "spare_started", "stopped_at", "kill_sent"):
        if name in obj:
            setattr(record, name, obj[name])
    cpus = obj.get("cpus")
    if cpus is not None:
        if not isinstance(cpus, list) or not 1 <= len(cpus) <= MAX_CPUS or len(set(cpus)) != len(cpus):
            raise ValueError("cpus is not a list of distinct CPUs")
        record.cpus = tuple(sorted(rules.count("cpu", c, 0, MAX_CPU) for c in cpus))
    mate_key = obj.get("mate_key")
    if mate_key is not None and not (isinstance(mate_key, str) and KEY_RE.match(mate_key)):
        raise ValueError("mate_key is not a starter key")
    record.mate_key = mate_key
    cgroup = obj.get("cgroup")
    if cgroup is not None and not (isinstance(cgroup, str) and cgroup.startswith("/") and len(cgroup) < 4096
                                   and "/../" not in cgroup + "/"):
        raise ValueError("cgroup is not a cgroup path")
    record.cgroup = cgroup
    return record


def load(state_dir: str) -> Tuple[Dict[str, Running], List[str]]:
    """The saved records, and what could not be read back (a record per line)."""
    raw = read_json(state_dir, JOBS_NAME)
    records: Dict[str, Running] = {}
    problems: List[str] = []
    if raw is None:
        return records, problems
    for item in raw if isinstance(raw, list) else []:
        try:
            record = _from_json(item)
            records[record.key] = record
        except (TypeError, ValueError) as exc:
            problems.append(f"job record dropped: {str(exc)[:120]}")
    return records, problems


def save(state_dir: str, records: Dict[str, Running]) -> None:
    write_json_atomic(state_dir, JOBS_NAME, [r.to_json() for r in records.values()])
