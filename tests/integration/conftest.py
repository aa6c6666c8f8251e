"""The real local pool, started once per test session and always torn down.

Tests that use the ``pool`` fixture are marked ``pool`` (root needed). One process holds one
HTCondor identity: security sessions are cached per process and htcondor2 cannot drop
them, so this process acts as the submitting user (alice) and edits as the queue super
user run in a child process (:meth:`PoolHandle.admin_edit`).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import pytest

from condor_sched import localpool
from condor_sched.localpool import chroot

_SUBMIT = """
import json, sys
import htcondor2
schedd = htcondor2.Schedd(htcondor2.Collector().query(htcondor2.AdTypes.Schedd)[0])
description, items = json.loads(sys.stdin.read())
print(schedd.submit(htcondor2.Submit(description), itemdata=iter(items)).cluster())
"""

_ADMIN_EDIT = """
import json, sys
import htcondor2
schedd = htcondor2.Schedd(htcondor2.Collector().query(htcondor2.AdTypes.Schedd)[0])
job, attr, value = sys.argv[1:4]
if attr == "--remove":
    print(json.dumps(schedd.act(htcondor2.JobAction.Remove, job)["TotalSuccess"]))
else:
    print(json.dumps(schedd.edit(job, attr, value)))
"""


@dataclass
class PoolHandle:
    info: localpool.PoolInfo
    settings: localpool.PoolSettings

    @property
    def domain(self) -> str:
        return self.info.domain

    def slot(self, slot_id: int, node: str) -> str:
        return f"slot{slot_id}@{node}@{node}.{self.domain}"

    def env(self, user: str) -> dict[str, str]:
        return localpool.client_env(user, self.settings)

    def schedd(self):
        """The pool's schedd, contacted as the submitting user (alice)."""
        import htcondor2

        return htcondor2.Schedd(htcondor2.Collector().query(htcondor2.AdTypes.Schedd)[0])

    def job_dir(self, user: str | None = None) -> Path:
        """A fresh directory in the shared workdir, owned by the submitting user (or ``user``:
        alice or the second user, bob)."""
        uid = self.settings.uid + (1 if user == self.settings.second_user else 0)
        d = self.info.workdir / f"test-{uuid.uuid4().hex[:8]}"
        d.mkdir()
        os.chown(d, uid, uid)
        return d

    def submit(self, **description: str) -> int:
        """Submit one job as alice (sleep 1 by default); returns its cluster id."""
        import htcondor2

        d = self.job_dir()
        desc = {"executable": "/bin/sleep", "arguments": "1", "initialdir": str(d),
                "should_transfer_files": "YES", "output": "out", "error": "err", "log": "log",
                **description}
        return self.schedd().submit(htcondor2.Submit(desc)).cluster()

    def submit_as(self, user: str, description: dict[str, str], items: list[dict[str, str]]) -> int:
        """Submit one cluster (one job per item row) as ``user``, in a child process; its cluster id."""
        out = subprocess.run([sys.executable, "-c", _SUBMIT], input=json.dumps([description, items]),
                             env={**os.environ, **self.env(user)}, capture_output=True, text=True, timeout=120)
        if out.returncode != 0:
            raise RuntimeError(f"submit as {user} failed: {out.stderr.strip()[-500:]}")
        return int(out.stdout.strip())

    def admin_edit(self, job_id: str, attr: str, value: str) -> int:
        """``Schedd.edit`` as the queue super user (``condor``), in a child process."""
        out = subprocess.run([sys.executable, "-c", _ADMIN_EDIT, job_id, attr, value],
                             env={**os.environ, **self.env(self.info.admin_user)},
                             capture_output=True, text=True, timeout=60)
        if out.returncode != 0:
            raise RuntimeError(f"admin edit of {job_id} failed: {out.stderr.strip()[-500:]}")
        return json.loads(out.stdout)

    def admin_remove(self, constraint: str) -> int:
        """Remove the jobs of ``constraint``, whoever owns them (as the queue super user)."""
        return self.admin_edit(constraint, "--remove", "")

    def job(self, cluster: int, attrs: list[str]) -> dict[str, Any] | None:
        """The job's queue ad, else its history ad, else None."""
        constraint = f"ClusterId == {cluster}"
        q = self.schedd().query(constraint, projection=["JobStatus", *attrs])
        if q:
            return dict(q[0])
        h = list(self.schedd().history(constraint, projection=["JobStatus", *attrs], match=1))
        return dict(h[0]) if h else None

    def wait_for(self, cluster: int, done: Callable[[dict[str, Any]], bool], attrs: list[str],
                 timeout_s: float = 60) -> dict[str, Any]:
        deadline = time.monotonic() + timeout_s
        ad = None
        while time.monotonic() < deadline:
            ad = self.job(cluster, attrs)
            if ad is not None and done(ad):
                return ad
            time.sleep(0.5)
        raise AssertionError(f"job {cluster} did not reach the expected state in {timeout_s} s: {ad}")


def _assert_nothing_left(root: Path) -> None:
    assert chroot.processes_in(root) == [], "processes still run in the pool root"
    assert chroot.mounts_under(root) == [], "mounts remain under the pool root"


@pytest.fixture(scope="session")
def pool(request):
    if os.geteuid() != 0:
        pytest.skip("the local pool needs root")
    settings = localpool.PoolSettings.from_env()

    def teardown() -> None:
        localpool.down(settings)
        _assert_nothing_left(settings.root)

    request.addfinalizer(teardown)
    info = localpool.up(settings=settings)
    import htcondor2

    os.environ.update(localpool.client_env(info.user, settings))
    htcondor2.reload_config()
    handle = PoolHandle(info, settings)
    # The cached root keeps its job queue across sessions: start from an empty one.
    handle.admin_remove("true")
    return handle
