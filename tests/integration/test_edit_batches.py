"""Issue 11 on the real pool: the sidecar's batched edits, killed mid-apply.

Every job's state is atomic on its own ("How pinning stays safe"): a batched edit is one
schedd transaction, and a job takes its next write only after its previous one landed. Here
the sidecar is killed (SIGKILL) twice while it applies a large cycle: once while it unpins
1500 jobs pinned to a slot that holds few, once while it enrolls 1500 jobs submitted
without the pin clause. After each kill every job is in a state of its own edit sequence;
the next run finishes the work.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import classad2
import pytest
from test_every_pin_runs import DEVICE_JOB, jobs_of

from condor_sched.classads import has_pin_clause

pytestmark = pytest.mark.pool

N = 1500
ATTRS = ["Requirements", "CoSchedPinOriginalRequirements", "CoSchedPinSlot", "CoSchedPinCycle", "CoSchedPinTime",
         "JobStatus"]


def _sidecar(pool, chunk_jobs: int, log: Path) -> subprocess.Popen:
    """``condor-sched run --once`` as the queue super user, its log lines (one per edited
    job) to the file ``log``."""
    env = {**os.environ, **pool.env(pool.info.admin_user), "_CONDOR_COSCHED_EDIT_CHUNK_JOBS": str(chunk_jobs)}
    with log.open("w") as out:
        return subprocess.Popen([sys.executable, "-m", "condor_sched", "run", "--once"], env=env,
                                stdout=out, stderr=subprocess.STDOUT)


def _kill_when(sidecar: subprocess.Popen, log: Path, progress, what: str) -> None:
    """SIGKILL the sidecar once ``progress()`` says its edits are under way but unfinished."""
    deadline = time.monotonic() + 240
    try:
        while sidecar.poll() is None and not progress():
            assert time.monotonic() < deadline, f"not within 240 s: {what}"
            time.sleep(0.05)
    finally:
        sidecar.send_signal(signal.SIGKILL)
        sidecar.wait(timeout=30)
    assert sidecar.returncode == -signal.SIGKILL, f"the sidecar ended before it was killed:\n{log.read_text()[-3000:]}"


def _counts(pool, unenrolled: int, overfull: int, slot: str) -> tuple[int, int]:
    """(jobs of the overfull cluster unpinned, jobs of the other cluster enrolled)."""
    over = jobs_of(pool, overfull, ["CoSchedPinSlot"]).values()
    enrolled = jobs_of(pool, unenrolled, ["Requirements"]).values()
    return (sum(1 for a in over if a.get("CoSchedPinSlot") != slot),
            sum(1 for a in enrolled if has_pin_clause(str(a.get("Requirements")))))


def _set(ad: dict, attr: str) -> bool:
    value = ad.get(attr)  # by identity: classad2.Value is an IntEnum (Undefined == 2)
    return value is not None and not isinstance(value, classad2.Value)


def _each_job_is_in_a_state_of_its_own_sequence(pool, unenrolled: int, overfull: int, slot: str) -> None:
    for proc, ad in jobs_of(pool, unenrolled, ATTRS).items():
        if has_pin_clause(str(ad["Requirements"])):   # enrolled: the original was saved first
            assert _set(ad, "CoSchedPinOriginalRequirements"), (unenrolled, proc, ad)
        if _set(ad, "CoSchedPinSlot"):                 # pinned: enrolled, with this cycle's number and time
            assert has_pin_clause(str(ad["Requirements"])) and _set(ad, "CoSchedPinCycle") \
                and _set(ad, "CoSchedPinTime"), (unenrolled, proc, ad)
    for proc, ad in jobs_of(pool, overfull, ATTRS).items():
        if _set(ad, "CoSchedPinSlot"):                 # not unpinned yet, or pinned again: whole
            assert _set(ad, "CoSchedPinCycle") and _set(ad, "CoSchedPinTime"), (overfull, proc, ad)
            if ad["CoSchedPinSlot"] == slot and ad["CoSchedPinCycle"] == 1:
                assert ad["CoSchedPinTime"] == 1, (overfull, proc, ad)  # nothing of it cleared


def test_killing_the_sidecar_mid_apply_leaves_every_job_whole_and_the_next_run_finishes(pool, tmp_path):
    slot = pool.slot(2, "node1")
    d = pool.job_dir()
    # Long jobs: the few that start stay in the queue until the test removes them.
    base = {**DEVICE_JOB, "initialdir": str(d), "arguments": "600", "request_PhiMemory": "500",
            "request_PhiThreads": "60"}
    items = [{"item": str(i)} for i in range(N)]
    unenrolled = pool.submit_as(pool.info.user, base, items)
    overfull = pool.submit_as(pool.info.user, base, items)
    try:
        # As if submitted before condor_sched was enabled: no pin clause, nothing saved.
        pool.admin_edit(f"ClusterId == {unenrolled}", "Requirements", "true")
        pool.admin_edit(f"ClusterId == {unenrolled}", "CoSchedPinOriginalRequirements", "undefined")
        # Pinned by an earlier cycle to one device that holds at most 4 of them.
        for attr, value in (("CoSchedPinCycle", "1"), ("CoSchedPinTime", "1"), ("CoSchedPinSlot", f'"{slot}"')):
            pool.admin_edit(f"ClusterId == {overfull}", attr, value)

        # Small chunks: hundreds of transactions, so the kill lands mid-apply.
        first = _sidecar(pool, 5, tmp_path / "first.log")
        _kill_when(first, tmp_path / "first.log", lambda: 0 < _counts(pool, unenrolled, overfull, slot)[0] < N - 4,
                   "the first sidecar unpinning")
        unpinned, enrolled = _counts(pool, unenrolled, overfull, slot)
        print(f"killed mid-unpin: {unpinned} unpinned, {enrolled} enrolled")
        assert 0 < unpinned < N - 4 and enrolled == 0
        _each_job_is_in_a_state_of_its_own_sequence(pool, unenrolled, overfull, slot)

        second = _sidecar(pool, 2, tmp_path / "second.log")
        _kill_when(second, tmp_path / "second.log", lambda: 0 < _counts(pool, unenrolled, overfull, slot)[1] < N,
                   "the second sidecar enrolling")
        unpinned, enrolled = _counts(pool, unenrolled, overfull, slot)
        print(f"killed mid-enroll: {unpinned} unpinned, {enrolled} enrolled")
        assert 0 < enrolled < N
        _each_job_is_in_a_state_of_its_own_sequence(pool, unenrolled, overfull, slot)

        started = time.monotonic()
        third = _sidecar(pool, 2000, tmp_path / "third.log")
        third.wait(timeout=300)
        assert third.returncode == 0, (tmp_path / "third.log").read_text()[-3000:]
        print(f"the third run finished in {time.monotonic() - started:.1f} s")
        _each_job_is_in_a_state_of_its_own_sequence(pool, unenrolled, overfull, slot)
        unpinned, enrolled = _counts(pool, unenrolled, overfull, slot)
        # The device holds 4: those may have started there, and up to 4 more stay pinned while
        # the slot's ad does not show the started ones yet (the next cycles unpin them).
        assert enrolled == N and unpinned >= N - 8, (unpinned, enrolled)
        # Every original Requirements was saved as it was before enrolment.
        assert {a.get("CoSchedPinOriginalRequirements") for a in jobs_of(pool, unenrolled, ATTRS).values()} == {True}
    finally:
        pool.admin_remove(f"ClusterId == {unenrolled} || ClusterId == {overfull}")
