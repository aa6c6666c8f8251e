"""The real pool: slot layout, placement by name, device requests, and the pin protocol."""
from __future__ import annotations

import time

import pytest

from condor_sched.model import partitionable_slot_of

from condor_sched.inventory import default_inventory_path, load_inventory, node_slots

pytestmark = pytest.mark.pool

RUNNING, COMPLETED = 2, 4
IDLE = 1



EXIT_ATTRS = ["LastRemoteHost", "ExitCode", "ExitBySignal"]


def finished(ad: dict) -> bool:
    """Completed, with where it ran and how it exited (the exit code can reach the ad after
    JobStatus does: seen once under load)."""
    return ad["JobStatus"] == COMPLETED and "LastRemoteHost" in ad and ("ExitCode" in ad or bool(ad.get("ExitBySignal")))


def test_collector_shows_exactly_the_inventory_slot_layout(pool):
    import htcondor2

    # Partitionable slots only: dynamic slots of an earlier test's removed jobs may still vacate.
    ads = htcondor2.Collector().query(htcondor2.AdTypes.Startd, "PartitionableSlot =?= true", projection=[
        "Name", "TotalSlotCpus", "TotalSlotMemory", "TotalSlotPhiMemory", "TotalSlotPhiThreads",
        "TotalSlotLLCWays", "TotalSlotMemBW", "PhiDeviceName", "LLCCacheId"])
    seen = {ad["Name"]: ad for ad in ads}
    expected = [s for n in load_inventory(default_inventory_path()).nodes for s in node_slots(n, pool.domain)]
    assert sorted(seen) == sorted(s.name for s in expected)
    for slot in expected:
        ad = seen[slot.name]
        assert (ad["TotalSlotCpus"], ad["TotalSlotMemory"]) == (slot.total.cpus, slot.total.memory_mb)
        assert ad["TotalSlotPhiMemory"] == slot.total.device_memory_mb
        assert ad["TotalSlotPhiThreads"] == slot.total.device_threads
        assert ad["TotalSlotLLCWays"] == slot.total.llc_ways
        assert ad["TotalSlotMemBW"] == int(slot.total.mem_bw_gbs)
        assert ad.get("PhiDeviceName") == slot.device_name
        assert ad.get("LLCCacheId") == slot.cache_id


def test_job_runs_to_completion_on_the_node_chosen_by_name(pool):
    cluster = pool.submit(requirements=f'TARGET.Machine == "node3.{pool.domain}"')
    ad = pool.wait_for(cluster, finished, EXIT_ATTRS)
    assert (ad.get("ExitCode"), ad.get("ExitBySignal", False)) == (0, False), ad
    assert ad["LastRemoteHost"].endswith(f"@node3@node3.{pool.domain}")
    assert ad["LastRemoteHost"].startswith(("slot1", "slot2"))  # a socket slot, not a device


def test_pin_protocol_and_device_requests_on_the_real_negotiator(pool):
    from htcondor2 import HTCondorException

    dev = {"request_PhiMemory": "500", "request_PhiThreads": "60"}
    # Submitted with a pin of its own, which the transform must discard.
    pinned = pool.submit(**dev, **{"+CoSchedPinSlot": f'"{pool.slot(3, "node1")}"', "+CoSchedPinCycle": "7",
                                   "+CoSchedPinExclusive": "0"})
    ad = pool.job(pinned, ["Requirements", "CoSchedPinSlot", "CoSchedPinCycle", "CoSchedPinExclusive",
                           "CoSchedPinOriginalRequirements"])
    from classad2 import Value

    for attr in ("CoSchedPinSlot", "CoSchedPinCycle", "CoSchedPinExclusive"):
        assert ad.get(attr, Value.Undefined) is Value.Undefined, attr
    assert str(ad["Requirements"]).endswith("&& (TARGET.Name is MY.CoSchedPinSlot)")
    assert str(ad["Requirements"]).startswith(f"({ad['CoSchedPinOriginalRequirements']})")
    assert "PhiMemory >= RequestPhiMemory" in str(ad["CoSchedPinOriginalRequirements"])

    # The owner may not set the pin; the super user may.
    with pytest.raises(HTCondorException, match="protected attribute"):
        pool.schedd().edit(f"{pinned}.0", "CoSchedPinSlot", f'"{pool.slot(2, "node1")}"')

    # Jobs that must never start: the same pin without a super-user edit, a device job
    # pinned to a socket slot, a non-device job aimed at a device slot, and a device job
    # asking for more device memory than any device has.
    on_socket = pool.submit(**dev)
    pool.admin_edit(f"{on_socket}.0", "CoSchedPinSlot", f'"{pool.slot(1, "node1")}"')
    plain_on_device = pool.submit(requirements=f'TARGET.Name == "{pool.slot(2, "node2")}"')
    too_big = pool.submit(request_PhiMemory="99999", request_PhiThreads="60")
    pool.admin_edit(f"{too_big}.0", "CoSchedPinSlot", f'"{pool.slot(4, "node3")}"')
    fits_big_device = pool.submit(request_PhiMemory="12000", request_PhiThreads="60")
    pool.admin_edit(f"{fits_big_device}.0", "CoSchedPinSlot", f'"{pool.slot(4, "node3")}"')

    time.sleep(10)  # several negotiation cycles (NEGOTIATOR_INTERVAL = 2)
    for never in (pinned, on_socket, plain_on_device, too_big):
        ad = pool.job(never, ["RemoteHost", "NumJobStarts"])
        assert ad["JobStatus"] == IDLE and ad.get("NumJobStarts", 0) == 0, (never, ad)

    assert pool.admin_edit(f"{pinned}.0", "CoSchedPinSlot", f'"{pool.slot(2, "node1")}"') == 1
    for cluster, slot in ((pinned, pool.slot(2, "node1")), (fits_big_device, pool.slot(4, "node3"))):
        ad = pool.wait_for(cluster, finished, EXIT_ATTRS)
        assert (partitionable_slot_of(ad["LastRemoteHost"]), ad.get("ExitCode"), ad.get("ExitBySignal", False)) \
            == (slot, 0, False), ad

    from htcondor2 import JobAction

    for cluster in (on_socket, plain_on_device, too_big):
        pool.schedd().act(JobAction.Remove, f"ClusterId == {cluster}")


def test_an_exclusive_pin_starts_only_when_its_device_is_idle(pool):
    dev = {"request_PhiMemory": "500", "request_PhiThreads": "60"}
    device = pool.slot(3, "node4")
    first = pool.submit(**dev, arguments="600")  # removed below, once the checks are done
    pool.admin_edit(f"{first}.0", "CoSchedPinSlot", f'"{device}"')
    remote = pool.wait_for(first, lambda a: a["JobStatus"] == RUNNING and "RemoteHost" in a, ["RemoteHost"])
    # The sidecar's model of the slot comes to list the job's dynamic slot (ChildName).
    assert_slot_lists(device, remote["RemoteHost"], timeout_s=15)
    # The device has room for both: a shared pin starts beside the first job, an exclusive
    # one (CoSchedPinExclusive = 1) is refused by START until the device is idle again.
    exclusive, shared = pool.submit(**dev), pool.submit(**dev)
    pool.admin_edit(f"{exclusive}.0", "CoSchedPinExclusive", "1")
    for cluster in (exclusive, shared):
        pool.admin_edit(f"{cluster}.0", "CoSchedPinSlot", f'"{device}"')
    attrs = ["LastRemoteHost", "JobCurrentStartDate", "CompletionDate", "NumJobStarts"]
    beside = pool.wait_for(shared, lambda a: a["JobStatus"] == COMPLETED and "LastRemoteHost" in a, attrs)
    assert partitionable_slot_of(beside["LastRemoteHost"]) == device
    time.sleep(6)  # more negotiation cycles while the first job still runs
    assert pool.job(first, [])["JobStatus"] == RUNNING
    waiting = pool.job(exclusive, ["NumJobStarts"])
    assert waiting["JobStatus"] == IDLE and waiting.get("NumJobStarts", 0) == 0, waiting
    from htcondor2 import JobAction

    removed_at = int(time.time())
    pool.schedd().act(JobAction.Remove, f"ClusterId == {first}")
    alone = pool.wait_for(exclusive, lambda a: a["JobStatus"] == COMPLETED and "LastRemoteHost" in a, attrs, timeout_s=90)
    assert partitionable_slot_of(alone["LastRemoteHost"]) == device
    assert alone["JobCurrentStartDate"] >= removed_at, (alone, removed_at)


def assert_slot_lists(slot_name: str, child: str, timeout_s: float) -> None:
    """The live model's record of ``slot_name`` lists ``child`` within ``timeout_s``."""
    from condor_sched.pool import read_state

    deadline = time.monotonic() + timeout_s
    children = None
    while time.monotonic() < deadline:
        children = {s.name: s.children for s in read_state().slots}.get(slot_name)
        if children is not None and child in children:
            return
        time.sleep(0.5)
    raise AssertionError(f"{slot_name} lists {children}, not {child}")
