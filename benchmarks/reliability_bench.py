"""Reliability: the defect cases of tests/reliability, and fault injection on the real
pipeline.

Fault injection: one uninterrupted `gem pipeline run --preset tiny` on a fixed simulated
dataset is the reference. Then, for each fault point, a fresh workspace runs the same
pipeline with ``GEM_FAULT=<point>`` (the whole run dies by SIGKILL there, see
gem_app/stages/context.py ``fault_point``) or is killed from outside mid-training, and is
rerun without the fault. The rerun must succeed, and its summary and registry (versions
per model, champion aliases) must equal the reference's. A rerun that succeeds with a
different result is a silent loss (goal: 0).

    python -m benchmarks.reliability_bench [--points ingest:recorded,train:registered,...]

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

POINTS = ("ingest:recorded", "features-teacher:mid", "train:start", "train:registered", "knowledge:mid",
          "distill:registered", "gate-feed:mid", "feed:recorded", "external:mid-train")
SURFACES = "feed,video"


def _pipeline(workspace: Path, data: Path, fault: str = "") -> subprocess.CompletedProcess:
    env = {**os.environ, "GEM_FAULT": fault} if fault else dict(os.environ)
    cmd = [sys.executable, "-m", "gem", "pipeline", "run", "--workspace", str(workspace), "--data", str(data),
           "--preset", "tiny", "--surfaces", SURFACES]
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


def snapshot(workspace: Path) -> dict:
    """What must not differ: the summary's figures and the registry's state."""
    import mlflow

    from gem import registry, tracking

    summary = json.loads((workspace / "summary.json").read_text())
    rows = [{k: (round(v, 6) if isinstance(v, float) else v) for k, v in row.items()} for row in summary["surfaces"]]
    tracking.configure(workspace, experiment=registry.EXPERIMENT)
    client = mlflow.MlflowClient()
    models = {}
    for model in client.search_registered_models():
        versions = sorted(int(v.version) for v in client.search_model_versions(f"name='{model.name}'"))
        models[model.name] = {"versions": versions, "champion": registry.champion_version(model.name)}
    mlflow.set_tracking_uri("")
    return {"rows": rows, "registry": models}


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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--points", default=",".join(POINTS), help="fault points (comma-separated)")
    parser.add_argument("--no-tests", action="store_true", help="skip the tests/reliability cases")
    args = parser.parse_args(argv)
    points = [p for p in args.points.split(",") if p]
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="gem-reliability-") as tmp:
        tmp = Path(tmp)
        tests = {"cases": [], "tried": 0, "passed": 0} if args.no_tests else reliability_tests(tmp)
        from gem.config import load_config
        from gem.data.simulate import SimulatorConfig, simulate

        data = tmp / "data"
        simulate(load_config(SimulatorConfig, section="simulator", preset="tiny", overrides=["days=4"]), data,
                 progress=False)
        reference_run = _pipeline(tmp / "reference", data)
        if reference_run.returncode != 0:
            print(reference_run.stderr[-3000:], file=sys.stderr)
            return 1
        reference = snapshot(tmp / "reference")
        faults = []
        for point in points:
            ws = tmp / point.replace(":", "_")
            killed = _pipeline(ws, data, point)
            rerun = _pipeline(ws, data)
            ok = rerun.returncode == 0 and (ws / "summary.json").is_file()
            same = ok and snapshot(ws) == reference
            faults.append({"case": f"fault:{point}", "killed_rc": killed.returncode, "rerun_rc": rerun.returncode,
                           "outcome": "passed" if same else ("silent loss" if ok else "failed"),
                           "stderr_tail": "" if ok else rerun.stderr[-1500:]})
            print(f"[reliability] {point}: {faults[-1]['outcome']}", flush=True)
    cases = tests["cases"] + faults
    figures = {"cases_tried": len(cases), "cases_passed": sum(c["outcome"] == "passed" for c in cases),
               "silent_losses": sum(c["outcome"] == "silent loss" for c in cases),
               "silent_wrong_results": sum(c["outcome"] == "silent wrong result" for c in cases),
               "unclear_errors": sum(c["outcome"] == "unclear error" for c in cases),
               "fault_points": len(faults), "fault_points_passed": sum(c["outcome"] == "passed" for c in faults),
               "defect_tests": tests["tried"], "defect_tests_passed": tests["passed"], "cases": cases,
               "seconds": time.perf_counter() - started}
    path = write_result("reliability", figures, sizes={"pipeline": "tiny", "simulator_days": 4, "surfaces": SURFACES})
    print_table(f"reliability ({path})", [(k, figures[k]) for k in (
        "cases_tried", "cases_passed", "silent_losses", "silent_wrong_results", "unclear_errors",
        "fault_points_passed", "defect_tests_passed")])
    return 0 if figures["cases_passed"] == figures["cases_tried"] else 1


if __name__ == "__main__":
    sys.exit(main())
