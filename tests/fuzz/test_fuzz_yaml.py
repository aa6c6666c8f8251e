"""Fuzz the YAML files a user gives ``condor-sched``: Spread-n-Share profiles and pool inventories.

Each input starts from a shipped file of examples/, then is mutated: values replaced by huge,
negative, NaN or infinite numbers, YAML 1.1 spellings (``1:30``, ``010``, ``yes``), tags,
anchors and aliases; lines repeated (a duplicate key), dropped or re-indented; non-UTF-8 and
NUL bytes; very long lines. The readers are called in-process (many examples): they return a
profile or an inventory, or raise their own error, one line naming the file. The commands a
user runs (``plan --profiles``, ``simulate --inventory``) are called in a subprocess (a few
examples) under the shared bounds of ``run_bounded``."""
from __future__ import annotations

import re
import sys
import tempfile
from pathlib import Path

from hypothesis import event, given
from hypothesis import strategies as st

from fuzzing import ROOT, fuzz_settings, run_bounded

from condor_sched.inventory import InventoryError, load_inventory
from condor_sched.profiles import ProfileError, load_profile

PROFILES = sorted((ROOT / "examples" / "profiles").glob("*.yaml"))
INVENTORY = ROOT / "examples" / "pools" / "default.yaml"
SNAPSHOT = ROOT / "examples" / "snapshots" / "default"
TEXTS = {path.name: path.read_text() for path in [*PROFILES, INVENTORY]}

#: A key line of a block mapping (not a list item, not a comment).
KEY_LINE = re.compile(r"^\s*([A-Za-z_][\w-]*|\d+):(\s|$)")
#: A number in the code part of a line (not inside a name such as mic0 or a uuid).
NUMBER = re.compile(r"(?<![\w.-])\d+(?:\.\d+)?(?![\w.-])")
#: A plain token in the code part of a line: a key, a name or a number.
TOKEN = re.compile(r"[^\s,\[\]{}:#\"]+")

HOSTILE = st.one_of(
    st.sampled_from([
        "1:30", "1:30.5", "010", "0o17", "0x1F", "0b101", "1_000", "yes", "No", "on", "OFF", "y", "~", "null", "''",
        ".inf", "-.inf", ".nan", "1e999", "-1", "0", "-0", "1" + "0" * 30, str(2**64), "9" * 5000, "1e5", "2024-01-01",
        "!!binary aGVsbG8=", "!!set {a, b}", "!!omap [{a: 1}]", "!!timestamp 2024-01-01", "!!int 1:30", "!!int '7'",
        "!!float 010", "!!bool yes", "!!str 12", "!local x", "!!python/object/apply:os.system [ls]", "*nowhere",
        "&a 8", "[", "{", "}", "]", "'unclosed", '"\\x00"', "\x00", "\t", "\ufeff", "|", ">", "? x", "- x",
        "{<<: {cores: 8}}", "[*a, *a]", "{a: 1, a: 2}",
    ]),
    st.integers(-2**70, 2**70).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.text(max_size=10),
)


def code_end(line: str) -> int:
    """Where the line's comment starts (its length when it has none)."""
    match = re.search(r"(^|\s)#", line)
    return match.start() if match else len(line)


@st.composite
def mutated_yaml(draw: st.DrawFn, names: list[str]) -> bytes:
    """A shipped file with a few values, lines or bytes changed."""
    lines = TEXTS[draw(st.sampled_from(names))].split("\n")
    for _ in range(draw(st.integers(1, 4))):
        index = draw(st.integers(0, len(lines) - 1))
        line = lines[index]
        action = draw(st.sampled_from(["token", "token", "token", "repeat", "drop", "indent", "anchor"]))
        tokens = list(TOKEN.finditer(line[:code_end(line)]))
        if action == "token" and tokens:
            span = draw(st.sampled_from(tokens)).span()
            lines[index] = line[:span[0]] + draw(HOSTILE) + line[span[1]:]
        elif action == "repeat":
            lines.insert(index, line)
        elif action == "drop":
            lines.pop(index)
        elif action == "indent":
            lines[index] = draw(st.sampled_from(["  ", " ", "\t", ""])) + line.lstrip(" " * draw(st.integers(0, 4)))
        elif action == "anchor":
            anchored = draw(st.sampled_from(["8", "{cores: 8}", "[1, 2]", "{a: 1, a: 1}", "!!int 1:30"]))
            lines.insert(0, "x-a: &a " + anchored)
    data = "\n".join(lines).encode("utf-8", "surrogatepass")
    for _ in range(draw(st.sampled_from([0, 0, 0, 1, 2]))):
        at = draw(st.integers(0, len(data)))
        junk = draw(st.one_of(st.binary(min_size=1, max_size=4), st.sampled_from(
            [b"\xff\xfe", b"\xc3", b"\x00", b"\xef\xbb\xbf", b"\t", b"x" * 5000, b"\n  - ", b": :"])))
        data = data[:at] + junk + data[at:]
    return data


def load(path: Path, inventory: bool) -> object:
    """The profile or inventory of ``path``; a refusal must be one bounded line naming the file."""
    error = InventoryError if inventory else ProfileError
    try:
        loaded = load_inventory(path) if inventory else load_profile(path)
    except error as err:
        message = str(err)
        assert str(path) in message and "\n" not in message and len(message) < 1000, message
        event("refused" + re.sub(r"'.*?'|\d+", "N", message.removeprefix(str(path)))[:50])
        return err
    event("read")
    return loaded


def written(tmp: str, data: bytes | str, name: str = "f.yaml") -> Path:
    path = Path(tmp) / name
    path.write_bytes(data.encode() if isinstance(data, str) else data)
    return path


@fuzz_settings()
@given(data=mutated_yaml([p.name for p in PROFILES]))
def test_mutated_profiles_load_or_are_refused_naming_the_file(data):
    with tempfile.TemporaryDirectory() as tmp:
        load(written(tmp, data), inventory=False)


@fuzz_settings()
@given(data=mutated_yaml([INVENTORY.name]))
def test_mutated_inventories_load_or_are_refused_naming_the_file(data):
    with tempfile.TemporaryDirectory() as tmp:
        load(written(tmp, data), inventory=True)


@fuzz_settings()
@given(name=st.sampled_from(sorted(TEXTS)), data=st.data())
def test_a_key_line_repeated_is_refused_naming_its_line_and_key(name, data):
    lines = TEXTS[name].split("\n")
    index = data.draw(st.sampled_from([i for i, line in enumerate(lines) if KEY_LINE.match(line)]))
    key = KEY_LINE.match(lines[index]).group(1)
    lines.insert(index + 1, lines[index])
    with tempfile.TemporaryDirectory() as tmp:
        path = written(tmp, "\n".join(lines))
        refusal = load(path, inventory=name == INVENTORY.name)
    shown_key = key if key.isdigit() else repr(key)
    assert isinstance(refusal, Exception) and f"line {index + 2}, column" in str(refusal), refusal
    assert f"duplicate key {shown_key} (first on line {index + 1})" in str(refusal), refusal


def yaml_1_1_spellings(number: str) -> list[str]:
    """Spellings YAML 1.1 reads as a number that YAML 1.2 (and so this reader) does not."""
    spellings = [f"{number}:00", f"0:{number}", number[:1] + "_" + number[1:] if len(number) > 1 else number + "_0",
                 "0" + number]
    if "." not in number:
        spellings += [f"0x{int(number):x}", f"0b{int(number):b}", f"0o{int(number):o}"]
    return spellings


@fuzz_settings()
@given(name=st.sampled_from(sorted(TEXTS)), data=st.data())
def test_a_number_in_a_yaml_1_1_spelling_is_refused_not_misread(name, data):
    lines = TEXTS[name].split("\n")
    places = [(i, m.span()) for i, line in enumerate(lines) for m in NUMBER.finditer(line[:code_end(line)])]
    index, (start, end) = data.draw(st.sampled_from(places))
    spelling = data.draw(st.sampled_from(yaml_1_1_spellings(lines[index][start:end])))
    lines[index] = lines[index][:start] + spelling + lines[index][end:]
    with tempfile.TemporaryDirectory() as tmp:
        refusal = load(written(tmp, "\n".join(lines)), inventory=name == INVENTORY.name)
    assert isinstance(refusal, Exception), f"{spelling!r} on line {index + 1} of {name} was read"


def condor_sched(*argv: str) -> list[str]:
    return [sys.executable, "-m", "condor_sched", *argv]


@fuzz_settings(2)
@given(data=mutated_yaml([p.name for p in PROFILES]))
def test_plan_with_a_mutated_profile_ends_cleanly(data):
    with tempfile.TemporaryDirectory() as tmp:
        written(tmp, TEXTS["mg.yaml"], "mg.yaml")
        path = written(tmp, data, "fuzzed.yaml")
        out = run_bounded(condor_sched("plan", "--queue", str(SNAPSHOT / "queue.json"), "--machines",
                                       str(SNAPSHOT / "machines.json"), "--profiles", tmp, "--json"), json_out=True)
        refused = isinstance(load(path, inventory=False), Exception)
    assert out.returncode == 0, out.stderr[-2000:]   # a bad profile is skipped and logged, never fatal
    assert ("profile skipped: " + str(path) in out.stderr) == refused, out.stderr[-2000:]


@fuzz_settings(2)
@given(data=mutated_yaml([INVENTORY.name]))
def test_simulate_with_a_mutated_inventory_ends_cleanly(data):
    with tempfile.TemporaryDirectory() as tmp:
        path = written(tmp, data, "pool.yaml")
        out = run_bounded(condor_sched("simulate", "--inventory", str(path), "--workload", "phi-table1", "--jobs", "3",
                                       "--json"), json_out=True)
    assert out.returncode in (0, 2), out.stderr[-2000:]
    if out.returncode == 2:
        assert str(path) in out.stderr and out.stderr.count("\n") == 1, out.stderr
