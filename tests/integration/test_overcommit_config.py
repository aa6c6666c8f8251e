"""An overcommitting node's configuration as docs/admin.md gives it, read by the pool's own
HTCondor (the wheel's version): its startd counts each core M times, advertises
``CoSchedMultiplicity`` through ``20-cosched-startd.conf``, and the slot ad the sidecar reads
from that configuration is an overcommitting slot of M x the cores."""
from __future__ import annotations

from pathlib import Path

import classad2
import pytest
from stock_pool import code_blocks

from condor_sched.classads.slots import slot_from_ad
from condor_sched.localpool import chroot
from condor_sched.model import SlotKind

pytestmark = pytest.mark.pool

REPO = Path(__file__).resolve().parents[2]


def documented_block() -> str:
    (block,) = [b for b in code_blocks((REPO / "docs" / "admin.md").read_text())
                if b.section == "Overcommitting nodes (paper 004)"]
    return block.text


def test_the_documented_node_config_counts_each_core_m_times(pool):
    root = pool.info.root
    config = root / "tmp" / "cosched-overcommit-node.conf"
    config.write_text("LOCAL_DIR = /tmp\n" + (REPO / "config.d" / "20-cosched-startd.conf").read_text()
                      + documented_block())
    try:
        out = chroot.in_chroot(root, ["env", "CONDOR_CONFIG=/tmp/cosched-overcommit-node.conf", "condor_config_val",
                                      "DETECTED_CPUS", "NUM_CPUS", "CoSchedMultiplicity", "STARTD_ATTRS"]).stdout
    finally:
        config.unlink()
    detected, num_cpus, multiplicity, startd_attrs = out.splitlines()
    assert int(multiplicity) == 2 and int(num_cpus) == 2 * int(detected)
    assert "CoSchedMultiplicity" in startd_attrs.split()
    ad = classad2.ClassAd({"Name": "slot1@node8.test", "Machine": "node8.test", "PartitionableSlot": True,
                           "TotalSlotCpus": int(num_cpus), "Cpus": int(num_cpus), "TotalSlotMemory": 4096,
                           "Memory": 4096, "CoSchedMultiplicity": int(multiplicity)})
    slot = slot_from_ad(ad)
    assert slot.kind is SlotKind.OVERCOMMIT and slot.total.cpus // slot.multiplicity == int(detected)
