"""The one gate to a live HTCondor pool (htcondor2): read ads, write per-job edits.

Everything else in condor_sched works on model records; only this module builds
Collector and Schedd objects.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field, replace
from typing import Callable, Iterable
import classad2
import htcondor2

from condor_sched.classads import GPU_JOB_ATTRS, start_references, state_from_ads
from condor_sched.device_kinds import NODE_LAYOUT, device_kinds
from condor_sched.edits import UNDEFINED, Applied, Edit, JobChange, apply_changes, release_change
from condor_sched.model import (
    EXECUTE_DURATION_ATTR,
    MALLEABLE_ATTR,
    OVERCOMMIT_ATTR,
    SPARE_ATTR,
    PIN_CYCLE_ATTR,
    PIN_GUEST_ATTR,
    PIN_MATE_ATTR,
    PIN_MATE_BASE_ATTR,
    PIN_MATE_INCREASE_ATTR,
    PIN_LLC_WAYS_ATTR,
    PIN_MEM_BW_ATTR,
    PIN_ORIGINAL_ATTR,
    PIN_REASON_ATTR,
    PIN_SCALE_ATTR,
    PIN_SLOT_ATTR,
    PIN_TIME_ATTR,
    JobKey,
    PoolState,
)

log = logging.getLogger("condor_sched.pool")


def job_projection() -> list[str]:
    """Job attributes the planners read (every device kind's requests); live queries project on these."""
    kinds = [a for k in device_kinds() for a in (k.request_memory_attr, k.request_compute_attr)]
    return [*_JOB_ATTRS, *kinds]


def covered_jobs() -> str:
    """Jobs any condor_sched policy covers: device jobs of every kind (any device memory request
    but 0), spread jobs (CoSchedProgram), malleable jobs (node sharing), spare-capacity jobs
    (CoSchedSpare), overcommitted jobs (CoSchedOvercommit) and GPU jobs (any GPU memory, compute
    or GPU count request but 0)."""
    # Any value but 0, so that a malformed request ("abc", -5) is read and held with its reason.
    requests = [*(k.request_memory_attr for k in device_kinds()),
                *(a for k in device_kinds(NODE_LAYOUT) for a in (k.request_memory_attr, k.request_compute_attr,
                                                                 k.count_request_attr))]
    return " || ".join([*(f"({a} =!= undefined && {a} =!= 0)" for a in requests),
                        "(CoSchedProgram =!= undefined)", f"({MALLEABLE_ATTR} =?= true)", f"({SPARE_ATTR} =?= true)",
                        f"({OVERCOMMIT_ATTR} =?= true)"])


_JOB_ATTRS = [
    "ClusterId", "ProcId", "GlobalJobId", "Owner", "JobStatus", "QDate", "Cmd", "Requirements",
    "RequestCpus", "RequestMemory", "RequestLLCWays", "RequestMemBW", "CoSchedProgram", "CoSchedAlpha", "RemoteHost", "JobCurrentStartDate", "AllowedExecuteDuration", "MemoryUsage", "ImageSize",
    "User", "AccountingGroup", "JobPrio", "VacateReason", "VacateReasonCode", "LastVacateTime", "EnteredCurrentStatus",
    PIN_SLOT_ATTR, PIN_CYCLE_ATTR, PIN_ORIGINAL_ATTR, PIN_LLC_WAYS_ATTR, PIN_MEM_BW_ATTR, PIN_SCALE_ATTR,
    PIN_TIME_ATTR, PIN_REASON_ATTR, MALLEABLE_ATTR, SPARE_ATTR, OVERCOMMIT_ATTR, "CpusUsage", PIN_MATE_ATTR, PIN_MATE_INCREASE_ATTR, PIN_MATE_BASE_ATTR,
    PIN_GUEST_ATTR, *GPU_JOB_ATTRS,
]


#: The slot ads the planners read: partitionable slots only (a dynamic slot's resources are
#: already taken from its parent's free amounts), so a pool with thousands of running jobs
#: does not send thousands of dynamic slot ads every cycle. Not projected: a job's
#: Requirements and Rank may name any slot attribute.
PLANNED_SLOTS = "PartitionableSlot =?= true"


class PoolUnreachable(RuntimeError):
    """The collector or a schedd did not answer."""


class CollectorUnreachable(PoolUnreachable):
    """The collector did not answer: nothing of the pool can be read (or advertised) now."""


@dataclass(frozen=True, slots=True)
class LiveAds:
    """Raw ads of one read of the pool: job ads per schedd name, startd slot ads, and the
    schedds the collector lists that did not answer (name -> why; only a ``partial`` read)."""

    jobs: dict[str, list[classad2.ClassAd]]
    slots: list[classad2.ClassAd]
    unreachable: dict[str, str] = field(default_factory=dict)


def _collector() -> htcondor2.Collector:
    return htcondor2.Collector()


def schedd_ads() -> list[classad2.ClassAd]:
    try:
        return list(_collector().locateAll(htcondor2.DaemonType.Schedd))
    except Exception as e:
        raise CollectorUnreachable(f"cannot list schedds from the collector: {e}") from None


def schedd(name: str) -> htcondor2.Schedd:
    for ad in schedd_ads():
        if ad.get("Name") == name:
            return htcondor2.Schedd(ad)
    raise PoolUnreachable(f"schedd {name!r} is not known to the collector")


def _query_schedd(ad: classad2.ClassAd, constraint: str, projection: list[str]) -> list[classad2.ClassAd]:
    """One schedd's job ads. A schedd restarted since our last query rejects the security
    session we cached ("SECMAN:2004:Server rejected our session id", seen on HTCondor 25);
    the bindings then drop it, so a second attempt, at once, authenticates afresh."""
    try:
        return list(htcondor2.Schedd(ad).query(constraint, projection))
    except Exception as e:
        if "SECMAN" not in str(e):
            raise
    return list(htcondor2.Schedd(ad).query(constraint, projection))


def read_ads(job_constraint: str = "true", projection: list[str] | None = None, partial: bool = False,
             more_job_attrs: Callable[[list[classad2.ClassAd]], Iterable[str]] | None = None) -> LiveAds:
    """Every partitionable slot ad (``PLANNED_SLOTS``), then the job ads of every schedd the
    collector knows (projected on ``projection`` and on what ``more_job_attrs`` asks of the
    slot ads; empty: full ads).

    A schedd that does not answer raises PoolUnreachable, unless ``partial``: then it is
    recorded in ``unreachable`` and the others are read (the sidecar's cycle goes on without
    its jobs). The collector not answering always raises CollectorUnreachable.
    """
    try:
        slots = list(_collector().query(htcondor2.AdType.Startd, PLANNED_SLOTS))
    except Exception as e:
        raise CollectorUnreachable(f"cannot query startd ads: {e}") from None
    if projection and more_job_attrs is not None:
        projection = sorted({*projection, *more_job_attrs(slots)})
    jobs: dict[str, list[classad2.ClassAd]] = {}
    unreachable: dict[str, str] = {}
    # One after another: htcondor2's query holds the GIL while it waits on the schedd
    # (htcondor2_impl's _schedd_query), so threads would not overlap them.
    for ad in schedd_ads():
        name = ad.get("Name", "?")
        try:
            jobs[name] = _query_schedd(ad, job_constraint, projection or [])
        except Exception as e:
            if not partial:
                raise PoolUnreachable(f"schedd {name!r} did not answer: {e}") from None
            unreachable[name] = str(e) or type(e).__name__
    return LiveAds(jobs, slots, unreachable)


def ads_to_state(ads: LiveAds) -> PoolState:
    """The records of ``ads``; schedds that did not answer are named in ``unreachable_schedds``."""
    state = replace(state_from_ads(ads.jobs, ads.slots), observed_at_s=time.time())
    return replace(state, unreachable_schedds=tuple(sorted(ads.unreachable))) if ads.unreachable else state


def read_covered_ads(partial: bool = False) -> LiveAds:
    """The co-scheduled jobs' ads (all statuses, projected) and the slot ads (``read_ads``)."""
    return read_ads(covered_jobs(), job_projection(), partial, start_references)


def read_state() -> PoolState:
    """The co-scheduled jobs (all statuses) and the partitionable slots, as records, with the
    submitters' priorities (``covered_state``)."""
    return covered_state(read_covered_ads())


def covered_state(ads: LiveAds) -> PoolState:
    """The records of a read of covered jobs, with the submitters' priorities. A job whose
    projected ad does not parse is read again in full (its request may refer to an attribute
    outside the projection) before it counts as malformed."""
    state = ads_to_state(ads)
    again = [s.job for s in state.skipped if s.job is not None and (s.idle or s.pinned_slot)]
    if again:
        full = _full_job_ads(again)
        ads = LiveAds({name: [full.get((name, a.get("ClusterId"), a.get("ProcId")), a) for a in job_ads]
                       for name, job_ads in ads.jobs.items()}, ads.slots, ads.unreachable)
        state = ads_to_state(ads)
    return replace(state, user_priorities=user_priorities())


def _full_job_ads(keys: list[JobKey]) -> dict[tuple[str, int, int], classad2.ClassAd]:
    out = {}
    for name in sorted({k.schedd for k in keys}):
        ids = [k.job_id for k in keys if k.schedd == name]
        try:
            ads = schedd(name).query(" || ".join(f"(ClusterId == {i.split('.')[0]} && ProcId == {i.split('.')[1]})"
                                                 for i in ids))
        except Exception:  # the projected ads stand; their jobs stay skipped
            continue
        out.update({(name, a.get("ClusterId"), a.get("ProcId")): a for a in ads})
    return out


def user_priorities() -> dict[str, float]:
    """Effective user priority of each submitter (``condor_userprio``), from the negotiator;
    empty (every submitter equal) when no negotiator answers."""
    try:
        negotiators = list(_collector().locateAll(htcondor2.DaemonType.Negotiator))
        ads = htcondor2.Negotiator(negotiators[0]).getPriorities() if negotiators else []
    except Exception as e:
        log.debug("no user priorities from the negotiator: %s", e)
        return {}
    out = {}
    for ad in ads:
        name, priority = ad.get("Name"), ad.get("Priority")
        if isinstance(name, str) and isinstance(priority, (int, float)) and priority > 0:
            out[name] = float(priority)
    return out


def advertise(ad: classad2.ClassAd, command: str) -> None:
    """Send one ad of our own to the collector (``command``: e.g. UPDATE_AD_GENERIC)."""
    try:
        _collector().advertise([ad], command)
    except Exception as e:
        raise CollectorUnreachable(f"cannot advertise to the collector: {e}") from None


def generic_ads(my_type: str) -> list[classad2.ClassAd]:
    """The collector's generic ads of ``MyType == my_type`` (e.g. every CoSchedSidecar ad),
    with the collector's ``LastHeardFrom``."""
    try:
        # AdType.Any with a constraint: an AdType.Generic query of HTCondor 25 did not return them.
        return list(_collector().query(htcondor2.AdType.Any, f"MyType == {classad2.quote(my_type)}"))
    except Exception as e:
        raise CollectorUnreachable(f"cannot query {my_type} ads: {e}") from None


def last_negotiation_cycle_end() -> int | None:
    """``LastNegotiationCycleEnd0`` of the negotiator ad (needs NEGOTIATOR_UPDATE_AFTER_CYCLE);
    None when the collector has no negotiator ad."""
    try:
        ads = _collector().query(htcondor2.AdType.Negotiator, projection=["LastNegotiationCycleEnd0"])
    except Exception as e:
        raise CollectorUnreachable(f"cannot query the negotiator ad: {e}") from None
    ends = [ad.get("LastNegotiationCycleEnd0") for ad in ads]
    ends = [e for e in ends if isinstance(e, int)]
    return max(ends) if ends else None


def running_sidecars() -> list[str]:
    """The sidecars that hold a live lease (``condor_sched.lease``: edits jobs, ad fresh), described."""
    from condor_sched.lease import SidecarId, live_rivals

    now = time.time()
    here = str(htcondor2.param.get("FULL_HOSTNAME") or "localhost")
    nobody = SidecarId(0, here, "", -1)  # not a sidecar: every live one is a rival
    return [r.describe(now) for r in live_rivals(generic_ads("CoSchedSidecar"), nobody, now)]


def idle_guests() -> list[JobKey]:
    """Every idle malleable job of every schedd that the sidecar pinned as a guest or told a
    reason: what ``condor-sched release`` unpins (running guests and mates keep their cores
    and their longer limits until they end)."""
    out = []
    for ad in schedd_ads():
        name = ad.get("Name", "?")
        try:
            ads = htcondor2.Schedd(ad).query(
                f"{MALLEABLE_ATTR} =?= true && JobStatus == 1 && ({PIN_SLOT_ATTR} =!= undefined || "
                f"{PIN_REASON_ATTR} =!= undefined || {PIN_MATE_ATTR} =!= undefined)", ["ClusterId", "ProcId"])
        except Exception as e:
            raise PoolUnreachable(f"schedd {name!r} did not answer: {e}") from None
        out += [JobKey(name, a["ClusterId"], a["ProcId"]) for a in ads]
    return out


def enrolled_jobs() -> list[tuple[JobKey, str]]:
    """Every job of every schedd that carries a saved original Requirements (enrolled by the
    transform or the sidecar), with that original: what ``condor-sched release`` restores."""
    out = []
    for ad in schedd_ads():
        name = ad.get("Name", "?")
        try:
            ads = htcondor2.Schedd(ad).query(f"{PIN_ORIGINAL_ATTR} =!= undefined",
                                             ["ClusterId", "ProcId", PIN_ORIGINAL_ATTR])
        except Exception as e:
            raise PoolUnreachable(f"schedd {name!r} did not answer: {e}") from None
        out += [(JobKey(name, a["ClusterId"], a["ProcId"]), str(a.lookup(PIN_ORIGINAL_ATTR))) for a in ads]
    return out


#: Attributes whose edits are forwarded to the job's shadow (``TransactionFlag.SetDirty``).
FORWARDED_ATTRS = frozenset({EXECUTE_DURATION_ATTR})


class JobEditor:
    """Batched edits (``condor_sched.edits``): each :class:`Edit` is one ``Schedd.edit`` call
    with a list of job ids, which the schedd commits as one transaction (all or none)."""

    def __init__(self) -> None:
        self._schedds: dict[str, htcondor2.Schedd] = {}

    def _schedd(self, name: str) -> htcondor2.Schedd:
        if name not in self._schedds:
            self._schedds[name] = schedd(name)
        return self._schedds[name]

    def write(self, edit: Edit) -> None:
        # A running job's shadow sees an edit only when it is flagged SetDirty (condor_qedit
        # -forward): a mate's longer AllowedExecuteDuration must reach the shadow that enforces it.
        flags = (htcondor2.TransactionFlag.SetDirty if edit.attr in FORWARDED_ATTRS
                 else htcondor2.TransactionFlag.Default)
        edited = self._schedd(edit.schedd).edit([j.job_id for j in edit.jobs], edit.attr, edit.value, flags)
        if edited != len(edit.jobs):
            raise LookupError(f"{edit.attr} set on {edited} of {len(edit.jobs)} jobs")

    def hold(self, job: JobKey, reason: str) -> None:
        """Put an idle job on hold with ``reason`` as its HoldReason (``condor_release`` undoes it)."""
        # htcondor2 25.14 drops a plain-string reason (HoldReason stays empty); a
        # (reason, code) tuple reaches the schedd.
        self._schedd(job.schedd).act(htcondor2.JobAction.Hold, [job.job_id], (reason, 0))

    def release(self, jobs: Iterable[tuple[JobKey, str | None]]) -> Applied:
        """Undo enrolment of ``jobs`` (key, saved original Requirements), batched."""
        return apply_changes([release_change(job, original) for job, original in jobs], self.write)

    def release_guests(self, jobs: Iterable[JobKey]) -> Applied:
        """Unpin idle guests ``jobs`` and drop their reasons, batched."""
        from condor_sched.modes.mates.live import guest_unpin_writes

        return apply_changes([JobChange(job, (*guest_unpin_writes(), (PIN_REASON_ATTR, UNDEFINED))) for job in jobs],
                             self.write)
