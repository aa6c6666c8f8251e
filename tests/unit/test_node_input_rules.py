"""Input rules of the node programs. The PREPARE_JOB hook's environment rule (discovery's
32-bit totals close the file): every variable the hook sets appears exactly once
in the ``Environment`` it prints, with the hook's value, whatever the job's ad wrote: a
second copy, quoting that spells the same name, the old ``Env`` with its delimiters, both
attributes, or the attribute itself twice.

HTCondor's starter reads ``Environment`` (else ``Env``) into a table keyed by the exact name,
the LAST copy winning, so a copy the hook leaves behind would override the hook's value. The
hook runs here in-process with a canned node agent reply for each kind of start (a Xeon Phi
device job, a spread job, a node-sharing node's node and guest slots, a GPU node's job with
and without a GPU); the variables checked are those the hook prints for a job that sets none.
"""

from __future__ import annotations

import io
import json
import tempfile
from pathlib import Path
from typing import Callable, NamedTuple

import pytest
from cosched_node import ads, config, discover, environment, prepare_job

U0 = "GPU-5f1c0d1e-7a2b-4c3d-8e9f-0a1b2c3d4e50"
PHI_NODE = {"node": "node1", "domain": "cosched.test", "cores": 12, "memory_mb": 6144, "slots": [
    {"slot_id": 1, "kind": "socket", "cache_id": 0, "cores": 4, "memory_mb": 4096, "llc_ways": 11, "mem_bw_gbs": 50.0},
    {"slot_id": 2, "kind": "device", "device": "mic0", "cores": 4, "memory_mb": 1024, "device_memory_mb": 8192,
     "hardware_threads": 240}]}
SHARING_NODE = {"node": "node1", "domain": "cosched.test", "cores": 8, "memory_mb": 8192, "slots": [
    {"slot_id": 1, "kind": "node", "cores": 8, "memory_mb": 8192},
    {"slot_id": 2, "kind": "guest", "cores": 8, "memory_mb": 8192, "sharing_factor": 0.5}]}
GPU_NODE = {"node": "node1", "domain": "cosched.test", "cores": 8, "memory_mb": 8192,
            "slots": [{"slot_id": 1, "kind": "gpu-node", "cores": 8, "memory_mb": 8192}],
            "gpus": [{"index": 0, "name": "gpu0", "uuid": U0, "model": "Tesla T4", "memory_mb": 15360,
                      "capability": 7.5}],
            "mps": {"pipe_directory": "/run/mps/pipe", "log_directory": "/run/mps/log", "single_account": False}}


class Start(NamedTuple):
    """One kind of start: its node config, slot, job ad lines, machine ad lines, agent reply."""
    node: dict
    slot: str
    job: str
    machine: str = ""
    reply: dict | None = None


STARTS = {
    "phi-device": Start(PHI_NODE, "slot2_1", "RequestPhiThreads = 60\nRequestPhiMemory = 2048\n", reply={
        "status": "ok", "kind": "device", "device": "mic0", "compute": 60, "units": [[0, 60]]}),
    "spread": Start(PHI_NODE, "slot1_1", 'CoSchedProgram = "lulesh"\nRequestCpus = 4\n'),
    "node-slot": Start(SHARING_NODE, "slot1_1", "RequestCpus = 6\n",
                       reply={"status": "ok", "kind": "node", "cpus": "0-5"}),
    "guest-slot": Start(SHARING_NODE, "slot2_1", "RequestCpus = 8\n",
                        reply={"status": "ok", "kind": "guest", "cpus": "3-5", "threads": 3}),
    "gpu": Start(GPU_NODE, "slot1_1", 'CoSchedPinGPUs = "0"\nCoSchedPinGPUCompute = 250\nCoSchedPinGPUMemory = 4000\n',
                 "CoSchedGPU0Memory = 4000\nCoSchedGPU0Compute = 250\n",
                 {"status": "ok", "kind": "gpu", "gpus": [[0, 4000, 250]]}),
    "no-gpu": Start(GPU_NODE, "slot1_1", ""),
}


def run_hook(tmp_path: Path, start: Start, job_env: str) -> tuple[int, dict]:
    """The hook's exit code and printed ad for ``start``, the job ad ending with ``job_env``."""
    node_config = tmp_path / "node.json"
    node_config.write_text(json.dumps(start.node))
    machine = tmp_path / "machine.ad"
    machine.write_text(f'Name = "{start.slot}@node1@node1.cosched.test"\n{start.machine}')
    job_ad = f"ClusterId = 10\nProcId = 0\nOwner = \"alice\"\n{start.job}{job_env}"
    hook_args = ["--node-config", str(node_config), "--state-dir", str(tmp_path / "state")]
    env = {"_CONDOR_MACHINE_AD": str(machine)}

    def ask(state_dir: str) -> dict:
        assert start.reply is not None, "this start asks the agent nothing"
        return start.reply

    out = io.StringIO()
    code = prepare_job.main(hook_args, stdin=io.BytesIO(job_ad.encode()), stdout=out, env=env, ask=ask)
    return code, ads.parse_classad(out.getvalue(), "hook output")


def printed_entries(out: dict) -> list[tuple[str, str]]:
    """The printed Environment's entries as the starter splits them, repeats kept."""
    return environment.parse_environment_v2(ads.ad_get(out, "Environment"))


def hook_variables(start_name: str) -> list[tuple[str, str, str]]:
    """(start, variable, value) for every variable the hook sets for that start."""
    with tempfile.TemporaryDirectory() as scratch:
        code, out = run_hook(Path(scratch), STARTS[start_name], "")
    assert code == 0, out
    return [(start_name, name, value) for name, value in printed_entries(out)]


SET_BY_THE_HOOK = [case for name in STARTS for case in hook_variables(name)]


def test_the_cases_cover_every_variable_the_hook_sets():
    names = {name for _, name, _ in SET_BY_THE_HOOK}
    assert {name for name, _ in config.PHI_KIND.environment} <= names
    assert {"OMP_NUM_THREADS", "COSCHED_CPUS", "CUDA_VISIBLE_DEVICES", "CUDA_MPS_PIPE_DIRECTORY",
            "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"} <= names
    assert ("no-gpu", "CUDA_VISIBLE_DEVICES", "10000") in SET_BY_THE_HOOK


#: Ways a job ad writes its own copies of variable ``v`` (and MINE=1, which must survive).
HOSTILE_FORMS: dict[str, Callable[[str], str]] = {
    "repeated": lambda v: f'Environment = "{v}=1 MINE=1 {v}=999"\n',
    "quoted names": lambda v: f"Environment = \"'{v}'=1 MINE=1 {v[:2]}''{v[2:]}=999\"\n",
    "quoted values": lambda v: f"Environment = \"{v}='a b' MINE=1 '{v}=9 9'\"\n",
    "tab separated": lambda v: f'Environment = "{v}=1\tMINE=1\t{v}=999"\n',
    "old Env": lambda v: f'Env = "{v}=1;MINE=1;{v}=999"\n',
    "old Env, blanks": lambda v: f'Env = "{v}=1; MINE=1;  {v}=999"\n',
    "old Env, own delimiter": lambda v: f'Env = "|{v}=1|MINE=1|{v}=999"\n',
    "old Env, EnvDelim": lambda v: f'Env = "{v}=1 MINE=1 {v}=999"\nEnvDelim = " "\n',
    "both attributes": lambda v: f'Env = "{v}=1;{v}=2"\nEnvironment = "MINE=1 {v}=999"\n',
    "attribute twice": lambda v: f'Environment = "{v}=1"\nenvironment = "MINE=1 {v}=998 {v}=999"\n',
}


@pytest.mark.parametrize("form", HOSTILE_FORMS)
@pytest.mark.parametrize("start_name, name, value", SET_BY_THE_HOOK)
def test_every_variable_the_hook_sets_is_printed_once_with_its_value(tmp_path: Path, start_name: str, name: str,
                                                                     value: str, form: str):
    code, out = run_hook(tmp_path, STARTS[start_name], HOSTILE_FORMS[form](name))
    assert code == 0, out
    entries = printed_entries(out)
    assert [v for n, v in entries if n == name] == [value], entries
    assert dict(entries)["MINE"] == "1"
    assert len({n for n, _ in entries}) == len(entries)           # no name twice, the job's own neither


# --------------------------------------------------------------------------------------- parsing as HTCondor does

@pytest.mark.parametrize("text, entries", [
    ("A=1 B='x y' C='it''s' D= E=''", ["A=1", "B=x y", "C=it's", "D=", "E="]),
    ("'OMP'_NUM''_THREADS=1 F=a'b c'd", ["OMP_NUM_THREADS=1", "F=ab cd"]),
    ("A=1\tB=2\r\nC=3   ", ["A=1", "B=2", "C=3"]),
    ("A=1\x0bB=2 C=\xa0", ["A=1\x0bB=2", "C=\xa0"]),            # only space, tab, CR and LF separate
    ('A="x y"', ['A="x', 'y"']),                                    # a double quote is an ordinary character
    ("G='''' H=''''''", ["G='", "H=''"]),
])
def test_environment_is_split_as_htcondors_split_args_splits_it(text: str, entries: list[str]):
    assert environment.split_environment_v2(text) == entries


@pytest.mark.parametrize("text, delimiter, pairs", [
    ("A=1;B=2", None, [("A", "1"), ("B", "2")]),
    (";A=1;;B=2;", None, [("A", "1"), ("B", "2")]),
    ("A=1\n  B=2 ", None, [("A", "1"), ("B", "2 ")]),
    ("|A=1;x|B=2", None, [("A", "1;x"), ("B", "2")]),
    ("A=1|B=2", "|", [("A", "1"), ("B", "2")]),
    ("A=1 B=2", " ", [("A", "1"), ("B", "2")]),
])
def test_old_env_is_split_as_htcondor_splits_it(text: str, delimiter: str | None, pairs: list):
    assert environment.parse_environment_v1(text, delimiter) == pairs


@pytest.mark.parametrize("text", ["A='open", "A='x''", "'", "NOEQUALS", "=1", "A=1 $$(X)", "'a b'=1", 'A"=1'])
def test_entries_the_starter_would_refuse_or_read_otherwise_are_refused(text: str):
    with pytest.raises(ValueError):
        environment.merge_environment({"environment": text}, [("OMP_NUM_THREADS", "4")])


def test_what_the_hook_prints_splits_back_into_what_it_meant():
    meant = [("A", ""), ("B", "x y"), ("C", "it's"), ("D", 'say "hi"'), ("E", "tab\there"), ("F", "''")]
    assert environment.parse_environment_v2(environment.format_environment_v2(meant)) == meant


def test_a_device_kind_that_sets_a_variable_twice_is_refused():
    kind = {"name": "gpux", "memory_attr": "GpuxMemory", "compute_attr": "GpuxCompute",
            "device_name_attr": "GpuxDeviceName", "compute_per_core": 1,
            "environment": [["X", "{compute}"], ["X", "0"]]}
    with pytest.raises(config.ConfigError, match="sets X twice"):
        config.parse_device_kind(kind, "test")


# --------------------------------------------------------------------------------------- discovery's numbers

def test_micinfo_memory_beyond_a_32_bit_machine_resource_leaves_the_device_out():
    text = ("Device No: 0, Device Name: mic0\n\t\tGDDR Size\t\t : 2097152 GB\n\t\tTotal No of Active Cores : 2\n"
            "Device No: 1, Device Name: mic1\n\t\tGDDR Size\t\t : 2097151 GB\n\t\tTotal No of Active Cores : 61\n")
    assert discover.parse_micinfo(text) == {"mic1": {"device_memory_mb": 2097151 * 1024, "hardware_threads": 240}}


def test_machine_totals_beyond_a_32_bit_int_are_refused():
    node = json.loads(json.dumps(PHI_NODE))
    node["slots"].append({**node["slots"][1], "slot_id": 3, "device": "mic1"})
    for device in node["slots"][1:]:
        device["device_memory_mb"] = 2**30
    with pytest.raises(discover.BadInput, match="PhiMemory totals 2147483648"):
        discover.render_slots(discover.parse_node_config(node), "NODE1")
