"""The features build against the peer a data engineer would write: one DuckDB SQL query.

    python -m benchmarks.features_duckdb [--sizes 1m,10m] [--sample 2000]

The peer (``peer_query``) computes the same point-in-time last-N sequences as the
project's build, with window functions over the raw events, and materializes one
Parquet row per example (``COPY ... TO`` zstd):

- the same rows: one per ad impression (role not "history") in the window [start, end);
- the same N (1,024, the `default` features preset) and the same history rule: the
  last N events of the user with event_time strictly before the example's (events at the
  same microsecond excluded, ties ordered by event_id), rows with role "example" never in
  a history;
- the same label-time rule: a history event's click is shown only when click_time (or
  its event time) is strictly before the example's time, its conversion only when
  conversion_time is; an organic like/share shows as a view until then.

How: a running count of the user's visible events gives each visible event its rank and
each example the rank of its history end (events strictly before it); the visible events
and one probe row per example, keyed by those ranks, go through one window whose frame
is the N ranks before the probe (empty on the other rows: the frame bounds are
per-row expressions), and ``list()`` collects the elements; the labels are then masked
per element against the example's time (``list_transform``).

Both are timed in the same process, one after the other, on the same simulated data
(1M events: preset events_1m, 10M: large) written clean by the validator, as the
pipeline's features builds read ingest's output, each given the machine's cores. The
sequences are checked equal on a random sample of examples (item ids through the build's
vocabulary, event type, surface, is_ad, action, and the event second of every element).
Writes benchmarks/results/features_duckdb.json.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np

from benchmarks.results import print_table, work_dir, write_result
from gem.utils.memory import keep_freed_memory

SIZES = {"1m": "events_1m", "10m": "large"}
MAX_SEQ_LEN = 1024
GOAL_SPEEDUP = 3.0
GOAL_STORAGE_RATIO = 1 / 50

PEER_SQL = """
WITH ev AS (
  SELECT user_id, event_id, epoch_us(event_time) AS t, item_id, surface, is_ad, click, conversion,
         CASE event_type WHEN 'impression' THEN 1 WHEN 'view' THEN 2 WHEN 'like' THEN 3 WHEN 'share' THEN 4
                         ELSE 0 END AS event_type,
         greatest(epoch_us(event_time), coalesce(epoch_us(click_time), epoch_us(event_time))) AS click_known,
         epoch_us(conversion_time) AS conversion_t,
         coalesce(role, 'both') <> 'example' AS visible,
         is_ad AND coalesce(role, 'both') <> 'history' AND epoch_us(event_time) >= {start_us} AS example
  FROM {source}
  WHERE epoch_us(event_time) < {end_us}
),
ranked AS (
  SELECT *,
         count(*) FILTER (WHERE visible) OVER (PARTITION BY user_id ORDER BY t, event_id
                                              ROWS UNBOUNDED PRECEDING) AS visible_rank,
         count(*) FILTER (WHERE visible) OVER (PARTITION BY user_id ORDER BY t
                                              RANGE BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS history_end
  FROM ev
),
keyed AS (
  SELECT user_id, visible_rank::DOUBLE AS k, false AS probe, NULL::BIGINT AS example_id, NULL::BIGINT AS example_t,
         item_id, event_type, surface, is_ad, click, click_known, conversion_t, t
  FROM ranked WHERE visible
  UNION ALL
  SELECT user_id, history_end + 0.5, true, event_id, t, item_id, NULL, surface, NULL, click, NULL, NULL, NULL
  FROM ranked WHERE example
),
windowed AS (
  SELECT user_id, probe, example_id, example_t, item_id AS example_item, surface AS example_surface,
         click AS example_click,
         list(item_id) FILTER (WHERE NOT probe) OVER w AS items,
         list(event_type) FILTER (WHERE NOT probe) OVER w AS types,
         list(surface) FILTER (WHERE NOT probe) OVER w AS surfaces,
         list(is_ad) FILTER (WHERE NOT probe) OVER w AS ads,
         list(click) FILTER (WHERE NOT probe) OVER w AS clicks,
         list(click_known) FILTER (WHERE NOT probe) OVER w AS clicks_known,
         list(conversion_t) FILTER (WHERE NOT probe) OVER w AS conversions_t,
         list(t) FILTER (WHERE NOT probe) OVER w AS times
  FROM keyed
  WINDOW w AS (PARTITION BY user_id ORDER BY k
               RANGE BETWEEN CASE WHEN probe THEN {n} - 0.5 ELSE 0.5 END PRECEDING
                         AND CASE WHEN probe THEN 0.5 ELSE 0.25 END PRECEDING)
)
SELECT example_id, user_id, example_t AS event_time_us, example_item AS item_id, example_surface AS surface,
       example_click AS click,
       coalesce(items, []) AS seq_item_id,
       coalesce(list_transform(list_zip(types, clicks, clicks_known),
                               lambda x: CASE WHEN x[1] >= 3 AND NOT (x[2] = 1 AND x[3] < example_t) THEN 2
                                              ELSE x[1] END), []) AS seq_event_type,
       coalesce(surfaces, []) AS seq_surface,
       coalesce(ads, []) AS seq_is_ad,
       coalesce(list_transform(list_zip(clicks, clicks_known, conversions_t),
                               lambda x: CASE WHEN x[1] = 1 AND x[2] < example_t
                                              THEN CASE WHEN x[3] < example_t THEN 2 ELSE 1 END ELSE 0 END),
                []) AS seq_action,
       coalesce(times, []) AS seq_event_time_us
FROM windowed WHERE probe
"""


def peer_query(data: Path, start_us: int, end_us: int, n: int = MAX_SEQ_LEN, *,
               present: set[str] | None = None) -> str:
    """The peer's SQL over ``data``'s events; an optional column none of its files has
    (``present``: the columns they have) reads as NULL."""
    import pyarrow as pa

    from gem.data.contract import EVENTS_DIR, EVENTS_SCHEMA, OPTIONAL_EVENT_COLUMNS

    events = "'" + str(Path(data) / EVENTS_DIR / "day=*" / "*.parquet").replace("'", "''") + "'"
    source = f"read_parquet({events}, hive_partitioning = false, union_by_name = true)"
    missing = [c for c in OPTIONAL_EVENT_COLUMNS if present is not None and c not in present]
    if missing:
        sql_type = {c: "VARCHAR" if pa.types.is_string(EVENTS_SCHEMA.field(c).type) else "TIMESTAMPTZ"
                    for c in missing}
        nulls = ", ".join(f"NULL::{sql_type[c]} AS {c}" for c in missing)
        source = f"(SELECT *, {nulls} FROM {source})"
    return PEER_SQL.format(source=source, start_us=int(start_us), end_us=int(end_us), n=int(n))


def present_columns(con, data: Path) -> set[str]:
    from gem.data.contract import EVENTS_DIR

    events = str(Path(data) / EVENTS_DIR / "day=*" / "*.parquet").replace("'", "''")
    return {row[0] for row in con.execute(
        f"DESCRIBE SELECT * FROM read_parquet('{events}', hive_partitioning = false, union_by_name = true)"
    ).fetchall()}


def run_peer(data: Path, out: Path, *, start_us: int, end_us: int, n: int = MAX_SEQ_LEN,
             threads: int | None = None, memory_limit: str = "", spill: Path | None = None) -> dict:
    """Materialize the peer's sequences of ``data``'s window to ``out`` (one Parquet
    file, zstd); seconds and bytes."""
    import duckdb

    out.parent.mkdir(parents=True, exist_ok=True)
    con = duckdb.connect()
    try:
        con.execute(f"SET threads TO {int(threads or os.cpu_count() or 1)}")
        if memory_limit:
            con.execute(f"SET memory_limit = '{memory_limit}'")
        if spill:
            con.execute(f"SET temp_directory = '{str(spill).replace(chr(39), chr(39) * 2)}'")
        con.execute("SET preserve_insertion_order = false")
        target = str(out).replace("'", "''")
        start = time.perf_counter()
        query = peer_query(data, start_us, end_us, n, present=present_columns(con, data))
        con.execute(f"COPY ({query}) TO '{target}' "
                    "(FORMAT parquet, COMPRESSION zstd)")
        seconds = time.perf_counter() - start
        rows = con.execute(f"SELECT count(*) FROM read_parquet('{target}')").fetchone()[0]
    finally:
        con.close()
    return {"seconds": seconds, "bytes": out.stat().st_size, "examples": int(rows)}


def peer_rows(path: Path, example_ids: np.ndarray) -> dict[int, dict]:
    """The peer's rows of ``example_ids``, by example id."""
    import duckdb
    import pyarrow as pa

    con = duckdb.connect()
    try:
        con.register("wanted", pa.table({"example_id": np.asarray(example_ids, dtype=np.int64)}))
        table = con.sql(f"SELECT p.* FROM read_parquet('{str(path).replace(chr(39), chr(39) * 2)}') p "
                        "JOIN wanted USING (example_id)").to_arrow_table()
    finally:
        con.close()
    return {row["example_id"]: row for row in table.to_pylist()}


SEQ_KEYS = ("seq_item_id", "seq_event_type", "seq_surface", "seq_is_ad", "seq_action")


def compare(features: Path, peer: Path, *, sample: int, seed: int = 0, shards: int = 4) -> dict:
    """The build's sequences of ``sample`` random examples (from ``shards`` random shards)
    against the peer's rows: the same examples, and the same elements in every key
    (items through the build's vocabulary, surfaces through its spec, is_ad as 1/2,
    event seconds as the build stores them). Returns the counts and the mismatches."""
    import duckdb

    from gem.features.loader import FeatureLoader
    from gem.features.vocab import Vocabularies

    loader = FeatureLoader(features, batch_size=1024, shuffle=False)
    rng = np.random.default_rng(seed)
    names = [s["name"] for s in loader.manifest["shards"]]
    chosen = sorted(rng.choice(names, size=min(shards, len(names)), replace=False).tolist())
    items = Vocabularies.read(features).values["item_id"].to_numpy(zero_copy_only=False)
    surfaces = loader.spec.surfaces
    ours: dict[int, dict] = {}
    for batch in FeatureLoader(features, batch_size=1024, shuffle=False, shards=chosen):
        lengths = batch.sequence.lengths()[: batch.batch_size].numpy()
        offsets = np.concatenate([[0], np.cumsum(lengths)])
        values = batch.sequence.values().view(len(batch.sequence.keys()), -1).numpy()
        by_key = dict(zip(batch.sequence.keys(), values))
        ages = batch.sequence_age.numpy()
        for i, eid in enumerate(batch.example_id.numpy().tolist()):
            lo, hi = offsets[i], offsets[i + 1]
            ours[eid] = {k: by_key[k][lo:hi] for k in SEQ_KEYS} | {"age": ages[lo:hi]}
    picked = rng.choice(sorted(ours), size=min(sample, len(ours)), replace=False)
    theirs = peer_rows(peer, picked)
    con = duckdb.connect()
    try:
        peer_examples = con.execute(f"SELECT count(*) FROM read_parquet('{str(peer).replace(chr(39), chr(39) * 2)}')"
                                    ).fetchone()[0]
    finally:
        con.close()
    mismatches, elements = [], 0
    for eid in picked.tolist():
        have, want = ours[eid], theirs.get(eid)
        if want is None:
            mismatches.append({"example_id": eid, "what": "missing from the peer"})
            continue
        t = want["event_time_us"]
        expect = {
            "seq_item_id": np.searchsorted(items, np.asarray(want["seq_item_id"], dtype=np.int64)) + 1,
            "seq_event_type": np.asarray(want["seq_event_type"], dtype=np.int64),
            "seq_surface": np.array([surfaces.index(s) + 1 for s in want["seq_surface"]], dtype=np.int64),
            "seq_is_ad": np.asarray(want["seq_is_ad"], dtype=np.int64) + 1,
            "seq_action": np.asarray(want["seq_action"], dtype=np.int64),
        }
        for key in SEQ_KEYS:
            if not np.array_equal(have[key], expect[key]):
                mismatches.append({"example_id": eid, "what": key, "ours": have[key][:8].tolist(),
                                   "peer": expect[key][:8].tolist()})
                break
        else:
            # the build stores whole event seconds: its age is (t - floor(event second)) in float32
            seconds = np.asarray(want["seq_event_time_us"], dtype=np.int64) // 1_000_000
            exact = (t - seconds * 1_000_000) / 1e6
            if len(exact) and np.max(np.abs(have["age"] - exact) / np.maximum(exact, 1.0)) > 1e-5:
                mismatches.append({"example_id": eid, "what": "age"})
        elements += len(want["seq_item_id"])
    return {"examples_ours": loader.num_examples, "examples_peer": int(peer_examples), "checked": len(picked),
            "elements_checked": elements, "shards_sampled": chosen, "mismatches": len(mismatches),
            "first_mismatches": mismatches[:5]}


def validated(data: Path) -> tuple[Path, float | None]:
    """``data`` written clean by the validator (stamped), as ingest leaves it for the
    pipeline's features builds; reused while the data and code are unchanged. Returns the
    folder and the validation's seconds when it ran now."""
    from benchmarks.results import built
    from gem.data.validate import validate_dataset
    from gem.utils.digest import tree_digest

    out, seconds = data.with_name(f"{data.name}-clean"), {}

    def build(o: Path) -> None:
        start = time.perf_counter()
        validate_dataset(data, report_dir=o.with_name(f".{o.name}-report"), out=o)
        seconds["s"] = time.perf_counter() - start

    built(out, {"data": tree_digest(data)}, build)
    return out, seconds.get("s")


def side_by_side(data: Path, tmp: Path, sample: int) -> dict:
    """The project's build and the peer on ``data`` validated (as the pipeline's
    features builds read it), timed one after the other."""
    from benchmarks.scale_bench import TreeUsage, count_events, dir_bytes
    from gem.config import load_config
    from gem.data.contract import Manifest
    from gem.features.build import build_features
    from gem.features.config import FeaturesConfig
    from gem.features.plan import to_us

    data, validation_s = validated(data)
    manifest = Manifest.read(data)
    cfg = load_config(FeaturesConfig, section="features", preset="default", overrides=[f"max_seq_len={MAX_SEQ_LEN}"])
    before = round(os.getloadavg()[0], 2)
    ours_dir = tmp / "ours"
    with TreeUsage() as ours_usage:
        start = time.perf_counter()
        built_manifest = build_features(data, ours_dir, cfg)
        ours_s = time.perf_counter() - start
    middle = round(os.getloadavg()[0], 2)
    peer_path = tmp / "peer" / "sequences.parquet"
    with TreeUsage() as peer_usage:
        peer = run_peer(data, peer_path, start_us=to_us(manifest.start), end_us=to_us(manifest.end),
                        memory_limit=os.environ.get("GEM_PEER_MEMORY", "10GB"), spill=tmp / "spill")
    after = round(os.getloadavg()[0], 2)
    check = compare(ours_dir, peer_path, sample=sample)
    ours_bytes = dir_bytes(ours_dir / "shards") + dir_bytes(ours_dir / "vocab")
    out = {
        "events": count_events(data), "examples": built_manifest["counts"]["examples"],
        "ours_seconds": round(ours_s, 1), "peer_seconds": round(peer["seconds"], 1),
        "speedup_ours_over_peer": round(peer["seconds"] / ours_s, 2),
        "ours_bytes": ours_bytes, "peer_bytes": peer["bytes"],
        "storage_ratio_ours_over_peer": round(ours_bytes / peer["bytes"], 4),
        "ours_peak_rss_gb": round(ours_usage.peak_rss / 2**30, 2),
        "peer_peak_rss_gb": round(peer_usage.peak_rss / 2**30, 2),
        "ours_cpu_s": round(ours_usage.cpu_s, 1), "peer_cpu_s": round(peer_usage.cpu_s, 1),
        "same_examples": check["examples_ours"] == check["examples_peer"] == peer["examples"],
        "check": check,
        "load_average_1m": {"before": before, "between": middle, "after": after},
        "validation_s": None if validation_s is None else round(validation_s, 1),
    }
    out["goals"] = {"ours_at_least_3x_faster": out["speedup_ours_over_peer"] >= GOAL_SPEEDUP,
                    "or_at_most_equal_time_with_1_50_storage": (out["speedup_ours_over_peer"] >= 1.0
                                                                and out["storage_ratio_ours_over_peer"]
                                                                <= GOAL_STORAGE_RATIO)}
    out["goals"]["met"] = any(out["goals"].values())
    return out


def main(argv: list[str] | None = None) -> int:
    from benchmarks.scale_bench import simulated

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1m,10m", help=f"of {sorted(SIZES)}")
    parser.add_argument("--sample", type=int, default=2000, help="examples whose sequences are compared")
    parser.add_argument("--data-root", default=None, help="simulated data (default $GEM_SCALE_DATA, "
                                                          "else .local_runs/scale)")
    args = parser.parse_args(argv)
    keep_freed_memory()  # this process runs builds, as `gem features build`'s does
    sizes = [s for s in args.sizes.split(",") if s]
    if unknown := [s for s in sizes if s not in SIZES]:
        parser.error(f"unknown size(s) {unknown}; of {sorted(SIZES)}")
    root = Path(args.data_root or os.environ.get("GEM_SCALE_DATA") or work_dir("scale"))
    started = time.perf_counter()
    figures = {}
    for size in sizes:
        data = simulated(root, SIZES[size])
        tmp = Path(tempfile.mkdtemp(prefix=f"features-duckdb-{size}-", dir=root))
        try:
            figures[size] = side_by_side(data, tmp, args.sample)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        print_table(f"features build vs one DuckDB query, {size} events",
                    [(k, v) for k, v in figures[size].items() if not isinstance(v, dict)])
    figures["bench_wall_s"] = round(time.perf_counter() - started, 1)
    path = write_result("features_duckdb", figures, sizes={
        "data": {s: f"simulator preset {SIZES[s]}" for s in sizes}, "max_seq_len": MAX_SEQ_LEN,
        "features_preset": "default", "peer": "one DuckDB query (benchmarks/features_duckdb.py PEER_SQL), "
                                              "all cores, COPY to Parquet zstd",
        "ours_bytes": "the build's shards and vocabularies (what its loader reads)",
        "note": "both read the dataset written clean by the validator (as the pipeline's features builds "
                "read ingest's output: an unchanged stamped dataset is not validated again); the build also does "
                "what the peer leaves out: vocabularies, point-in-time attributes through Feast, the report; "
                "validation_s: the validation, when it ran in this run"})
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
