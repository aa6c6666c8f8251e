"""Paper 001's live mapping on the node (issue 14): the node agent's cgroup v2 cpusets of
node-slot claims (mates) and their guests, on a directory laid out as cgroup v2 and a /proc
laid out as Linux's (starters, hooks and jobs as files; ``tests/unit/test_device_placement.py``
does the same for devices).

- every ``cpuset.cpus`` write is recorded and, right after it, the cpusets of all live job
  cgroups are checked pairwise disjoint (never sampled);
- a guest takes the highest k = min(floor(mate cores x SharingFactor), cores - 1) of its
  mate's CPUs, the mate's cgroup shrunk first; its end gives them back (Listing 3); a mate that
  ends first leaves them lent, and a node-slot start that needs them is refused;
- refusals: cgroup root missing, not writable, cgroup v1, no cpuset controller; mate not
  running, already hosting, memory over; a job-owned or job-writable mate cgroup; a failed write;
- a restarted agent keeps every assignment.
"""

from __future__ import annotations

import io
import json
import os
import random
import shutil
import signal
import threading
from pathlib import Path

import pytest
from cosched_node import ads, agent, channel, config, cpusets, environment, errors, prepare_job, procs, state
from cosched_node import startd_cron as cron
from test_node_harness import (HOOKS, IS_ROOT, SYSTEM_PYTHON, FakeView, Starters, go, make_agent, slot_ad, wait_for,
                               write_config)

pytestmark = pytest.mark.usefixtures("fake_pids_are_not_ours")
JOB_UID = 2001
HOOK_ARGV = [SYSTEM_PYTHON, "-Es", str(HOOKS / "cosched_prepare_job.py")]
STARTER_CGROUP = "/system.slice/condor.service"


def node_config(cores: int = 8, memory_mb: int = 8192, sharing_factor: float = 0.5) -> dict:
    return {"node": "node1", "domain": "cosched.test", "cores": cores, "memory_mb": memory_mb, "slots": [
        {"slot_id": 1, "kind": "node", "cores": cores, "memory_mb": memory_mb},
        {"slot_id": 2, "kind": "guest", "cores": cores, "memory_mb": memory_mb, "sharing_factor": sharing_factor}]}


def fake_proc(proc_root: Path, pid: int, ppid: int, comm: str, uid: int, start: int, cgroup: str) -> None:
    """/proc/<pid>/stat, status and cgroup as Linux lays them out."""
    (proc_root / str(pid)).mkdir(parents=True)
    (proc_root / str(pid) / "stat").write_text(f"{pid} ({comm}) S {ppid} {pid} {pid} " + "0 " * 15 + f"{start} 0\n")
    (proc_root / str(pid) / "status").write_text(f"Name:\t{comm}\nUid:\t{uid}\t{uid}\t{uid}\t{uid}\n")
    (proc_root / str(pid) / "cgroup").write_text(f"0::{cgroup}\n")


def make_cgroup_root(root: Path, effective: str = "0-7", controllers: str = "cpuset cpu io memory pids") -> Path:
    """A cgroup v2 root as /sys/fs/cgroup: cgroup.controllers, cpuset.cpus.effective, and the
    parent of the job cgroups (htcondor/)."""
    root.mkdir(parents=True)
    (root / "cgroup.controllers").write_text(controllers + "\n")
    (root / "cpuset.cpus.effective").write_text(effective + "\n")
    (root / "htcondor").mkdir(mode=0o755)
    os.chmod(root / "htcondor", 0o755)
    (root / STARTER_CGROUP.lstrip("/")).mkdir(parents=True)         # the starters' (and hooks') cgroup
    (root / STARTER_CGROUP.lstrip("/") / "cpuset.cpus").write_text("")
    return root


class Sim:
    """An execute node: node config, a cgroup v2 root, a /proc, a slot view, the agent. Every
    cpuset write goes through ``on_write``, which checks the invariant right after it."""

    def __init__(self, tmp: Path, effective: str = "0-7", cores: int = 8, memory_mb: int = 8192,
                 sharing_factor: float = 0.5, cgroup_root: Path | None = None,
                 hook_in_job_cgroup: bool = False) -> None:
        self.tmp = tmp
        self.hook_in_job_cgroup = hook_in_job_cgroup   # the starter made the job's cgroup before its hook
        self.config_path, self.config = write_config(tmp, node_config(cores, memory_mb, sharing_factor))
        self.cg = cgroup_root if cgroup_root is not None else make_cgroup_root(tmp / "cgroup", effective)
        self.proc = tmp / "proc"
        self.proc.mkdir()
        self.state = tmp / "state"
        state.prepare_state_dir(str(self.state))
        self.view = FakeView(self.config)
        self.logs: list[str] = []
        self.writes: list[tuple[str, str]] = []
        self.jobs: dict[str, dict] = {}      # job id -> {"starter", "pid", "slot", "cgroup"}
        self.n = 0
        self.agent = self.new_agent()

    def new_agent(self) -> agent.Agent:
        cgroups = cpusets.CgroupCpusets(str(self.cg), proc_root=str(self.proc))
        real_write = cgroups.write

        def on_write(cgroup: str, cpus) -> None:
            real_write(cgroup, cpus)
            self.writes.append((cgroup, cpusets.format_cpu_list(cpus)))
            self.check_disjoint(f"after write #{len(self.writes)} {cgroup} = {cpusets.format_cpu_list(cpus)}")

        cgroups.write = on_write
        return agent.Agent(self.config, str(self.state), self.view, None, self.logs.append,
                           proc_root=str(self.proc), starter_uid=0, cgroups=cgroups)

    # -- what the files say

    def live_cpusets(self) -> dict[str, frozenset]:
        """cpuset.cpus of every live job's cgroup (unwritten: empty)."""
        out = {}
        for job, info in self.jobs.items():
            path = self.cg / info["cgroup"].lstrip("/") / "cpuset.cpus"
            if path.exists():
                out[job] = cpusets.parse_cpu_list(path.read_text())
        return out

    def check_disjoint(self, when: str) -> None:
        sets = self.live_cpusets()
        clash = cpusets.overlap(sets)
        assert clash is None, f"{when}: jobs {clash[0]} and {clash[1]} share CPUs {sorted(clash[2])}"

    def cpuset_of(self, job: str) -> str:
        return cpusets.format_cpu_list(self.live_cpusets()[job])

    # -- the startd and the starters

    def start(self, kind: str, cpus: int, memory_mb: int = 1024, mate: str | None = None,
              job_cgroup_mode: int = 0o755, malleable: bool = True) -> dict:
        """A claim of the node (kind "node") or guest slot: its starter runs the hook, which asks
        the agent; a started job then runs in its own cgroup htcondor/<slot> (made before the
        hook, which runs in it, when ``hook_in_job_cgroup``)."""
        n = self.n = self.n + 1
        job, slot = f"{n}.0", f"slot{1 if kind == 'node' else 2}_{n}"
        starter, hook, pid = 1000 + n, 3000 + n, 5000 + n
        cgroup = f"/htcondor/{slot}"
        path = self.cg / cgroup.lstrip("/")
        fake_proc(self.proc, starter, 1, "condor_starter", 0, 100 + n, STARTER_CGROUP)
        if self.hook_in_job_cgroup:
            self.make_job_cgroup(path, job_cgroup_mode)
            self.jobs[job] = {"starter": starter, "pid": hook, "slot": slot, "cgroup": cgroup, "kind": kind}
        fake_proc(self.proc, hook, starter, "python3", JOB_UID, 200 + n,
                  cgroup if self.hook_in_job_cgroup else STARTER_CGROUP)
        attrs = {"Cpus": cpus, "Memory": memory_mb}
        if malleable:
            attrs["CoSchedMalleable"] = True
        if mate is not None:
            attrs["CoSchedPinMate"] = mate
        self.view.ads.append(slot_ad(slot, job, starter, **attrs))
        reply = self.agent.answer(hook, JOB_UID)
        shutil.rmtree(self.proc / str(hook))            # the hook exits
        if reply["status"] != "ok":
            shutil.rmtree(self.proc / str(starter))     # a refused start's starter exits
            self.view.drop(job)
            if self.jobs.pop(job, None):
                shutil.rmtree(path)
            return {**reply, "job": job}
        if not self.hook_in_job_cgroup:
            self.make_job_cgroup(path, job_cgroup_mode)
        fake_proc(self.proc, pid, starter, "job", JOB_UID, 300 + n, cgroup)
        self.jobs[job] = {"starter": starter, "pid": pid, "slot": slot, "cgroup": cgroup, "kind": kind}
        return {**reply, "job": job}

    def make_job_cgroup(self, path: Path, mode: int) -> None:
        if path.parent.is_dir():                        # an unusable root has no job cgroups
            path.mkdir(mode=mode)
            os.chmod(path, mode)
            (path / "cpuset.cpus").write_text("")

    def end(self, job: str) -> None:
        info = self.jobs.pop(job)
        shutil.rmtree(self.proc / str(info["starter"]))
        shutil.rmtree(self.proc / str(info["pid"]))
        shutil.rmtree(self.cg / info["cgroup"].lstrip("/"), ignore_errors=True)
        self.view.drop(job)

    def tick(self) -> None:
        self.agent.tick()
        self.check_disjoint("after an interval")

    def published(self) -> dict:
        return json.loads((self.state / "cpusets.json").read_text())

    def log(self) -> str:
        return "\n".join(self.logs)


@pytest.fixture
def sim(tmp_path: Path) -> Sim:
    return Sim(tmp_path)


# --------------------------------------------------------------------------------------- pure parts

def test_cpu_lists_round_trip_and_refuse_garbage():
    assert cpusets.parse_cpu_list("0-3,8,10-11\n") == frozenset({0, 1, 2, 3, 8, 10, 11})
    assert cpusets.format_cpu_list({11, 10, 8, 3, 2, 1, 0}) == "0-3,8,10-11"
    assert cpusets.parse_cpu_list("") == frozenset() and cpusets.format_cpu_list(()) == ""
    for bad in ("3-1", "a", "0-99999", "1,,2", "-1", "0 1"):
        with pytest.raises(cpusets.CpusetError):
            cpusets.parse_cpu_list(bad)


def test_node_cpus_are_the_first_c_effective_and_guests_take_the_highest_k():
    assert cpusets.node_cpus({8, 9, 2, 3, 4, 5}, 4) == (2, 3, 4, 5)
    assert cpusets.node_cpus({0, 1}, 4) is None
    assert cpusets.lowest_free((0, 1, 2, 3, 4), {1, 3}, 2) == (0, 2)
    assert cpusets.lowest_free((0, 1, 2, 3), {1, 3}, 3) is None
    # k = min(floor(C x SharingFactor), C - 1), the sidecar's guest_cores
    assert [cpusets.guest_share(c, 0.5) for c in (1, 2, 3, 8)] == [0, 1, 1, 4]
    assert cpusets.guest_share(4, 0.99) == 3 and cpusets.guest_share(10, 0.29) == 2
    assert cpusets.guest_take((0, 1, 2, 3, 8, 9), 2) == (8, 9)


def test_the_write_order_shrinks_before_it_widens_and_never_overlaps():
    current = {"mate": frozenset(range(8)), "guest": frozenset()}
    wanted = {"mate": frozenset(range(4)), "guest": frozenset(range(4, 8))}
    writes, deferred = cpusets.ordered_writes(current, wanted)
    assert writes == [("mate", frozenset(range(4))), ("guest", frozenset(range(4, 8)))] and deferred == []
    # the reverse (Listing 3): the guest's cgroup is gone, the mate widens
    assert cpusets.ordered_writes({"mate": frozenset(range(4))}, {"mate": frozenset(range(8))})[0] == \
        [("mate", frozenset(range(8)))]
    # a swap cannot be done without an overlap or an empty set: deferred, nothing written
    writes, deferred = cpusets.ordered_writes({"a": frozenset({0}), "b": frozenset({1})},
                                              {"a": frozenset({1}), "b": frozenset({0})})
    assert writes == [] and deferred == ["a", "b"]


def test_random_write_orders_never_overlap():
    rng = random.Random(7)
    for _ in range(2000):
        cpus = list(range(10))
        owners = {f"j{i}": frozenset(c for c in cpus if rng.random() < 0.3) for i in range(4)}
        current, taken = {}, set()
        for key, cpus_of in owners.items():        # a disjoint start
            current[key] = cpus_of - taken
            taken |= current[key]
        wanted, free = {}, set(cpus)
        for key in current:                         # a disjoint goal
            wanted[key] = frozenset(c for c in free if rng.random() < 0.4)
            free -= wanted[key]
        writes, deferred = cpusets.ordered_writes(current, wanted)
        state_now = dict(current)
        for key, value in writes:
            assert value, "never an empty cpuset"
            state_now[key] = value
            assert cpusets.overlap(state_now) is None
        assert all(state_now[k] == wanted[k] for k in wanted if wanted[k] and k not in deferred)


# --------------------------------------------------------------------------------------- mates and guests

def test_a_guest_takes_half_of_its_mates_cpus_mate_shrunk_first_and_gives_them_back(sim: Sim):
    mate = sim.start("node", 8)
    assert mate["status"] == "ok" and mate["kind"] == "node" and mate["cpus"] == "0-7"
    sim.tick()
    assert sim.cpuset_of(mate["job"]) == "0-7"
    sim.writes.clear()
    guest = sim.start("guest", 8, mate=mate["job"])
    assert (guest["status"], guest["kind"], guest["cpus"], guest["threads"]) == ("ok", "guest", "4-7", 4)
    # at the guest's hook only the mate was written: shrunk before the guest has anything
    assert sim.writes == [("/htcondor/slot1_1", "0-3")]
    sim.tick()
    assert sim.writes == [("/htcondor/slot1_1", "0-3"), ("/htcondor/slot2_2", "4-7")]
    assert sim.cpuset_of(mate["job"]) == "0-3" and sim.cpuset_of(guest["job"]) == "4-7"
    assert "cpuset: job 1.0 (slot1_1) /htcondor/slot1_1 cpuset.cpus 0-7 -> 0-3" in sim.log()
    assert "guest 2.0 started in slot2_2 on node1: 4 of mate 1.0's CPUs, 4-7" in sim.log()
    assert sum(line == f"cpusets usable under {sim.cg}: node slot CPUs 0-7" for line in sim.logs) == 1
    # Listing 3: the guest ends, its cores go back to its mate
    sim.end(guest["job"])
    sim.tick()
    assert sim.cpuset_of(mate["job"]) == "0-7" and sim.writes[-1] == ("/htcondor/slot1_1", "0-7")
    assert sim.published()["lent_cpus"] == 0


def test_a_mate_that_ends_first_leaves_its_guests_cpus_lent(sim: Sim):
    mate = sim.start("node", 6)
    other = sim.start("node", 2)
    assert (mate["cpus"], other["cpus"]) == ("0-5", "6-7")
    guest = sim.start("guest", 8, mate=mate["job"])
    assert guest["cpus"] == "3-5"
    sim.tick()
    sim.end(mate["job"])
    sim.tick()
    assert sim.cpuset_of(guest["job"]) == "3-5"           # the guest keeps its k cores
    assert sim.published()["lent_cpus"] == 3
    # HTCondor gives the mate's 6 cores back to slot1: only 3 are free here
    refused = sim.start("node", 4)
    assert refused["status"] == "refused" and refused["code"] == errors.EXIT_OVERSUBSCRIBED
    assert refused["message"] == ("node-slot start of 4.0 on node1 (slot1_4) refused: 4 cores needed, 3 of the "
                                  "node slot's 8 free (3 lent to guests whose mates ended)")
    assert "job 4.0: start refused" in sim.log()
    fits = sim.start("node", 3)
    assert fits["cpus"] == "0-2"
    sim.tick()
    sim.end(guest["job"])
    sim.tick()
    assert sim.published()["lent_cpus"] == 0
    assert sim.start("node", 3)["cpus"] == "3-5"


def test_node_slot_claims_get_the_lowest_free_cpus_and_refusal_when_none(sim: Sim):
    first, second = sim.start("node", 3), sim.start("node", 2)
    assert (first["cpus"], second["cpus"]) == ("0-2", "3-4")
    sim.tick()
    sim.end(first["job"])
    assert sim.start("node", 4)["cpus"] == "0-2,5"
    assert sim.start("node", 3)["status"] == "refused"


def test_the_first_c_effective_cpus_are_the_node_slots(tmp_path: Path):
    sim = Sim(tmp_path, effective="2-5,8-15", cores=6)
    assert sim.start("node", 6)["cpus"] == "2-5,8-9"
    sim.tick()
    assert sim.cpuset_of("1.0") == "2-5,8-9"


@pytest.mark.parametrize("hook_in_job_cgroup", [False, True])
@pytest.mark.parametrize("seed", range(30))
def test_random_starts_and_ends_keep_cpusets_disjoint_after_every_write(tmp_path: Path, seed: int,
                                                                        hook_in_job_cgroup: bool):
    """Node-slot and guest starts and ends, intervals and agent restarts in random order,
    against a model of what each claim holds; the invariant is checked after every write.
    With ``hook_in_job_cgroup`` the guest's cgroup is there at its hook, so the mate's shrink
    and the guest's widening happen in one round of writes."""
    rng = random.Random(seed)
    sim = Sim(tmp_path, effective="0-3,8-15", cores=8, memory_mb=6000, hook_in_job_cgroup=hook_in_job_cgroup)
    node_cpus = (0, 1, 2, 3, 8, 9, 10, 11)
    held: dict[str, tuple] = {}          # job -> CPUs the agent gave it
    mates: dict[str, str] = {}           # guest -> mate
    memory: dict[str, int] = {}
    for _ in range(40):
        what = rng.choice(["node", "node", "guest", "guest", "end", "end", "tick", "restart"])
        if what == "restart":
            before = {r.claim.job: r.cpus for r in sim.agent.records.values() if r.cpus}
            sim.agent = sim.new_agent()
            assert {r.claim.job: r.cpus for r in sim.agent.records.values() if r.cpus} == before
        elif what == "tick":
            sim.tick()
        elif what == "end" and sim.jobs:
            job = rng.choice(sorted(sim.jobs))
            sim.end(job)
            held.pop(job), memory.pop(job), mates.pop(job, None)
            if rng.random() < 0.7:
                sim.tick()
        elif what == "node":
            cpus, mb = rng.randint(1, 5), rng.randint(100, 2000)
            taken = {c for cs in held.values() for c in cs}
            free = [c for c in node_cpus if c not in taken]
            reply = sim.start("node", cpus, mb)
            if len(free) >= cpus:
                assert reply["status"] == "ok" and reply["cpus"] == cpusets.format_cpu_list(free[:cpus])
                held[reply["job"]], memory[reply["job"]] = tuple(free[:cpus]), mb
            else:
                assert reply["status"] == "refused" and reply["code"] == errors.EXIT_OVERSUBSCRIBED
                assert "cores needed" in reply["message"]
        elif what == "guest":
            mb = rng.randint(100, 2000)
            nodes = [j for j in sorted(held) if j not in mates]
            mate = rng.choice(nodes + ["999.0"]) if nodes else "999.0"
            mate_cpus = held.get(mate, ())
            k = min(len(mate_cpus) // 2, len(mate_cpus) - 1)
            hosting = mate in mates.values()
            over = sum(memory.values()) + mb > 6000
            reply = sim.start("guest", 8, mb, mate=mate)
            if mate in held and not hosting and not over and k >= 1:
                assert reply["status"] == "ok", reply
                assert reply["cpus"] == cpusets.format_cpu_list(sorted(mate_cpus)[-k:]) and reply["threads"] == k
                held[reply["job"]], memory[reply["job"]], mates[reply["job"]] = tuple(sorted(mate_cpus)[-k:]), mb, mate
            else:
                assert reply["status"] == "refused" and reply["code"] == errors.EXIT_OVERSUBSCRIBED, reply
                assert reply["message"].startswith(f"guest start of {reply['job']} on node1")
        # what each live claim's cgroup must hold once the agent has had an interval
        sim.tick()
        files = sim.live_cpusets()
        for job, cpus in held.items():
            guests = [g for g, m in mates.items() if m == job]
            expect = set(cpus) - {c for g in guests for c in held[g]}
            assert files[job] == frozenset(expect), (job, files[job], expect)
        lent = sum(len(held[g]) for g, m in mates.items() if m not in held)
        assert sim.published()["lent_cpus"] == lent
    # a restarted agent, once every job ended, frees everything: the whole node slot is free
    for job in list(sim.jobs):
        sim.end(job)
    sim.agent = sim.new_agent()
    sim.tick()
    assert sim.start("node", 8)["cpus"] == "0-3,8-11"


def test_a_restarted_agent_keeps_assignments_and_gives_back_after_a_guest_ended_while_down(sim: Sim):
    mate = sim.start("node", 4)
    sim.start("node", 2)
    guest = sim.start("guest", 4, mate=mate["job"])
    sim.tick()
    saved = json.loads((sim.state / "jobs.json").read_text())
    assert sorted((r["claim"]["job"], r["cpus"]) for r in saved) == [("1.0", [0, 1, 2, 3]), ("2.0", [4, 5]),
                                                                    ("3.0", [2, 3])]
    sim.end(guest["job"])                          # while the agent is down
    sim.agent = sim.new_agent()
    assert {r.claim.job: r.cpus for r in sim.agent.records.values()} == {"1.0": (0, 1, 2, 3), "2.0": (4, 5),
                                                                         "3.0": (2, 3)}
    sim.tick()
    assert sim.cpuset_of(mate["job"]) == "0-3" and sim.cpuset_of("2.0") == "4-5"
    assert sim.start("node", 2)["cpus"] == "6-7"


def test_a_node_slot_claim_the_hook_never_announced_gets_cpus_at_the_next_interval(sim: Sim):
    fake_proc(sim.proc, 1900, 1, "condor_starter", 0, 50, STARTER_CGROUP)
    (sim.cg / "htcondor" / "slot1_9").mkdir()
    (sim.cg / "htcondor" / "slot1_9" / "cpuset.cpus").write_text("")
    fake_proc(sim.proc, 1901, 1900, "job", JOB_UID, 51, "/htcondor/slot1_9")
    sim.jobs["9.0"] = {"starter": 1900, "pid": 1901, "slot": "slot1_9", "cgroup": "/htcondor/slot1_9"}
    sim.view.ads.append(slot_ad("slot1_9", "9.0", 1900, Cpus=3))
    sim.tick()
    assert sim.cpuset_of("9.0") == "0-2" and "job 9.0 in slot1_9: CPUs 0-2" in sim.log()


# --------------------------------------------------------------------------------------- refusals

def unusable_root(tmp_path: Path, how: str, monkeypatch) -> Path:
    root = tmp_path / "cgroup"
    if how == "missing":
        return root
    if how == "v1":                                # the host's hybrid layout: one hierarchy per controller
        for name in ("cpuset", "memory", "unified"):
            (root / name).mkdir(parents=True)
        (root / "cpuset" / "cpuset.cpus").write_text("0-7\n")
        return root
    make_cgroup_root(root, controllers="cpu io memory pids" if how == "no cpuset" else "cpuset cpu io memory pids")
    if how == "read-only":
        real_access = os.access
        monkeypatch.setattr(cpusets.os, "access",
                            lambda path, mode: False if str(path) == str(root) else real_access(path, mode))
    return root


@pytest.mark.parametrize("how, why", [("missing", "is missing"), ("v1", "is not cgroup v2 (no cgroup.controllers)"),
                                      ("no cpuset", "the cpuset controller is not available"),
                                      ("read-only", "is not writable")])
def test_without_usable_cgroups_guests_are_refused_and_node_jobs_start_without_cpusets(tmp_path: Path, monkeypatch,
                                                                                      how: str, why: str):
    sim = Sim(tmp_path, cgroup_root=unusable_root(tmp_path, how, monkeypatch))
    mate = sim.start("node", 8)
    assert mate["status"] == "ok" and mate["cpus"] is None
    guest = sim.start("guest", 8, mate=mate["job"])
    assert guest["status"] == "refused" and guest["code"] == errors.EXIT_OVERSUBSCRIBED
    assert guest["message"].startswith("guest start of 2.0 on node1 (slot2_2) refused: cpusets unusable on node1: "
                                       f"cgroup root {sim.cg}") and why in guest["message"]
    for _ in range(3):
        sim.tick()
    assert sum(line.startswith("cpusets unusable: ") for line in sim.logs) == 1          # logged once
    assert sim.writes == [] and sim.published()["usable"] is False
    out = io.StringIO()
    assert cron.main(["--node-config", str(sim.config_path), "--state-dir", str(sim.state)], stdout=out,
                     micinfo_text=None) == 0
    ad = ads.parse_classad(out.getvalue())
    assert ads.ad_get(ad, "CoSchedNodeSharing") is False and ads.ad_get(ad, "CoSchedLentCpus") == 0


def test_too_few_effective_cpus_make_cpusets_unusable(tmp_path: Path):
    sim = Sim(tmp_path, effective="0-3", cores=8)
    assert sim.start("node", 2)["cpus"] is None
    assert "fewer than the node slot's 8" in sim.start("guest", 8, mate="1.0")["message"]


@pytest.mark.parametrize("mate, why", [
    (None, "CoSchedPinMate names no job (missing or not Cluster.Proc)"),
    ("1.0; rm -rf /", "CoSchedPinMate names no job (missing or not Cluster.Proc)"),
    ("77.0", "mate 77.0 is not a running node-slot claim of node1"),
    ("2.0", "mate 2.0 is not a running node-slot claim of node1"),           # a guest is no mate
])
def test_a_guest_whose_mate_is_not_a_running_node_slot_claim_is_refused(sim: Sim, mate, why):
    first = sim.start("node", 4)
    assert sim.start("guest", 8, mate=first["job"])["status"] == "ok"     # 2.0, a guest
    sim.tick()
    reply = sim.start("guest", 8, mate=mate)
    assert reply == {"status": "refused", "code": errors.EXIT_OVERSUBSCRIBED, "job": "3.0",
                     "message": f"guest start of 3.0 on node1 (slot2_3) refused: {why}"}
    assert f"job 3.0: start refused (caller pid 3003, uid {JOB_UID}): guest start of 3.0" in sim.log()


def test_a_mate_hosts_one_guest_and_memory_is_not_oversubscribed(tmp_path: Path):
    sim = Sim(tmp_path, memory_mb=4000)
    mate = sim.start("node", 4, memory_mb=2000)
    other = sim.start("node", 4, memory_mb=1000)
    assert sim.start("guest", 8, memory_mb=500, mate=mate["job"])["status"] == "ok"
    second = sim.start("guest", 8, memory_mb=100, mate=mate["job"])
    assert second["message"].endswith("refused: mate 1.0 already hosts guest 3.0")
    over = sim.start("guest", 8, memory_mb=501, mate=other["job"])
    assert over["message"].endswith("refused: memory 3500+501 MB > 4000 MB of the node slot")
    assert sim.start("guest", 8, memory_mb=500, mate=other["job"])["status"] == "ok"


def test_a_job_that_did_not_opt_in_is_never_a_mate(sim: Sim):
    plain = sim.start("node", 8, malleable=False)
    sim.tick()
    reply = sim.start("guest", 8, mate=plain["job"])
    assert reply["message"].endswith("refused: mate 1.0 did not opt in (CoSchedMalleable)")
    sim.tick()
    assert sim.cpuset_of(plain["job"]) == "0-7"


def test_an_agent_that_lost_its_records_never_widens_a_mate_over_its_guest(sim: Sim):
    mate = sim.start("node", 8)
    guest = sim.start("guest", 8, mate=mate["job"])
    sim.tick()
    assert (sim.cpuset_of(mate["job"]), sim.cpuset_of(guest["job"])) == ("0-3", "4-7")
    (sim.state / "jobs.json").unlink()
    sim.agent = sim.new_agent()
    sim.writes.clear()
    sim.tick()                                      # the mate is planned 0-7 afresh; the guest holds 4-7
    assert sim.writes == [] and sim.cpuset_of(mate["job"]) == "0-3"
    assert "job 1.0 (slot1_1): cpuset 0-7 deferred: it would overlap another claim's" in sim.log()
    sim.end(guest["job"])
    sim.tick()
    assert sim.cpuset_of(mate["job"]) == "0-7"


def test_a_mate_of_one_core_has_none_to_share(sim: Sim):
    mate = sim.start("node", 1)
    assert sim.start("guest", 8, mate=mate["job"])["message"].endswith(
        "mate 1.0 has 1 cores: none to share at SharingFactor 0.5")


@pytest.mark.parametrize("change, why", [
    ("owned", "cgroup /htcondor/slot1_1 is job-owned or job-writable (" ),
    ("writable", "cgroup /htcondor/slot1_1 is job-owned or job-writable ("),
    ("file", "cgroup /htcondor/slot1_1: cpuset.cpus is job-owned or job-writable"),
    ("parent", "cgroup /htcondor/slot1_1 is job-owned or job-writable ("),
    ("no cpuset", "cgroup /htcondor/slot1_1 has no cpuset.cpus"),
    ("root", "is not a plain cgroup"),
    ("starter", "is its starter's own"),
    ("split", "job processes in 2 cgroups"),
])
def test_a_guest_is_refused_when_its_mates_cgroup_is_not_roots_own(sim: Sim, change: str, why: str):
    mate = sim.start("node", 8)
    sim.tick()
    path = sim.cg / "htcondor" / "slot1_1"
    if change == "owned":
        os.chown(path, JOB_UID, JOB_UID)
    elif change == "writable":
        os.chmod(path, 0o777)
    elif change == "file":
        os.chmod(path / "cpuset.cpus", 0o666)
    elif change == "parent":
        os.chown(sim.cg / "htcondor", JOB_UID, JOB_UID)
    elif change == "no cpuset":
        (path / "cpuset.cpus").unlink()
    else:
        pid = sim.jobs["1.0"]["pid"]
        if change == "split":
            fake_proc(sim.proc, 7000, pid, "job", JOB_UID, 999, "/htcondor/other")
        else:
            (sim.proc / str(pid) / "cgroup").write_text("0::/\n" if change == "root" else f"0::{STARTER_CGROUP}\n")
    before = (path / "cpuset.cpus").read_text() if (path / "cpuset.cpus").exists() else None
    reply = sim.start("guest", 8, mate=mate["job"])
    assert reply["status"] == "refused" and reply["code"] == errors.EXIT_OVERSUBSCRIBED
    assert reply["message"].startswith("guest start of 2.0 on node1 (slot2_2) refused: mate 1.0's cgroup cannot be "
                                       "shrunk: ") and why in reply["message"], reply["message"]
    after = (path / "cpuset.cpus").read_text() if (path / "cpuset.cpus").exists() else None
    assert after == before                          # nothing was written
    if change in ("owned", "writable", "file", "parent"):
        sim.tick()
        assert (path / "cpuset.cpus").read_text() == before     # nor is it written later
        assert "job 1.0 (slot1_1): cpuset not set: cgroup /htcondor/slot1_1" in sim.log()


def test_a_guest_is_refused_when_the_mates_cpuset_write_fails_and_nothing_changes(sim: Sim, monkeypatch):
    mate = sim.start("node", 8)
    sim.tick()
    real = sim.agent.cgroups.write

    def failing(cgroup: str, cpus) -> None:
        raise OSError(30, "Read-only file system")

    sim.agent.cgroups.write = failing
    reply = sim.start("guest", 8, mate=mate["job"])
    assert reply["status"] == "refused" and "mate 1.0's cgroup /htcondor/slot1_1 was not shrunk to 0-3" in \
        reply["message"]
    assert "cpuset write failed: job 1.0 (slot1_1) /htcondor/slot1_1 cpuset.cpus 0-3: Read-only file system" in \
        sim.log()
    sim.agent.cgroups.write = real
    sim.tick()
    assert sim.cpuset_of(mate["job"]) == "0-7" and sim.published()["claims"] == [
        {"job": "1.0", "slot": "slot1_1", "kind": "node", "cpus": "0-7", "cpuset": "0-7", "mate": None,
         "cgroup": "/htcondor/slot1_1"}]
    assert sim.start("guest", 8, mate=mate["job"])["status"] == "ok"     # the next try works


def test_a_job_owned_guest_cgroup_is_never_written(sim: Sim):
    mate = sim.start("node", 8)
    sim.tick()
    guest = sim.start("guest", 8, mate=mate["job"], job_cgroup_mode=0o777)
    assert guest["status"] == "ok"
    sim.tick()
    assert sim.cpuset_of(guest["job"]) == "" and sim.cpuset_of(mate["job"]) == "0-3"
    assert "job 2.0 (slot2_2): cpuset not set: cgroup /htcondor/slot2_2 is job-owned or job-writable" in sim.log()


# --------------------------------------------------------------------------------------- the startd cron

def test_the_cron_advertises_node_sharing_and_lent_cpus(sim: Sim):
    mate = sim.start("node", 8)
    sim.start("guest", 8, mate=mate["job"])
    sim.tick()
    sim.end(mate["job"])
    sim.tick()
    out = io.StringIO()
    args = ["--node-config", str(sim.config_path), "--state-dir", str(sim.state)]
    assert cron.main(args, stdout=out, micinfo_text=None) == 0
    ad = ads.parse_classad(out.getvalue())
    assert ads.ad_get(ad, "CoSchedNodeSharing") is True and ads.ad_get(ad, "CoSchedLentCpus") == 4
    out = io.StringIO()                             # a dead agent sets no cpusets
    assert cron.main(args + ["--max-age", "-1"], stdout=out, micinfo_text=None) == 0
    assert ads.ad_get(ads.parse_classad(out.getvalue()), "CoSchedNodeSharing") is False


def test_nodes_without_a_node_slot_advertise_no_sharing(tmp_path: Path):
    _, cfg = write_config(tmp_path, {"node": "node1", "domain": "cosched.test", "cores": 4, "memory_mb": 1024,
                                     "slots": [{"slot_id": 1, "kind": "socket", "cores": 4, "memory_mb": 1024}]})
    lines = cron.facts(cfg, str(tmp_path), None, 180)
    assert not any(line.startswith(("CoSchedNodeSharing", "CoSchedLentCpus")) for line in lines)


# --------------------------------------------------------------------------------------- the hook

class Hook:
    """The PREPARE_JOB hook of a start on ``sim``: asks the agent as the hook's process."""

    def __init__(self, sim: Sim) -> None:
        self.sim = sim

    def run(self, kind: str, cpus: int, mate: str | None = None, ask=None, job_env: str = "") -> tuple[int, dict]:
        sim = self.sim
        n = sim.n = sim.n + 1
        job, slot = f"{n}.0", f"slot{1 if kind == 'node' else 2}_{n}"
        starter, hook = 1000 + n, 3000 + n
        fake_proc(sim.proc, starter, 1, "condor_starter", 0, 100 + n, STARTER_CGROUP)
        fake_proc(sim.proc, hook, starter, "python3", JOB_UID, 200 + n, STARTER_CGROUP)
        attrs = {"Cpus": cpus, "Memory": 512, "CoSchedMalleable": True}
        if mate:
            attrs["CoSchedPinMate"] = mate
        sim.view.ads.append(slot_ad(slot, job, starter, **attrs))
        machine = sim.tmp / f"machine{n}.ad"
        machine.write_text(f'Name = "{slot}@node1@node1.cosched.test"\n')
        job_ad = f"ClusterId = {n}\nProcId = 0\nRequestCpus = {cpus}\n{job_env}"
        out = io.StringIO()
        hook_args = ["--node-config", str(sim.config_path), "--state-dir", str(sim.state)]
        env = {"_CONDOR_MACHINE_AD": str(machine)}
        code = prepare_job.main(hook_args, stdin=io.BytesIO(job_ad.encode()), stdout=out, env=env,
                                ask=ask or (lambda state_dir: sim.agent.answer(hook, JOB_UID)))
        shutil.rmtree(sim.proc / str(hook))             # the hook exits
        if code == 0:     # the job runs in its cgroup
            cgroup = sim.cg / "htcondor" / slot
            cgroup.mkdir()
            (cgroup / "cpuset.cpus").write_text("")
            fake_proc(sim.proc, 5000 + n, starter, "job", JOB_UID, 300 + n, f"/htcondor/{slot}")
            sim.jobs[job] = {"starter": starter, "pid": 5000 + n, "slot": slot, "cgroup": f"/htcondor/{slot}"}
        return code, ads.parse_classad(out.getvalue(), "hook output")


def env_of(out: dict) -> dict:
    return dict(environment.parse_environment_v2(ads.ad_get(out, "Environment")))


def test_the_hook_exports_the_cpus_and_a_guests_thread_count(sim: Sim):
    hook = Hook(sim)
    code, out = hook.run("node", 6, job_env='Environment = "OMP_NUM_THREADS=6 MINE=1"')
    assert code == 0 and env_of(out) == {"OMP_NUM_THREADS": "6", "MINE": "1", "COSCHED_CPUS": "0-5"}
    assert ads.ad_get(out, "CoSchedCpus") == "0-5"
    sim.tick()
    code, out = hook.run("guest", 8, mate="1.0", job_env='Environment = "OMP_NUM_THREADS=8"')
    assert code == 0, out
    assert code == 0 and env_of(out) == {"OMP_NUM_THREADS": "3", "COSCHED_CPUS": "3-5"}
    sim.tick()
    assert sim.cpuset_of("1.0") == "0-2" and sim.cpuset_of("2.0") == "3-5"


def test_a_refused_guest_goes_back_to_idle_with_a_condor_sched_reason(sim: Sim):
    code, out = Hook(sim).run("guest", 8, mate="5.0")
    assert code == errors.EXIT_OVERSUBSCRIBED and ads.ad_get(out, "HookStatusCode") == 303
    assert ads.ad_get(out, "HookStatusMessage") == ("condor_sched: guest start of 1.0 on node1 (slot2_1) refused: "
                                                    "mate 5.0 is not a running node-slot claim of node1; back to "
                                                    "idle for a new plan")
    assert ads.ad_get(out, "Environment") is None


def test_an_unreachable_agent_starts_node_jobs_without_cpus_and_sends_guests_back(sim: Sim):
    def unreachable(state_dir: str) -> dict:
        raise errors.StateError(111, "node agent at x: Connection refused")

    assert Hook(sim).run("node", 2, ask=unreachable) == (0, {})
    code, out = Hook(sim).run("guest", 8, mate="1.0", ask=unreachable)
    assert code == errors.EXIT_NO_STATE and ads.ad_get(out, "HookStatusCode") == 305


def test_the_hook_refuses_a_malformed_cpu_list_from_the_agent(sim: Sim):
    code, out = Hook(sim).run("node", 2, ask=lambda d: {"status": "ok", "kind": "node", "cpus": "0-2;rm"})
    assert code == errors.EXIT_NO_STATE and "CPU list is malformed" in ads.ad_get(out, "HookStatusMessage")
    code, out = Hook(sim).run("guest", 8, ask=lambda d: {"status": "ok", "kind": "node", "cpus": "0"})
    assert code == errors.EXIT_NO_STATE and "in the guest slot" in ads.ad_get(out, "HookStatusMessage")


# --------------------------------------------------------------------------------------- the node config

def test_node_and_guest_slots_are_read():
    cfg = config.parse_node_config(node_config(8, 4096, 0.25))
    assert cfg.node_slot.kind == "node" and cfg.node_slot.cores == 8 and cfg.node_slot.memory_mb == 4096
    assert cfg.guest_slot.sharing_factor == 0.25 and cfg.guest_slot.slot_id == 2
    assert config.parse_node_config({**node_config(), "slots": node_config()["slots"][:1]}).guest_slot is None


@pytest.mark.parametrize("change, why", [
    ({"sharing_factor": 0}, "'sharing_factor' must be a number in (0, 1)"),
    ({"sharing_factor": 1}, "'sharing_factor' must be a number in (0, 1)"),
    ({"sharing_factor": 1.5}, "'sharing_factor' must be a number in (0, 1)"),
    ({"sharing_factor": True}, "'sharing_factor' must be a number in (0, 1)"),
    ({"sharing_factor": "0.5"}, "'sharing_factor' must be a number in (0, 1)"),
    ({"sharing_factor": float("nan")}, "'sharing_factor' must be a number in (0, 1)"),
    ({"sharing_factor": None}, "'sharing_factor' must be a number in (0, 1)"),
    ({"cores": 4}, "the guest slot's cores and memory_mb must equal the node slot's"),
    ({"memory_mb": 1}, "the guest slot's cores and memory_mb must equal the node slot's"),
])
def test_a_bad_guest_slot_is_a_config_error(change, why):
    raw = node_config()
    raw["slots"][1].update(change)
    with pytest.raises(errors.ConfigError, match=why.replace("(", r"\(").replace(")", r"\)")):
        config.parse_node_config(raw)


@pytest.mark.parametrize("slots, why", [
    ([{"slot_id": 2, "kind": "guest", "cores": 8, "memory_mb": 8192, "sharing_factor": 0.5}],
     "a guest slot needs a node slot"),
    ([{"slot_id": 1, "kind": "node", "cores": 8, "memory_mb": 1}, {"slot_id": 2, "kind": "node", "cores": 8,
                                                                    "memory_mb": 1}],
     "at most one node slot and one guest slot"),
    ([{"slot_id": 1, "kind": "node", "cores": 8, "memory_mb": 1}, {"slot_id": 2, "kind": "socket", "cores": 8,
                                                                    "memory_mb": 1}],
     "has no socket slots"),
    ([{"slot_id": 1, "kind": "node", "cores": 0, "memory_mb": 1}], "a node slot needs 'cores' >= 1"),
    ([{"slot_id": 1, "kind": "node", "cores": 9, "memory_mb": 1}], "more cores than the node"),
])
def test_a_bad_node_sharing_layout_is_a_config_error(slots, why):
    with pytest.raises(errors.ConfigError, match=why):
        config.parse_node_config({**node_config(), "slots": slots})


def test_cgroup_root_option_is_checked_and_used(tmp_path: Path):
    args = agent.parse_args(["--node-config", "x", "--startd-address-file", "/a", "--cgroup-root", "rel/ative"])
    with pytest.raises(errors.ConfigError, match="--cgroup-root"):
        agent.build(args, config.parse_node_config(node_config()), str(tmp_path), lambda m: None)
    args = agent.parse_args(["--node-config", "x", "--startd-address-file", "/a", "--probe", "file",
                             "--probe-dir", str(tmp_path), "--perf", "", "--cgroup-root", str(tmp_path / "cg")])
    built = agent.build(args, config.parse_node_config(node_config()), str(tmp_path), lambda m: None)
    assert built.cgroups is not None and built.cgroups.root == str(tmp_path / "cg")
    assert agent.parse_args(["--node-config", "x", "--startd-address-file", "/a"]).cgroup_root == "/sys/fs/cgroup"


def test_procs_table_of_the_fake_proc_sees_jobs(sim: Sim):
    sim.start("node", 2)
    table = procs.process_table(str(sim.proc))
    assert [p.pid for p in procs.job_processes(1001, 101, table)] == [5001]


# --------------------------------------------------------------------------------------- over the real socket

class LiveNode:
    """The agent's serve loop in a thread (real socket, real /proc, fake starters running the
    real hook program); only the cgroup lines of the jobs' /proc entries come from a fake dir."""

    def __init__(self, root: Path, starters, cgroup_root: Path) -> None:
        self.root, self.starters, self.cg = root, starters, cgroup_root
        self.config_path, self.config = write_config(root, node_config())
        self.state = root / "state"
        self.cgproc = root / "cgproc"
        self.cgproc.mkdir()
        self.view = FakeView(self.config)
        self.logs: list[str] = []
        self.agent = make_agent(self.config, self.state, self.view, self.logs, interval_s=0.2,
                                cgroups=cpusets.CgroupCpusets(str(cgroup_root), proc_root=str(self.cgproc)))
        self.server = None

    def serve(self) -> None:
        self.server = channel.listen(str(self.state))
        self.stopping: list[int] = []
        self.thread = threading.Thread(target=agent.serve, args=(self.agent, self.server, self.stopping, False),
                                       daemon=True)
        self.thread.start()

    def stop(self) -> None:
        if self.server is not None:
            self.stopping.append(signal.SIGTERM)
            self.thread.join(timeout=10)
            self.server.close()

    def in_cgroup(self, pid: int, cgroup: str) -> None:
        (self.cgproc / str(pid)).mkdir()
        (self.cgproc / str(pid) / "cgroup").write_text(f"0::{cgroup}\n")

    def hook(self, slot: str, cluster: int, **claim: object):
        n = cluster
        (self.root / f"job{n}.ad").write_text(f'ClusterId = {n}\nProcId = 0\nRequestCpus = 8\nOwner = "alice"\n')
        (self.root / f"machine{n}.ad").write_text(f'Name = "{slot}@node1@node1.cosched.test"\n')
        hook_args = ["--node-config", str(self.config_path), "--state-dir", str(self.state)]
        env = {"_CONDOR_MACHINE_AD": str(self.root / f"machine{n}.ad"), "PATH": "/usr/bin:/bin"}
        out, err = self.root / f"out{n}", self.root / f"err{n}"
        starter = self.starters.hook(HOOK_ARGV + hook_args, self.root / f"job{n}.ad", out, err, env)
        self.view.ads.append(slot_ad(slot, f"{n}.0", starter.pid, **claim))
        return starter, out, err


@pytest.fixture
def live(tmp_path: Path, request):
    starters = Starters()
    root = make_cgroup_root(tmp_path / "cgroup") if request.param == "usable" else tmp_path / "missing"
    node = LiveNode(tmp_path, starters, root)
    yield node
    node.stop()
    starters.close()


@pytest.mark.parametrize("live", ["usable"], indirect=True)
def test_a_guest_started_by_the_real_hook_gets_half_its_mates_cpus(live: LiveNode):
    if not IS_ROOT:
        pytest.skip("the mate's job must run as another user than its starter (root only)")
    mate = live.starters.job()
    (live.cg / "htcondor" / "slot1_1").mkdir()
    (live.cg / "htcondor" / "slot1_1" / "cpuset.cpus").write_text("")
    live.in_cgroup(mate.child, "/htcondor/slot1_1")
    live.view.ads.append(slot_ad("slot1_1", "1.0", mate.pid, Cpus=8, Memory=1024, CoSchedMalleable=True))
    live.serve()
    mate_file = live.cg / "htcondor" / "slot1_1" / "cpuset.cpus"
    wait_for(lambda: mate_file.read_text().strip() == "0-7", "the mate's cpuset")
    starter, out, err = live.hook("slot2_2", 2, Cpus=8, Memory=1024, CoSchedMalleable=True, CoSchedPinMate="1.0")
    assert go(starter) == "0", err.read_text()
    printed = ads.parse_classad(out.read_text())
    assert dict(environment.parse_environment_v2(ads.ad_get(printed, "Environment"))) == \
        {"OMP_NUM_THREADS": "4", "COSCHED_CPUS": "4-7"}
    assert mate_file.read_text().strip() == "0-3"             # the mate gave the guest its upper half


@pytest.mark.parametrize("live", ["missing"], indirect=True)
def test_the_real_hook_sends_a_guest_back_to_idle_where_cgroups_are_unusable(live: LiveNode):
    live.serve()
    starter, out, err = live.hook("slot2_2", 2, Cpus=8, Memory=1024, CoSchedMalleable=True, CoSchedPinMate="1.0")
    assert go(starter) == str(errors.EXIT_OVERSUBSCRIBED), err.read_text()
    printed = ads.parse_classad(out.read_text())
    assert ads.ad_get(printed, "HookStatusCode") == 303
    assert ads.ad_get(printed, "HookStatusMessage").startswith(
        "condor_sched: guest start of 2.0 on node1 (slot2_2) refused: cpusets unusable on node1: cgroup root ")
    assert err.read_text() == ""
