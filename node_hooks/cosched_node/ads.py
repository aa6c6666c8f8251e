"""Old-syntax ClassAd text, as the starter hands a hook its job and machine ads.

Parsed without ``eval``: literals become Python values, anything else an ``Expr`` that is
never evaluated. Every value is hostile: numbers are range-checked through ``rules``, names
matched against a pattern before they become part of a file or attribute name, and what is
printed back (``format_line``) is quoted so the starter parses exactly one value.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any, Dict, List, Optional

from cosched_node import rules
from cosched_node.errors import AdError

MAX_AD_BYTES = 1 << 20
MAX_HOOK_MESSAGE = 240
ATTR_RE = rules.ATTR_RE


@dataclass(frozen=True)
class Expr:
    """An unparsed ClassAd expression (lists, records, references): never evaluated."""
    text: str


# ---------------------------------------------------------------------------------------
# Old-syntax ClassAd text <-> Python values

_INT_RE = re.compile(r"^[+-]?\d{1,40}$")
_REAL_RE = re.compile(r"^[+-]?(\d{1,40}\.\d{0,40}|\.\d{1,40}|\d{1,40})([eE][+-]?\d{1,4})?$")
#: One ``Attr = value`` line, matched once stripped (a lazy value before trailing blanks would
#: make a long line with inner blanks quadratic).
_LINE_RE = re.compile(r"^([A-Za-z_][A-Za-z0-9_.]*)\s*=\s*(.*)$")


def _parse_string(text: str, attr: str) -> str:
    """An old-syntax quoted string: ``\\"`` is a quote, other backslashes are literal."""
    out: List[str] = []
    i = 1
    while i < len(text):
        ch = text[i]
        if ch == "\\" and i + 1 < len(text) and text[i + 1] == '"':
            out.append('"')
            i += 2
            continue
        if ch == '"':
            if i != len(text) - 1:
                raise AdError(f"attribute {attr}: text after closing quote")
            return "".join(out)
        out.append(ch)
        i += 1
    raise AdError(f"attribute {attr}: unterminated string")


def parse_value(text: str, attr: str = "?") -> Any:
    """One ClassAd value: int, float, bool, str, None (undefined) or ``Expr`` for the rest."""
    if text == "":
        raise AdError(f"attribute {attr}: empty value")
    if text.startswith('"'):
        return _parse_string(text, attr)
    low = text.lower()
    if low == "true":
        return True
    if low == "false":
        return False
    if low == "undefined":
        return None
    if _INT_RE.match(text):
        return int(text)
    if _REAL_RE.match(text):
        value = float(text)
        if not math.isfinite(value):
            raise AdError(f"attribute {attr}: non-finite number")
        return value
    return Expr(text)


def parse_classad(data: "bytes | str", what: str = "ad") -> Dict[str, Any]:
    """Parse old-format ``Attr = value`` lines into a dict keyed by attribute name.

    Attribute names are case-insensitive in ClassAds, so keys are stored as given and looked
    up with :func:`ad_get`.  Raises ``AdError`` on non-UTF-8 input, oversized input, NUL
    bytes or a line that is not ``Name = value``.
    """
    if isinstance(data, bytes):
        if len(data) > MAX_AD_BYTES:
            raise AdError(f"{what}: larger than {MAX_AD_BYTES} bytes")
        try:
            data = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise AdError(f"{what}: not UTF-8 (byte offset {exc.start})") from None
    if "\x00" in data:
        raise AdError(f"{what}: contains a NUL byte")
    ad: Dict[str, Any] = {}
    for number, line in enumerate(data.splitlines(), 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        match = _LINE_RE.match(line.strip())
        if not match:
            raise AdError(f"{what}: line {number} is not 'Attr = value'")
        name, value = match.group(1), match.group(2)
        if not ATTR_RE.match(name):
            raise AdError(f"{what}: line {number}: bad attribute name")
        ad[name.lower()] = (name, parse_value(value, name))
    return {key: value for key, (_, value) in ad.items()}


def ad_get(ad: Dict[str, Any], attr: str, default: Any = None) -> Any:
    return ad.get(attr.lower(), default)


def ad_int(ad: Dict[str, Any], attr: str, low: int, high: int,
           default: Optional[int] = None) -> int:
    """An integer attribute within [low, high] (``rules.count``); a missing one gives
    ``default`` or AdError."""
    value = ad_get(ad, attr)
    if value is None:
        if default is None:
            raise AdError(f"attribute {attr} is missing")
        return default
    try:
        return rules.count(attr, value, low, high)
    except rules.RuleError as exc:
        raise AdError(f"attribute {exc}") from None


def ad_number(ad: Dict[str, Any], attr: str, low: float, high: float) -> float:
    """A finite number attribute (int or real) within [low, high]; missing gives AdError."""
    value = ad_get(ad, attr)
    if value is None:
        raise AdError(f"attribute {attr} is missing")
    try:
        return rules.number(attr, value, low, high)
    except rules.RuleError as exc:
        raise AdError(f"attribute {exc}") from None


def ad_str(ad: Dict[str, Any], attr: str, pattern: "re.Pattern[str]",
           required: bool = True) -> Optional[str]:
    value = ad_get(ad, attr)
    if value is None and not required:
        return None
    if not isinstance(value, str):
        raise AdError(f"attribute {attr} is {'missing' if value is None else 'not a string'}")
    if not pattern.match(value):
        raise AdError(f"attribute {attr} has a disallowed value")
    return value


def quote_string(value: str) -> str:
    """Quote a string for an old-syntax ``Attr = "value"`` line the starter will parse."""
    if any(ord(ch) < 32 or ord(ch) == 127 for ch in value):
        raise ValueError("control character in ClassAd string")
    if value.endswith("\\") or '\\"' in value:
        raise ValueError("backslash before a quote in ClassAd string")
    return '"' + value.replace('"', '\\"') + '"'


def format_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError("non-finite number")
        return repr(value)
    if isinstance(value, str):
        return quote_string(value)
    raise TypeError(f"cannot format {type(value).__name__} as a ClassAd value")


def hook_message(text: str) -> str:
    """``text`` made fit for a ``HookStatusMessage`` users read in HoldReason / VacateReason:
    printable ASCII without backslashes (quotes are escaped by :func:`format_line`), short."""
    safe = "".join(ch if 32 <= ord(ch) < 127 and ch != "\\" else "?" for ch in text)
    return safe if len(safe) <= MAX_HOOK_MESSAGE else safe[:MAX_HOOK_MESSAGE - 3] + "..."


def format_line(attr: str, value: Any) -> str:
    if not ATTR_RE.match(attr):
        raise ValueError(f"bad attribute name {attr!r}")
    return f"{attr} = {format_value(value)}"
