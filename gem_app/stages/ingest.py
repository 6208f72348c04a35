"""ingest: simulate a dataset when none is given, validate it into the workspace's clean
copy (bad rows quarantined with their reason), and cut the protocol's time windows: by
evidence (the default, ``evidence_windows``: the latest spans that hold enough examples
and clicks per surface, printed with their sizes), the last days (``split_windows``:
``student_days`` and ``holdout_days`` > 0), or explicit time cut points (``cut_windows``);
``student_overlap_days`` > 0 starts the students' window that many days before the
teacher's end, -1 (the default, ``gem.protocol.ALL_TEACHER_DAYS``) at the teacher's start
(``gem.protocol.overlap_students``).

Cut points come as ``cuts`` or, from `pipeline run --cut`, as the workspace's
``cuts.json`` (``write_cuts``): the compiled pipeline has no parameter for them, and a
local run's ingest reads them there (every local run writes or removes the file)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path

from gem import tracking
from gem.protocol import (
    ALL_TEACHER_DAYS,
    Evidence,
    check_windows,
    cut_windows,
    dataset_window_tag,
    evidence_windows,
    overlap_students,
    split_windows,
)
from gem.utils.digest import tree_digest, value_digest
from gem.utils.progress import figure, warning
from gem_app.stages.context import Reuse, RunContext, StageResult, tracked

WINDOW_NAMES = ("teacher", "student", "holdout")
CUTS_FILE = "cuts.json"


def write_cuts(workspace: str | Path, cuts: list[str] | None) -> None:
    """Record the cut points of the next local run in ``workspace`` (none: remove them)."""
    path = Path(workspace) / CUTS_FILE
    if not cuts:
        path.unlink(missing_ok=True)
        return
    from gem.utils.atomic import write_json

    write_json({"cuts": list(cuts)}, path)


def read_cuts(workspace: str | Path) -> list[str]:
    import json

    path = Path(workspace) / CUTS_FILE
    return list(json.loads(path.read_text())["cuts"]) if path.is_file() else []


@dataclass(kw_only=True)
class IngestResult(StageResult):
    clean: str
    data_digest: str
    windows: dict[str, str]
    features: dict[str, str]  # window name -> features directory (decided here, see below)
    summary: str
    quarantined_fraction: float
    events: int
    surfaces: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    evidence: dict[str, str] = field(default_factory=dict)  # windows chosen by evidence: span and sizes
    days: str = ""  # the file of the given dataset's day digests (late_data.write_days): the commit records them
    late_data: dict = field(default_factory=dict)  # late or corrected days found and backfilled (late_data=backfill)


def _show(result: IngestResult) -> None:
    for text in result.warnings:  # said again on every run that uses this dataset
        warning(text)
    for name, text in result.evidence.items():
        figure(name, text)
    w = result.windows
    if w.get("student_start", w["teacher_end"]) != w["teacher_end"]:
        figure("students also train on", f"{w['student_start'][:10]}..{w['teacher_end'][:10]} (the teacher's days)")


def simulate(out: str, preset: str, ctx: RunContext, overrides: list[str] | None = None) -> dict:
    import mlflow

    from gem.config import flatten, load_config
    from gem.data.simulate import SimulatorConfig
    from gem.data.simulate import simulate as run_simulator

    cfg = load_config(SimulatorConfig, section="simulator", preset=preset, overrides=overrides)
    with tracked(ctx, "simulate"):
        mlflow.log_params({f"sim/{k}": v for k, v in flatten(cfg).items()})
        manifest = run_simulator(cfg, out)
        mlflow.log_metric("data/events", manifest.extra["events"])
    return {"events": manifest.extra["events"], "config": value_digest(flatten(cfg))}


def validate(data: str, out: str, report_dir: str, ctx: RunContext, max_quarantine_fraction: float = 0.0):
    """Validate ``data`` and write the processed rows as a clean dataset to ``out``."""
    import mlflow

    from gem.data.validate import validate_dataset

    with tracked(ctx, "validate", tags={tracking.TAG_DATA_WINDOW: dataset_window_tag(data)}):
        report = validate_dataset(data, report_dir=report_dir, out=out)
        mlflow.log_metrics({f"rows/{kind}/{table}": n for kind, counts in (
            ("input", report.input_rows), ("processed", report.processed_rows),
            ("quarantined", report.quarantined_rows)) for table, n in counts.items()})
        mlflow.log_metrics({f"quarantine/{reason}": n for reason, n in report.reasons.items()})
        mlflow.log_artifact(report.report_path)
    if report.quarantined_fraction > max_quarantine_fraction:  # the user's data: a refusal (exit 2), not a crash
        from gem.features.validation import DatasetRejected

        raise DatasetRejected(f"{data}: {report.quarantined_fraction:.4%} of rows quarantined, above the allowed "
                              f"{max_quarantine_fraction:.4%}; each row and its reason: {report.quarantine_path}")
    return report


def check_surfaces(data: str, surfaces: list[str] | None) -> list[str]:
    """The surfaces to plan for: ``surfaces`` when the dataset has events on each (else a
    SurfaceError naming the surfaces it has, before any work), or all of the data's."""
    from gem.data.profile import profile_dataset

    return profile_dataset(data).require_surfaces(surfaces)


def ingest(data: str, workspace: str, sim_preset: str, ctx: RunContext, *, student_days: int = 0,
           holdout_days: int = 0, teacher_days: int = 0, surfaces: list[str] | None = None,
           cuts: list[str] | None = None, evidence: dict | None = None, late_data: str = "",
           student_overlap_days: int = ALL_TEACHER_DAYS) -> IngestResult:
    """A rerun reuses the result only when the dataset's bytes (or the simulator's
    config) and the protocol are unchanged. ``surfaces`` (asked for) are checked against
    the data first: a surface it lacks fails here, before any work. ``cuts`` (default:
    the workspace's cuts.json): [teacher_end, student_end]. Otherwise a window of
    ``student_days`` / ``holdout_days`` > 0 days is that many last days, and one of 0 is
    chosen by ``evidence`` (gem.protocol.Evidence fields; defaults where absent).
    ``late_data`` (refuse | backfill; empty: not checked) compares the dataset's days
    with those the last committed run recorded (gem_app.stages.late_data) first."""
    from gem.data.contract import DatasetHandle
    from gem.data.profile import profile_dataset
    from gem_app.stages.late_data import late_data_plan, write_days

    if data and surfaces:
        check_surfaces(data, surfaces)
    ws = Path(workspace)
    cuts = list(cuts) if cuts is not None else read_cuts(ws)
    by_days = student_days > 0 and holdout_days > 0
    dataset = DatasetHandle.open(data) if data else None
    days = dataset.day_digests() if dataset else {}
    late = None
    if dataset and late_data:
        late, teacher_days = late_data_plan(ctx.tracking_root, data, days, late_data, teacher_days=teacher_days,
                                            student_days=student_days, holdout_days=holdout_days)
        if late:
            warning(f"{late.describe()}: backfilled (late_data=backfill): every window rebuilt from the current "
                    f"data, the teacher window {teacher_days} days back")
    proof = Evidence.from_dict(evidence)
    protocol = {"cuts": cuts} if cuts else {"student_days": student_days, "holdout_days": holdout_days,
                                             "teacher_days": teacher_days}
    if not cuts and not by_days:
        protocol["evidence"] = asdict(proof)
    protocol["surfaces"] = sorted(surfaces or [])
    if student_overlap_days:
        protocol["student_overlap_days"] = student_overlap_days
    source = {"data": dataset.digest} if dataset else {"simulator": sim_preset}
    reuse = Reuse(ws / "ingest.json", {**source, **protocol})
    if (done := reuse.get()) and (ws / "clean").is_dir() and tree_digest(ws / "clean") == done["data_digest"]:
        result = IngestResult(**{**done, "days": write_days(ws, days)})
        _show(result)
        return result
    if not data:
        data = str(ws / "raw")
        simulate(data, sim_preset, ctx)
    report = validate(data, str(ws / "clean"), str(ws / "validation"), ctx)
    profile = profile_dataset(ws / "clean")  # the surfaces with events, in manifest order
    profile.require_surfaces(surfaces)
    chosen = None
    if cuts:
        windows = cut_windows(ws / "clean", cuts)
    elif by_days:
        windows = split_windows(ws / "clean", student_days=student_days, holdout_days=holdout_days,
                                teacher_days=teacher_days)
    else:
        if teacher_days:
            from gem.errors import UserError

            raise UserError("teacher_days (continued pretraining) takes --student-days and --holdout-days")
        chosen = evidence_windows(ws / "clean", proof, student_days=student_days, holdout_days=holdout_days)
        windows = chosen.windows
    windows = overlap_students(windows, student_overlap_days)
    # students only where the student and holdout windows can train and rank (fails fast
    # when a window holds no example or one label only)
    planned, window_warnings = check_windows(ws / "clean", windows, surfaces)
    if chosen is not None:
        missing = [s for s in (surfaces or []) if s not in chosen.surfaces]
        if missing:
            from gem.data.profile import SurfaceError

            raise SurfaceError(f"surface(s) {missing} cannot get a student: " + " ".join(
                w for w in chosen.warnings if any(repr(s) in w for s in missing)))
        planned = [s for s in planned if s in chosen.surfaces]
        said = [s for s in profile.surfaces if s not in chosen.surfaces]  # one warning per surface left out
        window_warnings = [*chosen.warnings, *(w for w in window_warnings if not any(repr(s) in w for s in said))]
    warnings = [*profile.warnings, *window_warnings]
    # the features directories of the three windows (paths are decided here: kfp.local
    # does not resolve f-strings of pipeline parameters passed into sub-pipelines)
    result = IngestResult(
        clean=str(ws / "clean"), data_digest=tree_digest(ws / "clean"), windows=windows.as_dict(),
        features={name: str(ws / "features" / name) for name in WINDOW_NAMES},
        summary=report.summary(), quarantined_fraction=report.quarantined_fraction,
        events=report.processed_rows.get("events", 0),
        surfaces=planned, warnings=warnings, evidence=chosen.lines() if chosen is not None else {},
        days=write_days(ws, days),
        late_data={**late.as_dict(), "teacher_days": teacher_days} if late else {})
    reuse.put(result.as_dict())
    _show(result)
    figure("events", result.events)
    figure("quarantined", f"{result.quarantined_fraction:.2%}")
    figure("surfaces", ",".join(result.surfaces))
    return result
