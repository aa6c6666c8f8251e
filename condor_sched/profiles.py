"""Program profiles for Spread-n-Share (Section 4.1 of paper 000): one YAML file per program.

A profile holds what SNS's profiler measures in exclusive runs of a program: the run time
at each scale factor, and the IPC-LLC and BW-LLC curves (performance and memory bandwidth
against the LLC ways allocated), sampled at a few way counts and linearly interpolated
between them (Section 5.1: "samples ... at 2, 4, 8, and 20 ways only and performs linear
interpolation"). Spreading changes the curves, so they are kept per scale factor where
measured.

Schema (units in the key names)::

    program: MG                  # [A-Za-z0-9][A-Za-z0-9_.+-]*, unique in a store;
                                 # matched case-insensitively against Job.program
    max_scale: 8                 # largest scale factor the program supports (1: one node)
    reference_processes: 16      # optional: processes of the profiled runs (information)
    runtime_s:                   # exclusive run time per scale factor; >= 1 entry, must
      1: 400.0                   # include 1; scale factors are 1, 2, 4 or 8
      2: 360.0
    curves:                      # per scale factor; must include 1; a scale without its
      1:                         # own curves uses those of the nearest smaller scale
        ipc_llc: [[2, 0.85], [4, 0.97], [20, 1.0]]   # [ways, IPC]; ways strictly rising
        bw_llc_gbs: [[2, 7.4], [20, 7.0]]            # [ways, GB/s PER PROCESS]

Bandwidth is per process (the average over a job's processes, Section 4.1), so a socket
hosting m processes of a job needs m times the curve's value.

Class (Sections 4.2 and 6.1), from the run times of the scales up to ``max_scale``:

* ``neutral``: run times within ``NEUTRAL_SPREAD`` (5%, the paper's rule) of each other:
  (slowest - fastest) / fastest <= 0.05;
* ``scaling``: otherwise, when the fastest scale is more than ``SCALING_GAIN`` (5%) faster
  than k = 1: t(1) / t(best) > 1.05;
* ``compact``: everything else, and every program that runs on one node only
  (``max_scale: 1``, e.g. GAN and RNN), which cannot be spread at all.

A file that cannot be used (not UTF-8, not YAML, beyond the reader's bounds, an unknown
key, a value out of range) raises :class:`ProfileError` naming the file and the field;
:meth:`ProfileStore.load_dir` skips such a file and records why in ``store.skipped`` (the
sidecar logs one warning line per skipped file and runs on). A directory that cannot be
listed, or holds more than ``MAX_PROFILE_FILES`` files, is an error.
"""
from __future__ import annotations

import enum
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping

from condor_sched import resources
from condor_sched.model import Skipped
from condor_sched.yamlio import MAX_NUMBER, check_keys, load_yaml, shown

SCALE_FACTORS = (1, 2, 4, 8)
NEUTRAL_SPREAD = 0.05
SCALING_GAIN = 0.05
PROGRAM_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.+-]{0,63}$")
#: The most [ways, value] points of one curve (profilers sample a few way counts), and the
#: most profile files of a directory.
MAX_CURVE_POINTS = 64
MAX_PROFILE_FILES = 10_000
PROFILE_KEYS = ("program", "max_scale", "reference_processes", "runtime_s", "curves")
CURVE_KEYS = ("ipc_llc", "bw_llc_gbs")
_EPS = 1e-9


class ProfileError(ValueError):
    """A profile that cannot be used; the message names the file and the field."""


class ProgramClass(str, enum.Enum):
    SCALING = "scaling"
    NEUTRAL = "neutral"
    COMPACT = "compact"


Curve = tuple[tuple[float, float], ...]


def interpolate(curve: Curve, ways: float) -> float:
    """Linear interpolation on a curve of (ways, value) points, flat beyond both ends."""
    if ways <= curve[0][0]:
        return curve[0][1]
    for (x0, y0), (x1, y1) in zip(curve, curve[1:]):
        if ways <= x1:
            return y0 + (y1 - y0) * (ways - x0) / (x1 - x0)
    return curve[-1][1]


@dataclass(frozen=True, slots=True)
class Profile:
    """One program's exclusive-run profile (Section 4.1 of paper 000)."""

    program: str
    max_scale: int
    runtime_s: Mapping[int, float]
    ipc_llc: Mapping[int, Curve]
    bw_llc_gbs: Mapping[int, Curve]
    source: str = "<profile>"
    reference_processes: int | None = None

    @property
    def program_class(self) -> ProgramClass:
        times = [self.runtime_s[k] for k in self.scales()]
        if len(times) < 2 or self.max_scale == 1:
            return ProgramClass.COMPACT
        if (max(times) - min(times)) / min(times) <= NEUTRAL_SPREAD + _EPS:
            return ProgramClass.NEUTRAL
        if self.runtime_s[1] / min(times) > 1.0 + SCALING_GAIN + _EPS:
            return ProgramClass.SCALING
        return ProgramClass.COMPACT

    def scales(self) -> list[int]:
        """Profiled scale factors up to ``max_scale``, fastest exclusive run first (Fig. 11's
        order of fallback); ties go to the smaller scale."""
        ks = [k for k in self.runtime_s if k <= self.max_scale]
        return sorted(ks, key=lambda k: (self.runtime_s[k], k))

    def speedup(self, k: int) -> float:
        """t(1) / t(k): how much faster scale ``k`` ran than compact-exclusive."""
        return self.runtime_s[1] / self.runtime_s[k]

    def predicted_slowdown(self, alpha: float, k: int, full_ways: int) -> float:
        """Run time at scale ``k`` holding the w ways of Fig. 10, over the exclusive run time
        at k = 1: t(k) / t(1) * F-IPC / IPC(w). A scale "meets the degradation constraint
        alpha" (Section 5.1, Fig. 11) when this is at most 1 / alpha."""
        w, _ = self.demand(alpha, k, full_ways)
        ipc = self._curve(self.ipc_llc, k)
        full = interpolate(ipc, min(max(1, int(full_ways)), ipc[-1][0]))
        return full / interpolate(ipc, w) / self.speedup(k)

    def _curve(self, curves: Mapping[int, Curve], k: int) -> Curve:
        return curves[max(s for s in curves if s <= k)]

    def demand(self, alpha: float, k: int, full_ways: int) -> tuple[int, float]:
        """(w, b) of Fig. 10 at scale ``k``: w, the fewest ways (no fewer than the smallest
        sampled count, at most ``full_ways``) whose interpolated IPC reaches
        T-IPC = alpha * F-IPC, F-IPC being the IPC with all ``full_ways`` ways; b, the
        per-process bandwidth (GB/s) the BW-LLC curve gives at w ways (Section 4.3)."""
        ipc = self._curve(self.ipc_llc, k)
        full_ways = max(1, int(full_ways))
        target = alpha * interpolate(ipc, min(full_ways, ipc[-1][0]))
        w = full_ways
        for ways in range(max(1, math.ceil(ipc[0][0])), full_ways + 1):
            if interpolate(ipc, ways) >= target - _EPS:
                w = ways
                break
        return w, interpolate(self._curve(self.bw_llc_gbs, k), w)


def _fail(source: str, field_: str, message: str) -> ProfileError:
    return ProfileError(f"{source}: field '{field_}': {message}")


def _positive(source: str, field_: str, value: Any) -> float:
    if (isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0
            or value > MAX_NUMBER):
        raise _fail(source, field_, f"must be a positive number up to {MAX_NUMBER:g}, got {shown(value)}")
    return float(value)


def _scale(source: str, field_: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value not in SCALE_FACTORS:
        raise _fail(source, field_, f"scale factors are one of {SCALE_FACTORS}, got {shown(value)}")
    return value


def _curve(source: str, field_: str, raw: Any, nonnegative: bool) -> Curve:
    if not isinstance(raw, list) or not 1 <= len(raw) <= MAX_CURVE_POINTS:
        raise _fail(source, field_, f"must be a list of 1 to {MAX_CURVE_POINTS} [ways, value] pairs")
    points: list[tuple[float, float]] = []
    for i, p in enumerate(raw):
        where = f"{field_}[{i}]"
        if not isinstance(p, list) or len(p) != 2:
            raise _fail(source, where, f"must be a [ways, value] pair, got {shown(p)}")
        ways = _positive(source, f"{where}.ways", p[0])
        value = p[1]
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0 or (
            not nonnegative and value == 0
        ) or value > MAX_NUMBER:
            raise _fail(source, f"{where}.value",
                        f"must be a {'non-negative' if nonnegative else 'positive'} number, got {shown(value)}")
        if points and ways <= points[-1][0]:
            raise _fail(source, f"{where}.ways", "way counts must be strictly increasing")
        points.append((ways, float(value)))
    return tuple(points)


def parse_profile(data: Any, source: str = "<profile>") -> Profile:
    """Validate one profile document (the schema of this module) and build its Profile."""
    if not isinstance(data, dict):
        raise ProfileError(f"{source}: top level must be a mapping")
    check_keys(source, data, PROFILE_KEYS, ProfileError)
    program = data.get("program")
    if not isinstance(program, str) or not PROGRAM_NAME.match(program):
        raise _fail(source, "program", f"must match {PROGRAM_NAME.pattern}, got {shown(program)}")
    max_scale = _scale(source, "max_scale", data.get("max_scale"))
    ref = data.get("reference_processes")
    if ref is not None and (isinstance(ref, bool) or not isinstance(ref, int) or not 1 <= ref <= MAX_NUMBER):
        raise _fail(source, "reference_processes", f"must be a positive integer, got {shown(ref)}")
    raw_rt = data.get("runtime_s")
    if not isinstance(raw_rt, dict) or not raw_rt:
        raise _fail(source, "runtime_s", "must be a non-empty mapping scale factor -> seconds")
    runtime = {_scale(source, f"runtime_s.{shown(k)}", k): _positive(source, f"runtime_s.{shown(k)}", v)
               for k, v in raw_rt.items()}
    if 1 not in runtime:
        raise _fail(source, "runtime_s.1", "the compact-exclusive run time (scale 1) is required")
    raw_curves = data.get("curves")
    if not isinstance(raw_curves, dict) or not raw_curves:
        raise _fail(source, "curves", "must be a non-empty mapping scale factor -> {ipc_llc, bw_llc_gbs}")
    ipc: dict[int, Curve] = {}
    bw: dict[int, Curve] = {}
    for k, c in raw_curves.items():
        k = _scale(source, f"curves.{shown(k)}", k)
        if not isinstance(c, dict):
            raise _fail(source, f"curves.{k}", "must be a mapping with 'ipc_llc' and 'bw_llc_gbs'")
        check_keys(f"{source}: curves.{k}", c, CURVE_KEYS, ProfileError)
        ipc[k] = _curve(source, f"curves.{k}.ipc_llc", c.get("ipc_llc"), nonnegative=False)
        bw[k] = _curve(source, f"curves.{k}.bw_llc_gbs", c.get("bw_llc_gbs"), nonnegative=True)
    if 1 not in ipc:
        raise _fail(source, "curves.1", "the curves at scale 1 are required")
    return Profile(program, max_scale, runtime, ipc, bw, source, ref)


def load_profile(path: str | Path) -> Profile:
    return parse_profile(load_yaml(path, ProfileError), str(path))


@dataclass
class ProfileStore:
    """Profiles by program name (case-insensitive), plus the files skipped and why."""

    profiles: dict[str, Profile] = field(default_factory=dict)
    skipped: list[Skipped] = field(default_factory=list)

    @classmethod
    def of(cls, profiles: Iterable[Profile]) -> ProfileStore:
        store = cls()
        for p in profiles:
            store.add(p)
        return store

    @classmethod
    def load_dir(cls, directory: str | Path) -> ProfileStore:
        """Every ``*.yaml``/``*.yml`` file of ``directory``, in name order; a bad file or a
        repeated program is skipped with its reason in ``skipped``."""
        store = cls()
        directory = Path(directory)
        if not directory.is_dir():
            store.skipped.append(Skipped(str(directory), "profile directory does not exist"))
            return store
        try:
            files = sorted(p for p in directory.iterdir() if p.suffix in (".yaml", ".yml"))
        except OSError as e:
            raise ProfileError(f"{directory}: cannot list the profile directory: {e.strerror}") from None
        if len(files) > MAX_PROFILE_FILES:
            raise ProfileError(f"{directory}: more than {MAX_PROFILE_FILES} profile files")
        for path in files:
            try:
                store.add(load_profile(path))
            except ProfileError as e:
                store.skipped.append(Skipped(str(path), str(e).removeprefix(f"{path}: ")))
        return store

    def add(self, profile: Profile) -> None:
        key = profile.program.lower()
        if key in self.profiles:
            raise ProfileError(f"{profile.source}: field 'program': {profile.program!r} already defined in "
                               f"{self.profiles[key].source}")
        self.profiles[key] = profile

    def get(self, program: str) -> Profile | None:
        return self.profiles.get(program.lower()) if program else None

    def __contains__(self, program: object) -> bool:
        return isinstance(program, str) and self.get(program) is not None

    def __len__(self) -> int:
        return len(self.profiles)


def default_profiles_dir() -> Path:
    """The profiles shipped with the package (``examples/profiles`` of the repository)."""
    return resources.profiles_dir()
