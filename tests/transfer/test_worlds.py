"""The transfer experiment's data and features under --work are reused by content only."""

import shutil

import pyarrow.dataset as pads

from benchmarks.transfer.worlds import DatasetConfig, build_features, make_dataset, windows
from gem.data.contract import EVENTS_DIR, Manifest
from gem.utils.digest import tree_digest
from tests.conftest import MOVIELENS_DIR, require_real_data


def _build(ds, work):
    data = make_dataset(ds, work / "data", work)
    w = windows(ds, Manifest.read(data).start, "gap0")
    features = build_features(ds, data, work / "gap0", w, max_seq_len=8)
    return data, {name: tree_digest(path) for name, path in features.items()}


def test_a_rerun_reuses_the_same_dataset_and_rebuilds_after_it_changes(tmp_path):
    ds = DatasetConfig(name="sim", source="simulator", teacher_periods=2, train_periods=2,
                       simulator={"users": 200, "items": 100, "days": 8, "seed": 0})
    data, first = _build(ds, tmp_path)
    records = sorted(tmp_path.rglob(".*.built.json"))
    assert len(records) == 5  # the dataset and four feature spans
    stamps = {p: p.stat().st_mtime_ns for p in records}

    assert _build(ds, tmp_path)[1] == first
    assert {p: p.stat().st_mtime_ns for p in records} == stamps  # nothing rebuilt

    # the same folder, another simulated world: the dataset and every span are built again
    ds.simulator["seed"] = 1
    data_digest = tree_digest(data)
    _, second = _build(ds, tmp_path)
    assert tree_digest(data) != data_digest
    assert set(second) == set(first) and all(second[n] != first[n] for n in first)


def test_a_changed_raw_file_is_converted_again(tmp_path):
    raw = tmp_path / "raw"
    shutil.copytree(require_real_data(MOVIELENS_DIR), raw)
    ds = DatasetConfig(name="ml", source="movielens", raw=str(raw), period_days=7)
    data = make_dataset(ds, tmp_path / "data", tmp_path)
    events = pads.dataset(data / EVENTS_DIR).count_rows()
    lines = (raw / "u.data").read_text().splitlines(keepends=True)
    (raw / "u.data").write_text("".join(lines[:-1000]))  # the same path, fewer ratings
    make_dataset(ds, tmp_path / "data", tmp_path)
    assert 0 < pads.dataset(data / EVENTS_DIR).count_rows() < events
