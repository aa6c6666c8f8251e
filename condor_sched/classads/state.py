"""Ads to a :class:`model.PoolState` (:func:`state_from_ads`, and ``_build_state`` under both
readers): the slot ads first, then the job ads read one at a time (``_read_jobs``) and
dropped, with each idle job's eligible slots and ranks, under the rules of ``consistency``."""
from __future__ import annotations

from dataclasses import replace
from typing import Callable, Iterable, Iterator, Mapping

import classad2

from condor_sched.classads.eligibility import _eligibility_key, _eligible, _probe_target, _rank_key, _ranks
from condor_sched.classads.jobs import _describe_job, _job_record, _key_and_pin, _record_reads, schedd_of
from condor_sched.classads.json_values import _BadValue
from condor_sched.classads.plain import AdError, _PlainAd, plain_ads
from condor_sched.classads.references import _start_refs
from condor_sched.classads.slots import slot_from_ad
from condor_sched.consistency import consistent_state, distinct_slots
from condor_sched.gc_pause import gc_paused
from condor_sched.model import Job, JobKey, PoolState, Skipped, Slot


def state_from_ads(job_ads: Mapping[str | None, Iterable[classad2.ClassAd]],
                   slot_ads: Iterable[classad2.ClassAd]) -> PoolState:
    """The pool state of job ads (per schedd name; None: from each ad's GlobalJobId) and
    startd ads, with each idle job's eligible slots, under the rules of ``consistency``
    (one ad per slot Name and job id, free amounts within the totals). What the sidecar
    calls on each read of the live pool: the job ads are read through :func:`plain_ads`."""
    return _build_state(((schedd, plain_ads(ads)) for schedd, ads in job_ads.items()), slot_ads)


def _build_state(job_ads: Iterable[tuple[str | None, Iterable[classad2.ClassAd | _PlainAd]]]
                 | Callable[[set[str]], Iterable[_JobRead]],
                 slot_ads: Iterable[classad2.ClassAd]) -> PoolState:
    """``state_from_ads`` on job ads that are read one at a time and then dropped: of each
    idle job only what its eligible slots and Rank depend on is kept (the slots come first).
    ``job_ads`` may instead be a function of the START references giving each ad's
    :func:`_read_jobs` entry (``snapshot_files.state_from_snapshot`` reads half a file in another process)."""
    with gc_paused():
        read_slots: list[tuple[Slot, tuple[str, classad2.ClassAd], set[str]]] = []
        slot_skips: list[Skipped] = []
        for ad in slot_ads:  # each ad is dropped once its record and probe target are built
            try:
                slot = slot_from_ad(ad)
                if slot is not None:
                    read_slots.append((slot, (slot.name, _probe_target(ad)), _start_refs(ad)))
            except AdError as e:
                slot_skips.append(Skipped(f"slot {ad.get('Name', '?')}", str(e)))
            except _BadValue as e:  # a value the probe's ClassAd cannot hold
                slot_skips.append(Skipped(f"slot {ad.get('Name', '?')}", f"{e.attribute or 'a value'}: {e.problem}"))
        slots, duplicates = distinct_slots([slot for slot, _, _ in read_slots])
        kept = {id(slot) for slot in slots}
        targets = [target for slot, target, _ in read_slots if id(slot) in kept]
        start_refs = set().union(*(refs for slot, _, refs in read_slots if id(slot) in kept))
        del read_slots
        jobs: list[Job] = []
        skipped: list[Skipped] = []
        seen: set[JobKey] = set()
        idle: list[tuple[Job, tuple | None, tuple | None]] = []
        entries = job_ads(start_refs) if callable(job_ads) else _read_jobs(job_ads, start_refs)
        for job, eligibility, rank in entries:
            if job.__class__ is Skipped:
                skipped.append(job)
                continue
            jobs.append(job)
            if job.key not in seen:  # consistency keeps the first ad of a job id that reads
                seen.add(job.key)
                if job.is_idle:
                    idle.append((job, eligibility, rank))
        state = consistent_state(PoolState(tuple(jobs), tuple(slots), tuple(skipped + slot_skips + duplicates)))
        return replace(state, eligible=_eligible([(job, key) for job, key, _ in idle], targets),
                       ranks=_ranks([(job, key) for job, _, key in idle], targets))


#: One job ad read: its record with, when idle, its eligibility and Rank keys; or why it is skipped.
_JobRead = tuple[Job | Skipped, tuple | None, tuple | None]


def _read_jobs(job_ads: Iterable[tuple[str | None, Iterable[classad2.ClassAd | _PlainAd]]],
               start_refs: set[str]) -> Iterator[_JobRead]:
    """Each job ad's record (``_job_record``) and the keys its eligible slots and Rank are
    found by, or its Skipped entry, in the ads' order."""
    references: dict[str, tuple[str, ...]] = {}
    reads = _record_reads()
    for schedd, ads in job_ads:
        for ad in ads:
            source = schedd or schedd_of(ad, "unknown-schedd")
            try:
                job = _job_record(ad, source, reads)
                read = (job, _eligibility_key(ad, start_refs, references), _rank_key(ad)) if job.is_idle else \
                    (job, None, None)
            except AdError as e:
                yield Skipped(_describe_job(ad, source), str(e), *_key_and_pin(ad, source)), None, None
                continue
            yield read
