"""GPU nodes, execute side (issue 13): what the node programs read from nvidia-smi,
condor_gpu_discovery and the startd's slot ads, the MPS environment the PREPARE_JOB hook sets,
the node agent's refusals and GPU memory stop, the inventory's ``gpus`` and the GPU node's
slot configuration.

Sample tool output is what the tools print on real machines (a Tesla T4 node, an A100 with
two MIG instances); no GPU is on our machines."""
from __future__ import annotations

import io
import json
import os
import re
import shutil
import stat
import subprocess
import time
from pathlib import Path

import pytest
from cosched_node import ads, config, discover, environment, errors, gpu_watch, gpus, memory_watch, prepare_job
from test_node_harness import (HOOKS, JOB_UID, SYSTEM_PYTHON, FakeView, Starter, Starters, make_agent, needs_root,
                               slot_ad, wait_for, write_config)

from condor_sched.inventory import InventoryError, node_config, node_slots, parse_inventory
from condor_sched.classads.jobs import has_pin_clause
from condor_sched.model import GPU_PIN_CLAUSE

U0 = "GPU-5f1c0d1e-7a2b-4c3d-8e9f-0a1b2c3d4e50"
U1 = "GPU-5f1c0d1e-7a2b-4c3d-8e9f-0a1b2c3d4e51"
MIG = "MIG-9c3c7b1f-3d5e-5b2c-9a9e-5b8e2f1a0c11"
PIPE = "/var/run/condor_sched/mps/gnode/pipe"

QUERY_GPU = f"""0, {U0}, Tesla T4, 15360 MiB, 7.5
1, {U1}, Tesla T4, 15360 MiB, 7.5
"""
QUERY_GPU_MIG = f"""0, GPU-0c1d2e3f-4a5b-6c7d-8e9f-a0b1c2d3e4f5, NVIDIA A100-SXM4-40GB, 40960, 8.0
1, {MIG}, NVIDIA A100-SXM4-40GB MIG 3g.20gb, 19968, 8.0
"""
GPU_DISCOVERY = """DetectedGPUs="GPU-5f1c0d1e, GPU-5f1c0d1f"
Common=[ Capability=7.5; ClockMhz=1590.00; ComputeUnits=40; CoresPerCU=64; DeviceName="Tesla T4"; DriverVersion=12.20; ECCEnabled=true; GlobalMemoryMb=14931; MaxSupportedVersion=12020; ]
GPU_5f1c0d1e=[ id="GPU-5f1c0d1e"; DevicePciBusId="0000:3B:00.0"; DeviceUuid="5f1c0d1e-7a2b-4c3d-8e9f-0a1b2c3d4e50"; ]
GPU_5f1c0d1f=[ id="GPU-5f1c0d1f"; DevicePciBusId="0000:D8:00.0"; DeviceUuid="5f1c0d1f-7a2b-4c3d-8e9f-0a1b2c3d4e51"; GlobalMemoryMb=15102; ]
"""
COMPUTE_APPS = f"""4711, {U0}, 4000
4712, {U0}, 2500
4713, {U1}, 300
4714, {MIG}, [N/A]
"""


# --------------------------------------------------------------------------------------- parsers

def test_nvidia_smi_query_gpu_gives_each_gpus_uuid_model_memory_and_capability():
    found = gpus.parse_query_gpu(QUERY_GPU)
    assert found == [gpus.GpuInfo(U0, "Tesla T4", 15360, 7.5, 0), gpus.GpuInfo(U1, "Tesla T4", 15360, 7.5, 1)]


def test_mig_instances_are_separate_gpus_named_by_their_mig_uuid_and_nounits_output_is_read():
    found = gpus.parse_query_gpu(QUERY_GPU_MIG)
    assert [g.uuid for g in found][1] == MIG and found[1].memory_mb == 19968 and found[1].capability == 8.0
    assert found[1].model == "NVIDIA A100-SXM4-40GB MIG 3g.20gb"
    old_mig = "MIG-GPU-0c1d2e3f-4a5b-6c7d-8e9f-a0b1c2d3e4f5/1/0"
    assert gpus.parse_query_gpu(f"0, {old_mig}, A100, 9856 MiB, 8.0\n")[0].uuid == old_mig


@pytest.mark.parametrize("line, why", [
    (f"0, {U0}, Tesla T4, 15360 MiB", "4 fields, expected 5"),
    (f"0, {U0}, Tesla T4, [N/A], 7.5", "memory '[N/A]' is not a number of MiB"),
    (f"0, {U0}, Tesla T4, 0 MiB, 7.5", "memory '0 MiB'"),
    (f"0, {U0}, Tesla T4, 15360 MiB, 7", "compute capability '7' is not"),
    (f"0, {U0}, Tesla T4, 15360 MiB, 0.5", "compute capability '0.5'"),
    ("0, GPU-not-a-uuid, Tesla T4, 15360 MiB, 7.5", "uuid 'GPU-not-a-uuid' is not GPU-<uuid>"),
    (f"x, {U0}, Tesla T4, 15360 MiB, 7.5", "index 'x' is not a GPU index"),
    (f'0, {U0}, Tesla T4"; Evil=1, 15360 MiB, 7.5', "GPU name"),
    (f"0, {U0}, Tesla T4, 15360 MiB, 7.5\n1, {U0}, Tesla T4, 15360 MiB, 7.5", "a GPU uuid repeats"),
    ("Failed to initialize NVML: Driver/library version mismatch", "1 fields, expected 5"),
])
def test_garbage_from_nvidia_smi_is_rejected_with_the_line_and_field(line, why):
    with pytest.raises(gpus.GpuError, match="nvidia-smi --query-gpu") as caught:
        gpus.parse_query_gpu(line + "\n")
    assert why in str(caught.value)


def test_more_than_eight_gpus_on_one_node_is_refused():
    lines = "".join(f"{k}, GPU-5f1c0d1e-7a2b-4c3d-8e9f-0a1b2c3d4e{k:02d}, Tesla T4, 15360 MiB, 7.5\n" for k in range(9))
    with pytest.raises(gpus.GpuError, match="at most 8"):
        gpus.parse_query_gpu(lines)


def test_condor_gpu_discovery_properties_give_full_uuids_and_per_device_overrides():
    found = gpus.parse_gpu_discovery(GPU_DISCOVERY)
    assert found == [gpus.GpuInfo(U0, "Tesla T4", 14931, 7.5),
                     gpus.GpuInfo("GPU-5f1c0d1f-7a2b-4c3d-8e9f-0a1b2c3d4e51", "Tesla T4", 15102, 7.5)]
    assert gpus.parse_gpu_discovery("DetectedGPUs=0\n") == []
    mig = (f'DetectedGPUs="{MIG}"\n{MIG.replace("-", "_")}=[ id="{MIG}"; DeviceName="A100 MIG 1g.5gb"; '
           'GlobalMemoryMb=4864; Capability=8.0; ]\n')
    assert gpus.parse_gpu_discovery(mig) == [gpus.GpuInfo(MIG, "A100 MIG 1g.5gb", 4864, 8.0)]


@pytest.mark.parametrize("text, why", [
    ('DetectedGPUs="GPU-5f1c0d1e"\n', "no GPU_5f1c0d1e=[ ... ] record"),
    ('DetectedGPUs="GPU-5f1c0d1e"\nGPU_5f1c0d1e=[ id="GPU-5f1c0d1e"; DeviceName="T4"; Capability=7.5; ]\n',
     "GlobalMemoryMb None"),
    ('DetectedGPUs="CUDA0"\n', "id is not GPU-<uuid>"),
    ('DetectedGPUs="GPU-5f1c0d1e"\nGPU_5f1c0d1e=[ DeviceName=system("rm"); ]\n', "is not a string, number"),
    ("this is not a ClassAd\n", "not Name=value"),
])
def test_garbage_from_condor_gpu_discovery_is_rejected(text, why):
    with pytest.raises(gpus.GpuError, match="condor_gpu_discovery") as caught:
        gpus.parse_gpu_discovery(text)
    assert why in str(caught.value)


def test_compute_apps_give_each_processes_memory_per_gpu_and_unknown_amounts_as_none():
    apps = gpus.parse_compute_apps(COMPUTE_APPS)
    assert apps[0] == gpus.ComputeApp(4711, U0, 4000) and apps[3] == gpus.ComputeApp(4714, MIG, None)
    assert gpus.parse_compute_apps("") == [] and gpus.parse_compute_apps("No running processes found\n") == []
    assert gpus.parse_compute_apps(f"4711, {U0}, 4000 MiB\n")[0].used_mb == 4000


@pytest.mark.parametrize("line, why", [
    (f"-1, {U0}, 4000", "pid '-1'"), (f"0, {U0}, 4000", "pid '0'"), (f"4711, {U0}, lots", "used_memory 'lots'"),
    ("4711, GPU-x, 4000", "uuid 'GPU-x'"), (f"4711, {U0}", "2 fields, expected 3"),
])
def test_garbage_compute_apps_are_rejected(line, why):
    with pytest.raises(gpus.GpuError, match=why):
        gpus.parse_compute_apps(line + "\n")


# --------------------------------------------------------------------------------------- claims and environment

def test_a_claims_gpus_are_those_with_compute_in_its_dynamic_slot():
    ad = {"CoSchedGPU0Memory": 0, "CoSchedGPU0Compute": 0, "cosched_gpu_ignored": 1,
          "coschedgpu1memory": 4000, "CoSchedGPU1Compute": 250}
    assert gpus.claim_shares(ad, 2) == (gpus.GpuShare(1, 4000, 250),)
    assert gpus.claim_shares({"CoSchedGPU2Compute": 1000}, 2) == ()   # not a GPU of this node


@pytest.mark.parametrize("ad", [
    {"CoSchedGPU0Compute": "250"}, {"CoSchedGPU0Compute": -1}, {"CoSchedGPU0Compute": 1001},
    {"CoSchedGPU0Compute": True}, {"CoSchedGPU0Compute": 2.5}, {"CoSchedGPU0Memory": 4000},
    {"CoSchedGPU0Compute": 100, "CoSchedGPU0Memory": 1 << 40},
])
def test_hostile_or_inconsistent_slot_amounts_are_an_error(ad):
    with pytest.raises(gpus.GpuError, match="CoSchedGPU0"):
        gpus.claim_shares(ad, 1)


def test_a_sharing_job_gets_its_gpus_uuid_a_thread_share_and_a_memory_limit():
    env = dict(gpus.mps_environment([gpus.GpuShare(1, 4000, 250)], [U0, U1], PIPE))
    assert env == {"CUDA_VISIBLE_DEVICES": U1, "CUDA_MPS_PIPE_DIRECTORY": PIPE,
                   "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "25", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=4000M"}
    odd = dict(gpus.mps_environment([gpus.GpuShare(0, 100, 333)], [U0], PIPE))
    assert odd["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "34"                  # rounded up
    assert dict(gpus.mps_environment([gpus.GpuShare(0, 1, 1)], [U0], PIPE))["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "1"


def test_a_two_gpu_job_names_both_by_uuid_and_limits_each_visible_index():
    env = dict(gpus.mps_environment([gpus.GpuShare(0, 15360, 1000), gpus.GpuShare(1, 15360, 1000)], [U0, U1], PIPE))
    assert env["CUDA_VISIBLE_DEVICES"] == f"{U0},{U1}" and env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "100"
    assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=15360M,1=15360M"


def test_a_job_holding_no_gpu_sees_none_as_htcondor_would_show_it():
    assert gpus.mps_environment([], [U0], PIPE) == [("CUDA_VISIBLE_DEVICES", "10000")]


def test_over_memory_counts_only_the_jobs_processes_and_any_use_of_an_unclaimed_gpu():
    apps = gpus.parse_compute_apps(COMPUTE_APPS)
    used = gpus.memory_by_gpu(apps, [4711, 4713, 4714])
    assert used == {U0: 4000, U1: 300}                       # 4712 is another job's; [N/A] is left out
    assert gpus.over_memory(used, {U0: 4000, U1: 300}) == []
    assert gpus.over_memory(used, {U0: 3999}) == [(U0, 4000, 3999), (U1, 300, 0)]


# --------------------------------------------------------------------------------------- node config

GNODE = {"node": "gnode", "domain": "cosched.test", "cores": 8, "memory_mb": 8192,
         "slots": [{"slot_id": 1, "kind": "gpu-node", "cores": 8, "memory_mb": 8192}],
         "gpus": [{"index": 0, "name": "gpu0", "uuid": U0, "model": "Tesla T4", "memory_mb": 15360, "capability": 7.5},
                  {"index": 1, "name": "gpu1", "uuid": U1, "model": "Tesla T4", "memory_mb": 15360,
                   "capability": 7.5}],
         "mps": {"pipe_directory": PIPE, "log_directory": "/var/run/condor_sched/mps/gnode/log",
                 "single_account": False}}


def _with(**changes) -> dict:
    data = json.loads(json.dumps(GNODE))
    for path, value in changes.items():
        target = data
        keys = path.split("__")
        for key in keys[:-1]:
            target = target[int(key)] if key.isdigit() else target[key]
        target[keys[-1]] = value
    return data


def test_a_gpu_node_config_names_its_gpus_and_mps_directories():
    parsed = config.parse_node_config(GNODE)
    assert parsed.gpu_slot.kind == "gpu-node" and [g.uuid for g in parsed.gpus] == [U0, U1]
    assert parsed.mps_pipe_directory == PIPE and parsed.single_account is False and parsed.gpu(2) is None


@pytest.mark.parametrize("changes, why", [
    ({"gpus__1__uuid": U0}, "repeat"), ({"gpus__0__uuid": "GPU-$(rm -rf)"}, "'uuid'"),
    ({"gpus__1__index": 0}, "'index' must be 1"), ({"gpus__0__capability": "7.5"}, "'capability'"),
    ({"mps__pipe_directory": "relative/pipe"}, "plain absolute"), ({"mps__single_account": "yes"}, "single_account"),
    ({"slots": [GNODE["slots"][0], {"slot_id": 2, "kind": "socket", "cores": 1, "memory_mb": 1, "cache_id": 0}]},
     "exactly one slot"),
    ({"gpus": []}, "1 to 8 GPUs"), ({"mps": None}, "'mps'"),
])
def test_a_bad_gpu_node_config_is_refused(changes, why):
    with pytest.raises(errors.ConfigError, match=why):
        config.parse_node_config(_with(**changes))


# --------------------------------------------------------------------------------------- inventory

GPU_YAML_NODE = {"name": "node6", "cores": 8, "memory_mb": 8192, "gpus": [
    {"name": "gpu0", "uuid": U0, "model": "Tesla T4", "memory_mb": 15360, "capability": 7.5},
    {"name": "mig1", "uuid": MIG, "model": "A100 MIG 3g.20gb", "memory_mb": 19968, "capability": 8.0}]}


def test_an_inventory_gpu_node_has_gpus_and_its_node_config_is_what_the_node_reads():
    node = parse_inventory({"nodes": [GPU_YAML_NODE]}).nodes[0]
    assert node.sockets == () and node.devices == () and [g.uuid for g in node.gpus] == [U0, MIG]
    assert node.gpus[1].model == "A100 MIG 3g.20gb" and node.gpus[1].capability == 8.0
    data = node_config(node, "cosched.test")
    parsed = config.parse_node_config(json.loads(json.dumps(data)))
    assert [(g.index, g.uuid, g.memory_mb) for g in parsed.gpus] == [(0, U0, 15360), (1, MIG, 19968)]
    assert parsed.slots[0].cores == 8 and parsed.slots[0].memory_mb == 8192 and not parsed.single_account


@pytest.mark.parametrize("change, why", [
    ({"sockets": [{"llc_ways": 11, "mem_bw_gbs": 50.0}]}, "has no 'sockets'"),
    ({"node_sharing": True}, "has no 'node_sharing'"),
    ({"devices": []}, "has no 'devices'"),
    ({"gpus": []}, "1 to 8 GPUs"),
    ({"gpus": [dict(GPU_YAML_NODE["gpus"][0], uuid="GPU-1234")]}, "'uuid' must match"),
    ({"gpus": [dict(GPU_YAML_NODE["gpus"][0], capability=100)]}, "'capability' must be <= 99.9"),
    ({"gpus": [dict(GPU_YAML_NODE["gpus"][0], memory_mb=0)]}, "'memory_mb' must be >= 1"),
    ({"gpus": [dict(GPU_YAML_NODE["gpus"][0], model="T4\nEvil = 1")]}, "'model' must match"),
    ({"gpus": [GPU_YAML_NODE["gpus"][0], dict(GPU_YAML_NODE["gpus"][0], name="gpu1")]}, "GPU uuids repeat"),
    ({"gpus": [dict(GPU_YAML_NODE["gpus"][0], vram=1)]}, "vram"),
])
def test_a_bad_inventory_gpu_node_is_refused_naming_the_field(change, why):
    with pytest.raises(InventoryError, match="node6") as caught:
        parse_inventory({"nodes": [dict(GPU_YAML_NODE, **change)]})
    assert why in str(caught.value)


# --------------------------------------------------------------------------------------- discovery

def _lines(text: str) -> dict[str, str]:
    return dict(line.split(" = ", 1) for line in text.splitlines() if " = " in line and not line.startswith("#"))


def test_discover_gives_a_gpu_node_one_slot_with_every_gpus_memory_and_compute():
    lines = _lines(discover.render_slots(discover.parse_node_config(GNODE), "NODE6"))
    assert lines["NODE6.SLOT_TYPE_1"] == ("cpus=8, memory=8192, CoSchedGPU0Memory=15360, CoSchedGPU0Compute=1000, "
                                          "CoSchedGPU1Memory=15360, CoSchedGPU1Compute=1000, GPUs=2, LLCWays=0, MemBW=0")
    assert lines["NODE6.MACHINE_RESOURCE_CoSchedGPU1Memory"] == "15360"
    assert lines["NODE6.MACHINE_RESOURCE_CoSchedGPU1Compute"] == "1000" and lines["NODE6.MACHINE_RESOURCE_GPUs"] == "2"
    assert lines["NODE6.SLOT1_CoSchedGPUNode"] == "True" and lines["NODE6.SLOT1_CoSchedGPUCount"] == "2"
    assert lines["NODE6.SLOT1_CoSchedGPU1Uuid"] == f'"{U1}"' and lines["NODE6.SLOT1_CoSchedGPU0Capability"] == "7.5"
    assert lines["NODE6.SLOT1_CoSchedGPU0DeviceName"] == '"Tesla T4"'
    assert lines["NODE6.SLOT1_CoSchedGPU0GlobalMemoryMb"] == "15360"
    assert lines["NODE6.SLOT1_GPUMemory"] == "max({ CoSchedGPU0Memory, CoSchedGPU1Memory })"
    assert f'Id = "{U1}"' in lines["NODE6.SLOT1_AvailableGPUs"]
    assert lines["NODE6.NUM_SLOTS_TYPE_1"] == "1" and lines["NODE6.SLOT_TYPE_1_PARTITIONABLE"] == "True"
    assert "NODE6.SLOT_TYPE_2" not in lines


def _discover(tmp_path: Path, *extra: str) -> subprocess.CompletedProcess:
    (tmp_path / "node.json").write_text(json.dumps(GNODE))
    return subprocess.run([SYSTEM_PYTHON, "-Es", str(HOOKS / "discover_devices.py"), "--node-config",
                           str(tmp_path / "node.json"), "--local-name", "NODE6", *extra], capture_output=True, text=True, timeout=60)


def test_discover_takes_gpu_memory_from_nvidia_smi_and_warns_of_gpus_the_inventory_lacks(tmp_path: Path):
    (tmp_path / "smi.txt").write_text(f"0, {U0}, Tesla T4, 15102 MiB, 7.5\n1, {MIG}, A100 MIG, 4864 MiB, 8.0\n")
    out = _discover(tmp_path, "--nvidia-smi", str(tmp_path / "smi.txt"))
    assert out.returncode == 0, out.stderr
    lines = _lines(out.stdout)
    assert lines["NODE6.MACHINE_RESOURCE_CoSchedGPU0Memory"] == "15102"       # nvidia-smi's
    assert lines["NODE6.MACHINE_RESOURCE_CoSchedGPU1Memory"] == "15360"       # not reported: the config's
    assert f"GPU 1 ({U1}) of gnode not reported by nvidia-smi" in out.stderr
    assert f"nvidia-smi reports GPU {MIG}, which the inventory of gnode does not list" in out.stderr


def test_a_startd_among_several_gets_its_node_config_hook_arguments_agent_and_unprefixed_declarations(
        tmp_path: Path):
    (tmp_path / "smi.txt").write_text(QUERY_GPU)
    out = _discover(tmp_path, "--nvidia-smi", str(tmp_path / "smi.txt"))
    assert out.returncode == 0, out.stderr
    lines, config_path = _lines(out.stdout), str(tmp_path / "node.json")
    assert lines["NODE6.COSCHED_NODE_CONFIG"] == config_path                  # the startd cron's
    assert lines["NODE6_ENVIRONMENT"] == (f"\"_CONDOR_COSCHED_HOOK_PREPARE_JOB_ARGS='--node-config {config_path}' "
                                          "_CONDOR_ENVIRONMENT_FOR_AssignedGPUs=COSCHED_HTCONDOR_ASSIGNED_GPUS\"")
    assert lines["NODE6.STARTD_ADDRESS_FILE"] == "$(LOG)/.startd_address.gnode"
    assert lines["COSCHED_NODE_AGENT_NODE6_ARGS"] == (
        f"-Es $(COSCHED_NODE_HOOKS)/cosched_node_agent.py --node-config {config_path} "
        "--startd-address-file $(LOG)/.startd_address.gnode")
    assert lines["COSCHED_NODE_AGENTS"] == "$(COSCHED_NODE_AGENTS) COSCHED_NODE_AGENT_NODE6"
    assert lines["MACHINE_RESOURCE_CoSchedGPU1Compute"] == "0" and lines["MACHINE_RESOURCE_GPUs"] == "0"
    assert lines["SLOT_TYPE_1_PARTITIONABLE"] == "True" and "MAX_SLOT_TYPES" not in lines
    odd = tmp_path / "a dir"
    odd.mkdir()
    (odd / "node.json").write_text(json.dumps(GNODE))
    out = subprocess.run([SYSTEM_PYTHON, "-Es", str(HOOKS / "discover_devices.py"), "--node-config",
                          str(odd / "node.json"), "--local-name", "NODE6", "--nvidia-smi", str(tmp_path / "smi.txt")],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and out.stdout == "" and "absolute plain path" in out.stderr


def test_discover_without_nvidia_smi_uses_saved_gpu_discovery_output_or_the_config(tmp_path: Path):
    (tmp_path / "disc.txt").write_text(GPU_DISCOVERY)
    out = _discover(tmp_path, "--nvidia-smi", "/nonexistent/nvidia-smi-output", "--gpu-discovery",
                    str(tmp_path / "disc.txt"))
    assert out.returncode == 2 and "nvidia-smi-output" in out.stderr        # a missing file given is an error
    if not shutil.which("nvidia-smi"):
        out = _discover(tmp_path, "--gpu-discovery", str(tmp_path / "disc.txt"))
        assert out.returncode == 0, out.stderr
        assert _lines(out.stdout)["NODE6.MACHINE_RESOURCE_CoSchedGPU0Memory"] == "14931"
        out = _discover(tmp_path)
        assert out.returncode == 0 and _lines(out.stdout)["NODE6.MACHINE_RESOURCE_CoSchedGPU0Memory"] == "15360"
    data = discover.parse_node_config(GNODE)
    merged = discover.merge_gpus(data, gpus.parse_gpu_discovery(GPU_DISCOVERY), "condor_gpu_discovery")
    assert [g["memory_mb"] for g in merged["gpus"]] == [14931, 15360]   # GPU 1: another uuid


def test_discover_refuses_garbage_nvidia_smi_output_and_prints_nothing(tmp_path: Path):
    (tmp_path / "smi.txt").write_text(f"0, {U0}, Tesla T4, lots, 7.5\n")
    out = _discover(tmp_path, "--nvidia-smi", str(tmp_path / "smi.txt"))
    assert out.returncode == 2 and out.stdout == "" and "memory 'lots' is not a number of MiB" in out.stderr


def test_the_fake_nvidia_smi_answers_from_the_node_config_and_live_pids(tmp_path: Path):
    (tmp_path / "node.json").write_text(json.dumps(GNODE))
    apps = tmp_path / "apps"
    apps.mkdir()
    (apps / str(os.getpid())).write_text(f"{U0} 4500\n")
    (apps / "4194303").write_text(f"{U0} 9999\n")                             # no such process
    fake = [SYSTEM_PYTHON, "-Es", str(HOOKS / "fake_nvidia_smi.py"), "--node-config", str(tmp_path / "node.json"),
            "--apps-dir", str(apps)]
    out = subprocess.run(fake + ["--query-gpu=index,uuid,name,memory.total,compute_cap", "--format=csv,noheader"],
                         capture_output=True, text=True, timeout=60, check=True).stdout
    assert gpus.parse_query_gpu(out) == gpus.parse_query_gpu(QUERY_GPU)
    out = subprocess.run(fake + list(gpu_watch.NVIDIA_SMI_APPS), capture_output=True, text=True, timeout=60,
                         check=True).stdout
    assert gpus.parse_compute_apps(out) == [gpus.ComputeApp(os.getpid(), U0, 4500)]


# --------------------------------------------------------------------------------------- agent and hook

def gpu_ad(slot: str, job: str, starter_pid: int, shares: dict[int, tuple[int, int]], user: str = "alice") -> dict:
    amounts = {}
    for k in range(2):
        memory, compute = shares.get(k, (0, 0))
        amounts[f"CoSchedGPU{k}Memory"], amounts[f"CoSchedGPU{k}Compute"] = memory, compute
    return slot_ad(slot, job, starter_pid, host="gnode", RemoteUser=f"{user}@cosched.test", **amounts)


FAKE_SMI = """#!/bin/sh
cat {apps}
"""


class GpuNode:
    def __init__(self, root: Path, starters: Starters, data: dict = GNODE) -> None:
        self.root = root
        self.config_path, self.config = write_config(root, data)
        self.state = root / "state"
        self.view = FakeView(self.config)
        self.logs: list[str] = []
        self.apps = root / "apps.csv"
        self.apps.write_text("")
        smi = root / "nvidia-smi"
        smi.write_text(FAKE_SMI.format(apps=self.apps))
        smi.chmod(smi.stat().st_mode | stat.S_IXUSR)
        self.agent = make_agent(self.config, self.state, self.view, self.logs, memory_watch.SysfsProbe("/nonexistent"),
                                nvidia_smi=gpu_watch.NvidiaSmi(str(smi), self.logs.append))
        self.starters = starters
        self.machine_ads = 0

    def claim(self, slot: str, job: str, shares: dict[int, tuple[int, int]], user: str = "alice") -> Starter:
        starter = self.starters.job()
        self.view.ads.append(gpu_ad(slot, job, starter.pid, shares, user))
        return starter

    def ask(self, starter: Starter) -> dict:
        return self.agent.answer(starter.child, os.getuid())

    def prepare(self, starter: Starter | None, machine: str, job_ad: str = "") -> tuple[int, dict]:
        """The hook's exit code and output for ``job_ad`` (default: alice's share job) on a
        claim whose machine ad is ``machine``; a job ad naming no GPU pin gets the pin the
        claim was carved from, as the schedd's job ad carries it."""
        self.machine_ads += 1
        path = self.root / f"machine{self.machine_ads}.ad"
        path.write_text(machine)
        hook_args = ["--node-config", str(self.config_path), "--state-dir", str(self.state)]
        env = {"_CONDOR_MACHINE_AD": str(path)}
        job_ad = job_ad or 'ClusterId = 40\nProcId = 0\nOwner = "alice"\nRequestGPUMemory = 4000\n'
        if "CoSchedPinGPUs" not in job_ad:
            job_ad += _pin_of(machine)
        out = io.StringIO()
        code = prepare_job.main(hook_args, stdin=io.BytesIO(job_ad.encode()), stdout=out, env=env,
                                ask=lambda state_dir: self.ask(starter))
        return code, ads.parse_classad(out.getvalue(), "hook output")

    def log(self) -> str:
        return "\n".join(self.logs)


@pytest.fixture
def gnode(tmp_path: Path):
    starters = Starters()
    yield GpuNode(tmp_path, starters)
    starters.close()


def _pin_of(machine: str) -> str:
    """The job ad lines of the GPU pin a machine ad's claim was carved from (none for no GPU)."""
    amounts = {(int(k), what): int(v) for k, what, v in re.findall(r"CoSchedGPU(\d)(Memory|Compute) = (\d+)", machine)}
    gpus = sorted({k for k, what in amounts if what == "Compute" and amounts[k, what] > 0})
    if not gpus:
        return ""
    return (f'CoSchedPinGPUs = "{",".join(map(str, gpus))}"\nCoSchedPinGPUCompute = {amounts[gpus[0], "Compute"]}\n'
            f'CoSchedPinGPUMemory = {amounts.get((gpus[0], "Memory"), 0)}\n')


def _machine(slot: str, shares: dict[int, tuple[int, int]]) -> str:
    lines = [f'Name = "{slot}@gnode@gnode.cosched.test"']
    for k, (memory, compute) in shares.items():
        lines += [f"CoSchedGPU{k}Memory = {memory}", f"CoSchedGPU{k}Compute = {compute}"]
    return "\n".join(lines) + "\n"


def test_two_sharing_jobs_of_one_owner_start_on_one_gpu_with_their_mps_environment(gnode: GpuNode):
    first = gnode.claim("slot1_1", "40.0", {0: (4000, 250)})
    second = gnode.claim("slot1_2", "41.0", {0: (4000, 250)})
    for starter, slot in ((first, "slot1_1"), (second, "slot1_2")):
        code, out = gnode.prepare(starter, _machine(slot, {0: (4000, 250)}),
                                  'ClusterId = 40\nProcId = 0\nEnvironment = "MINE=1"\n')
        assert code == 0, out
        env = dict(environment.parse_environment_v2(ads.ad_get(out, "Environment")))
        assert env == {"MINE": "1", "CUDA_VISIBLE_DEVICES": U0, "CUDA_MPS_PIPE_DIRECTORY": PIPE,
                       "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "25", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=4000M"}
        assert ads.ad_get(out, "CoSchedGPUs") == "0"
    assert "job 41.0 (alice@cosched.test) started on GPU node gnode slot slot1_2: GPUs 0 (4000 MB, compute 250)" \
        in gnode.log()


def test_a_second_owner_on_a_shared_gpu_is_refused_back_to_idle(gnode: GpuNode):
    alice = gnode.claim("slot1_1", "40.0", {0: (4000, 250)})
    bob = gnode.claim("slot1_2", "41.0", {0: (4000, 250)}, user="bob")
    elsewhere = gnode.claim("slot1_3", "42.0", {1: (4000, 250)}, user="bob")
    assert gnode.prepare(alice, _machine("slot1_1", {0: (4000, 250)}))[0] == 0
    code, out = gnode.prepare(bob, _machine("slot1_2", {0: (4000, 250)}))
    assert code == errors.EXIT_OVERSUBSCRIBED and ads.ad_get(out, "HookStatusCode") == 303
    assert "GPU 0 runs jobs of alice@cosched.test, not bob@cosched.test (MPS: one user per GPU)" in \
        ads.ad_get(out, "HookStatusMessage")
    assert gnode.prepare(elsewhere, _machine("slot1_3", {1: (4000, 250)}))[0] == 0


def test_one_execute_account_lets_owners_share_a_gpu(tmp_path: Path):
    starters = Starters()
    try:
        node = GpuNode(tmp_path, starters, _with(mps__single_account=True))
        alice = node.claim("slot1_1", "40.0", {0: (4000, 250)})
        bob = node.claim("slot1_2", "41.0", {0: (4000, 250)}, user="bob")
        assert node.ask(alice)["status"] == "ok" and node.ask(bob)["status"] == "ok"
    finally:
        starters.close()


def test_claims_over_a_gpus_memory_are_refused_whatever_the_stale_ads_said(gnode: GpuNode):
    first = gnode.claim("slot1_1", "40.0", {0: (12000, 500)})
    second = gnode.claim("slot1_2", "41.0", {0: (4000, 250)})
    assert gnode.ask(first)["gpus"] == [[0, 12000, 500]]
    reply = gnode.ask(second)
    assert reply["status"] == "refused" and reply["code"] == errors.EXIT_OVERSUBSCRIBED
    assert "GPU 0 memory 12000+4000 MB > 15360 MB" in reply["message"]
    assert gnode.ask(second)["status"] == "refused"                  # a refused start stays refused
    third = gnode.claim("slot1_3", "42.0", {0: (3360, 250)})
    assert gnode.ask(third)["status"] == "ok"                        # the refused one holds nothing


def test_the_hook_trusts_the_slot_ad_only_as_far_as_the_agent_agrees(gnode: GpuNode):
    starter = gnode.claim("slot1_1", "40.0", {0: (4000, 250)})
    code, out = gnode.prepare(starter, _machine("slot1_1", {0: (15360, 1000)}))     # a doctored machine ad
    assert code == errors.EXIT_NO_STATE and ads.ad_get(out, "HookStatusCode") == 305
    code, out = gnode.prepare(starter, _machine("slot1_1", {0: ('"4000"', 250)}))
    assert code == errors.EXIT_BAD_AD and "CoSchedGPU0Memory" in ads.ad_get(out, "HookStatusMessage")


def test_a_cpu_only_job_on_a_gpu_node_starts_with_no_gpu_visible_and_no_agent_question(gnode: GpuNode):
    code, out = gnode.prepare(None, _machine("slot1_4", {}), 'ClusterId = 43\nProcId = 0\n')
    assert code == 0 and ads.ad_get(out, "Environment") == "CUDA_VISIBLE_DEVICES=10000"
    assert ads.ad_get(out, "CoSchedGPUs") is None


def _state(pid: int) -> str:
    """The state letter of ``pid`` in /proc (T: stopped)."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


def _stopped(pid: int, within_s: float = 5.0) -> bool:
    """Whether ``pid`` shows stopped within ``within_s``: the kernel delivers SIGSTOP after the
    kill() call returns, so a loaded machine may show the old state for a moment."""
    deadline = time.monotonic() + within_s
    while _state(pid) != "T" and time.monotonic() < deadline:
        time.sleep(0.01)
    return _state(pid) == "T"


def test_a_job_over_its_claims_gpu_memory_is_stopped_and_recorded(gnode: GpuNode):
    over = gnode.claim("slot1_1", "40.0", {0: (4000, 250)})
    within = gnode.claim("slot1_2", "41.0", {0: (4000, 250)})
    cpu_only = gnode.claim("slot1_3", "42.0", {})
    for starter in (over, within, cpu_only):
        assert gnode.ask(starter)["status"] == "ok"
    gnode.apps.write_text(f"{over.child}, {U0}, 4001\n{within.child}, {U0}, 4000\n")
    gnode.agent.tick()
    assert _stopped(over.child)                            # stopped at once; the startd holds it
    assert within.child_alive() and cpu_only.child_alive() and _state(within.child) != "T"
    gnode.agent.hold_grace_s = 0                           # no hold came: killed after the grace
    gnode.agent.tick()
    assert over.exit_status_of_job() == "143"
    killed = json.loads((gnode.state / "killed" / "40.0.json").read_text())
    assert killed["reason"] == f"GPU memory use 4001 MB on GPU 0 ({U0}) exceeds its allocation of 4000 MB"
    assert killed["pids"] == [over.child] and killed["device"] == "gpu" and killed["slot"] == "slot1_1"
    assert f"job 40.0 stopped: {killed['reason']}" in gnode.log()


def test_a_job_using_a_gpu_its_claim_does_not_hold_is_stopped(gnode: GpuNode):
    cpu_only = gnode.claim("slot1_3", "42.0", {})
    gnode.ask(cpu_only)
    gnode.apps.write_text(f"{cpu_only.child}, {U1}, 1\n")
    gnode.agent.tick()
    assert _stopped(cpu_only.child)
    assert "allocation of 0 MB" in json.loads((gnode.state / "killed" / "42.0.json").read_text())["reason"]


def test_garbage_from_nvidia_smi_stops_nothing_and_is_logged_once(gnode: GpuNode):
    job = gnode.claim("slot1_1", "40.0", {0: (4000, 250)})
    gnode.ask(job)
    gnode.apps.write_text(f"{job.child}, {U0}, 99999 bytes\n")
    gnode.agent.tick()
    gnode.agent.tick()
    assert job.child_alive()
    assert sum("GPU memory not watched this interval" in line for line in gnode.logs) == 1


def test_gpu_claims_survive_an_agent_restart(gnode: GpuNode):
    job = gnode.claim("slot1_1", "40.0", {0: (4000, 250), 1: (4000, 250)})
    gnode.ask(job)
    gnode.agent.save()
    again = make_agent(gnode.config, gnode.state, gnode.view, [], None)
    record = next(iter(again.records.values()))
    assert record.claim.gpus == (gpus.GpuShare(0, 4000, 250), gpus.GpuShare(1, 4000, 250))


@needs_root
def test_a_gpu_job_running_as_its_owner_is_found_through_its_starter(gnode: GpuNode):
    job = gnode.claim("slot1_1", "40.0", {0: (4000, 250)})
    gnode.ask(job)
    gnode.apps.write_text(f"{job.child}, {U0}, 5000\n")
    gnode.agent.tick()
    assert _stopped(job.child) and JOB_UID != os.getuid()
    gnode.agent.hold_grace_s = 0
    gnode.agent.tick()
    assert job.exit_status_of_job() == "143"


def test_the_mps_daemon_is_started_once_with_the_node_configs_directories(tmp_path: Path):
    control = tmp_path / "nvidia-cuda-mps-control"
    record = tmp_path / "started"
    control.write_text(f'#!/bin/sh\necho "$@ $CUDA_MPS_PIPE_DIRECTORY $CUDA_MPS_LOG_DIRECTORY" >> {record}\n')
    control.chmod(0o755)
    logs: list[str] = []
    mps = gpu_watch.MpsControl(str(control), str(tmp_path / "pipe"), str(tmp_path / "log"), logs.append)
    mps.ensure({})
    assert record.read_text() == f"-d {tmp_path / 'pipe'} {tmp_path / 'log'}\n"
    assert (tmp_path / "pipe").is_dir() and "MPS control daemon started" in logs[0]
    from cosched_node.procs import Proc
    mps.ensure({7: Proc(7, 1, 7, 0, 0, 1, "nvidia-cuda-mps")})       # running: left alone
    assert record.read_text().count("-d") == 1
    wait_for(lambda: True, "nothing")


# --------------------------------------------------------------------------------------- schedd transform

def _gpu_transform_sets() -> dict[str, str]:
    text = (HOOKS.parent / "config.d" / "10-cosched-schedd.conf").read_text()
    body = text.split("JOB_TRANSFORM_CoSchedGPU @=end", 1)[1].split("@end", 1)[0]
    return dict(line.strip()[4:].split(" ", 1) for line in body.splitlines() if line.strip().startswith("SET "))


def test_the_transform_makes_a_claim_take_exactly_the_pinned_gpus_shares():
    # (evaluated by the schedd and startd on the local pool: tests/integration/test_gpu_sharing_live.py)
    sets = _gpu_transform_sets()
    for k in range(8):
        for what in ("Memory", "Compute"):
            assert sets[f"RequestCoSchedGPU{k}{what}"] == \
                f'ifThenElse(StringListMember("{k}", CoSchedPinGPUs ?: ""), CoSchedPinGPU{what}, 0)'
    for attr in ("CoSchedPinSlot", "CoSchedPinGPUs", "CoSchedPinGPUMemory", "CoSchedPinGPUCompute"):
        assert sets[attr] == "undefined"
    assert sets["Requirements"] == f"($(MY.Requirements)) && {GPU_PIN_CLAUSE}"   # as the sidecar enrolls


@pytest.mark.parametrize("job, slot, matches", [
    ("RequestGPUs = 1", 'Name = "slot1@native"', True),                        # native GPU node: as before
    ("RequestGPUs = 1", 'Name = "slot1@gnode"; CoSchedGPUNode = true', False),  # ours: only pinned
    ('RequestGPUs = 1; CoSchedPinSlot = "slot1@gnode"', 'Name = "slot1@gnode"; CoSchedGPUNode = true', True),
    ('RequestGPUs = 1; CoSchedPinSlot = "slot1@gnode"', 'Name = "slot1@native"', False),  # pinned elsewhere
    ('RequestGPUs = 1; CoSchedRequireGPUs = "Capability >= 9.0"', 'Name = "slot1@native"', False),
    ("RequestGPUMemory = 4000; RequestGPUCompute = 250", 'Name = "slot1@native"', False),  # a share: pin only
    ("RequestGPUCompute = 250", 'Name = "slot1@native"', False),
    ('RequestGPUCompute = 250; CoSchedPinSlot = "slot1@gnode"', 'Name = "slot1@gnode"; CoSchedGPUNode = true', True),
])
def test_the_gpu_pin_clause_lets_whole_gpu_jobs_match_native_gpu_nodes_and_shares_only_their_pin(job, slot, matches):
    import classad2

    job_ad, slot_ad = classad2.ClassAd(f"[{job}; Requirements = {GPU_PIN_CLAUSE}]"), classad2.ClassAd(f"[{slot}]")
    assert job_ad["Requirements"].eval(job_ad, slot_ad) is matches   # as the negotiator evaluates it
    assert has_pin_clause(f"(TARGET.GPUs >= RequestGPUs) && {GPU_PIN_CLAUSE}", gpu=True)
    assert not has_pin_clause(f"(TARGET.GPUs >= RequestGPUs) && {GPU_PIN_CLAUSE}", gpu=False)  # not for device jobs


def test_the_hook_ignores_gpu_amounts_a_job_ad_claims_and_refuses_a_malformed_environment(gnode: GpuNode):
    starter = gnode.claim("slot1_1", "40.0", {0: (4000, 250)})
    hostile = ('ClusterId = 40\nProcId = 0\nRequestCoSchedGPU1Memory = 15360\nRequestCoSchedGPU1Compute = 1000\n'
               'Environment = "CUDA_VISIBLE_DEVICES=all CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=100"\n')
    code, out = gnode.prepare(starter, _machine("slot1_1", {0: (4000, 250)}), hostile)
    env = dict(environment.parse_environment_v2(ads.ad_get(out, "Environment")))
    assert code == 0 and env["CUDA_VISIBLE_DEVICES"] == U0 and env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "25"
    code, out = gnode.prepare(starter, _machine("slot1_1", {0: (4000, 250)}),
                              hostile + 'CoSchedPinGPUs = "0,1"\nCoSchedPinGPUCompute = 1000\nCoSchedPinGPUMemory = 15360\n')
    assert code == errors.EXIT_OVERSUBSCRIBED and "its pin now names GPU 0 (1000/1000, 15360 MB), GPU 1" in \
        ads.ad_get(out, "HookStatusMessage")         # a pin that is not the claim's starts nothing
    code, out = gnode.prepare(starter, _machine("slot1_1", {0: (4000, 250)}), "ClusterId = 40\nProcId = 0\n"
                              "Environment = 3\n")
    assert code == errors.EXIT_BAD_AD and ads.ad_get(out, "HookStatusCode") == 4
    code, out = gnode.prepare(starter, 'Name = "slot1_1@othernode@othernode.cosched.test"\n')
    assert code == errors.EXIT_BAD_CONFIG


def test_a_claim_carved_from_an_older_pin_is_refused_back_to_idle_before_the_agent_hears_of_it(gnode: GpuNode):
    """The schedd claimed GPU 1 with the job's pin then; the sidecar pinned it again (GPU 0)
    before it started: it must not run where its ad and the sidecar's books do not say."""
    starter = gnode.claim("slot1_1", "40.0", {1: (3800, 250)})
    machine = _machine("slot1_1", {1: (3800, 250)})
    job = 'ClusterId = 40\nProcId = 0\nOwner = "alice"\nRequestGPUCompute = 250\nRequestGPUMemory = 3800\n'
    repinned = job + 'CoSchedPinGPUs = "0"\nCoSchedPinGPUCompute = 250\nCoSchedPinGPUMemory = 3800\n'
    code, out = gnode.prepare(starter, machine, repinned)
    assert code == errors.EXIT_OVERSUBSCRIBED and ads.ad_get(out, "HookStatusCode") == 303
    assert ads.ad_get(out, "HookStatusMessage") == (
        "condor_sched: GPU node gnode: its claim holds GPU 1 (250/1000, 3800 MB) but its pin now names GPU 0 "
        "(250/1000, 3800 MB) (pinned again after the match); back to idle for a new plan")
    assert "started on GPU node" not in gnode.log()                 # the agent never let it start
    for other in (job + 'CoSchedPinGPUs = "1"\nCoSchedPinGPUCompute = 500\nCoSchedPinGPUMemory = 3800\n',
                  job + 'CoSchedPinGPUs = "1"\nCoSchedPinGPUCompute = 250\nCoSchedPinGPUMemory = 7000\n',
                  job + 'CoSchedPinGPUs = "0,1"\nCoSchedPinGPUCompute = 250\nCoSchedPinGPUMemory = 3800\n'):
        assert gnode.prepare(starter, machine, other)[0] == errors.EXIT_OVERSUBSCRIBED
    code, out = gnode.prepare(starter, machine, job + 'CoSchedPinGPUs = "1"\nCoSchedPinGPUMemory = 3800\n')
    assert code == errors.EXIT_OVERSUBSCRIBED and "its GPU pin ('1') does not read" in ads.ad_get(out, "HookStatusMessage")
    code, out = gnode.prepare(starter, machine, job + 'CoSchedPinGPUs = undefined\n')      # unpinned since
    assert code == errors.EXIT_OVERSUBSCRIBED and "no longer pinned" in ads.ad_get(out, "HookStatusMessage")
    code, out = gnode.prepare(starter, machine, job + 'CoSchedPinGPUs = "1"\nCoSchedPinGPUCompute = 250\n'
                                                      'CoSchedPinGPUMemory = 3800\n')
    assert code == 0 and ads.ad_get(out, "CoSchedGPUs") == "1"      # the pin it was claimed with starts


def test_a_refused_gpu_start_says_why_without_the_device_tail(gnode: GpuNode):
    first = gnode.claim("slot1_1", "40.0", {0: (12000, 500)})
    second = gnode.claim("slot1_2", "41.0", {0: (4000, 250)})
    assert gnode.prepare(first, _machine("slot1_1", {0: (12000, 500)}))[0] == 0
    code, out = gnode.prepare(second, _machine("slot1_2", {0: (4000, 250)}))
    assert code == errors.EXIT_OVERSUBSCRIBED
    assert ads.ad_get(out, "HookStatusMessage") == ("condor_sched: GPU node gnode (slot1_2): GPU 0 memory 12000+4000 MB "
                                                    "> 15360 MB; back to idle for a new plan")


# --------------------------------------------------------------------------------------- admin knobs: compute
# overcommit (gpu_compute_overcommit) and one execute account (mps_single_account)

def test_an_overcommitted_inventory_gpu_node_offers_round_1000_f_per_gpu_to_the_planner_and_the_node():
    node = parse_inventory({"nodes": [dict(GPU_YAML_NODE, gpu_compute_overcommit=1.5)]}).nodes[0]
    assert node.gpu_compute_overcommit == 1.5 and node.gpu_compute == 1500 and node.mps_single_account is False
    slot = node_slots(node, "cosched.test")[0]
    assert [(g.compute, g.free_compute) for g in slot.gpus] == [(1500, 1500), (1500, 1500)]
    assert slot.gpu_single_account is False
    parsed = config.parse_node_config(json.loads(json.dumps(node_config(node, "cosched.test"))))
    assert parsed.gpu_compute_overcommit == 1.5 and parsed.gpu_compute == 1500 and parsed.single_account is False
    whole = parse_inventory({"nodes": [dict(GPU_YAML_NODE, gpu_compute_overcommit=2)]}).nodes[0]   # an integer
    assert node_slots(whole, "cosched.test")[0].gpus[0].compute == 2000
    odd = parse_inventory({"nodes": [dict(GPU_YAML_NODE, gpu_compute_overcommit=1.2345)]}).nodes[0]
    assert node_slots(odd, "cosched.test")[0].gpus[0].compute == 1234 == \
        config.parse_node_config(node_config(odd, "cosched.test")).gpu_compute


def test_an_inventory_gpu_node_by_default_neither_overcommits_nor_shares_an_account():
    node = parse_inventory({"nodes": [GPU_YAML_NODE]}).nodes[0]
    slot = node_slots(node, "cosched.test")[0]
    assert [(g.compute, g.free_compute) for g in slot.gpus] == [(1000, 1000), (1000, 1000)]
    assert slot.gpu_single_account is False
    data = node_config(node, "cosched.test")
    assert data["gpu_compute_overcommit"] == 1.0 and data["mps"]["single_account"] is False


def test_mps_single_account_in_the_inventory_reaches_the_planners_slot_and_the_node_config():
    node = parse_inventory({"nodes": [dict(GPU_YAML_NODE, mps_single_account=True)]}).nodes[0]
    assert node_slots(node, "cosched.test")[0].gpu_single_account is True
    assert config.parse_node_config(node_config(node, "cosched.test")).single_account is True


@pytest.mark.parametrize("change, why", [
    ({"gpu_compute_overcommit": 0.5}, "'gpu_compute_overcommit' must be a number from 1.0 to 4.0 (1.0: no overcommit), "
                                      "got 0.5"),
    ({"gpu_compute_overcommit": 0.999}, "'gpu_compute_overcommit' must be a number from 1.0 to 4.0"),
    ({"gpu_compute_overcommit": 4.5}, "got 4.5"),
    ({"gpu_compute_overcommit": "1.5"}, "'gpu_compute_overcommit' must be a number from 1.0 to 4.0 (1.0: no "
                                        "overcommit), got '1.5'"),
    ({"gpu_compute_overcommit": True}, "'gpu_compute_overcommit' must be a number from 1.0 to 4.0 (1.0: no "
                                       "overcommit), got True"),
    ({"gpu_compute_overcommit": float("inf")}, "got inf"),
    ({"gpu_compute_overcommit": float("nan")}, "got nan"),
    ({"gpu_compute_overcommit": None}, "got None"),
    ({"mps_single_account": "yes"}, "'mps_single_account' must be true or false, got 'yes'"),
    ({"mps_single_account": 1}, "'mps_single_account' must be true or false, got 1"),
])
def test_a_bad_gpu_node_knob_is_refused_naming_the_node_and_the_key(change, why):
    with pytest.raises(InventoryError, match="node6") as caught:
        parse_inventory({"nodes": [dict(GPU_YAML_NODE, **change)]})
    assert why in str(caught.value)


@pytest.mark.parametrize("key, value", [("gpu_compute_overcommit", 1.5), ("mps_single_account", True)])
def test_the_gpu_node_knobs_are_refused_on_a_node_without_gpus(key, value):
    cpu_node = {"name": "node1", "cores": 8, "memory_mb": 8192, "sockets": [{"llc_ways": 11, "mem_bw_gbs": 50.0}]}
    with pytest.raises(InventoryError, match=rf"node1.*'{key}' only on a GPU node"):
        parse_inventory({"nodes": [dict(cpu_node, **{key: value})]})


def test_the_node_config_carries_the_overcommit_factor_and_defaults_to_no_overcommit():
    assert config.parse_node_config(GNODE).gpu_compute == 1000                # absent: 1.0 (older configs)
    assert config.parse_node_config(_with(gpu_compute_overcommit=1.5)).gpu_compute == 1500
    assert config.parse_node_config(_with(gpu_compute_overcommit=4)).gpu_compute == 4000
    assert config.parse_node_config(_with(gpu_compute_overcommit=1)).gpu_compute_overcommit == 1.0


@pytest.mark.parametrize("value", [0.99, 4.01, 0, -1.5, "1.5", True, None, float("nan"), float("inf"), [1.5]])
def test_a_bad_overcommit_factor_in_the_node_config_is_refused(value):
    with pytest.raises(errors.ConfigError, match="'gpu_compute_overcommit' must be a number from 1.0 to 4.0"):
        config.parse_node_config(_with(gpu_compute_overcommit=value))


def test_the_overcommit_factor_is_refused_in_the_config_of_a_node_without_gpus():
    cpu_node = {"node": "node1", "domain": "cosched.test", "cores": 8, "memory_mb": 8192,
                "slots": [{"slot_id": 1, "kind": "socket", "cores": 8, "memory_mb": 8192, "cache_id": 0}],
                "gpu_compute_overcommit": 1.5}
    with pytest.raises(errors.ConfigError, match="for GPU nodes"):
        config.parse_node_config(cpu_node)


OVERCOMMITTED = _with(gpu_compute_overcommit=1.5, mps__single_account=True)


def test_discover_gives_every_gpu_of_an_overcommitted_node_1000_f_and_says_whether_one_account_runs_all():
    lines = _lines(discover.render_slots(discover.parse_node_config(OVERCOMMITTED), "NODE6"))
    assert lines["NODE6.MACHINE_RESOURCE_CoSchedGPU0Compute"] == "1500"
    assert lines["NODE6.MACHINE_RESOURCE_CoSchedGPU1Compute"] == "1500"
    assert lines["NODE6.SLOT_TYPE_1"] == ("cpus=8, memory=8192, CoSchedGPU0Memory=15360, CoSchedGPU0Compute=1500, "
                                          "CoSchedGPU1Memory=15360, CoSchedGPU1Compute=1500, GPUs=2, LLCWays=0, MemBW=0")
    assert lines["NODE6.MACHINE_RESOURCE_CoSchedGPU0Memory"] == "15360"     # memory: never overcommitted
    assert lines["NODE6.SLOT1_CoSchedGPUSingleAccount"] == "True"
    assert _lines(discover.render_slots(discover.parse_node_config(GNODE), "NODE6"))[
        "NODE6.SLOT1_CoSchedGPUSingleAccount"] == "False"


def test_the_discovery_program_prints_the_overcommitted_compute_after_nvidia_smi_and_refuses_a_bad_factor(
        tmp_path: Path):
    (tmp_path / "smi.txt").write_text(QUERY_GPU)
    (tmp_path / "node.json").write_text(json.dumps(OVERCOMMITTED))
    run = [SYSTEM_PYTHON, "-Es", str(HOOKS / "discover_devices.py"), "--node-config", str(tmp_path / "node.json"),
           "--local-name", "NODE6", "--nvidia-smi", str(tmp_path / "smi.txt")]
    out = subprocess.run(run, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    lines = _lines(out.stdout)
    assert lines["NODE6.MACHINE_RESOURCE_CoSchedGPU1Compute"] == "1500"
    assert lines["NODE6.SLOT1_CoSchedGPUSingleAccount"] == "True"
    (tmp_path / "node.json").write_text(json.dumps(_with(gpu_compute_overcommit=5)))
    out = subprocess.run(run, capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and out.stdout == "" and "gpu_compute_overcommit" in out.stderr


def test_the_discovered_slot_of_an_inventory_node_is_what_its_planner_slot_says():
    node = parse_inventory({"nodes": [dict(GPU_YAML_NODE, gpu_compute_overcommit=2.5, mps_single_account=True)]}).nodes[0]
    slot = node_slots(node, "cosched.test")[0]
    lines = _lines(discover.render_slots(discover.parse_node_config(node_config(node, "cosched.test")), "NODE6"))
    for gpu in slot.gpus:
        assert int(lines[f"NODE6.MACHINE_RESOURCE_CoSchedGPU{gpu.index}Compute"]) == gpu.compute == 2500
    assert lines["NODE6.SLOT1_CoSchedGPUSingleAccount"] == str(slot.gpu_single_account) == "True"


def _startd_attrs() -> set[str]:
    text = (HOOKS.parent / "config.d" / "20-cosched-startd.conf").read_text().replace("\\\n", " ")
    return {attr for line in text.splitlines() if line.startswith("STARTD_ATTRS = ") for attr in line.split()[3:]}


def test_every_attribute_discovery_gives_a_gpu_node_slot_is_advertised_by_config_d():
    lines = _lines(discover.render_slots(discover.parse_node_config(OVERCOMMITTED), "NODE6"))
    attrs = {key.split("SLOT1_", 1)[1] for key in lines if key.startswith("NODE6.SLOT1_")}
    assert "CoSchedGPUSingleAccount" in attrs and attrs <= _startd_attrs()


def test_a_claim_may_hold_up_to_the_nodes_compute_per_gpu_and_no_more():
    assert gpus.claim_shares({"CoSchedGPU0Compute": 1500, "CoSchedGPU0Memory": 15360}, 1, 1500) == \
        (gpus.GpuShare(0, 15360, 1500),)
    for too_much, per_gpu in ((1501, 1500), (1001, 1000), (4001, 4000)):
        with pytest.raises(gpus.GpuError, match=rf"CoSchedGPU0Compute '{too_much}' is not an integer in \[0, {per_gpu}\]"):
            gpus.claim_shares({"CoSchedGPU0Compute": too_much}, 1, per_gpu)
    with pytest.raises(gpus.GpuError, match="1001"):
        gpus.claim_shares({"CoSchedGPU0Compute": 1001}, 1)                 # default: a 1.0 node


def test_the_thread_percentage_stays_within_1_to_100_on_an_overcommitted_gpu():
    def percent(compute: int) -> str:
        return dict(gpus.mps_environment([gpus.GpuShare(0, 1000, compute)], [U0], PIPE))[
            "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"]
    assert [percent(c) for c in (1, 9, 10, 11, 999, 1000, 1001, 1500, 4000)] == \
        ["1", "1", "1", "2", "100", "100", "100", "100", "100"]


@pytest.fixture
def overcommitted(tmp_path: Path):
    starters = Starters()
    yield GpuNode(tmp_path, starters, _with(gpu_compute_overcommit=1.5))
    starters.close()


def test_shares_summing_to_the_overcommitted_compute_start_on_one_gpu_and_one_more_is_refused(overcommitted: GpuNode):
    node = overcommitted
    starters = [node.claim(f"slot1_{i}", f"4{i}.0", {0: (3000, 500)}) for i in range(1, 4)]
    for i, starter in enumerate(starters, 1):
        code, out = node.prepare(starter, _machine(f"slot1_{i}", {0: (3000, 500)}))
        assert code == 0, out
        env = dict(environment.parse_environment_v2(ads.ad_get(out, "Environment")))
        assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "50" and env["CUDA_VISIBLE_DEVICES"] == U0
    fourth = node.claim("slot1_4", "44.0", {0: (3000, 250)})
    reply = node.ask(fourth)
    assert reply["status"] == "refused" and "GPU 0 compute 1500+250 > 1500" in reply["message"]


def test_the_same_shares_over_one_gpu_are_refused_on_a_node_without_overcommit(gnode: GpuNode):
    first, second = gnode.claim("slot1_1", "41.0", {0: (3000, 600)}), gnode.claim("slot1_2", "42.0", {0: (3000, 500)})
    assert gnode.ask(first)["status"] == "ok"
    reply = gnode.ask(second)
    assert reply["status"] == "refused" and "GPU 0 compute 600+500 > 1000" in reply["message"]


def test_a_whole_gpu_job_on_an_overcommitted_node_needs_an_idle_gpu_and_keeps_it_alone(overcommitted: GpuNode):
    node = overcommitted
    share = node.claim("slot1_1", "41.0", {0: (3000, 250)})
    whole_on_shared = node.claim("slot1_2", "42.0", {0: (12000, 1000)})
    whole_on_idle = node.claim("slot1_3", "43.0", {1: (12000, 1000)})     # room left in memory and compute
    share_on_whole = node.claim("slot1_4", "44.0", {1: (300, 100)})
    assert node.ask(share)["status"] == "ok"
    reply = node.ask(whole_on_shared)
    assert reply["status"] == "refused" and "GPU 0 is held whole by one job, not shared" in reply["message"]
    code, out = node.prepare(whole_on_idle, _machine("slot1_3", {1: (12000, 1000)}))
    assert code == 0, out
    env = dict(environment.parse_environment_v2(ads.ad_get(out, "Environment")))
    assert env["CUDA_VISIBLE_DEVICES"] == U1 and env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "100"
    reply = node.ask(share_on_whole)
    assert reply["status"] == "refused" and "GPU 1 is held whole by one job" in reply["message"]


def test_the_hook_takes_a_claim_of_all_an_overcommitted_gpus_compute_as_a_whole_gpu_and_refuses_more(
        overcommitted: GpuNode):
    node = overcommitted
    starter = node.claim("slot1_1", "41.0", {0: (15360, 1500)})
    code, out = node.prepare(starter, _machine("slot1_1", {0: (15360, 1500)}))
    assert code == 0, out
    env = dict(environment.parse_environment_v2(ads.ad_get(out, "Environment")))
    assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "100"
    code, out = node.prepare(starter, _machine("slot1_1", {0: (15360, 1501)}))
    assert code == errors.EXIT_BAD_AD and "CoSchedGPU0Compute '1501' is not an integer in [0, 1500]" in \
        ads.ad_get(out, "HookStatusMessage")


def test_overcommitted_gpu_claims_survive_an_agent_restart(overcommitted: GpuNode):
    job = overcommitted.claim("slot1_1", "40.0", {0: (15360, 1500)})
    assert overcommitted.ask(job)["status"] == "ok"
    overcommitted.agent.save()
    again = make_agent(overcommitted.config, overcommitted.state, overcommitted.view, [], None)
    assert [r.claim.gpus for r in again.records.values()] == [(gpus.GpuShare(0, 15360, 1500),)]


def test_an_inventory_single_account_node_lets_two_owners_share_a_gpu_and_a_default_node_does_not(tmp_path: Path):
    starters = Starters()
    try:
        for single, root in ((True, tmp_path / "single"), (False, tmp_path / "default")):
            root.mkdir()
            inventory_node = parse_inventory({"nodes": [dict(GPU_YAML_NODE, name="gnode", mps_single_account=single)]})
            node = GpuNode(root, starters, node_config(inventory_node.nodes[0], "cosched.test"))
            alice = node.claim("slot1_1", "40.0", {0: (4000, 250)})
            bob = node.claim("slot1_2", "41.0", {0: (4000, 250)}, user="bob")
            assert node.ask(alice)["status"] == "ok"
            reply = node.ask(bob)
            if single:
                assert reply["status"] == "ok"
            else:
                assert reply["status"] == "refused" and "(MPS: one user per GPU)" in reply["message"]
    finally:
        starters.close()
