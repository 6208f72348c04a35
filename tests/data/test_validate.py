"""Contract validation: every bad-row reason, file-level errors, reconciliation."""

from __future__ import annotations

import datetime as dt
import json
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from gem.data.contract import EVENTS_SCHEMA, ContractError, Manifest, day_dir
from gem.data.validate import validate_dataset
from gem_app.cli import main as cli_main

UTC = dt.timezone.utc


def _copy(base: Path, tmp_path: Path) -> Path:
    out = tmp_path / "ds"
    shutil.copytree(base, out, ignore=shutil.ignore_patterns("_validation"))
    return out


def _first_day(root: Path) -> dt.date:
    return Manifest.read(root).start.date()


def _good_row(root: Path, event_id: int) -> dict:
    """A valid ad-impression row copied from the dataset's first event file."""
    first = sorted((root / "events").glob("day=*/*.parquet"))[0]
    row = pq.read_table(first).slice(0, 1).to_pylist()[0]
    row.update(event_id=event_id, is_ad=True, event_type="impression", click=0, conversion=0,
               conversion_time=None)
    items = pq.read_table(root / "items.parquet").to_pylist()
    row["item_id"] = next(i["item_id"] for i in items if i["is_ad"])
    return row


def _add_rows(root: Path, rows: list[dict], schema: pa.Schema = EVENTS_SCHEMA, name: str = "part-bad") -> None:
    schema = pa.schema([f.with_nullable(True) for f in schema])
    path = day_dir(root, _first_day(root)) / f"{name}.parquet"
    pq.write_table(pa.Table.from_pylist(rows, schema=schema), path)


BAD_CASES = {
    "null:user_id": {"user_id": None},
    "unknown_surface": {"surface": "billboard"},
    "unknown_event_type": {"event_type": "teleport"},
    "outside_window": {"event_time": dt.datetime(1999, 1, 1, tzinfo=UTC)},
    "conversion_without_click": {"click": 0, "conversion": 1},
    "bad_label:click": {"click": 7},
    "unknown_user": {"user_id": 10**12},
    "unknown_item": {"item_id": 10**12},
    "missing_conversion_time": {"click": 1, "conversion": 1, "conversion_time": None},
}


def test_simulated_dataset_passes_clean(tiny_dataset):
    report = validate_dataset(tiny_dataset, report_dir=tiny_dataset.parent / "tiny_report")
    assert report.input_rows["events"] > 1000
    assert report.quarantined_rows == {"users": 0, "items": 0, "events": 0}
    assert report.reconciles


@pytest.mark.parametrize("reason", sorted(BAD_CASES))
def test_each_bad_row_is_quarantined_with_its_reason(tiny_dataset, tmp_path, reason):
    root = _copy(tiny_dataset, tmp_path)
    good_id, bad_id = 10**15, 10**15 + 1
    bad = _good_row(root, bad_id) | BAD_CASES[reason]
    _add_rows(root, [_good_row(root, good_id), bad])
    report = validate_dataset(root, out=tmp_path / "clean")
    assert report.reasons == {f"events.{reason}": 1}
    assert report.reconciles
    quarantine = pq.read_table(report.quarantine_path).to_pylist()
    assert [(q["reason"], json.loads(q["record"])["event_id"]) for q in quarantine] == [(reason, bad_id)]
    clean_ids = pa.concat_tables(
        pq.read_table(p) for p in sorted((tmp_path / "clean" / "events").glob("day=*/*.parquet"))
    ).column("event_id").to_pylist()
    assert good_id in clean_ids and bad_id not in clean_ids
    assert len(clean_ids) == report.processed_rows["events"]


def test_duplicate_event_id_keeps_first_occurrence(tiny_dataset, tmp_path):
    root = _copy(tiny_dataset, tmp_path)
    first_file = sorted((root / "events").glob("day=*/*.parquet"))[0]
    existing_id = pq.read_table(first_file).column("event_id")[0].as_py()
    _add_rows(root, [_good_row(root, existing_id), _good_row(root, existing_id)], name="zz-dups")
    report = validate_dataset(root)
    assert report.reasons == {"events.duplicate_event_id": 2}
    assert report.reconciles


def test_duplicate_check_in_hash_partitions_quarantines_the_same_rows(tiny_dataset, tmp_path, monkeypatch):
    # the check holds at most DUPLICATE_CHECK_IDS ids at once (issue 30: it held the whole
    # log's, 7.6 GB at 100M events); many partitions must keep exactly the same rows
    import gem.data.validate as validate

    root = _copy(tiny_dataset, tmp_path)
    files = sorted((root / "events").glob("day=*/*.parquet"))
    ids = [pq.read_table(f).column("event_id")[i].as_py() for f in (files[0], files[-1]) for i in (0, 3)]
    _add_rows(root, [_good_row(root, i) for i in ids + ids[:2]], name="zz-dups")
    report_dirs = {}
    for cap in (validate.DUPLICATE_CHECK_IDS, 7):
        monkeypatch.setattr(validate, "DUPLICATE_CHECK_IDS", cap)
        report_dirs[cap] = tmp_path / f"report-{cap}"
        report = validate_dataset(root, report_dir=report_dirs[cap])
        assert report.reasons == {"events.duplicate_event_id": 6} and report.reconciles
    quarantined = [pq.read_table(d / "quarantine.parquet").to_pylist() for d in report_dirs.values()]
    assert quarantined[0] == quarantined[1]
    total = sum(pq.ParquetFile(f).metadata.num_rows for f in (root / "events").glob("day=*/*.parquet"))
    assert -(-total // 7) > 10  # the small cap did split the check


def test_row_level_wrong_type_in_a_string_column(tiny_dataset, tmp_path):
    root = _copy(tiny_dataset, tmp_path)
    row_ok, row_bad = _good_row(root, 10**15), _good_row(root, 10**15 + 1)
    schema = pa.schema([f.with_type(pa.string()) if f.name == "user_id" else f for f in EVENTS_SCHEMA])
    row_ok["user_id"], row_bad["user_id"] = str(row_ok["user_id"]), "not-a-number"
    _add_rows(root, [row_ok, row_bad], schema=schema)
    report = validate_dataset(root)
    assert report.reasons == {"events.wrong_type:user_id": 1}
    assert report.processed_rows["events"] + report.quarantined_rows["events"] == report.input_rows["events"]


def test_user_table_problems_are_quarantined_too(tiny_dataset, tmp_path):
    root = _copy(tiny_dataset, tmp_path)
    users = pq.read_table(root / "users.parquet")
    dup = users.slice(0, 1)
    pq.write_table(pa.concat_tables([users, dup]), root / "users.parquet")
    report = validate_dataset(root)
    assert report.reasons == {"users.duplicate_user_id": 1}
    assert report.input_rows["users"] == users.num_rows + 1


def test_not_parquet_names_the_file(tiny_dataset, tmp_path):
    root = _copy(tiny_dataset, tmp_path)
    (day_dir(root, _first_day(root)) / "broken.parquet").write_text("user_id,item_id\n1,2\n")
    with pytest.raises(ContractError, match=r"broken\.parquet.*not a readable Parquet"):
        validate_dataset(root)


def test_missing_column_names_file_and_column(tiny_dataset, tmp_path):
    root = _copy(tiny_dataset, tmp_path)
    row = _good_row(root, 10**15)
    del row["surface"]
    _add_rows(root, [row], schema=EVENTS_SCHEMA.remove(EVENTS_SCHEMA.get_field_index("surface")))
    with pytest.raises(ContractError, match=r"part-bad\.parquet: missing column 'surface'"):
        validate_dataset(root)


def test_incompatible_type_names_file_and_column(tiny_dataset, tmp_path):
    root = _copy(tiny_dataset, tmp_path)
    row = _good_row(root, 10**15)
    row["event_time"] = 1_700_000_000
    schema = pa.schema([f.with_type(pa.int64()) if f.name == "event_time" else f for f in EVENTS_SCHEMA])
    _add_rows(root, [row], schema=schema)
    with pytest.raises(ContractError, match=r"part-bad\.parquet: column 'event_time' has type int64"):
        validate_dataset(root)


def test_cli_exit_codes(tiny_dataset, tmp_path, capsys):
    root = _copy(tiny_dataset, tmp_path)
    assert cli_main(["data", "validate", str(root)]) == 0
    _add_rows(root, [_good_row(root, 10**15) | {"surface": "billboard"}])
    assert cli_main(["data", "validate", str(root)]) == 1
    assert "unknown_surface" in capsys.readouterr().out
    assert cli_main(["data", "validate", str(root), "--max-quarantine-fraction", "0.5"]) == 0
    (day_dir(root, _first_day(root)) / "junk.parquet").write_bytes(b"\x00junk")
    assert cli_main(["data", "validate", str(root)]) == 2
    assert "junk.parquet" in capsys.readouterr().err


def test_extra_columns_are_carried_through_validate_out_and_reported(tiny_dataset, tmp_path):
    """Issue 28 item 7: `validate --out` dropped `occupation` (users) and `price` (events)
    without a word, while docs/data-contract.md says extra columns are carried along."""
    root = _copy(tiny_dataset, tmp_path)
    users = pq.read_table(root / "users.parquet")
    pq.write_table(users.append_column("occupation", pa.array([f"job{i % 3}" for i in range(users.num_rows)])),
                   root / "users.parquet")
    first = sorted((root / "events").glob("day=*/*.parquet"))[0]
    events = pq.read_table(first)
    price = pa.array([float(i) for i in range(events.num_rows)])
    pq.write_table(events.append_column("price", price).append_column("__index_level_0__", price), first)
    bad = _good_row(root, 10**15) | {"surface": "billboard"}  # quarantined: its price must not be carried
    _add_rows(root, [bad], EVENTS_SCHEMA.append(pa.field("price", pa.float64())), name="part-extra")
    report = validate_dataset(root, out=tmp_path / "clean")
    assert report.extra_columns == {"users": ["occupation"], "events": ["price"]}
    assert report.dropped_columns == {"events": ["__index_level_0__"]}
    assert "extra columns carried: users: occupation; events: price" in report.summary()
    clean_users = pq.read_table(tmp_path / "clean" / "users.parquet")
    assert clean_users.column("occupation").to_pylist() == [f"job{i % 3}" for i in range(users.num_rows)]
    clean_first = pq.read_table(tmp_path / "clean" / first.relative_to(root))
    assert clean_first.column("price").to_pylist() == price.to_pylist()
    assert "__index_level_0__" not in clean_first.column_names
    extra = pq.read_table(tmp_path / "clean" / (day_dir(root, _first_day(root)) / "part-extra.parquet")
                          .relative_to(root))
    assert extra.num_rows == 0 and "price" in extra.column_names
    assert json.loads(Path(report.report_path).read_text())["extra_columns"]["events"] == ["price"]
    # the clean copy, with its extra columns, builds features like any contract dataset
    from gem.features.build import build_features
    from tests.features.conftest import tiny_cfg

    manifest = build_features(tmp_path / "clean", tmp_path / "features", tiny_cfg(num_buckets=1, workers=1))
    assert manifest["counts"]["examples"] > 0


@pytest.mark.parametrize("surface", ["video/reels", "../../x", "feed.v2", " feed"])
def test_a_surface_that_is_not_a_safe_name_is_refused_before_any_work(tiny_dataset, tmp_path, surface, capsys):
    """Issue 28 item 4: `video/reels` and `../../x` passed validate; the run died minutes
    later on MLflow's name check after writing students/.video/reels.pending.json."""
    root = _copy(tiny_dataset, tmp_path)
    manifest = Manifest.read(root)
    manifest.surfaces = [*manifest.surfaces, surface]
    manifest.write(root)
    assert cli_main(["data", "validate", str(root)]) == 2
    err = capsys.readouterr().err
    assert "not safe names" in err and not (root / "_validation").exists()
    workspace = tmp_path / "ws"
    assert cli_main(["pipeline", "run", "--data", str(root), "--workspace", str(workspace), "--preset", "tiny"]) == 2
    assert "not safe names" in capsys.readouterr().err and not workspace.exists()
