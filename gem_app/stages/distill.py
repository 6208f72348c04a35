"""distill: one surface's vertical student through the configured transfer methods, the
no-teacher student on the same rows for the lift, both scored on the holdout; the
transfer student is registered as a new version of ``student_<surface>``.

Reuse: the recorded result is returned only for the same teacher version (an alias
resolved to its version), the same train/eval features (windows and content digests),
the same knowledge in the Feast repo (content digest and window) and the same resolved
config. The no-teacher reference is capacity-matched to the transfer student; its
holdout predictions are logged with the run (``holdout/no_teacher.parquet``) for the
paired gate. Every student carries its lineage (``lineage.*`` params and tags: teacher
version and window, knowledge window and cadence, train / validation / adapter-fit /
evaluation windows).
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field, replace
from pathlib import Path

from gem import registry, tracking
from gem.utils.evidence import auc_text, computed
from gem.utils.progress import figure, warning
from gem_app.stages.context import Reuse, RunContext, StageResult, fault_point, log_model_input, tracked
from gem_app.stages.features import features_lineage, log_features_input
from gem_app.stages.knowledge import KNOWLEDGE_VIEWS

log = logging.getLogger(__name__)

GATE_TASK = "click"  # the gate compares click AUC and NE on the holdout


@dataclass(kw_only=True)
class DistillResult(StageResult):
    surface: str
    model_name: str
    version: str
    teacher_version: str
    methods: list[str]
    metrics: dict[str, dict[str, float]]  # "student" / "no_teacher" -> auc, ne, calibration
    lift: dict[str, float]
    flops_per_example: float = 0.0
    history: dict[str, list[float]] = field(default_factory=dict)
    skipped: str = ""  # why the plan trained no student here ("" = trained)
    # the chosen grid points and recalibrations of student and no-teacher reference
    selection: dict = field(default_factory=dict)
    # student - teacher on the surface's holdout rows: auc, auc_lo, auc_hi, ne, ne_lo, ne_hi
    vs_teacher: dict[str, float] = field(default_factory=dict)


def distill_config(preset: str, surface: str | None = None, overrides: list[str] | None = None,
                   path: str | Path | None = None):
    from gem.config import load_config
    from students.config import DistillConfig

    cfg = load_config(DistillConfig, section="students", preset=preset, path=path, overrides=overrides).validate()
    return replace(cfg, surfaces=[surface]) if surface else cfg


def student_tables(cfg, train_features: str | None, eval_features: str, feast_repo: str):
    """(train table, spec), (eval table, spec) with the teacher's knowledge joined point-in-time."""
    from students.data import attach_knowledge, load_table

    tr = cfg.transfer
    needs_preds = bool(tr.kd.weight or tr.adapter.weight or tr.hierarchical.weight)

    def load(path: str):
        table, spec = load_table(path, cfg.student)
        if tr.needs_teacher():
            table = attach_knowledge(table, feast_repo, predictions=needs_preds, embeddings=tr.representation.enabled,
                                     refresh_every=cfg.knowledge.refresh_every)
        return table, spec

    train = load(train_features) if train_features else (None, None)
    return train, load(eval_features)


def gate_metrics(metrics: dict[str, float]) -> dict[str, float]:
    """Click AUC/NE/calibration of one surface and the positives / negatives they rest on;
    NaN where the holdout has no positives, and no AUC under gem.utils.evidence's minimum
    (a degenerate surface is reported, not crashed on)."""
    nan = float("nan")
    return {"auc": float(metrics.get(f"auc/{GATE_TASK}", nan)), "ne": float(metrics.get(f"ne/{GATE_TASK}", nan)),
            "calibration": float(metrics.get(f"calibration/{GATE_TASK}", nan)),
            "positives": float(metrics.get(f"positives/{GATE_TASK}", 0.0)),
            "negatives": float(metrics.get(f"negatives/{GATE_TASK}", 0.0))}


def resolve_teacher(teacher_uri: str, teacher_version: str = "") -> str:
    """A fixed teacher version: ``models:/name@alias`` resolved to ``models:/name/N`` in the
    run's registry (an alias that moves is another teacher); anything else as given."""
    from mlflow import MlflowClient
    from mlflow.exceptions import MlflowException

    if teacher_version:
        return teacher_version
    rest = teacher_uri[len("models:/"):] if teacher_uri.startswith("models:/") else ""
    if "@" not in rest:
        return teacher_uri
    name, alias = rest.split("@", 1)
    try:
        return registry.model_uri(name, MlflowClient().get_model_version_by_alias(name, alias).version)
    except MlflowException:
        return teacher_uri  # not in this registry: the knowledge digest still keys the reuse


def teacher_window(teacher_version: str) -> str:
    """The data window a registered teacher was trained on (its version's tag), or ""."""
    from mlflow import MlflowClient
    from mlflow.exceptions import MlflowException

    if not teacher_version.startswith("models:/") or "@" in teacher_version:
        return ""
    name, version = teacher_version[len("models:/"):].split("/", 1)
    try:
        mv = MlflowClient().get_model_version(name, version)
    except MlflowException:
        return ""
    return mv.tags.get(tracking.TAG_DATA_WINDOW, "")


def reuse_key(cfg, surface: str, train_features: str, eval_features: str, feast_repo: str,
              teacher_version: str, fresh_from: str = "") -> dict:
    """What a recorded student depends on: the teacher version, both features windows
    (window and content digest), the knowledge registered in the Feast repo (digest and
    window: a new teacher's knowledge is a new input) and the resolved config."""
    from gem.config import flatten
    from gem.knowledge.feast import registered_knowledge
    from gem.utils.digest import value_digest

    knowledge = registered_knowledge(feast_repo) if cfg.transfer.needs_teacher() else {}
    return {"surface": surface, "teacher": teacher_version if cfg.transfer.needs_teacher() else "none",
            "train": list(features_lineage(train_features)), "eval": list(features_lineage(eval_features)),
            "knowledge": [knowledge.get("digest", ""), *knowledge.get("window", [])],
            "config": value_digest(flatten(cfg)), **({"fresh_from": fresh_from} if fresh_from else {})}


def distill(surface: str, train_features: str, eval_features: str, feast_repo: str, teacher_uri: str,
            out: str, ctx: RunContext, preset: str = "pipeline", overrides: list[str] | None = None,
            teacher_version: str = "", fresh_from: str = "") -> DistillResult:
    """``fresh_from`` (ISO): where the training window's rows after the teacher's window
    begin, when it overlaps the teacher's (``--student-overlap-days``): validation is cut
    from those rows only, since the teacher's predictions on its own days are in-sample."""
    import mlflow

    from gem.config import flatten, run_params
    from gem.knowledge.feast import registered_knowledge
    from gem.knowledge.teacher import load_teacher
    from gem.utils.paths import shown
    from students.distill import capacity_matched
    from students.protocol import lineage
    from students.pyfunc import input_example
    from students.registry import log_student

    cfg = distill_config(preset, surface, overrides)
    tracking_uri = ctx.configure()
    teacher_version = resolve_teacher(teacher_uri, teacher_version)
    window = features_lineage(train_features)[0]
    reuse = Reuse(Path(out) / f"{surface}.json",
                  reuse_key(cfg, surface, train_features, eval_features, feast_repo, teacher_version, fresh_from))
    if done := reuse.get():
        return DistillResult(**done)
    pending = Reuse(Path(out) / f".{surface}.pending.json", reuse.key)
    if (record := pending.get()) and (version := _registered_from(record["run_id"], surface)):
        return DistillResult(**reuse.put({**record["result"], "version": version}))  # killed after registering
    (train, spec), (holdout, _) = student_tables(cfg, train_features, eval_features, feast_repo)
    teacher = load_teacher(teacher_uri, tracking_uri) if cfg.transfer.sharing != "off" else None
    teacher_version = train.teacher_version or teacher_version or (teacher.version if teacher else teacher_uri)
    with tracked(ctx, f"distill-{surface}", tags={tracking.TAG_SURFACE: surface, tracking.TAG_MODEL_ROLE: "student",
                                                  tracking.TAG_TEACHER_VERSION: teacher_version,
                                                  tracking.TAG_FEATURE_VIEWS: KNOWLEDGE_VIEWS}):
        mlflow.log_params({k: str(v)[:500] for k, v in run_params(cfg).items()})
        log_features_input(train_features, "training")
        log_features_input(eval_features, "evaluation")
        _log_teacher_input(teacher_version)
        # the no-teacher reference is as large as the transfer student (capacity-matched)
        base_cfg = capacity_matched(cfg, teacher_emb_width=0 if train.teacher_emb is None else
                                    int(train.teacher_emb.shape[1]),
                                    teacher_embedding_dim=int(teacher.model.cfg.embedding_dim) if teacher else 0)
        chosen = choose_students(train, holdout, spec, cfg, surface, teacher.model if teacher else None, base_cfg,
                                 fresh_from=fresh_from)
        baseline, student, windows = chosen["no_teacher"].result, chosen["student"].result, chosen["windows"]
        if student.model.knowledge:  # the store it learned from, as this run records paths (students/lineage.py)
            student.model.knowledge["feast_repo"] = shown(feast_repo, ctx.tracking_root)
        knowledge = registered_knowledge(feast_repo) if cfg.transfer.needs_teacher() else {}
        tags = lineage(windows, teacher_version=teacher_version, teacher_window=teacher_window(teacher_version),
                       knowledge_window=knowledge.get("window"), refresh_every=cfg.knowledge.refresh_every)
        mlflow.log_params(tags)
        mlflow.log_params({f"student.{k}": v for k, v in student.size.items()}
                          | {f"no_teacher.{k}": v for k, v in baseline.size.items()})
        log_holdout(baseline, holdout, "no_teacher", features_lineage(eval_features)[1])
        figures = {"student": gate_metrics(student.metrics), "no_teacher": gate_metrics(baseline.metrics)}
        lift = {"auc": figures["student"]["auc"] - figures["no_teacher"]["auc"],
                "ne": figures["no_teacher"]["ne"] - figures["student"]["ne"]}
        selection = log_selection(chosen)
        # an AUC short of evidence is NaN here and stays out of MLflow (its counts go in)
        mlflow.log_metrics(computed({f"eval/{who}/{k}": v for who, m in figures.items() for k, v in m.items()}))
        mlflow.log_metrics(computed({f"eval/lift/{k}": v for k, v in lift.items()}))
        mlflow.log_metrics(tracking.holdout_metrics(figures["student"]))  # the names the teacher's run shares
        intervals = log_evaluation(student, baseline, holdout, surface)
        vs_teacher = {k[len("eval/vs_teacher/"):]: v for k, v in intervals.items() if k.startswith("eval/vs_teacher/")}
        if "eval/teacher/auc" in intervals:  # the teacher on the same holdout rows
            figures["teacher"] = {k: float(intervals[f"eval/teacher/{k}"]) for k in ("auc", "ne")}
        for who, res in (("student", student), ("no_teacher", baseline)):
            for epoch, loss in enumerate(res.train_loss):
                mlflow.log_metric(f"train/{who}/loss", loss, step=epoch)
        unregistered = DistillResult(surface=surface, model_name=registry.student_model(surface), version="",
                                     teacher_version=teacher_version, methods=list(student.methods), metrics=figures,
                                     lift=lift, flops_per_example=float(student.flops_per_example or 0.0),
                                     selection=selection, vs_teacher=vs_teacher)
        Path(out).mkdir(parents=True, exist_ok=True)
        pending.put({"run_id": mlflow.active_run().info.run_id,
                     "result": json.loads(json.dumps(unregistered.as_dict(), default=str))})
        version = log_student(
            student, registry.student_model(surface), teacher_version,
            extra_tags={tracking.TAG_PIPELINE_RUN: ctx.pipeline_run_id, tracking.TAG_DATA_WINDOW: window, **tags},
            tasks=list(holdout.tasks), refresh_every=cfg.knowledge.refresh_every,
            input_example=input_example(eval_features, feast_repo if student.model.teacher_emb_dim else None),
            params={**{f"student.{k}": v for k, v in flatten(cfg.student).items()},
                    "methods": ",".join(student.methods), **tags},
            metrics=computed({f"holdout/{k}": v for k, v in figures["student"].items()}),
            about=f"Trained on the window {window}, evaluated on {features_lineage(eval_features)[0]} "
                  f"(holdout AUC {auc_text(*(figures['student'][k] for k in ('auc', 'positives', 'negatives')))}, "
                  f"NE {figures['student']['ne']:.4f}).")
        fault_point("distill:registered")
    result = replace(unregistered, version=version)
    figure("surface", surface)
    shown = figures["student"]
    figure("student AUC", auc_text(shown["auc"], shown["positives"], shown["negatives"]))
    figure("lift AUC", auc_text(lift["auc"], shown["positives"], shown["negatives"], sign=True))
    reuse.put(json.loads(json.dumps(result.as_dict(), default=str)))
    return result


HOLDOUT_ARTIFACT = "holdout/{who}.parquet"


def choose_students(train, holdout, spec, cfg, surface: str, teacher_model, base_cfg, fresh_from: str = "") -> dict:
    """The transfer student and its no-teacher reference: with ``selection.validation_share``,
    each chosen on validation over its grid (students/selection.py) and recalibrated where
    the rule says; otherwise each trained once at the preset."""
    from students.data import split_at
    from students.distill import distill as run_distill
    from students.protocol import to_us
    from students.selection import Chosen, recalibrate, refit, select, teacher_ne, validation_split, with_older_rows

    sel = cfg.selection
    if not sel.validation_share:
        base_out = run_distill(train, holdout, spec, base_cfg)
        run = run_distill(train, holdout, spec, cfg, teacher_model=teacher_model)
        return {"no_teacher": Chosen(base_out.students[surface], {}), "student": Chosen(run.students[surface], {}),
                "windows": run.windows}
    fit, valid = validation_split(train, sel.validation_share, fresh_from=fresh_from)
    # a window reaching into the teacher's days: the grid is searched on every row
    # (older_rows "all") or on the fresh ones, and with "choose" validation decides whether
    # the chosen point also trains on the older ones (the no-teacher reference likewise)
    fresh_us = to_us(fresh_from) if fresh_from else 0
    older = bool(fresh_from) and bool((fit.event_time_us < fresh_us).any())
    fresh_only = older and sel.older_rows != "all"
    searched = split_at(fit, fresh_us)[1] if fresh_only else fit
    student = select(searched, valid, holdout, spec, cfg, surface, sel.grid, teacher_model=teacher_model)
    baseline = select(searched, valid, holdout, spec, base_cfg, surface, sel.no_teacher_grid)  # capacity-matched
    pairs = ((student, teacher_model), (baseline, None))
    if older:
        for chosen, model in pairs:
            chosen.rows = "fresh" if fresh_only else "all"
            if sel.older_rows == "choose":
                with_older_rows(chosen, fit, valid, holdout, spec, surface, teacher_model=model)
    if sel.calibrate:
        reference = teacher_ne(valid, surface)
        for chosen in (student, baseline):
            recalibrate(chosen, valid, holdout, surface, reference)
    if sel.refit:
        for chosen, model in pairs:
            if not chosen.calibration.get("applied"):
                rows = split_at(train, fresh_us)[1] if chosen.rows == "fresh" else train
                refit(chosen, rows, holdout, spec, surface, teacher_model=model)
    return {"no_teacher": baseline, "student": student, "windows": student.windows}


def log_selection(chosen: dict) -> dict:
    """Every grid point's validation figures (``select/<who>/<i>/...``, step = point index),
    the chosen points as params, recalibration as metrics and tags; returns the record
    the summary reads."""
    import mlflow

    record = {}
    for who in ("student", "no_teacher"):
        c = chosen[who]
        if not c.trials:
            continue
        for i, trial in enumerate(c.trials):
            mlflow.log_metrics(computed({f"select/{who}/{k}": trial[k] for k in
                                         ("valid_loss", "valid_auc", "valid_ne", "best_epoch", "best_epochs",
                                          "epochs_run") if k in trial}),
                               step=i)
        mlflow.log_dict({"trials": c.trials, "chosen": c.point, "calibration": c.calibration},
                        f"selection/{who}.json")
        mlflow.log_param(f"select.{who}.chosen", json.dumps(c.point)[:500])
        recalibrated = bool(c.calibration.get("applied"))
        mlflow.set_tag(f"select.{who}.recalibrated", str(recalibrated).lower())
        mlflow.log_metrics(computed({f"select/{who}/{k}": v for k, v in c.calibration.items()
                                     if k not in ("applied",)}))
        if c.refit:
            mlflow.log_metrics({f"select/{who}/refit_epochs": float(c.refit["epochs"]),
                                f"select/{who}/refit_rows": float(c.refit["rows"])})
        if c.rows:
            mlflow.log_param(f"select.{who}.rows", c.rows)
        record[who] = {"point": c.point, "points": len(c.trials), "recalibrated": recalibrated, "rows": c.rows,
                       "valid_loss": min(t["valid_loss"] for t in c.trials), "refit": dict(c.refit)}
    return record


def log_evaluation(student, baseline, holdout, surface: str, bootstrap: int = 500, level: float = 0.95) -> dict:
    """Intervals (users resampled, students/stats.py) for the student's and the
    no-teacher student's click AUC and NE and for the paired lift, as metrics beside
    the point figures (``eval/<who>/<metric>_lo`` / ``_hi``), and their ROC and
    calibration curves on the surface's holdout as a plot. With the teacher's predictions
    on the holdout rows: its AUC and NE there and student - teacher, paired
    (``eval/vs_teacher/auc`` and ``ne``: student NE - teacher NE, with ``_lo`` / ``_hi``)."""
    import mlflow
    import numpy as np

    from gem_app.stages.plots import holdout_figure
    from students.stats import interval, paired_difference, user_weights, weighted_auc, weighted_ne

    task = list(holdout.tasks).index(GATE_TASK)
    rows = student.eval_index
    if rows is None or student.eval_probs is None or baseline.eval_probs is None or not len(rows):
        return {}
    labels = holdout.labels[rows, task].numpy().astype(np.float64)
    probs = {"student": student.eval_probs[:, task].numpy().astype(np.float64),
             "no_teacher": baseline.eval_probs[:, task].numpy().astype(np.float64)}
    weights = user_weights(holdout.user_raw[rows].numpy(), bootstrap, seed=0)
    metrics = {}
    for who, p in probs.items():
        for name, fn in (("auc", weighted_auc), ("ne", weighted_ne)):
            lo, hi = interval(fn(labels, p, weights), level)
            metrics.update({f"eval/{who}/{name}_lo": lo, f"eval/{who}/{name}_hi": hi})
    run = [(np.arange(len(labels)), labels, probs["student"], probs["no_teacher"])]
    for name in ("auc", "ne"):
        lift = paired_difference(run, weights, name, level)
        metrics.update({f"eval/lift/{name}_lo": lift["lo"], f"eval/lift/{name}_hi": lift["hi"]})
    if holdout.teacher_logits is not None:  # the teacher on the same rows: how much of it reached the student
        logits = holdout.teacher_logits[rows, task].numpy().astype(np.float64)
        seen = np.isfinite(logits)
        if seen.any():
            teacher = 1.0 / (1.0 + np.exp(-logits[seen]))
            w_seen = weights[:, seen]  # the same resampled users as the lift's
            for name, fn in (("auc", weighted_auc), ("ne", weighted_ne)):
                metrics[f"eval/teacher/{name}"] = float(fn(labels[seen], teacher, np.ones((1, int(seen.sum()))))[0])
            pair = [(np.arange(int(seen.sum())), labels[seen], probs["student"][seen], teacher)]
            auc = paired_difference(pair, w_seen, "auc", level)
            ne = paired_difference(pair, w_seen, "ne", level)  # a lift: teacher NE - student NE
            metrics.update({"eval/vs_teacher/auc": auc["mean"], "eval/vs_teacher/auc_lo": auc["lo"],
                            "eval/vs_teacher/auc_hi": auc["hi"], "eval/vs_teacher/ne": -ne["mean"],
                            "eval/vs_teacher/ne_lo": -ne["hi"], "eval/vs_teacher/ne_hi": -ne["lo"],
                            "eval/vs_teacher/rows": float(seen.sum())})
    mlflow.log_metrics(computed({k: float(v) for k, v in metrics.items()}))
    figure_ = holdout_figure(labels, {"student": probs["student"], "no-teacher": probs["no_teacher"]}, surface)
    mlflow.log_figure(figure_, "plots/holdout_roc_calibration.png")
    return metrics


def log_holdout(result, holdout, who: str, holdout_digest: str) -> None:
    """A student's click probabilities on its surface's holdout rows (example_id, user_id,
    label, prob) as an artifact of the active run: the paired gate's evidence for a model
    that is not registered (the no-teacher reference). The holdout's digest is kept with it."""
    import tempfile

    import mlflow
    import pandas as pd

    task = list(holdout.tasks).index(GATE_TASK)
    rows = result.eval_index
    frame = pd.DataFrame({"example_id": holdout.example_id[rows].numpy(), "user_id": holdout.user_raw[rows].numpy(),
                          "label": holdout.labels[rows, task].numpy(),
                          "prob": result.eval_probs[:, task].numpy().astype("float64")})
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / f"{who}.parquet"
        frame.to_parquet(path, index=False)
        mlflow.log_artifact(str(path), artifact_path="holdout")
    mlflow.set_tag(f"gate.holdout_digest.{who}", holdout_digest)


def _log_teacher_input(teacher_version: str) -> None:
    """The teacher as the run's model input when this registry holds it (a teacher from
    another registry is linked by the teacher_version tag only)."""
    import logging

    from mlflow.exceptions import MlflowException

    try:
        log_model_input(teacher_version)
    except MlflowException as e:
        logging.getLogger(__name__).info("teacher %s is not in this run's registry (%s): linked by tag only",
                                         teacher_version, str(e).splitlines()[0])


def _registered_from(run_id: str, surface: str) -> str:
    """The version a killed attempt registered from its run, if it got that far (a rerun
    must not register the same student twice)."""
    from mlflow import MlflowClient

    name = registry.student_model(surface)
    versions = MlflowClient().search_model_versions(f"name='{name}' and run_id='{run_id}'")
    return str(versions[0].version) if versions else ""


def distill_plan(ctx: str, surfaces: list[str], available: list[str], **job) -> list[dict]:
    """One job per surface for the students' ParallelFor; a surface the data lacks is a
    clear error naming the surfaces that exist. With the windows and the gate settings in
    ``job``, a surface whose holdout cannot meet the gate's evidence floor (or whose
    student window lacks a positive or a negative) gets ``skip``: the reason. Its distill
    and gate tasks then train and score nothing, and it reads "not enough evidence"; one
    line per surface says which (the step's log)."""
    missing = sorted(set(surfaces) - set(available))
    if missing:
        raise ValueError(f"surfaces {missing} are not in this dataset; it has {sorted(available)}")
    jobs = [{"ctx": ctx, "surface": s, **job} for s in (surfaces or available)]  # default: the data's surfaces
    if not (job.get("train_features") and job.get("eval_features") and "gate" in job):
        return jobs
    from gem_app.promotion import GateConfig

    gate = GateConfig.from_dict(job["gate"])
    train, holdout = surface_evidence(job["train_features"]), surface_evidence(job["eval_features"])
    for j in jobs:
        reason = skip_reason(train.get(j["surface"], {}), holdout.get(j["surface"], {}), gate)
        h = holdout.get(j["surface"], {})
        if reason:
            j["skip"], j["holdout_evidence"] = reason, h
            warning(f"surface '{j['surface']}': {reason}")  # on the terminal, under the step's line
        log.info("%s: %s (student window %s, holdout %s)", j["surface"], f"skipped: {reason}" if reason else "distill",
                 _counts(train.get(j["surface"], {})), _counts(h))
    skipped = [j["surface"] for j in jobs if j.get("skip")]
    figure("students", f"{len(jobs) - len(skipped)} of {len(jobs)}"
           + (f" (too little evidence: {', '.join(skipped)})" if skipped else ""))
    return jobs


def surface_evidence(features: str) -> dict[str, dict[str, int]]:
    """Per surface of a features window (its report): examples, click positives and negatives."""
    report = json.loads((Path(features) / "report.json").read_text())
    out = {}
    for surface, rates in report.get("label_rates", {}).items():
        n = int(rates["examples"])
        positives = int(round(float(rates["click_rate"]) * n))
        out[surface] = {"examples": n, "positives": positives, "negatives": n - positives}
    return out


def skip_reason(train: dict[str, int], holdout: dict[str, int], gate) -> str:
    """Why no student of a surface could be promoted, whatever it learned ("" if one could):
    the holdout short of the gate's evidence floor, or nothing to learn in the student window."""
    from gem_app.promotion import evidence_shortfall

    short = evidence_shortfall({"positives": holdout.get("positives", 0), "negatives": holdout.get("negatives", 0)},
                               gate)
    if short:
        return f"no student trained: {short}"
    if not train.get("positives") or not train.get("negatives"):
        return (f"no student trained: the student window has {train.get('positives', 0)} positives and "
                f"{train.get('negatives', 0)} negatives")
    return ""


def _counts(evidence: dict[str, int]) -> str:
    return f"{evidence.get('examples', 0):,} examples, {evidence.get('positives', 0):,} positives"


def skipped_result(job: dict) -> DistillResult:
    """The record of a surface the plan skipped: no student, the holdout's evidence."""
    evidence = job.get("holdout_evidence", {})
    return DistillResult(surface=job["surface"], model_name=registry.student_model(job["surface"]), version="",
                         teacher_version=job.get("teacher_version", ""), methods=[],
                         metrics={"student": {k: float(evidence[k]) for k in ("positives", "negatives")
                                              if k in evidence}, "no_teacher": {}},
                         lift={}, skipped=job["skip"])
