"""Name and number rules shared by the planner (condor_sched) and the execute node.

One home for what a job may ask for and how names look, so that the sidecar never pins a
job the PREPARE_JOB hook will refuse, and the hook refuses nothing the planner accepted
(``tests/unit/test_rules_agree.py`` drives both with the same inputs). Standard library only:
the node's system ``python3`` runs it, and ``condor_sched`` imports it from the installed
``cosched_node`` package.

Values come from ClassAds: ints, reals, booleans, strings or ``None`` (undefined). A count
(device memory in MB, compute units, LLC ways) is an integer or an integral real; a
fractional, negative, boolean or string value is refused with a message that names the
attribute.
"""

from __future__ import annotations

import math
import re
from typing import Any, Optional, Tuple

#: Largest count any request or slot may carry (device memory in MB, compute units...).
MAX_INT = 10 ** 12
#: Compute units (hardware threads) of one device, at most.
MAX_UNITS = 100000
#: Largest ClusterId and ProcId (HTCondor's are 32-bit; generous bounds).
MAX_CLUSTER_ID = 10 ** 12 - 1
MAX_PROC_ID = 10 ** 9 - 1
#: Spread-n-Share's scale factors k (Section 4.2 of paper 000: 1, 2, 4, 8 nodes' worth).
SCALE_FACTORS = (1, 2, 4, 8)
#: Cache allocation bit masks are at most 64 ways wide; resctrl cache ids are small.
CBM_WIDTH_MAX = 64
CACHE_ID_MAX = 4095
#: Memory bandwidth of one socket, GB/s, at most.
MAX_BW_GBS = 100000.0

ATTR_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")
NODE_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9-]{0,62}$")
DOMAIN_RE = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9-]{0,62})(\.[A-Za-z0-9][A-Za-z0-9-]{0,62})*$")
#: Device names (``mic0``, ``gpu1``): they become parts of attribute and file names.
DEVICE_RE = re.compile(r"^[A-Za-z][A-Za-z0-9_]{0,31}$")
#: A job's Owner and the hex sha256 of a binary, as interference profiles are keyed (paper 004):
#: they become directory names.
OWNER_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}$")
SHA256_RE = re.compile(r"^[0-9a-f]{64}$")
#: A program name becomes a directory of the profile store: no '/', no leading '.'.
PROGRAM_RE = re.compile(r"^(?!\.)[A-Za-z0-9_.+-]{1,64}$")
OWNER_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}$")
#: ``slotN@...`` or ``slotN_M@...``: group 1 the short name, 2 the slot id, 3 the dynamic index.
SLOT_NAME_RE = re.compile(r"^(slot(\d{1,4})(?:_(\d{1,6}))?)@")
SHORT_SLOT_RE = re.compile(r"^slot\d{1,4}(?:_\d{1,6})?$")
JOB_ID_RE = re.compile(r"^(\d{1,12})\.(\d{1,9})$")


class RuleError(ValueError):
    """A value breaks a rule; the message names the attribute and what is wrong."""


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def count(attr: str, value: Any, low: int, high: int) -> int:
    """An integer count within [low, high]: an int, or a real with no fractional part."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise RuleError(f"{attr} = {_shown(value)} is not a number")
    if isinstance(value, float):
        if not math.isfinite(value) or not value.is_integer():
            raise RuleError(f"{attr} = {_shown(value)} is not an integer")
        value = int(value)
    if not low <= value <= high:
        raise RuleError(f"{attr} = {value if abs(value) < MAX_INT * 10 else 'huge'} is outside [{low}, {high}]")
    return value


def number(attr: str, value: Any, low: float, high: float) -> float:
    """A finite real within [low, high]."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise RuleError(f"{attr} = {_shown(value)} is not a number")
    value = float(value)
    if not math.isfinite(value) or not low <= value <= high:
        raise RuleError(f"{attr} = {value:g} is outside [{low:g}, {high:g}]")
    return value


def device_request(memory_attr: str, memory: Any, compute_attr: str, compute: Any) -> Optional[Tuple[int, int]]:
    """(memory_mb, compute units) a job asks of one device, None when it asks no device memory.

    A device job is one that requests device memory (``COSCHED_DEVICE_JOB`` of
    config.d/20: ``RequestPhiMemory > 0``); it must then request at least one compute unit
    (Section III of paper 002: every offload runs threads on the card). A job that requests
    compute but no memory is no device job: device slots never start it.
    """
    if memory is None or (not isinstance(memory, (bool, str)) and isinstance(memory, (int, float))
                          and memory == 0):
        return None
    memory_mb = count(memory_attr, memory, 1, MAX_INT)
    if compute is None:
        raise RuleError(f"{compute_attr} is missing (a job that requests {memory_attr} needs at least 1)")
    return memory_mb, count(compute_attr, compute, 1, MAX_UNITS)


def program_name(value: Any, attr: str = "CoSchedProgram") -> str:
    if not isinstance(value, str) or not PROGRAM_RE.match(value):
        raise RuleError(f"{attr} = {_shown(value)} is not a program name "
                        "(letters, digits, _ . + -, at most 64, no leading '.')")
    return value


def scale_factor(value: Any, attr: str = "CoSchedPinScale") -> int:
    k = count(attr, value, 1, max(SCALE_FACTORS))
    if k not in SCALE_FACTORS:
        raise RuleError(f"{attr} = {k} is not one of {SCALE_FACTORS}")
    return k


def llc_ways(value: Any, attr: str = "CoSchedPinLLCWays", high: int = CBM_WIDTH_MAX) -> int:
    """A proc's share of its job's LLC ways; 0 is allowed (it runs in its job's group)."""
    return count(attr, value, 0, high)


def mem_bw_gbs(value: Any, attr: str = "CoSchedPinMemBW", high: float = MAX_BW_GBS) -> float:
    return number(attr, value, 0.0, high)


def job_id(cluster: Any, proc: Any) -> Tuple[int, int]:
    """(ClusterId, ProcId) as integers; a fractional id is refused, never rounded."""
    return count("ClusterId", cluster, 0, MAX_CLUSTER_ID), count("ProcId", proc, 0, MAX_PROC_ID)


def device_name(value: Any, attr: str = "device name") -> str:
    if not isinstance(value, str) or not DEVICE_RE.match(value):
        raise RuleError(f"{attr} = {_shown(value)} is not a device name")
    return value
