"""`python -m gem distill ...`: per-surface students from a frozen GEM's knowledge.

    python -m gem distill run --train features_student/ --eval features_eval/ \\
        --repo feast_repo/ --teacher models:/gem-teacher/1 --out runs/students \\
        --set transfer.adapter.weight=0.5 --set transfer.representation.enabled=true
    python -m gem distill experiment --preset bench --out runs/transfer

``run`` reads the teacher's knowledge point-in-time from the Feast repo (registered
with ``gem knowledge register``), trains one student per surface, logs them to MLflow
and registers each, tagged with the teacher version. ``experiment`` runs the whole
stale-teacher transfer experiment (students/experiment.py).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("distill", help="distill GEM into per-surface vertical models",
                                   description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="distill_command", metavar="SUBCOMMAND", required=True)
    run = sub.add_parser("run", help="train one student per surface")
    run.add_argument("--train", required=True, type=Path, help="features directory of the student window")
    run.add_argument("--eval", type=Path, default=None, help="features directory evaluated after training")
    run.add_argument("--repo", required=True, type=Path, help="Feast repo holding the teacher's knowledge")
    run.add_argument("--teacher", default=None, help="teacher URI (needed for transfer.sharing)")
    run.add_argument("--out", required=True, type=Path, help="output folder (metrics.json, mlflow.db)")
    run.add_argument("--preset", default="default", help="gem/configs/students/<preset>.yaml")
    run.add_argument("--config", type=Path, default=None, help="a YAML file of DistillConfig values")
    run.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    run.set_defaults(func=_run)
    exp = sub.add_parser("experiment", help="the stale-teacher transfer experiment")
    exp.add_argument("--preset", default="bench", help="gem/configs/students/<preset>.yaml (ExperimentConfig)")
    exp.add_argument("--out", required=True, type=Path, help="work folder (data, features, mlflow.db)")
    exp.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    exp.add_argument("--no-latency", action="store_true", help="skip the serving latency benchmark")
    exp.set_defaults(func=_experiment)


def _run(args: argparse.Namespace) -> int:
    import mlflow

    from gem.config import flatten, load_config
    from students.config import DistillConfig
    from students.data import attach_knowledge, load_table
    from students.distill import distill
    from students.registry import log_student

    cfg = load_config(DistillConfig, section="students", preset=args.preset, path=args.config,
                      overrides=args.overrides).validate()
    tr = cfg.transfer
    needs_preds = bool(tr.kd.weight or tr.adapter.weight or tr.hierarchical.weight)
    train, spec = load_table(args.train, cfg.student)
    if tr.needs_teacher():
        train = attach_knowledge(train, args.repo, predictions=needs_preds, embeddings=tr.representation.enabled)
    eval_table = None
    if args.eval:
        eval_table, _ = load_table(args.eval, cfg.student)
        eval_table = attach_knowledge(eval_table, args.repo, predictions=needs_preds,
                                      embeddings=tr.representation.enabled) if tr.needs_teacher() else eval_table
    teacher_model, teacher_version = None, train.teacher_version
    if args.teacher:
        from gem.knowledge.teacher import load_teacher

        teacher = load_teacher(args.teacher, cfg.tracking_uri or None)
        teacher_model, teacher_version = teacher.model, teacher_version or teacher.version
    out = distill(train, eval_table, spec, cfg, teacher_model=teacher_model)
    args.out.mkdir(parents=True, exist_ok=True)
    mlflow.set_tracking_uri(cfg.tracking_uri or f"sqlite:///{(args.out / 'mlflow.db').resolve()}")
    mlflow.set_experiment(cfg.experiment)
    summary = {}
    with mlflow.start_run(run_name="distill") as parent:
        mlflow.log_params({k: str(v)[:500] for k, v in flatten(cfg).items()})
        for surface, res in out.students.items():
            with mlflow.start_run(run_name=surface, nested=True, parent_run_id=parent.info.run_id):
                mlflow.log_metrics({k.replace("/", "."): v for k, v in res.metrics.items()})
                version = log_student(res, f"student-{surface}", teacher_version or "none") if cfg.register else ""
            summary[surface] = {"metrics": res.metrics, "flops_per_example": res.flops_per_example,
                                "registered_version": version, "methods": res.methods}
    (args.out / "metrics.json").write_text(json.dumps(summary, indent=2, default=str))
    print(json.dumps({s: {k: v for k, v in d["metrics"].items() if k.startswith(("auc", "ne"))}
                      for s, d in summary.items()}, indent=2))
    return 0


def _experiment(args: argparse.Namespace) -> int:
    from students.experiment import load_experiment_config, run_experiment

    cfg = load_experiment_config(args.preset, args.overrides)
    payload = run_experiment(cfg, args.out, latency=not args.no_latency)
    print(json.dumps({k: payload[k] for k in ("transfer_ratio", "student_p99_ms", "student_flops_ratio")}, indent=2))
    return 0
