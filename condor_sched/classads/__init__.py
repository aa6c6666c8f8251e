"""ClassAds to model records, live or from snapshot files (classad2 only, no daemons).

Bad input rule: a file that breaks a bound (``MAX_SNAPSHOT_BYTES``, ``MAX_ADS``,
``MAX_VALUE_DEPTH``, ``MAX_EXPRESSION_CHARS``) or does not parse raises
:class:`SnapshotError` naming the file and the place (line, item, attribute); one job or
slot with a missing or malformed attribute, a request the execute node would refuse
(:func:`request_problem`), expressions that would cost more to walk or evaluate than the
bound of ``expression_cost`` (checked before classad2 touches them: ``plain._check_cost``) or
a value no ClassAd text carries (a NUL: ``plain._carried``), is skipped with a
:class:`Skipped` record naming it and the attribute, and the rest is used under the rules of
``consistency`` (one ad per slot Name and job id, free amounts within the totals, one slot
per GPU uuid).

Reading is fast (issue 11): snapshot files are streamed ad by ad (:func:`state_from_snapshot`)
and live ads read through their JSON (:func:`state_from_ads`), both as ``plain._PlainAd`` views
whose plain values need no classad2 call; a ClassAd is built only where ClassAd semantics are
needed, and matchmaking is evaluated once per class of equal slots
(``slot_classes._SlotClasses``).

The modules, each importing only those above it:

- ``json_values``: JSON values as ClassAd values, the bounds on a value (``MAX_VALUE_DEPTH``,
  ``MAX_EXPRESSION_CHARS``); importing it switches on HTCondor's ClassAd semantics in classad2;
- ``plain``: the plain view of an ad (``_PlainAd``, :func:`plain_ads`), reading one attribute
  (``_eval``, the typed reads, :class:`AdError`), the expression cost guard (``_check_cost``)
  and the readers' shared caches;
- ``jobs``: job ads to records (:func:`job_from_ad`, :func:`request_problem`,
  :func:`gpu_request`, :func:`has_pin_clause`, :func:`jobs_from_ads`);
- ``slots``: slot ads to records (:func:`slot_from_ad`, :func:`slots_from_ads`);
- ``references``: what an expression reads (:func:`start_references`);
- ``slot_classes``: slots in classes that answer a probe job alike (``_SlotClasses``);
- ``eligibility``: matchmaking (:func:`eligible_slots`, :func:`slot_ranks`);
- ``state``: ads to a pool state (:func:`state_from_ads`, ``_build_state``);
- ``snapshot_files``: reading and writing snapshot files (:func:`read_ads`,
  :func:`state_from_snapshot`, :func:`ads_to_json`, :class:`SnapshotError`, the file bounds).

This package re-exports their public names. A bound or setting is patched in the module
that reads it (e.g. ``snapshot_files.MAX_SNAPSHOT_BYTES``): the name here is a copy.
"""
from __future__ import annotations

from condor_sched.classads.json_values import MAX_EXPRESSION_CHARS, MAX_VALUE_DEPTH
from condor_sched.classads.plain import MAX_AMOUNT, AdError, plain_ads
from condor_sched.classads.jobs import (
    DEFAULT_SLOWDOWN_THRESHOLD,
    GPU_JOB_ATTRS,
    HOOK_REFUSED_VACATE_CODE,
    MAX_GPUS_PER_JOB,
    MAX_REQUIRE_GPUS_CHARS,
    MAX_SPREAD_CPUS,
    PROGRAM_NAME,
    gpu_request,
    has_pin_clause,
    job_from_ad,
    jobs_from_ads,
    request_problem,
    schedd_of,
)
from condor_sched.classads.slots import (
    DEVICE_NAME,
    GPU_MODEL,
    GPU_SINGLE_ACCOUNT_ATTR,
    GPU_UUID,
    MAX_GPUS_PER_NODE,
    slot_from_ad,
    slots_from_ads,
)
from condor_sched.classads.references import start_references
from condor_sched.classads.eligibility import eligible_slots, slot_ranks
from condor_sched.classads.state import state_from_ads
from condor_sched.classads.snapshot_files import (
    MAX_ADS,
    MAX_SNAPSHOT_BYTES,
    SPLIT_READ_BYTES,
    SnapshotError,
    ads_to_json,
    read_ads,
    state_from_snapshot,
)

__all__ = [
    "AdError",
    "DEFAULT_SLOWDOWN_THRESHOLD",
    "DEVICE_NAME",
    "GPU_JOB_ATTRS",
    "GPU_MODEL",
    "GPU_SINGLE_ACCOUNT_ATTR",
    "GPU_UUID",
    "HOOK_REFUSED_VACATE_CODE",
    "MAX_ADS",
    "MAX_AMOUNT",
    "MAX_EXPRESSION_CHARS",
    "MAX_GPUS_PER_JOB",
    "MAX_GPUS_PER_NODE",
    "MAX_REQUIRE_GPUS_CHARS",
    "MAX_SNAPSHOT_BYTES",
    "MAX_SPREAD_CPUS",
    "MAX_VALUE_DEPTH",
    "PROGRAM_NAME",
    "SPLIT_READ_BYTES",
    "SnapshotError",
    "ads_to_json",
    "eligible_slots",
    "gpu_request",
    "has_pin_clause",
    "job_from_ad",
    "jobs_from_ads",
    "plain_ads",
    "read_ads",
    "request_problem",
    "schedd_of",
    "slot_from_ad",
    "slot_ranks",
    "slots_from_ads",
    "start_references",
    "state_from_ads",
    "state_from_snapshot",
]
