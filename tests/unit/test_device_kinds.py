"""Devices as data: a second device kind is one record, and it runs through the ClassAd
readers, the planners (through the one cycle), the simulator and the PREPARE_JOB hook
without a change to any of them."""
from __future__ import annotations

import io
import json
import os
from pathlib import Path

import classad2
import pytest
from cosched_node import ads, environment, errors, prepare_job
from cosched_node.config import load_node_config
from test_node_harness import FakeView, Starters, make_agent, slot_ad

from condor_sched.classads import job_from_ad, slot_from_ad
from condor_sched.cycle import CycleConfig, CycleMemory, decide_cycle
from condor_sched.device_kinds import DeviceKind, DeviceKindError, register_device_kind, unregister_device_kind
from condor_sched.inventory import Device, Inventory, Node, Socket, node_config, node_slots
from condor_sched.model import JobStatus, PoolState, SlotKind
from condor_sched.modes.registry import get_policy
from condor_sched.simulate.engine import simulate
from condor_sched.simulate.workloads import SimJob

DUMMY = DeviceKind(name="dummy", memory_attr="DummyMemory", compute_attr="DummyUnits",
                   device_name_attr="DummyDeviceName", compute_unit="units", compute_per_core=2,
                   environment=(("DUMMY_UNITS", "{compute}"), ("DUMMY_CORES", "{core_list}"),
                                ("DUMMY_INDEX", "{device_index}")))


@pytest.fixture
def dummy():
    register_device_kind(DUMMY)
    yield DUMMY
    unregister_device_kind(DUMMY.name)


def mixed_node(name: str) -> Node:
    """One socket, a Xeon Phi and a dummy device of 4000 MB and 100 units."""
    return Node(name, 24, 16384, (Socket(0, 11, 50.0),),
                (Device("mic0", 8192, 240), Device("dum0", 4000, 100, kind="dummy")))


def test_a_kind_with_a_clashing_or_bad_record_is_refused(dummy):
    with pytest.raises(DeviceKindError, match="reuses"):
        register_device_kind(DeviceKind("other", "DummyMemory", "OtherUnits", "OtherName", "units"))
    with pytest.raises(DeviceKindError, match="fields"):
        DeviceKind("bad", "BadMemory", "BadUnits", "BadName", "units", environment=(("X", "{secret}"),))
    with pytest.raises(DeviceKindError, match="sets X more than once"):
        DeviceKind("bad", "BadMemory", "BadUnits", "BadName", "units", environment=(("X", "1"), ("X", "{compute}")))


def test_classads_read_a_dummy_slot_and_job_by_their_record(dummy):
    slot_ad = classad2.ClassAd({"Name": "slot3@n1@n1.test", "Machine": "n1.test", "PartitionableSlot": True,
                                "Cpus": 4, "TotalSlotCpus": 4, "Memory": 1024, "TotalSlotMemory": 1024,
                                "DummyMemory": 1000, "TotalSlotDummyMemory": 4000, "DummyUnits": 40,
                                "TotalSlotDummyUnits": 100, "DummyDeviceName": "dum0"})
    slot = slot_from_ad(slot_ad)
    assert (slot.kind, slot.device_kind, slot.device_name) == (SlotKind.DEVICE, "dummy", "dum0")
    assert (slot.total.device_memory_mb, slot.free.device_threads) == (4000, 40)
    job_ad = classad2.ClassAd({"ClusterId": 1, "ProcId": 0, "JobStatus": 1, "RequestCpus": 1, "RequestMemory": 64,
                               "RequestDummyMemory": 1500, "RequestDummyUnits": 30})
    job = job_from_ad(job_ad, "s")
    assert (job.device_kind, job.request.device_memory_mb, job.request.device_threads) == ("dummy", 1500, 30)
    job_ad["RequestPhiMemory"] = 100  # one job, one device
    with pytest.raises(ValueError, match="one device"):
        job_from_ad(job_ad, "s")


def test_the_cycle_places_each_job_only_on_devices_of_its_kind(dummy):
    from condor_sched.model import Job, JobKey, Resources

    slots = tuple(node_slots(mixed_node("n1"), "test"))
    jobs = tuple(Job(JobKey("s", 1, p), "u", JobStatus.IDLE,
                     Resources(cpus=1, memory_mb=64, device_memory_mb=1000, device_threads=20), has_pin_clause=True,
                     device_kind="dummy" if p % 2 else "phi") for p in range(8))
    kinds = {s.name: s.device_kind for s in slots}
    for policy in ("knapsack", "global", "random", "exclusive"):
        decision = decide_cycle(PoolState(jobs, slots), CycleMemory(1), CycleConfig(get_policy(policy), None))
        by_job = {j.key: j.device_kind for j in jobs}
        assert decision.pins and all(kinds[p.slot] == by_job[p.job] for p in decision.pins)


def test_the_simulator_runs_dummy_jobs_on_dummy_devices(dummy):
    inventory = Inventory((mixed_node("n1"), mixed_node("n2")))
    jobs = [SimJob(i, "t", 1000, 20 if i % 2 else 60, 10.0, device_kind="dummy" if i % 2 else "phi")
            for i in range(12)]
    result = simulate(jobs, inventory, get_policy("knapsack"), cycle_s=5.0)
    kinds = {s.name: s.device_kind for n in inventory.nodes for s in node_slots(n, "sim")}
    assert all(r.end_s is not None and kinds[r.slot] == r.job.device_kind for r in result.jobs)
    assert result.memory_oversubscriptions == 0


def test_the_node_agent_and_hook_enforce_a_dummy_device_from_its_record_in_the_node_config(dummy, tmp_path):
    config = tmp_path / "n1.json"
    config.write_text(json.dumps(node_config(mixed_node("n1"), "test")))
    view = FakeView(load_node_config(str(config)))
    logs: list = []
    node_agent = make_agent(view.config, tmp_path / "state", view, logs)
    starters = Starters()

    def prepare(proc: int, units: int, memory_mb: int) -> tuple[int, dict]:
        # the startd's claim of slot 3 (dum0) allocates the job's DummyUnits and DummyMemory
        starter = starters.job()
        view.ads.append(slot_ad(f"slot3_{proc + 1}", f"5.{proc}", starter.pid, host="n1", domain="test",
                                DummyDeviceName="dum0", DummyUnits=units, DummyMemory=memory_mb))
        machine_ad = tmp_path / f"machine{proc}.ad"
        machine_ad.write_text(f'Name = "slot3_{proc + 1}@n1@n1.test"\nDummyDeviceName = "dum0"\n')
        job_ad = (f'ClusterId = 5\nProcId = {proc}\nOwner = "alice"\nRequestDummyUnits = {units}\n'
                  f"RequestDummyMemory = {memory_mb}\n")
        out = io.StringIO()
        hook_args = ["--node-config", str(config), "--state-dir", str(tmp_path / "state")]
        env = {"_CONDOR_MACHINE_AD": str(machine_ad)}
        code = prepare_job.main(hook_args, stdin=io.BytesIO(job_ad.encode()), stdout=out, env=env,
                                ask=lambda state_dir: node_agent.answer(starter.child, os.getuid()))
        return code, ads.parse_classad(out.getvalue(), "hook output")

    try:
        code, out = prepare(0, 30, 1500)
        env = dict(environment.parse_environment_v2(ads.ad_get(out, "Environment")))
        # 30 units at 2 a core: cores 0-14 of the device's 50; no Xeon Phi variable set.
        assert code == errors.EXIT_OK and env == {"DUMMY_UNITS": "30", "DUMMY_CORES": "0-14", "DUMMY_INDEX": "0"}
        code, out = prepare(1, 60, 1500)
        assert code == errors.EXIT_OK
        assert dict(environment.parse_environment_v2(ads.ad_get(out, "Environment")))["DUMMY_CORES"] == "15-44"
        # claims of 30 + 60 + 20 units > 100: refused.
        code, out = prepare(2, 20, 100)
        assert code == errors.EXIT_OVERSUBSCRIBED
        assert "device DummyUnits 90+20 > 100 on dum0" in ads.ad_get(out, "HookStatusMessage")
        log = "\n".join(logs)
        assert "device dummy" not in log and "n1/dum0" in log
    finally:
        starters.close()


def test_only_the_device_kind_records_name_the_xeon_phi_attributes():
    import re

    import condor_sched

    package = Path(condor_sched.__file__).parent
    modules = [p for p in package.rglob("*.py") if "data" not in p.relative_to(package).parts]
    offenders = [str(p.relative_to(package)) for p in modules
                 if p.name != "device_kinds.py" and re.search(r"Phi(Memory|Threads)", p.read_text())]
    assert len(modules) > 30 and offenders == []
