"""An overcommitting node configured as docs/admin.md gives it: the overrides block read by the
node's describe program, its node config rendered by discovery, and the result read by the
pool's own HTCondor (the wheel's version) together with ``20-cosched-startd.conf``: the startd
counts each core M times, advertises ``CoSchedMultiplicity``, and the slot ad the sidecar reads
from it is an overcommitting slot of M x the cores."""
from __future__ import annotations

import configparser
from pathlib import Path

import classad2
import pytest
from cosched_node import describe, discover, hardware
from stock_pool import code_blocks

from condor_sched.classads.slots import slot_from_ad
from condor_sched.localpool import chroot
from condor_sched.model import SlotKind

pytestmark = pytest.mark.pool

REPO = Path(__file__).resolve().parents[2]


def documented_overrides() -> dict[str, str]:
    (block,) = [b for b in code_blocks((REPO / "docs" / "admin.md").read_text())
                if b.section == "Overcommitting nodes (paper 004)" and b.language == "ini"]
    parser = configparser.ConfigParser(interpolation=None)
    parser.read_string(block.text)
    return dict(parser["node"])


def test_the_documented_overrides_count_each_core_m_times(pool):
    hw = hardware.Hardware(cores=4, memory_mb=8192, sockets=(hardware.SocketInfo(0, 4, 0),), llc_ways=11)
    built = describe.build_config(hw, describe.parse_overrides(documented_overrides(), ini=True),
                                  "node7.cluster.example.org", lambda m: None)
    root = pool.info.root
    config = root / "tmp" / "cosched-overcommit-node.conf"
    config.write_text("LOCAL_DIR = /tmp\n" + (REPO / "config.d" / "20-cosched-startd.conf").read_text()
                      + discover.render_slots(discover.parse_node_config(built)))
    try:
        out = chroot.in_chroot(root, ["env", "CONDOR_CONFIG=/tmp/cosched-overcommit-node.conf", "condor_config_val",
                                      "NUM_CPUS", "SLOT_TYPE_1", "SLOT1_CoSchedMultiplicity", "STARTD_ATTRS"]).stdout
    finally:
        config.unlink()
    num_cpus, slot_type, multiplicity, startd_attrs = out.splitlines()
    assert int(multiplicity) == 2 and int(num_cpus) == 2 * hw.cores
    assert slot_type.startswith(f"cpus={2 * hw.cores},")
    assert "CoSchedMultiplicity" in startd_attrs.split()
    ad = classad2.ClassAd({"Name": "slot1@node7.test", "Machine": "node7.test", "PartitionableSlot": True,
                           "TotalSlotCpus": int(num_cpus), "Cpus": int(num_cpus), "TotalSlotMemory": 4096,
                           "Memory": 4096, "CoSchedMultiplicity": int(multiplicity)})
    slot = slot_from_ad(ad)
    assert slot.kind is SlotKind.OVERCOMMIT and slot.total.cpus // slot.multiplicity == hw.cores
