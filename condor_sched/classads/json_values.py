"""JSON values as ClassAd values: what ``condor_q -json`` holds (numbers, strings, booleans,
null, lists, nested ads, ``"/Expr(...)/"`` strings) built into classad2 values (``_classad``,
``_value``, ``_expression``), integers as a ClassAd holds them (``_json_int``), within the
bounds on a value's nesting and an expression's text. Importing it switches on HTCondor's
ClassAd semantics in classad2 (see below)."""
from __future__ import annotations

import math
from typing import Any

import classad2

# classad2 switches on HTCondor's ClassAd semantics (``MY.`` names the ad itself, as in the
# daemons) the first time it parses an ad that has an attribute; until then ``MY.Name`` in a
# slot's START is undefined and no job matches. The JSON reader builds ads from values
# without parsing any, so a process that reads only JSON (``condor-sched plan``) parses one here.
classad2.parseOne("CoSchedClassAdSemantics = true")

#: Bounds of what a reader accepts of a value (a snapshot file's bounds on its size and its
#: ClassAds: ``snapshot_files``): its nesting (lists and nested ads inside an attribute) and
#: an expression's text (classad2 25.14 overflows the C stack parsing some 400 KB of ``1+1+...``).
MAX_VALUE_DEPTH = 16
MAX_EXPRESSION_CHARS = 65_536


def _real(value: int) -> float:
    """An integer beyond 64 bits as the real ``_json_int`` makes of its digits (infinite past
    a double's range, where ``float`` of the integer would raise)."""
    try:
        return float(value)
    except OverflowError:
        return math.inf if value > 0 else -math.inf


def _json_int(digits: str) -> int | float:
    """A JSON integer as a ClassAd holds it: beyond 64 bits, a real (then out of every range)."""
    if len(digits) < 19:
        return int(digits)
    value = int(digits) if len(digits) <= 20 else float(digits)
    return value if isinstance(value, int) and -2**63 <= value < 2**63 else float(digits)


class _BadValue(ValueError):
    def __init__(self, problem: str, attribute: str = "") -> None:
        super().__init__(problem)
        self.problem, self.attribute = problem, attribute


def _classad(obj: dict, depth: int) -> classad2.ClassAd:
    values = {}
    for attr, value in obj.items():
        if not attr.isascii() and _lone_surrogate(attr):
            raise _BadValue(_SURROGATE_PROBLEM, attr.encode("utf-8", "backslashreplace").decode())
        if value.__class__ in _PLAIN or (value.__class__ is str and not value.startswith(_EXPR_PREFIX)):
            if value.__class__ is str and not value.isascii() and _lone_surrogate(value):
                raise _BadValue(_SURROGATE_PROBLEM, attr)
            values[attr] = value
            continue
        try:
            values[attr] = _value(value, depth)
        except _BadValue as e:
            raise _BadValue(e.problem, e.attribute or attr) from None
    try:
        return classad2.ClassAd(values)
    except Exception as e:  # an attribute name classad2 refuses
        raise _BadValue(f"not a ClassAd ({e})", next(iter(values), "?")) from None


_PLAIN = (int, float, bool, type(None))
_EXPR_PREFIX, _EXPR_SUFFIX = "/Expr(", ")/"


def _lone_surrogate(text: str) -> bool:
    """True when ``text`` holds half of a UTF-16 pair (JSON ``"\\ud800"``): classad2 25.14
    crashes the process on such a string."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


_SURROGATE_PROBLEM = "not Unicode text (an unpaired \\uD800-\\uDFFF escape)"


def _value(value: Any, depth: int) -> Any:
    """One JSON value as a ClassAd value (module ``snapshot_files._ads_from_json``)."""
    if isinstance(value, str) and not value.isascii() and _lone_surrogate(value):
        raise _BadValue(_SURROGATE_PROBLEM)
    if isinstance(value, str):
        if not (value.startswith(_EXPR_PREFIX) and value.endswith(_EXPR_SUFFIX)):
            return value
        return _expression(value[len(_EXPR_PREFIX):-len(_EXPR_SUFFIX)])
    if value.__class__ in _PLAIN:
        return value
    if depth >= MAX_VALUE_DEPTH:
        raise _BadValue(f"nested deeper than {MAX_VALUE_DEPTH} levels")
    if isinstance(value, list):
        return [_value(v, depth + 1) for v in value]
    return _classad(value, depth + 1)


def _expression(text: str) -> classad2.ExprTree:
    if len(text) > MAX_EXPRESSION_CHARS:
        raise _BadValue(f"expression longer than {MAX_EXPRESSION_CHARS} characters")
    try:
        return classad2.ExprTree(text)
    except Exception:
        raise _BadValue("expression does not parse") from None
