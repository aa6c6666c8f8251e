"""The plain view of one ad and the reading of one attribute.

:class:`_PlainAd` views an ad as its parsed JSON values (a snapshot file's, or a live ad
printed as JSON: :func:`plain_ads`), building a ClassAd only where ClassAd semantics are
needed. ``_eval`` and the typed reads (``_integer``, ``_number``, ``_string``,
``_lenient``) evaluate one attribute of a view or of a ClassAd and raise :class:`AdError`
naming it. The expression cost guard (``_check_cost`` and its caches) lives here too, beside
the view it reads: every evaluation of an expression applies it first. Also the readers'
shared caches, each bounded by ``_MAX_CACHED`` entries."""
from __future__ import annotations

import contextvars
import itertools
import json
import math
from typing import Any, Iterable, Iterator

import classad2
from cosched_node import rules

from condor_sched.classads.json_values import MAX_VALUE_DEPTH, _EXPR_PREFIX, _EXPR_SUFFIX, _classad, _json_int
from condor_sched.expression_cost import expression_cost_problem, names_read

#: Largest value accepted for any resource amount (guards against absurd ads).
MAX_AMOUNT = 2**40


class AdError(ValueError):
    """One ad with a missing or malformed attribute."""

    def __init__(self, attribute: str, problem: str):
        super().__init__(f"{attribute} {problem}")
        self.attribute = attribute


def _eval(ad: classad2.ClassAd | _PlainAd, attr: str) -> Any:
    """The evaluated value of ``attr``, or None when missing/undefined."""
    if ad.__class__ is _PlainAd:
        return ad.eval(attr)
    if attr not in ad:
        return None
    if ad.get(attr).__class__ is classad2.ExprTree:
        _check_cost(ad, (attr,), slot=_READING_SLOT.get())
    try:
        value = ad.eval(attr)
    except Exception as e:  # classad2 raises on evaluation failures
        raise AdError(attr, f"does not evaluate ({e})") from None
    if isinstance(value, classad2.Value):
        if value == classad2.Value.Error:
            raise AdError(attr, "evaluates to error")
        return None
    return value


def _integer(ad: classad2.ClassAd, attr: str, maximum: int = MAX_AMOUNT) -> int:
    """A required attribute that must hold an integer (job ids): a real is not rounded into
    an id that does not exist."""
    value = _eval(ad, attr)
    if value is None:
        raise AdError(attr, "is missing")
    try:
        return rules.count(attr, value, 0, maximum)
    except rules.RuleError as exc:
        raise AdError(attr, str(exc).removeprefix(f"{attr} = ")) from None


def _number(ad: classad2.ClassAd, attr: str, *, required: bool, default: float = 0,
            integer: bool = True, minimum: float = 0, maximum: float = MAX_AMOUNT) -> Any:
    value = _eval(ad, attr)
    if value is None:
        if required:
            raise AdError(attr, "is missing")
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise AdError(attr, f"must be a number, got {value!r}")
    if not math.isfinite(value) or value < minimum or value > maximum:
        raise AdError(attr, f"out of range [{minimum}, {maximum}]: {value!r}")
    if integer:
        return int(math.ceil(value))
    return float(value)


def _string(ad: classad2.ClassAd, attr: str, *, required: bool = False) -> str | None:
    value = _eval(ad, attr)
    if value is None:
        if required:
            raise AdError(attr, "is missing")
        return None
    if not isinstance(value, str):
        raise AdError(attr, f"must be a string, got {value!r}")
    return value


def _raw_values(ad: _PlainAd, attrs: tuple[str, ...]) -> tuple:
    """The JSON values of ``attrs`` in ``ad`` (``_MISSING`` where absent), in one C-level pass
    over their names as this layout of an ad writes them (found once per layout)."""
    key = (id(ad.names), attrs)
    columns = _COLUMNS.get(key)
    if columns is None or columns[0] is not ad.names:  # the names map is kept alive with its columns
        columns = ad.names, tuple(ad.names.get(a.lower(), "") for a in attrs)
        if len(_COLUMNS) < _MAX_CACHED:
            _COLUMNS[key] = columns
    return tuple(map(ad.values.get, columns[1], itertools.repeat(_MISSING)))


_COLUMNS: dict[tuple[int, tuple[str, ...]], tuple[dict[str, str], tuple[str, ...]]] = {}


def _lenient(ad: classad2.ClassAd, attr: str, kind: type) -> Any:
    """``attr``'s value when it is a ``kind`` (bools are not ints), else None: for attributes
    that only inform (a user's JobPrio, our own reason text), never a reason to skip a job."""
    try:
        value = _eval(ad, attr)
    except AdError:
        return None
    return value if isinstance(value, kind) and not (kind is int and isinstance(value, bool)) else None


#: True while a slot ad is read: its expressions are the startd's, which may call
#: ``evalInEachContext`` (``_check_cost``'s ``slot``).
_READING_SLOT: contextvars.ContextVar[bool] = contextvars.ContextVar("reading_slot", default=False)


def _check_cost(ad: classad2.ClassAd | _PlainAd, roots: tuple[str, ...], slot: bool = False) -> None:
    """Raise :class:`AdError` when what the sidecar evaluates of ``ad`` (``roots`` and every
    attribute they read) could cost more than the bound of :mod:`condor_sched.expression_cost`.
    Checked on the text before any classad2 call walks or evaluates it, so one user's ad
    cannot stall or stop a cycle for everyone. Of a snapshot's ad, found once per expressions
    among the roots and the values of what they follow. A ``slot`` ad (the startd's, not a
    user's) may call ``evalInEachContext``, as HTCondor's own slot ads do."""
    if ad.__class__ is not _PlainAd:
        _cost_of(_expressions_read(ad, roots)[0], dynamic=slot)
        return
    raw = _raw_values(ad, roots)
    first = (slot, roots, tuple([v if v.__class__ is str and v[:6] == _EXPR_PREFIX else None for v in raw]))
    try:
        followed = _FOLLOWED.get(first)
        key = None if followed is None else (first, followed, _raw_values(ad, followed))
        verdict = _COSTS.get(key, _COSTS) if key is not None else _COSTS
    except TypeError:  # a list or a nested ad: not a key
        _cost_of(_expressions_read(ad, roots)[0], dynamic=slot)
        return
    if verdict is _COSTS:
        expressions, followed = _expressions_read(ad, roots)
        verdict = _cost_of(expressions, check=False, dynamic=slot)
        if len(_COSTS) < _MAX_CACHED:
            _FOLLOWED[first] = followed
            _COSTS[(first, followed, _raw_values(ad, followed))] = verdict
    if verdict is not None:
        raise AdError(*verdict)


def _cost_of(expressions: list[tuple[str, str]], check: bool = True,
             dynamic: bool = False) -> tuple[str, str] | None:
    """``expression_cost_problem`` of ``expressions``; raised as AdError when ``check``."""
    problem = expression_cost_problem(expressions, dynamic=dynamic) if expressions else None
    if problem is not None and check:
        raise AdError(*problem)
    return problem


def _expressions_read(ad: classad2.ClassAd | _PlainAd, roots: tuple[str, ...]
                      ) -> tuple[list[tuple[str, str]], tuple[str, ...]]:
    """(name, ClassAd text) of every expression among ``roots`` and what they read, nested
    ads' attributes and list items included, and the names followed beyond ``roots``."""
    found: list[tuple[str, str]] = []
    seen = {name.lower() for name in roots}
    followed: list[str] = []
    todo = [(name, value) for name, value in zip(roots, _values_of(ad, roots)) if value is not _MISSING]
    while todo:
        name, value = todo.pop()
        texts = _texts_of(name, value)
        found += texts
        for _, text in texts:
            names = tuple(n for n in names_read(text) if n not in seen)
            seen.update(names)
            followed += names
            todo += ((n, v) for n, v in zip(names, _values_of(ad, names)) if v is not _MISSING)
    return found, tuple(followed)


def _values_of(ad: classad2.ClassAd | _PlainAd, names: tuple[str, ...]) -> Iterable[Any]:
    """The values of ``names`` in ``ad`` as JSON values (expressions as ``"/Expr(...)/"``
    strings), ``_MISSING`` where absent."""
    if ad.__class__ is _PlainAd:
        return _raw_values(ad, names)
    return [_json_value(ad, name) if name in ad else _MISSING for name in names]


def _json_value(ad: classad2.ClassAd, name: str) -> Any:
    value = ad.get(name)
    if value.__class__ is str or isinstance(value, (int, float, bool)) or value is None:
        return value
    return f"{_EXPR_PREFIX}{ad.lookup(name)}{_EXPR_SUFFIX}"


def _texts_of(name: str, value: Any, depth: int = 0) -> list[tuple[str, str]]:
    """The expressions of one JSON value: itself, a nested ad's attributes, a list's items."""
    kind = value.__class__
    if kind is str:
        return [(name, value[6:-2])] if value[:6] == _EXPR_PREFIX and value[-2:] == _EXPR_SUFFIX else []
    if depth > MAX_VALUE_DEPTH:
        return []
    if kind is dict:
        return [found for key, item in value.items() for found in _texts_of(key, item, depth + 1)]
    if kind is list:
        return [found for item in value for found in _texts_of(name, item, depth + 1)]
    return []


#: ``_check_cost``'s caches: the names followed beyond the roots per values of the roots, and
#: the verdict per values of the roots and of those names (equal values: equal expressions).
_FOLLOWED: dict[tuple, tuple[str, ...]] = {}
_COSTS: dict[tuple, tuple[str, str] | None] = {}


class _PlainAd:
    """One ad as parsed JSON values (``condor_q -json``, or a live ad printed as JSON): plain
    values (numbers, strings, booleans, null) are read as they are, and the ClassAd of the
    whole ad is built (or, for a live ad, used) only for what needs ClassAd semantics: an
    expression to evaluate or to read references of, a list, a nested ad. Names are looked up
    without regard to case, as in a ClassAd."""

    __slots__ = ("values", "names", "_classad", "live")

    def __init__(self, values: dict, classad: classad2.ClassAd | None = None, live: bool = False,
                 names: dict[str, str] | None = None):
        self.values = values
        self.names = names or _layout_names(values)
        self._classad = classad
        #: Values printed from a live ClassAd: a real or an expression is read from that ad
        #: (printJson rounds reals; a string is never an expression there).
        self.live = live

    @property
    def classad(self) -> classad2.ClassAd:
        if self._classad is None:
            self._classad = _classad(self.values, 0)
        return self._classad

    def __contains__(self, attr: str) -> bool:
        return attr.lower() in self.names

    def _plain(self, attr: str) -> Any:
        """The JSON value of ``attr`` when it is plain, ``_MISSING`` when absent, else ``_COMPLEX``."""
        name = self.names.get(attr.lower())
        if name is None:
            return _MISSING
        value = self.values[name]
        kind = value.__class__
        if kind is str:
            return _COMPLEX if value.startswith(_EXPR_PREFIX) and value.endswith(_EXPR_SUFFIX) else value
        if kind is int or kind is bool or value is None or (kind is float and not self.live):
            return value
        if kind is list and all(_plain_item(v) for v in value):
            return list(value)
        return _COMPLEX

    def is_literal(self, attr: str) -> bool:
        """True when ``attr`` holds a plain value (it refers to nothing)."""
        return self._plain(attr) is not _COMPLEX

    def eval(self, attr: str) -> Any:
        """``_eval``: the evaluated value, None when missing or undefined."""
        value = self._plain(attr)
        if value is _MISSING:
            return None
        if value is _COMPLEX:
            _check_cost(self, (attr,), slot=_READING_SLOT.get())
            return _eval(self.classad, attr)
        return value

    def get(self, attr: str, default: Any = None) -> Any:
        """``ClassAd.get``: a plain value as it is, undefined as ``Value.Undefined``."""
        value = self._plain(attr)
        if value is _MISSING:
            return default
        if value is _COMPLEX:
            return self.classad.get(attr, default)
        return classad2.Value.Undefined if value is None else value

    def lookup_text(self, attr: str) -> str:
        """``str(ad.lookup(attr))``: the value as ClassAd text (expressions as classad2 prints them)."""
        value = self._plain(attr)
        if value is _COMPLEX or value.__class__ is list:
            raw = self.values[self.names[attr.lower()]]
            if not self.live and raw.__class__ is str and raw in _EXPRESSIONS:
                return _EXPRESSIONS[raw]
            return _carried(attr, str(self.classad.lookup(attr)))
        key = (value.__class__, value)
        text = _UNPARSED.get(key)
        if text is None:
            text = _carried(attr, str(classad2.ClassAd({"v": value}).lookup("v")))
            if len(_UNPARSED) < _MAX_CACHED:
                _UNPARSED[key] = text
        return text


_MISSING, _COMPLEX = object(), object()


def _plain_item(value: Any) -> bool:
    """True for a list item that evaluates to itself (a string, integer, boolean)."""
    kind = value.__class__
    return (kind is str and not value.startswith(_EXPR_PREFIX)) or kind is int or kind is bool


#: Caches of the readers, each bounded by ``_MAX_CACHED`` entries: attribute names (lower case
#: to as written) per layout of an ad, expressions that parse (as in JSON -> as classad2 prints
#: them), and plain values as ClassAd text.
_MAX_CACHED = 100_000
_LAYOUTS: dict[str, dict[str, str]] = {}


def _layout_names(values: dict) -> dict[str, str]:
    """The names of ``values`` (lower case to as written), one map per layout of an ad, found
    by the names joined with NUL: one string to hash and compare where a tuple of fresh names
    cost 6 us an ad."""
    layout = "\0".join(values)
    names = _LAYOUTS.get(layout)
    if names is None:
        names = {name.lower(): name for name in values}
        if len(_LAYOUTS) < _MAX_CACHED and layout.count("\0") == len(values) - 1:  # no name holds a NUL
            _LAYOUTS[layout] = names
    return names


_EXPRESSIONS: dict[str, str] = {}
_UNPARSED: dict[tuple[type, Any], str] = {}


def _lookup_text(ad: classad2.ClassAd | _PlainAd, attr: str) -> str:
    return ad.lookup_text(attr) if ad.__class__ is _PlainAd else _carried(attr, str(ad.lookup(attr)))


def _carried(attr: str, text: str) -> str:
    """``text`` (an attribute's ClassAd text), or AdError when it holds a NUL character: no
    ClassAd carries one (classad2 prints it as ``\\000`` and refuses to parse that back, and so
    do HTCondor's daemons), so the job is skipped and told why rather than probed."""
    if "\0" in text or ("\\000" in text and "\\000" in text.replace("\\\\", "")):
        raise AdError(attr, "holds a NUL character, which a ClassAd string cannot carry")
    return text


def _classad_of(ad: classad2.ClassAd | _PlainAd) -> classad2.ClassAd:
    return ad.classad if ad.__class__ is _PlainAd else ad


def plain_ads(ads: Iterable[classad2.ClassAd], batch: int = 1000) -> Iterator[classad2.ClassAd | _PlainAd]:
    """Live ClassAds (``Schedd.query``) as :class:`_PlainAd` views, printed as JSON by classad2 and
    parsed ``batch`` at a time: the records read their plain values without one classad2 call
    per attribute. An ad whose JSON does not parse is given as it is."""
    chunk: list[classad2.ClassAd] = []
    for ad in ads:
        chunk.append(ad)
        if len(chunk) == batch:
            yield from _plain_batch(chunk)
            chunk = []
    yield from _plain_batch(chunk)


def _plain_batch(ads: list[classad2.ClassAd]) -> Iterator[classad2.ClassAd | _PlainAd]:
    if not ads:
        return
    try:
        values = json.loads("[" + ",".join(ad.printJson() for ad in ads) + "]", parse_int=_json_int)
    except Exception:
        values = [None] * len(ads)
        for i, ad in enumerate(ads):
            try:
                values[i] = json.loads(ad.printJson(), parse_int=_json_int)
            except Exception:
                pass
    for ad, obj in zip(ads, values):
        yield _PlainAd(obj, ad, live=True) if isinstance(obj, dict) and len(obj) == len(ad) else ad
