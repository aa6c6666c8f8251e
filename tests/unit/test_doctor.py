"""condor-sched doctor: a well-configured host of each role passes, and every planted fault is
found, named and given its fix. No pool: the knobs are what htcondor2 reads from the shipped
snippets (once, in a subprocess), the files live under tmp_path, the ads are dicts."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

import click
import pytest
from click.testing import CliRunner
from cosched_node import describe, hardware
from test_describe_node import FQDN, fake_node

from condor_sched import __version__, doctor
from condor_sched.doctor_checks import Account, HostView, permits, snippet_assignments
from condor_sched.doctor_command import doctor as doctor_command
from condor_sched.install import install_node_hooks
from condor_sched.resources import config_d_dir

#: The node programs trust only root's files, and the faults are planted with chown.
pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root: root-owned node config and hooks, chown")
NOW = 1_700_000_000.0
#: A non-root account with a group of its own, for the sidecar's COSCHED_SIDECAR_USERID.
COSCHED = Account("cosched", 4242, frozenset({4243}))
TRANSFORMS = ("CoSchedPin", "CoSchedSpread", "CoSchedMalleable", "CoSchedGPU", "CoSchedGPUClear")
KNOBS = ("DAEMON_LIST", "START", "JOB_TRANSFORM_NAMES", "PROTECTED_JOB_ATTRS", "MAX_CONCURRENT_UPLOADS",
         "MAX_CONCURRENT_UPLOADS_PER_USER", "STARTER_DEFAULT_JOB_HOOK_KEYWORD", "COSCHED_HOOK_PREPARE_JOB",
         "COSCHED_HOOK_PREPARE_JOB_ARGS", "STARTD_CRON_JOBLIST", "COSCHED_NODE_HOOKS", "COSCHED_SIDECAR",
         "COSCHED_SIDECAR_ARGS", "COSCHED_LOG", *(f"JOB_TRANSFORM_{t}" for t in TRANSFORMS))


def accounts(spec: str) -> Account:
    if spec == COSCHED.name:
        return COSCHED
    raise KeyError(spec)


@pytest.fixture(scope="module")
def shipped_param(tmp_path_factory) -> dict[str, str]:
    """The knobs of a host with every shipped snippet, as htcondor2 reads them."""
    directory = tmp_path_factory.mktemp("condor")
    (directory / "condor_config").write_text(f"DAEMON_LIST = MASTER, SCHEDD, STARTD\nLOG = {directory}\n"
                                             f"LOCAL_CONFIG_DIR = {config_d_dir()}\n")
    program = ("import htcondor2, json, sys\n"
               "print(json.dumps({k: str(htcondor2.param.get(k)) for k in sys.argv[1:] "
               "if htcondor2.param.get(k) is not None}))")
    env = {k: v for k, v in os.environ.items() if not k.startswith("_CONDOR_")}
    env["CONDOR_CONFIG"] = str(directory / "condor_config")
    out = subprocess.run([sys.executable, "-c", program, *KNOBS], env=env, capture_output=True, text=True,
                         timeout=120, check=True)
    return json.loads(out.stdout)


@pytest.fixture
def public_dir():
    """A directory every account may search (pytest's tmp_path is root's alone)."""
    path = Path(tempfile.mkdtemp(prefix="doctor-"))
    os.chmod(path, 0o755)
    yield path
    shutil.rmtree(path)


@pytest.fixture
def host(tmp_path: Path, public_dir: Path, shipped_param: dict[str, str]) -> HostView:
    """A well-configured host of every role: schedd, condor_sched execute node, sidecar."""
    hooks = public_dir / "libexec"
    install_node_hooks(hooks)
    root = fake_node(tmp_path / "root")
    hw = hardware.probe_hardware(str(root), "none", None, "none", lambda _m: None)
    config = describe.build_config(hw, describe.Overrides(mem_bw_gbs=(60.0,), state_dir=str(tmp_path / "state")),
                                   FQDN, lambda _m: None)
    node_config = tmp_path / "etc" / "node.json"
    node_config.parent.mkdir()
    node_config.write_text(json.dumps(config))
    node_config.chmod(0o644)
    (tmp_path / "state").mkdir(mode=0o755)
    (tmp_path / "state" / "agent.heartbeat").write_text(json.dumps({"time": NOW - 5}))
    launcher = public_dir / "bin" / "condor-sched"
    launcher.parent.mkdir(mode=0o755)
    launcher.write_text(f"#!{sys.executable}\nimport sys\nfrom condor_sched.cli import main\nsys.exit(main())\n")
    launcher.chmod(0o755)
    (tmp_path / "log").mkdir()
    param = {**shipped_param, "FULL_HOSTNAME": FQDN, "COSCHED_NODE_HOOKS": str(hooks),
             "COSCHED_HOOK_PREPARE_JOB": str(hooks / "cosched_prepare_job.py"),
             "COSCHED_HOOK_PREPARE_JOB_ARGS": f"--node-config {node_config}",
             "COSCHED_SIDECAR": str(launcher), "COSCHED_LOG": str(tmp_path / "log" / "CoSchedLog")}
    sidecar_ad = {"MyType": "CoSchedSidecar", "Name": "cosched@cm.example.org", "Machine": "cm.example.org",
                  "LastHeardFrom": int(NOW) - 20, "ClassAdLifetime": 210, "CoSchedVersion": __version__,
                  "CoSchedConfigError": "", "CoSchedLastError": ""}
    node_ads = [{"Machine": FQDN, "Name": f"slot{k}@{FQDN}", "CoSchedNodeVersion": __version__} for k in (1, 2)]
    return HostView(param=param, query_ads=fake_collector([sidecar_ad], node_ads), host=FQDN,
                    hardware_root=str(root), clock=lambda: NOW, accounts=accounts, nvidia_smi="none", micinfo="none")


def fake_collector(sidecars: list[dict], nodes: list[dict]):
    return lambda kind: {"CoSchedSidecar": sidecars, "CoSchedNode": nodes}[kind]


def with_knobs(view: HostView, **knobs: str | None) -> HostView:
    """``view`` with knobs set, or removed where None."""
    param = {**view.param, **knobs}
    return replace(view, param={k: v for k, v in param.items() if v is not None})


def problems(view: HostView, roles=None) -> dict[str, doctor.Finding]:
    return {f.what: f for f in doctor.diagnose(view, roles).problems}


def only_problem(view: HostView, roles=None) -> doctor.Finding:
    found = problems(view, roles)
    assert len(found) == 1, found
    return next(iter(found.values()))


# ---- well-configured hosts ----------------------------------------------------------------

def test_a_host_of_every_role_passes_and_says_what_it_checked(host: HostView):
    report = doctor.diagnose(host)
    assert report.roles == ("schedd", "execute", "sidecar") and report.ok, report.text()
    whats = [f.what for f in report.findings]
    assert "schedd offers MAX_CONCURRENT_UPLOADS_PER_USER" in whats
    assert [w for w in whats if w.startswith("schedd transform ")] == [f"schedd transform JOB_TRANSFORM_{t}"
                                                                       for t in TRANSFORMS]
    assert {"execute STARTER_DEFAULT_JOB_HOOK_KEYWORD", "execute DAEMON_LIST", "sidecar lease (CoSchedSidecar ad)",
            "versions"} <= set(whats)
    assert any(w.startswith("node config ") for w in whats) and any(w.startswith("node agent heartbeat") for w in whats)
    assert report.text().splitlines()[-1] == f"doctor: {FQDN} (schedd, execute, sidecar): {len(whats)} ok, 0 problems"


@pytest.mark.parametrize("role", ["schedd", "execute", "sidecar"])
def test_a_host_of_one_role_passes(host: HostView, role: str):
    daemons = {"schedd": "SCHEDD", "execute": "STARTD COSCHED_NODE_AGENT", "sidecar": "COSCHED_SIDECAR"}[role]
    report = doctor.diagnose(with_knobs(host, DAEMON_LIST=f"MASTER, {daemons}"))
    assert report.roles == (role,) and report.ok, report.text()


def test_roles_come_from_daemon_list_and_role_forces_them(host: HostView):
    bare = with_knobs(host, DAEMON_LIST="MASTER COLLECTOR NEGOTIATOR")
    assert doctor.host_roles(bare) == []
    report = doctor.diagnose(bare)
    assert report.roles == () and report.findings[0].what == "host roles" and report.ok
    assert doctor.diagnose(bare, ["sidecar"]).roles == ("sidecar",)


def test_an_account_in_the_files_group_may_write_it(tmp_path: Path):
    path = tmp_path / "f"
    path.write_text("")
    os.chown(path, 0, 4243)
    path.chmod(0o664)
    assert permits(path.stat(), COSCHED, 2)
    path.chmod(0o644)
    assert not permits(path.stat(), COSCHED, 2)


# ---- 1. the sidecar's program ------------------------------------------------------------

def test_a_sidecar_path_that_does_not_exist(host: HostView, tmp_path: Path):
    finding = only_problem(with_knobs(host, COSCHED_SIDECAR=str(tmp_path / "venv/bin/condor-sched")))
    assert finding.what == f"sidecar program COSCHED_SIDECAR = {tmp_path}/venv/bin/condor-sched"
    assert finding.why == "No such file or directory" and "condor-sched config 50-cosched-sidecar.conf" in finding.fix


def test_a_sidecar_that_is_not_executable_or_not_condor_sched(host: HostView):
    launcher = Path(host.knob("COSCHED_SIDECAR"))
    launcher.chmod(0o644)
    finding = only_problem(host)
    assert "root cannot read and execute it" in finding.why and finding.fix == f"chmod 755 {launcher}"
    launcher.write_text("#!/bin/sh\nexec true\n")
    launcher.chmod(0o755)
    assert "does not start condor-sched" in only_problem(host).why
    launcher.write_text("#!/opt/gone/bin/python\nfrom condor_sched.cli import main\n")
    assert "interpreter /opt/gone/bin/python is missing" in only_problem(host).why


def test_a_sidecar_its_account_cannot_reach(host: HostView, public_dir: Path):
    launcher = public_dir / "private" / "condor-sched"
    launcher.parent.mkdir(mode=0o700)
    shutil.copy(host.knob("COSCHED_SIDECAR"), launcher)
    (public_dir / "log").mkdir()
    os.chown(public_dir / "log", COSCHED.uid, 0)   # the log's directory is the account's
    view = with_knobs(host, COSCHED_SIDECAR=str(launcher), COSCHED_SIDECAR_USERID="cosched",
                      COSCHED_LOG=str(public_dir / "log" / "CoSchedLog"))
    finding = only_problem(view)
    assert finding.why == f"cosched cannot search directory {launcher.parent} (owner 0:0, mode 0700)"
    launcher.parent.chmod(0o755)
    assert doctor.diagnose(view).ok


def test_sidecar_arguments_must_say_run(host: HostView):
    finding = only_problem(with_knobs(host, COSCHED_SIDECAR_ARGS="plan"))
    assert finding.what == "sidecar arguments COSCHED_SIDECAR_ARGS = plan" and "COSCHED_SIDECAR_ARGS = run" in finding.fix


# ---- 2. the sidecar's log ------------------------------------------------------------------

def test_a_log_left_by_root_is_not_writable_by_the_sidecar_account(host: HostView, public_dir: Path):
    log_dir = public_dir / "log"
    log_dir.mkdir()
    os.chown(log_dir, COSCHED.uid, COSCHED.uid + 1)
    (log_dir / "CoSchedLog").write_text("")
    (log_dir / "CoSchedLog").chmod(0o644)
    view = with_knobs(host, COSCHED_SIDECAR_USERID="cosched", COSCHED_LOG=str(log_dir / "CoSchedLog"))
    finding = only_problem(view)
    assert finding.what == f"sidecar log COSCHED_LOG = {log_dir}/CoSchedLog"
    assert "cosched (COSCHED_SIDECAR_USERID) cannot write it" in finding.why and "owner 0:0, mode 0644" in finding.why
    assert finding.fix == (f"chown cosched {log_dir}/CoSchedLog; until then the sidecar logs to "
                           f"{log_dir}/CoSchedLog.cosched beside it")
    os.chown(log_dir / "CoSchedLog", 0, COSCHED.uid + 1)   # the account's group may write it
    (log_dir / "CoSchedLog").chmod(0o664)
    assert doctor.diagnose(view).ok


def test_a_log_whose_directory_the_account_cannot_search_or_write(host: HostView, public_dir: Path):
    log_dir = public_dir / "log"
    log_dir.mkdir(mode=0o700)
    view = with_knobs(host, COSCHED_SIDECAR_USERID="cosched", COSCHED_LOG=str(log_dir / "CoSchedLog"))
    finding = only_problem(view)
    assert f"cannot search directory {log_dir}" in finding.why and f"chmod o+x {log_dir}" in finding.fix
    assert "refuses to start" in finding.fix
    log_dir.chmod(0o755)
    finding = only_problem(view)
    assert f"it does not exist and cosched cannot create it in {log_dir}" in finding.why
    assert f"touch {log_dir}/CoSchedLog && chown cosched {log_dir}/CoSchedLog" in finding.fix


def test_an_unknown_sidecar_account_and_an_unset_log(host: HostView):
    assert only_problem(with_knobs(host, COSCHED_SIDECAR_USERID="nosuchuser")).what == \
        "sidecar account COSCHED_SIDECAR_USERID = nosuchuser"
    assert "condor_master discards" in only_problem(with_knobs(host, COSCHED_LOG=None)).why


# ---- 3. the schedd's transforms and offers ------------------------------------------------

def test_a_transform_left_out_of_job_transform_names_or_undefined(host: HostView):
    names = host.knob("JOB_TRANSFORM_NAMES").replace("CoSchedGPU CoSchedGPUClear", "")
    finding = only_problem(with_knobs(host, JOB_TRANSFORM_NAMES=names))
    assert finding.what == "schedd JOB_TRANSFORM_NAMES" and finding.why == "lacks CoSchedGPU CoSchedGPUClear"
    assert "condor-sched config 10-cosched-schedd.conf" in finding.fix
    assert only_problem(with_knobs(host, JOB_TRANSFORM_CoSchedGPUClear=None)).why == "not defined"


def test_a_transform_from_an_older_snippet_and_unprotected_attributes(host: HostView):
    older = "\n".join(line for line in host.knob("JOB_TRANSFORM_CoSchedPin").splitlines() if "PreJobPrio1" not in line)
    finding = only_problem(with_knobs(host, JOB_TRANSFORM_CoSchedPin=older))
    assert finding.what == "schedd transform JOB_TRANSFORM_CoSchedPin" and "does not SET PreJobPrio1" in finding.why
    protected = host.knob("PROTECTED_JOB_ATTRS").replace("PreJobPrio1", "")
    assert only_problem(with_knobs(host, PROTECTED_JOB_ATTRS=protected)).why == "lacks PreJobPrio1"


def test_the_offer_limit_below_the_snippets(host: HostView):
    finding = only_problem(with_knobs(host, MAX_CONCURRENT_UPLOADS_PER_USER="20"))
    assert finding.what == "schedd offers MAX_CONCURRENT_UPLOADS_PER_USER"
    assert "is 20, below the 100" in finding.why and "$(MAX_CONCURRENT_UPLOADS:100)" in finding.why
    assert doctor.diagnose(with_knobs(host, MAX_CONCURRENT_UPLOADS_PER_USER="400")).ok   # higher is allowed


def test_what_the_schedd_needs_is_read_from_the_shipped_snippet(host: HostView):
    text = (config_d_dir() / "10-cosched-schedd.conf").read_text()
    assignments = dict(snippet_assignments(text))
    assert "SET PreJobPrio1" in assignments["JOB_TRANSFORM_CoSchedPin"]
    newer = text + "\nJOB_TRANSFORM_NAMES = $(JOB_TRANSFORM_NAMES) CoSchedNew\nJOB_TRANSFORM_CoSchedNew @=end\n" \
                   "   SET CoSchedPinNew 1\n@end\nMAX_CONCURRENT_UPLOADS_PER_USER = 500\n"
    found = problems(replace(host, snippet=lambda name: newer if name.startswith("10-") else host.snippet(name)))
    assert found["schedd JOB_TRANSFORM_NAMES"].why == "lacks CoSchedNew"
    assert found["schedd transform JOB_TRANSFORM_CoSchedNew"].why == "not defined"
    assert "below the 500" in found["schedd offers MAX_CONCURRENT_UPLOADS_PER_USER"].why


# ---- 4. an execute node without the execute snippet ---------------------------------------

def test_a_startd_without_condor_sched_is_not_a_condor_sched_node(host: HostView, tmp_path: Path):
    view = replace(with_knobs(host, DAEMON_LIST="MASTER STARTD", START="True", COSCHED_HOOK_PREPARE_JOB=None,
                              STARTER_DEFAULT_JOB_HOOK_KEYWORD=None),
                   node_config_override=str(tmp_path / "absent.json"))
    report = doctor.diagnose(view)
    assert report.ok and report.findings[0].what == "execute node"
    assert report.findings[0].why.startswith("not a condor_sched node")


def test_a_condor_sched_node_without_the_execute_snippet(host: HostView):
    view = with_knobs(host, DAEMON_LIST="MASTER, STARTD", STARTER_DEFAULT_JOB_HOOK_KEYWORD=None, COSCHED_HOOK_PREPARE_JOB=None,
                      STARTD_CRON_JOBLIST="OTHER")
    found = problems(view)
    assert set(found) == {"execute STARTER_DEFAULT_JOB_HOOK_KEYWORD", "execute COSCHED_HOOK_PREPARE_JOB",
                          "execute STARTD_CRON_JOBLIST", "execute DAEMON_LIST"}
    assert found["execute STARTER_DEFAULT_JOB_HOOK_KEYWORD"].why == "is unset, 30-cosched-execute.conf sets COSCHED"
    assert found["execute STARTD_CRON_JOBLIST"].why == "lacks COSCHEDINFO"
    assert found["execute DAEMON_LIST"].why == "lacks COSCHED_NODE_AGENT"
    assert all("condor-sched config 30-cosched-execute.conf" in f.fix for f in found.values())
    wrong = with_knobs(host, STARTER_DEFAULT_JOB_HOOK_KEYWORD="OTHER")
    assert only_problem(wrong).why == "is OTHER, 30-cosched-execute.conf sets COSCHED"


def test_a_node_config_without_the_startd_policy(host: HostView):
    finding = only_problem(with_knobs(host, START="True"))
    assert finding.what == "execute START" and "20-cosched-startd.conf" in finding.fix


# ---- 5. the node config -------------------------------------------------------------------

def test_a_node_config_that_is_invalid_or_unsafe(host: HostView):
    path = Path(host.node_config_path)
    path.chmod(0o666)
    finding = only_problem(host)
    assert finding.what == f"node config {path}" and "writable by group or others" in finding.why
    assert "cosched_describe_node.py --output" in finding.fix
    path.chmod(0o644)
    path.write_text("{not json")
    assert "invalid: node config" in only_problem(host).why and "not valid JSON" in only_problem(host).why


def test_a_node_config_for_another_node(host: HostView):
    path = Path(host.node_config_path)
    config = json.loads(path.read_text())
    path.write_text(json.dumps({**config, "node": "node8"}))
    finding = only_problem(host)
    assert finding.why == "is for node 'node8', this host is node7 (FULL_HOSTNAME, STARTD_NAME)"
    assert doctor.diagnose(with_knobs(host, STARTD_NAME="cosched@node8.cluster.example.org")).ok


def test_a_node_config_that_does_not_match_the_hardware(host: HostView, tmp_path: Path):
    other = fake_node(tmp_path / "bigger", cores_per_socket=8)
    finding = only_problem(replace(host, hardware_root=str(other)))
    assert "does not match this host's hardware: cores: the config has 8, the hardware 16" in finding.why
    assert "--check" in finding.fix and "--overrides FILE" in finding.fix


# ---- 6. the PREPARE_JOB hook ---------------------------------------------------------------

def test_a_hook_job_users_cannot_run(host: HostView):
    hook = Path(host.knob("COSCHED_HOOK_PREPARE_JOB"))
    hook.chmod(0o750)
    finding = only_problem(host)
    assert finding.what == f"PREPARE_JOB hook COSCHED_HOOK_PREPARE_JOB = {hook}"
    assert "readable and executable by others" in finding.why and finding.fix == f"chmod 755 {hook}"
    hook.chmod(0o755)
    hook.parent.chmod(0o750)
    finding = only_problem(host)
    assert f"others cannot search directory {hook.parent}" in finding.why and f"chmod o+x {hook.parent}" in finding.fix


def test_a_hook_others_could_change(host: HostView):
    hook = Path(host.knob("COSCHED_HOOK_PREPARE_JOB"))
    os.chown(hook, COSCHED.uid, 0)
    finding = only_problem(host)
    assert f"owned by uid {COSCHED.uid}, not root" in finding.why and f"chown root:root {hook}" in finding.fix
    os.chown(hook, 0, 0)
    hook.parent.chmod(0o777)
    finding = only_problem(host)
    assert f"directory {hook.parent} is not root's alone" in finding.why and f"chmod go-w {hook.parent}" in finding.fix


def test_a_hook_that_is_missing(host: HostView):
    Path(host.knob("COSCHED_HOOK_PREPARE_JOB")).unlink()
    finding = only_problem(host)
    assert finding.why == "No such file or directory" and "condor-sched install-node" in finding.fix


# ---- 7. the node agent -------------------------------------------------------------------

def test_a_dead_node_agent(host: HostView, tmp_path: Path):
    later = replace(host, clock=lambda: NOW + 600)   # the sidecar's ad is stale by then too
    finding = problems(later)[f"node agent heartbeat {tmp_path}/state/agent.heartbeat"]
    assert "605 s old (limit 180 s)" in finding.why
    assert finding.fix.startswith("condor_on -daemon COSCHED_NODE_AGENT") and f"{tmp_path}/state/agent.log" in finding.fix
    (tmp_path / "state" / "agent.heartbeat").unlink()
    assert "missing or unreadable" in only_problem(host).why


# ---- 8. the sidecar's lease ------------------------------------------------------------------

def test_a_missing_or_stale_lease(host: HostView):
    sidecar = host.query_ads("CoSchedSidecar")[0]
    nodes = host.query_ads("CoSchedNode")
    finding = only_problem(replace(host, query_ads=fake_collector([], nodes)))
    assert finding.what == "sidecar lease (CoSchedSidecar ad)" and finding.why.startswith("missing")
    assert "condor_on -daemon COSCHED_SIDECAR" in finding.fix
    dry = {**sidecar, "Name": "dry-run-cosched@cm", "CoSchedDryRun": True}
    assert only_problem(replace(host, query_ads=fake_collector([dry], nodes))).why.startswith("missing")
    stale = {**sidecar, "LastHeardFrom": int(NOW) - 500}
    assert only_problem(replace(host, query_ads=fake_collector([stale], nodes))).why == (
        "stale: cosched@cm.example.org on cm.example.org was last heard from 500 s ago, beyond its ClassAdLifetime "
        "of 210 s: it died or cannot reach the collector")


def test_a_sidecar_reporting_an_error_and_two_live_leases(host: HostView):
    sidecar = host.query_ads("CoSchedSidecar")[0]
    nodes = host.query_ads("CoSchedNode")
    failing = {**sidecar, "CoSchedConfigError": "COSCHED_LOG = /x: Permission denied; logging to /x.condor instead"}
    finding = only_problem(replace(host, query_ads=fake_collector([failing], nodes)))
    assert finding.what == "sidecar cosched@cm.example.org on cm.example.org: its configuration (CoSchedConfigError)"
    second = {**sidecar, "Name": "cosched@b", "Machine": "b"}
    assert "2 sidecars hold live leases" in only_problem(replace(host, query_ads=fake_collector([sidecar, second],
                                                                                                 nodes))).why


def test_an_unreachable_collector_is_a_finding(host: HostView):
    def unreachable(kind: str):
        raise RuntimeError("Failed communication with collector.")

    finding = only_problem(replace(host, query_ads=unreachable))
    assert finding.what == "collector" and "Failed communication" in finding.why and "COLLECTOR_HOST" in finding.fix


# ---- 9. versions -----------------------------------------------------------------------

def test_versions_that_differ_between_hosts(host: HostView):
    sidecar = {**host.query_ads("CoSchedSidecar")[0], "CoSchedVersion": "0.0.9"}
    nodes = [*host.query_ads("CoSchedNode"), {"Machine": "old1", "CoSchedNodeVersion": "0.0.9"},
             {"Machine": "old2"}]
    found = problems(replace(host, query_ads=fake_collector([sidecar], nodes)))
    assert found["version of the sidecar cosched@cm.example.org on cm.example.org"].why == \
        f"runs condor_sched 0.0.9, this install is {__version__}"
    assert found["version of the node programs on old1"].why == \
        f"1 execute node advertises CoSchedNodeVersion 0.0.9, this install is {__version__}"
    assert found["version of the node programs on old2"].why == \
        f"1 execute node advertises CoSchedNodeVersion (none: programs older than it), this install is {__version__}"
    assert "condor-sched install-node" in found["version of the node programs on old1"].fix and len(found) == 3


def test_this_hosts_node_programs_of_another_release(host: HostView):
    init = Path(host.knob("COSCHED_NODE_HOOKS")) / "cosched_node" / "__init__.py"
    init.write_text(init.read_text().replace(f'__version__ = "{__version__}"', '__version__ = "0.0.9"'))
    finding = only_problem(host)
    assert finding.what == f"version of this host's node programs {init}"
    assert finding.why == f"0.0.9, this install is {__version__}" and "install-node" in finding.fix
    assert set(problems(replace(host, version="0.0.9"))) == {   # this install is the odd one out
        "version of the sidecar cosched@cm.example.org on cm.example.org", f"version of the node programs on {FQDN}"}


# ---- output and the command -------------------------------------------------------------

def test_text_and_json_output(host: HostView):
    report = doctor.diagnose(with_knobs(host, MAX_CONCURRENT_UPLOADS_PER_USER="20"))
    lines = report.text().splitlines()
    failing = lines.index(next(line for line in lines if line.startswith("FAIL ")))
    assert lines[failing].startswith("FAIL schedd offers MAX_CONCURRENT_UPLOADS_PER_USER: is 20")
    assert lines[failing + 1].startswith("     fix: install config.d/10-cosched-schedd.conf")
    assert all(line.startswith(("ok   ", "FAIL ", "     fix: ", "doctor: ")) for line in lines)
    data = report.as_json()
    assert data["ok"] is False and data["problems"] == 1 and data["roles"] == ["schedd", "execute", "sidecar"]
    assert json.loads(json.dumps(data))["findings"][0].keys() == {"ok", "what", "why", "fix"}


@pytest.fixture
def condor_config(tmp_path: Path):
    """CONDOR_CONFIG of a schedd host whose collector refuses connections; htcondor2 re-reads the
    caller's configuration afterwards."""
    import htcondor2

    (tmp_path / "condor_config").write_text(
        f"DAEMON_LIST = MASTER, SCHEDD\nCOLLECTOR_HOST = 127.0.0.1:1\nLOG = {tmp_path}\n"
        f"LOCAL_CONFIG_FILE = {config_d_dir() / '10-cosched-schedd.conf'}\n")
    saved = {k: v for k, v in os.environ.items() if k == "CONDOR_CONFIG" or k.startswith("_CONDOR_")}
    for key in saved:
        del os.environ[key]
    os.environ["CONDOR_CONFIG"] = str(tmp_path / "condor_config")
    try:
        yield tmp_path / "condor_config"
    finally:
        os.environ.pop("CONDOR_CONFIG", None)
        os.environ.update(saved)
        htcondor2.reload_config()


def test_the_command_reads_the_live_configuration(condor_config: Path):
    group = click.Group()
    group.add_command(doctor_command)
    result = CliRunner().invoke(group, ["doctor"])
    assert result.exit_code == 1, result.output
    assert "ok   schedd JOB_TRANSFORM_NAMES: has the 5 of 10-cosched-schedd.conf" in result.output
    assert "FAIL collector: cannot query CoSchedSidecar ads" in result.output
    result = CliRunner().invoke(group, ["doctor", "--json", "--role", "schedd"])
    data = json.loads(result.output)
    assert result.exit_code == 1 and data["roles"] == ["schedd"] and data["problems"] == 1
    assert CliRunner().invoke(group, ["doctor", "--role", "cm"]).exit_code == 2



def test_one_startd_of_several_is_checked_by_its_local_name(host: HostView, tmp_path: Path):
    """A host of several startds (docs/admin.md): --local-name reads the startd's NODE1. knobs,
    its node config (NODE1.COSCHED_NODE_CONFIG, named after its startd) and its own agent."""
    config = json.loads(Path(host.node_config_path).read_text())
    own = tmp_path / "etc" / "node1.json"
    own.write_text(json.dumps({**config, "node": "node1"}))
    own.chmod(0o644)
    several = with_knobs(host, DAEMON_LIST="MASTER, SCHEDD, COSCHED_SIDECAR, NODE1, COSCHED_NODE_AGENT_NODE1",
                         COSCHED_HOOK_PREPARE_JOB_ARGS="--node-config /etc/condor_sched/node.json",
                         COSCHED_NODE_AGENTS="COSCHED_NODE_AGENT_NODE1", **{
                             "NODE1.STARTD_NAME": "node1", "NODE1.NETWORK_HOSTNAME": "node1.example.org",
                             "NODE1.COSCHED_NODE_CONFIG": str(own)})
    assert doctor.host_roles(several) == ["schedd", "sidecar"]       # no STARTD: not an execute host by itself
    startd = replace(several, local_name="NODE1")
    report = doctor.diagnose(startd)
    assert report.roles == ("schedd", "execute", "sidecar") and report.ok, report.text()
    assert f"node config {own}" in [f.what for f in report.findings]
    own.write_text(json.dumps({**config, "node": "node2"}))
    problem = only_problem(startd)
    assert "is for node 'node2'" in problem.why and "Several startds on one host" in problem.fix
