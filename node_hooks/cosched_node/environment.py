"""A job's ``Environment`` (new syntax ``A=1 B='x y'``) or old ``Env`` (``A=1;B=2``):
parsed, updated with the variables a hook sets, printed back in the new syntax."""

from __future__ import annotations

import re
from typing import Dict, List, Sequence, Tuple

from cosched_node.ads import ad_get

ENV_ANY_NAME_RE = re.compile(r"^[^=\s'\"]{1,256}$")


def parse_environment_v2(text: str) -> List[Tuple[str, str]]:
    """Split HTCondor's V2 environment: whitespace separated, '...' quotes, '' is a quote."""
    tokens: List[str] = []
    current: List[str] = []
    in_token = quoted = False
    i = 0
    while i < len(text):
        ch = text[i]
        if quoted:
            if ch == "'":
                if i + 1 < len(text) and text[i + 1] == "'":
                    current.append("'")
                    i += 2
                    continue
                quoted = False
            else:
                current.append(ch)
        elif ch == "'":
            quoted = in_token = True
        elif ch.isspace():
            if in_token:
                tokens.append("".join(current))
                current, in_token = [], False
        else:
            current.append(ch)
            in_token = True
        i += 1
    if quoted:
        raise ValueError("unbalanced single quote in Environment")
    if in_token:
        tokens.append("".join(current))
    return [_split_assignment(token) for token in tokens]


def parse_environment_v1(text: str) -> List[Tuple[str, str]]:
    """Old-style ``Env``: ``A=1;B=2``."""
    return [_split_assignment(item) for item in text.split(";") if item.strip()]


def _split_assignment(token: str) -> Tuple[str, str]:
    name, sep, value = token.partition("=")
    if not sep or not ENV_ANY_NAME_RE.match(name):
        raise ValueError("Environment entry is not NAME=value")
    return name, value


def format_environment_v2(pairs: Sequence[Tuple[str, str]]) -> str:
    parts = []
    for name, value in pairs:
        if value == "" or any(ch.isspace() or ch in "'\"" for ch in value):
            value = "'" + value.replace("'", "''") + "'"
        parts.append(f"{name}={value}")
    return " ".join(parts)


def merge_environment(job_ad: Dict[str, object], updates: Sequence[Tuple[str, str]]) -> str:
    """The job's Environment (or old Env) with ``updates`` set; existing entries kept in order."""
    existing = ad_get(job_ad, "Environment")
    if isinstance(existing, str):
        pairs = parse_environment_v2(existing)
    elif existing is None and isinstance(ad_get(job_ad, "Env"), str):
        pairs = parse_environment_v1(ad_get(job_ad, "Env"))
    elif existing is None:
        pairs = []
    else:
        raise ValueError("Environment is not a string")
    wanted = dict(updates)
    merged = [(name, wanted.pop(name) if name in wanted else value) for name, value in pairs]
    merged.extend((name, value) for name, value in updates if name in wanted)
    return format_environment_v2(merged)
