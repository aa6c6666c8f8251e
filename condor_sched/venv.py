"""Scripts started with a bare ``python3`` re-run themselves under the project's venv."""
from __future__ import annotations

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def ensure_project_venv(script: str) -> None:
    """Re-exec ``script`` with ``.venv/bin/python`` when the dependencies are missing here."""
    try:
        import numpy  # noqa: F401
        import ortools  # noqa: F401
    except ImportError:
        venv_python = ROOT / ".venv" / "bin" / "python"
        if venv_python.exists() and Path(sys.executable) != venv_python:
            os.execv(str(venv_python), [str(venv_python), script, *sys.argv[1:]])
        raise
