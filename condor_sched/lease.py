"""One sidecar at a time: a lease held through the sidecar's own collector ad.

Two sidecars editing one pool would pin jobs against each other. Each sidecar advertises a
``CoSchedSidecar`` ad after every cycle, at most ``COSCHED_INTERVAL`` seconds apart (plus
the cycle), and that ad's ``ClassAdLifetime`` (3 intervals and 30 s) is its lease: an ad
the collector heard from (``LastHeardFrom``) within its lifetime is a live sidecar, unless it
names this very host and a process that is no longer a sidecar (one that crashed or was
killed: its ad does not block a restart). The rules, applied by ``condor_sched.daemon``:

- At start a sidecar refuses to run while another holds a live lease, naming it.
- Otherwise it claims: it advertises its ad, waits :data:`SETTLE_S` and looks again. Of
  sidecars that claimed at the same moment, the one that started first runs
  (``DaemonStartTime``, then ``Machine``, ``Name``, ``CoSchedPid``: every sidecar computes
  the same order) and the others exit.
- Before each cycle it looks again: a live rival that started first makes it stop (e.g. a
  sidecar that started while the collector had lost the first one's ad).
- A dry run (``CoSchedDryRun``) edits nothing: it neither holds nor respects the lease.

Pure functions of ads and the clock; the daemon does the I/O.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

#: Seconds a claiming sidecar waits before it looks for rivals that claimed at the same time.
SETTLE_S = 1.0


class LeaseHeld(RuntimeError):
    """Another sidecar holds the pool's lease: this one must not run."""


@dataclass(frozen=True, slots=True, order=True)
class SidecarId:
    """Who a sidecar is; ordered by start (the one that started first sorts first)."""

    start_time: int
    machine: str
    name: str
    pid: int

    @classmethod
    def of_ad(cls, ad: Mapping[str, Any]) -> SidecarId | None:
        """The sidecar an ad describes; None for an ad without a usable identity."""
        start, pid = ad.get("DaemonStartTime"), ad.get("CoSchedPid")
        if not isinstance(start, int) or not isinstance(pid, int):
            return None
        return cls(start, str(ad.get("Machine", "")), str(ad.get("Name", "")), pid)


@dataclass(frozen=True, slots=True)
class Rival:
    """Another live sidecar, as its ad shows it."""

    id: SidecarId
    heard_s_ago: float
    lease_s: int

    def describe(self, now: float) -> str:
        return (f"{self.id.name} on {self.id.machine}, pid {self.id.pid}, running for "
                f"{_duration(now - self.id.start_time)}, its ad updated {_duration(self.heard_s_ago)} ago "
                f"(lease {self.lease_s} s)")


def _duration(seconds: float) -> str:
    s = max(int(seconds), 0)
    if s < 120:
        return f"{s} s"
    if s < 7200:
        return f"{s // 60} min {s % 60} s"
    return f"{s // 3600} h {s % 3600 // 60} min"


def sidecar_alive(pid: int) -> bool:
    """Whether process ``pid`` of this host is a condor-sched process (a reused pid is not)."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except FileNotFoundError:
        return False
    except OSError:  # no /proc to read: ask the kernel whether the pid exists
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True
    return b"condor-sched" in cmdline or b"condor_sched" in cmdline


#: The lease of an ad without ClassAdLifetime: 3 intervals of 60 s + 30 s.
DEFAULT_LEASE_S = 210


def heard_and_lease(ad: Mapping[str, Any], now: float, default_lease_s: int = DEFAULT_LEASE_S) -> tuple[float, int]:
    """(seconds since the collector heard from the ad's sidecar, its lease in seconds). An ad
    without ``LastHeardFrom`` counts as just heard (the collector drops it at its lifetime)."""
    lease_s = ad.get("ClassAdLifetime")
    lease_s = lease_s if isinstance(lease_s, int) and not isinstance(lease_s, bool) and lease_s > 0 \
        else default_lease_s
    heard = ad.get("LastHeardFrom")
    return (now - heard if isinstance(heard, (int, float)) and not isinstance(heard, bool) else 0.0), lease_s


def within_lease(ad: Mapping[str, Any], now: float) -> bool:
    """Whether the ad's sidecar was heard from within its lease."""
    heard_s_ago, lease_s = heard_and_lease(ad, now)
    return heard_s_ago <= lease_s


def live_rivals(ads: Iterable[Mapping[str, Any]], me: SidecarId, now: float,
                alive: Callable[[int], bool] = sidecar_alive, default_lease_s: int = DEFAULT_LEASE_S) -> list[Rival]:
    """The sidecars other than ``me`` that hold a live lease, first started first.

    An ad is live while ``now - LastHeardFrom`` is within its ``ClassAdLifetime`` (an ad
    without ``LastHeardFrom`` counts as live: the collector drops it at its lifetime anyway);
    one of this host whose process is no longer a sidecar is not. Dry runs hold no lease.
    """
    rivals = []
    for ad in ads:
        other = SidecarId.of_ad(ad)
        if other is None or other == me or ad.get("CoSchedDryRun") is True:
            continue
        heard_s_ago, lease_s = heard_and_lease(ad, now, default_lease_s)
        if heard_s_ago > lease_s:
            continue
        if other.machine == me.machine and not alive(other.pid):
            continue
        rivals.append(Rival(other, heard_s_ago, lease_s))
    return sorted(rivals, key=lambda r: r.id)


def refusal(rival: Rival, now: float) -> str:
    """Why this sidecar does not run, and what the admin can do."""
    return (f"another sidecar runs on this pool: {rival.describe(now)}. One sidecar at a time: "
            f"stop it first (condor_off -daemon COSCHED_SIDECAR on {rival.id.machine}), or wait until its "
            "ad is older than its lease; `condor-sched run --dry-run` may run beside it")


def first_rival_before(rivals: Iterable[Rival], me: SidecarId) -> Rival | None:
    """The first rival that started before ``me`` (it keeps the lease), if any."""
    return next((r for r in sorted(rivals, key=lambda r: r.id) if r.id < me), None)


def lease_status(ads: Iterable[Mapping[str, Any]], now: float, interval_s: float) -> str:
    """One line for ``explain --live``: which sidecar holds the lease and how old its last
    cycle is, or that none does (then no pin is made or kept fresh: what ``explain`` prints
    is what a cycle would decide, not what one did)."""
    live = [ad for ad in ads if ad.get("CoSchedDryRun") is not True and within_lease(ad, now)]
    if not live:
        return ("no sidecar holds the lease (no live CoSchedSidecar ad in the collector): no job is pinned or "
                "kept pinned until one runs; below is what a cycle would decide now")
    ad = max(live, key=lambda a: a.get("DaemonStartTime") or 0)
    who = f"sidecar {ad.get('Name', '?')} on {ad.get('Machine', '?')}"
    last = ad.get("CoSchedLastCycleTime")
    if not isinstance(last, (int, float)):
        return f"{who} holds the lease but has not finished a cycle yet; below is what a cycle would decide now"
    age = now - last
    if age > 3 * interval_s:
        return (f"{who} holds the lease, but its last cycle ended {_duration(age)} ago (cycles are due every "
                f"{_duration(interval_s)} at most): pins may be stale; below is what a cycle would decide now")
    return f"{who}: last cycle {_duration(age)} ago; below is what a cycle would decide now"
