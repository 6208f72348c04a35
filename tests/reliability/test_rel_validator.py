"""Defect 5: the validator quarantines any value instead of crashing; its exit codes
tell a crash, a quarantine over the limit, unreadable input and an empty dataset apart."""

from __future__ import annotations

import shutil

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from gem.data.contract import EVENTS_SCHEMA, Manifest, day_dir, event_files
from gem.data.validate import validate_dataset


def _copy(tiny_dataset, tmp_path):
    out = tmp_path / "ds"
    shutil.copytree(tiny_dataset, out, ignore=shutil.ignore_patterns("_validation", ".gem-output"))
    return out


def _first_rows(root, n=3) -> pa.Table:
    return pq.read_table(event_files(root)[0]).slice(0, n)


def _write(root, table: pa.Table, name: str) -> None:
    pq.write_table(table, day_dir(root, Manifest.read(root).start.date()) / f"{name}.parquet")


def _not_utf8(values: list[bytes]) -> pa.Array:
    """A string array holding raw bytes (Parquet stores them unchecked)."""
    offsets = [0]
    for v in values:
        offsets.append(offsets[-1] + len(v))
    return pa.Array.from_buffers(pa.string(), len(values),
                                 [None, pa.py_buffer(pa.array(offsets, pa.int32()).buffers()[1]),
                                  pa.py_buffer(b"".join(values))])


def _reasons(report) -> dict[str, int]:
    return dict(report.reasons)


def test_an_id_string_beyond_int64_is_quarantined_not_a_crash(tiny_dataset, tmp_path):
    root = _copy(tiny_dataset, tmp_path)
    rows = _first_rows(root)
    ids = pa.array(["99999999999999999999999", "9223372036854775808", "424242"], pa.string())
    _write(root, rows.set_column(0, "event_id", ids), "part-long-ids")
    report = validate_dataset(root)
    assert _reasons(report)["events.wrong_type:event_id"] == 2
    assert report.reconciles


def test_an_unsigned_id_above_int64_is_quarantined(tiny_dataset, tmp_path):
    root = _copy(tiny_dataset, tmp_path)
    rows = _first_rows(root, 2)
    _write(root, rows.set_column(1, "user_id", pa.array([2**64 - 1, 1], pa.uint64())), "part-uint")
    report = validate_dataset(root)
    assert _reasons(report)["events.wrong_type:user_id"] == 1


def test_invalid_utf8_is_quarantined_with_its_bytes_kept(tiny_dataset, tmp_path):
    root = _copy(tiny_dataset, tmp_path)
    rows = _first_rows(root, 2)
    surface = rows.column("surface").to_pylist()
    _write(root, rows.set_column(4, "surface", _not_utf8([b"fe\xffed", surface[1].encode()])), "part-bytes")
    report = validate_dataset(root)
    assert _reasons(report).get("events.invalid_utf8:surface") == 1
    quarantine = pq.read_table(report.quarantine_path).to_pylist()
    bad = [q for q in quarantine if q["reason"] == "invalid_utf8:surface"]
    assert "xff" in bad[0]["record"]  # the original bytes, shown


def test_an_empty_dataset_is_a_clear_error_with_its_own_exit_code(tiny_dataset, tmp_path, capsys):
    from gem_app.cli import main

    root = _copy(tiny_dataset, tmp_path)
    for file in event_files(root):
        pq.write_table(EVENTS_SCHEMA.empty_table(), file)
    assert validate_dataset(root).empty
    assert main(["data", "validate", str(root)]) == 3
    assert "empty dataset" in capsys.readouterr().err


def test_exit_codes_are_distinct_and_documented(tiny_dataset, tmp_path, capsys, monkeypatch):
    from gem.data import cli as data_cli
    from gem_app.cli import main

    root = _copy(tiny_dataset, tmp_path)
    assert main(["data", "validate", str(root)]) == 0
    rows = _first_rows(root, 1)
    _write(root, rows.set_column(4, "surface", pa.array(["billboard"])), "part-bad")
    assert main(["data", "validate", str(root)]) == 1
    assert main(["data", "validate", str(tmp_path / "nowhere")]) == 2
    with pytest.raises(SystemExit):
        main(["data", "validate", "--help"])
    help_text = capsys.readouterr().out
    for code in ("0 ", "1 ", "2 ", "3 ", "4 "):
        assert f"\n  {code}" in help_text

    def broken(*args, **kwargs):  # a bug in the validator, not bad data
        raise RuntimeError("bug")

    monkeypatch.setattr("gem.data.validate.validate_dataset", broken)
    assert main(["data", "validate", str(root)]) == data_cli.EXIT_INTERNAL == 4
    assert "a bug, not bad data" in capsys.readouterr().err
