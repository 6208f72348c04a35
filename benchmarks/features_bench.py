"""Features benchmark: our sharded build vs materialized last-N arrays through Feast.

`python -m benchmarks features` (or `python -m benchmarks.features_bench [--quick]`).

1. Simulate ~10M events (preset `large`: 115k users x 14 days), cached under
   .local_runs/bench-data/ (git-ignored); simulation time is not counted.
2. Ours: `build_features` with max_seq_len 1,024 (preset `default`), timed; peak RSS of
   the whole process tree (build + its workers), sampled every 0.2 s.
3. The plain way on a subsample of users: a Feast source with one row per (user, event
   time) holding the materialized last-1,024 arrays (built with duckdb window lists),
   `feast apply`, then `get_historical_features` for the subsample's impressions as of
   t - 1 us. Time and bytes are measured on the subsample and scaled by its share of
   events (linear scaling flatters the plain way: its work per event grows with N).
4. Loader throughput (examples/s into KJT batches of 1,024) with 0 and 2 workers.
5. Long span (``long_span``; alone: ``--long-span``, merged into the existing JSON): a
   3-year simulated log with few events per day (LONG_SPAN: ~320k events, ~290 a day),
   built with the shard width chosen from the data (days_per_shard 0) and with the old
   fixed width of one day, in the same run: shards, seconds per phase, events/s, staged
   rows read by the shards, and their ratios.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import threading
import time
from dataclasses import asdict
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from benchmarks.results import built, print_table, work_dir, write_result
from gem.utils.memory import keep_freed_memory

CACHE = work_dir("bench-data")
MAX_SEQ_LEN = 1024
SUBSAMPLE_BUCKETS = 200  # the plain way runs on users with user_bucket % 200 == 0 (0.5%)
# 3 years, ~0.8 events per user a day: a sparse log whose days far outnumber its shards' worth of events
LONG_SPAN = {"users": 400, "items": 3000, "days": 1095, "activity_log_mean": -1.0, "topics": 16,
             "advertisers": 100, "seed": 1}


class TreeRssSampler:
    """Peak summed RSS of this process and all its descendants (workers included)."""

    def __init__(self, interval: float = 0.2):
        import psutil

        self.proc, self.interval, self.peak = psutil.Process(), interval, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        import psutil

        while not self._stop.is_set():
            total = 0
            for p in [self.proc, *self.proc.children(recursive=True)]:
                try:
                    total += p.memory_info().rss
                except psutil.Error:
                    pass
            self.peak = max(self.peak, total)
            self._stop.wait(self.interval)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()


def dataset(preset: str, overrides: dict | None = None) -> Path:
    """The simulator's ``preset`` (with ``overrides``) under the bench cache, reused only
    while its resolved config and the code are unchanged."""
    from gem.config import load_config
    from gem.data.simulate import SimulatorConfig, simulate
    from gem.utils.digest import value_digest

    out = CACHE / (f"sim-{preset}" if overrides is None else f"sim-{preset}-{value_digest(overrides)[:8]}")
    cfg = load_config(SimulatorConfig, section="simulator", preset=preset,
                      overrides=[f"{k}={v}" for k, v in (overrides or {}).items()])
    built(out, {"simulator": asdict(cfg)}, lambda o: simulate(cfg, o, progress=False))
    return out


def run_ours(data: Path, out: Path, days_per_shard: int = 1) -> dict:
    from gem.config import load_config
    from gem.features.build import build_features
    from gem.features.config import FeaturesConfig

    cfg = load_config(FeaturesConfig, section="features", preset="default",
                      overrides=[f"max_seq_len={MAX_SEQ_LEN}", f"days_per_shard={days_per_shard}"])
    with TreeRssSampler() as rss:
        start = time.perf_counter()
        manifest = build_features(data, out, cfg)
        seconds = time.perf_counter() - start
    return {"manifest": manifest, "seconds": seconds, "peak_rss_bytes": rss.peak}


def run_phases(data: Path, out: Path, days_per_shard: int) -> dict:
    """build_features' three steps, each timed (default preset, max_seq_len 1,024)."""
    from gem.config import load_config
    from gem.features.build import _workers, finalize_build, prepare_build
    from gem.features.config import FeaturesConfig
    from gem.features.jobs import shard_job
    from gem.features.shards import list_shards
    from gem.utils.pool import process_pool

    cfg = load_config(FeaturesConfig, section="features", preset="default",
                      overrides=[f"max_seq_len={MAX_SEQ_LEN}", f"days_per_shard={days_per_shard}"])
    with TreeRssSampler() as rss:
        start = time.perf_counter()
        plan = prepare_build(data, out, cfg)
        prepared = time.perf_counter()
        keys = list_shards(plan)
        with process_pool(_workers(cfg, len(keys))) as pool:
            list(pool.map(shard_job, [(plan, k) for k in keys]))
        built = time.perf_counter()
        manifest = finalize_build(plan, cfg)
        end = time.perf_counter()
    events = manifest["counts"]["history_events_stored"]
    loader = loader_seconds(out, seconds=60)
    return {"shards": len(keys), "periods": len(plan.example_days),
            "days_per_period": sorted(set(plan.period_days)),
            "build_seconds": round(end - start, 1), "prepare_seconds": round(prepared - start, 1),
            "shard_seconds": round(built - prepared, 1), "finalize_seconds": round(end - built, 1),
            "shard_ms_each": round(1000 * (built - prepared) / max(len(keys), 1), 1),
            "examples": manifest["counts"]["examples"], "history_events_stored": events,
            "staged_rows_read_by_shards": manifest["counts"]["staged_rows_read_by_shards"],
            "bytes_per_example": round(manifest["bytes"]["per_example"], 2),
            "peak_rss_gb": round(rss.peak / 2**30, 3), "digest": manifest["digest"],
            "loader_examples_per_s_time_order": loader}


def loader_seconds(features: Path, seconds: float) -> int:
    """Examples/s of the trainer's reading (time order, batches of 1,024, in-process), at
    most ``seconds`` of it: a one-day shard reads the segments of every earlier day."""
    from gem.features.loader import FeatureLoader

    seen, start = 0, time.perf_counter()
    for batch in FeatureLoader(features, batch_size=1024, seed=0, shard_order="time"):
        seen += batch.batch_size
        if time.perf_counter() - start > seconds:
            break
    return round(seen / (time.perf_counter() - start))


def long_span(tmp: Path) -> dict:
    """Section 5: the chosen width and the old one-day width on the same 3-year log."""
    from gem.data.contract import Manifest
    from gem.features.staging import day_events

    data = dataset("tiny", LONG_SPAN)
    manifest = Manifest.read(data)
    events = sum(day_events(data, [d.isoformat() for d in manifest.days()]).values())
    load_start = os.getloadavg()[0]
    runs = {}
    for name, width in (("auto", 0), ("one_day", 1)):
        runs[name] = run_phases(data, tmp / f"long-{name}", width)
        runs[name]["events_per_s"] = round(events / runs[name]["build_seconds"])
        shutil.rmtree(tmp / f"long-{name}", ignore_errors=True)
    auto, daily = runs["auto"], runs["one_day"]
    return {
        "auto": auto, "one_day": daily,
        "ratios_one_day_over_auto": {
            "shards": round(daily["shards"] / auto["shards"], 1),
            "build_seconds": round(daily["build_seconds"] / auto["build_seconds"], 2),
            "shard_seconds": round(daily["shard_seconds"] / max(auto["shard_seconds"], 0.1), 1),
            "staged_rows_read_by_shards": round(daily["staged_rows_read_by_shards"]
                                                / auto["staged_rows_read_by_shards"], 3),
            "bytes_per_example": round(daily["bytes_per_example"] / auto["bytes_per_example"], 1),
            "loader_examples_per_s": round(daily["loader_examples_per_s_time_order"]
                                           / max(auto["loader_examples_per_s_time_order"], 1), 3)},
        "same_examples": auto["examples"] == daily["examples"],
        "sizes": {"simulator": {"preset": "tiny", **LONG_SPAN}, "events": events, "days": len(manifest.days()),
                  "events_per_day": round(events / len(manifest.days()), 1), "features_preset": "default",
                  "max_seq_len": MAX_SEQ_LEN, "num_buckets": 8, "shard_events": 100_000},
        "load_average_1m": {"start": round(load_start, 2), "end": round(os.getloadavg()[0], 2),
                            "note": "2-core machine shared with other jobs; >2 means contention"},
        "note": "prepare_seconds (validation, profile, vocabularies, staging, the bucket index) read the "
                "log's 1,095 day files a few times each whatever the width; shard_seconds follow the shards",
    }


def merge_long_span(section: dict) -> Path:
    """``--long-span`` alone: the section replaces ``long_span`` in the existing features.json."""
    import json

    from benchmarks.results import machine_info, results_dir
    from gem.utils.atomic import write_json

    path = results_dir() / "features.json"
    payload = json.loads(path.read_text()) if path.is_file() else {}
    payload["long_span"] = {**section, "machine": machine_info(),
                            "written_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    write_json(payload, path)
    return path


def bytes_by_file(features: Path, examples: int) -> dict[str, float]:
    """Bytes per example of each kind of shard file (examples, history, users, stats)."""
    totals: dict[str, int] = {}
    for path in (features / "shards").glob("*/*"):
        totals[path.name] = totals.get(path.name, 0) + path.stat().st_size
    return {name: round(size / max(examples, 1), 2) for name, size in sorted(totals.items())}


def subsample_events(data: Path, out: Path) -> tuple[Path, int, int]:
    """Copy the subsample's events into one Parquet file; returns (path, events, total)."""
    from gem.data.contract import event_files
    from gem.features.jagged import user_bucket

    writer, kept, total = None, 0, 0
    path = out / "events.parquet"
    for file in event_files(data):
        table = pq.read_table(file)
        total += table.num_rows
        mask = user_bucket(table.column("user_id").to_numpy(), SUBSAMPLE_BUCKETS) == 0
        table = table.filter(pa.array(mask))
        kept += table.num_rows
        writer = writer or pq.ParquetWriter(path, table.schema)
        writer.write_table(table)
    writer.close()
    return path, kept, total


PLAIN_SOURCE_SQL = """
    WITH w AS (
      SELECT user_id, event_time, event_id,
             list(item_id) OVER last_n AS item_ids,
             list(epoch_us(event_time)) OVER last_n AS event_times_us,
             list(CAST(is_ad AS INT) * 1000 + click * 100 + conversion * 10
                  + CASE event_type WHEN 'impression' THEN 1 WHEN 'view' THEN 2 WHEN 'like' THEN 3 ELSE 4 END)
                  OVER last_n AS codes,
             list(surface) OVER last_n AS surfaces,
             row_number() OVER (PARTITION BY user_id, event_time ORDER BY event_id DESC) AS last_of_tie
      FROM read_parquet('{events}')
      WINDOW last_n AS (PARTITION BY user_id ORDER BY event_time, event_id
                        ROWS BETWEEN {n_minus_1} PRECEDING AND CURRENT ROW)
    )
    SELECT user_id, event_time AS event_timestamp, item_ids, event_times_us, codes, surfaces
    FROM w WHERE last_of_tie = 1
"""

PLAIN_REPO_YAML = """project: plain
provider: local
registry: data/registry.db
online_store:
  type: sqlite
  path: data/online_store.db
offline_store:
  type: duckdb
entity_key_serialization_version: 3
"""


def run_plain(data: Path, work: Path) -> dict:
    """Materialized last-N arrays retrieved point-in-time through Feast, on the subsample."""
    import datetime as dt

    import duckdb
    import pandas as pd
    from feast import Entity, FeatureStore, FeatureView, Field, FileSource, ValueType
    from feast.types import Array, Int64, String

    work.mkdir(parents=True, exist_ok=True)
    events, kept, total = subsample_events(data, work)
    repo = work / "repo"
    (repo / "data").mkdir(parents=True)
    (repo / "feature_store.yaml").write_text(PLAIN_REPO_YAML)
    source_path = repo / "data" / "last_n.parquet"

    start = time.perf_counter()
    con = duckdb.connect()
    con.execute("SET threads TO 2")
    con.execute(f"COPY ({PLAIN_SOURCE_SQL.format(events=events, n_minus_1=MAX_SEQ_LEN - 1)}) "
                f"TO '{source_path}' (FORMAT parquet, COMPRESSION zstd)")
    con.close()
    source_seconds = time.perf_counter() - start

    user = Entity(name="user", join_keys=["user_id"], value_type=ValueType.INT64)
    view = FeatureView(
        name="user_last_n", entities=[user], ttl=dt.timedelta(0), online=False,
        schema=[Field(name="item_ids", dtype=Array(Int64)), Field(name="event_times_us", dtype=Array(Int64)),
                Field(name="codes", dtype=Array(Int64)), Field(name="surfaces", dtype=Array(String))],
        source=FileSource(name="last_n", path=str(source_path), timestamp_field="event_timestamp"))
    store = FeatureStore(repo_path=str(repo))
    store.apply([user, view])

    imps = pq.read_table(events, columns=["user_id", "event_time", "is_ad"])
    imps = imps.filter(pc.equal(imps.column("is_ad"), True))
    entity = pd.DataFrame({
        "user_id": imps.column("user_id").to_numpy(),
        "event_timestamp": pd.to_datetime(imps.column("event_time").cast(pa.int64()).to_numpy() - 1,
                                          unit="us", utc=True),
    })
    retrieve_start = time.perf_counter()
    frame = store.get_historical_features(entity_df=entity, features=[
        "user_last_n:item_ids", "user_last_n:event_times_us", "user_last_n:codes", "user_last_n:surfaces"]).to_df()
    retrieve_seconds = time.perf_counter() - retrieve_start
    elements = int(frame["item_ids"].map(lambda v: 0 if v is None or (isinstance(v, float)) else len(v)).sum())
    return {
        "subsample_events": kept, "total_events": total, "subsample_examples": len(entity),
        "source_seconds": source_seconds, "retrieve_seconds": retrieve_seconds,
        "seconds": source_seconds + retrieve_seconds,
        "source_bytes": source_path.stat().st_size, "retrieved_elements": elements,
    }


def loader_throughput(features: Path, num_workers: int, max_batches: int = 400) -> float:
    from gem.features.loader import FeatureLoader

    loader = FeatureLoader(features, batch_size=1024, seed=0, num_workers=num_workers)
    seen, start = 0, time.perf_counter()
    for i, batch in enumerate(loader):
        seen += batch.batch_size
        if i + 1 >= max_batches:
            break
    return seen / (time.perf_counter() - start)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="the `small` simulator preset (smoke run)")
    parser.add_argument("--long-span", action="store_true",
                        help="only section 5 (3-year log), merged into the existing features.json")
    args = parser.parse_args(argv)
    keep_freed_memory()  # this process runs builds, as `gem features build`'s does
    if args.long_span:
        tmp = Path(tempfile.mkdtemp(prefix="features-bench-long-"))
        try:
            section = long_span(tmp)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        print_table("features: 3-year log, width chosen from the data vs one day per shard",
                    [(f"{run}.{k}", v) for run in ("auto", "one_day") for k, v in section[run].items()
                     if not isinstance(v, list)] + list(section["ratios_one_day_over_auto"].items()))
        print(f"wrote {merge_long_span(section)}")
        return 0
    preset = "small" if args.quick else "large"
    data = dataset(preset)
    tmp = Path(tempfile.mkdtemp(prefix="features-bench-"))
    load_start = os.getloadavg()[0]
    try:
        ours = run_ours(data, tmp / "features")
        manifest = ours["manifest"]
        split = bytes_by_file(tmp / "features", manifest["counts"]["examples"])
        weekly = run_ours(data, tmp / "features-weekly", days_per_shard=7)
        shutil.rmtree(tmp / "features-weekly", ignore_errors=True)
        plain = run_plain(data, tmp / "plain")
        loader_0 = loader_throughput(tmp / "features", 0)
        loader_2 = loader_throughput(tmp / "features", 2)
        shutil.rmtree(tmp / "features", ignore_errors=True)
        long = long_span(tmp) if not args.quick else None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    load_end = os.getloadavg()[0]

    events = plain["total_events"]
    examples = manifest["counts"]["examples"]
    scale = events / plain["subsample_events"]
    plain_seconds = plain["seconds"] * scale
    plain_bytes_per_example = plain["source_bytes"] / plain["subsample_examples"]
    ours_bpe = manifest["bytes"]["per_example"]
    figures = {
        "build_seconds_10m": round(ours["seconds"], 2),
        "events_per_s": round(events / ours["seconds"]),
        "peak_rss_gb": round(ours["peak_rss_bytes"] / 2**30, 3),
        "bytes_per_example": round(ours_bpe, 2),
        "bytes_per_example_by_file": split,
        "materialized_bytes_per_example": round(manifest["bytes"]["materialized_per_example"], 1),
        "bytes_ratio_vs_materialized": round(ours_bpe / manifest["bytes"]["materialized_per_example"], 5),
        "plain_feast_source_bytes_per_example": round(plain_bytes_per_example, 1),
        "bytes_ratio_vs_plain_feast_parquet": round(ours_bpe / plain_bytes_per_example, 5),
        "feast_plain_seconds": round(plain_seconds, 1),
        "feast_plain_seconds_measured_on_subsample": round(plain["seconds"], 2),
        "feast_plain_source_seconds_measured": round(plain["source_seconds"], 2),
        "feast_plain_retrieve_seconds_measured": round(plain["retrieve_seconds"], 2),
        "feast_plain_scaled": f"measured on {plain['subsample_events']} of {events} events "
                              f"({100 / scale:.2f}% of users), scaled linearly x{scale:.1f}",
        "speedup_vs_feast_plain": round(plain_seconds / ours["seconds"], 2),
        "loader_examples_per_s": round(max(loader_0, loader_2)),
        "loader_examples_per_s_workers_0": round(loader_0),
        "loader_examples_per_s_workers_2": round(loader_2),
        "weekly_shards": {  # days_per_shard=7: (bucket, week) shards, same examples, sequences and events stored
            "build_seconds_10m": round(weekly["seconds"], 2),
            "peak_rss_gb": round(weekly["peak_rss_bytes"] / 2**30, 3),
            "bytes_per_example": round(weekly["manifest"]["bytes"]["per_example"], 2),
            "bytes_ratio_vs_materialized": round(weekly["manifest"]["bytes"]["per_example"]
                                                 / manifest["bytes"]["materialized_per_example"], 5),
        },
        **({"long_span": long} if long else {}),
        "load_average_1m": {"start": round(load_start, 2), "end": round(load_end, 2),
                            "note": "2-core machine shared with other jobs; >2 means contention"},
        "goals": {"build_under_300s": ours["seconds"] < 300, "peak_rss_under_8gb": ours["peak_rss_bytes"] < 8 * 2**30,
                  "bytes_at_most_1_50_of_materialized": ours_bpe <= manifest["bytes"]["materialized_per_example"] / 50},
    }
    sizes = {"simulator_preset": preset, "events": events, "examples": examples,
             "shards": manifest["counts"]["shards"], "max_seq_len": MAX_SEQ_LEN,
             "mean_sequence_length": round(manifest["counts"]["sequence_elements"] / max(examples, 1), 1),
             "history_events_stored": manifest["counts"]["history_events_stored"],
             "history_events_stored_per_event": round(manifest["counts"]["history_events_stored"] / events, 4),
             "plain_subsample_examples": plain["subsample_examples"], "loader_batch_size": 1024}
    name = "features" if not args.quick else "features_quick"
    path = write_result(name, figures, sizes)
    print_table("features: sharded build vs materialized arrays through Feast",
                [(k, v) for k, v in figures.items() if not isinstance(v, dict)])
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
