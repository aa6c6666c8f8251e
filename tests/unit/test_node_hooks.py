"""Execute-node programs (the ``cosched_node`` package): ClassAd and environment handling,
placement, the node config, the PREPARE_JOB hook answered by the node agent, probes, the
startd cron, and the agent program's exit codes.

The hook asks the agent through ``ask``; here that is the agent's own ``answer`` for the
hook's process, a child of a fake condor_starter that the slot view reports as a claim's
starter (test_node_end_to_end.py runs the same over the real socket)."""

from __future__ import annotations

import io
import json
import os
import signal
import stat
import subprocess
import time
from pathlib import Path

import pytest
import cosched_node
import condor_sched
from cosched_node import ads, agent, config, environment, errors, memory_watch, placement, prepare_job, state
from cosched_node import startd_cron as cron
from test_node_harness import (HOOKS, SYSTEM_PYTHON, FakeView, Starter, Starters, device_ad, fake_condor_status,
                               make_agent, wait_for, write_config)

NODE = {"node": "node1", "domain": "cosched.test", "cores": 12, "memory_mb": 6144, "slots": [
    {"slot_id": 1, "kind": "socket", "cache_id": 0, "cores": 4, "memory_mb": 4096, "llc_ways": 11,
     "mem_bw_gbs": 50.0},
    {"slot_id": 2, "kind": "device", "device": "mic0", "cores": 4, "memory_mb": 1024,
     "device_memory_mb": 8192, "hardware_threads": 240},
    {"slot_id": 3, "kind": "device", "device": "mic1", "cores": 4, "memory_mb": 1024,
     "device_memory_mb": 8192, "hardware_threads": 240}]}


class Node:
    """A temp execute node: config file, the agent's state dir, a slot view, a file probe."""

    def __init__(self, root: Path, starters: Starters) -> None:
        self.root = root
        self.config_path, self.config = write_config(root, NODE)
        self.state = root / "state"
        self.probe = root / "probe"
        self.view = FakeView(self.config)
        self.logs: list[str] = []
        self.agent = make_agent(self.config, self.state, self.view, self.logs,
                                memory_watch.FileProbe(str(self.probe)))
        self.starters = starters
        self.asked: list[str] = []
        self.counter = 0

    def claim(self, slot: str, job: str, memory_mb: int, threads: int, **attrs: object) -> Starter:
        """The startd claims ``slot`` for ``job`` and starts its starter."""
        starter = self.starters.job()
        self.view.ads.append(device_ad(slot, job, starter.pid, memory_mb, threads, **attrs))
        return starter

    def machine_ad(self, text: str) -> str:
        self.counter += 1
        path = self.root / f"machine{self.counter}.ad"
        path.write_text(text)
        return str(path)

    def env(self, machine_ad: str) -> dict:
        return {"_CONDOR_MACHINE_AD": machine_ad}

    @property
    def hook_args(self) -> list[str]:
        """What the admin's PREPARE_JOB_ARGS gives the hook: its node config and state dir."""
        return ["--node-config", str(self.config_path), "--state-dir", str(self.state)]

    def ask_for(self, starter: Starter | None):
        """The hook's question as the agent hears it from ``starter``'s child."""
        def ask(state_dir: str) -> dict:
            self.asked.append(state_dir)
            assert starter is not None, "the hook asked the agent"
            return self.agent.answer(starter.child, os.getuid())
        return ask

    def prepare(self, job_ad: str | bytes, slot: str = "slot2_1", starter: Starter | None = None,
                extra_machine: str = "") -> tuple[int, dict]:
        ad = self.machine_ad(f'Name = "{slot}@node1@node1.cosched.test"\n{extra_machine}')
        out = io.StringIO()
        data = job_ad.encode() if isinstance(job_ad, str) else job_ad
        code = prepare_job.main(self.hook_args, stdin=io.BytesIO(data), stdout=out, env=self.env(ad), ask=self.ask_for(starter))
        return code, ads.parse_classad(out.getvalue(), "hook output")

    def units(self) -> dict:
        return {r.claim.job: r.units for r in self.agent.records.values()}

    def log(self) -> str:
        return "\n".join(self.logs)


@pytest.fixture
def node(tmp_path: Path):
    starters = Starters()
    yield Node(tmp_path, starters)
    starters.close()


def job(cluster: int = 10, proc: int = 0, threads: object = 60, memory: object = 2048, extra: str = "") -> str:
    lines = [f"ClusterId = {cluster}", f"ProcId = {proc}", 'Owner = "alice"',
             f'GlobalJobId = "submit#{cluster}.{proc}#1"']
    if threads is not None:
        lines.append(f"RequestPhiThreads = {threads}")
    if memory is not None:
        lines.append(f"RequestPhiMemory = {memory}")
    return "\n".join(lines + ([extra] if extra else [])) + "\n"


def env_of(out: dict) -> dict:
    return dict(environment.parse_environment_v2(ads.ad_get(out, "Environment")))


# --------------------------------------------------------------------------------------- parsing

def test_classad_parser_reads_values_without_evaluating_them():
    ad = ads.parse_classad('A = 3\nB = "say \\"hi\\""\nC = true\nD = 1.5\nE = undefined\n'
                           'Requirements = (TARGET.Arch == "X86_64") && true\n')
    assert ads.ad_get(ad, "a") == 3 and ads.ad_get(ad, "B") == 'say "hi"' and ads.ad_get(ad, "C") is True
    assert ads.ad_get(ad, "D") == 1.5 and ads.ad_get(ad, "E") is None
    assert isinstance(ads.ad_get(ad, "Requirements"), ads.Expr)


@pytest.mark.parametrize("data", [b"A = \xff\xfe\n", b"not a classad line\n", b'A = "open\n', b"A = 1\x00\n",
                                  b"A = 1\n" * (ads.MAX_AD_BYTES // 6 + 1)])
def test_classad_parser_refuses_malformed_input(data):
    with pytest.raises(errors.AdError):
        ads.parse_classad(data)


def test_quoted_strings_survive_a_round_trip():
    line = ads.format_line("Msg", 'a "quoted" word')
    assert ads.ad_get(ads.parse_classad(line), "Msg") == 'a "quoted" word'
    with pytest.raises(ValueError):
        ads.format_line("Msg", "new\nline")
    with pytest.raises(ValueError):
        ads.format_line("Msg", 'ends in a backslash\\')
    with pytest.raises(ValueError):
        ads.format_line("Bad-Name", 1)


def test_environment_v2_round_trip_keeps_quoting():
    pairs = environment.parse_environment_v2("A=1 B='x y' C='it''s' D=")
    assert pairs == [("A", "1"), ("B", "x y"), ("C", "it's"), ("D", "")]
    assert environment.parse_environment_v2(environment.format_environment_v2(pairs)) == pairs
    with pytest.raises(ValueError):
        environment.parse_environment_v2("A='open")


def test_old_env_is_converted_and_kept():
    merged = environment.merge_environment({"env": "A=1;B=2"}, [("B", "3"), ("C", "4")])
    assert environment.parse_environment_v2(merged) == [("A", "1"), ("B", "3"), ("C", "4")]


def test_placement_takes_whole_free_cores_lowest_first_and_needs_no_contiguity():
    # an idle 240-thread device: 60 threads are cores 0-14, as a contiguous range was
    assert placement.place_units(240, 4, [], 60) == ((0, 60),)
    # 118 threads after a 60-thread job: 29 whole cores and 2 threads of core 44
    assert placement.place_units(240, 4, [(0, 60)], 118) == ((60, 178),)
    # issue 9's hold: cores 30-44 busy, 45 free cores on either side: 180 threads fit
    assert placement.place_units(240, 4, [(120, 180)], 180) == ((0, 120), (180, 240))
    # a remainder goes to the partly used core it fits, keeping whole cores whole
    assert placement.place_units(16, 4, [(0, 2)], 6) == ((2, 8),)
    # no core has room for it alone: spread over the cores with most free threads
    assert placement.place_units(8, 4, [(0, 2), (4, 6)], 3) == ((2, 4), (6, 7))
    assert placement.place_units(8, 4, [(0, 8)], 1) is None
    assert placement.place_units(8, 4, [(0, 1)], 8) is None


def test_unit_lists_and_core_lists():
    units = ((0, 60), (64, 66), (70, 71))
    assert placement.format_ranges(units) == "0-59,64-65,70"
    assert placement.format_ranges(units, 1) == "1-60,65-66,71"     # Xeon Phi logical CPUs
    assert placement.core_ranges(units, 4) == ((0, 15), (16, 18))
    assert placement.to_ranges([5, 1, 2, 3, 7, 8]) == ((1, 4), (5, 6), (7, 9))
    assert placement.parse_units([[0, 60], [64, 66]], 62) == ((0, 60), (64, 66))
    # empty, empty range, unsorted, adjacent (not canonical), bool, negative, beyond any device, text, triple
    for bad, threads in (([], 0), ([[0, 0]], 0), ([[4, 8], [0, 2]], 6), ([[0, 4], [4, 8]], 8), ([[0, True]], 1),
                         ([[-1, 2]], 3), ([[0, 10 ** 6]], 10 ** 6), ("0-59", 60), ([[0, 4, 8]], 4)):
        with pytest.raises(ValueError, match="bad 'units'"):
            placement.parse_units(bad, threads)
    with pytest.raises(ValueError, match="add up"):
        placement.parse_units([[0, 60]], 59)


@pytest.mark.parametrize("change", [
    {"device": "../mic0"}, {"device": "mic0/x"}, {"device_memory_mb": 0}, {"device_memory_mb": True},
    {"hardware_threads": 10 ** 9}, {"slot_id": 1}, {"kind": "gpu"}, {"device_kind": {"name": "x"}}])
def test_node_config_refuses_bad_slots(change):
    bad = json.loads(json.dumps(NODE))
    bad["slots"][1].update(change)
    with pytest.raises(errors.ConfigError):
        config.parse_node_config(bad)


def test_node_config_reads_devices_and_sockets():
    cfg = config.parse_node_config(NODE)
    assert cfg.device("mic1").device_cores == 60 and cfg.device("mic1").slot_id == 3
    assert [s.slot_id for s in cfg.sockets] == [1] and cfg.sockets[0].llc_ways == 11
    assert config.state_dir_for(cfg) == "/var/lib/condor_sched/node1"
    assert config.state_dir_for(cfg, "/x/y/") == "/x/y"
    with pytest.raises(errors.ConfigError):
        config.state_dir_for(cfg, "/x/../etc")


def test_device_kind_templates_fill_the_environment():
    env = dict(config.PHI_KIND.job_environment("mic1", 180, ((0, 120), (180, 240))))
    assert env["MIC_KMP_AFFINITY"] == "granularity=fine,explicit,proclist=[1-120,181-240]"
    assert env["COSCHED_DEVICE_CORES"] == "0-29,45-59" and env["OFFLOAD_DEVICES"] == "1"
    kind = config.parse_device_kind({"name": "gpu", "memory_attr": "GpuMemory", "compute_attr": "GpuSMs",
                                     "device_name_attr": "GpuDeviceName", "compute_per_core": 2,
                                     "environment": [["CUDA_VISIBLE_DEVICES", "{device_index}"],
                                                     ["SMS", "{unit_list}"]]}, "test")
    # a device name without an index leaves out the variable that needs one
    assert kind.job_environment("gpux", 3, ((0, 3),)) == [("SMS", "0-2")]
    for template in ("{secret}", "{compute", "x}", "{0}"):
        with pytest.raises(errors.ConfigError):
            config.parse_device_kind({"name": "gpu", "memory_attr": "A", "compute_attr": "B",
                                      "device_name_attr": "C", "compute_per_core": 1,
                                      "environment": [["X", template]]}, "test")


# --------------------------------------------------------------------------------------- the hook

def test_device_job_runs_on_the_units_the_agent_placed_and_keeps_its_environment(node: Node):
    starter = node.claim("slot2_1", "10.0", 2048, 60)
    code, out = node.prepare(job(threads=60, extra="Environment = \"FOO=bar X='a b'\""), starter=starter)
    assert code == errors.EXIT_OK and node.asked == [str(node.state)]
    env = env_of(out)
    assert env["FOO"] == "bar" and env["X"] == "a b"
    assert env["OMP_NUM_THREADS"] == env["MIC_OMP_NUM_THREADS"] == "60"
    # one OpenMP thread per hardware thread, on logical CPUs 1-60 of the card (CPU 0 is the OS core's)
    assert env["MIC_KMP_AFFINITY"] == "granularity=fine,explicit,proclist=[1-60]"
    assert env["COSCHED_DEVICE_CORES"] == "0-14" and env["COSCHED_DEVICE_THREADS"] == "0-59"
    assert env["COSCHED_DEVICE"] == "mic0" and env["OFFLOAD_DEVICES"] == "0" and "MIC_KMP_PLACE_THREADS" not in env
    assert ads.ad_get(out, "CoSchedDevice") == "mic0" and ads.ad_get(out, "CoSchedDeviceCores") == "0-14"
    assert ads.ad_get(out, "CoSchedDeviceUnits") == "0-59" and "hookstatuscode" not in out
    saved = json.loads((node.state / "jobs.json").read_text())
    assert [(r["claim"]["job"], r["units"], r["starter_pid"]) for r in saved] == [("10.0", [[0, 60]], starter.pid)]
    assert "job 10.0 started on node1/mic0 slot slot2_1: 60 compute units, 2048 MB, units 0-59" in node.log()


def test_the_claims_allocation_counts_not_what_the_job_ad_asks(node: Node):
    # the job asks the whole device; the startd allocated its dynamic slot 60 threads and 1024 MB
    starter = node.claim("slot2_1", "10.0", 1024, 60)
    code, out = node.prepare(job(threads=240, memory=8192), starter=starter)
    assert code == 0 and env_of(out)["OMP_NUM_THREADS"] == "60" and ads.ad_get(out, "CoSchedDeviceUnits") == "0-59"
    assert node.agent.reply(next(iter(node.agent.records.values())))["memory_mb"] == 1024


def test_a_request_given_as_an_expression_is_the_startds_to_evaluate(node: Node):
    # the hook cannot evaluate it; the startd did, into the claim's allocation
    starter = node.claim("slot2_1", "10.0", 1024, 8)
    code, out = node.prepare(job(threads="RequestCpus * 8", memory="1024 * 1"), starter=starter)
    assert code == 0 and node.asked == [str(node.state)] and env_of(out)["OMP_NUM_THREADS"] == "8"


def test_co_running_jobs_get_disjoint_hardware_threads(node: Node):
    first = node.claim("slot2_1", "10.0", 1000, 60)
    assert node.prepare(job(10, threads=60), starter=first)[0] == 0
    _, second = node.prepare(job(11, threads=118), "slot2_2", node.claim("slot2_2", "11.0", 1000, 118))
    _, other_device = node.prepare(job(12, threads=8), "slot3_1", node.claim("slot3_1", "12.0", 1000, 8))
    assert env_of(second)["COSCHED_DEVICE_CORES"] == "15-44"        # 29 cores and 2 threads of core 44
    assert env_of(second)["COSCHED_DEVICE_THREADS"] == "60-177"
    assert env_of(other_device)["COSCHED_DEVICE_CORES"] == "0-1" and env_of(other_device)["COSCHED_DEVICE"] == "mic1"
    first.end()                                                      # job 10 ended: its threads are free
    node.view.drop("10.0")
    _, third = node.prepare(job(13, threads=40), "slot2_3", node.claim("slot2_3", "13.0", 1000, 40))
    assert env_of(third)["COSCHED_DEVICE_CORES"] == "0-9"
    _, fourth = node.prepare(job(14, threads=20), "slot2_4", node.claim("slot2_4", "14.0", 1000, 20))
    assert env_of(fourth)["COSCHED_DEVICE_CORES"] == "10-14"
    _, fifth = node.prepare(job(15, threads=2), "slot2_5", node.claim("slot2_5", "15.0", 1000, 2))
    assert env_of(fifth)["COSCHED_DEVICE_THREADS"] == "178-179"      # the 2 threads left on core 44
    assert env_of(fifth)["MIC_KMP_AFFINITY"] == "granularity=fine,explicit,proclist=[179-180]"
    assert "job 10.0 on mic0 ended: units 0-59 released" in node.log()
    assert "10.0" not in node.units()


def test_asking_again_gives_the_same_placement(node: Node):
    starter = node.claim("slot2_1", "10.0", 1000, 60)
    node.prepare(job(9, threads=4), "slot2_2", node.claim("slot2_2", "9.0", 1000, 4))
    first = node.prepare(job(10), starter=starter)
    assert first[0] == 0 and node.prepare(job(10), starter=starter) == first
    assert ads.ad_get(first[1], "CoSchedDeviceUnits") == "4-63"


def test_oversubscribing_start_goes_back_to_idle_with_a_reason_users_can_read(node: Node):
    assert node.prepare(job(20, threads=100, memory=6000), starter=node.claim("slot2_1", "20.0", 6000, 100))[0] == 0
    refused = node.claim("slot2_2", "21.0", 4000, 100)
    code, out = node.prepare(job(21, threads=100, memory=4000), "slot2_2", refused)
    # HookStatusCode >= 300: HTCondor sends the job back to Idle, the message in VacateReason
    assert code == errors.EXIT_OVERSUBSCRIBED == 3 and ads.ad_get(out, "HookStatusCode") == 303
    assert ads.ad_get(out, "HookStatusMessage") == (
        "condor_sched: device node1/mic0 (slot2_2) is full: device memory 6000+4000 MB > 8192 MB on mic0 "
        "(running jobs + this one); back to idle for a new plan")
    assert set(out) == {"hookstatuscode", "hookstatusmessage"}
    assert "job 21.0: start refused (caller pid " in node.log()
    assert "device memory 6000+4000 MB > 8192 MB on mic0" in node.log()
    refused.end()                 # the starter of a refused start exits; the startd drops its claim
    node.view.drop("21.0")
    code, out = node.prepare(job(22, threads=160, memory=100), "slot2_3", node.claim("slot2_3", "22.0", 100, 160))
    assert code == errors.EXIT_OVERSUBSCRIBED
    assert "device PhiThreads 100+160 > 240 on mic0" in ads.ad_get(out, "HookStatusMessage")
    assert {job: units for job, units in node.units().items() if units} == {"20.0": ((0, 100),)}


def test_refusal_lines_are_exactly_what_htcondor_reads(node: Node):
    node.prepare(job(20, threads=240, memory=100), starter=node.claim("slot2_1", "20.0", 100, 240))
    ad = node.machine_ad('Name = "slot2_2@node1@node1.cosched.test"\n')
    out = io.StringIO()
    assert prepare_job.main(node.hook_args, stdin=io.BytesIO(job(21, threads=4).encode()), stdout=out, env=node.env(ad),
                            ask=node.ask_for(node.claim("slot2_2", "21.0", 100, 4))) == errors.EXIT_OVERSUBSCRIBED
    first, second = out.getvalue().splitlines()
    assert first == "HookStatusCode = 303"
    assert second.startswith('HookStatusMessage = "condor_sched: device node1/mic0 (slot2_2) is full: '
                             'device PhiThreads 240+4 > 240 on mic0 ')


def test_a_claim_larger_than_the_device_is_refused(node: Node):
    assert node.prepare(job(threads=241), starter=node.claim("slot2_1", "10.0", 100, 241))[0] == \
        errors.EXIT_OVERSUBSCRIBED
    assert node.prepare(job(threads=4, memory=8193), "slot2_2",
                        node.claim("slot2_2", "11.0", 8193, 4))[0] == errors.EXIT_OVERSUBSCRIBED
    assert all(units is None for units in node.units().values())


def test_a_start_the_startd_does_not_report_goes_back_to_idle(node: Node):
    unclaimed = node.starters.job()           # a starter the startd reports no claim for
    code, out = node.prepare(job(), starter=unclaimed)
    assert code == errors.EXIT_NO_STATE and ads.ad_get(out, "HookStatusCode") == 305
    assert ads.ad_get(out, "HookStatusMessage") == (
        f"condor_sched: start refused: the startd reports no claim for starter {unclaimed.pid}; "
        "back to idle for a new plan")
    assert node.agent.records == {} and not (node.state / "jobs.json").exists()


def test_a_reply_for_another_device_than_the_slots_is_refused(node: Node):
    # the machine ad says slot2 (mic0), the startd's claim of this starter is on mic1
    code, out = node.prepare(job(), "slot2_1", node.claim("slot3_1", "10.0", 100, 4))
    assert code == errors.EXIT_NO_STATE and ads.ad_get(out, "HookStatusCode") == 305
    assert "does not know this start as one on mic0" in ads.ad_get(out, "HookStatusMessage")


def test_a_slot_of_another_node_is_a_config_error(node: Node):
    def prepare(name: str) -> tuple[int, dict]:
        out = io.StringIO()
        code = prepare_job.main(node.hook_args, stdin=io.BytesIO(job().encode()), stdout=out,
                                env=node.env(node.machine_ad(f'Name = "{name}"\n')), ask=node.ask_for(None))
        return code, ads.parse_classad(out.getvalue())

    assert prepare("slot2_1@node2@node2.cosched.test#")[0] == errors.EXIT_BAD_AD
    code, out = prepare("slot2_1@node2@node2.cosched.test")
    assert code == errors.EXIT_BAD_CONFIG and ads.ad_get(out, "HookStatusCode") == 2
    assert "slot slot2_1@node2@node2.cosched.test is not on node node1" in ads.ad_get(out, "HookStatusMessage")
    assert node.asked == []


def test_non_device_jobs_get_nothing(node: Node):
    assert node.prepare(job(threads=None, memory=None, extra="RequestCpus = 1"), "slot1_1") == (0, {})
    assert node.prepare(job(threads=None, memory=None), "slot2_1") == (0, {})
    assert node.prepare(job(threads=8, memory=0), "slot2_1") == (0, {})      # compute but no memory: no device job
    assert node.asked == [] and node.agent.records == {}


@pytest.mark.parametrize("job_ad, slot, extra_machine, why", [
    (job(threads='"1; rm -rf /"'), "slot2_1", "", "RequestPhiThreads"),
    (job(threads=10 ** 30), "slot2_1", "", "RequestPhiThreads = huge is outside [1, 100000]"),
    (job(threads=-4), "slot2_1", "", "RequestPhiThreads = -4 is outside"),
    (job(threads=2.5), "slot2_1", "", "RequestPhiThreads = 2.5 is not a"),
    (job(threads=None), "slot2_1", "", "RequestPhiThreads is missing"),
    (job(memory=10 ** 30), "slot2_1", "", "RequestPhiMemory = huge"),
    (job(memory=-1), "slot2_1", "", "RequestPhiMemory = -1"),
    (job(threads=0, memory=100), "slot2_1", "", "RequestPhiThreads = 0 is outside"),
    (job().replace("ClusterId = 10", 'ClusterId = "../../etc"'), "slot2_1", "", "ClusterId"),
    (job().replace("ClusterId = 10", "ClusterId = 10.5"), "slot2_1", "", "ClusterId = 10.5"),
    (job().replace("ProcId = 0\n", ""), "slot2_1", "", "ProcId"),
    (job().encode() + b'Environment = "A=\xff"\n', "slot2_1", "", "not UTF-8"),
    (job(extra="Environment = \"A='open\""), "slot2_1", "", "unbalanced single quote"),
    (job(extra="Environment = 7"), "slot2_1", "", "Environment is not a string"),
    (job(), "slot2_1@../../etc/passwd", "", "machine ad"),
    (job(), "slot9_1", "", "slot id 9 of slot9_1 is not in the node config"),
    (job(), "slot2_1", 'PhiDeviceName = "../mic0"', "PhiDeviceName has a disallowed value"),
    (job(), "slot2_1", 'PhiDeviceName = "mic1"', "names device mic1"),
])
def test_hostile_values_are_held_before_the_agent_is_asked(node: Node, capsys, job_ad, slot, extra_machine, why):
    code, out = node.prepare(job_ad, slot, extra_machine=extra_machine)
    # held (HookStatusCode 4 < 300), the reason readable in HoldReason
    assert code == errors.EXIT_BAD_AD and ads.ad_get(out, "HookStatusCode") == errors.EXIT_BAD_AD
    assert set(out) == {"hookstatuscode", "hookstatusmessage"}
    message = ads.ad_get(out, "HookStatusMessage")
    assert message.startswith("condor_sched: malformed job or machine ad: ") and why in message, message
    assert len(message) <= ads.MAX_HOOK_MESSAGE and "\\" not in message
    assert all(32 <= ord(ch) < 127 for ch in message)
    assert node.asked == [] and node.agent.records == {}
    assert "Traceback" not in capsys.readouterr().err


def test_device_name_comes_from_the_slot_ad_when_present(node: Node):
    starter = node.claim("slot3_1", "10.0", 100, 4, PhiDeviceName="mic1")
    code, out = node.prepare(job(threads=4), "slot3_1", starter, extra_machine='PhiDeviceName = "mic1"')
    assert code == 0 and env_of(out)["COSCHED_DEVICE"] == "mic1" and env_of(out)["OFFLOAD_DEVICES"] == "1"


def test_bad_config_and_an_unreachable_agent_have_their_own_codes(node: Node):
    ad = node.machine_ad('Name = "slot2_1@node1@node1.cosched.test"\n')
    env = node.env(ad)
    missing = ["--node-config", str(node.root / "missing.json"), "--state-dir", str(node.state)]
    out = io.StringIO()
    assert prepare_job.main(missing, stdin=io.BytesIO(job().encode()), stdout=out, env=env) == errors.EXIT_BAD_CONFIG
    status = ads.parse_classad(out.getvalue())
    assert ads.ad_get(status, "HookStatusCode") == errors.EXIT_BAD_CONFIG        # held: no replan fixes it
    assert ads.ad_get(status, "HookStatusMessage").startswith("condor_sched: bad node config: node config ")
    for bad_args in (["--node-config"], ["--bogus", "x"]):
        out = io.StringIO()
        assert prepare_job.main(bad_args, stdin=io.BytesIO(job().encode()), stdout=out, env=env) \
            == errors.EXIT_BAD_CONFIG
        assert "hook argument" in ads.ad_get(ads.parse_classad(out.getvalue()), "HookStatusMessage")
    # no agent listens in this state dir: the real channel cannot connect
    no_agent = ["--node-config", str(node.config_path), "--state-dir", str(node.root / "no-agent")]
    out = io.StringIO()
    assert prepare_job.main(no_agent, stdin=io.BytesIO(job().encode()), stdout=out, env=env) == errors.EXIT_NO_STATE
    status = ads.parse_classad(out.getvalue())
    assert ads.ad_get(status, "HookStatusCode") == 305                          # back to idle: a replan may
    assert "node agent unavailable" in ads.ad_get(status, "HookStatusMessage")
    assert "is the node agent running?" in ads.ad_get(status, "HookStatusMessage")


def test_the_hook_refuses_a_node_config_a_user_could_have_written(node: Node, tmp_path: Path):
    """The node config decides what a job is given: one not owned by root, writable by group or
    others, or in a directory others can write is refused (held with the reason), whatever it says."""
    ad = node.machine_ad('Name = "slot2_1@node1@node1.cosched.test"\n')

    def refusal(path: Path) -> str:
        out = io.StringIO()
        args = ["--node-config", str(path), "--state-dir", str(node.state)]
        assert prepare_job.main(args, stdin=io.BytesIO(job().encode()), stdout=out, env=node.env(ad)) \
            == errors.EXIT_BAD_CONFIG
        return ads.ad_get(ads.parse_classad(out.getvalue()), "HookStatusMessage")

    owned = tmp_path / "owned"
    owned.mkdir()
    config_file = owned / "node.json"
    config_file.write_text(node.config_path.read_text())
    os.chown(config_file, 2001, 2001)
    assert "not owned by root" in refusal(config_file)
    os.chown(config_file, 0, 0)
    os.chmod(config_file, 0o664)
    assert "writable by group or others" in refusal(config_file)
    os.chmod(config_file, 0o644)
    os.chmod(owned, 0o777)
    assert f"directory {owned} is not owned by root" in refusal(config_file)
    os.chmod(owned, 0o755)
    linked = tmp_path / "link.json"
    linked.symlink_to(config_file)              # a root-owned link to a good config is followed
    assert config.load_node_config(str(linked)).node == "node1"


def test_hook_runs_under_the_system_python_without_tracebacks(node: Node):
    ad = node.machine_ad('Name = "slot2_1@node1@node1.cosched.test"\n')
    hook = [SYSTEM_PYTHON, "-Es", str(HOOKS / "cosched_prepare_job.py"), *node.hook_args]
    env = dict(node.env(ad), PATH="/usr/bin:/bin")
    bad = subprocess.run(hook, input=b"\xff\xfe garbage = = =\n", env=env, capture_output=True, timeout=60)
    assert bad.returncode == errors.EXIT_BAD_AD and b"Traceback" not in bad.stderr
    status = ads.parse_classad(bad.stdout)
    assert ads.ad_get(status, "HookStatusCode") == errors.EXIT_BAD_AD
    assert "not UTF-8" in ads.ad_get(status, "HookStatusMessage")
    nothing = subprocess.run(hook, input=job(threads=None, memory=None).encode(), env=env, capture_output=True,
                             timeout=60)
    assert (nothing.returncode, nothing.stdout, nothing.stderr) == (0, b"", b"")
    no_agent = subprocess.run(hook, input=job().encode(), env=env, capture_output=True, timeout=60)
    assert no_agent.returncode == errors.EXIT_NO_STATE and b"Traceback" not in no_agent.stderr
    assert ads.ad_get(ads.parse_classad(no_agent.stdout), "HookStatusCode") == 305


# --------------------------------------------------------------------------------------- probes

MICSMC_SAMPLE = """\
mic0 (freq):
   Core Frequency: ....... 1.24 GHz
   Total Power: .......... 115.00 Watts
mic0 (mem):
   Free Memory: .......... 15236.59 MB
   Total Memory: ......... 15513.71 MB
   Memory Usage: ......... 277.12 MB
mic1 (mem):
   Free Memory: .......... 7000.00 MB
   Total Memory: ......... 7696.00 MB
   Memory Usage: ......... 696.00 MB
"""


def test_micsmc_output_is_parsed_per_device():
    parsed = memory_watch.parse_micsmc(MICSMC_SAMPLE)
    assert parsed["mic0"] == {"free_mb": 15236.59, "total_mb": 15513.71, "used_mb": 277.12}
    assert parsed["mic1"]["used_mb"] == 696.0
    assert memory_watch.parse_micsmc("garbage\n\x00\n") == {}


def test_file_probe_ignores_hostile_readings(tmp_path: Path):
    (tmp_path / "mic0").mkdir()
    (tmp_path / "mic0" / "1.0").write_text("12; rm -rf /")
    (tmp_path / "mic0" / "2.0").write_text(" 512\n")
    (tmp_path / "mic0" / "4.0").symlink_to(tmp_path / "mic0" / "2.0")
    probe = memory_watch.FileProbe(str(tmp_path))
    assert probe.job_usage_mb("mic0", 1, 0) is None and probe.job_usage_mb("mic0", 2, 0) == 512
    assert probe.job_usage_mb("../mic0", 2, 0) is None and probe.job_usage_mb("mic0", 3, 0) is None
    assert probe.job_usage_mb("mic0", 4, 0) is None                       # a symlink is not followed


def test_a_job_is_over_its_limit_only_when_measured_above_it():
    assert memory_watch.over_limit(1025, 1024) and not memory_watch.over_limit(1024, 1024)
    assert not memory_watch.over_limit(None, 0)
    with pytest.raises(errors.ConfigError):
        memory_watch.make_probe("file", None)


# --------------------------------------------------------------------------------------- the cron

MICINFO_SAMPLE = """\
MicInfo Utility Log
Created Mon Jan 12 10:01:05 2015

\tSystem Info
\t\tHOST OS\t\t\t: Linux
\t\tMPSS Version\t\t: 3.4.1

Device No: 0, Device Name: mic0

\tBoard
\t\tCoprocessor Stepping \t : C0
\t\tBoard SKU \t\t : C0PRQ-7120 P/A/X/D
\t\tECC Mode \t\t : Enabled

\tCores
\t\tTotal No of Active Cores : 61
\t\tFrequency\t\t : 1238095 kHz

\tGDDR
\t\tGDDR Size\t\t : 15872 MB

Device No: 1, Device Name: mic1

\tBoard
\t\tBoard SKU \t\t : C0PRQ-3120 "P"
\tCores
\t\tTotal No of Active Cores : 57
"""


def test_micinfo_output_is_parsed_per_device():
    parsed = cron.parse_micinfo(MICINFO_SAMPLE)
    assert parsed["mic0"] == {"model": "C0PRQ-7120 P/A/X/D", "active_cores": 61, "memory_mb": 15872}
    assert parsed["mic1"] == {"model": "C0PRQ-3120 P", "active_cores": 57}


def test_cron_prints_valid_classad_lines(node: Node):
    assert node.prepare(job(50), starter=node.claim("slot2_1", "50.0", 1024, 60))[0] == 0
    (node.probe / "mic0").mkdir(parents=True)
    (node.probe / "mic0" / "50.0").write_text("700")
    node.agent.tick()
    out = io.StringIO()
    args = ["--node-config", str(node.config_path), "--state-dir", str(node.state)]
    assert cron.main(args, stdout=out, micinfo_text=None) == 0
    lines = out.getvalue().splitlines()
    assert all(" = " in line for line in lines)
    ad = ads.parse_classad(out.getvalue())
    assert ads.ad_get(ad, "CoSchedNodeConfigOK") is True and ads.ad_get(ad, "CoSchedNodeAgentAlive") is True
    assert ads.ad_get(ad, "CoSchedDeviceModels") == "emulated"
    assert ads.ad_get(ad, "CoSchedPhiUsedMemory_mic0") == 700
    assert ads.ad_get(ad, "CoSchedPhiAllocatedMemory_mic0") == 1024
    assert ads.ad_get(ad, "CoSchedPhiAllocatedThreads_mic0") == 60
    assert ads.ad_get(ad, "CoSchedPhiBusyCores_mic0") == 15 and ads.ad_get(ad, "CoSchedPhiJobs_mic0") == 1
    assert ads.ad_get(ad, "CoSchedPhiJobs_mic1") == 0 and ads.ad_get(ad, "CoSchedPhiUsedMemory_mic1") is None
    out = io.StringIO()
    assert cron.main(args + ["--max-age", "0"], stdout=out, micinfo_text=MICINFO_SAMPLE) == 0
    ad = ads.parse_classad(out.getvalue())
    assert ads.ad_get(ad, "CoSchedDeviceModels") == "mic0=C0PRQ-7120 P/A/X/D,mic1=C0PRQ-3120 P"
    later = cron.facts(config.load_node_config(str(node.config_path)), str(node.state), None, 180, time.time() + 1000)
    assert "CoSchedNodeAgentAlive = false" in later


def test_cron_reports_a_dead_agent_and_the_last_kill(node: Node):
    state.write_json_atomic(str(node.state), "agent.heartbeat", {"time": time.time() - 1000})
    state.write_json_atomic(str(node.state / "killed"), "7.0.json",
                            {"job": "7.0", "reason": 'used 9 MB > 1 MB "x"', "time": time.time()})
    state.write_json_atomic(str(node.state / "killed"), "6.0.json",
                            {"job": "6.0", "reason": "older", "time": time.time() - 50})
    out = io.StringIO()
    assert cron.main(["--node-config", str(node.config_path), "--state-dir", str(node.state)],
                     stdout=out, micinfo_text=None) == 0
    ad = ads.parse_classad(out.getvalue())
    assert ads.ad_get(ad, "CoSchedNodeAgentAlive") is False
    assert ads.ad_get(ad, "CoSchedLastKill") == "7.0 used 9 MB  1 MB x"
    assert ads.ad_get(ad, "CoSchedNodeVersion") == cosched_node.__version__ == condor_sched.__version__
    assert not any(k.startswith("CoSchedOverLimit") for k in ad)       # records without a slot name none


def test_cron_publishes_each_stopped_jobs_reason_on_its_slot_for_the_startds_hold(node: Node):
    """CoSchedOverLimit_<slot> = "<job> <reason>" from the agent's records of the last hour:
    the newest per slot; a slot or job name the agent does not write, or an old record, none."""
    now = time.time()
    for name, record in {"30.0": {"slot": "slot2_1", "reason": "device memory use 1500 MB on mic0 exceeds its "
                                                                 "allocation of 1024 MB", "time": now - 5},
                         "29.0": {"slot": "slot2_1", "reason": "older", "time": now - 50},
                         "31.0": {"slot": "slot2_2", "reason": "long ago", "time": now - 7200},
                         "32.0": {"slot": "slot2_3\nSTART = true", "reason": "hostile", "time": now}}.items():
        state.write_json_atomic(str(node.state / "killed"), f"{name}.json", {"job": name, **record})
    lines = cron.facts(config.load_node_config(str(node.config_path)), str(node.state), None, 180, now)
    over = [line for line in lines if line.startswith("CoSchedOverLimit")]
    assert over == ['CoSchedOverLimit_slot2_1 = "30.0 device memory use 1500 MB on mic0 exceeds its allocation '
                    'of 1024 MB"']


def test_cron_with_a_bad_config_says_so(tmp_path: Path):
    bad = tmp_path / "bad.json"
    bad.write_bytes(b"\xff{")
    out = io.StringIO()
    assert cron.main(["--node-config", str(bad)], stdout=out) == errors.EXIT_BAD_CONFIG
    assert out.getvalue() == "CoSchedNodeConfigOK = false\n"


# --------------------------------------------------------------------------------------- the agent program

def agent_args(node: Node, condor_status: Path, address: Path, *extra: str) -> list[str]:
    return ["--node-config", str(node.config_path), "--state-dir", str(node.state), "--startd-address-file",
            str(address), "--condor-status", str(condor_status), "--probe", "file", "--probe-dir", str(node.probe),
            "--perf", "", *extra]


def test_agent_once_reads_the_startds_claims_and_publishes_them(node: Node, tmp_path: Path):
    starter = node.starters.job()
    script, address, argv_log = fake_condor_status(tmp_path, [device_ad("slot2_1", "10.0", starter.pid, 1024, 60)])
    assert agent.main(agent_args(node, script, address, "--once")) == 0
    argv = json.loads(argv_log.read_text().splitlines()[0])
    assert argv[:4] == ["-direct", "<127.0.0.1:9618?addrs=127.0.0.1-9618&alias=node1.cosched.test>", "-json",
                        "-attributes"]
    assert {"StarterPid", "JobId", "PhiMemory", "PhiThreads", "PhiDeviceName", "LLCWays"} <= set(argv[4].split(","))
    published = json.loads((node.state / "devices" / "mic0.json").read_text())
    assert published["allocated_mb"] == 1024 and published["jobs"][0]["job"] == "10.0"
    assert json.loads((node.state / "agent.heartbeat").read_text())["time"] > time.time() - 60
    assert stat.S_ISSOCK(os.lstat(node.state / "agent.sock").st_mode)


def test_agent_stops_cleanly_on_sigterm(node: Node, tmp_path: Path):
    script, address, _ = fake_condor_status(tmp_path, [])
    proc = subprocess.Popen([SYSTEM_PYTHON, "-Es", str(HOOKS / "cosched_node_agent.py"),
                             *agent_args(node, script, address, "--interval", "0.2")],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        wait_for(lambda: (node.state / "agent.heartbeat").exists(), "the agent's first heartbeat")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == 0
        assert b"Traceback" not in proc.stderr.read()
        assert "stopped" in (node.state / "agent.log").read_text().splitlines()[-1]
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()


def test_agent_refuses_an_unsafe_state_dir_and_bad_arguments(node: Node, tmp_path: Path, capsys):
    script, address, _ = fake_condor_status(tmp_path, [])
    unsafe = tmp_path / "unsafe"
    unsafe.mkdir()
    os.chmod(unsafe, 0o777)
    args = agent_args(node, script, address, "--once")
    assert agent.main(args + ["--state-dir", str(unsafe)]) == errors.EXIT_NO_STATE
    assert "must be a directory owned by uid" in capsys.readouterr().err
    assert agent.main(["--probe", "bogus"]) == errors.EXIT_BAD_CONFIG
    assert agent.main(agent_args(node, script, address, "--once", "--interval", "0")) == errors.EXIT_BAD_CONFIG
    no_dir = ["--node-config", str(node.config_path), "--state-dir", str(tmp_path / "s2"),
              "--startd-address-file", str(address), "--probe", "file", "--once"]
    assert agent.main(no_dir) == errors.EXIT_BAD_CONFIG                    # --probe file needs --probe-dir
    assert agent.main(["--node-config", str(tmp_path / "missing.json"), "--startd-address-file", str(address),
                       "--once"]) == errors.EXIT_BAD_CONFIG
