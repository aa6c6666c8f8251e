"""Batched queue edits: fewer calls, failures contained, and every job atomic on its own
whatever call a crash interrupts."""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from condor_sched.edits import (
    Edit,
    apply_changes,
    enroll_change,
    pin_change,
    release_change,
    unpin_change,
)
from condor_sched.model import PIN_CYCLE_ATTR, PIN_SLOT_ATTR, PIN_TIME_ATTR, JobKey


class Crash(BaseException):
    """The sidecar killed between two calls (not an Exception: nothing catches it)."""


class Queue:
    """A schedd's job attributes; each write is one transaction: all of its jobs or none."""

    def __init__(self, jobs, gone=(), crash_after=None):
        self.attrs = {j: {} for j in jobs}
        self.gone = set(gone)
        self.crash_after = crash_after
        self.calls = []

    def write(self, edit: Edit) -> None:
        if self.crash_after is not None and len(self.calls) >= self.crash_after:
            raise Crash()
        self.calls.append(edit)
        missing = [j for j in edit.jobs if j in self.gone]
        if missing:
            raise RuntimeError(f"Modifying attribute {edit.attr} in nonexistent job {missing[0].job_id}")
        for job in edit.jobs:
            self.attrs[job][edit.attr] = edit.value


def jobs(n, schedd="s"):
    return [JobKey(schedd, 1, p) for p in range(n)]


def test_alike_pins_share_calls_one_per_attribute_and_value():
    keys = jobs(1000)
    changes = [pin_change(k, f"slot{k.proc % 10}", 7, 1700000000, {"CoSchedPinExclusive": 0}) for k in keys]
    queue = Queue(keys)
    applied = apply_changes(changes, queue.write)
    assert sorted(applied.done) == keys and not applied.failed
    # cycle, time, exclusive: one call each; the slot: one per slot.
    assert applied.calls == len(queue.calls) == 3 + 10
    assert all(queue.attrs[k][PIN_SLOT_ATTR] == f'"slot{k.proc % 10}"' for k in keys)


def test_jobs_of_two_schedds_are_never_in_one_call():
    keys = jobs(5, "a") + jobs(5, "b")
    queue = Queue(keys)
    apply_changes([unpin_change(k) for k in keys], queue.write)
    assert all(len({j.schedd for j in e.jobs}) == 1 for e in queue.calls)
    assert len(queue.calls) == 2 * len(unpin_change(keys[0]).writes)


def test_a_job_gone_from_the_queue_fails_alone_and_is_found_in_few_calls():
    keys = jobs(1024)
    gone = {keys[3], keys[700]}
    queue = Queue(keys, gone=gone)
    applied = apply_changes([pin_change(k, "slotA", 1, 0, {}) for k in keys], queue.write)
    assert set(applied.failed) == gone and "nonexistent job" in applied.failed[keys[3]]
    assert len(applied.done) == 1022
    # The failing jobs took no later write, so neither is pinned.
    assert all(PIN_SLOT_ATTR not in queue.attrs[k] for k in gone)
    assert applied.calls < 3 * 2 * 2 * 11  # bisection, not one call per job


def _prefix_states(start: dict, writes) -> list[dict]:
    states, current = [dict(start)], dict(start)
    for attr, value in writes:
        current[attr] = value
        states.append(dict(current))
    return states


@settings(max_examples=150, deadline=None)
@given(n_pins=st.integers(1, 40), n_unpins=st.integers(0, 20), n_slots=st.integers(1, 6),
       crash_after=st.integers(0, 60), chunk=st.integers(1, 50))
def test_a_crash_at_any_call_leaves_each_job_in_a_state_of_its_own_sequence(n_pins, n_unpins, n_slots, crash_after, chunk):
    """Each job's attributes after a crash are its start plus a prefix of its own writes: a
    job is pinned (slot set, with this cycle's number and time) or not, never half."""
    pins, unpins = jobs(n_pins, "p"), jobs(n_unpins, "u")
    queue = Queue(pins + unpins, crash_after=crash_after)
    for k in unpins:  # pinned in an earlier cycle
        queue.attrs[k] = {PIN_SLOT_ATTR: '"old"', PIN_CYCLE_ATTR: "3", PIN_TIME_ATTR: "5"}
    start = {k: dict(v) for k, v in queue.attrs.items()}
    changes = ([pin_change(k, f"slot{k.proc % n_slots}", 9, 100, {"CoSchedPinExclusive": k.proc % 2}) for k in pins]
               + [unpin_change(k) for k in unpins])
    with pytest.raises(Crash):
        apply_changes(changes[:n_pins], queue.write, chunk_jobs=chunk)
        apply_changes(changes[n_pins:], queue.write, chunk_jobs=chunk)
        raise Crash()  # or the crash comes after the last call
    for change in changes:
        assert queue.attrs[change.job] in _prefix_states(start[change.job], change.writes), change.job
        slot = queue.attrs[change.job].get(PIN_SLOT_ATTR)
        if change.job in pins and slot not in (None, "undefined"):
            assert queue.attrs[change.job][PIN_CYCLE_ATTR] == "9" and queue.attrs[change.job][PIN_TIME_ATTR] == "100"
        if change.job in unpins and slot == '"old"':  # not unpinned yet: nothing of it cleared
            assert queue.attrs[change.job] == start[change.job]


def test_a_stop_request_is_honoured_between_chunks():
    keys = jobs(10)
    queue = Queue(keys)
    stop = []

    def write(edit):
        queue.write(edit)
        stop.append(edit)  # asked to stop during the first chunk's first call

    applied = apply_changes([enroll_change(k, "true") for k in keys], write, should_stop=lambda: bool(stop), chunk_jobs=4)
    assert len(applied.done) == 4 and applied.left_on_stop == 6
    # The chunk under way finished: its jobs carry both writes, the others none.
    assert sum(1 for k in keys if "Requirements" in queue.attrs[k]) == 4
    assert sum(1 for k in keys if queue.attrs[k]) == 4


def test_release_unpins_first_restores_requirements_and_drops_the_reason():
    writes = release_change(JobKey("s", 1, 0), "(Arch == \"X86_64\")").writes
    assert writes[0] == (PIN_SLOT_ATTR, "undefined")
    assert ("Requirements", "(Arch == \"X86_64\")") in writes and writes[-1] == ("CoSchedPinReason", "undefined")
    assert all(a != "Requirements" for a, _ in release_change(JobKey("s", 1, 0), None).writes)
