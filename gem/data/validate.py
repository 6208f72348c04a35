"""Check a dataset against the contract; quarantine every bad row with its reason.

Guarantee: for every table, processed + quarantined = input rows. A file that can't
be read under the contract (not Parquet, a missing column, a column whose type can
never hold the contract type) raises ContractError naming the file and column.

Row reasons (one per row: the first rule it breaks, in this order):
``wrong_type:<col>`` (a value that does not convert: an id beyond int64 too),
``invalid_utf8:<col>`` (bytes that are not UTF-8 in a string column), ``null:<col>``, ``unknown_surface``,
``unknown_event_type``,
``unknown_role``, ``bad_label:<col>``, ``outside_window``, ``wrong_day_partition``,
``conversion_without_click``, ``conversion_on_organic``, ``missing_conversion_time``,
``conversion_before_event``, ``click_before_event``, ``conversion_before_click``,
``ad_event_type``, ``unknown_user``, ``unknown_item``,
``is_ad_mismatch``, ``duplicate_event_id``; for users/items: ``wrong_type:<col>``,
``null:<key>``, ``duplicate_<key>``.

No value stops validation: every bad value is quarantined with its reason. An empty
dataset (no event rows, or none left after quarantine) is reported as ``empty``;
``python -m gem data validate`` then exits 3 (its exit codes: see gem/data/cli.py).

Duplicates: the first row with a given event_id in canonical order (day, file name,
row) is kept; later ones are quarantined, whatever else is wrong with the first.

Extra columns (not in the contract) are carried unchanged into ``--out`` with their
rows, and listed in the report (``extra_columns``); only a pandas index column
(``__index_level_N__``) is dropped, and the report says so (``dropped_columns``).
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import os
from collections import Counter
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from gem.data.coerce import coerce, printable_rows
from gem.data.contract import (
    AD_EVENT_TYPE,
    DAY_PARTITION,
    EVENTS_DIR,
    EVENTS_SCHEMA,
    ITEMS_FILE,
    ITEMS_SCHEMA,
    MANIFEST,
    PRIMARY_KEYS,
    ROLES,
    USERS_FILE,
    USERS_SCHEMA,
    ContractError,
    DatasetHandle,
    Manifest,
    event_files,
)
from gem.data.io import claim_dataset_output, write_json_atomic, write_parquet_atomic

log = logging.getLogger(__name__)

REPORT_DIR = "_validation"  # leading underscore: Parquet dataset readers skip it
QUARANTINE_SCHEMA = pa.schema(
    [
        ("table", pa.string()),
        ("source_file", pa.string()),
        ("source_row", pa.int64()),
        ("reason", pa.string()),
        ("record", pa.string()),  # the original row as JSON: nothing is lost
    ]
)


@dataclass
class ValidationReport:
    dataset: str
    input_rows: dict[str, int] = field(default_factory=dict)
    processed_rows: dict[str, int] = field(default_factory=dict)
    quarantined_rows: dict[str, int] = field(default_factory=dict)
    reasons: dict[str, int] = field(default_factory=dict)  # "<table>.<reason>" -> rows
    files: int = 0
    quarantine_path: str = ""
    report_path: str = ""
    extra_columns: dict[str, list[str]] = field(default_factory=dict)  # table -> carried into --out
    dropped_columns: dict[str, list[str]] = field(default_factory=dict)  # table -> not carried

    @property
    def reconciles(self) -> bool:
        return all(
            self.processed_rows.get(t, 0) + self.quarantined_rows.get(t, 0) == n
            for t, n in self.input_rows.items()
        )

    @property
    def empty(self) -> bool:
        """No event survives validation: nothing to train on."""
        return self.processed_rows.get("events", 0) == 0

    @property
    def quarantined_fraction(self) -> float:
        total = sum(self.input_rows.values())
        return sum(self.quarantined_rows.values()) / total if total else 0.0

    def summary(self) -> str:
        lines = [f"dataset {self.dataset}: {self.files} event files"]
        for table, n in self.input_rows.items():
            lines.append(
                f"  {table:<7} input {n:>12,}  processed {self.processed_rows.get(table, 0):>12,}"
                f"  quarantined {self.quarantined_rows.get(table, 0):>10,}"
            )
        for reason, n in sorted(self.reasons.items(), key=lambda kv: -kv[1]):
            lines.append(f"    {reason:<40} {n:>10,}")
        for what, columns in (("extra columns carried", self.extra_columns), ("columns dropped", self.dropped_columns)):
            if columns:
                lines.append(f"  {what}: " + "; ".join(f"{t}: {', '.join(c)}" for t, c in columns.items()))
        lines.append(f"  reconciles: {self.reconciles}")
        if self.quarantine_path:
            lines.append(f"  quarantine: {self.quarantine_path}")
        return "\n".join(lines)


class _Quarantine:
    """Appends quarantined rows to one Parquet file, opened on first use."""

    def __init__(self, path: Path):
        self.path = path
        self._tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
        self._writer: pq.ParquetWriter | None = None

    def add(self, table_name: str, source: str, raw: pa.Table, rows: np.ndarray, reasons: list[str]) -> None:
        if len(rows) == 0:
            return
        records = printable_rows(raw.take(pa.array(rows)))
        batch = pa.table(
            {
                "table": [table_name] * len(rows),
                "source_file": [source] * len(rows),
                "source_row": rows.astype(np.int64),
                "reason": reasons,
                "record": [json.dumps(r, default=str, sort_keys=True) for r in records],
            },
            schema=QUARANTINE_SCHEMA,
        )
        if self._writer is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._writer = pq.ParquetWriter(self._tmp, QUARANTINE_SCHEMA)
        self._writer.write_table(batch)

    def close(self) -> None:
        if self._writer is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            pq.write_table(QUARANTINE_SCHEMA.empty_table(), self._tmp)
        else:
            self._writer.close()
        os.replace(self._tmp, self.path)


def validate_dataset(path: str | Path | DatasetHandle, *, report_dir: str | Path | None = None,
                     out: str | Path | None = None) -> ValidationReport:
    """Validate the dataset at ``path``.

    Writes ``quarantine.parquet`` and ``validation_report.json`` to ``report_dir``
    (default ``path/_validation``). With ``out``, also writes the processed rows as a
    clean contract dataset there.
    """
    root = Path(path)
    if not root.is_dir():
        raise ContractError(f"{root}: not a dataset directory")
    # a handle's manifest is shared with its stage: this function changes a copy
    manifest = replace(path.manifest) if isinstance(path, DatasetHandle) else Manifest.read(root)
    report_dir = Path(report_dir) if report_dir else root / REPORT_DIR
    report = ValidationReport(dataset=str(root))
    quarantine = _Quarantine(report_dir / "quarantine.parquet")
    reasons: Counter[str] = Counter()
    out_root = Path(out) if out else None
    if out_root is not None:
        claim_dataset_output(out_root, inputs=(root,))

    users = _validate_entities(root / USERS_FILE, "users", USERS_SCHEMA, report, quarantine, reasons, out_root)
    items = _validate_entities(root / ITEMS_FILE, "items", ITEMS_SCHEMA, report, quarantine, reasons, out_root)
    item_ids = items.column("item_id").to_numpy()
    item_is_ad = items.column("is_ad").to_numpy(zero_copy_only=False)
    order = np.argsort(item_ids)
    item_index = (item_ids[order], item_is_ad[order])
    user_ids = np.sort(users.column("user_id").to_numpy())

    files = event_files(root)
    report.files = len(files)
    repeats = _duplicate_event_ids(files, root, DUPLICATE_CHECK_IDS)
    offset = 0
    for file in files:
        raw = _read(file, root, EVENTS_SCHEMA)
        n = raw.num_rows
        events, row_reason = _check_events(raw, file, root, manifest, user_ids, item_index,
                                           _rows_among(repeats, offset, n))
        offset += n
        bad = np.flatnonzero(row_reason != "")
        quarantine.add("events", str(file.relative_to(root)), raw, bad, row_reason[bad].tolist())
        reasons.update(f"events.{r}" for r in row_reason[bad])
        report.input_rows["events"] = report.input_rows.get("events", 0) + n
        report.quarantined_rows["events"] = report.quarantined_rows.get("events", 0) + len(bad)
        keep = pa.array(row_reason == "")
        good = events.filter(keep)
        report.processed_rows["events"] = report.processed_rows.get("events", 0) + good.num_rows
        extras = _extra_columns(raw, EVENTS_SCHEMA, "events", report)
        if out_root is not None:
            write_parquet_atomic(_with_extras(good.cast(EVENTS_SCHEMA), raw, extras, keep),
                                 out_root / file.relative_to(root))
    report.input_rows.setdefault("events", 0)
    report.processed_rows.setdefault("events", 0)
    report.quarantined_rows.setdefault("events", 0)
    quarantine.close()
    report.reasons = dict(sorted(reasons.items()))
    report.quarantine_path = str(quarantine.path)
    report.report_path = str(report_dir / "validation_report.json")
    write_json_atomic(asdict(report) | {"reconciles": report.reconciles}, Path(report.report_path))
    if out_root is not None:
        manifest.extra = dict(manifest.extra, validated_from=str(root))
        manifest.extra.pop("validation", None)
        manifest.write(out_root)
        stamp_clean(out_root, manifest)
    if not report.reconciles:  # pragma: no cover - an invariant, not a user error
        raise AssertionError(f"validation counts do not reconcile: {report}")
    return report


def dataset_stamp(root: "Path | DatasetHandle") -> str:
    """Digest of a dataset's files and manifest (less its own stamp and reports); of a
    DatasetHandle, from the manifest and the walk it already holds."""
    from gem.utils.digest import tree_digest, value_digest

    if isinstance(root, DatasetHandle):
        manifest, files = dict(root.raw_manifest), root.digest_excluding((MANIFEST, REPORT_DIR))
    else:
        manifest = json.loads((Path(root) / MANIFEST).read_text())
        files = tree_digest(root, exclude=(MANIFEST, REPORT_DIR))
    manifest["extra"] = {k: v for k, v in manifest.get("extra", {}).items() if k != "validation"}
    return value_digest({"files": files, "manifest": manifest})


def stamp_clean(root: Path, manifest: Manifest) -> None:
    """Record in ``root``'s manifest that it was written clean by the validator, so a
    features build of it, unchanged, does not validate again."""
    manifest.extra = dict(manifest.extra, validation={"digest": dataset_stamp(root)})
    manifest.write(root)


def _read(file: Path, root: Path, schema: pa.Schema) -> pa.Table:
    """Read one file; check it is Parquet and has every contract column."""
    name = str(file.relative_to(root)) if file.is_relative_to(root) else str(file)
    try:
        table = pq.read_table(file)
    except (pa.ArrowInvalid, OSError) as exc:
        raise ContractError(f"{name}: not a readable Parquet file ({exc})") from exc
    # a hive partition column read back from the path is not part of the file
    table = table.drop_columns([c for c in (DAY_PARTITION,) if c in table.column_names and c not in schema.names])
    missing = [f.name for f in schema if f.name not in table.column_names and f.nullable is False]
    if missing:
        raise ContractError(f"{name}: missing column {missing[0]!r} (all missing: {missing}); "
                            f"the contract requires {schema.names}")
    return table


def _coerced_columns(raw: pa.Table, schema: pa.Schema, name: str) -> tuple[dict[str, pa.Array], np.ndarray]:
    """Coerce each contract column; return columns and the per-row reason array."""
    reason = np.full(raw.num_rows, "", dtype=object)
    columns: dict[str, pa.Array] = {}
    for fld in schema:
        if fld.name not in raw.column_names:  # optional column absent: all null
            columns[fld.name] = pa.nulls(raw.num_rows, fld.type)
            continue
        target = pa.int64() if pa.types.is_integer(fld.type) else fld.type
        columns[fld.name], bad = coerce(raw.column(fld.name), target, file=name, column=fld.name)
        _mark(reason, bad, f"invalid_utf8:{fld.name}" if pa.types.is_string(fld.type) else f"wrong_type:{fld.name}")
    for fld in schema:
        if not fld.nullable:
            _mark(reason, _null_mask(columns[fld.name]), f"null:{fld.name}")
    return columns, reason


def _validate_entities(file: Path, table_name: str, schema: pa.Schema, report: ValidationReport,
                       quarantine: _Quarantine, reasons: Counter, out_root: Path | None) -> pa.Table:
    if not file.is_file():
        raise ContractError(f"{file}: missing; a dataset needs {USERS_FILE} and {ITEMS_FILE}")
    raw = _read(file, file.parent, schema)
    columns, reason = _coerced_columns(raw, schema, file.name)
    key = PRIMARY_KEYS[table_name]
    keys = columns[key].to_numpy(zero_copy_only=False)
    valid_key = reason == ""
    _mark(reason, _later_duplicates(np.where(valid_key, keys, 0), valid_key), f"duplicate_{key}")
    bad = np.flatnonzero(reason != "")
    quarantine.add(table_name, file.name, raw, bad, reason[bad].tolist())
    reasons.update(f"{table_name}.{r}" for r in reason[bad])
    keep = pa.array(reason == "")
    good = pa.table(columns, schema=pa.schema([f.with_type(columns[f.name].type) for f in schema])).filter(
        keep
    ).cast(schema)
    report.input_rows[table_name] = raw.num_rows
    report.quarantined_rows[table_name] = len(bad)
    report.processed_rows[table_name] = good.num_rows
    extras = _extra_columns(raw, schema, table_name, report)
    if out_root is not None:
        write_parquet_atomic(_with_extras(good, raw, extras, keep), out_root / file.name)
    return good


def _extra_columns(raw: pa.Table, schema: pa.Schema, table_name: str, report: ValidationReport) -> list[str]:
    """The file's columns outside the contract to carry (a pandas index column is
    dropped); both kinds recorded in the report."""
    carried = []
    for name in raw.column_names:
        if name in schema.names:
            continue
        dropped = name.startswith("__index_level_")
        listed = (report.dropped_columns if dropped else report.extra_columns).setdefault(table_name, [])
        if name not in listed:
            listed.append(name)
        if not dropped:
            carried.append(name)
    return carried


def _with_extras(good: pa.Table, raw: pa.Table, extras: list[str], keep: pa.Array) -> pa.Table:
    """``good`` (the contract columns of the kept rows) with the extra columns of the same
    rows appended unchanged."""
    for name in extras:
        good = good.append_column(raw.schema.field(name), raw.column(name).filter(keep))
    return good


# ids the duplicate check holds at once (~30 bytes each: key, position, sort order): a
# log with more is checked in that many hash partitions, one read of event_id each
DUPLICATE_CHECK_IDS = int(os.environ.get("GEM_DUPLICATE_CHECK_IDS", 25_000_000))


def _duplicate_event_ids(files: list[Path], root: Path, max_ids: int) -> np.ndarray:
    """The positions (in canonical order over all event files) of every later repeat of an
    event_id, sorted. Memory follows ``max_ids`` and the repeats, not the log: a larger log
    is checked one hash partition of its ids at a time (a repeat always falls in its first
    occurrence's partition)."""
    total = sum(_num_rows(f, root) for f in files)
    partitions = max(1, -(-total // max(max_ids, 1)))
    return np.sort(np.concatenate([_repeats_in_partition(files, root, p, partitions) for p in range(partitions)]))


def _num_rows(file: Path, root: Path) -> int:
    try:
        return pq.ParquetFile(file).metadata.num_rows
    except (pa.ArrowInvalid, OSError) as exc:
        _read(file, root, EVENTS_SCHEMA)  # raises the precise ContractError
        raise ContractError(f"{file.relative_to(root)}: not a readable Parquet file ({exc})") from exc


def _repeats_in_partition(files: list[Path], root: Path, part: int, partitions: int) -> np.ndarray:
    keys, positions, offset = [], [], 0
    for file in files:
        name = str(file.relative_to(root))
        try:
            column = pq.read_table(file, columns=["event_id"]).column("event_id")
        except (pa.ArrowInvalid, OSError, KeyError) as exc:
            _read(file, root, EVENTS_SCHEMA)  # raises the precise ContractError
            raise ContractError(f"{name}: cannot read column 'event_id' ({exc})") from exc
        values, bad = coerce(column, pa.int64(), file=name, column="event_id")
        ok = ~bad & ~_null_mask(values)
        ids = pc.fill_null(values, 0).to_numpy()
        if partitions > 1:  # Fibonacci hashing: sequential or strided ids spread evenly
            ok &= (ids.astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15) >> np.uint64(40)) % partitions == part
        rows = np.flatnonzero(ok)
        keys.append(ids[rows])
        positions.append(rows + offset)
        offset += len(ids)
    if not keys:
        return np.zeros(0, np.int64)
    keys, positions = np.concatenate(keys), np.concatenate(positions)
    order = np.argsort(keys, kind="stable")  # positions ascend, so each id's first row sorts first
    sorted_keys = keys[order]
    return positions[order[1:][sorted_keys[1:] == sorted_keys[:-1]]]


def _rows_among(sorted_positions: np.ndarray, offset: int, n: int) -> np.ndarray:
    """A mask of a file's ``n`` rows (from ``offset`` in canonical order) that are listed."""
    lo, hi = np.searchsorted(sorted_positions, [offset, offset + n])
    mask = np.zeros(n, bool)
    mask[sorted_positions[lo:hi] - offset] = True
    return mask


def _later_duplicates(keys: np.ndarray, valid: np.ndarray) -> np.ndarray:
    """True where a valid key already appeared at an earlier valid position."""
    positions = np.flatnonzero(valid)
    _, first = np.unique(keys[positions], return_index=True)
    duplicate = valid.copy()
    duplicate[positions[first]] = False
    return duplicate


def _check_events(raw: pa.Table, file: Path, root: Path, manifest: Manifest, user_ids: np.ndarray,
                  item_index: tuple[np.ndarray, np.ndarray], duplicate: np.ndarray) -> tuple[pa.Table, np.ndarray]:
    name = str(file.relative_to(root))
    columns, reason = _coerced_columns(raw, EVENTS_SCHEMA, name)
    col = {k: _np(v) for k, v in columns.items()}
    _mark(reason, ~np.isin(col["surface"], manifest.surfaces), "unknown_surface")
    _mark(reason, ~np.isin(col["event_type"], manifest.event_types), "unknown_event_type")
    _mark(reason, ~_null_mask(columns["role"]) & ~np.isin(col["role"], ROLES), "unknown_role")
    for label in ("click", "conversion"):
        _mark(reason, ~np.isin(col[label], [0, 1]), f"bad_label:{label}")
    t = col["event_time"]
    start, end = _us(manifest.start), _us(manifest.end)
    _mark(reason, (t < start) | (t >= end), "outside_window")
    partition_day = _partition_day(file)
    if partition_day is not None:
        day_start = _us_of_day(partition_day)
        _mark(reason, (t < day_start) | (t >= day_start + 86_400_000_000), "wrong_day_partition")
    conv, click, is_ad = col["conversion"] == 1, col["click"] == 1, col["is_ad"].astype(bool)
    _mark(reason, conv & ~click, "conversion_without_click")
    _mark(reason, conv & ~is_ad, "conversion_on_organic")
    conv_time = col["conversion_time"]
    has_conv_time = ~_null_mask(columns["conversion_time"])
    _mark(reason, conv & ~has_conv_time, "missing_conversion_time")
    _mark(reason, has_conv_time & (conv_time < t), "conversion_before_event")
    click_time = col["click_time"]
    has_click_time = ~_null_mask(columns["click_time"])
    _mark(reason, has_click_time & (click_time < t), "click_before_event")
    _mark(reason, conv & has_conv_time & has_click_time & click & (conv_time < click_time), "conversion_before_click")
    _mark(reason, is_ad & (col["event_type"] != AD_EVENT_TYPE), "ad_event_type")
    _mark(reason, ~_sorted_member(col["user_id"], user_ids), "unknown_user")
    item_ids, item_is_ad = item_index
    pos = np.clip(np.searchsorted(item_ids, col["item_id"]), 0, max(len(item_ids) - 1, 0))
    known_item = (len(item_ids) > 0) & (item_ids[pos] == col["item_id"]) if len(item_ids) else np.zeros(len(pos), bool)
    _mark(reason, ~known_item, "unknown_item")
    _mark(reason, known_item & (item_is_ad[pos] != is_ad), "is_ad_mismatch")
    _mark(reason, duplicate, "duplicate_event_id")
    table = pa.table(columns, schema=pa.schema([f.with_type(columns[f.name].type) for f in EVENTS_SCHEMA]))
    return table, reason


def _mark(reason: np.ndarray, mask: np.ndarray, label: str) -> None:
    """Record ``label`` for rows in ``mask`` that have no earlier reason."""
    reason[mask & (reason == "")] = label


def _null_mask(array: pa.Array) -> np.ndarray:
    return pc.is_null(array).to_numpy(zero_copy_only=False).astype(bool)


def _np(array: pa.Array) -> np.ndarray:
    """Numpy view with nulls filled by a neutral value (null rows are already marked)."""
    if pa.types.is_timestamp(array.type):
        return pc.fill_null(array.cast(pa.int64()), 0).to_numpy()
    if pa.types.is_boolean(array.type):
        return pc.fill_null(array, False).to_numpy(zero_copy_only=False)
    if pa.types.is_integer(array.type):
        return pc.fill_null(array, 0).to_numpy()
    return pc.fill_null(array, "").to_numpy(zero_copy_only=False)


def _sorted_member(values: np.ndarray, sorted_keys: np.ndarray) -> np.ndarray:
    if len(sorted_keys) == 0:
        return np.zeros(len(values), bool)
    pos = np.clip(np.searchsorted(sorted_keys, values), 0, len(sorted_keys) - 1)
    return sorted_keys[pos] == values


def _partition_day(file: Path) -> dt.date | None:
    name = file.parent.name
    if not name.startswith(f"{DAY_PARTITION}="):
        return None
    try:
        return dt.date.fromisoformat(name.split("=", 1)[1])
    except ValueError as exc:
        raise ContractError(f"{file}: partition folder {name!r} is not day=YYYY-MM-DD") from exc


def _us(moment: dt.datetime) -> int:
    return int(moment.timestamp() * 1_000_000)


def _us_of_day(day: dt.date) -> int:
    return _us(dt.datetime.combine(day, dt.time(), tzinfo=dt.timezone.utc))


__all__ = ["ValidationReport", "validate_dataset", "REPORT_DIR", "EVENTS_DIR"]
