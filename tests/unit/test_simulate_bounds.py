"""Workload readers stay bounded: huge counts, offloads and run times are refused or cut
while reading, never expanded first."""
from __future__ import annotations

import tracemalloc
from pathlib import Path

import pytest

from condor_sched.simulate.workloads import (
    MAX_OFFLOADS, MAX_RUNTIME_S, MAX_WORKLOAD_JOBS, WorkloadError, read_swf, read_yaml,
)

JOB = "device_memory_mb: 800, device_threads: 60, runtime_s: 30"


def workload(tmp_path: Path, *jobs: str) -> Path:
    path = tmp_path / "w.yaml"
    path.write_text("jobs:\n" + "".join(f"  - {{{j}}}\n" for j in jobs))
    return path


def test_jobs_limit_applies_while_count_is_expanded(tmp_path):
    tracemalloc.start()
    try:
        w = read_yaml(workload(tmp_path, f"{JOB}, count: {MAX_WORKLOAD_JOBS}"), limit=3)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert len(w.jobs) == 3 and peak < 5_000_000


def test_count_above_the_bound_is_refused_naming_the_job(tmp_path):
    with pytest.raises(WorkloadError, match=rf"w\.yaml: jobs\[0\]: 'count' must be <= {MAX_WORKLOAD_JOBS}"):
        read_yaml(workload(tmp_path, f"{JOB}, count: 100000000"), limit=1)


def test_counts_adding_up_beyond_the_bound_are_refused(tmp_path):
    half = MAX_WORKLOAD_JOBS // 2 + 1
    with pytest.raises(WorkloadError, match=rf"jobs\[1\]: the workload expands to more than {MAX_WORKLOAD_JOBS}"):
        read_yaml(workload(tmp_path, f"{JOB}, count: {half}", f"{JOB}, count: {half}"))


@pytest.mark.parametrize("field, value, bound", [
    ("offloads", MAX_OFFLOADS + 1, MAX_OFFLOADS),
    ("runtime_s", MAX_RUNTIME_S * 2, MAX_RUNTIME_S),
])
def test_offloads_and_runtime_have_a_maximum(tmp_path, field, value, bound):
    job = JOB.replace("runtime_s: 30", "runtime_s: 30.0" if field != "runtime_s" else f"runtime_s: {value}")
    if field == "offloads":
        job += f", offloads: {value}"
    with pytest.raises(WorkloadError, match=f"'{field}' must be <= {int(bound)},"):
        read_yaml(workload(tmp_path, job))


def test_swf_that_is_not_utf8_names_the_line(tmp_path):
    path = tmp_path / "t.swf"
    path.write_bytes(b"; comment\n\xff 1 2\n")
    with pytest.raises(WorkloadError, match=r"t\.swf:2: not UTF-8 text"):
        read_swf(path)
