"""Real-data adapters: the mapping, the accounting, and contract validity.

Unit tests build small raw files themselves; the full-dataset tests use ../shared/data
and skip with a visible reason when it is absent."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pyarrow.dataset as ds
import pytest

from gem.data.adapters.movielens import convert_movielens
from gem.data.adapters.taobao import convert_taobao
from gem.data.contract import Manifest
from gem.data.validate import validate_dataset

# 2017-11-25 10:00 China time = 02:00 UTC
T0 = 1_511_575_200


def _events(root: Path) -> pd.DataFrame:
    return ds.dataset(root / "events", partitioning="hive").to_table().to_pandas()


def _write_movielens(raw: Path) -> None:
    raw.mkdir()
    (raw / "u.data").write_text("1\t10\t5\t881250949\n1\t11\t3\t881250950\n2\t10\t4\t881250951\n2\t11\tx\t1\n3\t10\n")
    (raw / "u.user").write_text("1|24|M|technician|85711\n2|53|F|other|94043\n")
    genres = ["0"] * 19
    animation, drama = list(genres), list(genres)
    animation[3] = "1"
    drama[8] = "1"
    (raw / "u.item").write_text(
        "10|Toy|01-Jan-1995||url|" + "|".join(animation) + "\n11|Drama|01-Jan-1995||url|" + "|".join(drama) + "\n"
    )


def test_movielens_mapping_and_quarantine(tmp_path):
    _write_movielens(tmp_path / "raw")
    manifest = convert_movielens(tmp_path / "raw", tmp_path / "out")
    conv = manifest.extra["conversion"]
    assert conv["lines"]["u.data"] == 5 and conv["converted"]["u.data"] == 3
    assert conv["reasons"] == {"u.data.not_integer:rating": 1, "u.data.field_count:2!=4": 1}
    assert conv["reconciles"]
    ev = _events(tmp_path / "out").sort_values("event_id")
    assert ev.click.tolist() == [1, 0, 1] and ev.conversion.tolist() == [1, 0, 0]
    assert ev.surface.tolist() == ["messaging", "feed", "messaging"]
    report = validate_dataset(tmp_path / "out")
    assert report.processed_rows["events"] == 3 and sum(report.quarantined_rows.values()) == 0


def test_taobao_mapping_negatives_and_window(tmp_path):
    rows = [
        f"1,100,7,pv,{T0}",
        f"1,100,7,buy,{T0 + 3600}",
        f"1,101,8,pv,{T0 + 10}",
        f"2,101,8,pv,{T0 + 20}",
        f"2,100,7,cart,{T0 - 50}",  # before the pv of 2/100: no pv at all -> no conversion
        f"2,102,9,pv,{T0 - 400 * 86400}",  # outside the window
        "2,103,9,pv",  # malformed
    ]
    (tmp_path / "UserBehavior.csv").write_text("\n".join(rows) + "\n")
    manifest = convert_taobao(tmp_path / "UserBehavior.csv", tmp_path / "out", seed=1)
    conv = manifest.extra["conversion"]
    assert conv["reconciles"] and conv["lines"]["UserBehavior.csv"] == 7
    assert conv["reasons"] == {"UserBehavior.csv.outside_window": 1, "UserBehavior.csv.field_count:4!=5": 1}
    ev = _events(tmp_path / "out")
    clicked = ev[ev.click == 1].sort_values("event_id")
    assert clicked.item_id.tolist() == [100, 101, 101] and clicked.conversion.tolist() == [1, 0, 0]
    negatives = ev[ev.click == 0]
    assert len(negatives) == 3 and (negatives.event_id % 4 != 0).all() and (negatives.conversion == 0).all()
    assert sum(validate_dataset(tmp_path / "out").quarantined_rows.values()) == 0


@pytest.mark.realdata
def test_movielens_full_dataset(movielens_dataset):
    ev = _events(movielens_dataset)
    assert len(ev) == 100_000
    assert ev.click.mean() == pytest.approx(0.554, abs=0.002)  # share of ratings >= 4
    assert ev.conversion.mean() == pytest.approx(0.212, abs=0.002)  # share of 5s
    assert ev.surface.nunique() == 4
    report = validate_dataset(movielens_dataset)
    assert report.processed_rows["events"] == 100_000 and sum(report.quarantined_rows.values()) == 0


@pytest.mark.realdata
def test_taobao_full_dataset(taobao_dataset):
    manifest = Manifest.read(taobao_dataset)
    conv = manifest.extra["conversion"]
    assert conv["reconciles"] and conv["lines"]["UserBehavior.csv"] == 84_475
    notes = conv["notes"]
    assert notes["impressions_from_pv"] + notes["conversion_signals"] + sum(conv["quarantined"].values()) == 84_475
    ev = _events(taobao_dataset)
    assert 0.4 < ev.click.mean() < 0.6  # one sampled negative per click
    assert 0 < ev.conversion.mean() < 0.1
    report = validate_dataset(taobao_dataset)
    assert sum(report.quarantined_rows.values()) == 0 and report.processed_rows["events"] == len(ev)
