"""cosched_describe_node.py: the node writes its own node config from its hardware (fake
sysfs / proc trees, saved nvidia-smi / condor_gpu_discovery / micinfo output) and the admin's
overrides, in the shape the inventory writes, validated before anything is written."""

from __future__ import annotations

import json
import stat
import subprocess
from pathlib import Path

import pytest
from cosched_node import config, describe, hardware
from test_gpu_node import GPU_DISCOVERY, QUERY_GPU, U0, U1
from test_localpool_config import MICINFO
from test_node_harness import HOOKS, SYSTEM_PYTHON

from condor_sched import device_kinds, inventory
from condor_sched.inventory import Device, GpuSpec, Node, Socket

FQDN = "node7.cluster.example.org"
MEM_KB = 64 * 1024 * 1024 + 512      # 65536 MiB and a half


def fake_node(root: Path, sockets: int = 2, cores_per_socket: int = 4, threads: int = 2,
              cbm_mask: str | None = "fffff", mem_kb: int = MEM_KB, offline: int | None = None) -> Path:
    """A sysfs / proc tree: CPU n is thread n // (sockets * cores) of core (n // sockets) % cores
    of socket n % sockets (interleaved, as many BIOSes number them); socket s's L3 is id s."""
    cpu_base = root / "sys/devices/system/cpu"
    for n in range(sockets * cores_per_socket * threads):
        cpu = cpu_base / f"cpu{n}"
        (cpu / "topology").mkdir(parents=True)
        (cpu / "topology/physical_package_id").write_text(f"{n % sockets}\n")
        (cpu / "topology/core_id").write_text(f"{(n // sockets) % cores_per_socket}\n")
        for index, level, cache_id in (("index0", 1, n), ("index3", 3, n % sockets)):
            (cpu / "cache" / index).mkdir(parents=True)
            (cpu / "cache" / index / "level").write_text(f"{level}\n")
            (cpu / "cache" / index / "id").write_text(f"{cache_id}\n")
        if n:
            (cpu / "online").write_text("0\n" if n == offline else "1\n")
    (cpu_base / "online").write_text("0-15\n")   # a file, not a cpuN directory
    (root / "proc").mkdir()
    (root / "proc/meminfo").write_text(f"MemTotal:       {mem_kb} kB\nMemFree:         1000 kB\n")
    if cbm_mask is not None:
        (root / "sys/fs/resctrl/info/L3").mkdir(parents=True)
        (root / "sys/fs/resctrl/info/L3/cbm_mask").write_text(cbm_mask + "\n")
    return root


def run(tmp_path: Path, *args: str, overrides: dict | None = None, fqdn: str = FQDN, capsys=None,
        name: str = "overrides.json") -> int:
    argv = ["--root", str(tmp_path / "root"), "--nvidia-smi", "none", "--micinfo", "none", *args]
    if overrides is not None:
        (tmp_path / name).write_text(json.dumps(overrides))
        argv += ["--overrides", str(tmp_path / name)]
    return describe.main(argv, fqdn=fqdn)


def written(tmp_path: Path) -> dict:
    path = tmp_path / "etc/node.json"
    result = json.loads(path.read_text())
    config.parse_node_config(result)
    return result


@pytest.fixture
def root(tmp_path: Path) -> Path:
    return fake_node(tmp_path / "root")


@pytest.fixture
def phi_root(tmp_path: Path) -> Path:
    """A host of 2 x 8 cores: room for two cards' host shares (4 cores each) and the sockets."""
    return fake_node(tmp_path / "root", cores_per_socket=8)


def test_a_two_socket_node_with_resctrl_is_what_the_inventory_would_write(tmp_path: Path, root: Path):
    out = tmp_path / "etc/node.json"
    assert run(tmp_path, "--output", str(out), overrides={"mem_bw_gbs": [60, 55.5]}) == 0
    expected = inventory.node_config(Node("node7", 8, 65536, (Socket(0, 20, 60.0), Socket(1, 20, 55.5))),
                                     "cluster.example.org")
    assert written(tmp_path) == expected
    info = out.stat()
    assert stat.S_IMODE(info.st_mode) == 0o644 and info.st_uid == 0
    assert sorted(p.name for p in out.parent.iterdir()) == ["node.json"]    # no temp file left


def test_hardware_probe_counts_physical_cores_sockets_cache_ids_and_ways(root: Path):
    warnings: list[str] = []
    hw = hardware.probe_hardware(str(root), "none", None, "none", warnings.append)
    assert (hw.cores, hw.memory_mb, hw.llc_ways) == (8, 65536, 20)
    assert hw.sockets == (hardware.SocketInfo(0, 4, 0), hardware.SocketInfo(1, 4, 1))
    assert warnings == []


def test_an_offline_cpu_and_a_cpuinfo_only_node_are_counted_right(tmp_path: Path):
    one_thread_per_core = fake_node(tmp_path / "a", sockets=1, cores_per_socket=4, threads=1, offline=3)
    assert hardware.probe_cpus(str(one_thread_per_core), print)[0] == 3
    bare = tmp_path / "b"
    (bare / "proc").mkdir(parents=True)
    blocks = [f"processor\t: {n}\nphysical id\t: {n % 2}\ncore id\t\t: {n // 4}\n" for n in range(8)]
    (bare / "proc/cpuinfo").write_text("\n".join(blocks))
    cores, sockets = hardware.probe_cpus(str(bare), print)
    assert cores == 4 and [(s.package_id, s.cores, s.cache_id) for s in sockets] == [(0, 2, None), (1, 2, None)]


def test_without_resctrl_llc_ways_is_left_out_and_the_admin_told(tmp_path: Path, capsys):
    fake_node(tmp_path / "root", cbm_mask=None)
    assert run(tmp_path, "--output", "-", overrides={"mem_bw_gbs": 40}) == 0
    captured = capsys.readouterr()
    result = json.loads(captured.out)
    assert all("llc_ways" not in s and s["mem_bw_gbs"] == 40.0 for s in result["slots"])
    assert [s.llc_ways for s in config.parse_node_config(result).sockets] == [0, 0]
    assert "resctrl is not mounted" in captured.err


def test_without_a_bandwidth_figure_each_socket_says_0_unknown(tmp_path: Path, root: Path, capsys):
    assert run(tmp_path, "--output", "-") == 0
    captured = capsys.readouterr()
    assert [s["mem_bw_gbs"] for s in json.loads(captured.out)["slots"]] == [0.0, 0.0]
    assert "Spread-n-Share cannot plan bandwidth" in captured.err


def test_reserved_cores_and_memory_are_kept_from_the_slots(tmp_path: Path, root: Path):
    assert run(tmp_path, "--output", str(tmp_path / "etc/node.json"),
               overrides={"reserved_cores": 1, "reserved_memory_mb": 2048, "state_dir": "/srv/cosched"}) == 0
    result = written(tmp_path)
    assert (result["cores"], result["memory_mb"], result["state_dir"]) == (7, 63488, "/srv/cosched")
    assert [(s["cores"], s["memory_mb"]) for s in result["slots"]] == [(4, 31744), (3, 31744)]


def test_a_gpu_node_from_saved_nvidia_smi_output(tmp_path: Path, root: Path):
    (tmp_path / "query.txt").write_text(QUERY_GPU)
    assert run(tmp_path, "--output", str(tmp_path / "etc/node.json"), "--nvidia-smi", str(tmp_path / "query.txt"),
               overrides={"gpu_compute_overcommit": 2, "single_account": True}) == 0
    result = written(tmp_path)
    gpus = (GpuSpec("gpu0", U0, "Tesla T4", 15360, 7.5), GpuSpec("gpu1", U1, "Tesla T4", 15360, 7.5))
    expected = inventory.node_config(Node("node7", 8, 65536, (), gpus=gpus, gpu_compute_overcommit=2.0,
                                          mps_single_account=True), "cluster.example.org")
    expected["mps"].update(pipe_directory=describe.DEFAULT_MPS_PIPE_DIRECTORY,
                           log_directory=describe.DEFAULT_MPS_LOG_DIRECTORY)
    assert result == expected
    assert config.parse_node_config(result).gpu_compute == 2000


def test_a_gpu_node_of_several_models_is_written_with_a_warning_that_no_job_is_pinned_there(
        tmp_path: Path, root: Path, capsys):
    (tmp_path / "query.txt").write_text(f"0, {U0}, Tesla T4, 15360 MiB, 7.5\n1, {U1}, NVIDIA H100, 81559 MiB, 9.0\n")
    assert run(tmp_path, "--output", "-", "--nvidia-smi", str(tmp_path / "query.txt")) == 0
    assert "GPUs of several models (NVIDIA H100, Tesla T4)" in capsys.readouterr().err


def test_nvidia_smi_is_run_with_the_query_and_a_named_one_that_fails_is_an_error(tmp_path: Path, root: Path,
                                                                                 capsys):
    smi = tmp_path / "nvidia-smi"
    smi.write_text(f"#!/bin/sh\necho \"$@\" > {tmp_path}/argv\ncat <<'EOF'\n{QUERY_GPU}EOF\n")
    smi.chmod(0o755)
    assert run(tmp_path, "--output", "-", "--nvidia-smi", str(smi)) == 0
    assert [g["uuid"] for g in json.loads(capsys.readouterr().out)["gpus"]] == [U0, U1]
    assert (tmp_path / "argv").read_text().split() == list(hardware.NVIDIA_SMI_QUERY)
    smi.write_text("#!/bin/sh\necho 'No devices were found'\nexit 6\n")
    assert run(tmp_path, "--output", "-", "--nvidia-smi", str(smi)) == 2
    assert "failed (exit status 6)" in capsys.readouterr().err


def test_a_gpu_node_from_saved_condor_gpu_discovery_output(tmp_path: Path, root: Path, capsys):
    (tmp_path / "discovery.txt").write_text(GPU_DISCOVERY)
    assert run(tmp_path, "--output", "-", "--gpu-discovery", str(tmp_path / "discovery.txt"),
               overrides={"mps_pipe_directory": "/run/mps/pipe", "mps_log_directory": "/run/mps/log"}) == 0
    result = json.loads(capsys.readouterr().out)
    assert [(g["uuid"], g["memory_mb"]) for g in result["gpus"]] == [(U0, 14931), ("GPU-5f1c0d1f" + U1[12:], 15102)]
    assert result["slots"] == [{"slot_id": 1, "kind": "gpu-node", "cores": 8, "memory_mb": 65536}]
    assert result["mps"] == {"pipe_directory": "/run/mps/pipe", "log_directory": "/run/mps/log",
                             "single_account": False}


def test_a_phi_node_has_socket_slots_then_one_device_slot_per_card(tmp_path: Path, phi_root: Path):
    (tmp_path / "micinfo.txt").write_text(MICINFO)
    assert run(tmp_path, "--output", str(tmp_path / "etc/node.json"), "--micinfo", str(tmp_path / "micinfo.txt"),
               overrides={"mem_bw_gbs": 50}) == 0
    result = written(tmp_path)
    devices = (Device("mic0", 15872, 240), Device("mic1", 8192, 224))
    expected = inventory.node_config(Node("node7", 16, 65536, (Socket(0, 20, 50.0), Socket(1, 20, 50.0)), devices),
                                     "cluster.example.org")
    assert result == expected
    assert result["slots"][2]["device_kind"] == device_kinds.PHI.to_node_json()
    assert config.parse_node_config(result).devices[1].device_kind == config.PHI_KIND


def test_cards_whose_host_shares_leave_no_core_for_a_socket_exit_2(tmp_path: Path, phi_root: Path, capsys):
    (tmp_path / "micinfo.txt").write_text(MICINFO)
    assert run(tmp_path, "--output", "-", "--micinfo", str(tmp_path / "micinfo.txt"),
               overrides={"device_host_cores": 8}) == 2
    assert "device_host_cores" in capsys.readouterr().err
    assert run(tmp_path, "--output", "-", "--micinfo", str(tmp_path / "micinfo.txt"),
               overrides={"role": "socket"}) == 0
    captured = capsys.readouterr()
    assert [s["kind"] for s in json.loads(captured.out)["slots"]] == ["socket", "socket"]
    assert "2 Xeon Phi card(s) found but the role is socket" in captured.err


def test_node_sharing_gives_a_node_slot_and_its_guest(tmp_path: Path, root: Path):
    assert run(tmp_path, "--output", str(tmp_path / "etc/node.json"), overrides={"role": "node-sharing"}) == 0
    expected = inventory.node_config(Node("node7", 8, 65536, (Socket(0, 20, 0.0), Socket(1, 20, 0.0)),
                                          node_sharing=True), "cluster.example.org")
    assert written(tmp_path) == expected
    assert describe.NODE_SHARING_FACTOR == inventory.NODE_SHARING_FACTOR
    assert (describe.DEVICE_HOST_CORES, describe.DEVICE_HOST_MEMORY_MB) == \
        (Device("d", 1, 1).host_cores, Device("d", 1, 1).host_memory_mb)


def test_json_and_ini_overrides_say_the_same(tmp_path: Path, root: Path, capsys):
    settings = {"node": "n-7", "domain": "lab.example.net", "role": "node-sharing", "sharing_factor": 0.25,
                "reserved_cores": 2, "single_account": False}
    assert run(tmp_path, "--output", "-", overrides=settings) == 0
    from_json = json.loads(capsys.readouterr().out)
    ini = tmp_path / "overrides.ini"
    ini.write_text("# the admin's\n[node]\nnode = n-7\ndomain = lab.example.net\nrole = node-sharing\n"
                   "sharing_factor = 0.25\nreserved_cores = 2\nsingle_account = no\n")
    assert run(tmp_path, "--output", "-", "--overrides", str(ini)) == 0
    assert json.loads(capsys.readouterr().out) == from_json
    assert (from_json["node"], from_json["domain"], from_json["slots"][1]["sharing_factor"]) == \
        ("n-7", "lab.example.net", 0.25)


@pytest.mark.parametrize("settings, field", [
    ({"nodename": "x"}, "'nodename'"),
    ({"reserved_cores": -1}, "'reserved_cores'"),
    ({"reserved_cores": "2"}, "'reserved_cores'"),
    ({"reserved_cores": 8}, "'reserved_cores'"),
    ({"role": "phi"}, "'role'"),
    ({"mem_bw_gbs": [10, 20, 30]}, "'mem_bw_gbs'"),
    ({"mem_bw_gbs": -5}, "'mem_bw_gbs'"),
    ({"sharing_factor": 1}, "'sharing_factor'"),
    ({"gpu_compute_overcommit": 9}, "'gpu_compute_overcommit'"),
    ({"single_account": "yes"}, "'single_account'"),
    ({"node": "bad_name"}, "'node'"),
    ({"domain": "-x-"}, "'domain'"),
    ({"state_dir": "relative/dir"}, "'state_dir'"),
    ({"mps_pipe_directory": "/a/../b"}, "'mps_pipe_directory'"),
    ({"role": "gpu"}, "role"),
])
def test_bad_overrides_exit_2_naming_the_field_and_write_nothing(tmp_path: Path, root: Path, capsys, settings, field):
    out = tmp_path / "etc/node.json"
    assert run(tmp_path, "--output", str(out), overrides=settings) == 2
    assert field in capsys.readouterr().err
    assert not out.parent.exists()


@pytest.mark.parametrize("text, field", [
    ("[node]\nreserved_memory_mb = lots\n", "'reserved_memory_mb'"),
    ("[node]\ncolour = blue\n", "'colour'"),
    ("[node]\nrole = gpu\n[extra]\n", "one [node] section"),
    ("role = gpu\n", "not a valid INI file"),
])
def test_bad_ini_overrides_exit_2(tmp_path: Path, root: Path, capsys, text, field):
    (tmp_path / "overrides.conf").write_text(text)
    assert run(tmp_path, "--output", str(tmp_path / "etc/node.json"), "--overrides",
               str(tmp_path / "overrides.conf")) == 2
    assert field in capsys.readouterr().err
    assert not (tmp_path / "etc").exists()


def test_hardware_garbage_and_ambiguity_exit_2(tmp_path: Path, root: Path, capsys):
    (tmp_path / "query.txt").write_text("0, GPU-not-a-uuid, Tesla T4, 15360 MiB, 7.5\n")
    assert run(tmp_path, "--output", "-", "--nvidia-smi", str(tmp_path / "query.txt")) == 2
    assert "is not GPU-<uuid>" in capsys.readouterr().err
    (tmp_path / "query.txt").write_text(QUERY_GPU)
    (tmp_path / "micinfo.txt").write_text(MICINFO)
    assert run(tmp_path, "--output", "-", "--nvidia-smi", str(tmp_path / "query.txt"),
               "--micinfo", str(tmp_path / "micinfo.txt")) == 2
    assert "set 'role'" in capsys.readouterr().err
    (root / "sys/fs/resctrl/info/L3/cbm_mask").write_text("zz\n")
    assert run(tmp_path, "--output", "-") == 2
    assert "cbm_mask" in capsys.readouterr().err


def test_a_host_without_a_domain_is_told_what_to_set(tmp_path: Path, root: Path, capsys):
    assert run(tmp_path, "--output", "-", fqdn="Node7") == 2
    assert "set 'domain'" in capsys.readouterr().err
    assert run(tmp_path, "--output", "-", fqdn="Node7", overrides={"domain": "example.org"}) == 0
    assert json.loads(capsys.readouterr().out)["node"] == "node7"


def test_not_root_refuses_to_write_but_may_print(tmp_path: Path, root: Path, capsys, monkeypatch):
    monkeypatch.setattr(describe.os, "geteuid", lambda: 1000)
    assert run(tmp_path, "--output", str(tmp_path / "etc/node.json")) == 2
    assert "run as root" in capsys.readouterr().err and not (tmp_path / "etc").exists()
    assert run(tmp_path, "--output", "-") == 0


def test_check_finds_each_difference_and_exits_1(tmp_path: Path, capsys):
    fake_node(tmp_path / "root")
    (tmp_path / "query.txt").write_text(QUERY_GPU)
    out = tmp_path / "etc/node.json"
    assert run(tmp_path, "--output", str(out), "--nvidia-smi", str(tmp_path / "query.txt")) == 0
    assert run(tmp_path, "--check", str(out), "--nvidia-smi", str(tmp_path / "query.txt")) == 0
    assert "matches the hardware" in capsys.readouterr().out
    (tmp_path / "query.txt").write_text(QUERY_GPU.replace(U1, U1[:-2] + "99").splitlines()[1] + "\n")
    (tmp_path / "root/proc/meminfo").write_text("MemTotal: 33554432 kB\n")
    assert run(tmp_path, "--check", str(out), "--nvidia-smi", str(tmp_path / "query.txt"),
               overrides={"reserved_cores": 1}) == 1
    report = capsys.readouterr().out
    assert "cores: the config has 8, the hardware 7" in report
    assert "memory_mb: the config has 65536, the hardware 32768" in report
    assert "GPU count: the config has 2, the hardware 1" in report
    assert "GPU 0 uuid" in report
    assert out.stat().st_size > 0


def test_check_reports_devices_and_refuses_an_invalid_config(tmp_path: Path, phi_root: Path, capsys):
    (tmp_path / "micinfo.txt").write_text(MICINFO)
    out = tmp_path / "etc/node.json"
    assert run(tmp_path, "--output", str(out), "--micinfo", str(tmp_path / "micinfo.txt")) == 0
    (tmp_path / "micinfo.txt").write_text(MICINFO.split("Device No: 1")[0].replace("15872", "7936"))
    assert run(tmp_path, "--check", str(out), "--micinfo", str(tmp_path / "micinfo.txt")) == 1
    report = capsys.readouterr().out
    assert "device mic0: the config has 15872 MB and 240 threads, micinfo 7936 MB and 240 threads" in report
    assert "device mic1: in the config, not reported by micinfo" in report
    out.write_text(json.dumps({**json.loads(out.read_text()), "cores": -1}))
    assert run(tmp_path, "--check", str(out)) == 2
    assert "'cores'" in capsys.readouterr().err


def test_the_program_runs_under_the_system_python_with_an_empty_environment(tmp_path: Path, phi_root: Path):
    (tmp_path / "overrides.ini").write_text("[node]\nnode = node7\ndomain = cluster.example.org\n"
                                            "mem_bw_gbs = 80, 80\nreserved_memory_mb = 1024\n")
    (tmp_path / "micinfo.txt").write_text(MICINFO)
    out = tmp_path / "etc/condor_sched/node.json"
    script = [SYSTEM_PYTHON, "-Es", str(HOOKS / "cosched_describe_node.py")]
    probes = ["--root", str(phi_root), "--overrides", str(tmp_path / "overrides.ini"),
              "--micinfo", str(tmp_path / "micinfo.txt"), "--nvidia-smi", "none"]

    def node_program(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([*script, *probes, *args], env={"PATH": "/usr/bin:/bin"}, cwd="/",
                              capture_output=True, text=True, timeout=60, check=False)

    done = node_program("--output", str(out))
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr and "wrote" in done.stderr
    result = config.load_node_config(str(out))
    assert (result.node, result.domain, result.memory_mb) == ("node7", "cluster.example.org", 64512)
    assert [s.mem_bw_gbs for s in result.sockets] == [80.0, 80.0]
    assert [d.device for d in result.devices] == ["mic0", "mic1"]
    assert stat.S_IMODE(out.stat().st_mode) == 0o644 and out.stat().st_uid == 0
    check = node_program("--check", str(out))
    assert check.returncode == 0 and "matches the hardware" in check.stdout, check.stdout + check.stderr
    bad = node_program("--bogus")
    assert bad.returncode == 2 and "Traceback" not in bad.stderr
