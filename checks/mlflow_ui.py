"""What a person sees in a pipeline run's MLflow UI, checked in a real browser (issue 41, item 7).

    python -m checks.mlflow_ui WORKSPACE --out docs/ui-check      # or: make ui-check WORKSPACE=...

Starts the `mlflow ui` that the pipeline prints, on WORKSPACE/mlflow.db (a free loopback port, one
worker), opens it in headless Chromium (Debian's, driven by Playwright) with a fresh profile, and
records each check as PASS or FAIL with what the pages showed: a screenshot per page in OUT, the
table in OUT/README.md; exits 1 when a check fails. Pages are read as text. The REST API finds ids
and URLs; where it supplies a figure the table says "(REST)". Check g loads the registered models
outside the browser.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import functools
import json
import os
import re
import socket
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
import warnings
from importlib.metadata import version as installed
from pathlib import Path
from types import SimpleNamespace

from gem import tracking

EXPERIMENT = "gem-pipeline"
HEADLINE = ("teacher/holdout_auc", "teacher/holdout_ne", "students/mean_auc", "students/mean_lift",
            "decisions/promote", "decisions/keep", "decisions/not_enough_evidence", "decisions/none_trained")
SHARED = {f"holdout/{f}" for f in ("auc", "ne", "calibration", "rows", "positives", "negatives")}
GENAI = ("Token Usage", "Tokens per Trace", "Cost Breakdown")  # panels of the GenAI overview
DATE = r"\d{4}-\d{2}-\d{2}(?:[T ][0-9:.]+)?(?:Z|[+-]\d{2}:\d{2})?"
WINDOW = re.compile(rf"^{DATE}\.\.{DATE}$")
# a fresh profile, less the assistant's side panel (it would cover a third of every screenshot)
QUIET = ("localStorage.setItem('mlflow.assistant.fab.autoOpenedOnFirstLoad_v1', 'true');"
         "localStorage.setItem('mlflow.assistant.panelOpen_v1', 'false');")


def rest(url: str, endpoint: str, body: dict | None = None, raw: bool = False, **query):
    """The server's REST API (GET with query, or POST with a JSON body)."""
    request = urllib.request.Request(f"{url}{endpoint}?{urllib.parse.urlencode(query)}", body and json.dumps(body)
                                     .encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as r:
        return r.read() if raw else json.loads(r.read())


def kv(items: list[dict] | None) -> dict[str, str]:
    return {i["key"]: i["value"] for i in items or []}


@contextlib.contextmanager
def mlflow_ui(store: Path, log: Path):
    """The pipeline's `mlflow ui` command on a free loopback port; yields (url, command)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [str(Path(sys.executable).parent / "mlflow"), "ui", "--backend-store-uri", f"sqlite:///{store}",
           "--host", "127.0.0.1", "--port", str(port), "--workers", "1"]
    env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}  # no job runner: ~0.5 GB, not 3
    env.pop("MLFLOW_TRACKING_URI", None)
    with open(log, "w") as out, tempfile.TemporaryDirectory() as cwd:  # whatever it writes lands there
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=cwd, start_new_session=True)
        url, deadline = f"http://127.0.0.1:{port}", time.monotonic() + 120
        try:
            while True:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit(f"mlflow ui did not come up: {log.read_text()[-2000:]}")
                with contextlib.suppress(OSError), urllib.request.urlopen(f"{url}/health", timeout=2):
                    break
                time.sleep(0.5)
            yield url, " ".join(["mlflow", *cmd[1:]])
        finally:
            os.killpg(proc.pid, 15)
            proc.wait(30)


class Browser:
    def __init__(self, page, url: str, out: Path, workspace: str):
        self.page, self.url, self.out, self.ws = page, url, out, workspace
        self.shots, self.reloads, self.visits = [], [], 0

    def open(self, route: str, *wait_for: str) -> str:
        """Load a page afresh (after a change of the hash alone, the app kept showing the previous image
        or drawer), wait until its text shows one of `wait_for`; the page's text."""
        self.visits += 1
        self.page.goto(f"{self.url}/?visit={self.visits}#{route}")
        self.wait(*wait_for)
        return self.page.inner_text("body")

    def wait(self, *texts: str, retry: bool = True) -> None:
        try:
            self.page.wait_for_function("ts => ts.some(t => document.body.innerText.includes(t))", arg=texts,
                                        timeout=45_000)
        except Exception:
            if not retry:
                raise
            self.reloads.append(self.page.url.split("#", 1)[-1])  # came up empty: reload, as a person would
            self.page.reload()
            return self.wait(*texts, retry=False)
        self.page.wait_for_timeout(1000)  # the page's other requests
        got_it = self.page.get_by_role("button", name="Got it")  # a feature tour's popover
        if got_it.count() and got_it.first.is_visible():
            got_it.first.click()

    def shot(self, name: str) -> None:
        self.page.screenshot(path=self.out / name)
        self.shots.append(name)

    def keys(self, query: str = "") -> dict[str, str]:
        """The run page's metrics table (key: value), after typing `query` in its search box."""
        box = self.page.get_by_placeholder("Search metrics")
        if query:
            box.fill(query)
            self.page.wait_for_timeout(800)
        table = box.locator("xpath=ancestor::div[.//div[@role='table']][1]").locator("[role=table]").first
        rows = [r.split("\n") for r in table.locator("[role=row]").evaluate_all("rs => rs.map(r => r.innerText)")]
        return {r[0]: r[1] for r in rows[1:] if len(r) > 1}

    def paths(self, text: str) -> list[str]:
        """`key = path` for each workspace path on a page (key: the line before); MLflow's own "Path:"
        lines (where it keeps an artifact or where a dataset came from) left out."""
        lines = text.splitlines()
        return [f"{lines[i - 1].strip()} = {m}" for i, line in enumerate(lines) if not line.startswith("Path:")
                for m in re.findall(rf"{re.escape(self.ws)}[^\s\"',]*", line)]


def section(text: str, start: str, end: str) -> str:
    return text.split(start, 1)[1].split(end, 1)[0] if start in text else ""


def overview(text: str) -> dict[str, str]:
    """A run page's params (rows: key, value) and tags (key, ': value')."""
    params = section(text, "\nParameter\nValue\n", "\nAbout this run\n").splitlines()
    tags = section(text, "\nTags\n", "\nRegistered models\n").splitlines()
    return {**dict(zip(params[::2], params[1::2])),
            **{k: v.removeprefix(": ") for k, v in zip(tags[::2], tags[1::2]) if v.startswith(": ")}}


def find(ui: Browser, api) -> SimpleNamespace:
    """The ids and URLs the checks need (REST): the newest pipeline run and its stages, the registry."""
    exp = api("/api/2.0/mlflow/experiments/get-by-name", experiment_name=EXPERIMENT)["experiment"]
    runs = api("/api/2.0/mlflow/runs/search", {"experiment_ids": [exp["experiment_id"]], "max_results": 1000})["runs"]
    parent = max((r for r in runs if kv(r["data"].get("tags")).get("gem.stage") == "pipeline"),
                 key=lambda r: int(r["info"]["start_time"]))["info"]["run_id"]  # the newest pipeline run
    runs = [r for r in runs if parent in (r["info"]["run_id"], kv(r["data"].get("tags")).get("mlflow.parentRunId"))]
    tags = {r["info"]["run_id"]: kv(r["data"].get("tags")) for r in runs}
    aliases = {m["name"]: {a["alias"]: a["version"] for a in m.get("aliases", [])}
               for m in api("/api/2.0/mlflow/registered-models/search", max_results=100)["registered_models"]}
    s = SimpleNamespace(ui=ui, api=api, exp=exp, eid=exp["experiment_id"], parent=parent, runs=runs, tags=tags,
                        aliases=aliases, name={r["info"]["run_id"]: r["info"]["run_name"] for r in runs},
                        stage={t.get("gem.stage", ""): r for r, t in tags.items()},
                        versions=[v for m in aliases for v in api("/api/2.0/mlflow/model-versions/search",
                                                                  filter=f"name='{m}'")["model_versions"]])
    s.run_page = lambda rid: ui.open(f"/experiments/{s.eid}/runs/{rid}", "Parameters (")
    s.notes = []
    return s


def check_experiment(s: SimpleNamespace, add) -> None:
    """a. Where a fresh browser opens the experiment; its description; the parent run listed first."""
    ui, parent = s.ui, s.parent
    ui.open("/experiments", EXPERIMENT)
    rows = ui.page.locator("[role=row]").evaluate_all(
        "rs => rs.map(r => [...r.querySelectorAll('[role=cell],[role=columnheader]')].map(c => c.innerText))")
    desc = next((r[rows[0].index("Description")] for r in rows[1:] if EXPERIMENT in r), "(no row)")
    ui.page.get_by_role("link", name=EXPERIMENT).first.click()
    ui.wait("matching runs", *GENAI)
    clicked, genai = ui.page.url.split("#", 1)[1], [w for w in GENAI if w in ui.page.inner_text("body")]
    # MLflow 3.17 keeps one workflow type per browser (localStorage, GenAI on a fresh profile), whatever the
    # experiment's kind; a store cannot change it. The run prints a link that opens the training view.
    s.notes.append(f"from the experiments list a fresh profile lands on `{clicked}` (GenAI panels: "
                   f"{genai or 'none'}): MLflow's per-browser default, which no store setting changes")
    link = tracking.ui_link(s.eid, base=ui.url.rstrip("/"))
    ui.page.goto(link)
    ui.wait("matching runs", *GENAI)
    landed, genai = ui.page.url.split("#", 1)[1], [w for w in GENAI if w in ui.page.inner_text("body")]
    ui.shot("01-experiment-opens.png")
    add("a", "the link the run prints opens the experiment in the model-training view, not the GenAI dashboard",
        "/runs" in landed and "workflowType=genai" not in landed and not genai,
        f"`{link.split('#', 1)[1]}` landed on `{landed}`; GenAI panels: {genai or 'none'}")
    add("a", "the experiment has a description", desc.strip() not in ("", "-", "(no row)"),
        f"experiments list, Description column: `{desc[:160]}`")
    text = ui.open(f"/experiments/{s.eid}/runs", "matching runs")
    first = ui.page.locator('a[href*="/runs/"]').first
    add("a", "the parent run is listed first", (first.get_attribute("href") or "").endswith(parent),
        f"first row: `{first.inner_text()}`, the pipeline run: {(first.get_attribute('href') or '').endswith(parent)}; "
        + re.search(r"\d+ matching runs", text).group(0))
    ui.shot("02-runs.png")


def check_parent(s: SimpleNamespace, add) -> None:
    """b. The parent run's page: the run's summary as its description, the headline metrics."""
    ui, parent, name = s.ui, s.parent, s.name
    summary = section(s.run_page(parent), "\nDescription\n", "\nMetrics (")
    metrics = ui.keys()
    surfaces = sorted({t["gem.surface"] for t in s.tags.values() if t.get("gem.stage", "").startswith("distill-")})
    listed = [x for x in surfaces if re.search(rf"^{x}\t", summary, re.M)]
    ui.shot("03-parent-run.png")
    add("b", "the parent run's description is the run's summary",
        "Teacher:" in summary and "decision\twhy" in summary and listed == surfaces,
        f"`{name[parent]}`: `{summary.strip().splitlines()[0] if summary.strip() else ''}`, teacher line: "
        f"{'Teacher:' in summary}, a row per surface with a student: {listed} of {surfaces}")
    missing = [k for k in HEADLINE if k not in metrics]
    add("b", "the parent run shows the headline metrics", not missing,
        "; ".join(f"{k} {float(metrics[k]):.4g}" for k in HEADLINE if k in metrics) + f"; missing: {missing or 'none'}")


def check_shared_names(s: SimpleNamespace, add) -> None:
    """c. The teacher's run and the students' runs: one name per holdout figure."""
    ui, name, stage = s.ui, s.name, s.stage
    teacher = next((r for r, t in s.tags.items() if t.get("gem.model_role") == "teacher"), stage.get("train"))
    s.run_page(teacher)
    keys = {k for k in ui.keys("holdout/") if k.startswith("holdout/")}
    ui.shot("04-teacher-holdout-metrics.png")
    shared = {}
    for rid in sorted((r for st, r in stage.items() if st.startswith("distill-")), key=name.get):
        s.run_page(rid)
        shared[name[rid]] = keys & set(ui.keys("holdout/"))
    add("c", "teacher and student runs share the holdout metric names",
        bool(shared) and all(SHARED <= x for x in shared.values()),
        f"`{name[teacher]}` shows {len(keys)} holdout/ keys ({', '.join(sorted(k[8:] for k in keys))}); "
        + "; ".join(f"`{n}` shares {len(x & SHARED)} of {len(SHARED)}" + f", lacks {sorted(SHARED - x)}" *
                    bool(SHARED - x) for n, x in shared.items()))


def check_plots(s: SimpleNamespace, add) -> None:
    """d. The plots (PNG artifacts) render, each at its own size."""
    ui, name = s.ui, s.name
    plots = [(r, f["path"]) for r in sorted(s.tags, key=name.get)
             for f in s.api("/api/2.0/mlflow/artifacts/list", run_id=r, path="plots").get("files", [])
             if f["path"].endswith(".png")]
    rendered, blank = set(), []
    for rid, path in plots:
        ui.open(f"/experiments/{s.eid}/runs/{rid}/artifacts/{path}", path.rsplit("/", 1)[1])
        png = s.api("/get-artifact", raw=True, path=path, run_uuid=rid)
        w, h = int.from_bytes(png[16:20], "big"), int.from_bytes(png[20:24], "big")  # from the PNG header
        try:
            ui.page.wait_for_function("s => [...document.images].some(i => i.naturalWidth == s[0] && "
                                      "i.naturalHeight == s[1])", arg=[w, h], timeout=20_000)
            rendered.add(f"{path} ({w}x{h})")
            if "roc" in path and "05-roc-calibration-plot.png" not in ui.shots:
                ui.shot("05-roc-calibration-plot.png")
        except Exception:
            blank.append(f"`{name[rid]}` {path}")
    kinds = [k for k in ("roc", "calibration", "lift") if any(k in p for p in rendered)]
    add("d", "the ROC / calibration / lift plots are artifacts and render", plots and not blank and len(kinds) == 3,
        f"{len(plots) - len(blank)} of {len(plots)} PNGs shown at their own size: {', '.join(sorted(rendered))}; "
        f"kinds shown: {kinds}; not shown: {blank or 'none'}")


def check_provenance(s: SimpleNamespace, add) -> None:
    """e. Params and datasets; no machine paths; one spelling for a missing champion and for a window."""
    ui, name, stage = s.ui, s.name, s.stage
    pages = {rid: s.run_page(rid) for rid in sorted(s.tags, key=name.get)}
    seen, drawers = [], []
    for rid in [r for st, r in sorted(stage.items()) if st.startswith("features-") or st in ("feast", "knowledge")]:
        inputs = s.api("/api/2.0/mlflow/runs/get", run_id=rid)["run"].get("inputs", {}).get("dataset_inputs", [])
        seen.append((name[rid], int(re.search(r"Parameters \((\d+)\)", pages[rid]).group(1)),
                     sorted({d["dataset"]["name"] for d in inputs})))
        if inputs and (not drawers or name[rid] == "knowledge"):  # a source dataset and a features window
            data = inputs[0]["dataset"]
            s.run_page(rid)
            ui.page.get_by_text(f"{data['name']} ({data['digest']})").first.click()
            drawer = ui.page.locator("[role=dialog]").first
            drawer.wait_for()
            ui.page.wait_for_timeout(1000)
            drawers.append((name[rid], data["name"], [ln for ln in drawer.inner_text().splitlines()
                                                      if re.search("profile|schema|rows|Path:", ln)]))
            if len(drawers) == 1:
                ui.shot("06-dataset-drawer.png")
    add("e", "the features, feast and knowledge runs have params and datasets",
        len(seen) >= 3 and all(n and d for _, n, d in seen),
        "; ".join(f"`{r}` {n} params, datasets {', '.join(d) or 'none'}" for r, n, d in seen))
    add("e", "the dataset drawer shows a row count or a schema",
        drawers and all(not {"No profile available", "No schema available"} <= set(ls) for *_, ls in drawers),
        "; ".join(f"`{r}` {d}: {', '.join(ls)}" for r, d, ls in drawers))

    paths = [f"`{name[r]}` page: {p}" for r, text in pages.items() for p in ui.paths(text)]
    for v in s.versions:  # a version's page (its tags) and its logged model's input example
        paths += [f"`{v['name']}` v{v['version']} page: {p}" for p in
                  ui.paths(ui.open(f"/models/{v['name']}/versions/{v['version']}", "Source Run"))]
        ui.open(f"/experiments/{s.eid}/models/{v['source'].removeprefix('models:/')}/artifacts", "input_example.json")
        ui.page.get_by_text("input_example.json", exact=True).first.click()
        ui.wait('"inputs"')
        example = sorted({p.split(" = ")[-1] for p in ui.paths(ui.page.inner_text("body"))})
        paths += [f"`{v['name']}` v{v['version']} input example: {', '.join(example)}"] * bool(example)
    ui.shot("07-input-example.png")
    paths += [f"`{name[r['info']['run_id']]}` (REST) {k} = {t}" for r in s.runs for kind in ("params", "tags")
              for k, t in kv(r["data"].get(kind)).items()  # anything a page left out
              if ui.ws in t and k != "mlflow.note.content" and not any(f"{k} = {t}" in p for p in paths)]
    add("e", f"no machine paths (`{ui.ws}`) in params, tags or input examples", not paths,
        "; ".join(paths) or "none on the run pages, version pages or input examples")

    values = [(k, t) for text in pages.values() for k, t in overview(text).items()]
    values += [(k, t) for v in s.versions for k, t in kv(v.get("tags")).items()]  # (REST)
    champion_keys = sorted({k for k, _ in values if re.search("champion|against", k) and "require" not in k})
    missing = sorted({t for k, t in values if k in champion_keys and not re.match(r"(models:/|m-|v?\d+$)", t)})
    add("e", "a missing champion is spelled one way", len(missing) <= 1,
        f"keys {champion_keys} (version tags via REST) hold, for no champion: {missing}")
    windows = sorted({k for k, t in values if "window" in k and WINDOW.match(t)})
    other = sorted({f"{k} = {t}" for k, t in values if "window" in k and re.search(DATE, t) and not WINDOW.match(t)})
    add("e", "windows are spelled one way (start..end)", not other,
        f"{len(windows)} keys as start..end ({', '.join(windows)}); other spellings: {other or 'none'}")


def check_registry(s: SimpleNamespace, add) -> None:
    """f. The registry: every model's aliases; the teacher version's holdout figures."""
    ui, aliases, versions = s.ui, s.aliases, s.versions
    ui.open("/models", "Aliased versions")
    rows = {r.split("\n")[0]: r for r in ui.page.locator("[role=row]").evaluate_all("rs => rs.map(r => r.innerText)")}
    shown = {m: sorted(re.sub(r"\s", "", a) for a in re.findall(r"@\s*[\w-]+", rows.get(m, ""))) for m in aliases}
    ui.shot("08-registered-models.png")
    add("f", "every registered model shows its aliases",
        aliases and all(shown[m] and shown[m] == sorted(f"@{a}" for a in aliases[m]) for m in aliases),
        "; ".join(f"{m}: {' '.join(shown[m]) or 'no alias'}" for m in sorted(aliases)))
    version = aliases.get("gem_teacher", {}).get("champion") or max(
        (int(v["version"]) for v in versions if v["name"] == "gem_teacher"), default=1)
    desc = section(ui.open(f"/models/gem_teacher/versions/{version}", "Source Run"), "\nDescription", "\nTags\n")
    figures = re.search(r"Holdout[^\n]*AUC \d\.\d+, NE \d\.\d+[^\n]*", desc)
    ui.shot("09-teacher-version.png")
    add("f", "the teacher version's description holds its holdout figures", figures,
        f"gem_teacher v{version}: `{figures.group(0) if figures else desc.strip()[:200]}`")


def check_loading(store: Path, s: SimpleNamespace, add) -> None:
    """g. Loading every version and alias leaves the store's artifacts as they were (outside the browser)."""
    os.environ["MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR"] = "false"
    import mlflow

    mlflow.set_tracking_uri(f"sqlite:///{store}")
    mlflow.set_registry_uri(f"sqlite:///{store}")
    root = urllib.parse.urlparse(s.exp["artifact_location"])
    roots = [Path(root.path)] if root.scheme in ("", "file") else []
    tree = lambda: {str(p): (p.stat().st_size, p.stat().st_mtime_ns) for root in roots for p in root.rglob("*")}
    uris = [f"models:/{v['name']}/{v['version']}" for v in s.versions]
    uris += [f"models:/{m}@{a}" for m in s.aliases for a in s.aliases[m]]
    before = tree()
    with warnings.catch_warnings(record=True):  # MLflow's advice on type hints, once per model
        loaded = [u for u in uris if mlflow.pyfunc.load_model(u)]
    after = tree()
    changed = sorted(p for p in before.keys() | after.keys() if before.get(p) != after.get(p))
    add("g", "loading the registered models leaves the store's artifacts as they were", roots and not changed,
        f"loaded {len(loaded)} with mlflow.pyfunc.load_model ({', '.join(u[8:] for u in uris)}); artifact tree: "
        f"{len(before)} entries before, {len(after)} after, changed: {changed[:5] or 'none'}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m checks.mlflow_ui", description=__doc__.split("\n")[0])
    ap.add_argument("workspace", type=Path, help="a pipeline run's workspace (holds mlflow.db)")
    ap.add_argument("--out", type=Path, default=Path("docs/ui-check"), help="screenshots and README.md go here")
    ap.add_argument("--chromium", default=os.environ.get("CHROMIUM", "/usr/bin/chromium"))
    args = ap.parse_args(argv)
    store = (args.workspace / "mlflow.db").resolve()
    if not store.is_file():
        ap.error(f"no MLflow store at {store}: run the pipeline first (make run)")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        ap.error("playwright is not installed: make ui-check INSTALL_BROWSER=1 (or pip install '.[ui-check]')")
    if not Path(args.chromium).is_file():
        ap.error(f"no Chromium at {args.chromium}: make ui-check INSTALL_BROWSER=1 (or apt-get install chromium)")
    args.out.mkdir(parents=True, exist_ok=True)
    for old in args.out.glob("*.png"):
        old.unlink()
    checks, found = [], None

    def add(item: str, title: str, ok, saw: str) -> None:
        checks.append((item, title, bool(ok), saw))
        print(f"{'PASS' if ok else 'FAIL'}  {item}. {title}: {saw}", flush=True)

    with tempfile.TemporaryDirectory() as tmp, mlflow_ui(store, Path(tmp) / "mlflow-ui.log") as (url, command):
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=args.chromium, headless=True)
            page = browser.new_page(viewport={"width": 1400, "height": 900})
            page.add_init_script(QUIET)
            ui = Browser(page, url, args.out, str(store.parent))
            try:
                found = find(ui, functools.partial(rest, url))
                for check in (check_experiment, check_parent, check_shared_names, check_plots, check_provenance,
                              check_registry):
                    check(found, add)
            except Exception as e:  # the page it stopped on is evidence too
                ui.shot("99-stopped-here.png")
                add("-", "the check ran to its end", False,
                    f"stopped on `{page.url}`: {type(e).__name__}: {str(e).splitlines()[0]}")
            chromium = browser.version
            browser.close()
    if found:
        check_loading(store, found, add)
    runs = found.tags if found else {}
    tags = runs.get(found.parent, {}) if found else {}
    dirty = ", with uncommitted changes" * any(t.get("gem.git_dirty") == "true" for t in runs.values())
    cell = lambda s: str(s).replace("|", "\\|").replace("\n", " ")
    facts = {"store": f"`{store}`, pipeline run `{found.name[found.parent] if found else '?'}` (code "
                      f"{tags.get('mlflow.source.git.commit', '?')[:7]}{dirty})",
             "server": f"`{command}`",
             "browser": f"Chromium {chromium} (`{args.chromium}`), headless, driven by Playwright "
                        f"{installed('playwright')}; a fresh profile, viewport 1400x900; MLflow {installed('mlflow')}",
             "when": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
             "pages reloaded once (empty at first)": ", ".join(f"`{r}`" for r in ui.reloads) or "none",
             "screenshots": ", ".join(f"[{s}]({s})" for s in ui.shots)}
    if found and found.notes:
        facts["noted"] = "; ".join(found.notes)
    passed = sum(ok for _, _, ok, _ in checks)
    (args.out / "README.md").write_text("\n".join([
        "# MLflow UI check", "", "What a person sees in the MLflow UI of a pipeline run's store, checked in headless "
        "Chromium by `python -m checks.mlflow_ui` (`make ui-check`, docs/pipelines.md); this file is its output.", "",
        *[f"- {k}: {v}" for k, v in facts.items()], f"- result: **{passed} of {len(checks)} checks pass**", "",
        "| item | check | result | what the browser showed |", "|---|---|---|---|",
        *[f"| {i} | {cell(t)} | {'PASS' if ok else '**FAIL**'} | {cell(s)} |" for i, t, ok, s in checks], ""]))
    print(f"{passed} of {len(checks)} checks pass; {args.out / 'README.md'}")
    return 0 if passed == len(checks) else 1


if __name__ == "__main__":
    sys.exit(main())
