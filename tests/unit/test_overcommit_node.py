"""Paper 004's overcommitting node on the execute side: the admin's ``multiplicity`` override,
the node config that carries it, the slot configuration discovery renders from it (each core
counted M times, ``CoSchedMultiplicity``), and the inventory's same node for the local pool and
the planners."""
from __future__ import annotations

from pathlib import Path

import classad2
import pytest
from cosched_node import config, describe, discover, errors, hardware
from test_describe_node import FQDN, fake_node, run, written

from condor_sched import inventory
from condor_sched.classads.slots import slot_from_ad
from condor_sched.inventory import InventoryError, Node, Socket, parse_inventory
from condor_sched.model import SlotKind


def overcommitting(cores: int = 2, multiplicity: int = 2) -> dict:
    return {"node": "node8", "domain": "cosched.test", "cores": cores, "memory_mb": 4096, "multiplicity": multiplicity,
            "slots": [{"slot_id": 1, "kind": "socket", "cache_id": 0, "cores": cores, "memory_mb": 4096,
                       "llc_ways": 11, "mem_bw_gbs": 20.0}]}


def test_the_multiplicity_override_writes_what_the_inventory_would_write(tmp_path: Path):
    fake_node(tmp_path / "root")
    assert run(tmp_path, "--output", str(tmp_path / "etc/node.json"),
               overrides={"mem_bw_gbs": [60, 55.5], "multiplicity": 2}) == 0
    expected = inventory.node_config(Node("node7", 8, 65536, (Socket(0, 20, 60.0), Socket(1, 20, 55.5)),
                                          multiplicity=2), "cluster.example.org")
    assert written(tmp_path) == expected and expected["multiplicity"] == 2
    assert describe.parse_overrides({"multiplicity": "3"}, ini=True).multiplicity == 3


def test_multiplicity_is_refused_past_4_and_beside_every_other_role(tmp_path: Path):
    with pytest.raises(describe.DescribeError, match="'multiplicity' must be a whole number from 1 to 4, got 5"):
        describe.parse_overrides({"multiplicity": 5})
    hw = hardware.probe_hardware(str(fake_node(tmp_path / "root")), "none", None, "none", lambda m: None)
    for overrides, why in (({"role": "node-sharing"}, "not a node-sharing node"),
                           ({"spare_capacity": True}, "not one with spare_capacity")):
        with pytest.raises(describe.DescribeError, match=f"'multiplicity' above 1 is for socket nodes.*{why}"):
            describe.build_config(hw, describe.parse_overrides({**overrides, "multiplicity": 2}), FQDN, lambda m: None)


def test_the_node_config_reads_multiplicity_and_refuses_it_beside_other_slots():
    assert config.parse_node_config(overcommitting()).multiplicity == 2
    assert config.parse_node_config({**overcommitting(), "multiplicity": 1}).multiplicity == 1
    for value in (0, 5, True, 2.0, "2"):
        with pytest.raises(errors.ConfigError, match="'multiplicity' must be an integer from 1 to 4"):
            config.parse_node_config({**overcommitting(), "multiplicity": value})
    with_spare = overcommitting()
    with_spare["slots"] = with_spare["slots"] + [{"slot_id": 2, "kind": "spare", "cores": 2, "memory_mb": 4096}]
    with pytest.raises(errors.ConfigError, match="socket slots only"):
        config.parse_node_config(with_spare)
    with pytest.raises(discover.BadInput, match="socket slots only"):
        discover.parse_node_config(with_spare)
    with pytest.raises(discover.BadInput, match="'multiplicity' must be 1 to 4"):
        discover.parse_node_config({**overcommitting(), "multiplicity": 5})


def test_discovery_counts_each_core_m_times_and_the_sidecar_reads_an_overcommitting_slot():
    text = discover.render_slots(discover.parse_node_config(overcommitting(2, 3)))
    lines = dict(line.split(" = ", 1) for line in text.splitlines() if " = " in line)
    assert lines["NUM_CPUS"] == "6" and lines["SLOT_TYPE_1"].startswith("cpus=6, memory=4096")
    assert lines["SLOT1_CoSchedMultiplicity"] == "3" and lines["SLOT1_LLCCacheId"] == "0"
    plain = dict(line.split(" = ", 1) for line in discover.render_slots(
        discover.parse_node_config({**overcommitting(), "multiplicity": 1})).splitlines() if " = " in line)
    assert plain["NUM_CPUS"] == "2" and "SLOT1_CoSchedMultiplicity" not in plain
    ad = classad2.ClassAd({"Name": "slot1@node8.test", "Machine": "node8.test", "PartitionableSlot": True,
                           "TotalSlotCpus": 6, "Cpus": 6, "TotalSlotMemory": 4096, "Memory": 4096,
                           "LLCCacheId": 0, "CoSchedMultiplicity": int(lines["SLOT1_CoSchedMultiplicity"])})
    slot = slot_from_ad(ad)
    assert slot.kind is SlotKind.OVERCOMMIT and slot.multiplicity == 3 and slot.total.cpus == 6


def test_the_inventory_gives_an_overcommitting_node_m_times_its_cores_and_nothing_else():
    node = inventory.load_inventory(inventory.default_inventory_path()).node("node8")
    (slot,) = inventory.node_slots(node, "cosched.test")
    assert slot.kind is SlotKind.OVERCOMMIT and slot.multiplicity == 2 and slot.total.cpus == 2 * node.cores
    assert inventory.node_config(node, "cosched.test")["multiplicity"] == 2
    base = {"name": "n1", "cores": 2, "memory_mb": 4096, "sockets": [{"llc_ways": 11, "mem_bw_gbs": 20.0}]}
    for extra, why in (({"multiplicity": 5}, "'multiplicity' must be 1 to 4"),
                       ({"multiplicity": 2, "spare_capacity": True}, "socket slots only"),
                       ({"multiplicity": 2, "node_sharing": True}, "socket slots only")):
        with pytest.raises(InventoryError, match=why):
            parse_inventory({"nodes": [{**base, **extra}]})
    gpu = {"name": "g1", "cores": 8, "memory_mb": 8192, "multiplicity": 2,
           "gpus": [{"name": "gpu0", "uuid": "GPU-5f1c0d1e-7a2b-4c3d-8e9f-0a1b2c3d4e50", "model": "Tesla T4",
                     "memory_mb": 15360, "capability": 7.5}]}
    with pytest.raises(InventoryError, match="has no 'multiplicity'"):
        parse_inventory({"nodes": [gpu]})
