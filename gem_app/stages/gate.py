"""gate and promote, for the teacher and the students alike: the challenger and the
champion are scored on the same holdout, the decision (gem_app/promotion.py) is
recorded with its figures, and only a win moves the champion alias. A student must beat
the no-teacher reference and the champion by a paired-bootstrap margin (``gate``); the
teacher must beat the champion's AUC (``gate_teacher``)."""

from __future__ import annotations

from dataclasses import dataclass

from gem import registry, tracking
from gem.utils.progress import figure
from gem_app.promotion import GateConfig, GateDecision, apply_decision, decide, decision_from_dict
from gem_app.stages.context import RunContext, StageResult, tracked, without_nulls


def _log_decision(decision: GateDecision) -> None:
    import mlflow

    mlflow.set_tag("gate/decision", "promote" if decision.promote else "keep champion")
    mlflow.log_metric("gate/promote", float(decision.promote))
    for verdict in decision.surfaces:
        for who, figures in (("challenger", verdict.challenger), ("champion", verdict.champion or {})):
            mlflow.log_metrics({f"gate/{verdict.surface}/{who}/{k}": float(v) for k, v in figures.items()})
    mlflow.log_dict(decision.to_dict(), "gate_decision.json")


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


def gate_teacher(version: str, eval_features: str, ctx: RunContext) -> GateDecision:
    """The new teacher becomes champion only if it beats the champion on the same holdout."""
    name = registry.TEACHER_MODEL
    challenger = _teacher_holdout(registry.model_uri(name, version), eval_features)
    champion = (_teacher_holdout(registry.model_uri(name, alias=registry.CHAMPION), eval_features)
                if registry.champion_version(name) else None)
    with tracked(ctx, "gate-teacher"):
        decision = apply_decision(decide(name, version, challenger, champion, GateConfig(min_auc=0.5)))
        _log_decision(decision)
    return decision


def champion_teacher() -> dict:
    """The champion teacher's URI and the features directory whose vocabularies its
    tables use (continued pretraining must build new windows with the same ids)."""
    from mlflow import MlflowClient

    mv = MlflowClient().get_model_version_by_alias(registry.TEACHER_MODEL, registry.CHAMPION)
    return {"uri": registry.model_uri(registry.TEACHER_MODEL, mv.version),
            "features_dir": mv.tags.get(registry.FEATURES_DIR_TAG, "")}


def score_student(model_uri: str, surface: str, eval_features: str, feast_repo: str,
                  preset: str = "pipeline") -> dict[str, float]:
    """Click AUC / NE / calibration of a registered student on the surface's holdout."""
    from gem_app.stages.distill import distill_config, gate_metrics, student_tables
    from students.store import load_student
    from students.train import evaluate, predict

    cfg = distill_config(preset, surface)
    _, (holdout, _) = student_tables(cfg, None, eval_features, feast_repo)
    part = holdout.subset(holdout.surface == list(holdout.surfaces).index(surface))
    model = load_student(model_uri)
    metrics = evaluate(predict(model, part), part, list(holdout.surfaces), list(holdout.tasks))
    return gate_metrics({k.replace(f"/{surface}/", "/"): v for k, v in metrics.items() if f"/{surface}/" in k})


def student_roc(model_uri: str, surface: str, eval_features: str, feast_repo: str, preset: str = "pipeline",
                points: int = 200) -> dict[str, list[float]]:
    """The ROC curve (click task) of a registered student on its surface's holdout, the
    same predictions ``score_student`` scores, thinned to at most ``points`` points."""
    import numpy as np

    from gem_app.stages.distill import GATE_TASK, distill_config, student_tables
    from students.store import load_student
    from students.train import predict

    cfg = distill_config(preset, surface)
    _, (holdout, _) = student_tables(cfg, None, eval_features, feast_repo)
    part = holdout.subset(holdout.surface == list(holdout.surfaces).index(surface))
    model = load_student(model_uri)
    task = list(holdout.tasks).index(GATE_TASK)
    scores = predict(model, part)[:, task].detach().numpy().astype(np.float64)
    labels = part.labels[:, task].detach().numpy() > 0.5
    if not len(scores) or labels.all() or not labels.any():
        return {"fpr": [], "tpr": [], "thresholds": []}
    order = np.argsort(-scores, kind="stable")
    scores, labels = scores[order], labels[order]
    last = np.r_[np.flatnonzero(np.diff(scores)), len(scores) - 1]  # last index of each distinct score
    tpr = np.cumsum(labels)[last] / labels.sum()
    fpr = np.cumsum(~labels)[last] / (~labels).sum()
    pick = np.unique(np.linspace(0, len(last) - 1, min(points, len(last))).round().astype(int))
    return {"fpr": [0.0, *fpr[pick].tolist()], "tpr": [0.0, *tpr[pick].tolist()],
            "thresholds": [1.0, *scores[last][pick].tolist()]}


def holdout_predictions(model_uris: dict[str, str], surface: str, eval_features: str, feast_repo: str,
                        preset: str = "pipeline"):
    """The surface's holdout rows and each registered model's click probabilities on them
    (same rows, same order): ``(part, {who: probs})``. Teacher embeddings are joined (at
    the preset's knowledge cadence) only when a model reads them."""
    from gem_app.stages.distill import GATE_TASK, distill_config
    from students.data import attach_knowledge, load_table
    from students.store import load_student
    from students.train import predict

    cfg = distill_config(preset, surface)
    models = {who: load_student(uri) for who, uri in model_uris.items()}
    table, _ = load_table(eval_features, cfg.student)
    if any(m.teacher_emb_dim for m in models.values()):
        table = attach_knowledge(table, feast_repo, predictions=False, embeddings=True,
                                 refresh_every=cfg.knowledge.refresh_every)
    part = table.subset(table.surface == list(table.surfaces).index(surface))
    task = list(part.tasks).index(GATE_TASK)
    return part, {who: predict(m, part)[:, task].numpy().astype("float64") for who, m in models.items()}


def recorded_holdout(model_name: str, version: str, who: str, part, eval_features: str):
    """The probabilities a distill run logged for an unregistered reference (``who``) on
    this holdout, aligned to ``part``'s rows; None when that run logged none, or logged
    them for another holdout (digest) or other rows."""
    import tempfile

    import mlflow
    import numpy as np
    import pandas as pd
    from mlflow import MlflowClient
    from mlflow.exceptions import MlflowException

    from gem_app.stages.distill import HOLDOUT_ARTIFACT
    from gem_app.stages.features import features_lineage

    client = MlflowClient()
    run_id = client.get_model_version(model_name, version).run_id
    if client.get_run(run_id).data.tags.get(f"gate.holdout_digest.{who}") != features_lineage(eval_features)[1]:
        return None
    try:
        with tempfile.TemporaryDirectory() as tmp:
            path = mlflow.artifacts.download_artifacts(run_id=run_id, artifact_path=HOLDOUT_ARTIFACT.format(who=who),
                                                       dst_path=tmp)
            frame = pd.read_parquet(path).set_index("example_id")
    except (MlflowException, OSError):
        return None
    ids = part.example_id.numpy()
    if len(frame) != len(ids) or not np.isin(ids, frame.index.to_numpy()).all():
        return None
    return frame.loc[ids, "prob"].to_numpy(dtype="float64")


def gate(surface: str, challenger_version: str, eval_features: str, feast_repo: str, ctx: RunContext,
         cfg: GateConfig | None = None, preset: str = "pipeline") -> dict:
    """The paired gate (gem_app/promotion.py ``decide_paired``): on the surface's holdout,
    the challenger must beat the no-teacher reference its distill run trained on the same
    rows, and the champion when there is one, each by a paired-bootstrap margin over
    users (ties do not pass; the first champion too). The decision is returned, not applied."""
    from gem_app.promotion import Holdout, decide_paired
    from gem_app.stages.distill import GATE_TASK

    ctx.configure()
    name = registry.student_model(surface)
    with tracked(ctx, f"gate-{surface}", tags={tracking.TAG_SURFACE: surface}):
        uris = {"challenger": registry.model_uri(name, challenger_version)}
        if registry.champion_version(name):
            uris["champion"] = registry.model_uri(name, alias=registry.CHAMPION)
        part, probs = holdout_predictions(uris, surface, eval_features, feast_repo, preset)
        task = list(part.tasks).index(GATE_TASK)
        holdout = Holdout(labels=part.labels[:, task].numpy().astype("float64"), users=part.user_raw.numpy(),
                          challenger=probs["challenger"],
                          no_teacher=recorded_holdout(name, challenger_version, "no_teacher", part, eval_features),
                          champion=probs.get("champion"))
        decision = decide_paired(name, challenger_version, {surface: holdout}, cfg or GateConfig())
        _log_decision(decision)
    figure("surface", surface)
    figure("decision", "promote" if decision.promote else "reject")
    return without_nulls(decision.to_dict())


@dataclass(kw_only=True)
class PromoteResult(StageResult):
    model_name: str
    version: str
    promoted: bool
    champion_before: str | None
    summary: str


def promote(decision: dict, ctx: RunContext) -> PromoteResult:
    """Apply a gate decision: the champion alias moves only if the challenger won; the
    decision and its figures are recorded either way."""
    ctx.configure()
    parsed = decision_from_dict(decision)
    with tracked(ctx, f"promote-{parsed.model_name}"):
        apply_decision(parsed)
        _log_decision(parsed)
    figure(parsed.model_name, "promoted" if parsed.promote else "not promoted")
    return PromoteResult(model_name=parsed.model_name, version=parsed.challenger_version, promoted=parsed.promote,
                         champion_before=parsed.champion_version, summary=parsed.summary())
