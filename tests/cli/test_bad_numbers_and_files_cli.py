"""Bad input on the command line and in the files it reads: a one-line error (exit 2, or a
skipped file with its reason), never a traceback, a hang or a memory blow-up."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from condor_sched.cli import main
from condor_sched.options import BoundedFloat
from condor_sched.profiles import default_profiles_dir

NON_UTF8_PROFILE = b"program: X\n\xff\xfe\n"


def invoke(*args: str):
    result = CliRunner().invoke(main, list(args))
    assert "Traceback" not in result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    return result


def numeric_options(group: click.Group, prefix: str = ""):
    for name, command in group.commands.items():
        if isinstance(command, click.Group):
            yield from numeric_options(command, f"{prefix}{name} ")
            continue
        for param in command.params:
            if isinstance(param.type, (click.types.IntParamType, click.types.FloatParamType)):
                yield f"{prefix}{name} {param.opts[0]}", param.type


def test_every_numeric_option_has_a_minimum_and_a_maximum():
    options = dict(numeric_options(main))
    assert "plan --thread-overcommit" in options and "simulate --cycle-s" in options
    for name, kind in options.items():
        assert isinstance(kind, (click.IntRange, click.FloatRange)), name
        assert kind.min is not None and kind.max is not None, name
        if isinstance(kind, click.FloatRange):
            assert isinstance(kind, BoundedFloat), f"{name}: nan passes a plain FloatRange"


@pytest.mark.parametrize("args", [
    ("plan", "--thread-overcommit", "inf"),
    ("plan", "--thread-overcommit", "nan"),
    ("plan", "--thread-overcommit", "1e308"),
    ("plan", "--time-limit", "nan"),
    ("plan", "--granularity-mb", "99999999999"),
    ("plan", "--seed", "99999999999999999999"),
    ("plan", "--unpin-age-cycles", "99999999999"),
    ("simulate", "--thread-overcommit", "nan"),
    ("simulate", "--cycle-s", "inf"),
    ("simulate", "--cycle-s", "1e-300"),
    ("simulate", "--jobs", "100000000"),
    ("simulate", "--nodes", "100000000"),
    ("simulate", "--sequences", "100000000"),
    ("simulate", "--age-limit-cycles", "1e308"),
    ("simulate", "--seed", "-1"),
], ids=" ".join)
def test_out_of_range_number_is_a_usage_error_naming_the_option(args):
    command, option, value = args
    result = invoke(command, option, value)
    assert result.exit_code == 2 and f"Invalid value for '{option}'" in result.output


def test_non_utf8_profile_is_skipped_with_its_file_named(tmp_path, caplog):
    (tmp_path / "mg.yaml").write_bytes((default_profiles_dir() / "mg.yaml").read_bytes())
    (tmp_path / "bad.yaml").write_bytes(NON_UTF8_PROFILE)
    result = invoke("plan", "--json", "--profiles", str(tmp_path))
    assert result.exit_code == 0
    assert any("bad.yaml: not UTF-8 text (byte 11)" in r.getMessage() for r in caplog.records)


def test_run_starts_past_a_non_utf8_profile_naming_it_without_a_traceback(tmp_path):
    profiles = tmp_path / "profiles"
    profiles.mkdir()
    (profiles / "bad.yaml").write_bytes(NON_UTF8_PROFILE)
    (tmp_path / "condor_config").write_text("")
    env = {**os.environ, "CONDOR_CONFIG": str(tmp_path / "condor_config"),
           "_CONDOR_COSCHED_PROFILE_DIR": str(profiles)}
    done = subprocess.run([sys.executable, "-m", "condor_sched", "run", "--once", "--dry-run"], env=env,
                          capture_output=True, text=True, timeout=120)
    assert "Traceback" not in done.stderr, done.stderr
    assert "profile skipped: " + str(profiles / "bad.yaml") + ": not UTF-8 text (byte 11)" in done.stderr


def workload(tmp_path: Path, text: str) -> str:
    path = tmp_path / "w.yaml"
    path.write_text(text)
    return str(path)


@pytest.mark.parametrize("text, message", [
    ("jobs:\n  - {device_memory_mb: 800, devcie_threads: 60, runtime_s: 3}\n",
     "jobs[0]: unknown key 'devcie_threads' (did you mean 'device_threads'?)"),
    ("jobs:\n  - {device_memory_mb: 800, device_threads: 60, runtime_s: 3, count: 100000000}\n",
     "jobs[0]: 'count' must be <= 100000,"),
    ("a: &a [1,1,1,1,1,1,1,1,1,1]\nb: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a,*a]\nc: &c [*b,*b,*b,*b,*b,*b,*b,*b,*b,*b]\n"
     "d: &d [*c,*c,*c,*c,*c,*c,*c,*c,*c,*c]\ne: &e [*d,*d,*d,*d,*d,*d,*d,*d,*d,*d]\n"
     "f: &f [*e,*e,*e,*e,*e,*e,*e,*e,*e,*e]\njobs: [{device_memory_mb: *f}]\n",
     "aliases expand to more than"),
    ("jobs: " + "[" * 10_000 + "]" * 10_000 + "\n", "nested deeper than 32 levels"),
])
def test_bad_workload_file_is_one_line_error_naming_the_file(tmp_path, text, message):
    path = workload(tmp_path, text)
    result = invoke("simulate", "--workload", path, "--jobs", "5")
    assert result.exit_code == 2 and path in result.output and message in result.output
    assert len(result.output.strip().splitlines()) == 1


def test_misspelt_inventory_key_is_one_line_error_naming_the_file(tmp_path):
    path = tmp_path / "pool.yaml"
    path.write_text("nodes:\n  - {name: n1, cores: 8, memory_mb: 8192, sockets: [{llc_ways: 20, mem_bw_gbs: 50}],\n"
                    "     devices: [{name: mic0, memory_mb: 8192, hardware_thread: 240}]}\n")
    result = invoke("simulate", "--inventory", str(path), "--jobs", "5")
    assert result.exit_code == 2
    assert f"{path}: nodes[0] (n1) device 0: unknown key 'hardware_thread' (did you mean 'hardware_threads'?)" \
        in result.output


def test_workload_no_policy_can_place_ends_with_exit_3_naming_the_jobs(tmp_path):
    path = tmp_path / "tiny.yaml"
    path.write_text("nodes:\n  - {name: tiny, cores: 8, memory_mb: 65536, sockets: [{llc_ways: 20, mem_bw_gbs: 59}]}\n")
    result = invoke("simulate", "--workload", "sns-random", "--policy", "sns", "--jobs", "2", "--inventory", str(path))
    assert result.exit_code == 3 and "can place none of the 2 idle jobs" in result.output
    assert "sim#2.0 (28 procs of LU)" in result.output
