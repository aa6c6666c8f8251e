"""Shared pieces of the fuzz tests: one hypothesis profile per run length, and a bounded run of
a command that checks the goals every input surface shares (no traceback, a bounded time and
memory, strict JSON under ``--json``).

CI runs each surface with a few dozen examples (``COSCHED_FUZZ_EXAMPLES`` unset);
``scripts/fuzz`` sets it to run thousands."""
from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from hypothesis import HealthCheck, settings

ROOT = Path(__file__).resolve().parents[2]
NODE_HOOKS = str(ROOT / "node_hooks")
#: The node package, and the unit tests' modules (the fuzz tests start from their fixtures).
for _path in (NODE_HOOKS, str(ROOT / "tests" / "unit")):
    if _path not in sys.path:
        sys.path.insert(0, _path)

#: Examples per fuzz test: a CI run stays well under a minute for every surface together.
FUZZ_EXAMPLES = int(os.environ.get("COSCHED_FUZZ_EXAMPLES", "30"))
#: Every command's bounds (the goals: 60 s and 2 GB; a fuzz input gets far less time).
COMMAND_SECONDS = float(os.environ.get("COSCHED_FUZZ_COMMAND_S", "60"))
COMMAND_BYTES = 2 * 2**30

settings.register_profile("fuzz", max_examples=FUZZ_EXAMPLES, deadline=None, derandomize=False,
                          suppress_health_check=list(HealthCheck), database=None)


def fuzz_settings(examples: int | None = None) -> settings:
    """The fuzz profile, with ``examples`` scaled as ``COSCHED_FUZZ_EXAMPLES`` scales."""
    profile = settings.get_profile("fuzz")
    if examples is None:
        return profile
    return settings(profile, max_examples=max(1, examples * FUZZ_EXAMPLES // 30))


@dataclass(frozen=True)
class Outcome:
    returncode: int
    stdout: str
    stderr: str


def _limit_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (COMMAND_BYTES, COMMAND_BYTES))


def run_bounded(argv: list[str], stdin: bytes | None = None, json_out: bool = False,
                env: dict[str, str] | None = None, cwd: str | Path | None = None) -> Outcome:
    """Run ``argv`` under the shared bounds and assert the goals every surface shares: it ends
    within the time, under 2 GB of address space, with exit status 0, 1 or 2, no Python
    traceback, and (``json_out``) stdout that is strict JSON whenever it exits 0."""
    result = subprocess.run(argv, input=stdin, capture_output=True, timeout=COMMAND_SECONDS,
                            preexec_fn=_limit_memory, env=env, cwd=cwd)
    out = Outcome(result.returncode, result.stdout.decode(errors="replace"), result.stderr.decode(errors="replace"))
    assert "Traceback (most recent call last)" not in out.stderr + out.stdout, out.stderr[-3000:]
    assert out.returncode in (0, 1, 2), (out.returncode, out.stderr[-3000:])
    if json_out and out.returncode == 0:
        json.loads(out.stdout, parse_constant=_no_constant)
    return out


def _no_constant(name: str) -> None:
    raise ValueError(f"not JSON: {name}")

