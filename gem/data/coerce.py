"""Per-column type coercion for contract validation.

A column whose type family can hold the contract type (e.g. int32 or numeric strings
for an int64 id, any timestamp unit for event_time) is coerced value by value: values
that don't convert are marked bad, and their rows are quarantined as ``wrong_type``.
A column whose type can never hold it (a list where an id belongs, an integer epoch of
unknown unit for a timestamp) stops validation with a ContractError naming file and
column.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.types as pat

from gem.data.contract import ContractError

_INT_PATTERN = r"^\s*[-+]?\d+\s*$"
_TRUE = ("true", "1", "t", "yes")
_FALSE = ("false", "0", "f", "no")


def coerce(array: pa.ChunkedArray | pa.Array, target: pa.DataType, *, file: str,
           column: str) -> tuple[pa.Array, np.ndarray]:
    """Return (array of the contract type, bool mask of values that failed to convert).

    Integer contract columns are coerced to int64 (domain checks happen later)."""
    if isinstance(array, pa.ChunkedArray):
        array = array.combine_chunks()
    if pat.is_dictionary(array.type):
        array = array.dictionary_decode()
    source = array.type
    if pat.is_integer(target):
        coerced, bad = _to_int(array, source, file, column)
    elif pat.is_boolean(target):
        coerced, bad = _to_bool(array, source, file, column)
    elif pat.is_timestamp(target):
        coerced, bad = _to_timestamp(array, source, target, file, column)
    elif pat.is_string(target):
        if not (pat.is_string(source) or pat.is_large_string(source)):
            raise _wrong(file, column, source, target)
        coerced, bad = array.cast(pa.string()), np.zeros(len(array), bool)
    else:  # pragma: no cover - the contract uses only the types above
        raise _wrong(file, column, source, target)
    return coerced, bad


def _wrong(file: str, column: str, source: pa.DataType, target: pa.DataType) -> ContractError:
    return ContractError(f"{file}: column {column!r} has type {source}, which cannot hold the contract type {target}")


def _to_int(array: pa.Array, source: pa.DataType, file: str, column: str) -> tuple[pa.Array, np.ndarray]:
    if pat.is_integer(source) or pat.is_boolean(source):
        return array.cast(pa.int64()), np.zeros(len(array), bool)
    if pat.is_floating(source):
        values = array.to_numpy(zero_copy_only=False)
        present = ~np.isnan(values)
        ok = present & np.isfinite(values) & (np.floor(values) == values) & (np.abs(values) < 2**62)
        bad = present & ~ok
        out = pa.array(np.where(ok, values, 0).astype(np.int64), mask=~ok)
        return out, bad
    if pat.is_string(source) or pat.is_large_string(source):
        match = pc.match_substring_regex(array, _INT_PATTERN)
        bad = _filled(pc.and_(pc.is_valid(array), pc.invert(match)))
        kept = pc.if_else(match, pc.utf8_trim_whitespace(array), pa.scalar(None, pa.string()))
        return kept.cast(pa.int64()), bad
    raise _wrong(file, column, source, pa.int64())


def _to_bool(array: pa.Array, source: pa.DataType, file: str, column: str) -> tuple[pa.Array, np.ndarray]:
    if pat.is_boolean(source):
        return array, np.zeros(len(array), bool)
    if pat.is_integer(source):
        ok = pc.is_in(array, pa.array([0, 1], source))
        bad = _filled(pc.and_(pc.is_valid(array), pc.invert(ok)))
        return pc.if_else(ok, array, pa.scalar(None, source)).cast(pa.bool_()), bad
    if pat.is_string(source) or pat.is_large_string(source):
        lowered = pc.utf8_lower(pc.utf8_trim_whitespace(array))
        is_true, is_false = pc.is_in(lowered, pa.array(_TRUE)), pc.is_in(lowered, pa.array(_FALSE))
        ok = pc.or_(is_true, is_false)
        bad = _filled(pc.and_(pc.is_valid(array), pc.invert(ok)))
        return pc.if_else(ok, is_true, pa.scalar(None, pa.bool_())), bad
    raise _wrong(file, column, source, pa.bool_())


def _to_timestamp(array: pa.Array, source: pa.DataType, target: pa.DataType, file: str,
                  column: str) -> tuple[pa.Array, np.ndarray]:
    if pat.is_timestamp(source):
        if source.tz is None:  # naive times are read as UTC (documented in the contract)
            array = array.cast(pa.timestamp(target.unit)).cast(pa.int64()).cast(target)
        return array.cast(target), np.zeros(len(array), bool)
    if pat.is_string(source) or pat.is_large_string(source):
        raw = pd.Series(array.to_pandas(), dtype=object)
        parsed = pd.to_datetime(raw, errors="coerce", utc=True, format="ISO8601")
        bad = (raw.notna() & parsed.isna()).to_numpy()
        return pa.array(parsed, type=target, from_pandas=True), bad
    raise _wrong(file, column, source, target)


def _filled(mask: pa.Array) -> np.ndarray:
    return pc.fill_null(mask, False).to_numpy(zero_copy_only=False).astype(bool)
