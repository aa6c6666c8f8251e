"""A job's environment read as HTCondor's starter reads it, and the ``Environment`` the
PREPARE_JOB hook prints with its own variables set in it.

HTCondor (``Env::MergeFrom``) takes the ``Environment`` attribute when it is a string, else the
old ``Env``. ``Environment`` is split as ``split_args`` splits it: entries separated by space,
tab, CR or LF (no other character); ``'...'`` quotes anywhere in an entry, ``''`` inside
quotes is one ``'``, and ``"`` is an ordinary character (the submit file's surrounding double
quotes and ``""`` escapes are gone by the time the job ad holds the string). ``Env`` is split
at ``;`` (or ``EnvDelim``'s first character, or the string's first character when that is one
of HTCondor's permitted delimiters) and at LF, each entry's leading blanks dropped
(``Env::MergeFromV1AutoDelim``). Each entry is ``NAME=value``, split at the first ``=``, and
the starter keeps ONE value per exact name, the last one written. The hook reads the job's
variables into the same table, sets its own in it, and prints the table: every variable,
each hook-set one included, appears exactly once, so no copy a job adds can override it.
"""

from __future__ import annotations

import re
from typing import Dict, List, Optional, Sequence, Tuple

from cosched_node.ads import ad_get

#: A variable name a job may use: what HTCondor would take, less blanks and quotes (refused,
#: so that no name is ever read one way here and another way by the starter).
ENV_ANY_NAME_RE = re.compile(r"^[^=\s'\"]{1,256}$")
#: What ``split_args`` takes as the space between two ``Environment`` entries.
V2_SPACE = " \t\n\r"
_PLAIN_RUN_RE = re.compile(r"[^' \t\n\r]+")
#: The old ``Env``'s default delimiter, and the characters that may open it to name another.
V1_DELIMITER = ";"
V1_PERMITTED_DELIMITERS = "!#$%&*+,-/:;<>?@^`|~\x1f"
V1_BLANKS = " \t\n\r"


def split_environment_v2(text: str) -> List[str]:
    """HTCondor's ``split_args``: the entries of a new-syntax ``Environment``, unquoted."""
    entries: List[str] = []
    current: List[str] = []
    in_entry = False
    i = 0
    while i < len(text):
        if text[i] in V2_SPACE:
            if in_entry:
                entries.append("".join(current))
                current, in_entry = [], False
            i += 1
        elif text[i] == "'":
            in_entry = True
            i += 1
            while True:      # inside quotes: '' is one quote, a lone ' closes them
                close = text.find("'", i)
                if close < 0:
                    raise ValueError("unbalanced single quote in Environment")
                current.append(text[i:close])
                if text.startswith("''", close):
                    current.append("'")
                    i = close + 2
                else:
                    i = close + 1
                    break
        else:
            run = _PLAIN_RUN_RE.match(text, i)   # text[i] is neither blank nor quote: a run starts here
            current.append(run.group())
            in_entry = True
            i = run.end()
    if in_entry:
        entries.append("".join(current))
    return entries


def parse_environment_v2(text: str) -> List[Tuple[str, str]]:
    """The (name, value) entries of a new-syntax ``Environment``, in order, repeats kept."""
    return [_split_assignment(entry) for entry in split_environment_v2(text)]


def parse_environment_v1(text: str, delimiter: Optional[str] = None) -> List[Tuple[str, str]]:
    """The (name, value) entries of an old ``Env`` (``A=1;B=2``), in order, repeats kept;
    ``delimiter`` is ``EnvDelim``'s first character when the job ad has one."""
    delimiter = delimiter or V1_DELIMITER
    if text[:1] == delimiter:
        text = text[1:]
    elif text[:1] and text[0] in V1_PERMITTED_DELIMITERS:
        delimiter, text = text[0], text[1:]
    entries = (entry.lstrip(V1_BLANKS) for line in text.split("\n") for entry in line.split(delimiter))
    return [_split_assignment(entry) for entry in entries if entry]


def _split_assignment(entry: str) -> Tuple[str, str]:
    name, sep, value = entry.partition("=")
    if not sep or not ENV_ANY_NAME_RE.match(name):
        raise ValueError("Environment entry is not NAME=value")
    return name, value


def job_environment(job_ad: Dict[str, object]) -> Dict[str, str]:
    """The variables the starter would give the job from its ad: one value per name, the
    last one the ad writes (first-written order kept). ValueError for one it cannot read."""
    existing = ad_get(job_ad, "Environment")
    if isinstance(existing, str):
        pairs = parse_environment_v2(existing)
    elif existing is not None:
        raise ValueError("Environment is not a string")
    elif isinstance(ad_get(job_ad, "Env"), str):
        delimiter = ad_get(job_ad, "EnvDelim")
        pairs = parse_environment_v1(ad_get(job_ad, "Env"), delimiter[:1] if isinstance(delimiter, str) else None)
    else:
        pairs = []
    return dict(pairs)


def format_environment_v2(pairs: Sequence[Tuple[str, str]]) -> str:
    """New-syntax text that ``split_args`` splits back into exactly ``pairs``."""
    parts = []
    for name, value in pairs:
        if value == "" or any(ch in V2_SPACE or ch in "'\"" for ch in value):
            value = "'" + value.replace("'", "''") + "'"
        parts.append(f"{name}={value}")
    return " ".join(parts)


def merge_environment(job_ad: Dict[str, object], updates: Sequence[Tuple[str, str]]) -> str:
    """The job's variables (``job_environment``) with ``updates`` set, as one ``Environment``
    value that names every variable once: a job's own copies of an updated name are gone."""
    variables = job_environment(job_ad)
    for name, value in updates:
        if not ENV_ANY_NAME_RE.match(name):
            raise ValueError(f"the hook's variable name {name[:40]!r} is not NAME")
        variables[name] = value
    return format_environment_v2(list(variables.items()))
