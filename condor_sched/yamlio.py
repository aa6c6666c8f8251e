"""Reading the project's YAML files (inventory, profiles, workloads) with errors that name
the file and the field; each caller passes its own exception type.

The reader is bounded, so that no file can exhaust memory or the stack: at most
``MAX_YAML_BYTES`` of UTF-8 text, collections nested at most ``MAX_YAML_DEPTH`` deep,
scalars of at most ``MAX_YAML_SCALAR_CHARS`` characters, at most ``MAX_YAML_ALIASES``
aliases, and at most ``MAX_YAML_NODES`` nodes once every alias is expanded (the "billion
laughs" bomb). Error messages show values through :func:`shown`, never whole.

The reader is strict where YAML 1.1 (PyYAML's default) surprises: a key repeated in one
mapping, at any depth, is an error naming its line (YAML 1.1 keeps the last silently; a
merge key ``<<`` may still be overridden by the mapping's own keys, as usual). Plain
values are resolved as YAML 1.2's core schema, less its octal and hexadecimal forms:
``true``/``false`` (``yes``, ``no``, ``on``, ``off`` stay strings), ``null``/``~``/empty,
decimal integers without leading zeros, decimal floats (``1.5``, ``1e5``, ``.inf``,
``.nan``); anything else (``1:30``, ``010``, ``0o17``, ``0x1F``, ``1_000``,
``2024-01-01``) stays a string, so a schema that expects a number refuses it by name.
Explicit tags other than the core ones (``!!str``, ``!!int``, ``!!float``, ``!!bool``,
``!!null``, ``!!seq``, ``!!map``) are refused, and the core ones follow the same rules.
"""
from __future__ import annotations

import difflib
import math
import re
import reprlib
from pathlib import Path
from typing import Any, Iterable

import yaml

MAX_YAML_BYTES = 4 * 1024 * 1024
MAX_YAML_DEPTH = 32
MAX_YAML_SCALAR_CHARS = 4096
MAX_YAML_ALIASES = 1000
MAX_YAML_NODES = 1_000_000
#: The largest number any count, size or time of these files may hold.
MAX_NUMBER = 10**12
#: Keys with this prefix are ignored by every schema: a place for anchors (``x-defaults: &d``).
EXTENSION_PREFIX = "x-"
#: Longest rendering of a value inside an error message.
MAX_SHOWN_CHARS = 80

_REPR = reprlib.Repr()
_REPR.maxlevel, _REPR.maxstring, _REPR.maxother = 2, MAX_SHOWN_CHARS, MAX_SHOWN_CHARS
_REPR.maxlist = _REPR.maxtuple = _REPR.maxdict = _REPR.maxset = 4


def shown(value: Any) -> str:
    """``repr(value)`` cut to at most ``MAX_SHOWN_CHARS`` characters, without walking a
    large or deeply nested value whole."""
    text = _REPR.repr(value)
    return text if len(text) <= MAX_SHOWN_CHARS else text[:MAX_SHOWN_CHARS - 3] + "..."


class _Refused(yaml.MarkedYAMLError):
    """A rule of this module broken, at a place in the file."""


class _TooLarge(_Refused):
    """A bound of this module exceeded, at a place in the file."""


_TAG = "tag:yaml.org,2002:"
_MERGE_TAG = _TAG + "merge"
#: Plain scalars resolved as YAML 1.2 core values (module docstring); all else is a string.
_BOOL = {"true": True, "True": True, "TRUE": True, "false": False, "False": False, "FALSE": False}
_INT = re.compile(r"^[-+]?(?:0|[1-9][0-9]*)\Z")
_FLOAT = re.compile(r"^(?:[-+]?(?:(?:0|[1-9][0-9]*)(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][-+]?[0-9]+)?"
                    r"|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))\Z")
_CORE_TAGS = "!!str, !!int, !!float, !!bool, !!null, !!seq, !!map"


def _scalar_text(loader: yaml.SafeLoader, node: yaml.Node, kind: str) -> str:
    if not isinstance(node, yaml.ScalarNode):
        raise _Refused(problem=f"!!{kind} on a {node.id}, not a plain value", problem_mark=node.start_mark)
    return loader.construct_scalar(node)


def _construct_int(loader: yaml.SafeLoader, node: yaml.Node) -> int:
    text = _scalar_text(loader, node, "int")
    if not _INT.match(text):
        raise _Refused(problem=f"!!int {shown(text)} is not a decimal integer (YAML 1.1 octal, hexadecimal, "
                               "sexagesimal and '_' forms are not read)", problem_mark=node.start_mark)
    return int(text)


def _construct_float(loader: yaml.SafeLoader, node: yaml.Node) -> float:
    text = _scalar_text(loader, node, "float")
    if not (_FLOAT.match(text) or _INT.match(text)):
        raise _Refused(problem=f"!!float {shown(text)} is not a decimal number (YAML 1.1 sexagesimal and '_' "
                               "forms are not read)", problem_mark=node.start_mark)
    return float(text.replace(".", "", 1)) if text[-1].isalpha() else float(text)  # .inf, -.inf, .nan


def _construct_bool(loader: yaml.SafeLoader, node: yaml.Node) -> bool:
    text = _scalar_text(loader, node, "bool")
    if text not in _BOOL:
        raise _Refused(problem=f"!!bool {shown(text)} is not true or false", problem_mark=node.start_mark)
    return _BOOL[text]


def _construct_refused(loader: yaml.SafeLoader, node: yaml.Node) -> None:
    raise _Refused(problem=f"tag {shown(node.tag)} is not read here (only {_CORE_TAGS})", problem_mark=node.start_mark)


class _BoundedLoader(yaml.SafeLoader):
    """PyYAML's safe loader that counts depth, scalar length and aliases while composing,
    resolves plain values as the module docstring says and refuses repeated keys."""

    yaml_implicit_resolvers: dict = {}
    yaml_constructors = {
        **{_TAG + kind: yaml.SafeLoader.yaml_constructors[_TAG + kind] for kind in ("str", "null", "seq", "map")},
        _TAG + "int": _construct_int, _TAG + "float": _construct_float, _TAG + "bool": _construct_bool,
        None: _construct_refused,
    }

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0
        self._aliases = 0
        self._checked: set[int] = set()

    def compose_node(self, parent: yaml.Node | None, index: Any) -> yaml.Node:
        event = self.peek_event()
        if isinstance(event, yaml.AliasEvent):
            self._aliases += 1
            if self._aliases > MAX_YAML_ALIASES:
                raise _TooLarge(problem=f"more than {MAX_YAML_ALIASES} aliases", problem_mark=event.start_mark)
        elif isinstance(event, yaml.ScalarEvent) and len(event.value) > MAX_YAML_SCALAR_CHARS:
            raise _TooLarge(problem=f"a value longer than {MAX_YAML_SCALAR_CHARS} characters",
                            problem_mark=event.start_mark)
        self._depth += 1
        try:
            if self._depth > MAX_YAML_DEPTH:
                raise _TooLarge(problem=f"nested deeper than {MAX_YAML_DEPTH} levels", problem_mark=event.start_mark)
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def flatten_mapping(self, node: yaml.MappingNode) -> None:
        """Refuse a key repeated among the mapping's own keys, then put the merged keys
        (``<<``) in front of them, once per node. Done here rather than by PyYAML, which
        keeps the wrong value when a merged mapping overrides a key it merged itself:
        the mapping's own keys win, then earlier merged mappings over later ones."""
        if id(node) in self._checked:
            return
        self._checked.add(id(node))
        own: list[tuple[yaml.Node, yaml.Node]] = []
        merged: dict[Any, tuple[yaml.Node, yaml.Node]] = {}
        seen: dict[Any, yaml.Node] = {}
        for key_node, value_node in node.value:
            key = "<<" if key_node.tag == _MERGE_TAG else self.construct_object(key_node)
            first = seen.get(_hashable(key, key_node))
            if first is not None:
                raise _Refused(problem=f"duplicate key {shown(key)} (first on line {first.start_mark.line + 1})",
                               problem_mark=key_node.start_mark)
            seen[_hashable(key, key_node)] = key_node
            if key_node.tag != _MERGE_TAG:
                own.append((key_node, value_node))
                continue
            sources = value_node.value if isinstance(value_node, yaml.SequenceNode) else [value_node]
            for source in sources:
                if not isinstance(source, yaml.MappingNode):
                    raise _Refused(problem="a merge key '<<' takes a mapping or a list of mappings, not a "
                                           f"{source.id}", problem_mark=source.start_mark)
                self.flatten_mapping(source)
                winners = {_hashable(self.construct_object(k), k): (k, v) for k, v in source.value}
                for merged_key, pair in winners.items():
                    merged.setdefault(merged_key, pair)
        node.value = list(merged.values()) + own


def _hashable(key: Any, node: yaml.Node) -> Any:
    """``key`` itself where it can be a dict key, else its node (PyYAML refuses it later)."""
    try:
        hash(key)
    except TypeError:
        return node
    return key


for _tag, _pattern, _first in (
        ("bool", r"^(?:true|True|TRUE|false|False|FALSE)\Z", "tTfF"),
        ("int", _INT.pattern, "-+0123456789"),
        ("float", _FLOAT.pattern, "-+0123456789."),
        ("null", r"^(?:~|null|Null|NULL|)\Z", ["~", "n", "N", ""]),
        ("merge", r"^(?:<<)\Z", "<")):
    _BoundedLoader.add_implicit_resolver(_TAG + _tag, re.compile(_pattern), list(_first))


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    if isinstance(node, yaml.MappingNode):
        return [n for pair in node.value for n in pair]
    return []


def _check_expansion(root: yaml.Node) -> None:
    """Raise when the document, every alias expanded, has more than ``MAX_YAML_NODES`` nodes
    or an alias inside its own anchor (walked once per distinct node, without recursion)."""
    size: dict[int, int] = {}
    open_nodes: set[int] = set()
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, closing = stack.pop()
        key = id(node)
        if closing:
            open_nodes.discard(key)
            size[key] = 1 + sum(size[id(child)] for child in _children(node))
            if size[key] > MAX_YAML_NODES:
                raise _TooLarge(problem=f"aliases expand to more than {MAX_YAML_NODES} values",
                                problem_mark=node.start_mark)
        elif key in open_nodes:
            raise _TooLarge(problem="an alias refers to itself (a recursive anchor)", problem_mark=node.start_mark)
        elif key not in size:
            open_nodes.add(key)
            stack.append((node, True))
            stack.extend((child, False) for child in _children(node))


def _place(e: yaml.YAMLError) -> str:
    mark = getattr(e, "problem_mark", None) or getattr(e, "context_mark", None)
    where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
    problem = getattr(e, "problem", None) or str(e)
    return where + " ".join(str(problem).split())


def load_yaml(path: str | Path, error: type[Exception]) -> Any:
    """The document of the YAML file ``path``, within this module's bounds; any failure
    raises ``error`` with a one-line message naming the file and the line."""
    path = Path(path)
    try:
        with path.open("rb") as f:
            data = f.read(MAX_YAML_BYTES + 1)
    except OSError as e:
        raise error(f"{path}: cannot read: {e.strerror}") from None
    if len(data) > MAX_YAML_BYTES:
        raise error(f"{path}: larger than {MAX_YAML_BYTES} bytes")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise error(f"{path}: not UTF-8 text (byte {e.start})") from None
    try:
        loader = _BoundedLoader(text)
    except yaml.reader.ReaderError as e:  # a character YAML does not allow (NUL, most controls)
        line, column = text.count("\n", 0, e.position) + 1, e.position - text.rfind("\n", 0, e.position)
        raise error(f"{path}: not valid YAML: line {line}, column {column}: character #x{e.character:04x} is "
                    "not allowed") from None
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        _check_expansion(node)
        return loader.construct_document(node)
    except _Refused as e:
        raise error(f"{path}: {_place(e)}") from None
    except yaml.YAMLError as e:
        raise error(f"{path}: not valid YAML: {_place(e)}") from None
    except (ValueError, RecursionError) as e:  # a value PyYAML's constructors refuse
        raise error(f"{path}: not valid YAML: {' '.join(str(e).split())[:MAX_SHOWN_CHARS]}") from None
    finally:
        loader.dispose()


def check_keys(where: str, raw: dict[Any, Any], known: Iterable[str], error: type[Exception]) -> None:
    """Raise ``error`` naming the first key of ``raw`` not in ``known`` (with the closest known
    key when one is close): a misspelt key must not be silently ignored. Keys that start
    with ``EXTENSION_PREFIX`` are left to the file's author (a place for anchors)."""
    known = tuple(known)
    for key in raw:
        if key not in known and not (isinstance(key, str) and key.startswith(EXTENSION_PREFIX)):
            close = difflib.get_close_matches(str(key), known, n=1) if isinstance(key, str) else []
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise error(f"{where}: unknown key {shown(key)}{hint}; known: {', '.join(known)}")


def checked_number(where: str, raw: dict[str, Any], key: str, kind: type, minimum: float, error: type[Exception],
                   default: Any = None, strict_minimum: bool = False, maximum: float = MAX_NUMBER) -> Any:
    """``raw[key]`` as ``kind`` (int or float), at least (or above) ``minimum`` and at most
    ``maximum``; missing gives ``default``, or an error when there is none."""
    if key not in raw:
        if default is None:
            raise error(f"{where}: missing '{key}'")
        return default
    value = raw[key]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (kind is int and not isinstance(value, int)):
        raise error(f"{where}: '{key}' must be {'an integer' if kind is int else 'a number'}, got {shown(value)}")
    if isinstance(value, float) and not math.isfinite(value):
        raise error(f"{where}: '{key}' must be a finite number, got {shown(value)}")
    if value > maximum:
        raise error(f"{where}: '{key}' must be <= {int(maximum) if maximum == int(maximum) else maximum}, "
                    f"got {shown(value)}")
    if value < minimum or (strict_minimum and value == minimum):
        raise error(f"{where}: '{key}' must be {'>' if strict_minimum else '>='} {minimum}, got {shown(value)}")
    return kind(value)
