"""Spare capacity on the execute node (paper 003, Sections III-A/III-B): the node agent samples
the primaries, estimates them (Insight Engine), confines spare-capacity jobs in cgroups laid out
as v1 and as v2 in tmp dirs, and publishes DIR/spare.json; the startd cron turns it into
``CoSchedSpare*`` lines; discovery renders the spare slot; config.d/20 starts and evicts on it.
The real cgroup v1 test is test_spare_node_cgroup_v1.py."""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import classad2
import pytest
from cosched_node import ads, agent, config, describe, discover, errors, insight, prepare_job, procs, state
from cosched_node import startd_cron as cron
from cosched_node.spare_cgroups import Limits, SpareCgroups, parse_stat
from cosched_node.spare_duty import (FLOOR_SHARE, MB, SPARE_INTERVAL_S, NodeLimits, SpareUse, node_limits,
                                     proc_usage, spare_offer, split)
from test_node_harness import FakeView, slot_ad, write_config
from test_startd_config import _policy, starts, vacated

pytestmark = pytest.mark.usefixtures("fake_pids_are_not_ours")
JOB_UID = 2001
TICK = os.sysconf("SC_CLK_TCK")
V2_FILES = {"cgroup.procs": "", "cgroup.subtree_control": "", "cpu.max": "max 100000", "cpu.weight": "100",
            "cpu.idle": "0", "cpu.stat": "usage_usec 0\n", "memory.high": "max", "memory.max": "max",
            "memory.stat": "anon 0\nfile 0\nshmem 0\n"}
V1_FILES = {"cpu": {"cgroup.procs": "", "cpu.cfs_quota_us": "-1", "cpu.cfs_period_us": "100000",
                    "cpu.shares": "1024", "cpu.idle": "0"},
            "cpuacct": {"cgroup.procs": "", "cpuacct.usage": "0"},
            "memory": {"cgroup.procs": "", "memory.limit_in_bytes": "9223372036854771712",
                       "memory.soft_limit_in_bytes": "9223372036854771712",
                       "memory.stat": "cache 0\nrss 0\ntotal_cache 0\ntotal_rss 0\ntotal_shmem 0\n"}}


def kernel_group(root: Path, version: int, group: str, **files: str) -> None:
    """A cgroup directory as the kernel makes it, with its files (``files`` by name override),
    under a root laid out as cgroup v2 (/sys/fs/cgroup) or v1 (cpu/, cpuacct/, memory/)."""
    if version == 2:
        where = [(root / group.lstrip("/"), V2_FILES)]
        if not (root / "cgroup.controllers").exists():
            root.mkdir(parents=True, exist_ok=True)
            (root / "cgroup.controllers").write_text("cpuset cpu io memory pids\n")
            (root / "cgroup.subtree_control").write_text("")
    else:
        where = [(root / c / group.lstrip("/"), V1_FILES[c]) for c in V1_FILES]
        for controller, defaults in V1_FILES.items():
            if not (root / controller).exists():
                (root / controller).mkdir(parents=True)
                for name, text in defaults.items():
                    (root / controller / name).write_text(text)
    for path, defaults in where:
        path.mkdir(parents=True, exist_ok=True)
        for name, text in defaults.items():
            if name not in files or name not in defaults:
                (path / name).write_text(text)
        for name, text in files.items():
            if name in defaults:
                (path / name).write_text(text)


def fake_proc(proc_root: Path, pid: int, ppid: int, comm: str, uid: int, start: int, cgroup_lines: str,
              utime: int = 0, stime: int = 0, anon_kb: int = 0, shmem_kb: int = 0, file_kb: int = 0) -> None:
    """/proc/<pid>/stat (utime and stime in clock ticks), status (RssAnon, RssFile, RssShmem), cgroup."""
    path = proc_root / str(pid)
    path.mkdir(parents=True, exist_ok=True)
    (path / "stat").write_text(f"{pid} ({comm}) S {ppid} {pid} {pid} 0 0 0 0 0 0 0 {utime} {stime} 0 0 0 0 0 0 "
                               f"{start} 0\n")
    (path / "status").write_text(f"Name:\t{comm}\nUid:\t{uid}\t{uid}\t{uid}\t{uid}\nRssAnon:\t{anon_kb} kB\n"
                                 f"RssFile:\t{file_kb} kB\nRssShmem:\t{shmem_kb} kB\n")
    (path / "cgroup").write_text(cgroup_lines)


def cgroup_lines(version: int, group: str) -> str:
    if version == 2:
        return f"0::{group}\n"
    return f"4:memory:{group}\n2:cpuacct:{group}\n1:cpu:{group}\n0::/\n"


def estimate(q: float, xi: float) -> insight.Estimate:
    return insight.Estimate(q=q, xi=xi, mean_width=0.0, samples=100, confidence=0.8)


# --------------------------------------------------------------------------------------- limits

def test_the_cap_is_c_minus_the_confident_high_tightened_by_live_use_and_never_below_5_percent():
    cpu, memory = estimate(2.0, 1.0), estimate(3000.0, 500.0)
    calm = node_limits(8, 8000, cpu, memory, live_cores=1.0, live_memory_mb=2000.0)
    assert calm == NodeLimits(cores=5.0, memory_hard_mb=4500.0, memory_soft_mb=4000.0, tightened=False)
    busy = node_limits(8, 8000, cpu, memory, live_cores=6.0, live_memory_mb=5000.0)   # above Q + xi: tightened
    assert busy == NodeLimits(cores=2.0, memory_hard_mb=3000.0, memory_soft_mb=2500.0, tightened=True)
    full = node_limits(8, 8000, cpu, memory, live_cores=7.9, live_memory_mb=7900.0)
    assert full.cores == pytest.approx(FLOOR_SHARE * 8) and full.memory_hard_mb == full.memory_soft_mb == 400.0
    # no estimate yet: CPU at the floor; memory from live use alone (an agent restart evicts nobody)
    young = node_limits(8, 8000, None, None, live_cores=0.0, live_memory_mb=1000.0)
    assert young.cores == pytest.approx(0.4) and young.memory_hard_mb == young.memory_soft_mb == 7000.0


def test_the_published_offer_is_c_minus_the_confident_high_clamped_without_floor():
    assert spare_offer(8, estimate(2.0, 1.0)) == 5.0
    assert spare_offer(8, estimate(7.0, 3.0)) == 0.0
    assert spare_offer(8, None) == 0.0


def test_limits_split_by_cpus_and_memory_beyond_the_node_evicts_the_largest_first():
    limits = NodeLimits(cores=4.0, memory_hard_mb=4000.0, memory_soft_mb=3000.0, tightened=False)
    shares, evicted = split([SpareUse("a", 1, 100 * MB), SpareUse("b", 3, 200 * MB)], limits)
    assert evicted == []
    # each keeps what it uses plus its Cpus' share of the 3700 MB slack; soft 1000 MB lower by share
    assert shares["a"] == Limits(1.0, 100 * MB + 925 * MB - 250 * MB, 100 * MB + 925 * MB)
    assert shares["b"] == Limits(3.0, 200 * MB + 2775 * MB - 750 * MB, 200 * MB + 2775 * MB)
    # together beyond the node's hard limit: the largest user goes, the other then fits alone
    shares, evicted = split([SpareUse("a", 1, 2000 * MB), SpareUse("b", 3, 3500 * MB)], limits)
    assert evicted == ["b"] and shares["a"].memory_hard_bytes == 4000 * MB
    # one claim over its Cpus' share is not vacated while the node holds them all, and no
    # limit is ever below what its claim uses
    shares, evicted = split([SpareUse("a", 1, 1500 * MB), SpareUse("b", 3, 100 * MB)], limits)
    assert evicted == [] and all(shares[k].memory_soft_bytes >= u * MB and shares[k].memory_hard_bytes >= u * MB
                                 for k, u in (("a", 1500), ("b", 100)))
    _, evicted = split([SpareUse("a", 1, 5000 * MB), SpareUse("b", 1, 4500 * MB)], limits)
    assert evicted == ["a", "b"]


# --------------------------------------------------------------------------------------- cgroup files

@pytest.mark.parametrize("version", [1, 2])
def test_limits_go_to_the_right_files_with_the_right_values(tmp_path: Path, version: int):
    root = tmp_path / "cg"
    cgroups = SpareCgroups(str(root), proc_root=str(tmp_path / "proc"))
    group = cgroups.ours("slot3_1")
    kernel_group(root, version, group)
    kernel_group(root, version, "/cosched_spare")
    assert cgroups.probe() is None and cgroups.version == version
    cgroups.create(group)
    assert cgroups.write_limits(group, Limits(2.5, 1000 * MB, 1500 * MB)) == []
    read = {name: cgroups.read_limit(group, name) for _, name, _ in cgroups.limit_files(Limits(1, 1, 1))}
    if version == 2:
        assert read == {"cpu.max": "250000 100000", "cpu.weight": "1", "cpu.idle": "1",
                        "memory.max": str(1500 * MB), "memory.high": str(1000 * MB)}
        assert (root / "cgroup.subtree_control").read_text() == "+cpu +memory"
        assert (root / "cosched_spare" / "cgroup.subtree_control").read_text() == "+cpu +memory"
    else:
        assert read == {"cpu.cfs_period_us": "100000", "cpu.cfs_quota_us": "250000", "cpu.shares": "2",
                        "cpu.idle": "1", "memory.limit_in_bytes": str(1500 * MB),
                        "memory.soft_limit_in_bytes": str(1000 * MB)}
    cgroups.write_limits(group, Limits(0.001, 1, 2))          # the kernel's least quota is 1 ms
    assert cgroups.read_limit(group, "cpu.max" if version == 2 else "cpu.cfs_quota_us").split()[0] == "1000"
    assert cgroups.move(group, [4242]) == [4242]
    assert cgroups.procs(group) == [4242]


@pytest.mark.parametrize("version", [1, 2])
def test_memory_is_read_as_anon_plus_shmem_never_page_cache(tmp_path: Path, version: int):
    root = tmp_path / "cg"
    cgroups = SpareCgroups(str(root))
    if version == 2:
        kernel_group(root, 2, "/htcondor/slot1_1", **{"memory.stat": "anon 100\nfile 999999\nshmem 20\n",
                                                        "cpu.stat": "usage_usec 2500000\nuser_usec 1\n"})
    else:
        kernel_group(root, 1, "/htcondor/slot1_1", **{
            "memory.stat": "cache 5\nrss 7\nshmem 3\ntotal_cache 999999\ntotal_rss 100\ntotal_shmem 20\n",
            "cpuacct.usage": "2500000000\n"})
    assert cgroups.probe() is None
    usage = cgroups.usage("/htcondor/slot1_1")
    assert usage.memory_bytes == 120 and usage.cpu_s == pytest.approx(2.5)
    assert parse_stat("anon 1\nnot a line\nx y\n") == {"anon": 1}


@pytest.mark.parametrize("version", [1, 2])
def test_a_job_owned_or_group_writable_cgroup_is_refused_by_name(tmp_path: Path, version: int):
    root, proc_root = tmp_path / "cg", tmp_path / "proc"
    cgroups = SpareCgroups(str(root), proc_root=str(proc_root))
    kernel_group(root, version, "/htcondor/slot1_1")
    assert cgroups.probe() is None
    fake_proc(proc_root, 100, 1, "condor_starter", 0, 1, cgroup_lines(version, "/system.slice/condor.service"))
    fake_proc(proc_root, 101, 100, "job", JOB_UID, 2, cgroup_lines(version, "/htcondor/slot1_1"))
    assert cgroups.cgroup_of([101], 100) == ("/htcondor/slot1_1", None)
    hierarchy = root if version == 2 else root / "memory"
    os.chown(hierarchy / "htcondor" / "slot1_1", JOB_UID, -1)
    group, why = cgroups.cgroup_of([101], 100)
    assert group is None and "cgroup /htcondor/slot1_1 is job-owned or job-writable" in why
    os.chown(hierarchy / "htcondor" / "slot1_1", 0, -1)
    os.chmod(hierarchy / "htcondor", 0o775)
    assert "job-owned or job-writable" in cgroups.cgroup_of([101], 100)[1]
    os.chmod(hierarchy / "htcondor", 0o755)
    file = hierarchy / "htcondor" / "slot1_1" / ("memory.max" if version == 2 else "memory.limit_in_bytes")
    os.chmod(file, 0o666)
    assert f"{file.name} is job-owned or job-writable" in cgroups.cgroup_of([101], 100)[1]
    os.chmod(file, 0o644)
    fake_proc(proc_root, 102, 100, "job", JOB_UID, 3, cgroup_lines(version, "/cosched_spare/slot1_1"))
    assert "cgroups" in cgroups.cgroup_of([101, 102], 100)[1]          # two cgroups: none is its own
    assert cgroups.cgroup_of([102], 100) == (None, "cgroup /cosched_spare/slot1_1 is ours")
    fake_proc(proc_root, 100, 1, "condor_starter", 0, 1, cgroup_lines(version, "/htcondor/slot1_1"))
    assert cgroups.cgroup_of([101], 100) == (None, "cgroup /htcondor/slot1_1 is its starter's own")


def test_a_root_without_writable_cpu_and_memory_controllers_is_named(tmp_path: Path):
    root = tmp_path / "cg"
    assert "is missing" in SpareCgroups(str(root)).probe()
    (root / "unified").mkdir(parents=True)
    (root / "unified" / "cgroup.controllers").write_text("")       # this host's v2 mount: no controllers
    assert SpareCgroups(str(root / "unified")).probe() == \
        f"cgroup root {root}/unified is cgroup v2 without the cpu and memory controller"
    kernel_group(root, 1, "/x")
    shutil.rmtree(root / "memory")
    assert "missing memory" in SpareCgroups(str(root)).probe()


def test_proc_usage_counts_cpu_ticks_of_process_and_reaped_children_and_anon_plus_shmem(tmp_path: Path):
    fake_proc(tmp_path, 7, 1, "job", JOB_UID, 1, "0::/\n", utime=3 * TICK, stime=TICK, anon_kb=1024, shmem_kb=1024,
              file_kb=10 ** 6)
    stat_path = tmp_path / "7" / "stat"
    fields = stat_path.read_text().split(" ")
    fields[15], fields[16] = str(TICK), str(TICK)            # cutime, cstime
    stat_path.write_text(" ".join(fields))
    usage = proc_usage([7, 99], str(tmp_path))
    assert usage.cpu_s == pytest.approx(6.0) and usage.memory_bytes == 2 * MB


# --------------------------------------------------------------------------------------- the agent

def spare_config(cores: int = 8, memory_mb: int = 8000) -> dict:
    return {"node": "node1", "domain": "cosched.test", "cores": cores, "memory_mb": memory_mb, "slots": [
        {"slot_id": 1, "kind": "socket", "cores": cores, "memory_mb": memory_mb},
        {"slot_id": 2, "kind": "spare", "cores": cores, "memory_mb": memory_mb}]}


class Node:
    """An execute node with a spare slot: node config, a cgroup root laid out as v1 or v2, a
    /proc, a slot view and the agent, whose intervals the test times (``tick(now)``)."""

    def __init__(self, tmp: Path, version: int = 2, cgroup_root: Path | None = None) -> None:
        self.tmp, self.version = tmp, version
        self.config_path, self.config = write_config(tmp, spare_config())
        self.cg = cgroup_root if cgroup_root is not None else tmp / "cg"
        self.fake_kernel = cgroup_root is None
        if cgroup_root is None:
            kernel_group(self.cg, version, "/cosched_spare")
        self.proc = tmp / "proc"
        self.proc.mkdir()
        self.state = tmp / "state"
        state.prepare_state_dir(str(self.state))
        self.view = FakeView(self.config)
        self.logs: list[str] = []
        self.cgroups = SpareCgroups(str(self.cg), proc_root=str(self.proc))
        self.agent = agent.Agent(self.config, str(self.state), self.view, None, self.logs.append,
                                 proc_root=str(self.proc), starter_uid=0, spare_cgroups=self.cgroups)
        self.n = 0
        self.jobs: dict[str, dict] = {}

    def group_dir(self, group: str, controller: str = "cpu") -> Path:
        return self.cg / group.lstrip("/") if self.version == 2 else self.cg / controller / group.lstrip("/")

    def claim(self, slot_id: int, cpus: int, own_cgroup: bool = False, admitted: bool = True, **usage) -> str:
        """A running claim on slot ``slot_id``: a starter and its job (in HTCondor's own cgroup
        htcondor/<slot> when ``own_cgroup``); on the spare slot, one whose start the agent
        admitted unless not ``admitted`` (the hook asks: ``spare_start``)."""
        n = self.n = self.n + 1
        job, slot = f"{n}.0", f"slot{slot_id}_{n}"
        starter, pid = 1000 + n, 5000 + n
        group = f"/htcondor/{slot}" if own_cgroup else "/system.slice/condor.service"
        if own_cgroup:
            kernel_group(self.cg, self.version, group)
        fake_proc(self.proc, starter, 1, "condor_starter", 0, 100 + n, cgroup_lines(self.version, "/system.slice"))
        fake_proc(self.proc, pid, starter, "job", JOB_UID, 300 + n, cgroup_lines(self.version, group), **usage)
        self.view.ads.append(slot_ad(slot, job, starter, Cpus=cpus, Memory=1000))
        self.jobs[job] = {"starter": starter, "pid": pid, "slot": slot, "group": group, "n": n}
        if slot_id == self.config.spare_slot.slot_id and admitted:
            self.agent.reconcile(self.agent.claims(), procs.process_table(str(self.proc)), 0.0)
            next(r for r in self.agent.records.values() if r.claim.job == job).spare_started = True
        return job

    def warm(self, start: float) -> float:
        """Intervals enough for an estimate (none of the primaries busy); the next time."""
        for k in range(insight.MIN_SAMPLES + 1):
            self.tick(start + SPARE_INTERVAL_S * k)
        return start + SPARE_INTERVAL_S * (insight.MIN_SAMPLES + 1)

    def spare_start(self, cpus: int) -> dict:
        """A spare claim whose PREPARE_JOB hook asks the agent (our group made as the kernel would)."""
        n = self.n + 1
        if self.fake_kernel:
            kernel_group(self.cg, self.version, f"/cosched_spare/slot2_{n}")
        job = self.claim(2, cpus, admitted=False)
        info = self.jobs[job]
        hook = 3000 + info["n"]
        fake_proc(self.proc, hook, info["starter"], "python3", JOB_UID, 200 + info["n"],
                  cgroup_lines(self.version, "/system.slice"))
        reply = self.agent.answer(hook, JOB_UID)
        shutil.rmtree(self.proc / str(hook))
        return {**reply, "job": job}

    def burn(self, job: str, cpu_s: float, anon_kb: int = 0) -> None:
        """The job's processes used ``cpu_s`` more CPU seconds; now hold ``anon_kb``."""
        info = self.jobs[job]
        stat_path = self.proc / str(info["pid"]) / "stat"
        fields = stat_path.read_text().split(" ")
        fields[13] = str(int(fields[13]) + round(cpu_s * TICK))
        stat_path.write_text(" ".join(fields))
        status = self.proc / str(info["pid"]) / "status"
        status.write_text(status.read_text().split("RssAnon")[0] + f"RssAnon:\t{anon_kb} kB\nRssShmem:\t0 kB\n")

    def tick(self, now: float) -> dict:
        table = procs.process_table(str(self.proc))
        self.agent.reconcile(self.agent.claims(), table, now)
        self.agent.manage_spare(table, now)
        return json.loads((self.state / "spare.json").read_text())

    def cron(self, now: float) -> dict:
        state.write_json_atomic(str(self.state), state.HEARTBEAT_NAME, {"time": now, "pid": 1})
        return ads.parse_classad("\n".join(cron.facts(self.config, str(self.state), None, 180, now=now)))

    def log(self) -> str:
        return "\n".join(self.logs)


@pytest.mark.parametrize("version", [1, 2])
def test_primaries_sampled_estimated_and_spare_jobs_capped_and_tightened_within_one_interval(tmp_path: Path,
                                                                                            version: int):
    node = Node(tmp_path, version)
    primary = node.claim(1, 4)
    now = 1_000_000.0
    for _ in range(insight.MIN_SAMPLES + 3):          # the primary uses 2 cores and 1000 MB
        node.burn(primary, 2 * SPARE_INTERVAL_S, anon_kb=1000 * 1024)
        published = node.tick(now)
        now += SPARE_INTERVAL_S
    assert published["usable"] is True and published["problem"] is None
    assert published["cpus"] == pytest.approx(6.0, abs=0.01) and published["memory_mb"] == 7000
    # the primary's first interval gives no sample (its CPU is known from the next one)
    assert published["samples"] == insight.MIN_SAMPLES + 2 and published["confidence"] == 0.8
    reply = node.spare_start(2)
    assert reply["status"] == "ok" and reply["kind"] == "spare" and reply["cgroup"] == "/cosched_spare/slot2_2"
    spare = node.jobs[reply["job"]]
    procs_file = node.group_dir(reply["cgroup"]) / "cgroup.procs"
    assert procs_file.read_text() == str(spare["starter"])          # the starter moved in at the hook's start
    node.burn(primary, 2 * SPARE_INTERVAL_S, anon_kb=1000 * 1024)
    node.tick(now)
    now += SPARE_INTERVAL_S
    assert procs_file.read_text() == str(spare["pid"])               # and its job every interval
    quota = "cpu.max" if version == 2 else "cpu.cfs_quota_us"
    assert node.cgroups.read_limit(reply["cgroup"], quota).split()[0] == "600000"        # 8 - (2 + 0) cores
    assert node.cgroups.read_limit(reply["cgroup"], "cpu.idle") == "1"
    node.burn(primary, 7 * SPARE_INTERVAL_S, anon_kb=1000 * 1024)      # the primary rises to 7 cores
    published = node.tick(now)
    assert node.cgroups.read_limit(reply["cgroup"], quota).split()[0] == "100000"        # within this interval
    assert published["limits"]["cpus"] == pytest.approx(1.0) and "primaries above their confident high" in node.log()
    hard = "memory.max" if version == 2 else "memory.limit_in_bytes"
    assert int(node.cgroups.read_limit(reply["cgroup"], hard)) == 7000 * MB


@pytest.mark.parametrize("version", [1, 2])
def test_a_spare_job_in_htcondors_own_cgroup_gets_the_limits_there(tmp_path: Path, version: int):
    node = Node(tmp_path, version)
    job = node.claim(2, 4, own_cgroup=True)
    node.tick(1000.0)
    group = node.jobs[job]["group"]
    quota = "cpu.max" if version == 2 else "cpu.cfs_quota_us"
    assert node.cgroups.read_limit(group, quota).split()[0] == "40000"          # no estimate yet: 5% of 8 cores
    assert not (node.group_dir(f"/cosched_spare/{node.jobs[job]['slot']}")).exists()


def test_a_spare_job_that_must_shrink_below_its_use_is_vacated_through_the_startd(tmp_path: Path):
    node = Node(tmp_path, 2)
    primary = node.claim(1, 4)
    node.burn(primary, 0, anon_kb=1000 * 1024)
    node.tick(1000.0)
    big, small = node.claim(2, 2, own_cgroup=True), node.claim(2, 2, own_cgroup=True)
    for job, anon_mb in ((big, 3000), (small, 2000)):
        (node.group_dir(node.jobs[job]["group"]) / "memory.stat").write_text(f"anon {anon_mb * MB}\nshmem 0\n")
    node.tick(1005.0)
    hard = {job: int(node.cgroups.read_limit(node.jobs[job]["group"], "memory.max")) for job in (big, small)}
    # 7000 MB hold both: each keeps its use and half the 2000 MB slack (equal Cpus)
    assert hard == {big: 4000 * MB, small: 3000 * MB}
    node.burn(primary, 0, anon_kb=4000 * 1024)                         # the primary now holds 4000 MB
    published = node.tick(1010.0)
    (evict,) = published["evict"]
    assert evict["job"] == big and evict["slot"] == node.jobs[big]["slot"]
    assert int(node.cgroups.read_limit(node.jobs[big]["group"], "memory.max")) == 4000 * MB   # never below use
    assert int(node.cgroups.read_limit(node.jobs[small]["group"], "memory.max")) == 4000 * MB
    ad = node.cron(1010.0)
    text = ads.ad_get(ad, f"CoSchedSpareEvict_{node.jobs[big]['slot']}")
    assert text.startswith(f"{big} spare capacity: the primaries need the memory back")
    assert ads.ad_get(ad, f"CoSchedSpareEvict_{node.jobs[small]['slot']}") is None


@pytest.mark.parametrize("version", [1, 2])
def test_our_group_is_removed_when_its_claim_ends_and_leftovers_of_its_job_are_killed(tmp_path: Path, version: int,
                                                                                     monkeypatch):
    node = Node(tmp_path, version)
    node.warm(900.0)
    reply = node.spare_start(1)
    info = node.jobs[reply["job"]]
    node.tick(1000.0)
    removed, killed = [], []
    real_rmdir = os.rmdir

    def rmdir(path: str, **kwargs) -> None:   # the kernel removes a cgroup's files with it, once it is empty
        if kwargs:                                 # shutil's own, elsewhere
            return real_rmdir(path, **kwargs)
        if Path(path, "cgroup.procs").exists() and Path(path, "cgroup.procs").read_text().strip():
            raise OSError(16, "Device or resource busy")
        for child in Path(path).iterdir():
            child.unlink()
        real_rmdir(path)
        removed.append(path)

    monkeypatch.setattr("cosched_node.spare_cgroups.os.rmdir", rmdir)
    monkeypatch.setattr("cosched_node.spare_duty.os.kill", lambda pid, sig: killed.append(pid))
    shutil.rmtree(node.proc / str(info["starter"]))        # the claim ends; its job's process is left behind
    node.view.drop(reply["job"])
    node.tick(1005.0)
    assert set(killed) == {info["pid"]} and not removed
    for path in node.cgroups._dirs(reply["cgroup"]):
        Path(path, "cgroup.procs").write_text("")          # the kill took effect
    node.tick(1010.0)
    assert not any(os.path.exists(p) for p in node.cgroups._dirs(reply["cgroup"]))
    assert f"spare group {reply['cgroup']} removed" in node.log()


def test_without_a_usable_cgroup_spare_starts_are_refused_logged_once_and_published(tmp_path: Path):
    node = Node(tmp_path, cgroup_root=tmp_path / "nowhere")
    reply = node.spare_start(2)
    assert reply["status"] == "refused" and reply["code"] == errors.EXIT_OVERSUBSCRIBED
    assert reply["message"] == (f"spare-capacity start of 1.0 on node1 (slot2_1) refused: no usable cgroup: "
                                f"cgroup root {tmp_path}/nowhere is missing")
    primary = node.claim(1, 4)
    for k in range(insight.MIN_SAMPLES + 1):
        node.burn(primary, SPARE_INTERVAL_S)
        published = node.tick(1000.0 + 5 * k)
    assert sum("cannot confine spare jobs" in line for line in node.logs) == 1
    assert published["usable"] is False and "is missing" in published["problem"]
    assert published["cpus"] == pytest.approx(7.0, abs=0.01)        # /proc sampling still works
    ad = node.cron(1060.0)
    assert ads.ad_get(ad, "CoSchedSpareUsable") is False and "is missing" in ads.ad_get(ad, "CoSchedSpareProblem")
    assert ads.ad_get(ad, "CoSchedSpareCpus") == 0.0


def test_the_agent_interval_is_5_s_on_a_spare_node_and_10_s_elsewhere(tmp_path: Path):
    _, spare = write_config(tmp_path, spare_config())
    plain = config.parse_node_config({**spare_config(), "slots": spare_config()["slots"][:1]})
    for cfg, interval in ((spare, 5.0), (plain, 10.0)):
        args = agent.parse_args(["--startd-address-file", "/nonexistent/address", "--perf", ""])
        built = agent.build(args, cfg, str(tmp_path), lambda message: None)
        assert built.interval_s == interval and (built.spare_cgroups is not None) == (cfg is spare)
    args = agent.parse_args(["--startd-address-file", "/x", "--perf", "", "--interval", "2"])
    assert agent.build(args, spare, str(tmp_path), lambda message: None).interval_s == 2.0


# --------------------------------------------------------------------------------------- the startd cron

def cron_lines(tmp_path: Path, spare: object, now: float = 2000.0, beat: float | None = 2000.0) -> dict:
    _, cfg = write_config(tmp_path, spare_config())
    if spare is not None:
        (tmp_path / "spare.json").write_text(spare if isinstance(spare, str) else json.dumps(spare))
    if beat is not None:
        state.write_json_atomic(str(tmp_path), state.HEARTBEAT_NAME, {"time": beat, "pid": 1})
    return ads.parse_classad("\n".join(cron.facts(cfg, str(tmp_path), None, 180, now=now)))


GOOD = {"updated": 1995, "usable": True, "problem": None, "cpus": 5.25, "memory_mb": 4500, "confidence": 0.8,
        "samples": 360, "evict": [{"slot": "slot2_3", "job": "12.0", "reason": "spare capacity: memory"}]}


def test_the_cron_publishes_good_stale_and_garbage_spare_json(tmp_path: Path):
    ad = cron_lines(tmp_path, GOOD)
    assert {k: ads.ad_get(ad, k) for k in ("CoSchedSpareUsable", "CoSchedSpareCpus", "CoSchedSpareMemory",
                                          "CoSchedSpareConfidence", "CoSchedSpareSamples", "CoSchedSpareUpdated",
                                          "CoSchedSpareProblem", "CoSchedSpareEvict_slot2_3")} == {
        "CoSchedSpareUsable": True, "CoSchedSpareCpus": 5.25, "CoSchedSpareMemory": 4500,
        "CoSchedSpareConfidence": 0.8, "CoSchedSpareSamples": 360, "CoSchedSpareUpdated": 1995,
        "CoSchedSpareProblem": None, "CoSchedSpareEvict_slot2_3": "12.0 spare capacity: memory"}
    for spare, now, beat, why in (
            (GOOD, 2500.0, 2500.0, "the node agent's spare capacity is stale"),
            (GOOD, 2000.0, 1000.0, "the node agent is not alive"),
            (None, 2000.0, 2000.0, "no spare.json"),
            ("{not json", 2000.0, 2000.0, "no spare.json"),
            ({**GOOD, "cpus": 9.0}, 2000.0, 2000.0, "invalid values"),            # more than the slot's 8
            ({**GOOD, "cpus": "5"}, 2000.0, 2000.0, "invalid values"),
            ({**GOOD, "memory_mb": 9000}, 2000.0, 2000.0, "invalid values"),
            ({**GOOD, "confidence": 1.5}, 2000.0, 2000.0, "invalid values"),
            ({**GOOD, "usable": "yes"}, 2000.0, 2000.0, "invalid values"),
            ({**GOOD, "usable": False, "problem": 'no estimate yet: 3 of 12 samples"; X = 1'}, 2000.0, 2000.0,
             "no estimate yet: 3 of 12 samples X  1")):
        ad = cron_lines(tmp_path, spare, now, beat)
        assert ads.ad_get(ad, "CoSchedSpareUsable") is False, why
        assert why in ads.ad_get(ad, "CoSchedSpareProblem")
        assert ads.ad_get(ad, "CoSchedSpareCpus") == 0.0 and ads.ad_get(ad, "CoSchedSpareMemory") == 0
        assert ads.ad_get(ad, "X") is None
        (tmp_path / "spare.json").unlink(missing_ok=True)


def test_the_cron_publishes_only_evictions_of_the_spare_slots_jobs_by_valid_names(tmp_path: Path):
    evict = [{"slot": "slot1_1", "job": "1.0", "reason": "a primary"}, {"slot": "slot2_1; X=1", "job": "2.0",
             "reason": "r"}, {"slot": "slot2_2", "job": "2.0 || true", "reason": "r"},
             {"slot": "slot2_4", "job": "4.0", "reason": 'r" ; PREEMPT = true'}, "garbage"]
    ad = cron_lines(tmp_path, {**GOOD, "evict": evict})
    assert sorted(k.lower() for k in ad if k.lower().startswith("coschedspareevict")) == ["coschedspareevict_slot2_4"]
    assert ads.ad_get(ad, "CoSchedSpareEvict_slot2_4") == "4.0 r  PREEMPT  true"


def test_a_node_without_a_spare_slot_publishes_no_spare_lines(tmp_path: Path):
    _, cfg = write_config(tmp_path, {**spare_config(), "slots": spare_config()["slots"][:1]})
    assert not any(line.startswith("CoSchedSpare") for line in cron.facts(cfg, str(tmp_path), None, 180))


# --------------------------------------------------------------------------------------- node config

def test_a_spare_slot_is_read_and_a_bad_one_is_a_config_error():
    cfg = config.parse_node_config(spare_config())
    assert cfg.spare_slot is not None and (cfg.spare_slot.slot_id, cfg.spare_slot.cores) == (2, 8)
    base = spare_config()
    for slots, why in (
            ([{**base["slots"][1], "slot_id": 1}, {**base["slots"][0], "slot_id": 2}], "it is the last slot"),
            ([*base["slots"], {**base["slots"][1], "slot_id": 3}], "at most one spare slot"),
            ([base["slots"][0], {**base["slots"][1], "cores": 9}], "more cores or memory"),
            ([{**base["slots"][1], "slot_id": 1}], "needs socket slots or a node slot"),
            ([base["slots"][0], {**base["slots"][1], "memory_mb": 0}], "'memory_mb' >= 1")):
        with pytest.raises(errors.ConfigError, match=why):
            config.parse_node_config({**base, "slots": slots})


def test_discovery_renders_the_overlapping_spare_slot_counted_twice(tmp_path: Path):
    node = discover.parse_node_config({**spare_config(), "slots": [
        {"slot_id": 1, "kind": "socket", "cores": 4, "memory_mb": 4000, "mem_bw_gbs": 0},
        {"slot_id": 2, "kind": "socket", "cores": 4, "memory_mb": 4000, "mem_bw_gbs": 0},
        {"slot_id": 3, "kind": "spare", "cores": 8, "memory_mb": 8000}]})
    text = discover.render_slots(node)
    lines = dict(line.split(" = ", 1) for line in text.splitlines() if " = " in line)
    assert lines["NUM_CPUS"] == "16" and lines["MEMORY"] == "16000"
    assert lines["SLOT_TYPE_3"].startswith("cpus=8, memory=8000") and lines["SLOT3_CoSchedSpareSlot"] == "True"
    assert lines["SLOT_TYPE_3_PARTITIONABLE"] == "True"
    startd = (Path(__file__).resolve().parents[2] / "config.d" / "20-cosched-startd.conf").read_text()
    assert "CoSchedSpareSlot" in next(line for line in startd.splitlines() if "CoSchedGuestSlot" in line
                                      and line.startswith("STARTD_ATTRS"))
    shared = discover.parse_node_config({**spare_config(), "slots": [
        {"slot_id": 1, "kind": "node", "cores": 8, "memory_mb": 8000},
        {"slot_id": 2, "kind": "guest", "cores": 8, "memory_mb": 8000},
        {"slot_id": 3, "kind": "spare", "cores": 8, "memory_mb": 8000}]})
    lines = dict(line.split(" = ", 1) for line in discover.render_slots(shared).splitlines() if " = " in line)
    assert lines["NUM_CPUS"] == "24" and lines["SLOT3_CoSchedSpareSlot"] == "True"
    for slots, why in (([{"slot_id": 1, "kind": "spare", "cores": 8, "memory_mb": 8000},
                         {"slot_id": 2, "kind": "socket", "cores": 8, "memory_mb": 8000, "mem_bw_gbs": 0}],
                        "must be the last"),
                       ([{"slot_id": 1, "kind": "socket", "cores": 4, "memory_mb": 8000, "mem_bw_gbs": 0},
                         {"slot_id": 2, "kind": "spare", "cores": 8, "memory_mb": 8000}], "more cores or memory")):
        with pytest.raises(discover.BadInput, match=why):
            discover.parse_node_config({**spare_config(), "slots": slots})


def test_the_spare_capacity_override_adds_the_spare_slot_only_on_socket_and_node_sharing_nodes(tmp_path: Path):
    from test_describe_node import FQDN, fake_node
    from cosched_node import hardware
    hw = hardware.probe_hardware(str(fake_node(tmp_path / "root")), "none", None, "none", lambda m: None)
    for role, kinds in (("socket", ["socket", "socket", "spare"]), ("node-sharing", ["node", "guest", "spare"])):
        built = describe.build_config(hw, describe.parse_overrides({"role": role, "spare_capacity": True}), FQDN,
                                      lambda m: None)
        assert [s["kind"] for s in built["slots"]] == kinds
        spare = built["slots"][-1]
        real = [s for s in built["slots"] if s["kind"] in ("socket", "node")]
        assert spare["cores"] == sum(s["cores"] for s in real)
        assert spare["memory_mb"] == sum(s["memory_mb"] for s in real)
    plain = describe.build_config(hw, describe.parse_overrides({}), FQDN, lambda m: None)
    assert all(s["kind"] != "spare" for s in plain["slots"])
    assert describe.parse_overrides({"spare_capacity": "yes"}, ini=True).spare_capacity is True
    with pytest.raises(describe.DescribeError, match="'spare_capacity' must be true or false"):
        describe.parse_overrides({"spare_capacity": "yes"})
    from test_localpool_config import MICINFO
    (tmp_path / "micinfo.txt").write_text(MICINFO)
    phi = hardware.probe_hardware(str(fake_node(tmp_path / "phi", cores_per_socket=8)), "none", None,
                                  str(tmp_path / "micinfo.txt"), lambda m: None)
    with pytest.raises(describe.DescribeError, match="'spare_capacity' is for socket and node-sharing nodes, not a "
                                                     "device node"):
        describe.build_config(phi, describe.parse_overrides({"role": "device", "spare_capacity": True}), FQDN,
                              lambda m: None)


# --------------------------------------------------------------------------------------- config.d/20

SPARE_SLOT = "slot3@node1@node1.cosched.test"


def spare_slot(**attrs) -> classad2.ClassAd:
    return classad2.ClassAd({"Name": SPARE_SLOT, "PartitionableSlot": True, "CoSchedSpareSlot": True, "Cpus": 8,
                             **attrs})


def spare_job(**attrs) -> classad2.ClassAd:
    return classad2.ClassAd({"RequestCpus": 2, "CoSchedSpare": True, "CoSchedPinSlot": SPARE_SLOT, **attrs})


def test_a_spare_slot_takes_only_an_opted_in_cpu_job_pinned_to_it():
    assert starts(spare_slot(), spare_job())
    assert starts(spare_slot(Name="slot3_1@node1@node1.cosched.test", PartitionableSlot=False), spare_job())
    assert not starts(spare_slot(), spare_job(CoSchedSpare=None))                    # not opted in
    assert not starts(spare_slot(), spare_job(CoSchedSpare=1))
    assert not starts(spare_slot(), spare_job(CoSchedPinSlot=None))                  # not pinned
    assert not starts(spare_slot(), spare_job(CoSchedPinSlot="slot1@node1@node1.cosched.test"))
    assert not starts(spare_slot(), spare_job(RequestPhiMemory=1000))               # a device job
    assert not starts(spare_slot(), spare_job(RequestGPUs=1))                       # a GPU job
    assert not starts(spare_slot(), spare_job(CoSchedProgram="MG"))                 # a spread job
    assert not starts(spare_slot(), classad2.ClassAd({"RequestCpus": 1}))           # an ordinary job
    refused = vacated(303, message="condor_sched: spare-capacity start of 1.0 on node1 (slot3_1) refused")
    assert not starts(spare_slot(), spare_job(**refused, CoSchedPinTime=1000))
    assert starts(spare_slot(), spare_job(**refused, CoSchedPinTime=1001))
    # the other slots as before
    socket = classad2.ClassAd({"Name": "slot1@node1@node1.cosched.test", "PartitionableSlot": True})
    assert starts(socket, classad2.ClassAd({"RequestCpus": 1}))
    assert starts(socket, spare_job(CoSchedPinSlot=None))


def test_an_eviction_preempts_the_named_spare_job_without_a_hold():
    record = {"CoSchedSpareEvict_slot3_1": "40.0 spare capacity: the primaries need the memory back"}
    claimed = spare_slot(Name="slot3_1@node1@node1.cosched.test", PartitionableSlot=False, JobId="40.0", **record)
    values = {knob: _policy(knob).eval(scope=claimed, target=spare_job())
              for knob in ("PREEMPT", "WANT_HOLD", "WANT_VACATE", "MAXJOBRETIREMENTTIME")}
    assert values == {"PREEMPT": True, "WANT_HOLD": False, "WANT_VACATE": True, "MAXJOBRETIREMENTTIME": -1}
    for other in (spare_slot(Name="slot3_1@node1@node1.cosched.test", JobId="400.0", **record),
                  spare_slot(Name="slot3_2@node1@node1.cosched.test", JobId="40.0", **record),
                  spare_slot(Name="slot3_1@node1@node1.cosched.test", JobId="40.0")):
        assert _policy("PREEMPT").eval(scope=other, target=spare_job()) is False
        assert _policy("MAXJOBRETIREMENTTIME").eval(scope=other, target=spare_job()) == 0


# --------------------------------------------------------------------------------------- the hook

def run_hook(node: Node, ask) -> tuple[int, dict]:
    import io
    machine = node.tmp / "machine.ad"
    machine.write_text('Name = "slot2_1@node1@node1.cosched.test"\n')
    out = io.StringIO()
    code = prepare_job.main(["--node-config", str(node.config_path), "--state-dir", str(node.state)],
                            stdin=io.BytesIO(b"ClusterId = 1\nProcId = 0\nRequestCpus = 2\nCoSchedSpare = true\n"),
                            stdout=out, env={"_CONDOR_MACHINE_AD": str(machine)}, ask=ask)
    return code, ads.parse_classad(out.getvalue(), "hook output")


def test_the_hook_starts_a_spare_job_only_once_the_agent_confined_it(tmp_path: Path):
    node = Node(tmp_path, cgroup_root=tmp_path / "nowhere")
    assert run_hook(node, lambda d: {"status": "ok", "kind": "spare", "slot": "slot2_1", "cgroup": "/x"}) == (0, {})
    refusal = {"status": "refused", "code": errors.EXIT_OVERSUBSCRIBED,
               "message": "spare-capacity start of 1.0 on node1 (slot2_1) refused: no usable cgroup: x"}
    code, out = run_hook(node, lambda d: refusal)
    assert code == errors.EXIT_OVERSUBSCRIBED and ads.ad_get(out, "HookStatusCode") == 303
    assert ads.ad_get(out, "HookStatusMessage") == ("condor_sched: spare-capacity start of 1.0 on node1 (slot2_1) "
                                                    "refused: no usable cgroup: x; back to idle for a new plan")

    def unreachable(state_dir: str) -> dict:
        raise errors.StateError(111, "node agent at x: Connection refused")

    code, out = run_hook(node, unreachable)
    assert code == errors.EXIT_NO_STATE and ads.ad_get(out, "HookStatusCode") == 305
    code, out = run_hook(node, lambda d: {"status": "ok", "kind": "other"})
    assert code == errors.EXIT_NO_STATE and "spare slot" in ads.ad_get(out, "HookStatusMessage")


def test_the_estimate_starts_anew_when_the_primaries_change(tmp_path: Path):
    """The streams describe the primaries running now: a second primary (or one ending)
    restarts them, the node publishes no estimate until MIN_SAMPLES samples of the new set."""
    node = Node(tmp_path, 2)
    first = node.claim(1, 2)
    now = 1_000_000.0
    for _ in range(insight.MIN_SAMPLES + 2):
        node.burn(first, 2 * SPARE_INTERVAL_S)
        published = node.tick(now)
        now += SPARE_INTERVAL_S
    assert published["usable"] is True and published["cpus"] == pytest.approx(6.0, abs=0.01)
    second = node.claim(1, 2)
    for i in range(insight.MIN_SAMPLES + 1):
        node.burn(first, 2 * SPARE_INTERVAL_S)
        node.burn(second, 3 * SPARE_INTERVAL_S)
        published = node.tick(now)
        now += SPARE_INTERVAL_S
        if i < insight.MIN_SAMPLES:   # the change's interval adds none, then 1..MIN_SAMPLES - 1
            assert published["usable"] is False and "no estimate yet" in published["problem"], (i, published)
            assert published["limits"]["cpus"] == pytest.approx(0.05 * 8)          # the floor meanwhile
    assert published["usable"] is True and published["cpus"] == pytest.approx(3.0, abs=0.01)   # 8 - (2 + 3)

