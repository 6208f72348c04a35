"""Build the training examples of a time window from a contract dataset.

    plan = prepare_build(data_dir, out_dir, cfg)         # vocab, Feast work repo, staging
    for key in list_shards(plan): build_shard(plan, key)       # independent, any process
    manifest = finalize_build(plan, cfg)                 # report, manifest (written last)

``build_features`` runs the three steps, fanning shards over processes. Output:

    OUT/manifest.json   FeatureSpec, window, shards (+sha256), counts, bytes, digest
    OUT/report.json     validation report (see report.py)
    OUT/vocab/*.parquet vocabularies (id = 1 + row)
    OUT/validation/     the input's quarantine and validation report, when the validator
                        quarantined rows (see validation.py: by default the build refuses)
    OUT/shards/<bucket>-<day>/{examples,history,users}.parquet, stats.json (segments.py)

The manifest is removed when a build starts and written last: a directory without
one is an unfinished build and the loader refuses it.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import os
import shutil
import time
from pathlib import Path

from gem.data.batch import FeatureSpec
from gem.data.contract import EVENT_TYPES, MANIFEST, TASKS, DatasetHandle, Manifest, parse_utc
from gem.data.profile import daily_counts, profile_dataset
from gem.errors import MachineError, machine_failure
from gem.features.config import FeaturesConfig
from gem.features.counters import COUNTER_FEATURES, GLOBAL, KINDS
from gem.features.feast_repo import apply, copy_repo, resolve_repo
from gem.features.feast_sources import export
from gem.features.jobs import counter_job, index_job, shard_job, stage_job
from gem.features.plan import (
    PLAN_FILE,
    WORK_DIR,
    BuildPlan,
    dataset_days,
    day_start_us,
    shard_periods,
    to_us,
    window_days,
)
from gem.features.report import build_report, log_to_mlflow, read_report, report_warnings
from gem.features.segments import FORMAT
from gem.features.shards import DENSE_FEATURES, SPARSE_FEATURES, list_shards, read_stats
from gem.features.staging import group_days
from gem.features.storage import dir_bytes, dir_digest, dumps, file_digest, write_json_atomic
from gem.features.validation import checked_dataset
from gem.features.vocab import VOCAB_DIR, VOCAB_NAMES, Vocabularies, build_vocabularies
from gem.protocol import WindowError
from gem.utils.outputs import MARKER, claim_output, json_format, owner
from gem.utils.pool import process_pool
from gem.utils.progress import warning

log = logging.getLogger(__name__)

REPORT_FILE = "report.json"
VALIDATION_DIR = "validation"  # the input's quarantine, when rows were quarantined
OUTPUT_KIND = "features"
# bytes of one materialized sequence element: item int32, event_type/surface/is_ad/action
# int8, age float32 -- the "plain" layout the shard layout is compared with
MATERIALIZED_ELEMENT_BYTES = 4 + 1 + 1 + 1 + 1 + 4
SEQUENCE_CARDINALITY = {"seq_event_type": 1 + len(EVENT_TYPES), "seq_is_ad": 3, "seq_action": 3}


def feature_spec(vocab: Vocabularies, max_seq_len: int, surfaces: list[str], tasks: list[str],
                 history_labels: bool = True, counters: bool = False) -> FeatureSpec:
    sparse = {"user_id": vocab.cardinality("user_id"), "item_id": vocab.cardinality("item_id")}
    for name in SPARSE_FEATURES[2:]:
        sparse[name] = vocab.cardinality(name.split("_", 1)[1])
    sequence = {"seq_item_id": vocab.cardinality("item_id"), "seq_surface": 1 + len(surfaces), **SEQUENCE_CARDINALITY}
    # keys sorted: the manifest JSON is key-sorted, so the spec reads back identical
    return FeatureSpec(
        sparse=dict(sorted(sparse.items())),
        sequence=dict(sorted(sequence.items())),
        dense=list(DENSE_FEATURES) + (list(COUNTER_FEATURES) if counters else []),
        max_seq_len=max_seq_len,
        surfaces=list(surfaces),
        tasks=list(tasks),
        history_labels=history_labels,
        vocab_digests=dict(sorted(vocab.digests().items())),
    )


def prepare_build(data_dir: str | Path | DatasetHandle, out_dir: str | Path, cfg: FeaturesConfig, *,
                  window_start: str | None = None, window_end: str | None = None,
                  allow_empty: bool = False) -> BuildPlan:
    """Stage the window's inputs (see the module doc). ``data_dir``: a path, or the
    stage's DatasetHandle (its manifest and digests are then not read again). A window
    without any event is refused here, before any work (WindowError naming its bounds),
    unless ``allow_empty``."""
    cfg.check()
    dataset = DatasetHandle.open(data_dir)
    data_dir, out_dir, manifest = dataset.root, Path(out_dir).resolve(), dataset.manifest
    claim_output(out_dir, OUTPUT_KIND, inputs=[data_dir] + ([cfg.vocab_from] if cfg.vocab_from else []),
                 legacy=_earlier_build)
    (out_dir / MANIFEST).unlink(missing_ok=True)  # from here on the directory is "unfinished"
    shutil.rmtree(out_dir / WORK_DIR, ignore_errors=True)
    shutil.rmtree(out_dir / VALIDATION_DIR, ignore_errors=True)
    dataset = checked_dataset(dataset, out_dir / WORK_DIR, out_dir / VALIDATION_DIR, on_invalid=cfg.on_invalid)
    data_dir = dataset.root
    start = parse_utc(window_start) if window_start else manifest.start
    end = parse_utc(window_end) if window_end else manifest.end
    if start >= end:
        raise WindowError(f"window start {start.isoformat()} must be before its end {end.isoformat()}")
    start_us, end_us = to_us(start), to_us(end)
    history_days = [d for d in dataset_days(data_dir) if day_start_us(d) < end_us]
    # events per day from the dataset's cached daily counts (read once per dataset, not per build)
    by_day = daily_counts(dataset).events_by_day()
    if not allow_empty and not any(by_day.get(d, 0) for d in window_days(start_us, end_us)):
        raise WindowError(f"{dataset.root}: the features window [{start.isoformat()}, {end.isoformat()}) holds no "
                          f"event (the data's window is [{manifest.window_start}, {manifest.window_end})); choose "
                          "--start/--end inside it, or pass --allow-empty to build an empty window")
    sizes = {d: by_day.get(d, 0) for d in history_days}
    events = sum(sizes.values())
    example_days, period_days = shard_periods(window_days(start_us, end_us), sizes, days_per_shard=cfg.days_per_shard,
                                              shard_events=cfg.shard_events, num_buckets=cfg.num_buckets)
    profile = profile_dataset(dataset)  # the whole dataset's: every window of it gets the same spec
    for text in profile.warnings:
        log.warning("features: %s", text)
    if not profile.surfaces:
        raise ValueError(f"{data_dir}: no event on any of the manifest's surfaces {profile.declared_surfaces}")
    plan = BuildPlan(
        data_dir=str(data_dir), out_dir=str(out_dir),
        window_start=start.isoformat(), window_end=end.isoformat(),
        window_start_us=start_us, window_end_us=end_us,
        history_days=history_days,
        stage_groups=group_days(data_dir, history_days, min_groups=_workers(cfg, len(history_days), events),
                                sizes=sizes),
        example_days=example_days, period_days=period_days, days_per_shard=cfg.days_per_shard,
        shard_events=cfg.shard_events,
        max_seq_len=cfg.max_seq_len, num_buckets=cfg.num_buckets, include_organic=cfg.include_organic,
        feast_repo=str(resolve_repo(cfg.feast_repo)),
        # the data's surfaces; tasks stay (click, conversion) while the students' model has
        # two fixed outputs (students/model.py): without conversions that label is all 0 and
        # its metrics are left out (no positive). The GEM heads, loader and knowledge take
        # the data's tasks (profile.tasks, recorded in the manifest) as they are.
        surfaces=profile.surfaces, tasks=list(TASKS), data_tasks=list(profile.tasks),
        data_warnings=list(profile.warnings),  # the scan reads every event file: once per build
        counter_groups=_counter_groups(cfg, events) if cfg.counters else [],
    )
    vocab = Vocabularies.read(Path(cfg.vocab_from)) if cfg.vocab_from else build_vocabularies(
        data_dir, end_us, cfg.min_count)
    vocab.write(out_dir)
    copy_repo(plan.feast_repo, plan.feast_dir)
    export(dataset, plan.feast_dir, parts=("users", "items"))
    apply(plan.feast_dir, definitions_repo=plan.feast_repo)
    plan.write()
    with process_pool(_workers(cfg, len(plan.stage_groups), events)) as pool:
        staged = sum(pool.map(stage_job, [(plan, g) for g in range(len(plan.stage_groups))]))
    with process_pool(_workers(cfg, plan.num_buckets, events)) as pool:
        indexed = sum(pool.map(index_job, [(plan, b) for b in range(plan.num_buckets)]))
    if plan.counter_groups:
        with process_pool(_workers(cfg, len(plan.counter_groups), events)) as pool:
            counted = list(pool.map(counter_job, [(plan, j) for j in range(len(plan.counter_groups))]))
        log.info("features: counters of %s in %d job(s), %d staged rows read", ", ".join(KINDS), len(counted),
                 sum(counted))
    log.info("features: staged %d events of %d days into %d buckets x %d periods (%s days each); index read %d rows",
             staged, len(plan.history_days), plan.num_buckets, len(plan.example_days), _widths(plan), indexed)
    return plan


def _discard_unfinished(out: Path, *, created: bool) -> str:
    """Remove a build the machine stopped: the folder when this build created it, else its
    contents but the ownership marker. Says what it did."""
    if owner(out) != OUTPUT_KIND or (out / MANIFEST).exists():
        return f"{out} left as it was"  # not this build's (the claim failed), or finished
    if created:
        shutil.rmtree(out, ignore_errors=True)
        return f"its unfinished folder {out} was removed"
    for entry in out.iterdir():
        if entry.name != MARKER:
            shutil.rmtree(entry, ignore_errors=True) if entry.is_dir() and not entry.is_symlink() else entry.unlink()
    return f"the unfinished contents of {out} were removed"


def _counter_groups(cfg: FeaturesConfig, events: int) -> list[list[str]]:
    """The counter jobs: every key kind in one job in a one-process build (each job reads
    the staged rows once), else the kinds spread over the workers."""
    kinds = [*KINDS, GLOBAL]
    jobs = _workers(cfg, len(kinds), events)
    return [kinds[j::jobs] for j in range(jobs)]


def _widths(plan: BuildPlan) -> str:
    lo, hi = min(plan.period_days), max(plan.period_days)
    return str(lo) if lo == hi else f"{lo}-{hi}"


def _earlier_build(folder: Path) -> bool:
    """A features folder written before output markers existed."""
    return json_format(MANIFEST, "gem-features/")(folder) or (folder / WORK_DIR / PLAN_FILE).is_file()


# With ``workers: 0`` (auto), a build reading fewer history events runs in one process:
# a process pool's start (each worker re-imports the build) costs more than it saves
# there (measured: staging 184k events, 10.5 s with 2 workers against 3 s in one).
SMALL_BUILD_EVENTS = 1_000_000


def _workers(cfg: FeaturesConfig, jobs: int, events: int | None = None) -> int:
    if not cfg.workers and events is not None and events < SMALL_BUILD_EVENTS:
        return 1
    return max(1, min(cfg.workers or os.cpu_count() or 1, jobs))


def finalize_build(plan: BuildPlan, cfg: FeaturesConfig, *, previous_report: str | Path | None = None,
                   allow_empty: bool = False) -> dict:
    """Check every shard exists, drop stale ones, write report.json then manifest.json.
    A window of no example is refused (WindowError naming its bounds; no manifest is
    written) unless ``allow_empty``."""
    out = Path(plan.out_dir)
    keys = list_shards(plan)
    names = {k.name for k in keys}
    missing = [k.name for k in keys if not (plan.shards_dir / k.name / "stats.json").is_file()]
    if missing:
        more = " ..." if len(missing) > 5 else ""
        raise RuntimeError(f"{plan.shards_dir}: shards not built yet: {missing[:5]}{more}")
    for stale in plan.shards_dir.iterdir():
        if stale.name not in names:  # another window's shard or a dead temp dir
            shutil.rmtree(stale) if stale.is_dir() else stale.unlink()
    stats = [read_stats(plan.shards_dir / k.name) for k in keys]
    vocab = Vocabularies.read(out)
    spec = feature_spec(vocab, plan.max_seq_len, plan.surfaces, plan.tasks, cfg.history_labels,
                        counters=bool(plan.counter_groups))
    window = {"start": plan.window_start, "end": plan.window_end}
    previous = read_report(previous_report) if previous_report else None
    report = build_report(stats, window=window, max_seq_len=plan.max_seq_len, previous=previous)
    report["warnings"] = report_warnings(report, plan.data_warnings)
    for text in report["warnings"]:
        warning(text)  # the data's warnings among them read as ingest said them: a console says each once
    manifest = _manifest(plan, cfg, spec, keys, stats, window)
    if not allow_empty and not manifest["counts"]["examples"]:
        raise WindowError(f"{plan.data_dir}: the features window [{plan.window_start}, {plan.window_end}) holds no "
                          "example (events, but no impression to predict); choose another window, or pass "
                          "--allow-empty to build an empty one")
    write_json_atomic(report, out / REPORT_FILE)
    write_json_atomic(manifest, out / MANIFEST)
    if not cfg.keep_work:
        shutil.rmtree(plan.work_dir, ignore_errors=True)
    log_to_mlflow(report)
    return manifest


def _manifest(plan, cfg, spec, keys, stats, window) -> dict:
    out = Path(plan.out_dir)
    shards = []
    for key, s in zip(keys, stats):
        directory = plan.shards_dir / key.name
        by_day = s.get("examples_by_day", [s["examples"]])  # a shard kept from an older build: one slice
        shards.append({"name": key.name, "bucket": key.bucket, "day": key.day, "days": len(by_day),
                       "examples": s["examples"], "examples_by_day": by_day,
                       "history_events": s["history_events_stored"], "bytes": dir_bytes(directory),
                       "sha256": dir_digest(directory)})
    examples = sum(s["examples"] for s in shards)
    seq_elements = sum(s["sequence_elements"] for s in stats)
    total_bytes = sum(s["bytes"] for s in shards)
    vocab_digests = {n: file_digest(out / VOCAB_DIR / f"{n}.parquet") for n in VOCAB_NAMES}
    source = Manifest.read(Path(plan.data_dir))
    digest = hashlib.sha256(dumps({"spec": spec.to_dict(), "window": window, "vocab": vocab_digests,
                                   "shards": [(s["name"], s["sha256"]) for s in shards]}).encode()).hexdigest()
    config = {k: v for k, v in dataclasses.asdict(cfg).items()
              if k not in ("workers", "keep_work", "feast_repo", "vocab_from")}
    return {
        "format": FORMAT,
        "dataset": {"name": source.name, "source": source.source, "surfaces": list(source.surfaces),
                    "data_surfaces": list(plan.surfaces), "data_tasks": list(plan.data_tasks),
                    "manifest_sha256": file_digest(Path(plan.data_dir) / MANIFEST)},
        "window": window,
        "spec": spec.to_dict(),
        "config": config,
        "shards": shards,
        "counts": {"examples": examples, "shards": len(shards),
                   "history_events_stored": sum(s["history_events"] for s in shards),
                   "sequence_elements": seq_elements,
                   "staged_rows_read_by_shards": sum(s.get("staged_rows_read", 0) for s in stats)},
        # the shard width as configured (0: chosen from the events per day) and as chosen
        "periods": {"days_per_shard": plan.days_per_shard, "shard_events": plan.shard_events,
                    "first_days": list(plan.example_days), "days": list(plan.period_days)},
        "bytes": {"total": total_bytes, "per_example": total_bytes / examples if examples else 0.0,
                  "materialized_per_example": (seq_elements * MATERIALIZED_ELEMENT_BYTES / examples
                                               if examples else 0.0)},
        "vocab": {"sha256": vocab_digests,
                  "cardinality": {n: len(v) + 1 for n, v in Vocabularies.read(out).values.items()}},
        "digest": digest,
    }


def build_features(data_dir: str | Path, out_dir: str | Path, cfg: FeaturesConfig | None = None, *,
                   window_start: str | None = None, window_end: str | None = None,
                   previous_report: str | Path | None = None, allow_empty: bool = False) -> dict:
    """Build every shard of the window into ``out_dir``; returns the features manifest.
    A window without events or examples is refused unless ``allow_empty``. When the
    machine fails the build (a full disk, the file size limit), its unfinished files are
    removed and MachineError names the resource."""
    cfg = cfg or FeaturesConfig()
    started = time.perf_counter()
    if previous_report:
        read_report(previous_report)  # a missing one is refused before any work
    existed = Path(out_dir).exists()
    try:
        plan = prepare_build(data_dir, out_dir, cfg, window_start=window_start, window_end=window_end,
                             allow_empty=allow_empty)
        keys = list_shards(plan)
        with process_pool(_workers(cfg, len(keys))) as pool:
            for i, _ in enumerate(pool.map(shard_job, [(plan, k) for k in keys]), 1):
                if i % max(1, len(keys) // 10) == 0 or i == len(keys):
                    log.info("features: %d/%d shards (%.1fs)", i, len(keys), time.perf_counter() - started)
        manifest = finalize_build(plan, cfg, previous_report=previous_report, allow_empty=allow_empty)
    except Exception as exc:
        failure = machine_failure(exc, where=str(out_dir))
        if failure is None:
            raise
        removed = _discard_unfinished(Path(out_dir), created=not existed)
        raise MachineError(f"features build stopped: {failure} ({removed})") from exc
    log.info("features: %d examples in %d shards, %.1f bytes/example, %.1fs", manifest["counts"]["examples"],
             len(keys), manifest["bytes"]["per_example"], time.perf_counter() - started)
    return manifest
