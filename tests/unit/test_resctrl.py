"""cosched_node.resctrl (the node agent's resctrl manager) on a directory laid out as resctrl is."""
from pathlib import Path

import pytest
from cosched_node import resctrl as rc


@pytest.fixture
def root(tmp_path: Path) -> Path:
    (tmp_path / "info" / "L3").mkdir(parents=True)
    (tmp_path / "info" / "MB").mkdir(parents=True)
    (tmp_path / "info" / "L3" / "cbm_mask").write_text("fffff\n")
    (tmp_path / "info" / "L3" / "num_closids").write_text("4\n")
    (tmp_path / "info" / "L3" / "min_cbm_bits").write_text("1\n")
    (tmp_path / "info" / "MB" / "min_bandwidth").write_text("10\n")
    (tmp_path / "info" / "MB" / "bandwidth_gran").write_text("10\n")
    (tmp_path / "schemata").write_text("L3:0=fffff;1=fffff\nMB:0=100;1=100\n")
    return tmp_path


def manager(root, logs=None):
    return rc.ResctrlManager(str(root), log=(logs.append if logs is not None else lambda m: None))


def test_masks_are_contiguous_disjoint_and_share_the_spare_ways():
    # 20 ways, requests 4 + 6 = 10, spare 10 -> 5 each: a = 9 ways from bit 0, b = 11 from bit 9.
    masks = rc.contiguous_masks({"b": 6, "a": 4}, 20)
    assert masks == {"a": 0x1FF, "b": 0x7FF << 9}
    assert rc.contiguous_masks({"a": 4, "b": 6}, 20, give_away=False) == {"a": 0xF, "b": 0x3F << 4}
    # spare 3 over 2 jobs: the first gets the extra way
    assert rc.contiguous_masks({"a": 2, "b": 3}, 8) == {"a": 0xF, "b": 0xF << 4}
    assert rc.contiguous_masks({}, 20) == {}


def test_masks_refuse_oversubscription_and_honour_min_bits():
    with pytest.raises(rc.ResctrlError, match="exceed"):
        rc.contiguous_masks({"a": 15, "b": 6}, 20)
    assert rc.contiguous_masks({"a": 1}, 4, min_bits=2, give_away=False) == {"a": 0x3}


def test_cbm_width_and_mba_rounding():
    assert rc.cbm_width("fffff") == (20, 0)
    assert rc.cbm_width("7f8") == (8, 3)
    with pytest.raises(rc.ResctrlError):
        rc.cbm_width("f0f")
    assert rc.mba_percent(33, 10, 10) == 40
    assert rc.mba_percent(5, 10, 10) == 10
    assert rc.mba_percent(100, 10, 10) == 100
    assert rc.mba_percent(91, 10, 20) == 100


def test_group_lifecycle_gives_away_and_reclaims_ways(root: Path):
    mgr = manager(root)
    assert mgr.add_job("1.0", {0: 4, 1: 4}, [100, 101], mb_percent={0: 33})
    group_a = root / "cosched_1.0"
    assert (group_a / "tasks").read_text() == "100\n101\n"
    # alone on the node: all 20 ways given away to it; MB 33% rounded to 40
    assert (group_a / "schemata").read_text() == "L3:0=fffff;1=fffff\nMB:0=40\n"

    assert mgr.add_job("2.0", {0: 6}, [200])
    # reclaim on cache 0: 4 + 6 asked, 10 spare -> a 9 ways (0x1ff), b 11 ways from bit 9
    assert (group_a / "schemata").read_text() == "L3:0=1ff;1=fffff\nMB:0=40\n"
    # job 2 does not run on cache 1: the smallest mask at the top way
    assert (root / "cosched_2.0" / "schemata").read_text() == "L3:0=ffe00;1=80000\n"

    mgr.remove_job("1.0")
    assert not group_a.exists()
    assert (root / "cosched_2.0" / "schemata").read_text() == "L3:0=fffff;1=80000\n"
    mgr.remove_job("2.0")
    assert mgr.our_groups() == []
    assert (root / "schemata").read_text() == "L3:0=fffff;1=fffff\nMB:0=100;1=100\n"


def test_closids_running_out_leaves_the_job_ungrouped_with_a_reason(root: Path):
    logs: list[str] = []
    mgr = manager(root, logs)
    for job in ("1.0", "2.0", "3.0"):   # num_closids 4 = the default group + 3
        assert mgr.add_job(job, {0: 2}, [])
    assert not mgr.add_job("4.0", {0: 2}, [400])
    assert not (root / "cosched_4.0").exists()
    assert any("4.0 runs ungrouped: no CLOSID left" in m for m in logs)


def test_oversubscribed_ways_leave_the_job_ungrouped(root: Path):
    logs: list[str] = []
    mgr = manager(root, logs)
    assert mgr.add_job("1.0", {0: 15}, [])
    assert not mgr.add_job("2.0", {0: 6}, [])
    assert (root / "cosched_1.0" / "schemata").read_text().startswith("L3:0=fffff")
    assert any("2.0 runs ungrouped" in m and "exceed" in m for m in logs)


@pytest.mark.parametrize("job, ways, pids, mb", [
    ("../etc", {0: 2}, [], None),
    ("a/../../b", {0: 2}, [], None),
    ("x..y", {0: 2}, [], None),
    ("info", {0: 2}, [], None),
    ("", {0: 2}, [], None),
    ("1.0", {0: 10 ** 9}, [], None),
    ("1.0", {0: 0}, [], None),
    ("1.0", {10 ** 12: 2}, [], None),
    ("1.0", {7: 2}, [], None),            # cache id not in schemata
    ("1.0", {0: 2}, [10 ** 12], None),
    ("1.0", {0: 2}, [1], None),           # init
    ("1.0", {0: 2}, [True], None),
    ("1.0", {0: 2}, ["12"], None),
    ("1.0", {0: 2}, [], {0: 1000}),
    ("1.0", {}, [], None),
])
def test_hostile_values_are_refused(root: Path, job, ways, pids, mb):
    mgr = manager(root)
    with pytest.raises(rc.ResctrlError):
        mgr.add_job(job, ways, pids, mb)
    assert mgr.our_groups() == []
    assert not (root.parent / "etc").exists()


def test_absent_resctrl_is_logged_and_the_job_runs_ungrouped(tmp_path: Path):
    logs: list[str] = []
    mgr = rc.ResctrlManager(str(tmp_path / "nothing"), log=logs.append)
    assert not mgr.available
    assert not mgr.add_job("1.0", {0: 2}, [100])
    assert any("resctrl absent" in m for m in logs)


def test_no_mba_writes_only_l3(root: Path):
    for name in ("min_bandwidth", "bandwidth_gran"):
        (root / "info" / "MB" / name).unlink()
    mgr = manager(root)
    assert mgr.add_job("1.0", {0: 2, 1: 2}, [], mb_percent={0: 50})
    assert (root / "cosched_1.0" / "schemata").read_text() == "L3:0=fffff;1=fffff\n"


def test_a_state_file_keeps_requests_across_managers(root: Path, tmp_path: Path):
    state = str(tmp_path / "state.json")
    first = rc.ResctrlManager(str(root), log=lambda m: None, state_file=state)
    assert first.add_job("1.0", {0: 4}, [100]) and first.add_job("2.0", {0: 6})
    assert (root / "cosched_1.0" / "schemata").read_text().startswith("L3:0=1ff;")
    with pytest.raises(rc.ResctrlError):
        first.add_job("../x", {0: 4})
    with pytest.raises(rc.ResctrlError):
        first.add_job("3.0", {0: 99999999})
    again = rc.ResctrlManager(str(root), log=lambda m: None, state_file=state)   # a restart
    assert again.requests == {"1.0": {0: 4}, "2.0": {0: 6}}
    again.remove_job("1.0")
    assert (root / "cosched_2.0" / "schemata").read_text().startswith("L3:0=fffff;")


def test_a_damaged_state_file_starts_empty_with_a_logged_reason(root: Path, tmp_path: Path):
    state = tmp_path / "state.json"
    state.write_text('{"requests": {"1.0": {"0": "lots"}}}')
    (root / "cosched_1.0").mkdir()
    logs: list[str] = []
    mgr = rc.ResctrlManager(str(root), log=logs.append, state_file=str(state))
    assert mgr.requests == {} and any("unusable" in m for m in logs)


def test_sync_is_stateless_and_refuses_bad_values_without_raising(root: Path):
    logs: list[str] = []
    mgr = manager(root, logs)
    result = mgr.sync({"1.0": {0: 4}, "2.0": {0: 10 ** 30}, "../x": {0: 2}, "3.0": {9: 2}},
                      tasks={"1.0": [100, 100, 101]}, mb_percent={"1.0": {0: 33}})
    assert result["1.0"] is None and all(result[j].startswith("refused") for j in ("2.0", "../x", "3.0"))
    assert mgr.our_groups() == ["1.0"]
    assert (root / "cosched_1.0" / "tasks").read_text() == "100\n101\n"
    assert (root / "cosched_1.0" / "schemata").read_text() == "L3:0=fffff;1=80000\nMB:0=40\n"
    # a new manager (agent restart) sees the same groups; a second job reclaims spare ways
    again = manager(root, logs)
    assert again.sync({"1.0": {0: 4}, "2.0": {0: 6}}, tasks={"1.0": [100, 102]}) == {"1.0": None, "2.0": None}
    assert (root / "cosched_1.0" / "tasks").read_text() == "100\n101\n102\n"
    assert (root / "cosched_1.0" / "schemata").read_text().startswith("L3:0=1ff;")
    assert again.sync({}) == {}
    assert again.our_groups() == []
    assert sum("runs ungrouped" in m for m in logs) == 3     # each refusal logged once
    mgr.sync({"2.0": {0: 10 ** 30}})
    assert sum("runs ungrouped" in m for m in logs) == 3     # ... not again
