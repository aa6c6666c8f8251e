"""``simulate`` on the openb GPU trace (issue 13): which protocol, which seeds, one report.

The ``openb:`` prefix of ``--workload`` and ``--inventory`` selects the trace readers of
:mod:`condor_sched.simulate.openb`. Two protocols:

- ``inflation``: the FGD paper's (tasks shuffled by seed, clones up to 130% of GPU capacity,
  never finishing, failing where they fit nowhere), online (``batch`` 1) or in
  negotiation-cycle batches; ``sequences`` N runs seeds ``seed .. seed+N-1`` and reports
  each seed's figures and the median, as the paper reports the median of 10 seeds.
- ``replay``: the trace's own arrivals and durations at one negotiation cycle per
  ``cycle_s`` (:mod:`condor_sched.simulate.openb_replay`): stock HTCondor layouts
  (``native-whole``, ``native-divide-2``, ``native-divide-4`` and their ``-packed`` GPU
  lists), a GPU policy, or ``whole:POLICY`` (the policy's node choice, whole GPUs only).
"""
from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

from condor_sched.simulate.openb import OpenbError, read_openb_nodes, read_openb_tasks, run_inflation

#: The prefix that selects the openb trace readers.
OPENB_PREFIX = "openb:"
PROTOCOLS = ("inflation", "replay")
#: Tasks a negotiation-cycle batch may hold (one schedd offers far fewer per submitter).
MAX_BATCH = 100_000


def is_openb(path: str | None) -> bool:
    return bool(path) and path.startswith(OPENB_PREFIX)


def openb_path(option: str, value: str | None) -> Path:
    """The file behind ``openb:PATH``; OpenbError when the option lacks the prefix or the file."""
    if not is_openb(value):
        raise OpenbError(f"{option} {value!r}: an openb run needs both --workload openb:PODS.csv and "
                         "--inventory openb:NODES.csv")
    path = Path(value[len(OPENB_PREFIX):])
    if not path.is_file():
        raise OpenbError(f"{option} {value!r}: no such file {path}")
    return path


def simulate_openb(workload: str, inventory: str | None, protocol: str, policy: str, seed: int, batch: int,
                   sequences: int | None, cycle_s: float) -> dict[str, Any]:
    """The ``simulate --json`` object of one openb run (module docstring)."""
    from condor_sched.modes.registry import gpu_policy

    if protocol not in PROTOCOLS:
        raise OpenbError(f"--protocol {protocol!r}: use {' or '.join(PROTOCOLS)}")
    if protocol == "replay":
        from condor_sched.simulate.openb_replay import NATIVE_LAYOUTS, PACKED_LAYOUTS, WHOLE_PREFIX, run_replay

        if policy not in NATIVE_LAYOUTS + PACKED_LAYOUTS:
            gpu_policy(policy.removeprefix(WHOLE_PREFIX))  # an unknown name is a usage error before the trace is read
    else:
        planner = gpu_policy(policy)
    tasks = read_openb_tasks(openb_path("--workload", workload))
    fleet = read_openb_nodes(openb_path("--inventory", inventory))
    seeds = [seed] if sequences is None else list(range(seed, seed + sequences))
    head: dict[str, Any] = {"workload": workload, "inventory": inventory, "protocol": protocol, "policy": policy,
                            "tasks": len(tasks), "nodes": len(fleet), "gpus": int(fleet.gpu_count.sum())}
    if protocol == "inflation":
        head["batch"] = batch
        try:
            runs = [{"seed": s, **run_inflation(fleet, tasks, planner, s, batch=batch).to_json()} for s in seeds]
        except OpenbError as e:  # a whole list the protocol refuses: name both files
            raise OpenbError(f"{workload} on {inventory}: {e}") from None
        if len(runs) == 1:
            return {**head, **runs[0]}
        median = statistics.median(r["unallocated_gpu_pct_at_100"] for r in runs)
        curve = [[point[0], statistics.median(r["curve"][i][1] for r in runs)]
                 for i, point in enumerate(runs[0]["curve"])]
        return {**head, "seed": seed, "unallocated_gpu_pct_at_100": median, "curve": curve,
                "failed_tasks": statistics.median(r["failed_tasks"] for r in runs), "sequences": runs}
    head["cycle_s"] = cycle_s
    runs = [{"seed": s, **run_replay(fleet.copy(), tasks, policy, cycle_s, s).to_json()} for s in seeds]
    if len(runs) == 1:
        return {**head, **runs[0]}
    keys = [k for k, v in runs[0].items() if isinstance(v, (int, float)) and k != "seed"]
    return {**head, "seed": seed, **{k: statistics.median(r[k] for r in runs) for k in keys}, "sequences": runs}
