"""A lower bound on the makespan any device policy can reach on a workload (issue 12).

Under the offload model (``offload.py``) a job never slows down by sharing: its offloads
run on their own threads. What limits a policy is how the jobs' thread requests tile a
device. Let a *configuration* be a multiset of thread requests that fits one device's
hardware threads T, and W_s the device time jobs of request s must be given:

* threads a hard limit (``thread_overcommit`` 1): a job holds its threads from start to end,
  so W_s is the summed exclusive run time of the jobs requesting s;
* threads overcommitted (COSMIC serialises offloads): only offloads hold threads, so W_s is
  the summed offload time (run time x offload fraction).

Every schedule spends, in each configuration c, some device time y_c with
sum_c n_s(c) y_c >= W_s for every s and sum_c y_c <= devices x makespan, so the LP

    minimise  sum_c y_c   s.t.  sum_c n_s(c) y_c >= W_s,  y >= 0

divided by the devices bounds the makespan from below; a configuration holds at most as
many jobs of a request as there are. It is a preemptive relaxation (a job's time may be
split between configurations, as if jobs could pause and move), and device memory,
negotiation cycles and the tail are left out, so no policy reaches it. The longest job
bounds the makespan too.
"""
from __future__ import annotations

from collections import defaultdict
from typing import Sequence

from condor_sched.modes.devices.configurations import configuration_lp, configurations
from condor_sched.simulate.workloads import SimJob


def makespan_lower_bound(jobs: Sequence[SimJob], devices: int, hardware_threads: int,
                         thread_overcommit: float = 1.0) -> float | None:
    """The bound of the module docstring (seconds), or None when the jobs have too many
    distinct thread requests to enumerate the configurations."""
    if not jobs or devices <= 0:
        return 0.0
    work: dict[int, float] = defaultdict(float)
    count: dict[int, int] = defaultdict(int)
    for job in jobs:
        share = 1.0 if thread_overcommit <= 1.0 else job.offload_fraction
        work[min(job.device_threads, hardware_threads)] += job.exclusive_runtime_s * share
        count[min(job.device_threads, hardware_threads)] += 1
    sizes = sorted(s for s in work if s > 0)
    found = configurations(sizes, [count[s] for s in sizes], hardware_threads)
    if found is None:
        return None
    value, _ = configuration_lp([work[s] for s in sizes], found)
    return max(value / devices, max(job.exclusive_runtime_s for job in jobs))
