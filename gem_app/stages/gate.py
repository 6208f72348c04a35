"""gate (per model under test) and promote (once per run), for the teacher and the
students alike.

``gate_teacher`` / ``gate``: the challenger and the champion are scored on the same
holdout and judged (gem_app/promotion.py: floors, then the comparisons); the decision
(promote / keep / not enough evidence) and its one-line reason are recorded on one
gate run per model, named ``gate-<model>``: the reason as its description, the gate
settings as params, the figures under the same metric names for every surface, the
judged model version as its model input and the holdout as its dataset. Nothing in the
registry moves here.

``promote``: the run's commit (``promotion.commit``): every decision of the run at
once, after every step it depends on has succeeded; the words go on each model version.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from gem import registry, tracking
from gem.utils.evidence import computed
from gem.utils.progress import figure
from gem_app.promotion import (
    DECISION_TAG,
    GateConfig,
    GateDecision,
    Holdout,
    commit,
    decide,
    decide_paired,
    decision_from_dict,
    holdout_figures,
    shown_outcome,
)
from gem_app.stages.context import RunContext, StageResult, fault_point, log_model_input, tracked, without_nulls
from gem_app.stages.late_data import COMMIT_DIR

TAG_MODEL = "gem.model"
TAG_MODEL_VERSION = "gem.model_version"


EVIDENCE = ("examples", "positives", "negatives")


def gate_metric_name(key: str) -> str:
    """A gate figure's metric name, the same for every surface and model: ``holdout/
    positives``, ``challenger/ne``, ``no_teacher/auc``, ``vs_no_teacher/auc_lift_lo``..."""
    for who in ("no_teacher", "champion"):
        if key.startswith(f"vs_{who}_"):
            return f"vs_{who}/{key[len(who) + 4:]}"
        if key.startswith(f"{who}_"):
            return f"{who}/{key[len(who) + 1:]}"
    if key in EVIDENCE:
        return f"holdout/{key}"
    return f"challenger/{'invalid_predictions' if key == 'invalid' else key}"


def _log_gate_run(decision: GateDecision, cfg: GateConfig, eval_features: str, model_uri: str,
                  champion_uri: str | None, plot: dict[str, np.ndarray] | None, labels: np.ndarray | None) -> None:
    """The active gate run's record of the decision (see the module docstring)."""
    import mlflow

    from gem_app.stages.features import log_features_input
    from gem_app.stages.plots import holdout_figure

    mlflow.log_params({**cfg.params(), "model": decision.model_name, "model_version": decision.challenger_version,
                       "champion_version": decision.champion_version or "none",
                       "teacher_version": decision.teacher_version or "none"})
    mlflow.set_tags({DECISION_TAG: decision.outcome, "mlflow.note.content": f"{decision.outcome}: {decision.reason}",
                     "gem.model_uri": model_uri})
    metrics = {"decision/promote": float(decision.promote)}
    for verdict in decision.surfaces:  # one per model in this pipeline: the same names on every gate run
        metrics.update({gate_metric_name(k): float(v) for k, v in verdict.challenger.items()})
        metrics.update({f"champion/{k}": float(v) for k, v in (verdict.champion or {}).items()
                        if k in ("auc", "ne", "calibration")})
    mlflow.log_metrics(computed(metrics))  # an "n/a" AUC is left out
    mlflow.log_dict(decision.to_dict(), "gate_decision.json")
    log_features_input(eval_features, "evaluation")
    for uri in (model_uri, champion_uri):
        if uri:
            log_model_input(uri)
    if plot and labels is not None:
        mlflow.log_figure(holdout_figure(labels, plot, decision.model_name), "plots/holdout_roc_calibration.png")


# -- the teacher -------------------------------------------------------------------------------
def teacher_predictions(model_uri: str, eval_features: str, kept: str = "") -> tuple[np.ndarray, np.ndarray]:
    """(click labels, click probabilities) of a registered teacher on every example of
    a holdout window (a window of other vocabularies is refused). ``kept``: the predictions
    its training run kept (gem.training.eval_predictions), read instead of scoring when
    they are of this version's weights (the digest its files are checked against on every
    load) on this very window (its content digest); otherwise it is scored."""
    import mlflow

    if kept:  # before torch loads: the digests need none
        from gem.model.store import resolve, verify
        from gem.training.eval_predictions import read_kept

        folder, _, _ = resolve(model_uri, mlflow.get_tracking_uri())
        found = read_kept(kept, model_digest=verify(folder), features_dir=eval_features, task="click")
        if found is not None:
            return found
    from gem.knowledge.teacher import load_teacher
    from gem.training.pyfunc import predict_window

    teacher = load_teacher(model_uri, mlflow.get_tracking_uri())
    scored = predict_window(teacher.model, teacher.spec, eval_features, name=f"the teacher {model_uri}")
    task = list(scored["spec"].tasks).index("click")
    return scored["labels"][:, task].astype(np.float64), scored["probs"][:, task].astype(np.float64)


def gate_teacher(version: str, eval_features: str, ctx: RunContext, cfg: GateConfig | None = None,
                 kept: str = "") -> dict:
    """The new teacher's decision: the floors, then the champion's figures on the same
    holdout (or ``min_auc`` with no champion). Staged: ``promote`` applies it. ``kept``:
    the training run's holdout predictions (``teacher_predictions``)."""
    cfg = (cfg or GateConfig()).validate()
    ctx.configure()
    name = registry.TEACHER_MODEL
    uri = registry.model_uri(name, version)
    labels, probs = teacher_predictions(uri, eval_features, kept)
    plot = {f"challenger v{version}": probs}
    current = registry.champion_version(name)
    champion_uri, champion = None, None
    if current and current != str(version):
        champion_uri = registry.model_uri(name, current)
        _, champion_probs = teacher_predictions(champion_uri, eval_features)
        champion = {"all": holdout_figures(labels, champion_probs)}
        plot[f"champion v{current}"] = champion_probs
    with tracked(ctx, f"gate-{name}", tags={TAG_MODEL: name, TAG_MODEL_VERSION: str(version)}) as run:
        decision = decide(name, str(version), {"all": holdout_figures(labels, probs)}, champion, cfg)
        decision = replace(decision, gate_run_id=run.info.run_id)
        _log_gate_run(decision, cfg, eval_features, uri, champion_uri, plot, labels)
    figure("decision", shown_outcome(decision.outcome, decision.offered))
    return without_nulls(decision.to_dict())


def champion_teacher(workspace: str) -> dict:
    """The champion teacher's URI and the features directory whose vocabularies its
    tables use (continued pretraining must build new windows with the same ids); the
    version's tag names the folder relative to ``workspace`` (gem.utils.paths)."""
    from mlflow import MlflowClient

    from gem.utils.paths import located

    mv = MlflowClient().get_model_version_by_alias(registry.TEACHER_MODEL, registry.CHAMPION)
    tag = mv.tags.get(registry.FEATURES_DIR_TAG, "")
    return {"uri": registry.model_uri(registry.TEACHER_MODEL, mv.version),
            "features_dir": str(located(tag, workspace)) if tag else ""}


# -- students ----------------------------------------------------------------------------------
def holdout_predictions(model_uris: dict[str, str], surface: str, eval_features: str, feast_repo: str,
                        preset: str = "pipeline", unavailable: dict[str, str] | None = None, workspace: str = ""):
    """The surface's holdout rows and each registered model's click probabilities on them
    (same rows, same order): ``(part, {who: probs})``, scored as the served pyfunc model
    scores (students.pyfunc.score_window: each model reads the window with its own
    feature settings; teacher embeddings joined at the preset's knowledge cadence when
    it reads them, from a store of its own teacher's knowledge only: students/lineage.py).

    The run's store holds this run's teacher's knowledge. The champion (``who`` =
    "champion") may have learned from an earlier teacher's: it is scored with the store
    it was trained with when that still holds its knowledge (what serving it would read);
    when neither does, it cannot be scored fairly here, nor served from this store: with
    ``unavailable`` (a dict) it is left out and the reason recorded there, else refused
    (KnowledgeMismatch). Any other model reading another teacher's knowledge is refused.
    ``workspace``: what the recorded store's path is relative to (gem.utils.paths)."""
    from gem.utils.paths import located
    from gem_app.stages.distill import GATE_TASK, distill_config
    from students.lineage import KnowledgeMismatch, knowledge_problem
    from students.pyfunc import score_window
    from students.store import load_student

    refresh_every = distill_config(preset, surface).knowledge.refresh_every
    part, probs = None, {}
    for who, uri in model_uris.items():
        model, name, repo = load_student(uri), f"{who} {uri}", feast_repo
        if (why := knowledge_problem(model, feast_repo, name=name)) and who == "champion":
            recorded = model.knowledge.get("feast_repo", "")
            own = str(located(recorded, workspace or None)) if recorded else ""
            if own and Path(own).is_dir() and not knowledge_problem(model, own, name=name):
                repo = own  # an earlier run's store, still holding its teacher's knowledge
            elif unavailable is not None:
                unavailable[who] = why
                continue
            else:
                raise KnowledgeMismatch(why)
        rows, scored = score_window(model, eval_features, surface=surface, feast_repo=repo,
                                    refresh_every=refresh_every, name=name)
        if part is not None and not (rows.example_id == part.example_id).all():
            raise RuntimeError(f"{uri} scored other rows of {eval_features} than {model_uris}; cannot pair them")
        part = rows if part is None else part
        probs[who] = scored[:, list(rows.tasks).index(GATE_TASK)]
    return part, probs


def recorded_holdout(model_name: str, version: str, who: str, part, eval_features: str):
    """The probabilities a distill run logged for an unregistered reference (``who``) on
    this holdout, aligned to ``part``'s rows; None when that run logged none, or logged
    them for another holdout (digest) or other rows."""
    import tempfile

    import mlflow
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


@dataclass(kw_only=True)
class GateResult(StageResult):
    decision: dict
    roc: dict = field(default_factory=dict)  # the challenger's ROC points on the surface's holdout (click)


def gate(surface: str, challenger_version: str, eval_features: str, feast_repo: str, ctx: RunContext,
         cfg: GateConfig | None = None, preset: str = "pipeline", teacher_gate: dict | None = None) -> GateResult:
    """The paired gate (gem_app/promotion.py ``decide_paired``): on the surface's holdout,
    the floors, then the challenger must beat the no-teacher reference its distill run
    trained on the same rows, and the champion when there is one, each by a
    paired-bootstrap margin over users (ties do not pass; the first champion too); its
    teacher must be the champion or promoted by this run (``teacher_gate``, the run's
    teacher decision). The decision is staged, not applied."""
    from mlflow import MlflowClient

    from gem_app.stages.distill import GATE_TASK
    from gem_app.stages.plots import roc_points

    cfg = (cfg or GateConfig()).validate()
    ctx.configure()
    name = registry.student_model(surface)
    uri = registry.model_uri(name, challenger_version)
    teacher_version = MlflowClient().get_model_version(name, challenger_version).tags.get("teacher_version", "")
    staged_teacher = decision_from_dict(teacher_gate) if teacher_gate else None
    with tracked(ctx, f"gate-{name}", tags={tracking.TAG_SURFACE: surface, TAG_MODEL: name,
                                            TAG_MODEL_VERSION: str(challenger_version)}) as run:
        uris = {"challenger": uri}
        current = registry.champion_version(name)
        if current and current != str(challenger_version):
            uris["champion"] = registry.model_uri(name, current)
        unscored: dict[str, str] = {}  # the champion, when no store holds its teacher's knowledge
        part, probs = holdout_predictions(uris, surface, eval_features, feast_repo, preset, unavailable=unscored,
                                          workspace=ctx.tracking_root)
        task = list(part.tasks).index(GATE_TASK)
        labels = part.labels[:, task].numpy().astype("float64")
        no_teacher = recorded_holdout(name, challenger_version, "no_teacher", part, eval_features)
        holdout = Holdout(labels=labels, users=part.user_raw.numpy(), challenger=probs["challenger"],
                          no_teacher=no_teacher, champion=probs.get("champion"))
        decision = decide_paired(name, challenger_version, {surface: holdout}, cfg, teacher_version=teacher_version,
                                 staged_teacher=staged_teacher, champion_unavailable=unscored.get("champion", ""))
        decision = replace(decision, gate_run_id=run.info.run_id)
        plot = {"challenger": probs["challenger"], **({"no-teacher": no_teacher} if no_teacher is not None else {}),
                **({"champion": probs["champion"]} if "champion" in probs else {})}
        _log_gate_run(decision, cfg, eval_features, uri, uris.get("champion"), plot, labels)
    fault_point(f"gate-{name}:decided")
    figure("model", name)
    figure("decision", shown_outcome(decision.outcome, decision.offered))
    return GateResult(decision=without_nulls(decision.to_dict()), roc=roc_points(labels, probs["challenger"]))


def skipped_decision(surface: str, reason: str) -> dict:
    """The decision of a surface the distill plan trained no student for: not enough
    evidence, with the plan's reason; nothing for the commit to move."""
    from gem_app.promotion import NOT_ENOUGH_EVIDENCE

    return without_nulls(GateDecision(model_name=registry.student_model(surface), challenger_version="",
                                      champion_version=None, outcome=NOT_ENOUGH_EVIDENCE, reason=reason).to_dict())


# -- the run's commit --------------------------------------------------------------------------
@dataclass(kw_only=True)
class PromoteResult(StageResult):
    teacher: dict  # the teacher's decision as applied ({} when it was not gated)
    surfaces: list[dict]  # per surface: its distill record, the decision as applied, "decision", "why", "promoted"
    summary: str


def promote(teacher_gate: dict, gated: list[dict], ctx: RunContext, *, data: str = "",
            data_days: str = "") -> PromoteResult:
    """Apply every decision of the run at once (promotion.commit): the champions move
    only now, after every step of the run has succeeded. Then ``data``'s days as the run
    read them (``data_days``: ingest's file) are recorded (gem_app.stages.late_data: the next
    run's late-data check)."""
    import mlflow

    from gem_app.stages.late_data import read_days, record_committed_days

    ctx.configure()
    decisions = ([decision_from_dict(teacher_gate)] if teacher_gate else []) + [
        decision_from_dict(g["decision"]) for g in gated if g["decision"].get("challenger_version")]
    final = commit(decisions, Path(ctx.tracking_root) / COMMIT_DIR, pipeline_run_id=ctx.pipeline_run_id,
                   fault=lambda where: fault_point(f"promote:{where}"))
    if data and data_days:
        record_committed_days(ctx.tracking_root, data, read_days(data_days))
    applied = {d.model_name: d for d in final}
    lines = [d.summary() for d in final]
    if ctx.parent_run_id:
        client = mlflow.MlflowClient()
        client.log_dict(ctx.parent_run_id, [without_nulls(d.to_dict()) for d in final], "promotion.json")
        client.set_tag(ctx.parent_run_id, "gem.promotion",
                       "; ".join(f"{d.model_name} v{d.challenger_version}: {d.outcome}" for d in final)[:5000])
    rows = []
    for g in sorted(gated, key=lambda g: g["distilled"]["surface"]):
        # a surface without a student keeps the plan's decision: nothing was committed for it
        d = applied.get(g["decision"]["model_name"]) if g["decision"].get("challenger_version") else \
            decision_from_dict(g["decision"])
        rows.append({**g["distilled"], "decision": d.outcome, "why": d.reason, "promoted": d.promote,
                     "champion_before": d.champion_version or "none", "gate": without_nulls(d.to_dict())})
    teacher = without_nulls(applied[decisions[0].model_name].to_dict()) if teacher_gate else {}
    for d in final:
        figure(d.model_name, shown_outcome(d.outcome, d.offered))
    return PromoteResult(teacher=teacher, surfaces=rows, summary="\n".join(lines))
