"""Which surfaces get students (benchmarks/transfer/surfaces.py), the student-row cuts,
and the windows of a log with quarters and a longer evaluation window (the Ciao preset)."""

from __future__ import annotations

import datetime as dt

import numpy as np
import pyarrow.dataset as pads
import pytest
import torch

from benchmarks.transfer.experiment import PreparedWorld, load_experiment_config
from benchmarks.transfer.surfaces import cut_tables, newest_rows, student_surfaces, window_counts
from benchmarks.transfer.worlds import World, check_world_windows, windows, world_names
from gem.data.contract import EVENTS_DIR, Manifest, parse_utc
from students.data import StudentTable

DAY_US = 86_400 * 10**6


def _counted(data, lo: str, hi: str) -> dict[str, tuple[int, int]]:
    """surface -> (examples, clicks) of the ad rows in [lo, hi), read from the event files."""
    frame = pads.dataset(data / EVENTS_DIR, partitioning="hive").to_table(
        columns=["surface", "is_ad", "click", "event_time", "role"]).to_pandas()
    t = frame["event_time"]
    rows = frame[(t >= parse_utc(lo)) & (t < parse_utc(hi)) & frame["is_ad"] & (frame["role"] != "history")]
    return {s: (len(g), int(g["click"].sum())) for s, g in rows.groupby("surface")}


def test_students_go_to_the_surfaces_with_evidence_in_every_window(tiny_dataset):
    manifest = Manifest.read(tiny_dataset)
    start = parse_utc(manifest.window_start)
    day = lambda n: (start + dt.timedelta(days=n)).isoformat()  # noqa: E731
    w = {"train": (day(1), day(2)), "validation": (day(2), day(3)), "evaluation": (day(3), day(4))}
    counts = window_counts(tiny_dataset, w)
    for name, (lo, hi) in w.items():  # the cached daily counts are the event files' own counts
        direct = _counted(tiny_dataset, lo, hi)
        assert {s: (c["examples"], c["clicks"]) for s, c in counts[name].items() if c["examples"]} == direct
    declared = list(manifest.surfaces)
    assert student_surfaces(declared, counts, {}) == (declared, {})  # no rule: every surface
    # the rule at the second-smallest surface's evidence: the smallest one becomes teacher-only
    fewest = {s: min(counts[n][s]["clicks"] for n in w) for s in declared}
    floor = sorted(set(fewest.values()))[1]
    chosen, why = student_surfaces(declared, counts, {"examples": 1, "positives": floor})
    assert chosen == [s for s in declared if fewest[s] >= floor and all(
        counts[n][s]["unclicked"] >= floor for n in w)]
    assert chosen and set(why) == set(declared) - set(chosen)
    dropped = min(fewest, key=fewest.get)
    assert dropped in why and "clicked" in why[dropped]
    with pytest.raises(ValueError, match="unknown"):
        student_surfaces(declared, counts, {"clicks": 3})


def _table(surfaces: list[int], times: list[int]) -> StudentTable:
    n = len(surfaces)
    table = StudentTable(sparse=torch.zeros(n, 1, dtype=torch.long), history=torch.zeros(n, 1, dtype=torch.long),
                         dense=torch.zeros(n, 1), surface=torch.tensor(surfaces), labels=torch.zeros(n, 2),
                         example_id=torch.arange(n), event_time_us=torch.tensor(times) * DAY_US,
                         user_raw=torch.arange(n), item_raw=torch.arange(n))
    table.window_us = (0, 100 * DAY_US)
    return table


def test_a_row_cut_keeps_each_surfaces_newest_rows():
    rng = np.random.default_rng(0)
    surfaces = [0] * 40 + [1] * 7
    times = rng.integers(0, 90, size=len(surfaces)).tolist()
    times[40:43] = [95, 95, 95]  # a tie among surface 1's newest rows: the larger example id is the newer
    table = _table(surfaces, times)
    cut = newest_rows(table, 0.1)
    assert cut.window_us == table.window_us
    for s, n, keep in ((0, 40, 4), (1, 7, 1)):  # ceil(0.1 x rows): a surface keeps at least one row
        mine = cut.surface == s
        assert int(mine.sum()) == keep
        all_times = table.event_time_us[table.surface == s]
        assert int(cut.event_time_us[mine].min()) >= int(torch.sort(all_times).values[n - keep])
    assert cut.example_id[cut.surface == 1].tolist() == [42]
    assert len(newest_rows(table, 1.0)) == len(table)
    with pytest.raises(ValueError, match="fraction"):
        newest_rows(table, 0.0)
    tables = {"train": table, "validation": _table([0], [96]), "evaluation": _table([1], [97])}
    cut_all = cut_tables(tables, 0.3)
    assert cut_all["validation"] is tables["validation"] and cut_all["evaluation"] is tables["evaluation"]
    assert len(cut_all["train"]) == 12 + 3


def test_a_cut_world_keeps_the_headline_teachers_and_cuts_the_same_rows_everywhere():
    train = _table([0] * 10 + [1] * 10, list(range(20)))
    with_knowledge = _table([0] * 10 + [1] * 10, list(range(20)))
    with_knowledge.teacher_logits = torch.randn(20, 2)
    rest = {"validation": _table([0], [96]), "evaluation": _table([1], [97])}
    world = World("gap0", 0, {"train": ("a", "b")}, {}, teachers=["t0"], timings={"students_s": 1.0})
    prepared = PreparedWorld(world, None, {"train": train, **rest}, {"t0": {"1d": {"train": with_knowledge, **rest}}},
                             {"t0": {}}, (32, 16), ["cat01"], {"cat02": "too few"})
    cut = prepared.cut("rows30", 0.3)
    assert cut.world.name == "rows30" and cut.world.teachers is world.teachers and cut.world.timings == {}
    assert world.name == "gap0" and world.timings == {"students_s": 1.0}  # the headline world untouched
    ids = cut.base_tables["train"].example_id.tolist()
    assert ids == cut.knowledge_tables["t0"]["1d"]["train"].example_id.tolist() == [7, 8, 9, 17, 18, 19]
    assert cut.knowledge_tables["t0"]["1d"]["evaluation"] is rest["evaluation"]
    assert (cut.surfaces, cut.teacher_only, cut.dims) == (["cat01"], {"cat02": "too few"}, (32, 16))


def test_the_ciao_preset_windows_end_at_the_logs_end_in_quarters():
    cfg = load_experiment_config("ciao")
    ds = cfg.datasets[0]
    assert world_names(ds) == ["gap0", "rows10", "rows30", "gap1", "gap2", "gap4", "fresh"]
    assert set(cfg.cut_arms) >= {"combined", "nt_combined"}  # the 10%-rows goal's comparison
    log_start = parse_utc("2000-05-30")
    head = windows(ds, log_start, "gap0")
    assert head["evaluation"][1].startswith("2011-04-13")  # the converted log's window_end
    lo, hi = (parse_utc(x) for x in head["evaluation"])
    assert hi - lo == dt.timedelta(days=2 * 91)
    for name in ("gap0", "gap1", "gap2", "gap4", "fresh"):
        w = windows(ds, log_start, name)
        check_world_windows(name, w)
        assert {k: w[k] for k in ("train", "validation", "evaluation")} == \
            {k: head[k] for k in ("train", "validation", "evaluation")}
    lo, hi = (parse_utc(x) for x in windows(ds, log_start, "gap4")["teacher"])
    assert parse_utc(head["train"][0]) - hi == dt.timedelta(days=4 * 91) and hi - lo == dt.timedelta(days=12 * 91)
