"""Profile store: schema validation, class derivation, the paper's numbers in examples/."""
from pathlib import Path

import pytest

from condor_sched.profiles import (
    ProfileError, ProfileStore, ProgramClass, default_profiles_dir, interpolate, load_profile, parse_profile,
)

CURVES = {1: {"ipc_llc": [[2, 0.5], [20, 1.0]], "bw_llc_gbs": [[2, 1.0], [20, 1.0]]}}


def profile(runtime, max_scale=8):
    return parse_profile({"program": "P", "max_scale": max_scale, "runtime_s": runtime, "curves": CURVES})


@pytest.mark.parametrize("runtime, max_scale, expected", [
    ({1: 100, 2: 103, 4: 104.9, 8: 101}, 8, ProgramClass.NEUTRAL),   # (104.9-100)/100 <= 5%
    ({1: 100, 2: 90, 4: 85, 8: 80}, 8, ProgramClass.SCALING),        # 100/80 = 1.25 > 1.05
    ({1: 100, 2: 94, 4: 120}, 4, ProgramClass.SCALING),               # 100/94 = 1.064 > 1.05
    ({1: 100, 2: 96, 4: 108}, 4, ProgramClass.COMPACT),               # spread 12.5%, gain 4.2%
    ({1: 100, 2: 120, 4: 130}, 4, ProgramClass.COMPACT),              # slower when spread
    ({1: 100}, 1, ProgramClass.COMPACT),                              # one node only
    ({1: 100, 2: 60}, 1, ProgramClass.COMPACT),                       # k = 2 beyond max_scale
])
def test_class_derivation_follows_the_five_percent_rules(runtime, max_scale, expected):
    assert profile(runtime, max_scale).program_class is expected


def test_scales_are_ordered_by_profiled_runtime_and_capped_by_max_scale():
    p = profile({1: 100, 2: 80, 4: 90, 8: 70}, max_scale=4)
    assert p.scales() == [2, 4, 1]


def test_linear_interpolation_is_flat_beyond_the_samples():
    curve = ((2.0, 0.5), (4.0, 0.9), (20.0, 1.0))
    assert interpolate(curve, 3) == pytest.approx(0.7)
    assert interpolate(curve, 1) == 0.5
    assert interpolate(curve, 30) == 1.0


def test_example_profiles_reproduce_the_papers_numbers():
    store = ProfileStore.load_dir(default_profiles_dir())
    assert store.skipped == []
    assert len(store) == 12
    classes = {name: store.get(name).program_class for name in
               ("MG", "CG", "EP", "LU", "BFS", "WC", "NW", "TS", "GAN", "RNN", "HC", "BW")}
    assert [n for n, c in classes.items() if c is ProgramClass.SCALING] == ["MG", "CG", "LU", "TS", "BW"]
    assert [n for n, c in classes.items() if c is ProgramClass.NEUTRAL] == ["EP", "WC", "NW", "HC"]
    assert [n for n, c in classes.items() if c is ProgramClass.COMPACT] == ["BFS", "GAN", "RNN"]
    # Section 2: ways for 90% of full-cache performance; single-node bandwidth (16 procs).
    assert store.get("MG").demand(0.9, 1, 20)[0] == 3
    assert store.get("CG").demand(0.9, 1, 20)[0] == 10
    assert store.get("BFS").demand(0.9, 1, 20)[0] == 18
    for name, node_gbs in (("MG", 112.0), ("CG", 42.9), ("EP", 0.09), ("BFS", 0.12)):
        per_process = interpolate(store.get(name).bw_llc_gbs[1], 20)
        assert per_process * 16 == pytest.approx(node_gbs, rel=0.01)
    assert store.get("CG").scales()[0] == 2 and store.get("CG").speedup(2) == pytest.approx(1.13, abs=0.005)
    for name in ("MG", "LU", "TS", "BW"):  # "over 30% speedup": we take the bound, 1.3
        assert store.get(name).scales()[0] == 8 and store.get(name).speedup(8) == pytest.approx(1.3, abs=0.001)
    assert store.get("gan").max_scale == 1 and store.get("rnn").max_scale == 1
    # Fig. 1 (16 cores, CE on one node; SNS on two shared nodes): MG x5, TS, HC.
    assert store.get("MG").runtime_s[1] == pytest.approx(487.65 / 5, abs=0.05)
    assert store.get("MG").runtime_s[2] == pytest.approx(443.67 / 5, abs=0.05)
    assert store.get("TS").runtime_s[1] == pytest.approx(376.98) and store.get("TS").runtime_s[2] == pytest.approx(351.75)
    assert store.get("HC").runtime_s[1] == pytest.approx(482.33)
    # Section 2: MG on two nodes, 67.6 GB/s per node with 8 processes each.
    assert interpolate(store.get("MG").bw_llc_gbs[2], 20) * 8 == pytest.approx(67.6, rel=0.01)
    # Section 6.1: 50 s to 1200 s.
    assert all(50 <= t <= 1200 for p in store.profiles.values() for t in p.runtime_s.values())


def test_example_profiles_label_every_number_with_its_provenance():
    """Issue 12: each profile says, for its numbers, whether they are read from the paper,
    derived from read numbers, or assumed."""
    for path in sorted(default_profiles_dir().glob("*.yaml")):
        text = path.read_text()
        assert "[read]" in text and "[assumed]" in text, path.name
        for line in text.splitlines():
            body = line.split("#")[0]
            if body.strip().startswith(("1:", "2:", "4:", "8:", "ipc_llc", "bw_llc_gbs", "runtime_s: {")) \
                    and any(ch.isdigit() for ch in body.split(":", 1)[1]):
                # a line with numbers is labelled on itself or in the comment block just above it
                lines = text.splitlines()
                i = lines.index(line)
                block = [line] + [x for x in reversed(lines[max(0, i - 6):i]) if x.strip().startswith("#") or "#" in x]
                assert any(tag in x for x in block for tag in ("[read]", "[derived]", "[assumed]")), (path.name, line)


@pytest.mark.parametrize("text, field", [
    ("program: ../x\nmax_scale: 1\n", "program"),
    ("program: X\nmax_scale: 3\n", "max_scale"),
    ("program: X\nmax_scale: 2\nruntime_s: {2: 10}\n", "runtime_s.1"),
    ("program: X\nmax_scale: 2\nruntime_s: {1: -5}\n", "runtime_s.1"),
    ("program: X\nmax_scale: 1\nruntime_s: {1: 5}\ncurves: {1: {ipc_llc: [[4, 1.0], [2, 0.5]], bw_llc_gbs: [[2, 1]]}}\n",
     "curves.1.ipc_llc[1].ways"),
    ("program: X\nmax_scale: 1\nruntime_s: {1: 5}\ncurves: {1: {ipc_llc: [[2, 1.0]], bw_llc_gbs: [[2, -1]]}}\n",
     "curves.1.bw_llc_gbs[0].value"),
    ("program: X\nmax_scale: 1\nruntime_s: {1: 5}\ncurves: {2: {ipc_llc: [[2, 1.0]], bw_llc_gbs: [[2, 1]]}}\n",
     "curves.1"),
])
def test_bad_profile_names_file_and_field(tmp_path: Path, text, field):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(ProfileError) as err:
        load_profile(path)
    assert str(path) in str(err.value) and f"'{field}'" in str(err.value)


def test_invalid_yaml_is_a_profile_error(tmp_path: Path):
    path = tmp_path / "broken.yaml"
    path.write_text("program: [unclosed\n")
    with pytest.raises(ProfileError, match="broken.yaml: not valid YAML"):
        load_profile(path)


def test_store_skips_bad_files_and_duplicates_with_reasons(tmp_path: Path):
    good = (default_profiles_dir() / "mg.yaml").read_text()
    (tmp_path / "a_mg.yaml").write_text(good)
    (tmp_path / "b_mg_again.yaml").write_text(good)
    (tmp_path / "c_bad.yaml").write_text("program: Y\nmax_scale: 1\n")
    (tmp_path / "notes.txt").write_text("ignored")
    store = ProfileStore.load_dir(tmp_path)
    assert len(store) == 1 and "mg" in store and "MG" in store
    reasons = {Path(s.what).name: s.reason for s in store.skipped}
    assert set(reasons) == {"b_mg_again.yaml", "c_bad.yaml"}
    assert "already defined" in reasons["b_mg_again.yaml"]
    assert "'runtime_s'" in reasons["c_bad.yaml"]


@pytest.mark.parametrize("edit, message", [
    (("  2: 236.0", "  1: 236.0"), r"bfs\.yaml: line \d+, column 3: duplicate key 1 \(first on line \d+\)"),  # was: last won
    (("  1: 200.0", "  1: 3:20"), r"'3:20'"),                                     # YAML 1.1: 200 seconds
    (("max_scale: 8", "max_scale: 010"), r"'010'"),                               # YAML 1.1: 8 (octal)
])
def test_a_profile_with_a_repeated_key_or_a_yaml_1_1_number_is_refused(tmp_path: Path, edit, message):
    path = tmp_path / "bfs.yaml"
    path.write_text((default_profiles_dir() / "bfs.yaml").read_text().replace(*edit))
    with pytest.raises(ProfileError, match=message):
        load_profile(path)
    store = ProfileStore.load_dir(tmp_path)
    assert len(store) == 0 and len(store.skipped) == 1
