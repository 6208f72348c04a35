"""A tiny end-to-end world for tests: simulator data, teacher/student/eval feature
windows, a briefly trained GEM registered in MLflow (sqlite), its knowledge on the
teacher, student and eval windows, and a private Feast repo holding it. Built once per process.

    world = tiny_world(tmp_path_factory.mktemp("transfer"))
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

_CACHE: dict[str, "World"] = {}
WINDOWS = {"teacher": ("2026-01-01", "2026-01-03"), "student": ("2026-01-03", "2026-01-04"),
           "eval": ("2026-01-04", "2026-01-05")}
TEACHER_NAME = "gem-teacher-test"


@dataclass
class World:
    root: Path
    data: Path
    features: dict[str, Path]
    teacher_dir: Path
    teacher_uri: str
    tracking_uri: str
    knowledge: dict[str, Path]
    repo: Path


def tiny_world(root: Path) -> World:
    key = "world"
    if key in _CACHE:
        return _CACHE[key]
    import mlflow

    from gem.data.simulate import SimulatorConfig, simulate
    from gem.features import build_features
    from gem.features.config import FeaturesConfig
    from gem.features.loader import FeatureLoader
    from gem.knowledge import generate_knowledge, prepare_repo, register_knowledge
    from gem.model import build_model, load_model_config
    from gem.model.store import log_model
    from gem.training.step import build_dense_optimizer, train_step
    from gem.training.trainer import export_model

    root = Path(root)
    data = root / "data"
    simulate(SimulatorConfig(users=300, items=600, days=4, topics=8, advertisers=40, seed=0, workers=1,
                             click_bias=-4.0), data, progress=False)
    features = {}
    for name, (lo, hi) in WINDOWS.items():
        features[name] = root / f"features_{name}"
        cfg = FeaturesConfig(max_seq_len=16, num_buckets=1, workers=1,
                             vocab_from="" if name == "teacher" else str(root / "features_teacher"))
        build_features(data, features[name], cfg, window_start=lo, window_end=hi)
    torch.manual_seed(0)
    loader = FeatureLoader(features["teacher"], batch_size=128, shuffle=True, seed=0)
    model_cfg = load_model_config("tiny", ["attention_backend=padded"])
    model = build_model(model_cfg, loader.spec)
    opt, _ = build_dense_optimizer(model, 3e-3, 0.0, [0.9, 0.999])
    for batch in loader:
        train_step(model, batch, opt)
    teacher_dir = root / "teacher"
    export_model(model.state_dict(), model_cfg, loader.spec, teacher_dir)
    tracking_uri = f"sqlite:///{root / 'mlflow.db'}"
    mlflow.set_tracking_uri(tracking_uri)
    experiment = mlflow.create_experiment("transfer-tests", artifact_location=(root / "mlartifacts").as_uri())
    with mlflow.start_run(experiment_id=experiment, run_name="teacher") as run:
        log_model(teacher_dir / "model", name="model")
    version = mlflow.register_model(f"runs:/{run.info.run_id}/model", TEACHER_NAME).version
    teacher_uri = f"models:/{TEACHER_NAME}/{version}"
    knowledge = {}
    # the daily knowledge job runs from the teacher's last training day on: a request on the
    # student window's first day reads what it wrote at that day's midnight
    for name in ("teacher", "student", "eval"):
        knowledge[name] = root / f"knowledge_{name}"
        generate_knowledge(teacher_uri, features[name], knowledge[name], tracking_uri=tracking_uri)
    repo = prepare_repo(root / "feast", data)
    register_knowledge(repo, list(knowledge.values()))
    world = World(root, data, features, teacher_dir, teacher_uri, tracking_uri, knowledge, repo)
    _CACHE[key] = world
    return world
