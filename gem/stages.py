"""One package function per pipeline stage.

The kfp components in components/ are thin typed wrappers over these functions, and
the refresh cycle calls them directly. Each stage takes plain paths and parameters plus
a ``RunContext`` (which pipeline run it belongs to, where MLflow records it), runs one
package function, records an MLflow run nested under the pipeline's parent run with
the lineage tags, and returns a small JSON-able dict.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import os
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Iterator

from gem import tracking
from gem.data.contract import Manifest

log = logging.getLogger(__name__)

TEACHER_MODEL = "gem_teacher"
FEATURES_DIR_TAG = "gem.features_dir"
EXPERIMENT = "gem-pipeline"


@dataclass(kw_only=True)
class RunContext:
    """Which pipeline run a stage belongs to and where MLflow lives (JSON-serialised
    into every component as one string parameter)."""

    pipeline_run_id: str
    tracking_root: str  # local MLflow store root (ignored when MLFLOW_TRACKING_URI is set)
    parent_run_id: str = ""
    experiment: str = EXPERIMENT

    def __post_init__(self) -> None:
        if not self.tracking_root:
            raise ValueError("RunContext.tracking_root is empty; give the local MLflow store's folder")

    def dumps(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def loads(cls, text: str) -> "RunContext":
        return cls(**json.loads(text))


@dataclass(kw_only=True)
class Windows:
    """The time protocol: teacher [start, teacher_end), students [teacher_end, student_end),
    holdout [student_end, end). ISO-8601 UTC strings."""

    start: str
    teacher_end: str
    student_end: str
    end: str

    def as_dict(self) -> dict[str, str]:
        return asdict(self)


def split_windows(data: str | Path, *, student_days: int = 1, holdout_days: int = 1, teacher_days: int = 0) -> Windows:
    """Teacher gets every day but the last ``student_days + holdout_days`` (only the
    last ``teacher_days`` of those when > 0: continued pretraining on fresh days)."""
    manifest = Manifest.read(Path(data))
    days = manifest.days()
    if len(days) < student_days + holdout_days + 1:
        raise ValueError(f"{data}: {len(days)} day(s) in the window; the protocol needs at least "
                         f"{student_days + holdout_days + 1} (teacher + {student_days} student + {holdout_days} holdout)")
    iso = lambda d: dt.datetime.combine(d, dt.time(), tzinfo=dt.timezone.utc).isoformat()  # noqa: E731
    teacher_end = days[-(student_days + holdout_days)]
    student_end = days[-holdout_days]
    start = manifest.start.isoformat()
    if teacher_days > 0:
        first = days.index(teacher_end) - teacher_days
        if first < 0:
            raise ValueError(f"{data}: teacher_days={teacher_days} reaches before the dataset's first day")
        start = iso(days[first])
    return Windows(start=start, teacher_end=iso(teacher_end), student_end=iso(student_end), end=manifest.end.isoformat())


def without_nulls(value):
    """kfp parameters can't carry None: nested None becomes "" (and back via ``or None``)."""
    if isinstance(value, dict):
        return {k: without_nulls(v) for k, v in value.items()}
    if isinstance(value, list):
        return [without_nulls(v) for v in value]
    return "" if value is None else value


# ---------------------------------------------------------------- tracking plumbing


def start_pipeline(ctx: RunContext, *, params: dict | None = None, tags: dict | None = None) -> RunContext:
    """Create the pipeline's parent run (left open; ``finish_pipeline`` closes it)."""
    import mlflow

    tracking.configure(ctx.tracking_root, experiment=ctx.experiment)
    client = mlflow.MlflowClient()
    experiment = client.get_experiment_by_name(ctx.experiment)
    run = client.create_run(experiment.experiment_id, run_name=f"pipeline-{ctx.pipeline_run_id}",
                            tags={tracking.TAG_PIPELINE_RUN: ctx.pipeline_run_id, **(tags or {})})
    for key, value in (params or {}).items():
        client.log_param(run.info.run_id, key, str(value)[:500])
    return RunContext(pipeline_run_id=ctx.pipeline_run_id, tracking_root=ctx.tracking_root,
                      parent_run_id=run.info.run_id, experiment=ctx.experiment)


@contextmanager
def stage(ctx: RunContext, name: str, *, tags: dict | None = None) -> Iterator[object]:
    """An MLflow run for one stage, nested under the pipeline run, with lineage tags."""
    tracking.configure(ctx.tracking_root, experiment=ctx.experiment)
    all_tags = {tracking.TAG_PIPELINE_RUN: ctx.pipeline_run_id, **(tags or {})}
    with tracking.stage_run(name, tags=all_tags, parent_run_id=ctx.parent_run_id or None) as run:
        yield run


def finish_pipeline(ctx: RunContext, summary: dict, status: str = "FINISHED") -> None:
    import mlflow

    tracking.configure(ctx.tracking_root, experiment=ctx.experiment)
    client = mlflow.MlflowClient()
    client.log_dict(ctx.parent_run_id, summary, "pipeline_summary.json")
    client.set_terminated(ctx.parent_run_id, status=status)


# ---------------------------------------------------------------- data


def simulate_stage(out: str, preset: str, ctx: RunContext, overrides: list[str] | None = None) -> dict:
    from gem.config import flatten, load_config
    from gem.data.simulate import SimulatorConfig, simulate

    cfg = load_config(SimulatorConfig, section="simulator", preset=preset, overrides=overrides)
    import mlflow

    with stage(ctx, "simulate"):
        mlflow.log_params({f"sim.{k}": v for k, v in flatten(cfg).items()})
        manifest = simulate(cfg, out)
        mlflow.log_metric("events", manifest.extra["events"])
    return {"events": manifest.extra["events"], "window": [manifest.window_start, manifest.window_end]}


def validate_stage(data: str, out: str, report_dir: str, ctx: RunContext, max_quarantine_fraction: float = 0.0) -> dict:
    """Validate ``data`` and write the processed rows as a clean dataset to ``out``."""
    import mlflow

    from gem.data.validate import validate_dataset

    with stage(ctx, "validate", tags={tracking.TAG_DATA_WINDOW: _window_tag(data)}):
        report = validate_dataset(data, report_dir=report_dir, out=out)
        mlflow.log_metrics({f"rows.{k}.{t}": v for k, counts in (("input", report.input_rows),
                            ("processed", report.processed_rows), ("quarantined", report.quarantined_rows))
                            for t, v in counts.items()})
        mlflow.log_metrics({f"quarantine.{r}": n for r, n in report.reasons.items()})
        mlflow.log_artifact(report.report_path)
    if report.quarantined_fraction > max_quarantine_fraction:
        raise ValueError(f"{data}: {report.quarantined_fraction:.4%} of rows quarantined, above the allowed "
                         f"{max_quarantine_fraction:.4%}; see {report.quarantine_path}")
    return {"summary": report.summary(), "quarantined_fraction": report.quarantined_fraction,
            "events": report.processed_rows.get("events", 0)}


def ingest_stage(data: str, workspace: str, sim_preset: str, ctx: RunContext, *, student_days: int = 1,
                 holdout_days: int = 1, teacher_days: int = 0) -> dict:
    """Simulate a dataset when ``data`` is empty, validate it into ``workspace/clean`` and
    split the protocol's time windows. A rerun with the same inputs reuses the result."""
    ws = Path(workspace)
    key = {"data": data, "sim_preset": sim_preset, "student_days": student_days, "holdout_days": holdout_days,
           "teacher_days": teacher_days}
    cached = _completed(ws / "ingest.json", key)
    if cached:
        return cached
    if not data:
        data = str(ws / "raw")
        simulate_stage(data, sim_preset, ctx)
    validated = validate_stage(data, str(ws / "clean"), str(ws / "validation"), ctx)
    windows = split_windows(ws / "clean", student_days=student_days, holdout_days=holdout_days,
                            teacher_days=teacher_days)
    # the features directories of the three windows (paths are decided here: kfp.local
    # does not resolve f-strings of pipeline parameters passed into sub-pipelines)
    features = {name: str(ws / "features" / name) for name in ("teacher", "student", "holdout")}
    result = {"clean": str(ws / "clean"), "windows": windows.as_dict(), "features": features, **validated}
    return _complete(ws / "ingest.json", key, result)


def _completed(path: Path, key: dict) -> dict | None:
    """The recorded result of a finished stage run with the same inputs, if any."""
    if path.is_file():
        record = json.loads(path.read_text())
        if record.get("key") == key:
            log.info("stage output %s is complete; reusing it", path)
            return record["result"]
    return None


def _complete(path: Path, key: dict, result: dict) -> dict:
    from gem.data.io import write_json_atomic

    write_json_atomic({"key": key, "result": result}, path)
    return result


def _window_tag(data: str | Path) -> str:
    manifest = Manifest.read(Path(data))
    return f"{manifest.window_start}..{manifest.window_end}"


# ---------------------------------------------------------------- features


def features_plan_stage(data: str, out: str, start: str, end: str, preset: str, vocab_from: str = "",
                        overrides: list[str] | None = None) -> list[str]:
    """Stage the window's inputs and return the shard names to fan out over."""
    from gem.features.build import prepare_build
    from gem.features.shards import list_shards

    finished = _finished_features(out, start, end)
    if finished:
        return [shard["name"] for shard in finished["shards"]]
    cfg = _features_cfg(preset, vocab_from, overrides)
    plan = prepare_build(data, out, cfg, window_start=start, window_end=end)
    return [key.name for key in list_shards(plan)]


def _finished_features(out: str, start: str | None = None, end: str | None = None) -> dict | None:
    """The manifest of a finished build of the same window (written last by finalize),
    in the current layout (an older format is rebuilt)."""
    from gem.data.contract import parse_utc
    from gem.features.segments import FORMAT

    path = Path(out) / "manifest.json"
    if not path.is_file():
        return None
    manifest = json.loads(path.read_text())
    if manifest.get("format") != FORMAT:
        return None
    window = manifest.get("window", {})
    if start and end and (parse_utc(window["start"]), parse_utc(window["end"])) != (parse_utc(start), parse_utc(end)):
        return None
    return manifest


def features_shard_stage(out: str, shard: str) -> dict:
    from gem.features.plan import BuildPlan, ShardKey
    from gem.features.segments import FORMAT
    from gem.features.shards import build_shard, read_stats

    if _finished_features(out):
        return {"shard": shard, "reused": True}
    plan = BuildPlan.read(Path(out))
    if (plan.shards_dir / shard / "stats.json").is_file():  # shards are renamed into place whole
        stats = read_stats(plan.shards_dir / shard)
        if stats.get("format") == FORMAT:  # not a shard of an older layout
            return stats
    return build_shard(plan, ShardKey.parse(shard))


def features_finalize_stage(out: str, preset: str, ctx: RunContext, name: str, vocab_from: str = "",
                            overrides: list[str] | None = None) -> dict:
    import mlflow

    from gem.features.build import finalize_build
    from gem.features.plan import BuildPlan

    finished = _finished_features(out)
    if finished:
        window = finished["window"]
        return {"examples": finished["counts"]["examples"], "digest": finished["digest"],
                "window": f"{window['start']}..{window['end']}"}
    cfg = _features_cfg(preset, vocab_from, overrides)
    plan = BuildPlan.read(Path(out))
    window = f"{plan.window_start}..{plan.window_end}"
    with stage(ctx, f"features-{name}", tags={tracking.TAG_DATA_WINDOW: window}):
        manifest = finalize_build(plan, cfg)
        mlflow.set_tag(tracking.TAG_DATA_DIGEST, manifest["digest"])
        mlflow.log_metrics({"examples": manifest["counts"]["examples"],
                            "bytes_per_example": manifest["bytes"]["per_example"]})
    return {"examples": manifest["counts"]["examples"], "digest": manifest["digest"], "window": window}


def _features_cfg(preset: str, vocab_from: str, overrides: list[str] | None):
    from gem.config import load_config
    from gem.features.config import FeaturesConfig

    extra = [f"vocab_from={vocab_from}"] if vocab_from else []
    return load_config(FeaturesConfig, section="features", preset=preset, overrides=[*extra, *(overrides or [])])


def feast_stage(data: str, repo_dir: str, end: str, ctx: RunContext) -> dict:
    """Export the dataset's attribute and recent-behaviour sources into a copy of the
    Feast repo, apply it, and materialize the online store up to ``end``."""
    import mlflow

    from gem.data.contract import parse_utc
    from gem.features.feast_repo import apply, copy_repo, materialize, resolve_repo
    from gem.features.feast_sources import export

    with stage(ctx, "feast", tags={tracking.TAG_FEATURE_VIEWS: "user_attributes,item_attributes,recent_behavior"}):
        repo = copy_repo(None, Path(repo_dir))
        export(data, repo)
        apply(repo, definitions_repo=resolve_repo(None))
        store = materialize(repo, end=parse_utc(end))
        views = sorted(v.name for v in store.list_feature_views())
        mlflow.log_param("feature_views", ",".join(views))
    return {"repo": str(repo), "feature_views": views}


# ---------------------------------------------------------------- pretraining


def pretrain_stage(features: str, eval_features: str, out: str, preset: str, ctx: RunContext,
                   overrides: list[str] | None = None, init_from: str = "", launcher: str = "local") -> dict:
    """Train GEM on ``features`` (starting from the weights of ``init_from`` when given);
    register the model as ``gem_teacher`` tagged with its data window and digest.

    Killed mid-way and rerun, it resumes the same MLflow run from the last checkpoint;
    rerun after it finished, it returns the recorded result."""
    import mlflow

    from gem.launch import Launcher, run_torchrun, submit_trainjob, train_args, trainjob_manifest
    from gem.training.config import load_train_config
    from gem.training.trainer import train

    out_dir = Path(out)
    window, digest = _features_lineage(features)
    key = {"features": digest, "eval": _features_lineage(eval_features)[1] if eval_features else "",
           "preset": preset, "overrides": overrides or [], "init_from": init_from, "launcher": launcher}
    cached = _completed(out_dir / "pretrain.json", key)
    if cached:
        return cached
    tracking.configure(ctx.tracking_root, experiment=ctx.experiment)
    extra = [f"tracking_uri={mlflow.get_tracking_uri()}", f"experiment={ctx.experiment}", "run_name=pretrain"]
    cfg, model_cfg = load_train_config(preset, [*extra, *(overrides or [])])
    started = _completed(out_dir / "pretrain_run.json", key)
    if started:
        run_id = started["run_id"]
    else:
        client = mlflow.MlflowClient()
        experiment = client.get_experiment_by_name(ctx.experiment)
        run_id = client.create_run(experiment.experiment_id, run_name="pretrain", tags={
            "mlflow.parentRunId": ctx.parent_run_id, tracking.TAG_PIPELINE_RUN: ctx.pipeline_run_id,
            tracking.TAG_STAGE: "pretrain", tracking.TAG_DATA_WINDOW: window, tracking.TAG_DATA_DIGEST: digest,
            **({"gem.init_from": init_from} if init_from else {})}).info.run_id
        out_dir.mkdir(parents=True, exist_ok=True)
        _complete(out_dir / "pretrain_run.json", key, {"run_id": run_id})
    how = Launcher.parse(launcher)
    if how.kind == "local":
        os.environ["MLFLOW_RUN_ID"] = run_id
        try:
            result = train(features, out, cfg, model_cfg, eval_features=eval_features or None, resume=True,
                           init_from=init_from or None)
        finally:
            os.environ.pop("MLFLOW_RUN_ID", None)
        eval_metrics, steps = {k: float(v) for k, v in result.eval_metrics.items()}, result.steps
    else:
        args = train_args(features, eval_features, out, preset, [*extra, *(overrides or [])], init_from)
        env = {"MLFLOW_RUN_ID": run_id, "MLFLOW_TRACKING_URI": mlflow.get_tracking_uri()}
        if how.kind == "torchrun":
            run_torchrun(how.nproc, args, env)
        else:
            manifest = trainjob_manifest(f"gem-pretrain-{run_id[:12]}", os.environ.get("GEM_IMAGE", "gem:latest"),
                                         args, nodes=how.nodes, gpus_per_node=how.gpus, env=env)
            submit_trainjob(manifest)
        logged = mlflow.MlflowClient().get_run(run_id).data.metrics
        eval_metrics = {k.replace(".", "/"): float(v) for k, v in logged.items() if k.startswith("eval.")}
        history = mlflow.MlflowClient().get_metric_history(run_id, "train.loss")
        steps = history[-1].step if history else 0
    version = _registered_version(TEACHER_MODEL, run_id) or mlflow.register_model(
        f"runs:/{run_id}/model", TEACHER_MODEL,
        tags={tracking.TAG_DATA_WINDOW: window, tracking.TAG_DATA_DIGEST: digest,
              tracking.TAG_PIPELINE_RUN: ctx.pipeline_run_id, FEATURES_DIR_TAG: str(Path(features).resolve())})
    decision = _gate_teacher(str(version.version), eval_features, ctx) if eval_features else None
    return _complete(out_dir / "pretrain.json", key, without_nulls({
        "run_id": run_id, "model_version": str(version.version), "model_uri": f"models:/{TEACHER_MODEL}/{version.version}",
        "metrics": eval_metrics, "steps": steps,
        "promoted": bool(decision and decision.promote)}))


def _registered_version(name: str, run_id: str):
    """The version already registered from this run (a rerun after a kill between
    registration and the completion record must not register it twice)."""
    from mlflow import MlflowClient

    versions = MlflowClient().search_model_versions(f"name='{name}' and run_id='{run_id}'")
    return versions[0] if versions else None


def _teacher_holdout(model_uri: str, eval_features: str) -> dict[str, dict[str, float]]:
    """Click AUC / NE over all surfaces of a registered teacher on a holdout window."""
    import mlflow

    from gem.features.loader import FeatureLoader
    from gem.knowledge.teacher import load_teacher
    from gem.training.distributed import init_distributed
    from gem.training.trainer import evaluate

    teacher = load_teacher(model_uri, mlflow.get_tracking_uri())
    loader = FeatureLoader(eval_features, batch_size=1024, shuffle=False)
    metrics = evaluate(teacher.model, loader, init_distributed(), teacher.spec).compute()
    return {"all": {"auc": float(metrics["auc/all/click"]), "ne": float(metrics["ne/all/click"])}}


def _gate_teacher(version: str, eval_features: str, ctx: RunContext):
    """The new teacher becomes champion only if it beats the champion on the same holdout."""
    from gem.promotion import CHAMPION, GateConfig, apply_decision, champion_version, decide

    challenger = _teacher_holdout(f"models:/{TEACHER_MODEL}/{version}", eval_features)
    champion = (_teacher_holdout(f"models:/{TEACHER_MODEL}@{CHAMPION}", eval_features)
                if champion_version(TEACHER_MODEL) else None)
    with stage(ctx, "gate-teacher"):
        return apply_decision(decide(TEACHER_MODEL, version, challenger, champion, GateConfig(min_auc=0.5)))


def champion_teacher() -> dict:
    """The champion teacher's URI and the features directory whose vocabularies its
    tables use (continued pretraining must build new windows with the same ids)."""
    from mlflow import MlflowClient

    from gem.promotion import CHAMPION

    mv = MlflowClient().get_model_version_by_alias(TEACHER_MODEL, CHAMPION)
    return {"uri": f"models:/{TEACHER_MODEL}/{mv.version}", "features_dir": mv.tags.get(FEATURES_DIR_TAG, "")}


def _features_lineage(features: str) -> tuple[str, str]:
    manifest = json.loads((Path(features) / "manifest.json").read_text())
    window = manifest.get("window", {})
    return f"{window.get('start')}..{window.get('end')}", manifest.get("digest", "")


# ---------------------------------------------------------------- knowledge


def knowledge_stage(teacher_uri: str, features: list[str], out_root: str, feast_repo: str, ctx: RunContext,
                    preset: str = "default") -> dict:
    """Run the frozen teacher over each features window, write its knowledge under
    ``out_root/<window name>`` and register all of it in the Feast repo."""
    import mlflow

    from gem.config import load_config
    from gem.knowledge.config import KnowledgeConfig
    from gem.knowledge.feast import register_knowledge
    from gem.knowledge.generate import generate_knowledge
    from gem.knowledge.teacher import load_teacher

    cfg = load_config(KnowledgeConfig, section="knowledge", preset=preset)
    tracking.configure(ctx.tracking_root, experiment=ctx.experiment)
    teacher = load_teacher(teacher_uri, mlflow.get_tracking_uri())
    outputs, manifests = [], []
    with stage(ctx, "knowledge", tags={tracking.TAG_TEACHER_VERSION: teacher.version}):
        for features_dir in features:
            out = Path(out_root) / Path(features_dir).name
            manifest = generate_knowledge(teacher, features_dir, out, cfg)
            outputs.append(str(out))
            manifests.append(manifest)
            mlflow.log_metric(f"examples_per_s.{Path(features_dir).name}", manifest["examples_per_s"])
        register_knowledge(feast_repo, outputs)
        mlflow.set_tag(tracking.TAG_FEATURE_VIEWS, "teacher_predictions,teacher_user_embedding,teacher_item_embedding")
    return {"knowledge": outputs, "teacher_version": teacher.version,
            "examples": sum(m["counts"]["examples"] for m in manifests)}


# ---------------------------------------------------------------- summary


def summary_stage(teacher: dict, surfaces: list[dict], workspace: str, ctx: RunContext) -> dict:
    """Per surface: teacher and student AUC/NE on the holdout, the no-teacher student, the
    transfer lift and the promotion outcome. Written to the workspace and to the
    pipeline's parent run, which it closes."""
    import mlflow

    from gem.data.io import write_json_atomic

    rows = []
    for row in sorted(surfaces, key=lambda r: r["surface"]):
        s = row["surface"]
        rows.append({
            "surface": s,
            "teacher_auc": teacher["metrics"].get(f"eval/auc/{s}/click", float("nan")),
            "teacher_ne": teacher["metrics"].get(f"eval/ne/{s}/click", float("nan")),
            "student_auc": row["metrics"]["student"]["auc"], "student_ne": row["metrics"]["student"]["ne"],
            "no_teacher_auc": row["metrics"]["no_teacher"]["auc"], "no_teacher_ne": row["metrics"]["no_teacher"]["ne"],
            "lift_auc": row["lift"]["auc"], "lift_ne": row["lift"]["ne"],
            "student": f"{row['model_name']} v{row['version']}",
            "promoted": row.get("promoted", False),
        })
    header = ("| surface | teacher AUC | teacher NE | student AUC | student NE | no-teacher AUC | "
              "lift AUC | lift NE | student | promoted |")
    lines = ["# GEM pipeline run " + ctx.pipeline_run_id, "",
             f"Teacher: {teacher.get('model_uri', '')} (holdout, click task)", "", header,
             "|" + "---|" * 10]
    for r in rows:
        lines.append(f"| {r['surface']} | {r['teacher_auc']:.4f} | {r['teacher_ne']:.4f} | {r['student_auc']:.4f} | "
                     f"{r['student_ne']:.4f} | {r['no_teacher_auc']:.4f} | {r['lift_auc']:+.4f} | "
                     f"{r['lift_ne']:+.4f} | {r['student']} | {'yes' if r['promoted'] else 'no'} |")
    markdown = "\n".join(lines) + "\n"
    payload = {"pipeline_run_id": ctx.pipeline_run_id, "teacher": teacher, "surfaces": rows}
    write_json_atomic(payload, Path(workspace) / "summary.json")
    (Path(workspace) / "summary.md").write_text(markdown)
    tracking.configure(ctx.tracking_root, experiment=ctx.experiment)
    client = mlflow.MlflowClient()
    client.log_text(ctx.parent_run_id, markdown, "summary.md")
    for r in rows:
        for key in ("student_auc", "student_ne", "lift_auc", "lift_ne", "teacher_auc", "teacher_ne"):
            client.log_metric(ctx.parent_run_id, f"{r['surface']}.{key}", float(r[key]))
    finish_pipeline(ctx, payload)
    return {"markdown": markdown, "rows": rows}
