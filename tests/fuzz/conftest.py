"""The fuzz tests' session rules: the node package on the path, and a stuck run ended with a
traceback. The shared helpers are in ``fuzzing.py``."""
from __future__ import annotations

import faulthandler
import os

import pytest

from fuzzing import FUZZ_EXAMPLES, NODE_HOOKS  # noqa: F401  (puts node_hooks/ on sys.path)

#: A fuzz test that runs past this is stuck (a hang in C code no Python timeout can stop):
#: the run ends with every thread's traceback instead of waiting for CI's limit.
STUCK_AFTER_S = float(os.environ.get("COSCHED_FUZZ_STUCK_S", str(300 * max(1.0, FUZZ_EXAMPLES / 30))))


@pytest.fixture(autouse=True)
def _end_a_stuck_run():
    faulthandler.dump_traceback_later(STUCK_AFTER_S, exit=True)
    yield
    faulthandler.cancel_dump_traceback_later()
