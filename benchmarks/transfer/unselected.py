"""The pipeline's students as they were before selection on validation (issue 43), on a
finished pipeline workspace's own windows, teacher and knowledge:

    python -m benchmarks.transfer.unselected WORKSPACE OUT [--current] [--overlap-days N] [KEY=VALUE ...]

For every surface the run trained a student for, the distill stage with the `pipeline`
preset as it was (one config, 3 epochs, every student row trained on), tracked under OUT
(its own MLflow store); prints and writes OUT/unselected.json: per surface the student's,
the no-teacher reference's and the teacher's holdout figures and student - teacher,
paired. Compare with the workspace's summary.json (the selected students). ``--current``:
the preset as it is now instead (the students of today's code on that workspace's
teacher and knowledge); KEY=VALUE: overrides of the students' config on top (e.g. a
grid: 'selection.grid=[{}, {transfer.adapter.weight: 0.9}]'). ``--overlap-days N``: the
students also train on the teacher window's last N days (``pipeline run
--student-overlap-days``): that window's features and the teacher's knowledge on it are
built under OUT by the pipeline's own stages (the workspace's MLflow store and Feast repo
copied there first; the workspace is not changed), validation kept to the fresh rows."""

from __future__ import annotations

import json
import sys
from pathlib import Path

UNSELECTED = ["selection.validation_share=0", "optim.epochs=3", "optim.patience=0"]


def main(argv: list[str] | None = None) -> dict:
    from gem_app.stages.context import RunContext
    from gem_app.stages.distill import distill

    args = sys.argv[1:] if argv is None else argv
    current = "--current" in args
    overlap = None  # 0: the students' own window, rebuilt (the workspace's may overlap the teacher's)
    if "--overlap-days" in args:
        at = args.index("--overlap-days")
        overlap, args = int(args[at + 1]), args[:at] + args[at + 2:]
    extra = [a for a in args if "=" in a]
    args = [a for a in args if a != "--current" and "=" not in a]
    if len(args) != 2:
        raise SystemExit(__doc__)
    workspace, out = Path(args[0]), Path(args[1])
    summary = json.loads((workspace / "summary.json").read_text())
    ctx = RunContext(pipeline_run_id="unselected", tracking_root=str(out))
    train, feast, fresh_from = str(workspace / "features" / "student"), str(workspace / "feast"), ""
    if overlap is not None:
        train, feast, fresh_from = overlapped_window(workspace, out, overlap, summary["teacher"]["model_uri"], ctx)
    rows = {}
    for row in summary["surfaces"]:
        if row["student"] == "none trained":
            continue
        s = row["surface"]
        r = distill(s, train, str(workspace / "features" / "holdout"), feast, summary["teacher"]["model_uri"],
                    str(out / "students"), ctx, preset="pipeline", overrides=([] if current else UNSELECTED) + extra,
                    fresh_from=fresh_from)
        rows[s] = {"student": r.metrics["student"], "no_teacher": r.metrics["no_teacher"],
                   "teacher": r.metrics.get("teacher", {}), "vs_teacher": r.vs_teacher, "lift": r.lift}
        print(s, json.dumps(rows[s]), flush=True)
    together = pooled(rows)
    print("pooled student - teacher", json.dumps(together), flush=True)
    (out / "unselected.json").write_text(json.dumps({**rows, "pooled": together}, indent=1, default=str))
    return rows


def pooled(rows: dict) -> dict:
    """Student - teacher AUC and NE over the surfaces, as the run's summary pools them."""
    from gem_app.stages.summary import pooled_vs_teacher

    return pooled_vs_teacher([{"student_auc": r["student"].get("auc"), "vs_teacher_rows": r["vs_teacher"].get("rows"),
                               **{f"vs_teacher_{k}": v for k, v in r["vs_teacher"].items() if k != "rows"}}
                              for s, r in rows.items() if s != "pooled"])


def overlapped_window(workspace: Path, out: Path, days: int, teacher_uri: str, ctx) -> tuple[str, str, str]:
    """(features, Feast repo, fresh_from) of the students' window started ``days`` before
    the teacher's end, built under ``out`` as the pipeline builds it."""
    import shutil

    from gem.protocol import Windows, overlap_students
    from gem_app.stages.features import features_finalize, features_plan, features_shard
    from gem_app.stages.knowledge import knowledge

    out.mkdir(parents=True, exist_ok=True)
    if not (out / "mlflow.db").exists():  # the teacher's registry, so the knowledge stage can load it
        shutil.copy2(workspace / "mlflow.db", out / "mlflow.db")
        _artifacts_under(out / "mlflow.db", workspace, out)
        shutil.copytree(workspace / "feast", out / "feast", dirs_exist_ok=True)
    recorded = json.loads((workspace / "ingest.json").read_text())["result"]["windows"]  # the run's own windows
    windows = overlap_students(Windows(**{**recorded, "student_start": ""}), days)
    features, vocab = out / "features" / "student", str(workspace / "features" / "teacher")
    preset = json.loads((workspace / "run.json").read_text())["params"]["features_preset"]
    for shard in features_plan(str(workspace / "clean"), str(features), windows.students_from, windows.student_end,
                               preset, vocab_from=vocab):
        features_shard(str(features), shard)
    features_finalize(str(features), preset, ctx, "student", vocab_from=vocab)
    knowledge(teacher_uri, [str(features), str(workspace / "features" / "holdout")], str(out / "knowledge"),
              str(out / "feast"), ctx, lead_from=vocab)
    return str(features), str(out / "feast"), windows.teacher_end


def _artifacts_under(db: Path, workspace: Path, out: Path) -> None:
    """The copied store's experiments keep their artifacts under ``out``: their locations
    name the workspace, where this tool's runs would otherwise write (the teacher's run
    keeps its own URI, read from the workspace)."""
    import sqlite3

    with sqlite3.connect(db) as con:
        con.execute("UPDATE experiments SET artifact_location = replace(artifact_location, ?, ?)",
                    (str(workspace.resolve()), str(out.resolve())))


if __name__ == "__main__":
    main()
