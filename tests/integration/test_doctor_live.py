"""``condor-sched doctor`` as an admin runs it: on the pool's host, as root, reading that host's
own HTCondor configuration and asking its own collector; a fault planted in the configuration
it reads is found with its fix."""
from __future__ import annotations

import json

import pytest

from condor_sched.localpool import chroot, config

pytestmark = pytest.mark.pool


def doctor(pool, *args: str, knobs: dict[str, str] | None = None) -> tuple[int, dict]:
    """doctor inside the pool's root (its /etc/condor config), with ``knobs`` set for it alone."""
    overrides = [f"_CONDOR_{k}={v}" for k, v in (knobs or {}).items()]
    out = chroot.in_chroot(pool.info.root, ["env", *overrides, str(config.SIDECAR_COMMAND), "doctor", "--json", *args],
                           check=False)
    assert "Traceback" not in out.stdout, out.stdout[-2000:]
    return out.returncode, json.loads(out.stdout)


def test_doctor_checks_the_pools_schedd_and_finds_a_transform_taken_out(pool):
    code, report = doctor(pool, "--role", "schedd")
    schedd = [f for f in report["findings"] if f["what"].startswith("schedd")]
    assert schedd and all(f["ok"] for f in schedd), schedd
    assert report["roles"] == ["schedd"]
    # No sidecar daemon runs in this pool: its lease is missing, which doctor says, with the fix.
    lease = next(f for f in report["findings"] if f["what"].startswith("sidecar lease"))
    assert not lease["ok"] and "missing" in lease["why"] and "COSCHED_SIDECAR" in lease["fix"]
    assert code == 1
    code, planted = doctor(pool, "--role", "schedd", knobs={"JOB_TRANSFORM_NAMES": "CoSchedPin CoSchedSpread"})
    missing = next(f for f in planted["findings"] if f["what"] == "schedd JOB_TRANSFORM_NAMES")
    assert code == 1 and not missing["ok"] and "CoSchedGPU" in missing["why"]
    assert "10-cosched-schedd.conf" in missing["fix"]
