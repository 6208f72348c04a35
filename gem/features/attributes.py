"""Static user/item attributes of examples, through Feast point-in-time retrieval.

Each example asks Feast for the attribute rows of its (user_id, item_id) as of
``impression_time - 1 us``: Feast joins rows with ``event_timestamp <= entity time``,
so shifting by one microsecond turns that into the strict "before the impression"
rule used everywhere in the features stage.

The duckdb offline store returns entity rows without a matching feature row with
nulls, which turns integer columns into float64 (NaN); values are cast back to the
vocabulary's type before lookup, and nulls become id 0 (unknown).
"""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa

from gem.data.contract import ITEM_ATTRIBUTES, USER_ATTRIBUTES
from gem.features.vocab import Vocabularies

FEATURE_REFS = [f"user_attributes:{a}" for a in USER_ATTRIBUTES] + [f"item_attributes:{a}" for a in ITEM_ATTRIBUTES]
ROW = "_example_row"

_stores: dict[str, object] = {}


def _store(repo_dir: Path):
    from gem.features.feast_repo import open_store

    key = str(repo_dir)
    if key not in _stores:
        _stores[key] = open_store(repo_dir)
    return _stores[key]


def entity_frame(user_id: np.ndarray, item_id: np.ndarray, time_us: np.ndarray) -> pd.DataFrame:
    return pd.DataFrame({
        ROW: np.arange(len(user_id), dtype=np.int64),
        "user_id": user_id.astype(np.int64),
        "item_id": item_id.astype(np.int64),
        "event_timestamp": pd.to_datetime(time_us - 1, unit="us", utc=True),
    })


def fetch_attributes(repo_dir: Path, user_id: np.ndarray, item_id: np.ndarray, time_us: np.ndarray) -> pd.DataFrame:
    """The attribute columns (USER_ATTRIBUTES + ITEM_ATTRIBUTES) as raw values, one row
    per input row and in input order."""
    if len(user_id) == 0:
        return pd.DataFrame({a: pd.Series([], dtype=object) for a in USER_ATTRIBUTES + ITEM_ATTRIBUTES})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # ibis's own duckdb deprecations
        job = _store(repo_dir).get_historical_features(
            entity_df=entity_frame(user_id, item_id, time_us), features=FEATURE_REFS)
        frame = job.to_df().sort_values(ROW, kind="stable").reset_index(drop=True)
    if len(frame) != len(user_id) or not np.array_equal(frame[ROW].to_numpy(), np.arange(len(user_id))):
        raise RuntimeError(
            f"{repo_dir}: Feast returned {len(frame)} rows for {len(user_id)} entity rows (expected one each)")
    return frame


def attribute_ids(frame: pd.DataFrame, vocab: Vocabularies) -> dict[str, np.ndarray]:
    """int32 (n,) dense ids per attribute (0 = unknown/null)."""
    out = {}
    for name in USER_ATTRIBUTES + ITEM_ATTRIBUTES:
        values = pa.array(frame[name], from_pandas=True)
        target = vocab.values[name].type
        if pa.types.is_floating(values.type) and pa.types.is_integer(target):
            values = values.cast(target)  # NaN-for-missing came back as float64 nulls
        out[name] = vocab.ids(name, values)
    return out
