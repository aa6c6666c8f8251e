"""The sidecar's cycle logic, without a pool: what it unpins, enrolls and pins."""
from dataclasses import replace

import classad2

import pytest

from condor_sched.model import Assignment, Job, JobKey, JobStatus, Plan, PoolState, Resources, Slot, SlotKind, Unplaced
from condor_sched.settings import SettingsError, SidecarSettings, settings_from_knobs
from condor_sched.cycle import CycleConfig, CycleMemory, decide_cycle
from condor_sched.modes.planning import PolicyKind
from condor_sched.sidecar import Sidecar, apply_cycle

DEV = Resources(cpus=4, memory_mb=1024, device_memory_mb=8192, device_threads=240)


class FirstFit:
    """A trivial policy for these tests: first device slot with room."""

    name = "first-fit"
    kind = PolicyKind.DEVICE

    def plan(self, request, settings):
        jobs, slots = request.idle, request.slots
        free = {s.name: s.free for s in slots}
        placed, unplaced = [], []
        for j in jobs:
            for name, f in free.items():
                if j.request.fits_in(f):
                    free[name] = f - j.request
                    placed.append(Assignment(j.key, name))
                    break
            else:
                unplaced.append(Unplaced(j.key, "no room"))
        return Plan(self.name, tuple(placed), tuple(unplaced))


def device_job(proc, mem=3000, threads=60, **kw):
    defaults = dict(key=JobKey("s", 1, proc), owner="alice", status=JobStatus.IDLE,
                    request=Resources(cpus=1, memory_mb=64, device_memory_mb=mem, device_threads=threads),
                    has_pin_clause=True, attributes={"Requirements": "true"})
    defaults.update(kw)
    return Job(**defaults)


def slot(name, free=DEV):
    return Slot(name, "node1.cosched.test", SlotKind.DEVICE, DEV, free, device_name="mic0")


SETTINGS = SidecarSettings(unpin_age_cycles=3)


def decide(state, cycle, policy, spread_policy=None, profiles=None):
    """One cycle numbered ``cycle`` with no memory of earlier ones, pins unmatched for 3 cycles unpinned."""
    return decide_cycle(state, CycleMemory(cycle), CycleConfig(policy, spread_policy, unpin_age_cycles=3,
                                                               profiles=profiles))


def test_fresh_pins_are_kept_and_their_requests_reserved():
    pinned = device_job(1, mem=6000, pinned_slot="slotA", pinned_cycle=9)
    new = device_job(2, mem=3000)
    d = decide(PoolState((pinned, new), (slot("slotA"), slot("slotB"))), 10, FirstFit())
    assert [(a.job.proc, a.slot) for a in d.kept] == [(1, "slotA")] and d.unpins == ()
    # 6000 MB of slotA are held by the pinned, unmatched job: the new job goes to slotB.
    assert [(p.job.proc, p.slot) for p in d.pins] == [(2, "slotB")]


def test_stale_and_vanished_pins_are_unpinned_and_replanned():
    stale = device_job(1, pinned_slot="slotA", pinned_cycle=5)
    vanished = device_job(2, pinned_slot="slotGone", pinned_cycle=10)
    d = decide(PoolState((stale, vanished), (slot("slotA"),)), 10, FirstFit())
    reasons = {u.job.proc: u.reason for u in d.unpins}
    assert "not matched within 3 cycles" in reasons[1] and "vanished" in reasons[2]
    assert sorted(p.job.proc for p in d.pins) == [1, 2]


def test_only_idle_device_jobs_are_covered():
    running = device_job(1, status=JobStatus.RUNNING)
    plain = device_job(2, request=Resources(cpus=1, memory_mb=64))
    d = decide(PoolState((running, plain), (slot("slotA"),)), 1, FirstFit())
    assert d.seen == 0 and d.pins == () and d.enrolls == ()


def test_jobs_without_the_pin_clause_are_enrolled_before_pinning():
    legacy = device_job(1, has_pin_clause=False, attributes={"Requirements": "(TARGET.Arch == \"X86_64\")"})
    d = decide(PoolState((legacy,), (slot("slotA"),)), 1, FirstFit())
    assert [e.requirements for e in d.enrolls] == ['(TARGET.Arch == "X86_64")']
    assert [p.job.proc for p in d.pins] == [1]


class RecordingEditor:
    """Applies batched edits to a dict of job attributes (all of an edit's jobs or none, as a
    schedd transaction); can fail on one job."""

    def __init__(self, fail_on=None):
        self.attrs = {}
        self.fail_on = fail_on
        self.edits = []

    def _check(self, job):
        if job == self.fail_on:
            raise RuntimeError("schedd said no")

    def write(self, edit):
        for job in edit.jobs:
            self._check(job)
        self.edits.append(edit)
        for job in edit.jobs:
            self.attrs.setdefault(job, {})[edit.attr] = literal(edit.value)

    def hold(self, job, reason):
        self._check(job)
        self.attrs.setdefault(job, {}).update(HoldReason=reason)


def literal(text):
    """A written expression's value as the job ad would show it (None: undefined; text: not a literal)."""
    value = classad2.ExprTree(text).eval()
    if value is classad2.Value.Undefined:
        return None
    return value if isinstance(value, (int, str, float)) and not isinstance(value, bool) else text


def test_one_failing_job_does_not_stop_the_cycle_and_an_unenrolled_job_is_never_pinned():
    jobs = (device_job(1, has_pin_clause=False), device_job(2), device_job(3))
    d = decide(PoolState(jobs, (slot("slotA"), slot("slotB"))), 4, FirstFit())
    editor = RecordingEditor(fail_on=JobKey("s", 1, 1))
    outcome = apply_cycle(d, editor)
    assert outcome.pinned == 2 and len(outcome.failed) == 1 and "enroll" in outcome.failed[0]
    assert JobKey("s", 1, 1) not in editor.attrs
    assert editor.attrs[JobKey("s", 1, 2)]["CoSchedPinCycle"] == 4


def test_asked_to_stop_mid_cycle_it_finishes_the_job_it_edits_and_edits_no_other():
    jobs = tuple(device_job(p, mem=1000) for p in range(4))
    d = decide(PoolState(jobs, (slot("slotA"),)), 1, FirstFit())
    stop = []

    class StoppedDuringSecondPin(RecordingEditor):
        def write(self, edit):
            if len(self.attrs) == 1 and edit.jobs[0] not in self.attrs:
                stop.append(edit)  # SIGTERM arrives while the second job's edits are under way
            super().write(edit)

    editor = StoppedDuringSecondPin()
    outcome = apply_cycle(d, editor, should_stop=lambda: bool(stop), chunk_jobs=1)
    # Two pins left, and the reasons of the two jobs pinned (none is told of a pin it lacks).
    assert outcome.pinned == 2 and outcome.left_on_stop == 4
    assert sorted(k.proc for k in editor.attrs) == [0, 1]
    assert all(a["CoSchedPinSlot"] == "slotA" and a["CoSchedPinCycle"] == 1 for a in editor.attrs.values())


def test_cycle_numbers_continue_after_a_restart():
    state = PoolState((device_job(1, pinned_slot="slotA", pinned_cycle=41),), (slot("slotA"),))
    sidecar = Sidecar(SETTINGS, CycleConfig(FirstFit(), None), lambda: state, None)
    assert sidecar.run_cycle().decision.cycle == 42
    assert sidecar.run_cycle().decision.cycle == 43


def test_a_pin_ages_only_by_negotiation_cycles_so_none_is_taken_back_the_moment_the_negotiator_returns():
    """Pinned in cycle 41 (the job's ad stays idle and pinned: no negotiator matches it). While
    the collector has no negotiator ad, and on the sidecar's own interval cycles between two
    negotiation cycles, the pin does not age; it is taken back after the third negotiation
    cycle that did not match it, as COSCHED_UNPIN_AGE_CYCLES = 3 says."""
    state = PoolState((device_job(1, pinned_slot="slotA", pinned_cycle=41),), (slot("slotA"),))
    ends = iter([None, None, None, None, 1000, 1000, 1000, 1002, 1002, 1004])
    sidecar = Sidecar(SETTINGS, CycleConfig(FirstFit(), None, unpin_age_cycles=3), lambda: state, None,
                      cycle_end=lambda: next(ends))
    unpins = [sidecar.run_cycle().decision.unpins for _ in range(10)]
    assert [bool(u) for u in unpins] == [False] * 9 + [True]
    assert "not matched within 3 cycles" in unpins[-1][0].reason
    assert sidecar.memory.negotiated == (46, 49, 51) and sidecar.memory.cycle == 52
    every_cycle = Sidecar(SETTINGS, CycleConfig(FirstFit(), None, unpin_age_cycles=3), lambda: state, None)
    assert [bool(every_cycle.run_cycle().decision.unpins) for _ in range(3)] == [False, False, True]


def test_knobs_are_parsed_and_bad_values_named():
    s = settings_from_knobs({"COSCHED_UNPIN_AGE_CYCLES": "5", "COSCHED_MEMORY_GRANULARITY_MB": "25",
                             "COSCHED_CYCLE_SOURCE": "interval"})
    assert (s.unpin_age_cycles, s.plan.memory_granularity_mb, s.cycle_source) == (5, 25, "interval")
    with pytest.raises(SettingsError, match="COSCHED_UNPIN_AGE_CYCLES"):
        settings_from_knobs({"COSCHED_UNPIN_AGE_CYCLES": "soon"})
    with pytest.raises(SettingsError, match="COSCHED_POLICY"):
        settings_from_knobs({"COSCHED_POLICY": "nope"})


def test_device_and_spread_aging_are_separate_knobs():
    old = settings_from_knobs({"COSCHED_AGE_LIMIT_CYCLES": "7"}).plan
    assert (old.age_limit_cycles, old.spread_age_limit()) == (7, 30)   # the old name: device only
    both = settings_from_knobs({"COSCHED_AGE_LIMIT_CYCLES": "7", "COSCHED_SPREAD_AGE_LIMIT_CYCLES": "90"}).plan
    assert (both.age_limit_cycles, both.spread_age_limit()) == (7, 90)


@pytest.mark.parametrize(("knob", "raw"), [("COSCHED_INTERVAL", "inf"), ("COSCHED_INTERVAL", "nan"),
                                           ("COSCHED_INTERVAL", "1e308"), ("COSCHED_SOLVER_TIME_LIMIT", "inf"),
                                           ("COSCHED_THREAD_OVERCOMMIT", "1e308"),
                                           ("COSCHED_AGE_LIMIT_CYCLES", "99999999999"),
                                           ("COSCHED_SPREAD_AGE_LIMIT_CYCLES", "99999999999")])
def test_numeric_knobs_are_finite_and_bounded_like_their_options(knob, raw):
    with pytest.raises(SettingsError, match=f"{knob} = '{raw}' must be a finite number in"):
        settings_from_knobs({knob: raw})


def test_the_sidecar_refuses_a_thread_overcommit_htcondor_would_not_account():
    assert settings_from_knobs({"COSCHED_THREAD_OVERCOMMIT": "1.0"}).plan.thread_overcommit == 1.0
    with pytest.raises(SettingsError, match="COSCHED_THREAD_OVERCOMMIT = 2: .*never match"):
        settings_from_knobs({"COSCHED_THREAD_OVERCOMMIT": "2"})


def test_spread_jobs_go_to_the_spread_policy_and_their_pins_carry_ways_and_bandwidth():
    from condor_sched.inventory import default_inventory_path, load_inventory, node_slots
    from condor_sched.modes.registry import get_policy
    from condor_sched.profiles import ProfileStore, default_profiles_dir
    from condor_sched.modes.slot_mode import pin_details

    slots = tuple(s for n in load_inventory(default_inventory_path()).nodes for s in node_slots(n, "cosched.test"))
    procs = tuple(device_job(p, request=Resources(cpus=1, memory_mb=64), spread=True, program="MG",
                             key=JobKey("s", 5, p)) for p in range(4))
    plain = device_job(9, request=Resources(cpus=1, memory_mb=64), key=JobKey("s", 6, 0))  # not covered
    dev = device_job(1)
    d = decide(PoolState((*procs, plain, dev), slots), 1, FirstFit(),
               spread_policy=get_policy("sns"), profiles=ProfileStore.load_dir(default_profiles_dir()))
    by_job = {p.job: p for p in d.pins}
    assert set(by_job) == {j.key for j in procs} | {dev.key}
    kinds = {s.name: s.kind for s in slots}
    assert kinds[by_job[dev.key].slot] is SlotKind.DEVICE and by_job[dev.key].llc_ways is None
    for j in procs:
        pin = by_job[j.key]
        assert kinds[pin.slot] is SlotKind.SOCKET and pin.llc_ways >= 0 and pin.scale_factor in (1, 2, 4, 8)
        assert set(pin_details(pin)) == {"CoSchedPinLLCWays", "CoSchedPinMemBW", "CoSchedPinScale"}
    # Without a spread policy the sidecar leaves spread jobs alone.
    d = decide(PoolState((*procs, dev), slots), 1, FirstFit())
    assert [p.job for p in d.pins] == [dev.key] and d.enrolls == ()


def test_a_job_started_after_its_slot_ad_was_sent_still_counts_against_the_slot():
    ad_time = 1000
    fresh = replace(slot("slotA"), updated_at_s=ad_time)
    fresh = replace(fresh, name="slot2@node1@h")
    running = device_job(1, mem=6000, status=JobStatus.RUNNING, remote_slot="slot2_4@node1@h", started_at_s=ad_time + 3)
    new = device_job(2, mem=3000)
    d = decide(PoolState((running, new), (fresh, slot("slot3@node1@h"))), 1, FirstFit())
    assert [p.slot for p in d.pins] == ["slot3@node1@h"]
    # Once the ad is newer than the start, HTCondor's own free amounts already count it.
    newer = replace(fresh, updated_at_s=ad_time + 10, free=fresh.free - running.request)
    d = decide(PoolState((running, new), (newer,)), 1, FirstFit())
    assert d.pins == () 


def test_a_pinned_job_whose_ad_went_bad_is_unpinned_and_a_bad_unpinned_one_left_alone():
    from condor_sched.model import Skipped

    bad_pinned = Skipped("job s#1.3", "RequestPhiThreads must be a number", JobKey("s", 1, 3), "slotA")
    bad_unpinned = Skipped("job s#1.4", "RequestCpus is missing", JobKey("s", 1, 4), None)
    d = decide(PoolState((), (slot("slotA"),), (bad_pinned, bad_unpinned)), 5, FirstFit())
    assert [(u.job.proc, u.reason.startswith("malformed ad: RequestPhiThreads")) for u in d.unpins] == [(3, True)]
    assert d.pins == () and len(d.skipped) == 2


def test_an_ad_listing_its_dynamic_slots_says_exactly_which_running_jobs_it_already_counts():
    spare = slot("slot3@node1@h")
    new = device_job(2, mem=3000)

    def target(running, dev_slot):
        pins = decide(PoolState((running, new), (dev_slot, spare)), 1, FirstFit()).pins
        return [p.slot for p in pins]

    # The ad is newer than the start, yet does not list the job's dynamic slot: not counted yet.
    listed = replace(slot("slot2@node1@h"), updated_at_s=2000, children=("slot2_1@node1@h",))
    running = device_job(1, mem=6000, status=JobStatus.RUNNING, remote_slot="slot2_4@node1@h", started_at_s=1990)
    assert target(running, listed) == ["slot3@node1@h"]
    # Listed: its resources are already out of the ad's free amounts, and not taken out twice.
    small = replace(running, request=replace(running.request, device_memory_mb=4000))
    counted = replace(listed, children=("slot2_4@node1@h",), free=listed.free - small.request)
    assert target(small, counted) == ["slot2@node1@h"]
    # No ChildName and no start time yet: counted (the claim precedes the start).
    assert target(replace(running, started_at_s=None), replace(listed, children=None)) == ["slot3@node1@h"]


@pytest.mark.parametrize("status", [JobStatus.RUNNING, JobStatus.TRANSFERRING_OUTPUT, JobStatus.SUSPENDED])
def test_a_started_job_without_remote_host_yet_counts_against_the_slot_it_is_pinned_to(status):
    # The schedd marks a job running in one transaction and records RemoteHost in a later
    # one: in between the job holds (or is claiming) its pinned device, which the ad may not show.
    ad = replace(slot("slot2@node1@h"), updated_at_s=2000, children=())
    starting = device_job(1, mem=6000, status=status, pinned_slot="slot2@node1@h", pinned_cycle=1,
                          started_at_s=1990)
    new = device_job(2, mem=3000)
    pins = decide(PoolState((starting, new), (ad, slot("slot3@node1@h"))), 2, FirstFit()).pins
    assert [p.slot for p in pins] == ["slot3@node1@h"]
    # Without a pin (not a job condor_sched placed) nothing is reserved for it.
    unpinned = replace(starting, pinned_slot=None, pinned_cycle=None)
    pins = decide(PoolState((unpinned, new), (ad,)), 2, FirstFit()).pins
    assert [p.slot for p in pins] == ["slot2@node1@h"]


def test_exclusive_pins_ask_the_startd_for_the_whole_device_and_other_device_pins_do_not():
    from condor_sched.modes.registry import get_policy
    from condor_sched.modes.slot_mode import pin_details

    jobs = (device_job(1), device_job(2))
    slots = (slot("slot2@node1@h"), slot("slot3@node1@h"))
    exclusive = decide(PoolState(jobs, slots), 1, get_policy("exclusive")).pins
    shared = decide(PoolState(jobs, slots), 1, get_policy("knapsack")).pins
    assert len(exclusive) == 2 and all(pin_details(p) == {"CoSchedPinExclusive": 1} for p in exclusive)
    assert len(shared) == 2 and all(pin_details(p) == {"CoSchedPinExclusive": 0} for p in shared)
