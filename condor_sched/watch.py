"""Problems that last, warned once: schedds gone or not answering, the collector, skipped jobs.

The sidecar cycles every few seconds; a problem that lasts (a schedd stopped with
``condor_off``, the collector down, a job whose ad stays malformed) must not fill its log
with the same warning every cycle or every poll (issue 9, items 6 and 7). :class:`Notices`
warns once when a problem starts (or its kind changes) and logs once when it ends;
:class:`ScheddWatch` tells from each read which schedds the cycle could not see.
"""
from __future__ import annotations

import logging
from dataclasses import replace
from typing import TYPE_CHECKING, Callable, Mapping

from condor_sched.model import JobStatus, PoolState

if TYPE_CHECKING:
    from condor_sched.pool import LiveAds


class Notices:
    """Lasting problems by key: each warned when it starts, logged (info) when it ends."""

    def __init__(self, logger: logging.Logger) -> None:
        self._log = logger
        self._active: dict[str, str] = {}

    def warn(self, key: str, message: str, kind: str | None = None) -> bool:
        """Warn ``message`` unless ``key`` is already warned with the same ``kind`` (default:
        the message itself); True when it was logged."""
        kind = message if kind is None else kind
        if self._active.get(key) == kind:
            return False
        self._active[key] = kind
        self._log.warning("%s", message)
        return True

    def clear(self, key: str, message: str) -> bool:
        """Log ``message`` if ``key`` was warned (the problem ended); True when it was logged."""
        if self._active.pop(key, None) is None:
            return False
        self._log.info("%s", message)
        return True

    def active(self, key: str) -> bool:
        return key in self._active

    def settle(self, group: str, problems: Mapping[str, str], ended: Callable[[str], str]) -> None:
        """The current problems of ``group`` (subject -> warning): each new one warned once,
        ``ended(subject)`` logged for each earlier one that is no longer there."""
        prefix = f"{group}:"
        for subject, message in problems.items():
            self.warn(prefix + subject, message)
        for key in [k for k in self._active if k.startswith(prefix) and k[len(prefix):] not in problems]:
            self.clear(key, ended(key[len(prefix):]))


class ScheddWatch:
    """Which schedds a read could not see, with one warning each time one goes and one line
    when it is back.

    A schedd is known once it answered a read. One the collector lists that does not answer
    is *unreachable*; a known one whose ad left the collector (``condor_off`` removes it)
    is *gone*. Either is warned once per outage (a schedd shutting down is often unreachable
    first, then gone: one warning) and reported until it answers again (a gone schedd that
    never comes back is reported until the sidecar restarts). Its jobs are not planned meanwhile, and its
    pinned, not yet matched jobs are not reserved: another job may be pinned to their room,
    and HTCondor's own accounting lets only one of them match (the START expression admits
    only pinned jobs), so the worst outcome is a pin that waits and is unpinned later.
    """

    def __init__(self, notices: Notices) -> None:
        self.notices = notices
        self._idle_jobs: dict[str, int] = {}
        self._missing: dict[str, str] = {}

    def _its_jobs(self, name: str) -> str:
        if name not in self._idle_jobs:
            return "its idle co-scheduled jobs (none seen yet) are"
        n = self._idle_jobs[name]
        return f"its {n} idle co-scheduled job{'' if n == 1 else 's'} {'is' if n == 1 else 'are'}"

    def observe(self, answered: Mapping[str, int], unreachable: Mapping[str, str]) -> tuple[str, ...]:
        """One read: the idle co-scheduled jobs of each schedd that answered, the error of
        each listed one that did not. Returns every schedd not read, gone or unreachable."""
        for name, idle in answered.items():
            self._missing.pop(name, None)
            self._idle_jobs[name] = idle
            self.notices.clear(f"schedd:{name}", f"schedd {name} is back: {self._its_jobs(name)} planned again")
        for name, why in unreachable.items():
            self._missing[name] = "unreachable"
            self.notices.warn(f"schedd:{name}", f"schedd {name} is unreachable ({why}): {self._its_jobs(name)} "
                              "not planned until it answers; the other schedds go on", kind="missing")
        for name in sorted(self._idle_jobs.keys() - answered.keys() - unreachable.keys()):
            self._missing[name] = "gone"
            self.notices.warn(f"schedd:{name}", f"schedd {name} is gone (its ad left the collector, e.g. condor_off): "
                              f"{self._its_jobs(name)} not planned until it is back; the other schedds go on",
                              kind="missing")
        return tuple(sorted(self._missing))

    def missing(self) -> dict[str, str]:
        """Each schedd not read by the last read: ``gone`` or ``unreachable``."""
        return dict(self._missing)


def _default_read() -> LiveAds:
    from condor_sched import pool

    return pool.read_covered_ads(partial=True)


def _default_state(ads: LiveAds) -> PoolState:
    from condor_sched import pool

    return pool.covered_state(ads)


class WatchedRead:
    """The sidecar's read of the live pool: every schedd that answers is read, the others
    are reported once (:class:`ScheddWatch`) and named in ``unreachable_schedds``."""

    def __init__(self, watch: ScheddWatch, read_ads: Callable[[], LiveAds] = _default_read,
                 to_state: Callable[[LiveAds], PoolState] = _default_state) -> None:
        self.watch = watch
        self._read_ads = read_ads
        self._to_state = to_state

    def __call__(self) -> PoolState:
        ads = self._read_ads()
        answered = {name: sum(1 for ad in job_ads if ad.get("JobStatus") == JobStatus.IDLE.value)
                    for name, job_ads in ads.jobs.items()}
        missing = self.watch.observe(answered, ads.unreachable)
        return replace(self._to_state(ads), unreachable_schedds=missing)
