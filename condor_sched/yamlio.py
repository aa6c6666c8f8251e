"""Reading the project's YAML files (inventory, profiles, workloads) with errors that name
the file and the field; each caller passes its own exception type."""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import yaml


def load_yaml(path: str | Path, error: type[Exception]) -> Any:
    path = Path(path)
    try:
        return yaml.safe_load(path.read_text())
    except OSError as e:
        raise error(f"{path}: cannot read: {e.strerror}") from None
    except yaml.YAMLError as e:
        raise error(f"{path}: not valid YAML: {e}") from None


def checked_number(where: str, raw: dict[str, Any], key: str, kind: type, minimum: float, error: type[Exception],
                   default: Any = None, strict_minimum: bool = False) -> Any:
    """``raw[key]`` as ``kind`` (int or float), at least (or above) ``minimum``; missing
    gives ``default``, or an error when there is none."""
    if key not in raw:
        if default is None:
            raise error(f"{where}: missing '{key}'")
        return default
    value = raw[key]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (kind is int and not isinstance(value, int)):
        raise error(f"{where}: '{key}' must be {'an integer' if kind is int else 'a number'}, got {value!r}")
    if value < minimum or (strict_minimum and value == minimum) or not math.isfinite(value):
        raise error(f"{where}: '{key}' must be {'>' if strict_minimum else '>='} {minimum}, got {value!r}")
    return kind(value)
