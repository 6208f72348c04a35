"""The experiment's windows and what is built on them: data, features, teachers, knowledge.

Per dataset, with periods of ``period_days`` from ``start``, the student window starts at
S = start + (teacher_periods + the largest gap) periods so that every staleness setting
shares the same student and evaluation windows:

    teacher (gap g)  [S - (g + T) p, S - g p)        GEM, one per teacher seed, then frozen
    knowledge lead   [S - L p, S)                     the knowledge job's days before S
    train            [S, S + k p)                     the students' labels (the adapter: its newest periods)
    validation       [S + k p, S + (k + v) p)         early stopping and the grid, never trained on
    evaluation       [S + (k + v) p, ... + e p)       only scored (e = evaluation_periods)

The fresh-teacher control trains GEM on [S + (k - T) p, S + k p): it has seen the
students' training window (not validation, not evaluation). A world is one teacher
window with its teachers, their knowledge (one private Feast repo each) and the student
tables built with that teacher window's vocabularies (the students share GEM's ids).
A row-cut world (``train_fractions``, benchmarks/transfer/surfaces.py) is the headline
world with the students' training rows cut: same windows, teachers and knowledge.
"""

from __future__ import annotations

import datetime as dt
import logging
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from gem import registry
from gem.config import from_dict
from gem.data.contract import parse_utc

log = logging.getLogger(__name__)

FRESH = "fresh"


@dataclass(kw_only=True)
class DatasetConfig:
    name: str
    source: str  # simulator | movielens | taobao | ciao
    simulator: dict[str, Any] = field(default_factory=dict)  # SimulatorConfig overrides
    raw: str = ""  # movielens dir / taobao csv / ciao dir ("" = ../shared/data)
    start: str = ""  # first period ("" = the dataset's window start)
    period_days: float = 1.0
    teacher_periods: int = 3
    train_periods: int = 2
    validation_periods: int = 1
    evaluation_periods: int = 1
    knowledge_lead_periods: int = 2
    gap: int = 0  # the headline world's gap (periods between the teacher's last day and S)
    staleness_gaps: list[int] = field(default_factory=list)  # more worlds for the staleness sweep
    fresh_control: bool = False  # and the fresh-teacher control world
    num_buckets: int = 2  # user buckets of the features build
    buckets: list[int] = field(default_factory=list)  # buckets the students use ([] = all): user subsampling
    teacher_max_steps: int = 0  # 0 = one full epoch
    # gem.protocol.Evidence settings a surface's train, validation and evaluation windows must
    # each meet for it to get a student ({} = every surface; benchmarks/transfer/surfaces.py)
    student_evidence: dict[str, int] = field(default_factory=dict)
    # row-cut worlds: the headline world with each surface's training rows cut to its newest fraction
    train_fractions: list[float] = field(default_factory=list)


@dataclass
class TeacherRun:
    id: str  # t0, t1, ...
    seed: int
    uri: str
    version: str
    repo: Path
    model: Any = None


@dataclass
class World:
    name: str  # "gap0", "gap3", "fresh"
    gap: int | None
    windows: dict[str, tuple[str, str]]
    features: dict[str, Path]
    teachers: list[TeacherRun] = field(default_factory=list)
    timings: dict[str, float] = field(default_factory=dict)


def make_dataset(ds: DatasetConfig, out: Path, shared: Path) -> Path:
    """The dataset in the data contract at ``out``, reused only under the same source
    (simulator settings, or the raw files' digest) and code (``benchmarks.results.built``)."""
    from benchmarks.results import built
    from gem.utils.digest import path_digest

    if ds.source == "simulator":
        from gem.data.simulate import SimulatorConfig, simulate

        sim = from_dict(SimulatorConfig, {"workers": 1, **ds.simulator})
        built(out, {"source": "simulator", "config": asdict(sim)}, lambda o: simulate(sim, o, progress=False))
        return out
    if ds.source == "movielens":
        from gem.data.adapters.movielens import convert_movielens as convert

        raw = Path(ds.raw or shared / "movielens-100k")
    elif ds.source == "taobao":
        from gem.data.adapters.taobao import convert_taobao as convert

        raw = Path(ds.raw or shared / "taobao-userbehavior")
    elif ds.source == "ciao":
        from gem.data.adapters.ciao import convert_ciao as convert

        raw = Path(ds.raw or shared / "ciao")
    else:
        raise ValueError(f"dataset {ds.name}: source={ds.source!r} must be simulator, movielens, taobao or ciao")
    built(out, {"source": ds.source, "raw": path_digest(raw)}, lambda o: convert(raw, o))
    return out


def world_names(ds: DatasetConfig) -> list[str]:
    """The headline world, its row cuts, then the staleness worlds and the fresh control."""
    from benchmarks.transfer.surfaces import cut_name

    gaps = [ds.gap, *[g for g in ds.staleness_gaps if g != ds.gap]]
    cuts = [cut_name(f) for f in ds.train_fractions]
    return [f"gap{gaps[0]}", *cuts, *[f"gap{g}" for g in gaps[1:]]] + ([FRESH] if ds.fresh_control else [])


def windows(ds: DatasetConfig, data_start: dt.datetime, world: str) -> dict[str, tuple[str, str]]:
    """The ISO [start, end) windows of one world (see the module docstring)."""
    start = parse_utc(ds.start) if ds.start else data_start
    start = start.replace(hour=0, minute=0, second=0, microsecond=0)
    p = dt.timedelta(days=ds.period_days)
    t, k, v, e = ds.teacher_periods, ds.train_periods, ds.validation_periods, ds.evaluation_periods
    s = start + (t + max([ds.gap, *ds.staleness_gaps])) * p
    if world == FRESH:
        teacher = (s + (k - t) * p, s + k * p)
    else:
        g = int(world.removeprefix("gap"))
        teacher = (s - (g + t) * p, s - g * p)
    out = {"teacher": teacher, "knowledge_lead": (s - ds.knowledge_lead_periods * p, s), "train": (s, s + k * p),
           "validation": (s + k * p, s + (k + v) * p), "evaluation": (s + (k + v) * p, s + (k + v + e) * p)}
    return {name: (lo.isoformat(), hi.isoformat()) for name, (lo, hi) in out.items()}


def check_world_windows(name: str, w: dict[str, tuple[str, str]]) -> None:
    """Teacher, train, validation and evaluation pairwise disjoint (the fresh control's
    teacher overlaps train by design, never validation or evaluation)."""
    from students.protocol import check_windows

    check_windows({k: w[k] for k in ("train", "validation", "evaluation")})
    check_windows({k: w[k] for k in ("teacher", "validation", "evaluation")})
    if name != FRESH:
        check_windows({k: w[k] for k in ("teacher", "train")})


def build_features(ds: DatasetConfig, data_dir: Path, work: Path, w: dict[str, tuple[str, str]],
                   max_seq_len: int) -> dict[str, Path]:
    """Features of the teacher window (its own vocabularies) and, with those, of the lead,
    the student window (train + validation) and the evaluation window."""
    from benchmarks.results import built
    from gem.features import build_features as build
    from gem.features.config import FeaturesConfig
    from gem.utils.digest import tree_digest

    spans = {"teacher": w["teacher"], "lead": w["knowledge_lead"], "student": (w["train"][0], w["validation"][1]),
             "evaluation": w["evaluation"]}
    data_digest, teacher_digest, out = tree_digest(data_dir), "", {}
    for name, (lo, hi) in spans.items():
        out[name] = work / f"features_{name}"
        cfg = FeaturesConfig(max_seq_len=max_seq_len, num_buckets=ds.num_buckets, workers=1,
                             vocab_from="" if name == "teacher" else str(out["teacher"]))
        # the vocabularies' source by content (the teacher window's build), not by its path
        key = {"data": data_digest, "window": [lo, hi], "config": {**asdict(cfg), "vocab_from": teacher_digest}}

        def make(o: Path, cfg=cfg, lo=lo, hi=hi) -> None:
            build(data_dir, o, cfg, window_start=lo, window_end=hi)

        digest = built(out[name], key, make)
        teacher_digest = teacher_digest or digest
    return out


def bucket_shards(features_dir: Path, buckets: list[int]) -> list[str]:
    from gem.features.loader import read_manifest

    return [s["name"] for s in read_manifest(features_dir)["shards"] if not buckets or s["bucket"] in buckets]


def train_teacher(ds: DatasetConfig, world: World, seed: int, work: Path, preset: str, overrides: list[str],
                  experiment: str, tracking_uri: str, parent_run_id: str) -> tuple[str, str]:
    """GEM on the world's teacher window (gem.training), registered as
    ``gem_teacher_<dataset>`` with its window and seed as tags; returns (uri, run id)."""
    import mlflow
    from mlflow import MlflowClient

    from gem import tracking
    from gem.training.config import load_train_config
    from gem.training.trainer import train

    run_overrides = [*overrides, f"tracking_uri={tracking_uri}", f"experiment={experiment}",
                     f"run_name=teacher-{ds.name}-{world.name}-s{seed}", "measure_peak=false", "system_metrics=false",
                     "checkpoint_every=0", f"max_steps={ds.teacher_max_steps}", f"seed={seed}"]
    train_cfg, model_cfg = load_train_config(preset, run_overrides)
    result = train(str(world.features["teacher"]), work / f"teacher_s{seed}", train_cfg, model_cfg)
    client = MlflowClient(tracking_uri)
    window = "/".join(world.windows["teacher"])
    for key, value in {"mlflow.parentRunId": parent_run_id, "role": "teacher", "world": world.name,
                       "teacher_seed": str(seed), tracking.TAG_DATA_WINDOW: window}.items():
        client.set_tag(result.run_id, key, value)
    name = registry.teacher_model(ds.name)
    mlflow.set_tracking_uri(tracking_uri)
    mv = mlflow.register_model(f"runs:/{result.run_id}/model", name,
                               tags={tracking.TAG_DATA_WINDOW: window, "world": world.name, "teacher_seed": str(seed)})
    if world.name == f"gap{ds.gap}" and seed == 0:
        client.set_registered_model_alias(name, registry.STALE, mv.version)
    return registry.model_uri(name, mv.version), result.run_id


def teacher_knowledge(teacher, world: World, ds: DatasetConfig, work: Path, data_dir: Path | None) -> Path:
    """The teacher's knowledge on the lead, student and evaluation windows, registered in
    its own Feast repo (with the dataset's attribute sources when ``data_dir``: serving)."""
    from gem.knowledge import generate_knowledge, prepare_repo, register_knowledge
    from gem.knowledge.config import KnowledgeConfig

    dirs = []
    for name in ("lead", "student", "evaluation"):
        out = work / f"knowledge_{name}"  # work is the teacher's own fresh folder: nothing to reuse
        shards = bucket_shards(world.features[name], ds.buckets)
        generate_knowledge(teacher, world.features[name], out, KnowledgeConfig(batch_size=1024), shards=shards)
        dirs.append(out)
    repo = prepare_repo(work / "feast", data_dir)
    register_knowledge(repo, dirs)
    return repo
