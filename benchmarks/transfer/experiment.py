"""The transfer experiment: GEM teachers, vertical students per arm, lifts with intervals.

Per dataset (benchmarks/transfer/worlds.py has the windows):
- the headline world (gap ``gap``): every arm, ``teacher_seeds`` teachers x ``seeds``;
- the staleness worlds (``staleness_gaps`` and the fresh-teacher control): the
  ``staleness_arms`` with ``staleness_seeds``, so the adapter's value against KD is a
  function of how old the teacher is;
- every arm: the same budget (epochs, patience, a grid of the same size) and the same
  selection on the validation slice (benchmarks/transfer/arms.py);
- every reported difference paired on the evaluation rows with a bootstrap over users
  and runs (benchmarks/transfer/analysis.py).

Everything lands in one MLflow experiment: a parent run, the teachers, one summary run
per (dataset, world, arm) whose metrics are its lifts and intervals (the comparison
view shows the arms side by side), one child run per (teacher, seed) under it with the
raw per-surface figures and the lineage; the first seed's students of the first teacher
of the headline world are registered (``student_<dataset>_<arm>_<surface>``).
"""

from __future__ import annotations

import logging
import shutil
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import torch

from benchmarks.results import bench_tracking, shared_data
from benchmarks.transfer.arms import TEACHER_FREE, ArmConfig, ArmResult, check_arms, needs_teacher, run_arm
from benchmarks.transfer.worlds import (
    DatasetConfig,
    TeacherRun,
    World,
    bucket_shards,
    build_features,
    check_world_windows,
    make_dataset,
    teacher_knowledge,
    train_teacher,
    windows,
    world_names,
)
from gem.config import flatten, from_dict
from gem.data.contract import Manifest
from students.config import KnowledgeReadConfig, OptimConfig, StudentModelConfig

log = logging.getLogger(__name__)

BASELINE = TEACHER_FREE


@dataclass(kw_only=True)
class ServingConfig:
    arm: str = "representation"  # the student whose latency is measured (feed surface, first teacher/seed)
    requests: int = 2000
    candidates: int = 100
    repeats: int = 3
    threads: int = 4  # concurrent request threads
    uncached_requests: int = 500  # every candidate read from the online store (slow: fewer requests)


@dataclass(kw_only=True)
class ExperimentConfig:
    datasets: list[DatasetConfig] = field(default_factory=list)
    seeds: list[int] = field(default_factory=lambda: [0, 1, 2, 3, 4])
    teacher_seeds: list[int] = field(default_factory=lambda: [0, 1])
    arms: dict[str, ArmConfig] = field(default_factory=dict)
    staleness_arms: list[str] = field(default_factory=lambda: ["no_teacher", "kd", "adapter"])
    staleness_seeds: list[int] = field(default_factory=lambda: [0, 1, 2])
    cut_arms: list[str] = field(default_factory=list)  # the row-cut worlds' arms ([] = staleness_arms)
    # the differences reported besides each arm's lift: name -> [arm a, arm b] (a minus b)
    differences: dict[str, list[str]] = field(default_factory=lambda: {
        "adapter_vs_kd": ["adapter", "kd"], "combined_vs_kd": ["combined", "kd"]})
    student: StudentModelConfig = field(default_factory=StudentModelConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    knowledge: KnowledgeReadConfig = field(default_factory=KnowledgeReadConfig)
    teacher_preset: str = "tiny"  # gem/configs/train preset
    teacher_overrides: list[str] = field(default_factory=list)
    max_seq_len: int = 32
    bootstrap: int = 1000
    experiment: str = "gem-transfer"
    tracking_uri: str = ""  # "" = the benchmarks' store (benchmarks/results.py bench_store)
    register: list[str] = field(default_factory=lambda: ["no_teacher", "kd", "adapter", "combined"])  # arms registered
    serving: ServingConfig = field(default_factory=ServingConfig)
    threads: int = 2


def load_experiment_config(preset: str, overrides: list[str] | None = None) -> ExperimentConfig:
    from gem.config import load_config

    cfg = load_config(ExperimentConfig, section="students", preset=preset, overrides=overrides)
    cfg.arms = {name: arm if isinstance(arm, ArmConfig) else from_dict(ArmConfig, arm, f"arms.{name}.")
                for name, arm in cfg.arms.items()}  # gem.config types list items, not dict values
    check_arms(cfg.arms)
    for key in ("staleness_arms", "cut_arms"):
        missing = [a for a in getattr(cfg, key) if a not in cfg.arms]
        if missing:
            raise ValueError(f"{key} {missing} are not arms ({sorted(cfg.arms)})")
    return cfg


# -- one world --------------------------------------------------------------------------
@dataclass
class WorldResult:
    world: World
    arms: dict[str, list[ArmResult]]
    evidence: Any  # analysis.Evidence
    teacher_metrics: dict[str, dict[str, float]]
    examples: dict[str, int]
    serving: dict = field(default_factory=dict)
    surfaces: list[str] = field(default_factory=list)  # the surfaces with students
    teacher_only: dict[str, str] = field(default_factory=dict)  # surface -> why it has no student
    examples_by_surface: dict[str, dict[str, int]] = field(default_factory=dict)  # table -> surface -> rows


@dataclass
class PreparedWorld:
    """A world's windows, features, tables, teachers and knowledge: what its arms train on."""

    world: World
    spec: Any
    base_tables: dict  # {"train", "validation", "evaluation"} without knowledge
    knowledge_tables: dict  # teacher id -> cadence -> tables with its knowledge
    teacher_metrics: dict[str, dict[str, float]]
    dims: tuple[int, int]  # (teacher-embedding width, teacher embedding_dim)
    surfaces: list[str]
    teacher_only: dict[str, str]

    def cut(self, name: str, fraction: float) -> "PreparedWorld":
        """The same world with every table's training rows cut to each surface's newest ``fraction``."""
        from benchmarks.transfer.surfaces import cut_tables

        world = replace(self.world, name=name, timings={})
        knowledge = {t: {c: cut_tables(tables, fraction) for c, tables in by_cadence.items()}
                     for t, by_cadence in self.knowledge_tables.items()}
        return replace(self, world=world, base_tables=cut_tables(self.base_tables, fraction),
                       knowledge_tables=knowledge)


def _tables(world: World, ds: DatasetConfig, cfg: ExperimentConfig):
    from gem.data.contract import parse_utc
    from students.data import load_table, split_at

    student, spec = load_table(world.features["student"], cfg.student,
                               shards=bucket_shards(world.features["student"], ds.buckets))
    evaluation, _ = load_table(world.features["evaluation"], cfg.student,
                               shards=bucket_shards(world.features["evaluation"], ds.buckets))
    cut = int(round(parse_utc(world.windows["validation"][0]).timestamp() * 1e6))
    train, valid = split_at(student, cut)
    return {"train": train, "validation": valid, "evaluation": evaluation}, spec


def _with_knowledge(tables: dict, repo: Path, refresh_every: str) -> dict:
    from students.data import attach_knowledge

    return {k: attach_knowledge(t, repo, refresh_every=refresh_every) for k, t in tables.items()}


def _cadences(cfg: ExperimentConfig, arm_names: list[str]) -> set[str]:
    return {cfg.arms[a].refresh_every or cfg.knowledge.refresh_every for a in arm_names if needs_teacher(cfg.arms[a])}


def prepare_world(ds: DatasetConfig, cfg: ExperimentConfig, name: str, data_dir: Path, work: Path,
                  tracking_uri: str, parent_id: str, arm_names: list[str], headline: bool) -> PreparedWorld:
    """Windows, features, the student surfaces, tables, teachers and their knowledge."""
    from benchmarks.transfer.surfaces import student_surfaces, window_counts
    from gem.knowledge import load_teacher
    from students.train import evaluate

    started = time.perf_counter()
    w = windows(ds, Manifest.read(data_dir).start, name)
    check_world_windows(name, w)
    world = World(name, None if name == "fresh" else int(name.removeprefix("gap")), w,
                  build_features(ds, data_dir, work, w, cfg.max_seq_len))
    world.timings["features_s"] = round(time.perf_counter() - started, 1)
    base_tables, spec = _tables(world, ds, cfg)
    surfaces, teacher_only = student_surfaces(list(spec.surfaces), window_counts(data_dir, w), ds.student_evidence)
    if not surfaces:
        raise ValueError(f"dataset {ds.name}, world {name}: no surface meets student_evidence {ds.student_evidence} "
                         f"in its train, validation and evaluation windows: {teacher_only}")
    cadences = _cadences(cfg, arm_names)
    teachers, knowledge_tables, teacher_metrics = [], {}, {}
    clock = time.perf_counter()
    for seed in cfg.teacher_seeds if cadences or headline else []:
        tdir = work / f"teacher_s{seed}"
        shutil.rmtree(tdir, ignore_errors=True)
        tdir.mkdir(parents=True)
        uri, _ = train_teacher(ds, world, seed, tdir, cfg.teacher_preset, cfg.teacher_overrides, cfg.experiment,
                               tracking_uri, parent_id)
        teacher = load_teacher(uri, tracking_uri)
        serving_repo = headline and seed == cfg.teacher_seeds[0]
        repo = teacher_knowledge(teacher, world, ds, tdir, data_dir if serving_repo else None)
        run = TeacherRun(f"t{len(teachers)}", seed, uri, teacher.version, repo, teacher.model)
        teachers.append(run)
        knowledge_tables[run.id] = {c: _with_knowledge(base_tables, repo, c) for c in cadences}
        ev_t = knowledge_tables[run.id][next(iter(cadences))]["evaluation"] if cadences else \
            _with_knowledge(base_tables, repo, cfg.knowledge.refresh_every)["evaluation"]
        teacher_metrics[run.id] = evaluate(torch.sigmoid(ev_t.teacher_logits), ev_t, list(spec.surfaces),
                                           list(spec.tasks))
    world.teachers = teachers
    if teachers:
        from gem.model import forward_flops_per_example

        world.timings["teacher_flops_per_example"] = float(
            forward_flops_per_example(teachers[0].model, mean_len=float(cfg.max_seq_len) / 2))
    world.timings["teachers_and_knowledge_s"] = round(time.perf_counter() - clock, 1)
    dims = (0, 0)
    if teachers and knowledge_tables[teachers[0].id]:
        any_tables = next(iter(knowledge_tables[teachers[0].id].values()))
        dims = (int(any_tables["train"].teacher_emb.shape[1]), int(teachers[0].model.cfg.embedding_dim))
    return PreparedWorld(world, spec, base_tables, knowledge_tables, teacher_metrics, dims, surfaces, teacher_only)


def run_arms(ds: DatasetConfig, cfg: ExperimentConfig, prepared: PreparedWorld, arm_names: list[str],
             seeds: list[int], headline: bool) -> WorldResult:
    """Every arm of ``arm_names`` on the prepared world's student surfaces (the headline
    world keeps its first seed's students: registered, and the serving run's student)."""
    from benchmarks.transfer.analysis import Evidence

    world, spec, base_tables = prepared.world, prepared.spec, prepared.base_tables
    arms = {a: cfg.arms[a] for a in arm_names}
    teachers = world.teachers
    base = {"student": asdict(cfg.student), "optim": asdict(cfg.optim), "period_days": ds.period_days,
            "knowledge": asdict(cfg.knowledge), "surfaces": list(prepared.surfaces)}
    evaluation = base_tables["evaluation"]
    evidence = Evidence(evaluation.labels[:, 0].numpy(), evaluation.user_raw.numpy(), n=cfg.bootstrap,
                        seed=len(world.name))
    results: dict[str, list[ArmResult]] = {}
    clock = time.perf_counter()
    keep = (seeds[0],) if headline else ()
    for arm_name in arm_names:
        arm = arms[arm_name]
        runs = []
        if needs_teacher(arm):
            for t in teachers:
                tables = prepared.knowledge_tables[t.id][arm.refresh_every or cfg.knowledge.refresh_every]
                runs.append(run_arm(arm_name, arm, cfg.arms, tables, spec, base, seeds, teacher_model=t.model,
                                    teacher_id=t.id, teacher_dims=prepared.dims,
                                    keep_models=keep if t is teachers[0] else ()))
        else:
            runs.append(run_arm(arm_name, arm, cfg.arms, base_tables, spec, base, seeds,
                                teacher_dims=prepared.dims, keep_models=keep))
        for r in runs:
            for seed, surfaces in r.runs.items():
                evidence.add(arm_name, r.teacher, seed, {s: (x.index, x.probs) for s, x in surfaces.items()})
        results[arm_name] = runs
        log.info("transfer: %s/%s/%s done (%.0f s)", ds.name, world.name, arm_name, time.perf_counter() - clock)
    world.timings["students_s"] = round(time.perf_counter() - clock, 1)
    examples = {k: len(t) for k, t in base_tables.items()}
    by_surface = {k: {s: int((t.surface == i).sum()) for i, s in enumerate(spec.surfaces)}
                  for k, t in base_tables.items()}
    serving = {"users": sorted(set(evaluation.user_raw.tolist())),
               "items": sorted({i for i in base_tables["train"].item_raw.tolist() if i >= 0})}
    return WorldResult(world, results, evidence, prepared.teacher_metrics, examples, serving,
                       list(prepared.surfaces), dict(prepared.teacher_only), by_surface)


# -- everything -----------------------------------------------------------------------------
def run_dataset(ds: DatasetConfig, cfg: ExperimentConfig, work: Path, tracking_uri: str, parent_id: str) -> dict:
    """Every world of the dataset: the headline (every arm), its row cuts (``cut_arms``,
    on the headline's teachers and knowledge), the staleness worlds (``staleness_arms``)."""
    from benchmarks.transfer.figures import world_figures
    from benchmarks.transfer.surfaces import cut_name, rule_text
    from benchmarks.transfer.tracking import log_world

    work.mkdir(parents=True, exist_ok=True)
    data_dir = make_dataset(ds, work / "data", shared_data())
    worlds, figures = {}, {}
    cuts = {cut_name(f): f for f in ds.train_fractions}
    headline_world = None
    for i, name in enumerate(world_names(ds)):
        headline = i == 0
        arm_names = list(cfg.arms) if headline else list(cfg.cut_arms or cfg.staleness_arms) if name in cuts \
            else list(cfg.staleness_arms)
        seeds = cfg.seeds if headline else cfg.staleness_seeds
        if name in cuts:
            prepared = headline_world.cut(name, cuts[name])
        else:
            prepared = prepare_world(ds, cfg, name, data_dir, work / name, tracking_uri, parent_id,
                                     [*arm_names, *(cfg.cut_arms or cfg.staleness_arms if headline and cuts else [])],
                                     headline)
        res = run_arms(ds, cfg, prepared, arm_names, seeds, headline)
        if headline:
            headline_world = prepared
        if name == next(reversed(cuts), None):
            headline_world = None  # the last cut is done: the headline's tables can go
        figures[name] = world_figures(res, cfg)
        log_world(ds, res, figures[name], cfg, parent_id, headline=headline)
        worlds[name] = res
    return {"worlds": worlds, "figures": figures, "data_dir": data_dir, "cuts": cuts,
            "student_rule": rule_text(ds.student_evidence)}


def open_experiment(cfg: ExperimentConfig, work: Path) -> str:
    """Point MLflow at the experiment's store and experiment; returns the tracking URI."""
    import mlflow

    if not cfg.tracking_uri:
        return bench_tracking(cfg.experiment)  # the benchmarks' store: every run's arms side by side
    mlflow.set_tracking_uri(cfg.tracking_uri)
    if mlflow.get_experiment_by_name(cfg.experiment) is None:
        mlflow.create_experiment(cfg.experiment, artifact_location=(work / "mlartifacts").as_uri())
    mlflow.set_experiment(cfg.experiment)
    return cfg.tracking_uri


def start_parent(cfg: ExperimentConfig, work: Path) -> tuple[str, str]:
    """(tracking URI, id of a new RUNNING parent run ``transfer-experiment``)."""
    import mlflow

    tracking_uri = open_experiment(cfg, work)
    experiment_id = mlflow.get_experiment_by_name(cfg.experiment).experiment_id
    return tracking_uri, mlflow.MlflowClient(tracking_uri).create_run(
        experiment_id, run_name="transfer-experiment").info.run_id


def run_datasets(cfg: ExperimentConfig, work: str | Path, parent_id: str, *, latency: bool = True,
                 quiet_after: list[Path] | None = None) -> dict:
    """The datasets of ``cfg`` under an existing parent run: ``{"datasets": {name: entry},
    "serving": {...}}`` (serving measured on the first dataset, with ``latency``, once the
    files ``quiet_after`` exist: the other jobs of a parallel run are done)."""
    import mlflow

    from benchmarks.transfer.report import dataset_entry

    torch.set_num_threads(cfg.threads)
    work = Path(work).resolve()
    work.mkdir(parents=True, exist_ok=True)
    tracking_uri = open_experiment(cfg, work)
    entries, serving = {}, {}
    for i, ds in enumerate(cfg.datasets):
        log.info("transfer: dataset %s", ds.name)
        clock = time.perf_counter()
        res = run_dataset(ds, cfg, work / ds.name, tracking_uri, parent_id)
        res["wall_s"] = round(time.perf_counter() - clock, 1)
        entries[ds.name] = dataset_entry(res)
        mlflow.set_tracking_uri(tracking_uri)
        mlflow.set_experiment(cfg.experiment)  # gem.training's tracker may have switched it
        if latency and i == 0:
            from benchmarks.transfer.serving import serving_benchmark

            serving = serving_benchmark(res, cfg, work / ds.name, quiet_after=quiet_after)
        del res  # teachers, tables and students of this dataset
    return {"datasets": entries, "serving": serving}


def finish(parent_id: str, parts: list[dict], cfg: ExperimentConfig, seconds: float) -> dict:
    """Merge the parts (run_datasets results), log the payload on the parent run."""
    from benchmarks.transfer.report import assemble
    from benchmarks.transfer.tracking import log_parent

    datasets = {k: v for part in parts for k, v in part["datasets"].items()}
    order = [d.name for d in cfg.datasets]
    datasets = {k: datasets[k] for k in sorted(datasets, key=lambda n: order.index(n) if n in order else len(order))}
    serving = next((p["serving"] for p in parts if p.get("serving")), {})
    payload = assemble(datasets, serving, cfg, seconds)
    log_parent(parent_id, payload, cfg, {k: str(v)[:500] for k, v in flatten(cfg).items()})
    return payload


def run_experiment(cfg: ExperimentConfig, work: str | Path, *, latency: bool = True) -> dict:
    """Every dataset in this process, one parent run; returns the transfer.json payload."""
    import mlflow

    started = time.perf_counter()
    work = Path(work).resolve()
    work.mkdir(parents=True, exist_ok=True)
    tracking_uri, parent_id = start_parent(cfg, work)
    try:
        part = run_datasets(cfg, work, parent_id, latency=latency)
    except BaseException:
        mlflow.MlflowClient(tracking_uri).set_terminated(parent_id, "FAILED")
        raise
    return finish(parent_id, [part], cfg, time.perf_counter() - started)
