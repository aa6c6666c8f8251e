"""The profile-driven runtime model: parallel CPU jobs slowed by their co-runners (paper 000).

A parallel job placed on n nodes runs at scale k = n / ceil(P/T) (P processes, T cores of
the largest node) and, alone, takes its profile's exclusive run time t(k) (Section 4.1),
linearly interpolated between profiled scales and flat beyond them (``cs`` may spread a
job to an unprofiled scale, e.g. 3 nodes: it then runs at the interpolated time; one-node
programs such as GAN stay on one node under every policy). Its remaining work, in exclusive
seconds, drains at a rate r <= 1 recomputed at every start and finish in the pool.

Per SOCKET (the unit of LLC ways and memory controllers, and of the policies' accounting;
a node's 118 GB/s STREAM peak is two sockets of 59 GB/s), with W ways and peak B GB/s, a
job j with m_j procs there at scale k:

* Ways (Section 4.4: ways left over are given away in equal shares). A job the policy gave
  g_j > 0 ways (``group_llc_ways``: ``sns``, ``sns-global``, ``ce``) keeps them; the rest
  R = W - sum g_j goes to the jobs given none, in proportion to their bandwidth demand
  with all ways d_j = m_j * bw_k(W) (under ``cs`` every job shares all W ways this way: a
  job's LLC occupancy follows its miss traffic), or, when every job has ways, in equal
  shares R / |jobs|. That is the job's effective ways e_j.
* LLC per process: the curves at scale k were measured with the profiled layout's r_j
  procs per socket (below); m_j procs sharing e_j ways have e_j / m_j ways each, which the
  curves give at e'_j = min(W, e_j * r_j / m_j) ways (Sec. 2 / Fig. 5: spreading lowers
  the miss rate "thanks to increased LLC capacity"; crowding raises it).
* Cache: IPC factor c_j = IPC_k(e'_j) / IPC_k(W) on the IPC-LLC curve (its exclusive run
  had all W ways), so fewer ways than w lower IPC along the curve (below alpha * F-IPC).
* Bandwidth: demand D = sum_j m_j * bw_k(e'_j) on the BW-LLC curve. When D > B every job
  there slows in proportion, factor B / D; normalised by the job's own state in its
  profiled exclusive run, a_j = min(1, B / (r_j * bw_k(W))), with r_j = P / (n * S) its
  procs per socket when its P procs are split evenly over its n nodes and their S sockets
  each (the profiled layout: 16 processes "8 cores per socket", Section 6.1; t(k) already
  contains that run's own saturation): b_j = min(1, min(1, B / D) / a_j). A placement that
  crowds more of the job's procs onto one socket than the profiled layout pays for it
  (Section 2: per-node bandwidth levels off at the STREAM peak from about 8 cores).
* A parallel job moves at the pace of its slowest process: r = min over its sockets of
  c_j * b_j.

So a job alone on its sockets runs exactly t(k); two jobs whose summed demand on a socket
is 1.5 B (each within B alone) both run 1.5 times longer there.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Mapping, Sequence

from condor_sched.model import Slot
from condor_sched.profiles import Curve, Profile, ProfileStore, interpolate

if TYPE_CHECKING:  # pragma: no cover
    from condor_sched.simulate.offload import Clock
    from condor_sched.simulate.workloads import SimJob


class ProfileModelError(ValueError):
    """A parallel job whose program has no profile."""


def curve_at(curves: Mapping[int, Curve], k: float) -> Curve:
    """The curve measured at the largest profiled scale <= k (scale 1 at least)."""
    return curves[max((s for s in curves if s <= k), default=min(curves))]


def exclusive_runtime_s(profile: Profile, k: float) -> float:
    """t(k): the profile's exclusive run time, linear between profiled scales <= max_scale
    and flat beyond the first and last."""
    points = sorted((s, t) for s, t in profile.runtime_s.items() if s <= profile.max_scale)
    return interpolate(tuple((float(s), t) for s, t in points), k)


@dataclass(frozen=True, slots=True)
class SocketShare:
    """A job's procs on one socket slot and the ways the policy partitioned for it there."""

    slot: str
    procs: int
    group_ways: int


@dataclass(slots=True)
class _Running:
    job: SimJob
    profile: Profile
    scale: float
    shares: tuple[SocketShare, ...]
    remaining_s: float
    #: Procs per socket in the profiled layout: P / (nodes * sockets per node).
    reference_procs_per_socket: float = 0.0
    rate: float = 0.0
    version: int = 0
    work_done_s: float = 0.0
    min_rate: float = 1.0


@dataclass(slots=True)
class PoolRuntime:
    """The running parallel jobs of a pool under the model of this module's docstring."""

    profiles: ProfileStore
    sockets: Mapping[str, Slot]
    cores_per_node: int
    clock: Clock
    record: bool = False
    #: Socket-seconds during which bandwidth demand exceeded the socket's peak.
    bw_oversubscribed_s: float = 0.0
    #: Exclusive-seconds of work each finished job did (sum of rate x dt), by job index.
    work_done_s: dict[int, float] = field(default_factory=dict)
    #: Lowest rate each finished job ran at, by job index.
    min_rate: dict[int, float] = field(default_factory=dict)
    #: (time_s, {job index: rate}) after every event, when recording is on.
    rate_log: list[tuple[float, dict[int, float]]] = field(default_factory=list)
    _running: dict[int, _Running] = field(default_factory=dict)
    _last_s: float = 0.0
    _saturated: int = 0

    def admit(self, job: SimJob, shares: Sequence[SocketShare], nodes: int, now: float) -> tuple[float, float]:
        """Start ``job`` with ``shares`` on ``nodes`` nodes; return (scale k, t(k))."""
        profile = self.profiles.get(job.program)
        if profile is None:
            raise ProfileModelError(f"job {job.index}: no profile for program {job.program!r}")
        scale = nodes / max(1, math.ceil(job.procs / self.cores_per_node))
        runtime = exclusive_runtime_s(profile, scale)
        self._advance(now)
        machines = {self.sockets[s.slot].machine for s in shares}
        per_node = max((sum(1 for x in self.sockets.values() if x.machine == m) for m in machines), default=1)
        reference = job.procs / max(1, len(machines)) / max(1, per_node)
        self._running[job.index] = _Running(job, profile, scale, tuple(shares), runtime, reference)
        self._reschedule(now)
        return scale, runtime

    def rates(self) -> dict[int, float]:
        """The current rate of every running job (by index)."""
        return {i: r.rate for i, r in sorted(self._running.items())}

    # --- internals -------------------------------------------------------------------------

    def _advance(self, now: float) -> None:
        dt = now - self._last_s
        if dt > 0:
            for r in self._running.values():
                r.remaining_s -= r.rate * dt
                r.work_done_s += r.rate * dt
            self.bw_oversubscribed_s += self._saturated * dt
        self._last_s = now

    def _rates(self) -> tuple[dict[int, float], int]:
        """Every running job's rate, and how many sockets are over their peak."""
        by_socket: dict[str, list[tuple[_Running, SocketShare]]] = {}
        for _, r in sorted(self._running.items()):
            for share in r.shares:
                by_socket.setdefault(share.slot, []).append((r, share))
        rate = {i: 1.0 for i in self._running}
        saturated = 0
        for name in sorted(by_socket):
            jobs = by_socket[name]
            total = self.sockets[name].total
            ways, peak = float(total.llc_ways), float(total.mem_bw_gbs)
            full_bw = [s.procs * interpolate(curve_at(r.profile.bw_llc_gbs, r.scale), ways) for r, s in jobs]
            left = max(0.0, ways - sum(s.group_ways for _, s in jobs))
            shared = [i for i, (_, s) in enumerate(jobs) if s.group_ways <= 0]
            effective = [float(s.group_ways) for _, s in jobs]
            if shared:
                weight = sum(full_bw[i] for i in shared)
                for i in shared:
                    effective[i] = left * (full_bw[i] / weight if weight > 0 else 1.0 / len(shared))
            else:
                effective = [e + left / len(jobs) for e in effective]
            # LLC per process: the curves at scale k hold for the profiled layout's procs per
            # socket; m procs in e ways see what the curve gives at e * reference / m ways.
            effective = [min(ways, e * r.reference_procs_per_socket / s.procs) if s.procs > 0 else e
                         for (r, s), e in zip(jobs, effective)]
            demand = sum(s.procs * interpolate(curve_at(r.profile.bw_llc_gbs, r.scale), e)
                         for (r, s), e in zip(jobs, effective))
            contended = min(1.0, peak / demand) if demand > 0 else 1.0
            saturated += demand > peak
            for (r, s), e in zip(jobs, effective):
                ipc = curve_at(r.profile.ipc_llc, r.scale)
                cache = interpolate(ipc, e) / interpolate(ipc, ways)
                own = r.reference_procs_per_socket * interpolate(curve_at(r.profile.bw_llc_gbs, r.scale), ways)
                alone = min(1.0, peak / own) if own > 0 else 1.0
                bandwidth = min(1.0, contended / alone)
                rate[r.job.index] = min(rate[r.job.index], cache * bandwidth)
        return rate, saturated

    def _reschedule(self, now: float) -> None:
        rates, self._saturated = self._rates()
        for i, r in sorted(self._running.items()):
            new = rates[i]
            r.min_rate = min(r.min_rate, new)
            if new == r.rate:
                continue
            r.rate = new
            r.version += 1
            end = now + max(0.0, r.remaining_s) / new
            self.clock.schedule(end, lambda t, i=i, v=r.version: self._end(i, v, t))
        if self.record:
            self.rate_log.append((now, self.rates()))

    def _end(self, index: int, version: int, now: float) -> None:
        r = self._running.get(index)
        if r is None or r.version != version:
            return
        self._advance(now)
        del self._running[index]
        self.work_done_s[index] = r.work_done_s
        self.min_rate[index] = r.min_rate
        self.clock.job_finished(r.job, now)
        self._reschedule(now)


@dataclass(frozen=True, slots=True)
class ProfileDrivenModel:
    """Paper 000's jobs: exclusive run times per scale, slowed by shared ways and bandwidth."""

    profiles: ProfileStore
    name: str = "profile"

    def device(self, hardware_threads: int, clock: Clock, record: bool = False):
        raise NotImplementedError("the profile model runs parallel CPU jobs; device jobs use the offload model")

    def pool(self, sockets: Sequence[Slot], cores_per_node: int, clock: Clock, record: bool = False) -> PoolRuntime:
        return PoolRuntime(self.profiles, {s.name: s for s in sockets}, cores_per_node, clock, record)
