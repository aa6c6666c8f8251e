"""A bound on what evaluating a job ad's expressions can cost, found from their text alone.

ClassAd evaluation does not share the value of an attribute read twice: ``a1 = a0 + a0;
a2 = a1 + a1; ...`` (top level or inside a nested record) doubles the work per level, so a
500-character Requirements can keep classad2, the schedd and the negotiator busy for hours.
String substitution does the same to memory (``regexps`` nested in ``regexps``, each copying
its input several times), and each regular expression may backtrack up to PCRE's match limit.
This module bounds all three without calling classad2: it tokenizes each expression once,
expands every attribute reference through what it may resolve to (the ad's attributes and
every definition of a nested record, the costliest of equal names), counts the tokens of the
whole expansion, and refuses an ad whose bound passes ``MAX_EXPRESSION_COST``. A call that
evaluates an expression built while it runs (``eval``) has no cost in the text: refused.
Pure and standard library only, so the sidecar, ``plan`` and the simulator share it.
"""
from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from functools import lru_cache

#: The most expanded tokens one attribute's evaluation may visit: a default job Requirements
#: expands to about 150, a hand-written one rarely past 1,000. classad2 walks about 10^8
#: expanded tokens a second, so the bound keeps each evaluation under a millisecond.
MAX_EXPRESSION_COST = 50_000
#: What one regular-expression call counts for: PCRE stops a backtracking match at its match
#: limit, after about 0.1 s measured with classad2 25.14 (so ten calls at most).
REGEX_CALL_COST = 5_000
#: The deepest chain of references followed (``a1`` reads ``a2`` reads ...): deeper counts as
#: past the bound, as no job's expressions nest so far and Python's stack would not follow.
MAX_REFERENCE_DEPTH = 200
#: How many tokens the bound may scan, as a multiple of the limit (nested bodies overlap).
SCAN_LIMIT_FACTOR = 4
#: Functions that run a regular expression.
REGEX_FUNCTIONS = frozenset({"regexp", "regexps", "regexpmember", "stringlist_regexpmember", "replace",
                             "replaceall", "stringlistregexpmember"})
#: Functions whose result may be many times longer than their arguments (a substitution that
#: repeats its match): one nested in another, directly or through attributes, grows a string
#: geometrically (12 nested ``regexps`` of ``\\1`` four times made 32 MB from "ab").
GROWING_FUNCTIONS = frozenset({"regexps", "replace", "replaceall"})
#: Functions that evaluate an expression built while they run (``eval`` of a computed string)
#: or once per item of a list: what they cost is not in the text, so a job calling one is refused.
DYNAMIC_FUNCTIONS = frozenset({"eval", "evalineachcontext", "countmatches"})
#: Words that are not attribute references.
_KEYWORDS = frozenset({"my", "target", "parent", "true", "false", "undefined", "error", "is", "isnt"})

_TOKENS = re.compile(r"""
    (?P<space>\s+)
  | (?P<string>"(?:[^"\\]|\\.)*"?)
  | (?P<quoted>'(?:[^'\\]|\\.)*'?)
  | (?P<name>[A-Za-z_][A-Za-z0-9_]*)
  | (?P<number>\d+(?:\.\d*)?(?:[eE][+-]?\d+)?|\.\d+(?:[eE][+-]?\d+)?)
  | (?P<operator>=\?=|=!=|==|!=|<=|>=|&&|\|\||<<|>>>|>>|.)
""", re.VERBOSE | re.DOTALL)


class ExpressionTooCostly(ValueError):
    """An ad whose expressions cannot be evaluated within the bound; the message says which
    attribute and why, in words a job's owner can act on."""


@dataclass(frozen=True, slots=True)
class _Shape:
    """One expression's text reduced to what its cost depends on."""

    #: (kind, lower-case word) per token: "n" a name read, "d" a name a nested record defines,
    #: "c" a call's name, "o" an operator, "l" a literal.
    tokens: tuple[tuple[str, str], ...]
    #: Definitions of nested records in it: (lower-case name, index of the body's first token,
    #: index past its last).
    definitions: tuple[tuple[str, int, int], ...]
    #: The names it reads (lower case), each once: what an ad must also give for its bound.
    names: tuple[str, ...]


@lru_cache(maxsize=65_536)
def _shape(text: str) -> _Shape:
    """Tokens and nested definitions of one expression's text (cached: jobs share texts)."""
    raw: list[tuple[str, str]] = []
    for match in _TOKENS.finditer(text):
        kind = match.lastgroup
        if kind == "space":
            continue
        value = match.group()
        if kind == "name":
            raw.append(("n", value.lower()))
        elif kind == "quoted":
            raw.append(("n", value[1:-1].lower()))
        elif kind == "operator":
            raw.append(("o", value))
        else:
            raw.append(("l", ""))
    tokens: list[tuple[str, str]] = []
    for i, (kind, value) in enumerate(raw):
        following = raw[i + 1][1] if i + 1 < len(raw) else ""
        if kind == "n" and following == "(":
            kind = "c"
        elif kind == "n" and value in _KEYWORDS:
            kind = "l"
        tokens.append((kind, value))
    definitions = _definitions(tokens)
    for _, start, _ in definitions:
        tokens[start - 2] = ("d", tokens[start - 2][1])  # the name a record defines reads nothing
    return _Shape(tuple(tokens), definitions, tuple(dict.fromkeys(v for k, v in tokens if k == "n")))


def names_read(text: str) -> tuple[str, ...]:
    """The names (lower case) an expression's text may read: attributes of its own ad or of
    the other ad (``TARGET.X`` gives ``x`` too), and nested records' attributes."""
    return _shape(text).names


def _definitions(tokens: list[tuple[str, str]]) -> tuple[tuple[str, int, int], ...]:
    """``name = body`` inside brackets: a nested record's attributes, each body up to the
    ``;`` or closing bracket of its own depth (ClassAd has no other single ``=``). One pass."""
    found: list[tuple[str, int, int]] = []
    open_bodies: list[tuple[str, int, int]] = []  # name, first token, bracket depth
    depth = 0

    def close(at: int, deeper_than: int) -> None:
        while open_bodies and open_bodies[-1][2] > deeper_than:
            name, start, _ = open_bodies.pop()
            found.append((name, start, at))

    for i, (kind, value) in enumerate(tokens):
        if kind == "o" and value in ("(", "[", "{"):
            depth += 1
        elif kind == "o" and value in (")", "]", "}"):
            close(i, depth - 1)
            depth -= 1
        elif kind == "o" and value == ";":
            close(i, depth - 1)
        elif kind == "n" and i + 1 < len(tokens) and tokens[i + 1] == ("o", "="):
            open_bodies.append((value, i + 2, depth))
    close(len(tokens), -1 - len(tokens))
    return tuple(found)


@dataclass(frozen=True, slots=True)
class _Bound:
    """The expansion bound of one body: tokens visited, how deeply string-growing calls nest,
    and the first function it reaches that evaluates an expression built at run time."""

    cost: int = 1
    growth: int = 0
    dynamic: str | None = None

    def worst(self, other: _Bound) -> _Bound:
        return _Bound(max(self.cost, other.cost), max(self.growth, other.growth), self.dynamic or other.dynamic)


def expression_cost_problem(expressions: Iterable[tuple[str, str]], limit: int = MAX_EXPRESSION_COST,
                            dynamic: bool = False) -> tuple[str, str] | None:
    """The first attribute of an ad with these expressions (name, ClassAd text) that cannot
    be evaluated within ``limit``, and why; None when every one can. Attributes with plain
    values need not be given: a reference to a name no expression defines counts as one.
    ``dynamic``: ``DYNAMIC_FUNCTIONS`` pass as ordinary calls (a startd's own slot ads call
    ``evalInEachContext``; classad2 stops any evaluation after about 10^7 steps)."""
    bodies: dict[str, list[tuple[_Shape, int, int]]] = {}
    names: list[str] = []
    for name, text in expressions:
        shape = _shape(text)
        names.append(name)
        bodies.setdefault(name.lower(), []).append((shape, 0, len(shape.tokens)))
        for defined, start, end in shape.definitions:
            bodies.setdefault(defined, []).append((shape, start, end))
    bounds = _NameBounds(bodies, limit)
    for name in names:
        bound = bounds.name(name.lower())
        if bound.dynamic is not None and not dynamic:
            return name, (f"calls {bound.dynamic}(), which evaluates an expression built while it runs, whose "
                          f"cost cannot be bounded from its text; write the expression out")
        if bound.cost > limit:
            return name, (f"cannot be evaluated within {limit:,} terms: it reads attributes that read "
                          f"others more than once (each read is evaluated again) or references nest more "
                          f"than {MAX_REFERENCE_DEPTH} deep; write it without such nested repeats")
        if bound.growth > 1:
            return name, ("nests string substitution (regexps, replace, replaceall) inside string "
                          "substitution, which grows a string without bound; substitute once")
    return None


class _NameBounds:
    """Bounds of every name by its definitions, each found once; a name read while its own
    bound is being found counts as one token, as ClassAd evaluation stops at such a loop."""

    def __init__(self, bodies: dict[str, list[tuple[_Shape, int, int]]], limit: int):
        self.bodies, self.limit = bodies, limit
        self.known: dict[str, _Bound] = {}
        self.open: set[str] = set()
        self.past = _Bound(limit + 1)
        #: Tokens scanned so far: nested records' bodies overlap, so an ad that makes the scans
        #: themselves long (thousands of nested definitions) counts as past the bound.
        self.scanned = 0

    def name(self, name: str) -> _Bound:
        found = self.known.get(name)
        if found is not None:
            return found
        if name in self.open or name not in self.bodies:
            return _Bound()
        if len(self.open) >= MAX_REFERENCE_DEPTH:
            return self.past
        self.open.add(name)
        worst = _Bound()
        for shape, start, end in self.bodies[name]:
            worst = worst.worst(self.body(shape, start, end))
        self.open.discard(name)
        self.known[name] = worst
        return worst

    def body(self, shape: _Shape, start: int, end: int) -> _Bound:
        """Tokens ``start:end`` of ``shape`` with every reference expanded, saturating past
        the limit."""
        cost, dynamic, frames = 0, None, [[None, 0]]  # per open bracket: its call, the growth inside
        tokens = shape.tokens
        self.scanned += end - start
        if self.scanned > SCAN_LIMIT_FACTOR * self.limit:
            return self.past
        for i in range(start, end):
            kind, value = tokens[i]
            cost += 1
            if kind == "n":
                bound = self.name(value)
                cost += bound.cost
                dynamic = dynamic or bound.dynamic
                frames[-1][1] = max(frames[-1][1], bound.growth)
            elif kind == "c":
                if value in REGEX_FUNCTIONS:
                    cost += REGEX_CALL_COST
                elif value in DYNAMIC_FUNCTIONS:
                    dynamic = dynamic or value
            elif kind == "o" and value in ("(", "[", "{"):
                call = tokens[i - 1][1] if i > start and tokens[i - 1][0] == "c" and value == "(" else None
                frames.append([call, 0])
            elif kind == "o" and value in (")", "]", "}") and len(frames) > 1:
                call, growth = frames.pop()
                frames[-1][1] = max(frames[-1][1], growth + (call in GROWING_FUNCTIONS))
            if cost > self.limit:
                return _Bound(self.limit + 1, 0, dynamic)
        while len(frames) > 1:  # an unclosed call still nests
            call, growth = frames.pop()
            frames[-1][1] = max(frames[-1][1], growth + (call in GROWING_FUNCTIONS))
        return _Bound(cost, frames[0][1], dynamic)
