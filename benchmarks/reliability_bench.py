"""Reliability: the defect cases of tests/reliability, and fault injection on the real
pipeline.

Fault injection: one uninterrupted pipeline run (the `tiny` preset, surfaces feed and
video, on a fixed simulated dataset) is the reference. Its gate settings are lenient
(``BENCH_GATE``: the tiny holdout has too few clicks for the real floors), so that the
run promotes the teacher and both students and a failure has champions to move. Then,
for each fault point, a fresh workspace runs the same pipeline with
``GEM_FAULT=<point>`` (the whole run dies by SIGKILL there, see
gem_app/stages/context.py ``fault_point``; ``fail@<point>``: the step fails there with
an error) or is killed from outside mid-training, and is rerun without the fault.

- Every faulted run must leave the registry's aliases exactly as they were before it
  (none, in a fresh workspace): promotion is one commit per run. A fault that moved an
  alias is a "moved aliases" outcome (goal: 0).
- The rerun must succeed, and its summary and registry (versions per model, aliases)
  must equal the reference's. A rerun that succeeds with a different result is a
  silent loss (goal: 0).
- The registry's rules (gem_app.promotion ``registry_problems``: one champion per
  model, a challenger never the champion and newer than it, the decisions written on
  the versions matching their aliases, no commit journal left) must hold in the
  reference, after each fault (after the recovery for ``promote:*``) and after each
  rerun; a case where they do not is "registry rules broken" (goal: 0).

A kill inside the commit itself (``promote:mid``, between two alias moves; MLflow
moves one alias at a time; ``promote:moved``, the students' commit with every alias
moved and no decision written on the versions; ``promote:recorded``, the decisions
written and checked, the journal not yet removed) leaves the commit's journal: the case
checks the aliases after the recovery the next start does (gem_app.promotion.recover),
and records what they were before it. ``knowledge:window-written`` kills the knowledge
generation after its first window is written, before the others and before any is
registered in the Feast repo.

The failure cases of issue 28: ``fail@distill-video:mid`` (a surface's distill fails
after the teacher's gate decided to promote it) and ``fail@gate-student_video:decided``
(one surface's gate fails; the case records whether the other surface's gate had
passed by then).

    python -m benchmarks.reliability_bench [--points ingest:recorded,train:registered,...]
    python -m benchmarks.reliability_bench --faults-from benchmarks/results/reliability.json

(the second reruns the defect tests only, ~10 min, and keeps the fault points' cases of
the earlier file, saying when they were recorded: ``faults_recorded_at``; with ``--points``
as well, those points run again and join or replace the earlier file's cases)

Writes <results>/reliability.json: cases tried, passed, silent losses, and each case.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path

from benchmarks.results import print_table, write_result

POINTS = ("ingest:recorded", "features-teacher:mid", "train:start", "train:registered", "gate-gem_teacher:mid",
          "knowledge:mid", "knowledge:window-written", "distill:registered", "gate-student_feed:mid",
          "feed:recorded", "promote:mid", "promote:moved", "promote:recorded", "external:mid-train",
          "fail@distill-video:mid", "fail@gate-student_video:decided")
SURFACES = "feed,video"
# the tiny run's holdout has a handful of clicks: the real floors would promote nothing
BENCH_GATE = {"min_positives": 1, "min_negatives": 1, "max_ne": 10.0, "min_calibration": 0.0,
              "max_calibration": 100.0, "min_auc": 0.0, "min_auc_gain": -1.0, "max_ne_increase": 10.0}
# `python -m gem pipeline run --preset tiny --surfaces feed,video` with the bench's gate settings
RUNNER = ("import json, sys; from gem_app.pipelines.local import run_gem_pipeline; "
          "run_gem_pipeline(sys.argv[1], **json.loads(sys.argv[2]))")


def _pipeline(workspace: Path, data: Path, fault: str = "") -> subprocess.CompletedProcess:
    from gem_app.pipelines.local import PRESETS

    env = {**os.environ, "GEM_FAULT": fault} if fault else dict(os.environ)
    params = {**PRESETS["tiny"], "data": str(data), "surfaces": SURFACES.split(","), "gate_settings": BENCH_GATE}
    cmd = [sys.executable, "-c", RUNNER, str(workspace), json.dumps(params)]
    if fault != "external:mid-train":
        return subprocess.run(cmd, env=env, capture_output=True, text=True, start_new_session=True)
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    marker = workspace / ".stages" / "teacher.train-run.json"
    while not marker.exists() and proc.poll() is None:
        time.sleep(0.5)
    time.sleep(2.0)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    return subprocess.CompletedProcess(cmd, -9, "", "")


def aliases(workspace: Path) -> dict:
    """Every registered model's aliases (alias -> version) in the workspace's store."""
    import mlflow

    from gem import registry, tracking

    if not (workspace / "mlflow.db").is_file():
        return {}
    tracking.configure(workspace, experiment=registry.EXPERIMENT)
    models = mlflow.MlflowClient().search_registered_models()
    found = {m.name: {k: str(v) for k, v in m.aliases.items()} for m in models}
    mlflow.set_tracking_uri("")
    return {name: moved for name, moved in found.items() if moved}


def snapshot(workspace: Path) -> dict:
    """What must not differ: the summary's figures and decisions and the registry's state."""
    import mlflow

    from gem import registry, tracking

    summary = json.loads((workspace / "summary.json").read_text())
    rows = [{k: (round(v, 6) if isinstance(v, float) else v) for k, v in row.items()} for row in summary["surfaces"]]
    tracking.configure(workspace, experiment=registry.EXPERIMENT)
    client = mlflow.MlflowClient()
    models = {}
    for model in client.search_registered_models():
        versions = sorted(int(v.version) for v in client.search_model_versions(f"name='{model.name}'"))
        models[model.name] = {"versions": versions, "aliases": {k: str(v) for k, v in model.aliases.items()}}
    mlflow.set_tracking_uri("")
    return {"rows": rows, "registry": models}


def invariants(workspace: Path) -> list[str]:
    """What breaks the registry's rules in the workspace's store (gem_app.promotion
    ``registry_problems``: one champion per model, a challenger never the champion and
    newer than it, the decisions written on the versions matching their aliases, no
    commit journal left); [] when none."""
    import mlflow

    from gem import registry, tracking
    from gem_app.promotion import registry_problems
    from gem_app.stages.late_data import COMMIT_DIR

    if not (workspace / "mlflow.db").is_file():
        return []
    tracking.configure(workspace, experiment=registry.EXPERIMENT)
    problems = registry_problems(journal_dir=workspace / COMMIT_DIR)
    mlflow.set_tracking_uri("")
    return problems


def _recover(workspace: Path) -> None:
    import mlflow

    from gem import registry, tracking
    from gem_app.promotion import recover

    tracking.configure(workspace, experiment=registry.EXPERIMENT)
    recover(workspace / ".runs")
    mlflow.set_tracking_uri("")


def other_gate_passed(workspace: Path, failed: str = "student_video") -> bool:
    """Whether a surface's gate other than ``failed``'s finished with decision promote
    before the failing gate's run ended (the case "one surface's gate fails after another
    surface passed")."""
    import mlflow

    from gem import registry, tracking

    tracking.configure(workspace, experiment=registry.EXPERIMENT)
    runs = {r.info.run_name: r for r in mlflow.search_runs(experiment_names=[registry.EXPERIMENT],
                                                           output_format="list")}
    mlflow.set_tracking_uri("")
    failing = runs.get(f"gate-{failed}")
    ended = failing.info.end_time if failing and failing.info.end_time else float("inf")
    return any(name.startswith("gate-student_") and name != f"gate-{failed}" and r.info.status == "FINISHED"
               and r.data.tags.get("gate.decision") == "promote" and (r.info.end_time or 0) <= ended
               for name, r in runs.items())


def fault_case(ws: Path, data: Path, point: str, reference: dict) -> dict:
    """One fault point: the faulted run (killed or failing there), then the rerun."""
    killed = _pipeline(ws, data, point)
    case = {"case": f"fault:{point}", "killed_rc": killed.returncode}
    if point.startswith("promote:"):
        # killed between two alias moves of the commit: what the next start (any run, a
        # refresh cycle) does first is to undo it from the commit's journal
        case["journal_left"] = (ws / ".runs" / "promotion-journal.json").is_file()
        case["aliases_before_recovery"] = aliases(ws)
        _recover(ws)
    after_fault = aliases(ws)  # a fresh workspace: no alias may exist
    case["aliases_after_fault"] = after_fault
    case["registry_problems_after_fault"] = invariants(ws)  # after the recovery, for promote:*
    if point.startswith("fail@gate-"):
        case["other_surface_passed"] = other_gate_passed(ws)
    rerun = _pipeline(ws, data)
    ok = rerun.returncode == 0 and (ws / "summary.json").is_file()
    case["registry_problems"] = invariants(ws) if ok else []
    broken = case["registry_problems_after_fault"] + case["registry_problems"]
    same = ok and snapshot(ws) == reference
    outcome = ("fault not reached" if killed.returncode == 0 else "moved aliases" if after_fault
               else "registry rules broken" if broken else "passed" if same else "silent loss" if ok else "failed")
    return {**case, "rerun_rc": rerun.returncode, "outcome": outcome,
            "stderr_tail": "" if ok else rerun.stderr[-1500:]}


def reliability_tests(out: Path) -> dict:
    """Every test of tests/reliability and every registered case (tests/reliability/cases.py,
    some live beside the code they test). A failed case of a registered ``kind`` counts as
    that kind: a silent wrong result or loss, or an unclear error."""
    from tests.reliability.cases import CASES

    xml = out / "reliability-tests.xml"
    elsewhere = sorted({c.node for c in CASES if not c.node.startswith("tests/reliability/")})
    subprocess.run([sys.executable, "-m", "pytest", "-q", "tests/reliability", *elsewhere, f"--junitxml={xml}",
                    "-p", "no:cacheprovider"], capture_output=True, text=True)
    registered = {c.node: c for c in CASES}
    cases = []
    for case in ET.parse(xml).getroot().iter("testcase"):
        failed = case.find("failure") is not None or case.find("error") is not None
        skipped = case.find("skipped") is not None
        node = f"{case.get('classname').replace('.', '/')}.py::{case.get('name')}"
        known = registered.get(node)
        outcome = "failed" if failed else "skipped" if skipped else "passed"
        if failed and known is not None and known.kind:
            outcome = known.kind
        cases.append({"case": node, "outcome": outcome,
                      **({"issue": known.issue, "defect": known.defect, "id": known.id} if known else {})})
    return {"cases": cases, "tried": len(cases), "passed": sum(c["outcome"] == "passed" for c in cases)}


def fault_cases(tmp: Path, points: list[str]) -> list[dict] | None:
    """The reference run, then each fault point against it (None: the reference failed)."""
    from gem.config import load_config
    from gem.data.simulate import SimulatorConfig, simulate

    data = tmp / "data"
    simulate(load_config(SimulatorConfig, section="simulator", preset="tiny", overrides=["days=4"]), data,
             progress=False)
    reference_run = _pipeline(tmp / "reference", data)
    if reference_run.returncode != 0:
        print(reference_run.stderr[-3000:], file=sys.stderr)
        return None
    reference = snapshot(tmp / "reference")
    if problems := invariants(tmp / "reference"):
        print(f"the reference run broke the registry's rules: {problems}", file=sys.stderr)
        return None
    if not all(m["aliases"].get("champion") for m in reference["registry"].values()):
        print(f"the reference run did not promote every model: {reference['registry']}", file=sys.stderr)
        return None
    faults = []
    for point in points:
        faults.append(fault_case(tmp / point.replace(":", "_").replace("@", "_"), data, point, reference))
        print(f"[reliability] {point}: {faults[-1]['outcome']}", flush=True)
    return faults


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--points", default=None,
                        help="fault points (comma-separated; default all); with --faults-from: these are run "
                             "again and replace or join the earlier file's fault cases")
    parser.add_argument("--no-tests", action="store_true", help="skip the tests/reliability cases")
    parser.add_argument("--faults-from", type=Path, default=None,
                        help="rerun the defect tests only; the fault points' cases are those of this earlier "
                             "reliability.json (its written_at is recorded as faults_recorded_at)")
    args = parser.parse_args(argv)
    points = [p for p in (args.points or ",".join(POINTS)).split(",") if p]
    started = time.perf_counter()
    earlier = json.loads(args.faults_from.read_text()) if args.faults_from else None
    with tempfile.TemporaryDirectory(prefix="gem-reliability-") as tmp:
        tmp = Path(tmp)
        tests = {"cases": [], "tried": 0, "passed": 0} if args.no_tests else reliability_tests(tmp)
        if earlier is not None:
            faults = [c for c in earlier["cases"] if c["case"].startswith("fault:")]
            if args.points:  # run these points now; the other points' cases as recorded earlier
                fresh = fault_cases(tmp, points)
                if fresh is None:
                    return 1
                faults = [c for c in faults if c["case"] not in {f["case"] for f in fresh}] + fresh
        else:
            faults = fault_cases(tmp, points)
            if faults is None:
                return 1
    cases = tests["cases"] + faults
    figures = {"cases_tried": len(cases), "cases_passed": sum(c["outcome"] == "passed" for c in cases),
               "silent_losses": sum(c["outcome"] == "silent loss" for c in cases),
               "faults_that_moved_aliases": sum(c["outcome"] == "moved aliases" for c in faults),
               "registry_rules_broken": sum(c["outcome"] == "registry rules broken" for c in faults),
               "silent_wrong_results": sum(c["outcome"] == "silent wrong result" for c in cases),
               "unclear_errors": sum(c["outcome"] == "unclear error" for c in cases),
               "fault_points": len(faults), "fault_points_passed": sum(c["outcome"] == "passed" for c in faults),
               "defect_tests": tests["tried"], "defect_tests_passed": tests["passed"], "cases": cases,
               "seconds": time.perf_counter() - started,
               **({"faults_recorded_at": earlier.get("written_at", "")} if earlier is not None else {})}
    path = write_result("reliability", figures, sizes={"pipeline": "tiny", "simulator_days": 4, "surfaces": SURFACES,
                                                       "gate_settings": BENCH_GATE})
    print_table(f"reliability ({path})", [(k, figures[k]) for k in (
        "cases_tried", "cases_passed", "silent_losses", "silent_wrong_results", "unclear_errors",
        "faults_that_moved_aliases", "registry_rules_broken", "fault_points_passed", "defect_tests_passed")])
    return 0 if figures["cases_passed"] == figures["cases_tried"] else 1


if __name__ == "__main__":
    sys.exit(main())
