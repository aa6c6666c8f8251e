"""The YAML reader every project file goes through: bounded, one-line errors naming file and place."""
from __future__ import annotations

from pathlib import Path

import pytest

from condor_sched.inventory import InventoryError, default_inventory_path, load_inventory
from condor_sched.profiles import ProfileError, ProfileStore, default_profiles_dir, load_profile
from condor_sched.simulate.workloads import WorkloadError, read_yaml
from condor_sched.yamlio import (
    MAX_YAML_ALIASES, MAX_YAML_BYTES, MAX_YAML_DEPTH, MAX_YAML_SCALAR_CHARS, MAX_SHOWN_CHARS, load_yaml, shown,
)


class BadFile(ValueError):
    pass


BILLION_LAUGHS = """\
a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]
b: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a]
c: &c [*b,*b,*b,*b,*b,*b,*b,*b,*b]
d: &d [*c,*c,*c,*c,*c,*c,*c,*c,*c]
e: &e [*d,*d,*d,*d,*d,*d,*d,*d,*d]
f: &f [*e,*e,*e,*e,*e,*e,*e,*e,*e]
g: &g [*f,*f,*f,*f,*f,*f,*f,*f,*f]
h: &h [*g,*g,*g,*g,*g,*g,*g,*g,*g]
i: &i [*h,*h,*h,*h,*h,*h,*h,*h,*h]
jobs: [*i]
"""


def write(tmp_path: Path, text: str | bytes, name: str = "f.yaml") -> Path:
    path = tmp_path / name
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    return path


def test_alias_bomb_is_refused_naming_the_file_before_it_is_expanded(tmp_path):
    path = write(tmp_path, BILLION_LAUGHS)
    with pytest.raises(BadFile, match=r"f\.yaml: .*aliases expand to more than") as e:
        load_yaml(path, BadFile)
    assert len(str(e.value)) < 300 and "\n" not in str(e.value)


def test_too_many_aliases_are_refused(tmp_path):
    text = "x: &x 1\nl: [" + ",".join(["*x"] * (MAX_YAML_ALIASES + 1)) + "]\n"
    with pytest.raises(BadFile, match=f"more than {MAX_YAML_ALIASES} aliases"):
        load_yaml(write(tmp_path, text), BadFile)


def test_recursive_alias_is_refused(tmp_path):
    with pytest.raises(BadFile, match="refers to itself"):
        load_yaml(write(tmp_path, "a: &a [1, *a]\n"), BadFile)


def test_deep_nesting_is_refused_with_the_line_not_a_recursion_error(tmp_path):
    text = "a: " + "[" * 100_000 + "]" * 100_000 + "\n"
    with pytest.raises(BadFile, match=rf"f\.yaml: line 1, column \d+: nested deeper than {MAX_YAML_DEPTH}"):
        load_yaml(write(tmp_path, text), BadFile)


def test_a_file_larger_than_the_bound_is_refused_unread(tmp_path):
    path = write(tmp_path, b"# " + b"x" * MAX_YAML_BYTES)
    with pytest.raises(BadFile, match=f"larger than {MAX_YAML_BYTES} bytes"):
        load_yaml(path, BadFile)


def test_a_long_scalar_is_refused(tmp_path):
    with pytest.raises(BadFile, match=f"longer than {MAX_YAML_SCALAR_CHARS} characters"):
        load_yaml(write(tmp_path, "a: " + "1" * 5000 + "\n"), BadFile)


def test_non_utf8_file_names_the_file_and_byte(tmp_path):
    with pytest.raises(BadFile, match=r"f\.yaml: not UTF-8 text \(byte 11\)"):
        load_yaml(write(tmp_path, b"program: X\n\xff\xfe\n"), BadFile)


def test_invalid_yaml_is_one_line_with_line_and_column(tmp_path):
    with pytest.raises(BadFile, match=r"f\.yaml: not valid YAML: line \d+, column \d+: ") as e:
        load_yaml(write(tmp_path, "a: [1,\nb: {\n"), BadFile)
    assert "\n" not in str(e.value)


def test_shown_truncates_huge_and_nested_values():
    assert len(shown("x" * 10_000)) <= MAX_SHOWN_CHARS
    nested: list = []
    for _ in range(1000):
        nested = [nested, nested]
    assert len(shown(nested)) <= MAX_SHOWN_CHARS
    assert shown(10) == "10" and shown("a") == "'a'"


def test_misspelt_workload_key_is_refused_naming_key_file_place_and_suggestion(tmp_path):
    path = write(tmp_path, "jobs:\n  - {device_memory_mb: 800, devcie_threads: 60, runtime_s: 3}\n")
    with pytest.raises(WorkloadError, match=r"f\.yaml: jobs\[0\]: unknown key 'devcie_threads' "
                                            r"\(did you mean 'device_threads'\?\)"):
        read_yaml(path)


def test_unknown_top_level_workload_key_is_refused(tmp_path):
    path = write(tmp_path, "jobs:\n  - {device_memory_mb: 800, device_threads: 60, runtime_s: 3}\njbos: []\n")
    with pytest.raises(WorkloadError, match=r"f\.yaml: unknown key 'jbos' \(did you mean 'jobs'\?\)"):
        read_yaml(path)


def test_misspelt_inventory_keys_are_refused(tmp_path):
    node = "nodes:\n  - name: n1\n    cores: 8\n    memory_mb: 8192\n    sockets: [{llc_ways: 20, mem_bw_gbs: 50}]\n"
    with pytest.raises(InventoryError, match=r"nodes\[0\] \(n1\): unknown key 'memroy_mb'"):
        load_inventory(write(tmp_path, node + "    memroy_mb: 1\n"))
    with pytest.raises(InventoryError, match=r"socket 0: unknown key 'llc_way' \(did you mean 'llc_ways'\?\)"):
        load_inventory(write(tmp_path, node.replace("llc_ways", "llc_way")))
    device = "    devices: [{name: mic0, memory_mb: 8192, hardware_threads: 240, host_core: 2}]\n"
    with pytest.raises(InventoryError, match=r"device 0: unknown key 'host_core'"):
        load_inventory(write(tmp_path, node + device))


def test_misspelt_profile_keys_are_refused(tmp_path):
    good = (default_profiles_dir() / "mg.yaml").read_text()
    with pytest.raises(ProfileError, match=r"unknown key 'max_scales' \(did you mean 'max_scale'\?\)"):
        load_profile(write(tmp_path, good.replace("max_scale:", "max_scales:")))
    with pytest.raises(ProfileError, match=r"curves\.1: unknown key 'ipc_lc'"):
        load_profile(write(tmp_path, good.replace("ipc_llc", "ipc_lc", 1)))


def test_anchors_under_an_x_key_and_merge_keys_still_work(tmp_path):
    path = write(tmp_path, "x-node: &d {cores: 8, memory_mb: 8192, sockets: [{llc_ways: 20, mem_bw_gbs: 50}]}\n"
                           "nodes:\n  - {<<: *d, name: n1}\n  - {<<: *d, name: n2, cores: 16}\n")
    assert [n.cores for n in load_inventory(path).nodes] == [8, 16]


def test_shipped_examples_still_load():
    store = ProfileStore.load_dir(default_profiles_dir())
    assert len(store) == 12 and not store.skipped
    assert load_inventory(default_inventory_path()).nodes


def test_error_about_a_huge_value_does_not_format_it_whole(tmp_path):
    path = write(tmp_path, "jobs:\n  - {runtime_s: 3, device_threads: 60, device_memory_mb: [" + ",".join(["1"] * 50_000) + "]}\n")
    with pytest.raises(WorkloadError) as e:
        read_yaml(path)
    assert len(str(e.value)) < 300


# --- YAML 1.1 surprises: repeated keys, sexagesimal, octal, yes/no, exotic tags ----------------

NODE = "nodes:\n  - name: n1\n    cores: 12\n    memory_mb: 8192\n    sockets: [{llc_ways: 20, mem_bw_gbs: 50}]\n"


@pytest.mark.parametrize("text, line, key", [
    (NODE + "    cores: 4096\n", 6, "'cores'"),                                  # the probe's case: last won
    ("nodes: []\nnodes: []\n", 2, "'nodes'"),
    (NODE.replace("mem_bw_gbs: 50}", "mem_bw_gbs: 50, llc_ways: 40}"), 5, "'llc_ways'"),   # in a flow mapping
    ("x-d: &d {cores: 8, cores: 16}\n" + NODE, 1, "'cores'"),                 # in an anchor under x-
    ("x-d: &d {a: 1}\nx-e: {<<: *d, <<: *d}\n", 2, "'<<'"),
    ("x-e: {<<: {a: 1, a: 2}}\n", 1, "'a'"),                                    # in a merged mapping
    ("x: {1: a, 1.0: b}\n", 1, "1.0"),                                          # equal keys collapse in Python
])
def test_a_repeated_key_at_any_depth_names_file_line_and_key(tmp_path, text, line, key):
    with pytest.raises(BadFile, match=rf"f\.yaml: line {line}, column \d+: duplicate key {key} \(first on line \d+\)"):
        load_yaml(write(tmp_path, text), BadFile)
    with pytest.raises(InventoryError, match="duplicate key"):
        load_inventory(write(tmp_path, text))


def test_a_merged_key_is_still_overridden_by_the_mapping_and_nested_merges_keep_the_override(tmp_path):
    path = write(tmp_path, "x-b: &b {cores: 8, memory_mb: 8192, sockets: [{llc_ways: 20, mem_bw_gbs: 50}]}\n"
                           "x-n: &n {<<: *b, cores: 16}\n"
                           "nodes:\n  - {<<: *n, name: n1}\n  - {<<: [*b, *n], name: n2}\n"
                           "  - {<<: *n, name: n3, cores: 4}\n")
    # PyYAML alone gives n1 8 cores: it keeps the first of the merged 'cores' of *n.
    assert [n.cores for n in load_inventory(path).nodes] == [16, 8, 4]


@pytest.mark.parametrize("plain, value", [
    ("1:30", "1:30"), ("010", "010"), ("0o17", "0o17"), ("0x1F", "0x1F"), ("1_000", "1_000"), ("0b101", "0b101"),
    ("2024-01-01", "2024-01-01"), ("yes", "yes"), ("No", "No"), ("on", "on"), ("OFF", "OFF"), ("=", "="),
    ("00.5", "00.5"), ("1:30.5", "1:30.5"),
    ("true", True), ("False", False), ("~", None), ("null", None), ("12", 12), ("-3", -3), ("+7", 7), ("0", 0),
    ("1.5", 1.5), ("1e5", 100000.0), ("-2.5E-3", -0.0025), (".5", 0.5),
])
def test_plain_values_follow_yaml_1_2_core_and_the_rest_stays_a_string(tmp_path, plain, value):
    assert load_yaml(write(tmp_path, f"a: {plain}\n"), BadFile) == {"a": value}


def test_special_floats_are_read_for_the_schemas_to_refuse(tmp_path):
    import math

    values = load_yaml(write(tmp_path, "a: [.inf, -.Inf, .NaN]\n"), BadFile)["a"]
    assert values[:2] == [math.inf, -math.inf] and math.isnan(values[2])


@pytest.mark.parametrize("text, problem", [
    ("a: !!int 1:30\n", r"!!int '1:30' is not a decimal integer"),
    ("a: !!int 010\n", r"!!int '010' is not a decimal integer"),
    ("a: !!float 1:30\n", r"!!float '1:30' is not a decimal number"),
    ("a: !!bool yes\n", r"!!bool 'yes' is not true or false"),
    ("a: !!int [1]\n", r"!!int on a sequence"),
    ("a: !!binary aGVsbG8=\n", r"tag 'tag:yaml.org,2002:binary' is not read here"),
    ("a: !!timestamp 2024-01-01\n", r"tag 'tag:yaml.org,2002:timestamp' is not read here"),
    ("a: !!set {x, y}\n", r"tag 'tag:yaml.org,2002:set' is not read here"),
    ("a: !!omap [{x: 1}]\n", r"tag 'tag:yaml.org,2002:omap' is not read here"),
    ("a: !local x\n", r"tag '!local' is not read here"),
    ("a: !!python/object/apply:os.system [ls]\n", r"tag '\S+os\.system' is not read here"),
    ("a: {<<: [1]}\n", r"a merge key '<<' takes a mapping or a list of mappings"),
])
def test_tags_beyond_the_core_schema_are_refused_naming_the_line(tmp_path, text, problem):
    with pytest.raises(BadFile, match=rf"f\.yaml: line 1, column \d+: {problem}"):
        load_yaml(write(tmp_path, text), BadFile)
    assert load_yaml(write(tmp_path, "a: !!int '12'\nb: !!str 1:30\nc: !!float 3\n"), BadFile) == {
        "a": 12, "b": "1:30", "c": 3.0}


@pytest.mark.parametrize("edit, message", [
    (("cores: 12", "cores: 1:30"), r"'cores' must be an integer, got '1:30'"),      # YAML 1.1: 90
    (("cores: 12", "cores: 010"), r"'cores' must be an integer, got '010'"),        # YAML 1.1: 8
    (("cores: 12", "cores: 0o14"), r"'cores' must be an integer, got '0o14'"),
    (("mem_bw_gbs: 50}", "mem_bw_gbs: 1_000}"), r"'mem_bw_gbs'"),
    (("sockets:", "node_sharing: yes\n    sockets:"), r"'node_sharing' must be true or false, got 'yes'"),
])
def test_yaml_1_1_numbers_and_booleans_are_refused_by_the_inventory_by_name(tmp_path, edit, message):
    with pytest.raises(InventoryError, match=message):
        load_inventory(write(tmp_path, NODE.replace(*edit)))
