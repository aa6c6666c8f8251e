"""Spare capacity's confinement on the host's real cgroup v1 controllers (paper 003, Section
III-B): a CPU-burning child moved into a group by the real ``SpareCgroups`` code is held at a
0.2-core cap, runs faster once the cap is lifted, and a memory limit reads back as written.
Runs as root where the host has writable v1 cpu, cpuacct and memory hierarchies (our CI machines
do); every group it makes is removed and its child killed, whatever happens."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
from cosched_node import insight
from cosched_node.spare_cgroups import CFS_PERIOD_US, Limits, SpareCgroups

MB = 1 << 20


def v1_root() -> str | None:
    """The parent of the host's v1 cpu, cpuacct and memory hierarchies (/proc/self/mountinfo),
    when all three are mounted side by side under it and writable; else None."""
    mounts = {}
    try:
        with open("/proc/self/mountinfo", encoding="utf-8") as handle:
            for line in handle:
                fields = line.split()
                if " - cgroup " not in line:
                    continue
                options = fields[-1].split(",")
                for controller in ("cpu", "cpuacct", "memory"):
                    if controller in options:   # the host's own, not a later bind (a pool's chroot)
                        mounts.setdefault(controller, fields[4])
    except OSError:
        return None
    if set(mounts) != {"cpu", "cpuacct", "memory"} or os.geteuid() != 0:
        return None
    parents = {os.path.dirname(path) for path in mounts.values()}
    if len(parents) != 1 or not all(os.access(path, os.W_OK) for path in mounts.values()):
        return None
    return parents.pop()


ROOT = v1_root()
pytestmark = pytest.mark.skipif(ROOT is None, reason="no writable cgroup v1 cpu, cpuacct and memory hierarchies "
                                                     "side by side (or not root)")


def cores_used(cgroups: SpareCgroups, group: str, seconds: float) -> float:
    before, start = cgroups.usage(group).cpu_s, time.monotonic()
    time.sleep(seconds)
    return (cgroups.usage(group).cpu_s - before) / (time.monotonic() - start)


def remove_test_groups(cgroups: SpareCgroups, group: str) -> None:
    """rmdir the test's group (once the killed process has left it) and its parent, everywhere."""
    for _ in range(50):
        if cgroups.remove(group) is None:
            break
        time.sleep(0.05)
    for path in cgroups._dirs(f"/{cgroups.parent}"):
        if os.path.isdir(path):
            os.rmdir(path)


def test_a_capped_burner_in_a_real_v1_group_uses_at_most_its_cap_and_more_once_lifted():
    cgroups = SpareCgroups(ROOT, parent=f"cosched_test_{os.getpid()}")
    assert cgroups.probe() is None and cgroups.version == 1
    group = cgroups.ours("slot9_1")
    child = None
    try:
        cgroups.create(group)
        assert cgroups.check(group) is None
        parent = os.path.join(cgroups.hierarchies["cpu"], cgroups.parent)
        assert open(os.path.join(parent, "cpu.shares")).read().strip() in ("2", "3")
        assert not os.path.exists(os.path.join(parent, "cpu.idle")) or \
            open(os.path.join(parent, "cpu.idle")).read().strip() == "1"     # the parent too: weight is per level
        child = subprocess.Popen([sys.executable, "-c", "while True: pass"])
        assert cgroups.move(group, [child.pid]) == [child.pid]
        assert cgroups.procs(group) == [child.pid]
        skipped = cgroups.write_limits(group, Limits(0.2, 64 * MB, 128 * MB))
        assert cgroups.read_limit(group, "cpu.cfs_quota_us") == str(int(0.2 * CFS_PERIOD_US))
        assert cgroups.read_limit(group, "cpu.cfs_period_us") == str(CFS_PERIOD_US)
        assert cgroups.read_limit(group, "cpu.shares") in ("2", "3")   # 3: an idle group's weight (cpu.idle)
        assert skipped or cgroups.read_limit(group, "cpu.idle") == "1"
        assert cgroups.read_limit(group, "memory.limit_in_bytes") == str(128 * MB)
        assert cgroups.read_limit(group, "memory.soft_limit_in_bytes") == str(64 * MB)
        time.sleep(0.3)
        capped = cores_used(cgroups, group, 2.0)
        assert capped <= 0.3, f"capped at 0.2 cores, used {capped:.2f}"
        cgroups.write_limits(group, Limits(4.0, 64 * MB, 128 * MB), memory=False)
        time.sleep(0.2)
        lifted = cores_used(cgroups, group, 1.0)
        assert lifted > 0.5 and lifted > 2 * capped, f"lifted: {lifted:.2f} cores, capped: {capped:.2f}"
        assert cgroups.usage(group).memory_bytes >= 0
    finally:
        if child is not None:
            os.kill(child.pid, signal.SIGKILL)
            child.wait()
        remove_test_groups(cgroups, group)
    assert not any(os.path.exists(path) for path in cgroups._dirs(f"/{cgroups.parent}"))


def test_the_agent_confines_a_real_spare_claim_from_its_start_and_removes_its_group_at_its_end(tmp_path):
    from cosched_node import procs
    from test_node_harness import JOB_UID, FakeView, Starters, make_agent, slot_ad, write_config
    _, cfg = write_config(tmp_path, {"node": "node1", "domain": "cosched.test", "cores": 2, "memory_mb": 1000,
                                     "slots": [{"slot_id": 1, "kind": "socket", "cores": 2, "memory_mb": 1000},
                                               {"slot_id": 2, "kind": "spare", "cores": 2, "memory_mb": 1000}]})
    cgroups = SpareCgroups(ROOT, parent=f"cosched_test_{os.getpid()}")
    starters, logs = Starters(), []
    try:
        starter = starters.job()
        view = FakeView(cfg, [slot_ad("slot2_1", "7.0", starter.pid, Cpus=2, Memory=1000)])
        node_agent = make_agent(cfg, tmp_path / "state", view, logs, spare_cgroups=cgroups)
        refused = node_agent.answer(starter.child, JOB_UID)    # the job's process stands in for the hook
        assert refused["status"] == "refused" and "no estimate of its primaries yet" in refused["message"]
        for _ in range(insight.MIN_SAMPLES + 1):                 # no primary: the node is all spare
            node_agent.tick()
        reply = node_agent.answer(starter.child, JOB_UID)
        assert reply == {"status": "ok", "kind": "spare", "slot": "slot2_1", "cgroup": cgroups.ours("slot2_1")}, logs
        group = reply["cgroup"]
        assert starter.pid in cgroups.procs(group)               # the starter: its next child starts inside
        node_agent.tick()
        assert sorted(cgroups.procs(group)) == sorted([starter.pid, starter.child])
        assert cgroups.read_limit(group, "cpu.cfs_quota_us") == "200000"      # both cores idle
        assert cgroups.read_limit(group, "memory.limit_in_bytes") == str(1000 * MB)
        assert procs.read_proc(starter.child) is not None
        starter.end()
        view.drop("7.0")
        for _ in range(50):
            node_agent.tick()
            if not any(os.path.exists(p) for p in cgroups._dirs(group)):
                break
            time.sleep(0.05)
        assert not any(os.path.exists(p) for p in cgroups._dirs(group)), logs
    finally:
        starters.close()
        for _ in range(50):
            if cgroups.version is None or cgroups.remove(cgroups.ours("slot2_1")) is None:
                break
            time.sleep(0.05)
        for path in cgroups._dirs(f"/{cgroups.parent}") if cgroups.version else ():
            if os.path.isdir(path):
                os.rmdir(path)


def test_a_spare_job_gets_next_to_nothing_while_ordinary_processes_want_every_core():
    """The idle class protects the primaries whatever the cap: with every host core wanted by
    ordinary processes, a burner in a spare group (cap lifted to all cores) gets a sliver."""
    cgroups = SpareCgroups(ROOT, parent=f"cosched_test_{os.getpid()}")
    assert cgroups.probe() is None
    group = cgroups.ours("slot9_2")
    burners: list = []
    try:
        cgroups.create(group)
        spare = subprocess.Popen([sys.executable, "-c", "while True: pass"])
        burners.append(spare)
        cgroups.move(group, [spare.pid])
        skipped = cgroups.write_limits(group, Limits(float(os.cpu_count() or 1), 64 * MB, 128 * MB), memory=False)
        burners += [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(os.cpu_count() or 1)]
        time.sleep(0.3)
        used = cores_used(cgroups, group, 2.0)
        limit = 0.5 if skipped else 0.15      # no cpu.idle: the least weight alone (2 of 1024 per core)
        assert used <= limit, f"a spare burner beside {len(burners) - 1} ordinary ones used {used:.2f} cores"
    finally:
        for proc in burners:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
        remove_test_groups(cgroups, group)
    assert not any(os.path.exists(path) for path in cgroups._dirs(f"/{cgroups.parent}"))

