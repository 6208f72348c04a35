"""Every dataset shape runs through the library stages: validate -> features -> a few
training steps -> knowledge -> one student per surface the data has; surfaces and tasks
come from the data. The one-surface, no-conversion shape also runs the real
`gem pipeline run --preset tiny` in tests/app/test_e2e.py."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.datasets.shapes import SHAPES, make_shape


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> Path:
    from gem.data.simulate import SimulatorConfig, simulate

    out = tmp_path_factory.mktemp("matrix") / "base"
    simulate(SimulatorConfig(users=120, items=300, days=4, topics=6, advertisers=20, seed=11, click_bias=-2.5,
                             workers=1), out, progress=False)
    return out


def _features_cfg(**kw):
    from gem.config import load_config
    from gem.features.config import FeaturesConfig

    return load_config(FeaturesConfig, section="features", preset="tiny",
                       overrides=["max_seq_len=32", "num_buckets=2", "workers=1", "counters=true",  # as the pipeline
                                  *[f"{k}={v}" for k, v in kw.items()]])


@pytest.mark.parametrize("shape", SHAPES)
def test_shape_runs_through_every_stage(shape, base, tmp_path):
    from gem.data.profile import profile_dataset
    from gem.data.validate import validate_dataset
    from gem.features.build import build_features
    from gem.features.loader import FeatureLoader
    from gem.knowledge.config import KnowledgeConfig
    from gem.knowledge.generate import generate_knowledge, own_columns
    from gem.model import build_model, load_model_config
    from gem.model.heads import multitask_loss
    from gem.model.store import save_model

    data = make_shape(base, tmp_path / shape, shape)
    clean = tmp_path / "clean"
    report = validate_dataset(data, out=clean)
    assert report.quarantined_rows["events"] == 0, report.reasons
    profile = profile_dataset(clean)
    days = profile.span_days
    window = None
    if shape == "three_years":  # last 60 days as the window, history from three years
        import datetime as dt

        assert days > 1000
        end = dt.date(1970, 1, 1) + dt.timedelta(days=profile.last_day + 1)
        window = ((end - dt.timedelta(days=60)).isoformat() + "T00:00:00+00:00", end.isoformat() + "T00:00:00+00:00")
    feats = tmp_path / "features"
    manifest = build_features(clean, feats, _features_cfg(), window_start=window and window[0],
                              window_end=window and window[1])
    spec = FeatureLoader(feats, batch_size=64).spec
    assert spec.surfaces == profile.surfaces
    assert profile.tasks == (["click"] if shape in ("one_surface", "no_conversions") else ["click", "conversion"])
    assert manifest["dataset"]["data_tasks"] == profile.tasks
    if shape == "one_surface":
        assert spec.surfaces == ["search"]
    if shape == "users_without_attributes":
        warnings = " ".join(__import__("json").loads((feats / "report.json").read_text())["warnings"])
        assert "user_age_bucket" in warnings and "every" in warnings
    assert manifest["counts"]["examples"] > 0

    model = build_model(load_model_config("tiny"), spec)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    for step, batch in enumerate(FeatureLoader(feats, batch_size=64, shuffle=True)):
        loss, per_task = multitask_loss(model(batch), batch.labels)
        assert torch.isfinite(loss)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step == 3:
            break
    folder = save_model(model, load_model_config("tiny"), spec, tmp_path / "model")
    know = generate_knowledge(folder, feats, tmp_path / "knowledge", KnowledgeConfig())
    assert know["tasks"] == spec.tasks and know["surfaces"] == spec.surfaces
    import pyarrow.parquet as pq

    cols = pq.read_schema(tmp_path / "knowledge" / "predictions.parquet").names
    assert set(own_columns(spec.tasks)) <= set(cols)

    from gem.config import load_config
    from students.config import DistillConfig
    from students.data import load_table
    from students.distill import distill

    cfg = load_config(DistillConfig, section="students", preset="pipeline",
                      overrides=["register=false", "transfer.kd.weight=0", "transfer.adapter.weight=0",
                                 "transfer.hierarchical.weight=0", "transfer.representation.enabled=false",
                                 "transfer.sharing=\"off\""])
    from students.data import split_at

    table, tspec = load_table(feats, cfg.student)
    lo, hi = table.window_us
    train, held = split_at(table, lo + (hi - lo) * 3 // 4)
    out = distill(train, held, tspec, cfg)
    in_train = {spec.surfaces[int(s)] for s in train.surface.unique()}  # the window's surfaces, not the vocabulary
    assert sorted(out.students) == sorted(in_train) and set(in_train) <= set(profile.surfaces)


def test_asking_for_an_absent_surface_fails_fast(base, tmp_path):
    from gem.data.profile import SurfaceError, profile_dataset
    from gem_app.stages.ingest import check_surfaces

    data = make_shape(base, tmp_path / "one", "one_surface")
    with pytest.raises(SurfaceError, match=r"\['video'\].*\['search'\]"):
        check_surfaces(str(data), ["video"])
    assert profile_dataset(data).require_surfaces(None) == ["search"]
    assert any("conversion" in w for w in profile_dataset(data).warnings)
