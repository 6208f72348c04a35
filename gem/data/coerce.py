"""Per-column type coercion for contract validation.

A column whose type family can hold the contract type (e.g. int32 or numeric strings
for an int64 id, any timestamp unit for event_time) is coerced value by value: values
that don't convert are marked bad, and their rows are quarantined as ``wrong_type``.
A column whose type can never hold it (a list where an id belongs, an integer epoch of
unknown unit for a timestamp) stops validation with a ContractError naming file and
column.

No value ever stops validation: a value that fails a conversion (an id string beyond
int64, an unsigned id above 2**63-1, a timestamp out of range, bytes that are not UTF-8
in a string column) is marked bad like any other; ``invalid_utf8`` tells the last case
apart (see ``invalid_utf8``).
"""

from __future__ import annotations

import numpy as np
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
    if pat.is_null(source):  # a column with no value at all (e.g. an all-null optional column)
        return pa.nulls(len(array), pa.int64() if pat.is_integer(target) else target), np.zeros(len(array), bool)
    if pat.is_integer(target):
        coerced, bad = _to_int(array, source, file, column)
    elif pat.is_boolean(target):
        coerced, bad = _to_bool(array, source, file, column)
    elif pat.is_timestamp(target):
        coerced, bad = _to_timestamp(array, source, target, file, column)
    elif pat.is_string(target):
        if not (pat.is_string(source) or pat.is_large_string(source)):
            raise _wrong(file, column, source, target)
        array, bad = drop_invalid_utf8(array)
        coerced = array.cast(pa.string())
    else:  # pragma: no cover - the contract uses only the types above
        raise _wrong(file, column, source, target)
    return coerced, bad


def _wrong(file: str, column: str, source: pa.DataType, target: pa.DataType) -> ContractError:
    return ContractError(f"{file}: column {column!r} has type {source}, which cannot hold the contract type {target}")


def _to_int(array: pa.Array, source: pa.DataType, file: str, column: str) -> tuple[pa.Array, np.ndarray]:
    if pat.is_integer(source) or pat.is_boolean(source):
        return cast_or_null(array, pa.int64())
    if pat.is_floating(source):
        values = array.to_numpy(zero_copy_only=False)
        present = ~np.isnan(values)
        ok = present & np.isfinite(values) & (np.floor(values) == values) & (np.abs(values) < 2**62)
        bad = present & ~ok
        out = pa.array(np.where(ok, values, 0).astype(np.int64), mask=~ok)
        return out, bad
    if pat.is_string(source) or pat.is_large_string(source):
        array, bad = drop_invalid_utf8(array)
        match = pc.match_substring_regex(array, _INT_PATTERN)
        bad |= _filled(pc.and_(pc.is_valid(array), pc.invert(match)))
        kept = pc.if_else(match, pc.utf8_trim_whitespace(array), pa.scalar(None, pa.string()))
        out, overflow = cast_or_null(kept, pa.int64())  # more digits than int64 holds
        return out, bad | overflow
    raise _wrong(file, column, source, pa.int64())


def _to_bool(array: pa.Array, source: pa.DataType, file: str, column: str) -> tuple[pa.Array, np.ndarray]:
    if pat.is_boolean(source):
        return array, np.zeros(len(array), bool)
    if pat.is_integer(source):
        ok = pc.is_in(array, pa.array([0, 1], source))
        bad = _filled(pc.and_(pc.is_valid(array), pc.invert(ok)))
        return pc.if_else(ok, array, pa.scalar(None, source)).cast(pa.bool_()), bad
    if pat.is_string(source) or pat.is_large_string(source):
        array, bad_bytes = drop_invalid_utf8(array)
        lowered = pc.utf8_lower(pc.utf8_trim_whitespace(array))
        is_true, is_false = pc.is_in(lowered, pa.array(_TRUE)), pc.is_in(lowered, pa.array(_FALSE))
        ok = pc.or_(is_true, is_false)
        bad = _filled(pc.and_(pc.is_valid(array), pc.invert(ok))) | bad_bytes
        return pc.if_else(ok, is_true, pa.scalar(None, pa.bool_())), bad
    raise _wrong(file, column, source, pa.bool_())


def _to_timestamp(array: pa.Array, source: pa.DataType, target: pa.DataType, file: str,
                  column: str) -> tuple[pa.Array, np.ndarray]:
    if pat.is_timestamp(source):
        if source.tz is None:  # naive times are read as UTC (documented in the contract)
            source = pa.timestamp(source.unit, tz="UTC")
            array = array.cast(pa.int64()).cast(source)
        return cast_or_null(array, target)  # e.g. seconds beyond year 294247 in microseconds
    if pat.is_string(source) or pat.is_large_string(source):
        import pandas as pd  # here: only ISO text times need it (pipeline tasks import this module)

        array, bad_bytes = drop_invalid_utf8(array)
        raw = pd.Series(array.to_pandas(), dtype=object)
        parsed = pd.to_datetime(raw, errors="coerce", utc=True, format="ISO8601")
        bad = (raw.notna() & parsed.isna()).to_numpy() | bad_bytes
        return pa.array(parsed, type=target, from_pandas=True), bad
    raise _wrong(file, column, source, target)


def _filled(mask: pa.Array) -> np.ndarray:
    return pc.fill_null(mask, False).to_numpy(zero_copy_only=False).astype(bool)


def cast_or_null(array: pa.Array, target: pa.DataType, block: int = 4096) -> tuple[pa.Array, np.ndarray]:
    """Cast; values the cast refuses (overflow, unparsable) become null and are marked
    bad. The failing case is bisected block by block, so one bad value costs ~one block."""
    try:
        return array.cast(target), np.zeros(len(array), bool)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, OverflowError):
        pass
    parts, bad = [], np.zeros(len(array), bool)
    for lo in range(0, len(array), block):
        chunk = array.slice(lo, block)
        try:
            parts.append(chunk.cast(target))
            continue
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, OverflowError):
            pass
        values = []
        for i in range(len(chunk)):
            try:
                values.append(chunk.slice(i, 1).cast(target)[0].as_py())
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError, OverflowError):
                values.append(None)
                bad[lo + i] = True
        parts.append(pa.array(values, target))
    return (pa.concat_arrays(parts) if parts else pa.array([], target)), bad


def invalid_utf8(array: pa.Array) -> np.ndarray:
    """bool (n,): string values whose bytes are not valid UTF-8 (Parquet does not check)."""
    if not (pat.is_string(array.type) or pat.is_large_string(array.type)):
        return np.zeros(len(array), bool)
    try:
        array.validate(full=True)
        return np.zeros(len(array), bool)
    except pa.ArrowInvalid:
        pass
    binary = array.view(pa.large_binary() if pat.is_large_string(array.type) else pa.binary())
    bad = np.zeros(len(array), bool)
    for i, value in enumerate(binary.to_pylist()):
        if value is not None:
            try:
                value.decode("utf-8")
            except UnicodeDecodeError:
                bad[i] = True
    return bad


def drop_invalid_utf8(array: pa.Array) -> tuple[pa.Array, np.ndarray]:
    """The array with non-UTF-8 values set to null, and the mask of those values."""
    bad = invalid_utf8(array)
    if bad.any():
        array = pc.if_else(pa.array(bad), pa.scalar(None, array.type), array)
    return array, bad


def printable_rows(table: pa.Table) -> list[dict]:
    """``table.to_pylist()`` that never fails on bytes that are not UTF-8 (shown as bytes)."""
    columns = {}
    for name, column in zip(table.column_names, table.columns):
        column = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
        if pat.is_dictionary(column.type):
            column = column.dictionary_decode()
        if invalid_utf8(column).any():
            column = column.view(pa.large_binary() if pat.is_large_string(column.type) else pa.binary())
        columns[name] = column.to_pylist()
    return [dict(zip(columns, values)) for values in zip(*columns.values())] if columns else []
