"""Real-data adapters: the mapping, the accounting, and contract validity.

Unit tests build small raw files themselves; the full-dataset tests use ../shared/data
and skip with a visible reason when it is absent."""

from __future__ import annotations

from pathlib import Path

import numpy as np
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


def _write_movielens1m(raw, *, gz: bool) -> None:
    import gzip

    raw.mkdir()
    ratings = "1::10::5::978300760\n1::11::3::978300761\n2::10::4::978300762\n2::11::9::978300763\n3::10\n"
    if gz:
        with gzip.open(raw / "ratings.dat.gz", "wt") as fh:
            fh.write(ratings)
    else:
        (raw / "ratings.dat").write_text(ratings)
    (raw / "users.dat").write_text("1::F::1::10::48067\n2::M::56::16::x0072\n")
    (raw / "movies.dat").write_bytes("10::Toy Story (1995)::Animation|Children's|Comedy\n"
                                     "11::Am\xe9lie (2001)::Romance\n".encode("latin-1"))


@pytest.mark.parametrize("gz", [True, False])
def test_movielens1m_mapping_and_quarantine(tmp_path, gz):
    from gem.data.adapters.movielens1m import convert_movielens1m

    _write_movielens1m(tmp_path / "raw", gz=gz)
    conv = convert_movielens1m(tmp_path / "raw", tmp_path / "out").extra["conversion"]
    ratings = "ratings.dat.gz" if gz else "ratings.dat"
    assert conv["lines"][ratings] == 5 and conv["converted"][ratings] == 3 and conv["reconciles"]
    assert conv["reasons"] == {f"{ratings}.out_of_range:rating": 1, f"{ratings}.field_count:2!=4": 1}
    ev = _events(tmp_path / "out").sort_values("event_id")
    assert ev.click.tolist() == [1, 0, 1] and ev.conversion.tolist() == [1, 0, 0]
    assert ev.surface.tolist() == ["messaging", "feed", "messaging"]
    users = pd.read_parquet(tmp_path / "out" / "users.parquet").set_index("user_id")
    assert users.loc[1, "age_bucket"] == "<18" and users.loc[1, "device"] == "occupation:K-12 student"
    assert users.loc[2, "age_bucket"] == "56+" and users.loc[2, "country"] == "US-?"
    items = pd.read_parquet(tmp_path / "out" / "items.parquet").set_index("item_id")
    assert items.loc[10, "advertiser_id"] == 1995 and items.loc[10, "category_id"] == 3  # Animation
    assert items.loc[10, "format"] == "Animation|Children's|Comedy" and items.loc[11, "objective"] == "2000s"
    assert sum(validate_dataset(tmp_path / "out").quarantined_rows.values()) == 0


def test_movielens1m_implicit_negatives_follow_the_rule(tmp_path):
    """Implicit feedback: every rating a positive, one negative per positive at its time,
    never a movie the user had rated up to then, example-only, the same with the same seed."""
    from gem.data.adapters.movielens1m import convert_movielens1m

    raw = tmp_path / "raw"
    raw.mkdir()
    rng = np.random.default_rng(1)
    lines = [f"{u}::{m}::{r}::{978300000 + t}" for u, m, r, t in
             zip(rng.integers(1, 4, 90), rng.integers(1, 40, 90), rng.integers(1, 6, 90), rng.integers(0, 50, 90))]
    (raw / "ratings.dat").write_text("\n".join(lines) + "\n")
    (raw / "users.dat").write_text("1::F::1::10::48067\n2::M::56::16::10072\n3::M::25::1::20072\n")
    (raw / "movies.dat").write_text("".join(f"{m}::Movie {m} (1995)::Comedy\n" for m in range(1, 41)))
    convert_movielens1m(raw, tmp_path / "a", implicit=True, seed=3)
    ev = _events(tmp_path / "a")
    pos, neg = ev[ev.role.isna()], ev[ev.role == "example"]
    assert len(pos) == len(neg) == 90 and (pos.click == 1).all() and (neg.click == 0).all()
    assert (ev.conversion == 0).all() and neg.event_id.min() > pos.event_id.max()
    assert set(neg.item_id) <= set(pos.item_id)  # drawn from the log's rated movies (40 is never rated)
    first = pos.groupby(["user_id", "item_id"]).event_time.min()
    rated = first.reindex(pd.MultiIndex.from_arrays([neg.user_id, neg.item_id])).to_numpy()
    assert not (pd.notna(rated) & (rated <= neg.event_time.to_numpy())).any(), "a negative the user had rated"
    pairs = sorted(zip(pos.user_id, pos.event_time)), sorted(zip(neg.user_id, neg.event_time))
    assert pairs[0] == pairs[1]  # one negative per positive, same user and time
    assert sum(validate_dataset(tmp_path / "a").quarantined_rows.values()) == 0
    convert_movielens1m(raw, tmp_path / "b", implicit=True, seed=3)
    again = _events(tmp_path / "b").sort_values("event_id")
    assert again.item_id.tolist() == ev.sort_values("event_id").item_id.tolist()


def test_ciao_mapping_repeats_and_bad_ratings(tmp_path):
    from gem.data.adapters.ciao import convert_ciao

    day = 959670000  # 2000-05-30, the source's first day
    lines = ["user_id,item_id,category_id,rating,helpfulness,timestamp",
             f"1,100,24,5,4,{day}",
             f"1,101,4,3,1,{day + 86400}",
             f"1,100,24,2,1,{day + 2 * 86400}",  # a later repeat of (1, 100): quarantined
             f"2,100,24,4,1,{day + 86400}",
             f"2,102,4,0,1,{day}",  # rating 0: quarantined
             f"2,103,4,4,1,{day + 3 * 86400}",
             f"2,103,4,5,1,{day + 3 * 86400}",  # same day repeat: the earlier line is kept
             f"3,104,29,4,1,{day}",  # no category 29
             "3,105,4"]
    (tmp_path / "ratings.csv").write_text("\n".join(lines) + "\n")
    conv = convert_ciao(tmp_path / "ratings.csv", tmp_path / "out").extra["conversion"]
    assert conv["lines"]["ratings.csv"] == 9 and conv["converted"]["ratings.csv"] == 4 and conv["reconciles"]
    assert conv["reasons"] == {"ratings.csv.repeat:user_item": 2, "ratings.csv.out_of_range:rating": 1,
                               "ratings.csv.out_of_range:category_id": 1, "ratings.csv.field_count:3!=6": 1}
    quarantine = pd.read_parquet(tmp_path / "out" / "_conversion" / "quarantine.parquet")
    assert sorted(quarantine.loc[quarantine.reason == "repeat:user_item", "line"]) == [4, 8]  # file line numbers
    ev = _events(tmp_path / "out").sort_values("event_id")
    assert ev.event_id.tolist() == [2, 3, 5, 7]
    assert ev.surface.tolist() == ["cat24", "cat04", "cat24", "cat04"] and ev.click.tolist() == [1, 0, 1, 1]
    manifest = Manifest.read(tmp_path / "out")
    assert manifest.surfaces[0] == "cat01" and len(manifest.surfaces) == 28
    assert sum(validate_dataset(tmp_path / "out").quarantined_rows.values()) == 0


def test_ciao_refuses_a_file_without_its_header(tmp_path):
    from gem.data.adapters.ciao import convert_ciao

    (tmp_path / "ratings.csv").write_text("1,100,24,5,4,959670000\n")
    with pytest.raises(ValueError, match="ratings.csv: line 1 must be the header"):
        convert_ciao(tmp_path / "ratings.csv", tmp_path / "out")


@pytest.mark.realdata
def test_ciao_full_dataset(tmp_path):
    from gem.data.adapters.ciao import convert_ciao
    from tests.conftest import SHARED_DATA, require_real_data

    raw = require_real_data(SHARED_DATA / "ciao" / "ratings.csv.gz")
    conv = convert_ciao(raw, tmp_path / "ciao").extra["conversion"]
    # the README's defects: 34 rows rated 0, 1,436 repeated pairs (3 of them also rated 0)
    assert conv["lines"]["ratings.csv.gz"] == 284_086 and conv["reconciles"]
    assert conv["reasons"] == {"ratings.csv.gz.out_of_range:rating": 34, "ratings.csv.gz.repeat:user_item": 1_433}
    ev = _events(tmp_path / "ciao")
    assert len(ev) == 284_086 - 34 - 1_433 and ev.surface.nunique() == 28
    assert ev.click.mean() == pytest.approx(0.80, abs=0.01)  # the README: 80.0% of ratings are >= 4
    assert not ev.duplicated(["user_id", "item_id"]).any()
