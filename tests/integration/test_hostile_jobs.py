"""One user's costly job on the real pool: the sidecar holds it with the reason, which its
owner reads with condor_q, and pins everyone else's jobs in the same cycle.

The job's Requirements doubles its evaluation work with each level of a nested record. 16
levels cost HTCondor itself little (``docs/expression-cost-htcondor.md``: the daemons feel
24 and more), so the test pool stays quick, yet they pass condor_sched's bound many times."""
from __future__ import annotations

import time

import htcondor2
import pytest
from test_every_pin_runs import DEVICE_JOB, cli

pytestmark = pytest.mark.pool

LEVELS = 16


def doubling_requirements(levels: int) -> str:
    chain = ";".join(["a0 = 1"] + [f"a{i} = a{i - 1} + a{i - 1}" for i in range(1, levels + 1)])
    return f"[{chain}].a{levels} < 0 || (TARGET.PhiMemory >= RequestPhiMemory)"


def test_a_costly_job_is_held_with_its_reason_and_the_other_users_job_is_pinned(pool):
    base = {**DEVICE_JOB, "arguments": "30", "request_PhiMemory": "1000", "request_PhiThreads": "60"}
    alice = pool.submit(**base)
    bob = pool.submit_as(pool.settings.second_user, {**base, "initialdir": str(pool.job_dir(pool.settings.second_user)),
                                                     "requirements": doubling_requirements(LEVELS)}, [{}])
    constraint = f"ClusterId == {alice} || ClusterId == {bob}"
    try:
        start = time.monotonic()
        ran = cli(pool, "run", "--once")
        took = time.monotonic() - start
        assert ran.returncode == 0, ran.stdout + ran.stderr
        assert took < 60, f"one cycle took {took:.0f} s"
        ads = {a["ClusterId"]: dict(a) for a in pool.schedd().query(
            constraint, ["ClusterId", "JobStatus", "HoldReason", "CoSchedPinReason", "CoSchedPinSlot"])}
        assert ads[bob]["JobStatus"] == 5, ads[bob]
        assert "Requirements cannot be evaluated within 50,000 terms" in ads[bob]["HoldReason"]
        assert "condor_release" in ads[bob]["HoldReason"]
        assert isinstance(ads[alice].get("CoSchedPinSlot"), str), ads[alice]
        assert ads[alice]["CoSchedPinReason"].startswith(f"pinned to {ads[alice]['CoSchedPinSlot']}")
    finally:
        pool.schedd().act(htcondor2.JobAction.Remove, constraint)
