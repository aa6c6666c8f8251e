"""The interference profiles node agents record (``cosched_node.interference_duty``), read on the
sidecar's host: each record checked, and one profile per program, keyed by (Owner, sha256 of
its executable), each signal the median over the program's records (runs alone on a node: the
paper's dedicated runs, Section 3.3 step 2).

Records live under ``<COSCHED_PROFILE_RUNS_DIR>/interference/<owner>/<sha256>/<job>.json``, the
directory the agents' ``--profile-dir`` share with the spread jobs' run records. Only root on an
execute node writes them; still, a record that does not read (not JSON, too large, another
version, its owner or hash not those of its directory, a signal not a finite number >= 0) is
left out and named, and the rest are used. Parsed records are cached by path, size and
modification time, so a cycle reads only what changed.
"""
from __future__ import annotations

import json
import math
import os
import statistics
from collections.abc import Mapping
from dataclasses import dataclass, field

from cosched_node.interference_duty import RECORD_VERSION, records_of
from cosched_node.runs import MAX_RECORD_BYTES

from condor_sched.interference.dataset import SOFTWARE_SIGNALS

ProgramKey = tuple[str, str]
MAX_RECORDS = 20000
#: A signal beyond this is not a measurement (rates per second, shares, log2 MiB).
MAX_SIGNAL = 1e9


class ProfileRecordError(ValueError):
    """A record that cannot be used; the message names the file and the field."""


def check_record(path: str, text: str, owner: str, exe: str) -> dict[str, float]:
    """The record's signals (those the model knows), or ProfileRecordError naming what is wrong."""
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ProfileRecordError(f"{path}: not JSON ({exc.msg})") from None
    if not isinstance(obj, dict):
        raise ProfileRecordError(f"{path}: not a JSON object")
    if obj.get("version") != RECORD_VERSION:
        raise ProfileRecordError(f"{path}: version must be {RECORD_VERSION}, got {obj.get('version')!r}")
    if obj.get("owner") != owner or obj.get("exe_sha256") != exe:
        raise ProfileRecordError(f"{path}: owner and exe_sha256 must name its directory ({owner}/{exe[:12]}...)")
    signals = obj.get("signals")
    if not isinstance(signals, dict):
        raise ProfileRecordError(f"{path}: signals must be an object")
    out = {}
    for name in SOFTWARE_SIGNALS:
        value = signals.get(name)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
                or not 0 <= value <= MAX_SIGNAL:
            raise ProfileRecordError(f"{path}: signals.{name} must be a finite number in [0, {MAX_SIGNAL:g}], "
                                     f"got {str(value)[:40]!r}")
        out[name] = float(value)
    if not out:
        raise ProfileRecordError(f"{path}: no known signal ({', '.join(SOFTWARE_SIGNALS[:3])}, ...)")
    return out


@dataclass
class ProfileReader:
    """Reads a profile directory cycle after cycle, parsing only records that changed."""

    directory: str
    _parsed: dict[str, tuple[tuple[int, int], dict[str, float] | None]] = field(default_factory=dict)
    problems: dict[str, str] = field(default_factory=dict)

    def read(self) -> dict[ProgramKey, dict[str, float]]:
        """Every program's profile now (the medians of its good records); bad records in ``problems``."""
        seen: dict[ProgramKey, list[dict[str, float]]] = {}
        paths = records_of(self.directory)
        if len(paths) > MAX_RECORDS:
            self.problems[self.directory] = f"more than {MAX_RECORDS} records: the rest are not read"
        else:
            self.problems.pop(self.directory, None)
        live = set(paths[:MAX_RECORDS])
        for path in paths[:MAX_RECORDS]:
            owner, exe = path.split(os.sep)[-3:-1]
            signals = self._record(path, owner, exe)
            if signals is not None:
                seen.setdefault((owner, exe), []).append(signals)
        for gone in [p for p in self._parsed if p not in live]:
            del self._parsed[gone]
            self.problems.pop(gone, None)
        return {key: _medians(records) for key, records in sorted(seen.items())}

    def _record(self, path: str, owner: str, exe: str) -> dict[str, float] | None:
        try:
            info = os.stat(path)
        except OSError:
            return None
        stamp = (info.st_size, info.st_mtime_ns)
        cached = self._parsed.get(path)
        if cached is not None and cached[0] == stamp:
            return cached[1]
        signals: dict[str, float] | None = None
        try:
            if info.st_size > MAX_RECORD_BYTES:
                raise ProfileRecordError(f"{path}: larger than {MAX_RECORD_BYTES} bytes")
            with open(path, "rb") as handle:
                text = handle.read(MAX_RECORD_BYTES + 1).decode("utf-8")
            signals = check_record(path, text, owner, exe)
            self.problems.pop(path, None)
        except (OSError, UnicodeDecodeError) as exc:
            self.problems[path] = f"{path}: cannot be read ({getattr(exc, 'strerror', None) or exc})"
        except ProfileRecordError as exc:
            self.problems[path] = str(exc)
        self._parsed[path] = (stamp, signals)
        return signals


def _medians(records: list[Mapping[str, float]]) -> dict[str, float]:
    names = sorted({n for r in records for n in r})
    return {n: statistics.median(r[n] for r in records if n in r) for n in names}
