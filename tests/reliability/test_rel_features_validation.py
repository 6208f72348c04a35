"""Defect 3: `features build` runs the data validator's rules on its input: it refuses
(or, asked to, quarantines) what validation would reject, and an empty dataset."""

from __future__ import annotations

import shutil

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from gem.data.contract import EVENTS_SCHEMA, MANIFEST, Manifest, day_dir, event_files
from gem.features.build import build_features
from gem.features.validation import DatasetRejected
from tests.features.conftest import tiny_cfg

CFG = dict(max_seq_len=8, num_buckets=1, workers=1)


def _copy(tiny_dataset, tmp_path):
    out = tmp_path / "ds"
    shutil.copytree(tiny_dataset, out, ignore=shutil.ignore_patterns("_validation", ".gem-output"))
    return out


def _append(root, change: dict, n: int = 1) -> None:
    rows = pq.read_table(event_files(root)[0]).slice(0, n)
    rows = rows.cast(pa.schema([f.with_nullable(True) for f in rows.schema]))
    for name, value in change.items():
        column = pa.array([value] * n, rows.schema.field(name).type)
        rows = rows.set_column(rows.schema.get_field_index(name), name, column)
    rows = rows.set_column(0, "event_id", pa.array(range(10**9, 10**9 + n), pa.int64()))
    pq.write_table(rows, day_dir(root, Manifest.read(root).start.date()) / "part-zz-bad.parquet")


@pytest.mark.parametrize("change, rule", [
    ({"click": 2}, "field 'click': rule bad_label"),
    ({"surface": "billboard"}, "rule unknown_surface"),
    ({"user_id": None}, "field 'user_id': rule null"),
    ({"event_time": None}, "field 'event_time': rule null"),
], ids=["click-2", "unknown-surface", "null-user-id", "null-event-time"])
def test_features_build_refuses_rows_the_validator_rejects(tiny_dataset, tmp_path, change, rule):
    root = _copy(tiny_dataset, tmp_path)
    _append(root, change)
    with pytest.raises(DatasetRejected) as err:
        build_features(root, tmp_path / "f", tiny_cfg(**CFG))
    message = str(err.value)
    assert "part-zz-bad.parquet row 0" in message and rule in message and "python -m gem data validate" in message
    assert not (tmp_path / "f" / MANIFEST).exists()


def test_duplicate_rows_are_refused(tiny_dataset, tmp_path):
    root = _copy(tiny_dataset, tmp_path)
    first = event_files(root)[0]
    shutil.copy(first, first.with_name("zz-copy.parquet"))
    with pytest.raises(DatasetRejected, match="rule duplicate_event_id"):
        build_features(root, tmp_path / "f", tiny_cfg(**CFG))


def test_quarantine_mode_builds_from_the_valid_rows_only(tiny_dataset, tmp_path):
    root = _copy(tiny_dataset, tmp_path)
    _append(root, {"click": 2}, n=3)
    manifest = build_features(root, tmp_path / "q", tiny_cfg(on_invalid="quarantine", **CFG))
    clean = build_features(tiny_dataset, tmp_path / "c", tiny_cfg(**CFG))
    assert manifest["digest"] == clean["digest"]  # the bad rows never reached an example
    quarantine = pq.read_table(tmp_path / "q" / "validation" / "quarantine.parquet")
    assert quarantine.num_rows == 3 and set(quarantine.column("reason").to_pylist()) == {"bad_label:click"}


def test_an_empty_dataset_is_refused_clearly(tiny_dataset, tmp_path):
    root = _copy(tiny_dataset, tmp_path)
    for file in event_files(root):
        pq.write_table(EVENTS_SCHEMA.empty_table(), file)
    with pytest.raises(DatasetRejected, match="empty dataset"):
        build_features(root, tmp_path / "f", tiny_cfg(**CFG))


def test_cli_names_the_problem_and_exits_2(tiny_dataset, tmp_path, capsys):
    from gem_app.cli import main

    root = _copy(tiny_dataset, tmp_path)
    _append(root, {"surface": "billboard"})
    assert main(["features", "build", str(root), str(tmp_path / "f"), "--preset", "tiny"]) == 2
    assert "unknown_surface" in capsys.readouterr().err


def test_a_validated_clean_copy_is_not_validated_again(tiny_dataset, tmp_path, monkeypatch):
    from gem.data.validate import validate_dataset
    from gem.features import validation

    clean = tmp_path / "clean"
    validate_dataset(tiny_dataset, report_dir=tmp_path / "r", out=clean)
    calls = []
    monkeypatch.setattr(validation, "validate_dataset", lambda *a, **k: calls.append(a) or validate_dataset(*a, **k))
    build_features(clean, tmp_path / "f", tiny_cfg(**CFG))
    assert calls == []
    _append(clean, {"click": 2})  # changed after validation: validated again, and refused
    with pytest.raises(DatasetRejected):
        build_features(clean, tmp_path / "f", tiny_cfg(**CFG))
    assert len(calls) == 1
