"""Pure parts of the local pool: config rendering, apt sources, and device discovery."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from cosched_node import discover

from condor_sched import localpool
from condor_sched.model import SlotKind
from condor_sched.inventory import default_inventory_path, load_inventory, node_config, node_slots
from condor_sched.localpool import chroot, config

INVENTORY = load_inventory(default_inventory_path())

MICINFO = """MicInfo Utility Log
Created Mon Jan 12 13:21:02 2015

\tSystem Info
\t\tHOST OS\t\t\t: Linux
\t\tHost Physical Memory\t: 65863 MB

Device No: 0, Device Name: mic0

\tCores
\t\tTotal No of Active Cores : 61
\t\tVoltage \t\t : 1014000 uV
\tGDDR
\t\tGDDR Vendor\t\t : Samsung
\t\tGDDR Density\t\t : 4096 Mb
\t\tGDDR Size\t\t : 15872 MB
\t\tGDDR Speed\t\t : 5.500000 GT/s

Device No: 1, Device Name: mic1

\tCores
\t\tTotal No of Active Cores : 57
\tGDDR
\t\tGDDR Size\t\t : 8 GB
"""


def _config_lines(text: str) -> dict[str, str]:
    return dict(line.split(" = ", 1) for line in text.splitlines() if " = " in line and not line.startswith("#"))


def _slot_types(lines: dict[str, str], prefix: str) -> list[dict[str, str]]:
    types = []
    for i in range(1, 100):
        spec = lines.get(f"{prefix}.SLOT_TYPE_{i}")
        if spec is None:
            break
        types.append(dict(part.strip().split("=") for part in spec.split(",")))
    return types


@pytest.mark.parametrize("node", INVENTORY.nodes, ids=lambda n: n.name)
def test_discovered_slot_types_match_the_inventory_layout(node):
    data = discover.parse_node_config(json.loads(json.dumps(node_config(node, config.DOMAIN))))
    lines = _config_lines(discover.render_slots(data, "NODE7"))
    types = _slot_types(lines, "NODE7")
    slots = node_slots(node, config.DOMAIN)
    assert len(types) == len(slots)
    for i, (t, slot) in enumerate(zip(types, slots), 1):
        assert int(t["cpus"]) == slot.total.cpus and int(t["memory"]) == slot.total.memory_mb
        assert int(t.get("PhiMemory", 0)) == slot.total.device_memory_mb  # a node without devices names no kind
        assert int(t.get("PhiThreads", 0)) == slot.total.device_threads
        assert int(t["LLCWays"]) == slot.total.llc_ways
        assert int(t["MemBW"]) == int(slot.total.mem_bw_gbs)
        for gpu in slot.gpus:  # a GPU node's one slot: every GPU's memory and compute, as node_slots says
            assert int(t[f"CoSchedGPU{gpu.index}Memory"]) == gpu.memory_mb
            assert int(t[f"CoSchedGPU{gpu.index}Compute"]) == gpu.compute
        assert int(t.get("GPUs", 0)) == len(slot.gpus)
        assert lines[f"NODE7.SLOT_TYPE_{i}_PARTITIONABLE"] == "True"
        assert lines[f"NODE7.NUM_SLOTS_TYPE_{i}"] == "1"
        if slot.device_name:
            assert lines[f"NODE7.SLOT{i}_PhiDeviceName"] == f'"{slot.device_name}"'
        elif slot.kind is SlotKind.NODE:
            assert lines[f"NODE7.SLOT{i}_CoSchedNodeSlot"] == "True"
        elif slot.kind is SlotKind.GUEST:
            assert lines[f"NODE7.SLOT{i}_CoSchedGuestSlot"] == "True"
        elif slot.kind is SlotKind.SPARE:
            assert lines[f"NODE7.SLOT{i}_CoSchedSpareSlot"] == "True"
        elif slot.kind is SlotKind.GPU_NODE:
            assert lines[f"NODE7.SLOT{i}_CoSchedGPUNode"] == "True"
            assert lines[f"NODE7.SLOT{i}_CoSchedGPUCount"] == str(len(slot.gpus))
            assert [lines[f"NODE7.SLOT{i}_CoSchedGPU{g.index}Uuid"] for g in slot.gpus] == [f'"{g.uuid}"' for g in slot.gpus]
        else:
            assert lines[f"NODE7.SLOT{i}_LLCCacheId"] == str(slot.cache_id)
            if slot.kind is SlotKind.OVERCOMMIT:
                assert lines[f"NODE7.SLOT{i}_CoSchedMultiplicity"] == str(slot.multiplicity)
    # a guest slot overlaps its node slot, a spare slot the socket slots: the machine counts
    # their cores and memory twice; an overcommitting node counts each core M times
    guest = [s.total for s in slots if s.kind in (SlotKind.GUEST, SlotKind.SPARE)]
    assert int(lines["NODE7.NUM_CPUS"]) == node.multiplicity * node.cores + sum(g.cpus for g in guest)
    assert int(lines["NODE7.MEMORY"]) == node.memory_mb + sum(g.memory_mb for g in guest)
    for resource in ("PhiMemory", "PhiThreads", "LLCWays", "MemBW"):
        assert int(lines.get(f"NODE7.MACHINE_RESOURCE_{resource}", 0)) == sum(int(t.get(resource, 0)) for t in types)


def test_memory_bandwidth_is_rounded_down_to_whole_gbs():
    raw = node_config(INVENTORY.node("node3"), config.DOMAIN)
    raw["slots"][0]["mem_bw_gbs"] = 59.99
    lines = _config_lines(discover.render_slots(discover.parse_node_config(raw), "NODE1"))
    assert "MemBW=59" in lines["NODE1.SLOT_TYPE_1"]


def test_micinfo_sections_give_memory_and_threads_per_device():
    assert discover.parse_micinfo(MICINFO) == {
        "mic0": {"device_memory_mb": 15872, "hardware_threads": 240},
        "mic1": {"device_memory_mb": 8192, "hardware_threads": 224},
    }


def test_micinfo_values_replace_the_node_config_for_named_devices_only():
    node = discover.parse_node_config(node_config(INVENTORY.node("node1"), config.DOMAIN))
    warnings: list[str] = []
    merged = discover.merge_micinfo(node, {"mic0": {"device_memory_mb": 15872, "hardware_threads": 240},
                                           "mic9": {"device_memory_mb": 1, "hardware_threads": 4}},
                                    warnings.append)
    assert [d["device_memory_mb"] for d in merged["devices"]] == [15872, 8192]
    assert any("mic9" in w for w in warnings) and any("mic1" in w for w in warnings)


@pytest.mark.parametrize("text", [
    "Device No: 0, Device Name: ../../etc\n GDDR Size : 100 MB\n Total No of Active Cores : 61\n",
    "Device No: 0, Device Name: mic0\n GDDR Size : -5 MB\n Total No of Active Cores : 61\n",
    "Device No: 0, Device Name: mic0\n GDDR Size : 1e9 MB\n Total No of Active Cores : 61\n",
    "Device No: 0, Device Name: mic0\n GDDR Size : 100 MB\n Total No of Active Cores : 61; rm -rf /\n",
    "Device No: 0, Device Name: mic0\n GDDR Size : 99999999999 MB\n Total No of Active Cores : 61\n",
    "Device No: 0, Device Name: mic0\nDevice No: 1, Device Name: mic0\n",
])
def test_hostile_micinfo_output_yields_no_device(text):
    assert discover.parse_micinfo(text) == {}


@pytest.mark.parametrize("patch", [
    {"node": "node1\nSTART = True"},
    {"cores": "12"},
    {"cores": True},
    {"memory_mb": 2**40},
    {"slots": []},
])
def test_hostile_node_config_is_refused(patch):
    raw = {**node_config(INVENTORY.node("node1"), config.DOMAIN), **patch}
    with pytest.raises(discover.BadInput):
        discover.parse_node_config(raw)


@pytest.mark.parametrize("slot_patch", [
    {"device": 'mic0"\nSTART = True'},
    {"hardware_threads": -1},
    {"device_memory_mb": 1.5},
    {"kind": "gpu"},
    {"slot_id": 9},
])
def test_hostile_device_entries_are_refused(slot_patch):
    raw = node_config(INVENTORY.node("node1"), config.DOMAIN)
    raw["slots"][1].update(slot_patch)
    with pytest.raises(discover.BadInput):
        discover.parse_node_config(raw)


def test_socket_bandwidth_must_be_a_finite_number():
    raw = node_config(INVENTORY.node("node1"), config.DOMAIN)
    raw["slots"][0]["mem_bw_gbs"] = float("nan")
    with pytest.raises(discover.BadInput):
        discover.parse_node_config(raw)


def test_bad_local_name_is_refused():
    node = discover.parse_node_config(node_config(INVENTORY.node("node1"), config.DOMAIN))
    with pytest.raises(discover.BadInput):
        discover.render_slots(node, "NODE1.START")


def test_discover_main_prints_config_and_exits_2_on_bad_file(tmp_path, capsys):
    good = tmp_path / "node1.json"
    good.write_text(json.dumps(node_config(INVENTORY.node("node1"), config.DOMAIN)))
    saved = tmp_path / "micinfo.txt"
    saved.write_text(MICINFO)
    assert discover.main(["--node-config", str(good), "--local-name", "NODE1", "--micinfo", str(saved)]) == 0
    out = capsys.readouterr().out
    assert "NODE1.SLOT_TYPE_2 = cpus=4, memory=1024, PhiMemory=15872, PhiThreads=240" in out
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    assert discover.main(["--node-config", str(bad), "--local-name", "NODE1"]) == 2
    assert capsys.readouterr().out == ""


def test_pool_config_lists_one_startd_and_one_agent_per_node():
    text = config.render_pool_config(list(INVENTORY.nodes), config.HookFiles())
    daemon_list = re.search(r"^DAEMON_LIST = (.*)$", text, re.M).group(1).split(", ")
    assert daemon_list[:5] == ["MASTER", "COLLECTOR", "NEGOTIATOR", "SCHEDD", "SHARED_PORT"]
    assert daemon_list[5:] == [x for i in range(1, 1 + len(INVENTORY.nodes)) for x in (f"NODE{i}", f"COSCHED_AGENT{i}")]
    for knob in ("NEGOTIATOR_INTERVAL = 2", "NEGOTIATOR_MIN_INTERVAL = 1", "NEGOTIATOR_CYCLE_DELAY = 1",
                 "NEGOTIATOR_UPDATE_AFTER_CYCLE = True", "SCHEDD_INTERVAL = 5", "UPDATE_INTERVAL = 5",
                 "STARTER_UPDATE_INTERVAL = 5", "CONDOR_HOST = 127.0.0.1", "MACHINE_RESOURCE_PhiMemory = 0"):
        assert f"\n{knob}\n" in text
    assert "DC_DAEMON_LIST =" not in text  # the agents must stay non-DaemonCore


def test_missing_hooks_are_not_wired():
    text = config.render_pool_config(list(INVENTORY.nodes), config.HookFiles(False, False, False))
    assert "COSCHED_AGENT" not in text.split("DAEMON_LIST = ")[1].splitlines()[0]
    assert "STARTD_CRON" not in text and "HOOK" not in text
    node = config.render_node_daemons(INVENTORY.node("node2"), 2, config.HookFiles(False, False, False))
    assert "COSCHED_AGENT" not in node and "STARTD_CRON" not in node
    assert "_HOOK_" not in config.starter_environment("node2", config.HookFiles(False, False, False))


def test_node_daemons_point_every_hook_at_the_node_config():
    text = config.render_node_daemons(INVENTORY.node("node2"), 2, config.HookFiles())
    lines = _config_lines(text)
    assert lines["NODE2"] == "$(STARTD)" and lines["NODE2_ARGS"] == "-local-name NODE2"
    assert lines["NODE2.STARTD_NAME"] == "node2"
    assert lines["NODE2.NETWORK_HOSTNAME"] == "node2.cosched.test"
    assert lines["NODE2.STARTD_CRON_COSCHEDINFO_ARGS"] == (
        "-Es /opt/condor_sched/node_hooks/cosched_startd_cron.py --node-config /etc/condor_sched/nodes/node2.json")
    assert lines["COSCHED_AGENT2"] == "/usr/bin/python3"
    # The agent asks this node's startd (its address file) for the claims it enforces.
    assert lines["NODE2.STARTD_ADDRESS_FILE"] == "/var/log/condor/.startd_address.node2"
    assert lines["COSCHED_AGENT2_ARGS"] == ("-Es /opt/condor_sched/node_hooks/cosched_node_agent.py --node-config "
                                            "/etc/condor_sched/nodes/node2.json --state-dir /var/lib/condor_sched/node2 "
                                            "--startd-address-file /var/log/condor/.startd_address.node2 "
                                            "--probe file --probe-dir /var/lib/condor_sched/probe/node2 "
                                            "--profile-dir /var/lib/condor_sched/profiles --interval 2")
    # Its starters (local name slot_type_<n>) inherit the startd's environment, set by the master.
    assert lines["NODE2_ENVIRONMENT"] == ('"_CONDOR_STARTER_LOG=/var/log/condor/StarterLog.node2 '
                                          "_CONDOR_COSCHED_HOOK_PREPARE_JOB_ARGS='--node-config "
                                          "/etc/condor_sched/nodes/node2.json'\"")
    assert "NODE2.STARTER" not in lines


def test_hosts_file_puts_every_node_on_loopback():
    text = config.render_hosts(["myhost"], ["node1", "node2"])
    assert text.splitlines()[0].split() == ["127.0.0.1", "localhost", "myhost", "node1.cosched.test", "node1",
                                            "node2.cosched.test", "node2"]


def test_client_config_claims_the_user_and_refuses_odd_names():
    text = config.render_client_config("alice")
    assert "SEC_CLAIMTOBE_USER = alice" in text and "SEC_CLIENT_AUTHENTICATION_METHODS = CLAIMTOBE" in text
    with pytest.raises(ValueError):
        config.render_client_config("alice\nSEC_CLAIMTOBE_USER = root")


def test_client_env_points_at_a_written_config(tmp_path):
    settings = localpool.PoolSettings(root=tmp_path / "pool-root")
    env = localpool.client_env("condor", settings)
    assert "SEC_CLAIMTOBE_USER = condor" in Path(env["CONDOR_CONFIG"]).read_text()


def test_pool_root_setting_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("COSCHED_POOL_ROOT", str(tmp_path / "r"))
    assert localpool.PoolSettings.from_env().root == tmp_path / "r"
    monkeypatch.delenv("COSCHED_POOL_ROOT")
    assert localpool.PoolSettings.from_env().root == Path("/var/cache/condor-sched/pool-root")


def test_up_without_root_says_so(monkeypatch):
    monkeypatch.setattr("os.geteuid", lambda: 1000)
    with pytest.raises(localpool.PoolError, match="pool up needs root"):
        localpool.up()


def test_mirror_comes_from_the_host_sources():
    deb822 = "Types: deb\nURIs: http://mirror.example/debian\nSuites: bookworm\n\nURIs: http://security.example/debian-security\n"
    assert chroot.parse_deb822_uris(deb822) == ["http://mirror.example/debian", "http://security.example/debian-security"]
    assert chroot.parse_one_line_uris("deb [arch=amd64] http://m.example/debian bookworm main\n# deb http://x/ y\n") \
        == ["http://m.example/debian"]


def test_sidecar_venv_installs_the_projects_requirements_with_the_pools_htcondor():
    setup_cfg = (Path(__file__).resolve().parents[2] / "setup.cfg").read_text()
    banner = "$CondorVersion: 25.14.1 2026-10-16 PackageID: 25.14.1+dfsg-1 $\n$CondorPlatform: X86_64-Debian_ $\n"
    requirements = config.sidecar_requirements(setup_cfg, config.condor_version_of(banner))
    assert requirements[0] == "htcondor==25.14.1"
    assert {r.split(">=")[0] for r in requirements[1:]} >= {"numpy", "ortools", "pyyaml", "click"}
    with pytest.raises(ValueError, match="CondorVersion"):
        config.condor_version_of("condor_version: not found")


def test_a_venv_built_the_same_way_is_kept_and_another_is_rebuilt(tmp_path):
    venv = tmp_path / "opt/condor_sched/venv"
    venv.mkdir(parents=True)
    scripts = {"condor-sched": config.render_sidecar_launcher()}
    stamp = chroot.venv_stamp(["htcondor==25.14.1"], ["/opt/condor_sched/src"], scripts)
    (venv / chroot.VENV_STAMP).write_text(stamp)
    assert chroot.ensure_venv(tmp_path, "/opt/condor_sched/venv", ["htcondor==25.14.1"],
                              ["/opt/condor_sched/src"], scripts) is False
    assert chroot.venv_stamp(["htcondor==25.14.2"], ["/opt/condor_sched/src"], scripts) != stamp
    assert chroot.venv_stamp(["htcondor==25.14.1"], ["/opt/condor_sched/src"], {"condor-sched": "#!"}) != stamp
    assert f"step {chroot.VENV_STEP_VERSION}" in stamp


def test_pool_sidecar_runs_the_chroot_venv_as_the_condor_super_user():
    lines = _config_lines(config.render_sidecar_pool_config())
    assert lines["COSCHED_SIDECAR"] == str(config.SIDECAR_COMMAND)
    assert lines["COSCHED_SIDECAR_USERID"] == "condor"
    assert lines["COSCHED_PROFILE_RUNS_DIR"] == str(config.PROFILE_RUNS_DIR)
    launcher = config.render_sidecar_launcher()
    assert launcher.startswith(f"#!{config.SIDECAR_VENV}/bin/python3\n") and "condor_sched.cli" in launcher
    snippet = (Path(__file__).resolve().parents[2] / "config.d" / config.SIDECAR_SNIPPET).read_text()
    assert "DAEMON_LIST = $(DAEMON_LIST) COSCHED_SIDECAR" in snippet


def test_a_second_schedd_has_its_own_name_queue_and_log_under_the_same_master():
    lines = _config_lines(config.render_second_schedd())
    assert lines["SCHEDD2"] == "$(SCHEDD)" and lines["SCHEDD2_ARGS"] == "-local-name SCHEDD2"
    assert lines["SCHEDD2.SCHEDD_NAME"] == "schedd2" and lines["SCHEDD2.SPOOL"] == "/var/spool/condor/schedd2"
    assert lines["SCHEDD2.SCHEDD_ADDRESS_FILE"].startswith("/var/spool/condor/schedd2/")
    assert lines["DAEMON_LIST"] == "$(DAEMON_LIST) SCHEDD2"


def test_a_node_with_more_slot_types_than_htcondors_default_raises_max_slot_types():
    from condor_sched.inventory import Device, Node, Socket

    big = Node("big", cores=64, memory_mb=65536, sockets=(Socket(0, 11, 50.0),),
               devices=tuple(Device(f"mic{i}", 8192, 240, host_cores=2, host_memory_mb=512) for i in range(12)))
    text = config.render_pool_config([*INVENTORY.nodes, big], config.HookFiles())
    assert "\nMAX_SLOT_TYPES = 13\n" in text and "\nSLOT_TYPE_13_PARTITIONABLE = True\n" in text
    data = discover.parse_node_config(json.loads(json.dumps(node_config(big, config.DOMAIN))))
    assert len(_slot_types(_config_lines(discover.render_slots(data, "NODE5")), "NODE5")) == 13
    assert "\nMAX_SLOT_TYPES = 10\n" in config.render_pool_config(list(INVENTORY.nodes), config.HookFiles())


def test_a_gpu_node_gets_its_fake_nvidia_smi_its_starters_gpu_variable_and_the_gpu_resources():
    gpu_node = INVENTORY.node("node6")
    assert len(gpu_node.gpus) == 2 and gpu_node.sockets == ()
    pool = config.render_pool_config(list(INVENTORY.nodes), config.HookFiles())
    for k in (0, 1):
        assert f"\nMACHINE_RESOURCE_CoSchedGPU{k}Memory = 0\n" in pool
        assert f"\nMACHINE_RESOURCE_CoSchedGPU{k}Compute = 0\n" in pool
    assert "\nMACHINE_RESOURCE_GPUs = 0\n" in pool and "CoSchedGPU2Memory" not in pool
    daemons = config.render_node_daemons(gpu_node, 6, config.HookFiles())
    assert "--nvidia-smi /etc/condor_sched/wrappers/node6/nvidia-smi" in daemons
    assert "--nvidia-smi" not in config.render_node_daemons(INVENTORY.node("node2"), 2, config.HookFiles())
    wrapper = config.render_nvidia_smi_wrapper("node6")
    assert "fake_nvidia_smi.py --node-config /etc/condor_sched/nodes/node6.json" in wrapper
    assert "--apps-dir /var/lib/condor_sched/fake-gpu/node6" in wrapper
    starter = config.starter_environment("node6", config.HookFiles(), gpu_node=True)
    assert " _CONDOR_ENVIRONMENT_FOR_AssignedGPUs=COSCHED_HTCONDOR_ASSIGNED_GPUS " in starter
    assert "AssignedGPUs" not in config.starter_environment("node2", config.HookFiles())


def test_a_node_of_its_own_gets_plain_knobs_and_what_the_startd_reads_unprefixed(tmp_path):
    """A one-startd node (no local name): every line unprefixed, MAX_SLOT_TYPES raised when the
    node has more slot types than HTCondor's default, and a GPU node's starter variables moved
    out of the hook's way; --output replaces the file only when discovery succeeds."""
    data = discover.parse_node_config(node_config(INVENTORY.node("node2"), "cosched.test"))
    text = discover.render_slots(data)
    assert all(not line.startswith("NODE") for line in text.splitlines())
    assert "SLOT_TYPE_1_PARTITIONABLE = True" in text.splitlines() and "MAX_SLOT_TYPES" not in text
    many = dict(data, devices=[dict(data["devices"][0], name=f"mic{i}") for i in range(11)])
    assert "MAX_SLOT_TYPES = 12" in discover.render_slots(many).splitlines()
    gpu_node = next(n for n in INVENTORY.nodes if n.gpus)
    gpu_text = discover.render_slots(discover.parse_node_config(node_config(gpu_node, "cosched.test")))
    assert discover.GPU_STARTER_ENVIRONMENT in gpu_text.splitlines()
    assert discover.GPU_STARTER_ENVIRONMENT not in discover.render_slots(
        discover.parse_node_config(node_config(gpu_node, "cosched.test")), "NODE6")
    node_file, out = tmp_path / "node.json", tmp_path / "31-cosched-slots.conf"
    node_file.write_text(json.dumps(node_config(INVENTORY.node("node2"), "cosched.test")))
    assert discover.main(["--node-config", str(node_file), "--output", str(out)]) == 0
    assert out.read_text() == text and oct(out.stat().st_mode & 0o777) == "0o644"
    node_file.write_text("{not json")
    assert discover.main(["--node-config", str(node_file), "--output", str(out)]) == 2
    assert out.read_text() == text and [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []
