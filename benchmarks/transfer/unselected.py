"""The pipeline's students as they were before selection on validation (issue 43), on a
finished pipeline workspace's own windows, teacher and knowledge:

    python -m benchmarks.transfer.unselected WORKSPACE OUT [--current] [KEY=VALUE ...]

For every surface the run trained a student for, the distill stage with the `pipeline`
preset as it was (one config, 3 epochs, every student row trained on), tracked under OUT
(its own MLflow store); prints and writes OUT/unselected.json: per surface the student's,
the no-teacher reference's and the teacher's holdout figures and student - teacher,
paired. Compare with the workspace's summary.json (the selected students). ``--current``:
the preset as it is now instead (the students of today's code on that workspace's
teacher and knowledge); KEY=VALUE: overrides of the students' config on top (e.g. a
grid: 'selection.grid=[{}, {transfer.adapter.weight: 0.9}]')."""

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
    extra = [a for a in args if "=" in a]
    args = [a for a in args if a != "--current" and "=" not in a]
    if len(args) != 2:
        raise SystemExit(__doc__)
    workspace, out = Path(args[0]), Path(args[1])
    summary = json.loads((workspace / "summary.json").read_text())
    ctx = RunContext(pipeline_run_id="unselected", tracking_root=str(out))
    rows = {}
    for row in summary["surfaces"]:
        if row["student"] == "none trained":
            continue
        s = row["surface"]
        r = distill(s, str(workspace / "features" / "student"), str(workspace / "features" / "holdout"),
                    str(workspace / "feast"), summary["teacher"]["model_uri"], str(out / "students"), ctx,
                    preset="pipeline", overrides=([] if current else UNSELECTED) + extra)
        rows[s] = {"student": r.metrics["student"], "no_teacher": r.metrics["no_teacher"],
                   "teacher": r.metrics.get("teacher", {}), "vs_teacher": r.vs_teacher, "lift": r.lift}
        print(s, json.dumps(rows[s]), flush=True)
    (out / "unselected.json").write_text(json.dumps(rows, indent=1, default=str))
    return rows


if __name__ == "__main__":
    main()
