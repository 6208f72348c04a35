"""The transfer experiment in MLflow: one summary run per (dataset, world, arm) whose
metrics are its lifts with their intervals (select them in the UI and compare: the arms
side by side), one child run per (teacher, seed) under it with the per-surface figures,
the selected grid point and the lineage; the first seed's students of the first teacher
of the headline world registered for the arms named in ``register``, with their lineage
tags."""

from __future__ import annotations

import json
import math
import time

from gem import registry

LIFT_KEYS = ("mean", "lo", "hi", "sd_runs")


def _metrics(prefix: str, entry: dict | None) -> dict[str, float]:
    if not entry:
        return {}
    return {f"{prefix}/{k}": float(entry[k]) for k in LIFT_KEYS if isinstance(entry.get(k), (int, float))
            and math.isfinite(entry[k])}


def _batch(client, run_id: str, metrics: dict[str, float], params: dict[str, str], tags: dict[str, str]) -> None:
    from mlflow.entities import Metric, Param, RunTag

    now = int(time.time() * 1000)
    m = [Metric(k, float(v), now, 0) for k, v in metrics.items() if isinstance(v, (int, float)) and math.isfinite(v)]
    p = [Param(k, str(v)[:500]) for k, v in params.items()]
    t = [RunTag(k, str(v)[:5000]) for k, v in tags.items()]
    for i in range(0, max(len(m), len(p), len(t), 1), 100):
        client.log_batch(run_id, metrics=m[i:i + 100], params=p[i:i + 100], tags=t[i:i + 100])


def log_world(ds, res, figures: dict, cfg, parent_id: str, *, headline: bool) -> None:
    import mlflow

    client = mlflow.MlflowClient()
    experiment_id = client.get_run(parent_id).info.experiment_id
    world = res.world
    teachers = {t.id: t for t in world.teachers}
    for arm, runs in res.arms.items():
        entry = figures["arms"][arm]
        summary = client.create_run(experiment_id, run_name=f"{ds.name}/{world.name}/{arm}",
                                    tags={"mlflow.parentRunId": parent_id, "dataset": ds.name, "world": world.name,
                                          "arm": arm, "role": "arm-summary"})
        metrics = {"auc/click": entry["auc"], "ne/click": entry["ne"], **_metrics("lift/auc", entry.get("lift_auc")),
                   **_metrics("lift/ne", entry.get("lift_ne")),
                   **_metrics("lift_vs_capacity/auc", entry.get("lift_auc_vs_capacity")),
                   **_metrics("lift_vs_capacity/ne", entry.get("lift_ne_vs_capacity")),
                   "flops_per_example": entry["flops_per_example"],
                   **{f"size/{k}": v for k, v in entry["size"].items()}}
        params = {"transfer": json.dumps(cfg.arms[arm].transfer, sort_keys=True),
                  "grid": json.dumps(cfg.arms[arm].grid, sort_keys=True), "capacity_of": cfg.arms[arm].capacity_of,
                  "knowledge_cadence": cfg.arms[arm].refresh_every or cfg.knowledge.refresh_every,
                  **{f"window.{k}": "/".join(v) for k, v in world.windows.items()}}
        _batch(client, summary.info.run_id, metrics, params, {})
        for r in runs:
            _log_runs(client, experiment_id, summary.info.run_id, ds, world, arm, r, teachers.get(r.teacher), cfg,
                      register=headline and arm in cfg.register and r.teacher in (None, "t0"))
        client.set_terminated(summary.info.run_id)


def _log_runs(client, experiment_id: str, parent: str, ds, world, arm: str, r, teacher, cfg, *, register: bool):
    """One child run per seed of an (arm, teacher) result: per-surface figures, selection,
    lineage; with ``register`` the kept seed's students are registered."""
    from students.protocol import lineage

    cadence = cfg.arms[arm].refresh_every or cfg.knowledge.refresh_every
    tags = lineage(r.windows, teacher_version=teacher.version if teacher else "",
                   teacher_window="/".join(world.windows["teacher"]) if teacher else "",
                   knowledge_window=[world.windows["knowledge_lead"][0], world.windows["evaluation"][1]]
                   if teacher else None, refresh_every=cadence if teacher else "")
    for seed, surfaces in r.runs.items():
        name = f"{ds.name}/{world.name}/{arm}/{r.teacher or '-'}/s{seed}"
        child = client.create_run(experiment_id, run_name=name, tags={
            "mlflow.parentRunId": parent, "dataset": ds.name, "world": world.name, "arm": arm, "role": "arm-run",
            "teacher_version": teacher.version if teacher else "none"})
        m = {}
        for s, run in surfaces.items():
            m.update({f"eval/{k.replace('/', f'/{s}/', 1)}": v for k, v in run.metrics.items()})
            m.update({f"valid/{s}/loss": run.valid_loss, f"valid/{s}/best_epoch": run.best_epoch})
        _batch(client, child.info.run_id, m, {**tags, "seed": seed, "point": json.dumps(r.point, sort_keys=True)}, {})
        client.set_terminated(child.info.run_id)
        if register and seed in r.models:
            _register(r.models[seed], ds.name, arm, teacher.version if teacher else "none", tags, child.info.run_id)


def _register(students: dict, dataset: str, arm: str, teacher_version: str, tags: dict, run_id: str) -> None:
    import mlflow

    from students.registry import log_student

    with mlflow.start_run(run_id=run_id):
        for surface, res in students.items():
            log_student(res, registry.student_model(surface, dataset=dataset, method=arm), teacher_version,
                        {"dataset": dataset, "method": arm, **tags})


def log_parent(parent_id: str, payload: dict, cfg, params: dict[str, str]) -> None:
    import mlflow

    from benchmarks.transfer.report import comparison_markdown, lift_figure

    with mlflow.start_run(run_id=parent_id):
        mlflow.log_params(params)
        mlflow.log_dict(payload, "transfer.json")
        mlflow.log_text(comparison_markdown(payload), "comparison.md")
        fig = lift_figure(payload)
        if fig is not None:
            mlflow.log_figure(fig, "plots/lift.png")
        flat = {}
        for ds, entry in payload["datasets"].items():
            for arm, a in entry["arms"].items():
                flat.update(_metrics(f"{ds}/{arm}/lift_auc", a.get("lift_auc")))
        mlflow.log_metrics(flat)
