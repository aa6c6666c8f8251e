"""GPU sharing at scale and through daemon restarts, on the real pool (issue 13).

node6 is one partitionable slot with two fake Tesla T4s (15360 MB, 1000 compute each). Two
users submit more GPU share jobs each than one negotiation cycle used to offer (FACTS.md: 20
per submitter), with mixed compute and memory shares and some whole-GPU jobs; the sidecar pins
them cycle after cycle until every one has run. While they run, the queue is sampled: the jobs
it shows running on a GPU may not need more than its compute or memory, or be shares of two
Owners (MPS: one user per GPU), for longer than the queue lags the node (MAX_QUEUE_LAG_S), and
at no instant of the history may they; a pin that running claims and older pins
leave no room for must be gone within a few cycles (the queue may still show a job running
whose claim the startd's newer ad has released; a pin made after the startd reused a dynamic
slot name was such a case until the sidecar stopped trusting a listed name in an ad older
than the job's start: tests/unit/test_gpu_slot_name_reuse.py).
Every job reports the CUDA / MPS environment it got, which must name the GPU it was pinned to
(the PREPARE_JOB hook refuses a claim carved from an older pin: tests/unit/test_gpu_node.py).
The second test restarts the schedd, or node6's startd, while GPU jobs run and others sit
pinned but unmatched (the negotiator off), and checks that every job still runs exactly once
to completion on consistent pins.
"""
from __future__ import annotations

import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import htcondor2
import pytest
from test_sidecar_daemon import HostSidecar, condor, safely
from waiting import wait_until

pytestmark = pytest.mark.pool

NODE = "node6"
GPU_MEMORY_MB = 15360
WHOLE_GPU = 1000
UUIDS = ("GPU-5f1c0d1e-7a2b-4c3d-8e9f-0a1b2c3d4e50", "GPU-5f1c0d1e-7a2b-4c3d-8e9f-0a1b2c3d4e51")
RUNNING, IDLE, HELD, COMPLETED = 2, 1, 5, 4
#: The job prints its environment (what the PREPARE_JOB hook gave it) and sleeps ``$1`` s.
SCRIPT = '#!/bin/sh\nenv | sort\nsleep "$1"\n'
#: Share shapes (compute thousandths, MB): a quarter, a memory-heavy tenth, a half. Memory
#: binds before compute for some mixes (two 6000 MB tenths and a 3800 MB quarter: 15800 MB).
SHAPES = ((250, 3800), (100, 6000), (500, 7000), (250, 3800), (100, 6000), (250, 3800))
JOB_ATTRS = ["ClusterId", "ProcId", "Owner", "JobStatus", "HoldReason", "RemoteHost", "JobCurrentStartDate",
             "CoSchedPinSlot",
             "CoSchedPinGPUs", "CoSchedPinGPUCompute", "CoSchedPinGPUMemory", "RequestGPUCompute",
             "RequestGPUMemory", "RequestGPUs"]
HISTORY_ATTRS = ["ClusterId", "ProcId", "Owner", "JobStatus", "ExitCode", "LastRemoteHost", "JobRunCount",
                 "JobCurrentStartDate", "CompletionDate", "CoSchedPinGPUs", "CoSchedPinGPUCompute",
                 "CoSchedPinGPUMemory", "RequestGPUCompute", "RequestGPUMemory", "RequestGPUs", "Iwd"]


@dataclass
class Cluster:
    """One submitted cluster: its id, owner, directory and size."""

    id: int
    owner: str
    directory: Path
    count: int


def submit_gpu_jobs(pool, user: str, seconds: int, shapes: tuple[tuple[int, int], ...] = (),
                    whole_gpus: int = 0) -> Cluster:
    """``user``'s cluster of share jobs (one per (compute, memory) shape), or of ``whole_gpus``
    jobs asking for ``request_GPUs = 1``; each prints its environment to out.<ProcId>."""
    d = pool.job_dir(user)
    script = d / "gpu_job.sh"
    script.write_text(SCRIPT)
    script.chmod(0o755)
    desc = {"executable": str(script), "arguments": str(seconds), "initialdir": str(d),
            "should_transfer_files": "YES", "output": "out.$(ProcId)", "error": "err.$(ProcId)", "log": "log",
            "request_cpus": "1", "request_memory": "64"}
    if whole_gpus:
        desc["request_GPUs"] = "1"
        items = [{} for _ in range(whole_gpus)]
    else:
        desc.update(request_GPUCompute="$(compute)", request_GPUMemory="$(memory)")
        items = [{"compute": str(c), "memory": str(m)} for c, m in shapes]
    return Cluster(pool.submit_as(user, desc, items), user, d, len(items))


def either(clusters: list[Cluster]) -> str:
    return " || ".join(f"ClusterId == {c.id}" for c in clusters)


def gpus_of(ad: dict[str, Any]) -> list[int]:
    pinned = ad.get("CoSchedPinGPUs")
    return [int(g) for g in pinned.split(",")] if isinstance(pinned, str) and pinned else []


def whole_gpus_of(ad: dict[str, Any]) -> int:
    """A whole-GPU job's request_GPUs (0 for a share job)."""
    count = ad.get("RequestGPUs")
    return count if isinstance(count, int) else 0


def is_share(ad: dict[str, Any]) -> bool:
    return isinstance(ad.get("CoSchedPinGPUCompute"), int) and ad["CoSchedPinGPUCompute"] < WHOLE_GPU


@dataclass
class GpuWatch:
    """Samples of the queue while GPU jobs run: what each GPU of node6 holds at one instant.

    One schedd query is one instant of the queue. A running job holds its claim's shares
    (``violations`` if they ever exceed a GPU or mix Owners); an idle job pinned to node6 holds
    what the sidecar reserved for it (``overbooked`` if running claims and pins together
    exceed a GPU or mix Owners: a pin the GPU cannot take, and ``overbooked_for_s`` how long each
    such pin was seen). ``reused_slot_names`` counts jobs seen running on a dynamic slot name
    another job of the test ran on before.
    """

    constraint: str
    samples: int = 0
    violations: list[str] = field(default_factory=list)
    off_node: list[str] = field(default_factory=list)
    overbooked: list[str] = field(default_factory=list)
    held: list[dict] = field(default_factory=list)
    most_shares_at_once: int = 0
    pinned_idle_seen: int = 0
    reused_slot_names: int = 0
    _on_slot: dict[str, tuple[int, int]] = field(default_factory=dict)
    _overbooked_seen: dict[tuple[int, int, int], list[float]] = field(default_factory=dict)
    _violated_since: dict[tuple, float] = field(default_factory=dict)
    _violated_longest: dict[tuple, float] = field(default_factory=dict)

    def violated_for_s(self) -> dict[str, float]:
        """Each GPU (or job) the running jobs' pins ever put over a GPU, mixed Owners on, or
        showed running without its pin: the longest run of consecutive samples, in seconds."""
        return {" ".join(map(str, key)): round(s, 1) for key, s in self._violated_longest.items()}

    def _violated(self, key: tuple, now: float, seen: set) -> None:
        seen.add(key)
        since = self._violated_since.setdefault(key, now)
        self._violated_longest[key] = max(self._violated_longest.get(key, 0.0), now - since)

    def overbooked_for_s(self) -> dict[str, float]:
        """Each pin seen on an overbooked GPU: seconds from its first to its last such sample."""
        return {f"{c}.{p} on GPU {g}": round(last - first, 1)
                for (c, p, g), (first, last) in self._overbooked_seen.items()}

    def sample(self, pool) -> list[dict] | None:
        try:
            ads = [dict(a) for a in pool.schedd().query(self.constraint, projection=JOB_ATTRS)]
        except Exception:  # noqa: BLE001 - the schedd may be restarting
            return None
        self.samples += 1
        self.held += [a for a in ads if a["JobStatus"] == HELD]
        running = [a for a in ads if a["JobStatus"] == RUNNING]
        pinned = [a for a in ads if a["JobStatus"] == IDLE and isinstance(a.get("CoSchedPinSlot"), str)]
        self.pinned_idle_seen = max(self.pinned_idle_seen, len(pinned))
        for a in running:
            name = a.get("RemoteHost")
            if not isinstance(name, str):   # a job leaving its claim is Running a moment without one
                continue
            if f"@{NODE}@" not in name:
                self.off_node.append(f"running off {NODE}: {a}")
            job = (a["ClusterId"], a["ProcId"])
            if self._on_slot.get(name, job) != job:
                self.reused_slot_names += 1
            self._on_slot[name] = job
        now, violated = time.monotonic(), set()
        for found, jobs in ((self.violations, running), (self.overbooked, running + pinned)):
            per_gpu: dict[int, list[dict]] = defaultdict(list)
            for a in jobs:
                gpus = gpus_of(a)
                want = 1 if is_share(a) else whole_gpus_of(a)
                if len(gpus) != want or any(g not in (0, 1) for g in gpus):
                    found.append(f"job {a['ClusterId']}.{a['ProcId']} pinned to GPUs {gpus}: {a}")
                    if found is self.violations:
                        self._violated(("job", f"{a['ClusterId']}.{a['ProcId']}"), now, violated)
                for g in gpus:
                    per_gpu[g].append(a)
            for g, on in per_gpu.items():
                compute = sum(a["CoSchedPinGPUCompute"] for a in on)
                memory = sum(a["CoSchedPinGPUMemory"] for a in on)
                owners = {a["Owner"] for a in on if is_share(a)}
                if compute > WHOLE_GPU or memory > GPU_MEMORY_MB or len(owners) > 1:
                    if found is self.violations:
                        self._violated(("GPU", g), now, violated)
                    for a in on:
                        if found is self.overbooked and a["JobStatus"] == IDLE:
                            self._overbooked_seen.setdefault((a["ClusterId"], a["ProcId"], g), [now, now])[1] = now
                    found.append(
                        f"{time.strftime('%H:%M:%S')} GPU {g}: {compute} compute, {memory} MB, share owners "
                        f"{sorted(owners)}: " + ", ".join(
                            f"{a['ClusterId']}.{a['ProcId']} {a['Owner']} {'running' if a['JobStatus'] == RUNNING else 'pinned'}"
                            f" {a['CoSchedPinGPUCompute']}/{a['CoSchedPinGPUMemory']}" for a in on))
                if found is self.violations:
                    self.most_shares_at_once = max(self.most_shares_at_once, sum(1 for a in on if is_share(a)))
        for key in set(self._violated_since) - violated:
            del self._violated_since[key]
        return ads

    def keep_log(self, pool, sidecar: HostSidecar, name: str) -> Path:
        """The sidecar's log, kept in the pool's workdir for a reader of a failure."""
        path = pool.info.workdir / f"{name}-sidecar.log"
        path.write_text("\n".join(sidecar.lines) + "\n")
        return path

    def until_done(self, pool, sidecar: HostSidecar, timeout_s: float) -> None:
        """Sample every half second until no job of ``constraint`` is left in the queue."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            ads = self.sample(pool)
            if ads == [] or (ads and all(a["JobStatus"] == COMPLETED for a in ads)):
                return
            assert sidecar.proc.poll() is None, f"the sidecar exited: {sidecar.tail(40)}"
            time.sleep(0.5)
        left = Counter(a["JobStatus"] for a in (self.sample(pool) or []))
        raise AssertionError(f"jobs left after {timeout_s} s (by JobStatus): {dict(left)}; "
                             f"sidecar: {sidecar.tail(30)}")


def finished(pool, clusters: list[Cluster]) -> list[dict]:
    """The history ads of ``clusters`` once every job is there (a job between queue and history
    file is in neither for a moment)."""
    total = sum(c.count for c in clusters)

    def probe():
        ads = [dict(a) for a in pool.schedd().history(either(clusters), projection=HISTORY_ATTRS, match=10 * total)]
        return ads if len({(a["ClusterId"], a["ProcId"]) for a in ads}) >= total else None

    return wait_until(probe, "every job in the history", timeout_s=60)


def environment(path: Path) -> dict[str, str]:
    return dict(line.split("=", 1) for line in path.read_text().splitlines() if "=" in line)


def assert_every_job_ran_once_on_its_pin(clusters: list[Cluster], history: list[dict]) -> None:
    """Each job: one history ad, completed with exit 0 on node6, pinned to as many GPUs as it
    asked for with its requested share, and its environment names exactly those GPUs."""
    dirs = {c.id: c for c in clusters}
    keys = Counter((a["ClusterId"], a["ProcId"]) for a in history)
    assert len(keys) == sum(c.count for c in clusters) and set(keys.values()) == {1}, keys
    for a in history:
        job = f"{a['ClusterId']}.{a['ProcId']}"
        assert a["JobStatus"] == COMPLETED and a.get("ExitCode") == 0, (job, a)
        assert f"@{NODE}@" in str(a["LastRemoteHost"]), (job, a)
        assert a["Owner"] == dirs[a["ClusterId"]].owner, (job, a)
        gpus = gpus_of(a)
        env = environment(dirs[a["ClusterId"]].directory / f"out.{a['ProcId']}")
        if is_share(a):
            assert len(gpus) == 1 and a["CoSchedPinGPUCompute"] == a["RequestGPUCompute"], (job, a)
            assert a["CoSchedPinGPUMemory"] == a["RequestGPUMemory"], (job, a)
            assert env.get("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE") == str(a["RequestGPUCompute"] // 10), (job, env)
            assert env.get("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT") == f"0={a['RequestGPUMemory']}M", (job, env)
        else:
            assert len(gpus) == whole_gpus_of(a) == 1 and a["CoSchedPinGPUCompute"] == WHOLE_GPU, (job, a)
        assert env.get("CUDA_VISIBLE_DEVICES") == ",".join(UUIDS[g] for g in gpus), (job, gpus, env)


def assert_history_never_oversubscribes(history: list[dict]) -> None:
    """From the last run of each job (start and completion dates): per GPU, at every start,
    the jobs running hold at most its compute and memory, and shares of one Owner only."""
    per_gpu: dict[int, list[dict]] = defaultdict(list)
    for a in history:
        for g in gpus_of(a):
            per_gpu[g].append(a)
    for g, jobs in per_gpu.items():
        for t in sorted({j["JobCurrentStartDate"] for j in jobs}):
            on = [j for j in jobs if j["JobCurrentStartDate"] <= t < j["CompletionDate"]]
            assert sum(j["CoSchedPinGPUCompute"] for j in on) <= WHOLE_GPU, (g, t, on)
            assert sum(j["CoSchedPinGPUMemory"] for j in on) <= GPU_MEMORY_MB, (g, t, on)
            assert len({j["Owner"] for j in on if is_share(j)}) <= 1, (g, t, on)


#: How long the queue may show running jobs whose pins exceed a GPU or mix Owners, or a job
#: running without its GPU pin. What ran is the history's to say (start and completion of each
#: job, on the pin the PREPARE_JOB hook holds it to): the queue lags the execute node, e.g. a
#: job whose claim ended shows Running until the schedd reaps its shadow while the job that
#: took its room already runs (seen once on CI), and a job the hook sends back to Idle for a
#: claim carved from an older pin shows Running a moment with the new one.
MAX_QUEUE_LAG_S = 5.0
#: How long a pin may sit on a GPU that running claims and older pins already fill: the
#: sidecar's next cycles unpin it ("cannot hold it with the pins kept before it"); cycles follow
#: the pool's 2 s negotiation cycles.
MAX_OVERBOOKED_S = 15.0


def assert_overbooking_is_corrected(watch: GpuWatch, log: Path) -> None:
    """No pin stays on a GPU that cannot take it. (That one is never made at all is not
    observable from the queue alone, which lags the startd: tests/unit/test_gpu_slot_name_reuse.py
    holds the sidecar's side of it.)"""
    lasting = {pin: s for pin, s in watch.overbooked_for_s().items() if s > MAX_OVERBOOKED_S}
    assert not lasting, "\n".join([f"pins left on a full GPU for more than {MAX_OVERBOOKED_S} s: {lasting}",
                                    *watch.overbooked[:5], f"sidecar log: {log}"])


def assert_all_ran_within_the_gpus(pool, clusters: list[Cluster], watch: GpuWatch,
                                   sidecar: HostSidecar) -> list[dict]:
    """No job held, no sample over a GPU or mixing Owners, no pin left on a full GPU, every
    job ran once on its pin and the history never oversubscribes a GPU; the history."""
    assert not watch.held, watch.held[:3]
    log = watch.keep_log(pool, sidecar, f"gpu-scale-{time.strftime('%H%M%S')}")
    assert not watch.off_node, watch.off_node[:3]
    lasting = {what: s for what, s in watch.violated_for_s().items() if s > MAX_QUEUE_LAG_S}
    assert not lasting, "\n".join([f"the queue showed these over a GPU or off their pin for more than "
                                   f"{MAX_QUEUE_LAG_S} s: {lasting}", *watch.violations[:5], f"sidecar log: {log}"])
    assert_overbooking_is_corrected(watch, log)
    history = finished(pool, clusters)
    assert_every_job_ran_once_on_its_pin(clusters, history)
    assert_history_never_oversubscribes(history)
    return history


def remove_and_wait(pool, clusters: list[Cluster]) -> None:
    """Leave the pool idle for the next test (warns, not fails, so a test's own failure shows)."""
    constraint = either(clusters)
    safely(lambda: pool.admin_remove(constraint))()
    try:
        wait_until(safely(lambda: not pool.schedd().query(constraint, projection=["ProcId"])),
                   "the test's jobs leave the queue", timeout_s=60)
    except AssertionError as e:
        print(f"warning: {e}")


def gpu_node_idle(pool) -> dict | None:
    """node6's partitionable slot once its ad shows both GPUs wholly free."""
    ads = htcondor2.Collector().query(htcondor2.AdTypes.Startd, f'Name == "{pool.slot(1, NODE)}"')
    ad = dict(ads[0]) if ads else None
    return ad if ad and all(ad.get(f"CoSchedGPU{g}Compute") == WHOLE_GPU for g in (0, 1)) else None


# --- more idle GPU jobs than one negotiation cycle offered, two users ------------------------

def test_two_users_with_more_gpu_shares_than_one_cycle_offers_all_run_and_no_gpu_is_oversubscribed(pool):
    """24 share jobs (quarter, memory-heavy tenth, half) and 2 whole-GPU jobs per user, 6 s
    each: all 52 run to completion on node6, each on the GPU it was pinned to with its own
    share; no instant of the history (and no run of queue samples longer than the queue's
    lag) shows a GPU holding more than its compute or memory, or two Owners' shares; and
    shares did share a GPU."""
    wait_until(lambda: gpu_node_idle(pool), "node6 idle", timeout_s=60)
    users = (pool.settings.user, pool.settings.second_user)
    clusters = [submit_gpu_jobs(pool, u, 6, shapes=SHAPES * 4) for u in users]
    clusters += [submit_gpu_jobs(pool, u, 6, whole_gpus=2) for u in users]
    assert all(c.count > 20 for c in clusters[:2])
    watch = GpuWatch(either(clusters))
    started = time.monotonic()
    sidecar = HostSidecar(pool)
    try:
        watch.until_done(pool, sidecar, timeout_s=270)
    finally:
        sidecar.stop()
        remove_and_wait(pool, clusters)
    took = time.monotonic() - started
    print(f"{sum(c.count for c in clusters)} GPU jobs of two users ran in {took:.0f} s; {watch.samples} samples, "
          f"at most {watch.most_shares_at_once} shares on one GPU, at most {watch.pinned_idle_seen} pinned idle, "
          f"{watch.reused_slot_names} reused dynamic slot names, pins on a full GPU: {watch.overbooked_for_s()}, "
          f"queue over a GPU or off a pin: {watch.violated_for_s()}")
    assert_all_ran_within_the_gpus(pool, clusters, watch, sidecar)
    assert watch.most_shares_at_once >= 2, "no two shares ever ran on one GPU together"
    assert sidecar.count(r"pinned \S+#") >= sum(c.count for c in clusters), sidecar.tail(40)


# --- a daemon restarted while GPU jobs run and others wait on their pins ------------------

def daemon_start_time(pool, daemon: str) -> int | None:
    if daemon == "SCHEDD":
        ads = htcondor2.Collector().query(htcondor2.AdTypes.Schedd, projection=["DaemonStartTime"])
    else:
        ads = htcondor2.Collector().query(htcondor2.AdTypes.Startd, f'Name == "{pool.slot(1, NODE)}"',
                                          projection=["DaemonStartTime"])
    return ads[0].get("DaemonStartTime") if ads else None


def restart_command(pool, daemon: str) -> list[str]:
    """condor_restart of the schedd, or of node6's startd alone (the master names it NODE6,
    which ``-daemon`` does not find: the startd is named instead)."""
    if daemon == "SCHEDD":
        return ["condor_restart", "-daemon", "SCHEDD"]
    return ["condor_restart", "-startd", "-name", f"{NODE}@{NODE}.{pool.domain}"]


@pytest.mark.parametrize("daemon", ["SCHEDD", "STARTD"])
def test_gpu_jobs_survive_a_daemon_restart_between_pin_and_match(pool, daemon):
    """alice's long shares run on node6; with the negotiator off, alice and bob submit more
    shares and the sidecar pins some of them, unmatched; then ``daemon`` (the schedd, or
    node6's startd) restarts, and the negotiator comes back. Every job still runs exactly once
    to completion on a pin that fits its GPU, and no GPU is ever oversubscribed or mixed."""
    wait_until(lambda: gpu_node_idle(pool), "node6 idle", timeout_s=60)
    alice, bob = pool.settings.user, pool.settings.second_user
    clusters = [submit_gpu_jobs(pool, alice, 25, shapes=((250, 3800),) * 3)]
    watch = GpuWatch(either(clusters))
    sidecar = HostSidecar(pool, COSCHED_INTERVAL="2")
    negotiator_off = False
    started = time.monotonic()
    try:
        # running for a few seconds: their starters are up when the restart comes
        wait_until(lambda: (ads := watch.sample(pool)) and sum(
            a["JobStatus"] == RUNNING and a.get("JobCurrentStartDate", time.time()) < time.time() - 5
            for a in ads) >= 2, "alice's long shares run", timeout_s=90)
        condor(pool, "condor_off", "-daemon", "NEGOTIATOR")
        negotiator_off = True
        clusters += [submit_gpu_jobs(pool, alice, 4, shapes=SHAPES + SHAPES[:4]),
                     submit_gpu_jobs(pool, bob, 4, shapes=SHAPES + SHAPES[:4])]
        watch.constraint = either(clusters)

        def pinned_unmatched() -> list[dict] | None:
            ads = watch.sample(pool) or []
            pinned = [a for a in ads if a["ClusterId"] != clusters[0].id and a["JobStatus"] == IDLE
                      and isinstance(a.get("CoSchedPinSlot"), str)]
            return pinned if len(pinned) >= 2 else None

        pinned = wait_until(pinned_unmatched, "the sidecar pins new shares the negotiator cannot match yet",
                            timeout_s=60)
        running_before = sum(a["JobStatus"] == RUNNING for a in watch.sample(pool) or [])
        assert running_before >= 2, "the restart is to find shares running"
        before = daemon_start_time(pool, daemon)
        restarted_at = time.monotonic()
        condor(pool, *restart_command(pool, daemon))
        wait_until(safely(lambda: (t := daemon_start_time(pool, daemon)) and t != before and t),
                   f"{daemon} restarts and advertises again", timeout_s=120)
        print(f"{daemon} back after {time.monotonic() - restarted_at:.0f} s; {running_before} jobs ran, "
              f"{len(pinned)} pinned idle")
        condor(pool, "condor_on", "-daemon", "NEGOTIATOR")
        negotiator_off = False
        watch.until_done(pool, sidecar, timeout_s=240)
    finally:
        if negotiator_off:
            condor(pool, "condor_on", "-daemon", "NEGOTIATOR")
        sidecar.stop()
        remove_and_wait(pool, clusters)
    print(f"{sum(c.count for c in clusters)} GPU jobs done {time.monotonic() - started:.0f} s after the first "
          f"submit; {watch.samples} samples, {watch.reused_slot_names} reused dynamic slot names, "
          f"pins on a full GPU: {watch.overbooked_for_s()}, queue over a GPU or off a pin: {watch.violated_for_s()}")
    history = assert_all_ran_within_the_gpus(pool, clusters, watch, sidecar)
    if daemon == "STARTD":  # the restart evicted alice's running shares, which ran again
        assert any(a["JobRunCount"] >= 2 for a in history if a["ClusterId"] == clusters[0].id), history
