"""The features build's gate on its input: gem.data.validate's rules, nothing else.

    dataset = checked_dataset(data, work_dir, report_dir, on_invalid="refuse")  # a DatasetHandle

A dataset written by ``gem data validate --out`` carries a stamp (the digest of its
files and manifest at validation time); an unchanged stamped dataset is not validated
again. Otherwise the validator runs; then:

- no valid event (empty dataset): DatasetRejected, always;
- some rows quarantined: with ``on_invalid="refuse"`` (the default) DatasetRejected
  naming the first bad row's file, row, field and rule and pointing at
  ``python -m gem data validate``; with ``"quarantine"`` the build reads the valid rows
  only (a clean copy in the work dir) and the quarantine is kept in ``report_dir``.
"""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import pyarrow.parquet as pq

from gem.data.contract import DatasetHandle
from gem.data.validate import dataset_stamp, validate_dataset
from gem.errors import UserError

log = logging.getLogger(__name__)
ON_INVALID = ("refuse", "quarantine")


class DatasetRejected(UserError, ValueError):
    """The features build's input breaks the data contract."""


def checked_dataset(data: Path | DatasetHandle, work_dir: Path, report_dir: Path, *,
                    on_invalid: str = "refuse") -> DatasetHandle:
    """The dataset to build from (``data`` or a clean copy); see module doc."""
    if on_invalid not in ON_INVALID:
        raise ValueError(f"features.on_invalid={on_invalid!r} must be one of {ON_INVALID}")
    dataset = DatasetHandle.open(data)
    data_dir = dataset.root
    stamp = dataset.manifest.extra.get("validation", {})
    if stamp.get("digest") and stamp["digest"] == dataset_stamp(dataset):
        log.info("features: %s was validated clean and is unchanged; not validating again", data_dir)
        return dataset
    clean = work_dir / "clean" if on_invalid == "quarantine" else None
    scratch = work_dir / "validation"
    report = validate_dataset(dataset, report_dir=scratch, out=clean)
    hint = f"run `python -m gem data validate {data_dir}` for the full report"
    if report.empty:
        raise DatasetRejected(f"{data_dir}: empty dataset: {report.input_rows.get('events', 0):,} event rows, "
                              f"none valid; nothing to build features from ({hint})")
    quarantined = sum(report.quarantined_rows.values())
    if quarantined == 0:
        shutil.rmtree(scratch, ignore_errors=True)
        return dataset
    report_dir.mkdir(parents=True, exist_ok=True)
    for name in ("quarantine.parquet", "validation_report.json"):
        shutil.move(scratch / name, report_dir / name)
    if on_invalid == "refuse":
        first = pq.read_table(report_dir / "quarantine.parquet").slice(0, 1).to_pylist()[0]
        reasons = ", ".join(f"{k} x{v}" for k, v in sorted(report.reasons.items(), key=lambda kv: -kv[1])[:5])
        raise DatasetRejected(
            f"{data_dir}: {quarantined:,} row(s) break the data contract ({reasons}); first: "
            f"{first['table']} {first['source_file']} row {first['source_row']}: {_rule(first['reason'])}. "
            f"Fix the data, or build from `python -m gem data validate {data_dir} --out CLEAN`, or set "
            f"features.on_invalid=quarantine to drop them; quarantine: {report_dir / 'quarantine.parquet'}")
    log.warning("features: %d row(s) of %s quarantined (%s), building from the rest", quarantined, data_dir,
                json.dumps(report.reasons))
    return DatasetHandle.open(clean)


def _rule(reason: str) -> str:
    """'null:user_id' -> "field 'user_id': rule null"; 'unknown_surface' -> 'rule unknown_surface'."""
    rule, _, field = reason.partition(":")
    return f"field {field!r}: rule {rule}" if field else f"rule {reason}"
