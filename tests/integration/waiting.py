"""Polling for the integration tests: a condition on the real pool, within a time limit."""
from __future__ import annotations

import time
from typing import Any, Callable


def wait_until(probe: Callable[[], Any], what: str, timeout_s: float = 60) -> Any:
    """Poll ``probe`` until it returns something truthy; that value."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = probe()
        if value:
            return value
        time.sleep(0.5)
    raise AssertionError(f"not within {timeout_s} s: {what}")
