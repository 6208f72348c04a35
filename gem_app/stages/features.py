"""features: plan one window (stage its inputs), build its shards (fanned out), finalize
it (report and manifest, written last); feast_materialize: the attribute and
recent-behaviour sources into the Feast repo and its online store.

Reuse: the plan records a content key (the dataset's digest, the window, the resolved
config, the vocabularies it borrows); a window is reused only under the same key, and
shards left by a killed build of the same key are kept, those of another key dropped.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path

from gem import tracking
from gem.data.contract import DatasetHandle
from gem.protocol import dataset_window_tag, window_tag
from gem.utils.digest import lineage_digest, tree_digest, value_digest
from gem.utils.progress import figure, warning
from gem_app.stages.context import Reuse, RunContext, StageResult, tracked

PLAN_RECORD = "features_plan.json"
DONE_RECORD = "features_stage.json"


@dataclass(kw_only=True)
class FeaturesResult(StageResult):
    features: str
    examples: int
    digest: str
    window: str


def _config(preset: str, vocab_from: str, overrides: list[str] | None):
    from gem.config import load_config
    from gem.features.config import FeaturesConfig

    extra = [f"vocab_from={vocab_from}"] if vocab_from else []
    return load_config(FeaturesConfig, section="features", preset=preset, overrides=[*extra, *(overrides or [])])


def _key(dataset: DatasetHandle, start: str, end: str, cfg, vocab_from: str) -> dict:
    from gem.config import flatten

    settings = {k: v for k, v in flatten(cfg).items() if k not in ("vocab_from", "workers")}
    return {"data": dataset.digest, "window": [start, end], "config": value_digest(settings),
            "vocab": tree_digest(Path(vocab_from) / "vocab") if vocab_from else ""}


def _finished(out: str) -> dict | None:
    """The manifest of a finished build in the current layout (an older one is rebuilt)."""
    from gem.features.segments import FORMAT

    path = Path(out) / "manifest.json"
    if not path.is_file():
        return None
    manifest = json.loads(path.read_text())
    return manifest if manifest.get("format") == FORMAT else None


def features_plan(data: str, out: str, start: str, end: str, preset: str, vocab_from: str = "",
                  overrides: list[str] | None = None) -> list[str]:
    """Stage the window's inputs and return the shard names to fan out over."""
    from gem.features.build import prepare_build
    from gem.features.shards import list_shards
    cfg = _config(preset, vocab_from, overrides)
    dataset = DatasetHandle.open(data)  # the manifest read and the tree digested once for the whole stage
    key = _key(dataset, start, end, cfg, vocab_from)
    done = Reuse(Path(out) / DONE_RECORD, key)
    if done.get() and (manifest := _finished(out)):
        return [shard["name"] for shard in manifest["shards"]]
    planned = Reuse(Path(out) / PLAN_RECORD, key)
    if not planned.get():
        shutil.rmtree(Path(out) / "shards", ignore_errors=True)  # built from other inputs
    plan = prepare_build(dataset, out, cfg, window_start=start, window_end=end)
    names = [k.name for k in list_shards(plan)]
    planned.put({"shards": names})
    figure("shards", len(names))
    return names


def features_shard(out: str, shard: str) -> dict:
    """Build one (user bucket, day) shard of a planned window (renamed into place whole,
    so a shard of the current layout found here is complete and of this plan)."""
    from gem.features.plan import BuildPlan, ShardKey
    from gem.features.segments import FORMAT
    from gem.features.shards import build_shard, read_stats
    if _finished(out):
        return {"shard": shard, "reused": True}
    plan = BuildPlan.read(Path(out))
    if (plan.shards_dir / shard / "stats.json").is_file():
        stats = read_stats(plan.shards_dir / shard)
        if stats.get("format") == FORMAT:
            return stats
    return build_shard(plan, ShardKey.parse(shard))


def features_finalize(out: str, preset: str, ctx: RunContext, name: str, vocab_from: str = "",
                      overrides: list[str] | None = None) -> FeaturesResult:
    record = json.loads((Path(out) / PLAN_RECORD).read_text())
    done = Reuse(Path(out) / DONE_RECORD, {k: v for k, v in record["key"].items() if k != "code"})
    if (result := done.get()) and _finished(out):
        from gem.features.build import REPORT_FILE

        for text in json.loads((Path(out) / REPORT_FILE).read_text()).get("warnings", []):
            warning(text)  # said again on every run that uses the build
        return FeaturesResult(**result)
    import mlflow  # here: a reused build needs neither MLflow nor the build code (seconds of imports)

    from gem.config import run_params
    from gem.features.build import finalize_build
    from gem.features.plan import BuildPlan
    from gem.utils.paths import shown

    cfg = _config(preset, vocab_from, overrides)
    plan = BuildPlan.read(Path(out))
    window = window_tag(plan.window_start, plan.window_end)
    with tracked(ctx, f"features-{name}", tags={tracking.TAG_DATA_WINDOW: window}):
        manifest = finalize_build(plan, cfg)
        mlflow.set_tag(tracking.TAG_DATA_DIGEST, lineage_digest(manifest["digest"]))
        mlflow.log_params({**run_params(cfg), "vocab_from": shown(vocab_from, ctx.tracking_root), "window": window,
                           "window_name": name,
                           "shards": manifest["counts"].get("shards", ""), "surfaces": ",".join(plan.surfaces),
                           "tasks": ",".join(plan.data_tasks)})
        log_dataset_input(plan.data_dir, record["key"]["data"], "source")
        mlflow.log_metrics({"features/examples": manifest["counts"]["examples"],
                            "features/bytes_per_example": manifest["bytes"]["per_example"]})
    result = FeaturesResult(features=out, examples=manifest["counts"]["examples"], digest=manifest["digest"],
                            window=window)
    done.put(result.as_dict())
    figure("window", name)
    figure("examples", result.examples)
    return result


MATERIALIZED_RECORD = "materialized.json"


@dataclass(kw_only=True)
class FeastResult(StageResult):
    repo: str
    feature_views: list[str]


def feast_materialize(data: str, repo_dir: str, end: str, ctx: RunContext, data_digest: str = "") -> FeastResult:
    """Export the dataset's attribute and recent-behaviour sources into a copy of the
    Feast repo (the store configuration of ``$GEM_FEAST_ENV``), apply it, and
    materialize the online store up to ``end``. A rerun with the same data (digest),
    end, store configuration and code reuses the materialized repo."""
    from gem.features.feast_repo import feast_env

    env = feast_env()  # GEM_FEAST_ENV: cluster tasks get the shared stores (feature_repo/feature_store.cluster.yaml)
    dataset = DatasetHandle.open(data)
    reuse = Reuse(Path(repo_dir) / MATERIALIZED_RECORD, {"data": data_digest or dataset.digest, "end": end,
                                                          "env": env})
    if (done := reuse.get()) and (Path(repo_dir) / "feature_store.yaml").is_file():
        figure("feature views", len(done["feature_views"]))
        return FeastResult(**done)
    import mlflow

    from gem.data.contract import parse_utc
    from gem.features.feast_repo import apply, copy_repo, materialize, resolve_repo
    from gem.features.feast_sources import export

    with tracked(ctx, "feast"):
        repo = copy_repo(None, Path(repo_dir), env=env)
        mlflow.log_params({"feast_env": env, "materialized_until": end})
        log_dataset_input(dataset.root, reuse.key["data"], "source")
        export(dataset, repo, counters_at=parse_utc(end))
        apply(repo, definitions_repo=resolve_repo(None))
        store = materialize(repo, end=parse_utc(end))
        views = sorted(v.name for v in store.list_feature_views())
        mlflow.log_param("feature_views", ",".join(views))  # the tag and the param say the same
        mlflow.set_tag(tracking.TAG_FEATURE_VIEWS, ",".join(views))
    figure("feature views", len(views))
    return FeastResult(**reuse.put(FeastResult(repo=str(repo), feature_views=views).as_dict()))


def features_lineage(features: str) -> tuple[str, str]:
    """(window tag, lineage digest) of a finished features build."""
    return _lineage(json.loads((Path(features) / "manifest.json").read_text()))


def _lineage(manifest: dict) -> tuple[str, str]:
    window = manifest.get("window", {})
    return window_tag(window.get("start"), window.get("end")), lineage_digest(manifest.get("digest", ""))


def log_dataset_input(data: str | Path, digest: str, context: str) -> None:
    """The contract dataset a run read (events, users, items) as an MLflow dataset input
    of the active run: ``digest``, its content digest as the caller already has it (a
    second walk would hash every file again), and its number of events."""
    import pyarrow.parquet as pq

    from gem.data.contract import EVENTS_SCHEMA, event_files

    handle = DatasetHandle.open(data)
    events = sum(pq.ParquetFile(f).metadata.num_rows for f in event_files(handle.root))  # footers only
    columns = {f.name: _MLFLOW_TYPES.get(str(f.type).split("[")[0], "string") for f in EVENTS_SCHEMA}
    _log_input(handle.root, f"data/{handle.manifest.name}", lineage_digest(digest),
               {"mlflow.data.context": context, "num_events": str(events)},
               profile={"num_events": events, "window": dataset_window_tag(handle.root)}, columns=columns)


# arrow types of the contract's events as MLflow column types (the dataset drawer's schema)
_MLFLOW_TYPES = {"int64": "long", "int8": "integer", "bool": "boolean", "string": "string", "timestamp": "datetime"}


def log_features_input(features: str, context: str, run_id: str | None = None) -> None:
    """The features window as an MLflow dataset input of a run (default: the active one):
    its digest is the ``gem.data_digest`` tag's, its source the folder."""
    manifest = json.loads((Path(features) / "manifest.json").read_text())
    window, digest = _lineage(manifest)
    tags = {"mlflow.data.context": context, tracking.TAG_DATA_WINDOW: window}
    examples = manifest.get("counts", {}).get("examples")
    if examples is not None:
        tags["num_examples"] = str(examples)  # as the trainer's dataset inputs say it
    profile = {"num_examples": examples, "window": window, "shards": manifest.get("counts", {}).get("shards")}
    _log_input(Path(features).resolve(), f"features/{Path(features).name}", digest, tags, run_id,
               profile={k: v for k, v in profile.items() if v is not None},
               columns=tracking.features_columns(manifest.get("spec", {})))


def _log_input(folder: Path, name: str, digest: str, tags: dict[str, str], run_id: str | None = None, *,
               profile: dict | None = None, columns: dict[str, str] | None = None) -> None:
    import mlflow
    from mlflow.entities import DatasetInput, InputTag

    dataset = tracking.dataset_entity(Path(folder).resolve().as_uri(), name, digest, profile=profile, columns=columns)
    entity = DatasetInput(dataset, [InputTag(k, v) for k, v in tags.items()])
    mlflow.MlflowClient().log_inputs(run_id or mlflow.active_run().info.run_id, datasets=[entity])
