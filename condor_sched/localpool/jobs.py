"""Submit descriptions of paper 002's Table I jobs for the local pool (pure)."""
from __future__ import annotations

from typing import Any

from condor_sched.device_kinds import PHI
from condor_sched.simulate.workloads import table1_jobs

#: Table I runtimes are about 28.5 s exclusive; the pool runs them this many times faster.
DEFAULT_TIME_SCALE = 6.0


def table1_submit(n: int, seed: int, initialdir: str, time_scale: float = DEFAULT_TIME_SCALE
                  ) -> tuple[dict[str, str], list[dict[str, str]]]:
    """One submit description and ``n`` item rows (device memory, threads, sleep seconds).

    Each job is an ordinary submit file's job: ``request_<memory>`` and ``request_<compute>``
    of the Xeon Phi kind make it co-scheduled; ``sleep`` stands in for its run.
    """
    description = {
        "executable": "/bin/sleep",
        "arguments": "$(seconds)",
        "initialdir": initialdir,
        "should_transfer_files": "YES",
        "output": "out.$(ProcId)",
        "error": "err.$(ProcId)",
        "log": "jobs.log",
        "request_cpus": "1",
        "request_memory": "64",
        f"request_{PHI.memory_attr}": "$(phi_memory)",
        f"request_{PHI.compute_attr}": "$(phi_threads)",
        "+CoSchedProgram": '"$(program)"',
    }
    items: list[dict[str, Any]] = [
        {"phi_memory": str(j.device_memory_mb), "phi_threads": str(j.device_threads), "program": j.program,
         "seconds": str(max(1, round(j.exclusive_runtime_s / time_scale)))}
        for j in table1_jobs(n, seed)
    ]
    return description, items
