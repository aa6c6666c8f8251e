"""Snapshot files: ``condor_q -json`` / ``condor_status -json`` and ``-long`` files read whole
(:func:`read_ads`) or streamed ad by ad into a pool state (:func:`state_from_snapshot`; a
big queue file in two processes, half of its ads each), within the bounds
``MAX_SNAPSHOT_BYTES`` and ``MAX_ADS`` (a file that breaks one or does not parse:
:class:`SnapshotError`), and ads written as ``condor_q -json`` (:func:`ads_to_json`)."""
from __future__ import annotations

import codecs
import json
import multiprocessing
import os
import re
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any, BinaryIO, Callable, Iterable, Iterator, NamedTuple

import classad2

from condor_sched.classads.json_values import (
    MAX_EXPRESSION_CHARS,
    MAX_VALUE_DEPTH,
    _BadValue,
    _EXPR_PREFIX,
    _EXPR_SUFFIX,
    _classad,
    _expression,
    _json_int,
    _real,
)
from condor_sched.classads.plain import _EXPRESSIONS, _LAYOUTS, _MAX_CACHED, _PlainAd
from condor_sched.classads.state import _JobRead, _build_state, _read_jobs
from condor_sched.model import PoolState

# tests/unit/test_readers.py and test_bad_input.py import this module under the package's name,
# so that their patches of its globals reach the readers; they reach these names through it too.
from condor_sched.classads.eligibility import _SlotClasses, _targets, eligible_slots  # noqa: F401
from condor_sched.classads.jobs import (  # noqa: F401
    _RECORD_PER_JOB_READS,
    _record_reads,
    job_from_ad,
    request_problem,
)
from condor_sched.classads.plain import AdError, plain_ads  # noqa: F401


class SnapshotError(ValueError):
    """A snapshot file that cannot be parsed at all; names the file and the place."""


#: Bounds of what a snapshot reader accepts: the file's size and the ClassAds in it (a value's
#: nesting and an expression's text: ``json_values.MAX_VALUE_DEPTH``, ``MAX_EXPRESSION_CHARS``).
MAX_SNAPSHOT_BYTES = 2**30
MAX_ADS = 1_000_000
#: The deepest JSON the reader parses (the list of ads, an ad, then its values).
_MAX_JSON_DEPTH = MAX_VALUE_DEPTH + 2


def read_ads(path: str | Path) -> list[classad2.ClassAd]:
    """Ads from a ``condor_q -json`` / ``condor_status -json`` file or ``-long`` text; a file
    that breaks a bound or does not parse raises :class:`SnapshotError` naming it and the place."""
    path = Path(path)
    try:
        with path.open("rb") as f:
            data = f.read(MAX_SNAPSHOT_BYTES + 1)
    except OSError as e:
        raise SnapshotError(f"{path}: cannot read: {e.strerror or e}") from None
    if len(data) > MAX_SNAPSHOT_BYTES:
        raise SnapshotError(f"{path}: larger than {MAX_SNAPSHOT_BYTES} bytes")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        raise SnapshotError(f"{path}: not UTF-8 text (line {line}, byte {e.start})") from None
    if text.lstrip().startswith(("[", "{")):
        return _ads_from_json(path, text)
    return _ads_from_long(path, text)


def _ads_from_json(path: Path, text: str) -> list[classad2.ClassAd]:
    """ClassAds built straight from the parsed JSON (``condor_q -json``): numbers, strings,
    booleans, null (undefined), lists and nested ads as ClassAd values, ``"/Expr(...)/"``
    strings as expressions."""
    try:
        data = json.loads(text, parse_int=_json_int)
    except json.JSONDecodeError as e:
        raise SnapshotError(f"{path}: bad JSON at line {e.lineno} column {e.colno}: {e.msg}") from None
    except RecursionError:
        line, column = _too_deep(text, _MAX_JSON_DEPTH)
        raise SnapshotError(f"{path}: nested deeper than {_MAX_JSON_DEPTH} levels at line {line} "
                            f"column {column}") from None
    if isinstance(data, dict):
        data = [data]
    if not isinstance(data, list):
        raise SnapshotError(f"{path}: expected a JSON list of ClassAds")
    if len(data) > MAX_ADS:
        raise SnapshotError(f"{path}: more than {MAX_ADS} ClassAds")
    ads = []
    for i, obj in enumerate(data):
        if not isinstance(obj, dict):
            raise SnapshotError(f"{path}: item {i} is not a JSON object")
        try:
            ads.append(_classad(obj, 0))
        except _BadValue as e:
            raise SnapshotError(f"{path}: item {i}, attribute {e.attribute}: {e.problem}") from None
    return ads


def _too_deep(text: str, limit: int) -> tuple[int, int]:
    """Line and column where JSON ``text`` first nests deeper than ``limit`` (strings skipped)."""
    depth = 0
    for token in re.finditer(r'"(?:[^"\\]|\\.)*"|[\[{]|[\]}]', text):
        char = token.group()
        if char in "[{":
            depth += 1
            if depth > limit:
                line = text.count("\n", 0, token.start()) + 1
                return line, token.start() - text.rfind("\n", 0, token.start())
        elif char in "]}":
            depth -= 1
    return 1, 1


#: ``-long`` text: ``Attr = value`` lines (HTCondor's attribute names) and ``#`` comments.
_LONG_LINE = re.compile(r"^[ \t]*([A-Za-z_][A-Za-z0-9_.]*)[ \t]*=(.*)$")
_LONG_NAMES = re.compile(r"^[ \t]*([A-Za-z_][A-Za-z0-9_.]*)[ \t]*=", re.MULTILINE)
_LONG_AD = re.compile(r"(?:[ \t]*(?:[A-Za-z_][A-Za-z0-9_.]*[ \t]*=[^\n]{0,%d}|#[^\n]*)(?:\n|\Z))*"
                      % MAX_EXPRESSION_CHARS)
_LONG_BLOCK = re.compile(r"(?:^[ \t\r\f\v]*\S.*(?:\n|\Z))+", re.MULTILINE)


def _ads_from_long(path: Path, text: str) -> list[classad2.ClassAd]:
    """Ads from ``-long`` text: ``Attr = value`` lines, ads separated by lines holding only
    whitespace, ``#`` comment lines. Any other line, or a value that does not parse, is an
    error naming the line: such a file is cut off or not ``-long`` output, and planning on
    part of it would lose jobs without a reason."""
    text = text.replace("\r\n", "\n")
    ads: list[classad2.ClassAd] = []
    line, at = 1, 0
    for block in _LONG_BLOCK.finditer(text):
        line += text.count("\n", at, block.start())
        at = block.start()
        if len(ads) == MAX_ADS:
            raise SnapshotError(f"{path}: more than {MAX_ADS} ClassAds (line {line})")
        ad = _long_ad(path, block.group(), line)
        if ad is not None:
            ads.append(ad)
    return ads


def _long_ad(path: Path, block: str, first_line: int) -> classad2.ClassAd | None:
    """One ``-long`` ad (None: only comments). The lines are checked and classad2 parses the
    block at once (fast); it must have read every attribute, else the line it refused is named."""
    listed = _LONG_NAMES.findall(block)
    names = set(map(str.lower, listed))
    if _LONG_AD.fullmatch(block) is None:
        _refuse_long_line(path, block, first_line)
        raise SnapshotError(f"{path}: the ClassAd at line {first_line} does not parse")
    if len(names) < len(listed):
        _refuse_repeated(path, block, first_line)
    if not names:
        return None
    try:
        ad = classad2.parseNext(block, classad2.ParserType.Old)  # parseOne copies it attribute by attribute
    except Exception:
        ad = None
    if ad is not None and len(ad) == len(names):
        return ad
    _refuse_long_line(path, block, first_line)
    raise SnapshotError(f"{path}: the ClassAd at line {first_line} does not parse")


def _refuse_repeated(path: Path, block: str, first_line: int) -> None:
    """Raise SnapshotError naming an attribute given twice in one ad (two ads without the
    blank line between them would otherwise read as one, losing a job)."""
    seen: dict[str, int] = {}
    for number, line in enumerate(block.splitlines(), first_line):
        match = _LONG_LINE.match(line)
        if match is not None:
            name = match.group(1).lower()
            if name in seen:
                raise SnapshotError(f"{path}: line {number}: {match.group(1)} again (as on line {seen[name]}): "
                                    "is a blank line missing between two ClassAds?")
            seen[name] = number


def _refuse_long_line(path: Path, block: str, first_line: int) -> None:
    """Raise SnapshotError naming the first line of ``block`` that is not ``Attr = value``,
    holds too long a value or does not parse; return when every line is a comment."""
    for number, line in enumerate(block.splitlines(), first_line):
        match = _LONG_LINE.match(line)
        if match is None:
            if line.lstrip().startswith("#"):
                continue
            raise SnapshotError(f"{path}: line {number} is not 'Attr = value'")
        name, value = match.group(1), match.group(2).strip()
        if len(value) > MAX_EXPRESSION_CHARS:
            raise SnapshotError(f"{path}: line {number}: {name}: value longer than {MAX_EXPRESSION_CHARS} characters")
        try:
            classad2.ExprTree(value)
        except Exception:
            raise SnapshotError(f"{path}: line {number}: {name} does not parse") from None


def ads_to_json(ads: Iterable[classad2.ClassAd]) -> str:
    """The ``condor_q -json`` format: a JSON list of ClassAd objects."""
    return "[\n" + ",\n".join(ad.printJson().strip() for ad in ads) + "\n]\n"


class _Fallback(Exception):
    """The streaming reader met what the whole-file reader must judge (an error, a lone object)."""


class _SplitFailed(Exception):
    """Reading a file in two halves did not work out (the cut was not between two ads, a bad
    ad, the other process failed): read it in one stream instead."""


class _Span(NamedTuple):
    """Bytes ``start`` to ``end`` of a file, read as if ``head`` came before and ``tail`` after."""
    start: int
    end: int
    head: bytes
    tail: bytes


class _SpanReader:
    """``read`` of a :class:`_Span` of an open file."""

    def __init__(self, f: BinaryIO, span: _Span):
        self.f, self.left, self.pending = f, span.end - span.start, span.head
        self.tail = span.tail
        f.seek(span.start)

    def read(self, size: int) -> bytes:
        data, self.pending = self.pending, b""
        if self.left > 0:
            chunk = self.f.read(min(size, self.left))
            self.left = self.left - len(chunk) if chunk else 0
            data += chunk
        if self.left <= 0:
            data, self.tail = data + self.tail, b""
        return data


#: Queue files from this size are read in two processes, half of the ads each, when the
#: process may run on two CPUs (``plan`` on 100k ads, 520 MB: parsing JSON is half its time).
SPLIT_READ_BYTES = 64 << 20
#: Where one ad ends and the next begins: ``}``, a comma, ``{`` and the quote of a name. Inside
#: a string this cannot end in a quote; inside an ad it leaves the first half unbalanced, so the
#: first half parsing as a list proves the cut.
_AD_BOUNDARY = re.compile(rb'\}[ \t\r\n]*(,)[ \t\r\n]*(\{)[ \t\r\n]*"')


def _halves(path: Path) -> tuple[_Span, _Span] | None:
    """The two halves of a queue file worth reading apart, cut between two ads near the middle."""
    try:
        size = path.stat().st_size
        if not SPLIT_READ_BYTES <= size <= MAX_SNAPSHOT_BYTES or len(os.sched_getaffinity(0)) < 2:
            return None
        with path.open("rb") as f:
            f.seek(size // 2)
            found = _AD_BOUNDARY.search(f.read(1 << 20))
    except OSError:
        return None
    if found is None:
        return None
    comma, brace = size // 2 + found.start(1), size // 2 + found.start(2)
    return _Span(0, comma, b"", b"]"), _Span(brace, size, b"[", b"")


def _split_reader(path: Path) -> Callable[[set[str]], Iterator[_JobRead]] | None:
    """``_build_state``'s reader of a big queue file in two processes: a forked child reads the
    second half of the ads while this process reads the first, and sends its entries back.
    Raises _SplitFailed (read the file in one stream) on anything but two clean halves."""
    halves = _halves(path)
    if halves is None:
        return None

    def read(start_refs: set[str]) -> Iterator[_JobRead]:
        context = multiprocessing.get_context("fork")
        receiver, sender = context.Pipe(duplex=False)
        child = context.Process(target=_read_half, args=(path, halves[1], start_refs, sender), daemon=True)
        child.start()
        sender.close()
        try:
            count = 0
            try:
                for entry in _read_jobs([(None, _span_ads(path, halves[0]))], start_refs):
                    count += 1
                    yield entry
                rest = receiver.recv()
            except (_Fallback, EOFError, OSError):
                raise _SplitFailed from None
            if rest is None or count + len(rest) > MAX_ADS:
                raise _SplitFailed
            yield from rest
        finally:
            receiver.close()
            child.join(timeout=5)
            if child.is_alive():
                child.kill()
                child.join()

    return read


def _read_half(path: Path, span: _Span, start_refs: set[str], sender: Connection) -> None:
    """The child of ``_split_reader``: its half's entries, or None when it cannot read them."""
    try:
        entries: list[_JobRead] | None = list(_read_jobs([(None, _span_ads(path, span))], start_refs))
    except Exception:
        entries = None
    sender.send(entries)
    sender.close()


def _span_ads(path: Path, span: _Span) -> Iterator[_PlainAd]:
    """The ads of one half of a queue file; _Fallback on anything ``_stream_ads`` would fall
    back on (the caller then reads the whole file as one stream)."""
    escapes = {"surrogate": False}
    for obj in _json_items(path, escapes, span):
        yield _checked(obj, escapes["surrogate"])


def state_from_snapshot(queue: str | Path, machines: str | Path) -> PoolState:
    """The pool state of snapshot files, as ``state_from_ads(read_ads(queue), read_ads(machines))``
    gives it, with the same errors, but read as a stream: the machines first, then each job ad
    parsed alone, checked as ``read_ads`` checks it, turned into a record and dropped; only
    expressions are parsed with classad2 (each distinct text once) and a job's ClassAd is built
    only when an attribute the planner reads is an expression (issue 11). A big queue file is
    read in two processes (``_split_reader``), half of its ads each, the same entries in order."""
    try:
        try:
            split = _split_reader(Path(queue))
            if split is not None:
                return _build_state(split, _machine_ads(Path(machines)))
        except _SplitFailed:
            pass
        return _build_state([(None, _stream_ads(Path(queue)))], _machine_ads(Path(machines)))
    except _BadMachines as bad:
        try:
            for _ in _stream_ads(Path(queue)):  # a bad queue file is named first, as by read_ads
                pass
        except _Fallback:
            pass
        raise bad.error from None
    except _Fallback:
        return _build_state([(None, read_ads(queue))], read_ads(machines))


class _BadMachines(Exception):
    def __init__(self, error: SnapshotError):
        super().__init__(str(error))
        self.error = error


def _machine_ads(path: Path) -> Iterator[classad2.ClassAd | _PlainAd]:
    """``_stream_ads`` of the machines file, its SnapshotError wrapped (``state_from_snapshot``)."""
    try:
        yield from _stream_ads(path)
    except SnapshotError as e:
        raise _BadMachines(e) from None


def _stream_ads(path: Path) -> Iterator[classad2.ClassAd | _PlainAd]:
    """The ads of a snapshot file one at a time: JSON lists streamed (:func:`_json_items`), any
    other file, and any file the stream cannot judge, read whole by :func:`read_ads`. Raises
    SnapshotError as ``read_ads`` does, or _Fallback after part of a file was given (then
    ``read_ads`` has found no error: read it whole)."""
    escapes = {"surrogate": False}
    items = _json_items(path, escapes)
    try:
        first = next(items, None)
    except _Fallback:
        yield from read_ads(path)
        return
    if first is None:
        return
    try:
        yield _checked(first, escapes["surrogate"])
        for obj in items:
            yield _checked(obj, escapes["surrogate"])
    except _Fallback:
        read_ads(path)  # raises the error, as the whole-file reader names it
        raise


def _checked(obj: Any, surrogates: bool) -> _PlainAd:
    """One streamed JSON item as ``_ads_from_json`` takes it, as a view; _Fallback when it
    refuses it. ``surrogates``: the file has ``\\uD800``-like escapes, so every string is checked."""
    if obj.__class__ is not dict:
        raise _Fallback
    if surrogates:
        _big_reals(obj)
        try:
            return _PlainAd(obj, _classad(obj, 0))
        except _BadValue:
            raise _Fallback from None
    names = _LAYOUTS.get("\0".join(obj))
    if names is None and not _names_ok(tuple(obj)):
        raise _Fallback
    if _nothing_to_check(obj):
        return _PlainAd(obj, names=names)
    _check_nested(obj, -1)  # the ad's own values at depth -1, its lists and nested ads from 0
    return _PlainAd(obj)


def _nothing_to_check(obj: dict) -> bool:
    """True when every value of ``obj`` is a string that is no new expression, an integer of 64
    bits, a real, a boolean or null: the usual ad, told in one lean pass (4x the full check)."""
    for value in obj.values():
        kind = value.__class__
        if kind is str:
            if value[:6] != _EXPR_PREFIX or value in _EXPRESSIONS:
                continue
        elif kind is int:
            if -9223372036854775808 <= value < 9223372036854775808:
                continue
        elif kind is float or kind is bool or value is None:
            continue
        return False
    return True


def _known_expression(value: str) -> None:
    """Remember ``"/Expr(...)/"`` as classad2 prints it; _Fallback when it does not parse."""
    try:
        text = str(_expression(value[len(_EXPR_PREFIX):-len(_EXPR_SUFFIX)]))
    except _BadValue:
        raise _Fallback from None
    if len(_EXPRESSIONS) < _MAX_CACHED:
        _EXPRESSIONS[value] = text


def _check_nested(value: list | dict, depth: int) -> None:
    """``json_values._value``'s checks of a list or nested ad, without building it (integers beyond 64 bits
    made reals, as ``_json_int`` reads them); _Fallback where ``json_values._value`` refuses."""
    if depth >= MAX_VALUE_DEPTH:
        raise _Fallback
    if value.__class__ is dict:
        if not _names_ok(tuple(value)):
            raise _Fallback
        keys: Iterable = list(value)
    else:
        keys = range(len(value))
    for key in keys:
        item = value[key]
        kind = item.__class__
        if kind is str:
            if item.startswith(_EXPR_PREFIX) and item.endswith(_EXPR_SUFFIX) and item not in _EXPRESSIONS:
                _known_expression(item)
        elif kind is int:
            if not -2**63 <= item < 2**63:
                value[key] = _real(item)
        elif kind is list or kind is dict:
            _check_nested(item, depth + 1)


def _big_reals(value: list | dict) -> None:
    """Integers beyond 64 bits in ``value`` made reals, in place (``_json_int``)."""
    for key in (list(value) if value.__class__ is dict else range(len(value))):
        item = value[key]
        if item.__class__ is int and not -2**63 <= item < 2**63:
            value[key] = _real(item)
        elif item.__class__ is list or item.__class__ is dict:
            _big_reals(item)


def _names_ok(layout: tuple[str, ...]) -> bool:
    """True when classad2 takes these attribute names."""
    try:
        classad2.ClassAd(dict.fromkeys(layout, 0))
    except Exception:
        return False
    return True


_JSON_SPACE = re.compile(r"[ \t\n\r]*")
_CHUNK_BYTES = 1 << 22


_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


def _json_items(path: Path, escapes: dict[str, bool], span: _Span | None = None) -> Iterator[Any]:
    """Each item of a file holding a JSON list, parsed one at a time from 4 MiB reads (the text
    is never held whole); _Fallback for anything else (an object, a BOM, not UTF-8, a syntax
    error, a bound broken: ``read_ads`` names it). Sets ``escapes["surrogate"]`` once the text
    has an escape of half a UTF-16 pair. ``span``: read only those bytes of the file, as a list."""
    try:
        raw = path.open("rb")
    except OSError:
        raise _Fallback from None
    with raw:
        if os.fstat(raw.fileno()).st_size > MAX_SNAPSHOT_BYTES:
            raise _Fallback
        f = raw if span is None else _SpanReader(raw, span)
        decoder = codecs.getincrementaldecoder("utf-8")()
        scan = json.JSONDecoder().raw_decode  # integers beyond 64 bits: _checked
        state = {"buf": "", "pos": 0, "eof": False, "read": 0}

        def fill() -> None:
            data = f.read(_CHUNK_BYTES)
            state["read"] += len(data)
            if state["read"] > MAX_SNAPSHOT_BYTES:
                raise _Fallback
            try:
                text = decoder.decode(data, final=not data)
            except UnicodeDecodeError:
                raise _Fallback from None
            state["buf"], state["pos"], state["eof"] = state["buf"][state["pos"]:] + text, 0, not data
            if not escapes["surrogate"] and _SURROGATE_ESCAPE.search(state["buf"]):
                escapes["surrogate"] = True

        def next_char() -> str:
            """The next non-space character ('' at the end), not consumed."""
            while True:
                pos = _JSON_SPACE.match(state["buf"], state["pos"]).end()
                state["pos"] = pos
                if pos < len(state["buf"]):
                    return state["buf"][pos]
                if state["eof"]:
                    return ""
                fill()

        if next_char() != "[":
            raise _Fallback
        state["pos"] += 1
        count = 0
        if next_char() == "]":
            state["pos"] += 1
        else:
            while True:
                if next_char() != "{":
                    raise _Fallback
                while True:
                    buf = state["buf"]
                    try:
                        obj, end = scan(buf, state["pos"])
                        break
                    except json.JSONDecodeError as e:
                        cut = e.msg.startswith("Unterminated string") or e.pos >= len(buf) - 16
                        if state["eof"] or not cut:
                            raise _Fallback from None
                        fill()
                    except (RecursionError, ValueError):  # ValueError: an integer of 4300 digits and more
                        raise _Fallback from None
                state["pos"] = end
                count += 1
                if count > MAX_ADS:
                    raise _Fallback
                yield obj
                char = next_char()
                state["pos"] += 1
                if char == "]":
                    break
                if char != ",":
                    raise _Fallback
        if next_char() != "":
            raise _Fallback
