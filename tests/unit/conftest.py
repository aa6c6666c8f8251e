"""Import ``cosched_node`` from THIS checkout's node_hooks/ (the editable install maps it to the
checkout it was installed from; ``PYTHONPATH=<checkout>`` covers ``condor_sched`` only), so the
in-process node tests exercise the same code as the node programs they run as subprocesses."""
import os
import sys
from pathlib import Path

import pytest

NODE_HOOKS = str(Path(__file__).resolve().parents[2] / "node_hooks")
if NODE_HOOKS not in sys.path:
    sys.path.insert(0, NODE_HOOKS)


class _OsWithoutOurPid:
    """``os`` for ``cosched_node.procs`` where this process's pid reads as 1 (no fake process's)."""

    def __getattr__(self, name: str):
        return getattr(os, name)

    @staticmethod
    def getpid() -> int:
        return 1


@pytest.fixture(scope="module")
def fake_pids_are_not_ours():
    """The node tests lay out fake /proc trees with fixed pids (1000 + n, 7000, ...), and
    ``procs.job_processes`` leaves the calling process out of a job's processes: where this test
    process's real pid is one of the fake ones, a fake job process would vanish (seen once in CI,
    at pid 7000). Within ``procs`` our pid reads as 1, which no fake process has."""
    from cosched_node import procs

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(procs, "os", _OsWithoutOurPid())
        yield
