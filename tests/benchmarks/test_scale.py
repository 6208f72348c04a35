"""The scale benchmark's arithmetic (benchmarks/scale_bench.py), the presets it and the
long-history training benchmark use, and the import floor of a features shard task."""

from __future__ import annotations

import subprocess
import sys

import pytest

from benchmarks import scale_bench
from benchmarks.pipeline_usage import TaskUsage
from benchmarks.scale_bench import SCALES, by_stage, fixed_and_rate, growth, slope
from gem.config import load_config
from gem.data.simulate import SimulatorConfig


def _run(events: int, stages: dict[str, tuple[float, float, float]]) -> dict:
    return {"events": events, "pipeline": {"wall_s": sum(w for w, _, _ in stages.values()), "stages": {
        name: {"tasks": 1, "wall_s": w, "cpu_s": c, "peak_rss_mb": r, "write_bytes": 0}
        for name, (w, c, r) in stages.items()}}}


def test_growth_finds_the_slope_the_fixed_part_and_a_stage_above_the_goal():
    runs = {}
    for scale in (1, 4, 16):
        n = 250_000 * scale
        runs[scale] = _run(n, {
            "linear": (5.0 + 20.0 * n / 1e6, 4.0 * n / 1e6, 300.0),  # 5 s fixed + 20 s per million
            "quadratic": ((n / 1e5) ** 2, (n / 1e5) ** 2, 100.0 * scale),  # time ~ n^2, memory ~ n
            "constant": (3.0, 2.0, 200.0),
        })
    out = growth(runs)
    assert out["quadratic"]["slope_wall"] == pytest.approx(2.0, abs=1e-3)
    assert out["quadratic"]["slope_peak_rss"] == pytest.approx(1.0, abs=1e-3)
    assert out["quadratic"]["meets_slope_goal"] is False
    assert out["linear"]["slope_cpu"] == pytest.approx(1.0, abs=1e-3)
    assert 0.6 < out["linear"]["slope_wall"] < 1.0 and out["linear"]["meets_slope_goal"]
    assert out["linear"]["fixed_wall_s"] == pytest.approx(5.0, abs=0.05)
    assert out["linear"]["wall_s_per_million_events"] == pytest.approx(20.0, abs=0.05)
    assert out["constant"]["slope_wall"] == pytest.approx(0.0, abs=1e-6)
    assert out["constant"]["peak_rss_ratio_largest_over_smallest"] == 1.0
    assert "whole_run" in out


def test_slope_and_fit_edge_cases():
    assert slope([1.0], [2.0]) is None
    assert slope([1.0, 10.0], [3.0, 30.0]) == pytest.approx(1.0)
    fixed, rate = fixed_and_rate([1.0, 2.0, 3.0], [0.0, 0.5, 3.0])  # a negative intercept: through the origin
    assert fixed == 0.0 and rate > 0


def test_by_stage_sums_fanned_out_tasks_and_keeps_the_largest_memory():
    tasks = [TaskUsage(component="features_shard", pid=1, started=0.0, ended=2.0, cpu_s=1.5, peak_rss_mb=200.0,
                       write_bytes=10),
             TaskUsage(component="features_shard", pid=2, started=2.0, ended=5.0, cpu_s=2.5, peak_rss_mb=300.0,
                       write_bytes=5),
             TaskUsage(component="train", pid=3, started=5.0, ended=15.0, cpu_s=9.0, peak_rss_mb=900.0)]
    out = by_stage(tasks)
    assert out["features_shard"] == {"tasks": 2, "wall_s": 5.0, "cpu_s": 4.0, "peak_rss_mb": 300.0, "write_bytes": 15}
    assert out["train"]["tasks"] == 1 and out["train"]["peak_rss_mb"] == 900.0


def test_the_scale_presets_scale_users_only():
    base = load_config(SimulatorConfig, section="simulator", preset="small")
    for scale, preset in SCALES.items():
        cfg = load_config(SimulatorConfig, section="simulator", preset=preset)
        assert cfg.users == scale * base.users
        assert (cfg.items, cfg.days, cfg.seed, cfg.activity_log_mean) == (base.items, base.days, base.seed,
                                                                          base.activity_log_mean)
    large = load_config(SimulatorConfig, section="simulator", preset="large")
    for preset, factor in (("events_1m", 0.1), ("events_100m", 10)):
        cfg = load_config(SimulatorConfig, section="simulator", preset=preset)
        assert cfg.users == round(factor * large.users)
        assert (cfg.items, cfg.days, cfg.topics) == (large.items, large.days, large.topics)


def test_a_features_shard_task_imports_no_heavy_library():
    """The per-task floor (issue 30, item 4): a shard build needs neither Feast, pandas,
    DuckDB, torch nor MLflow (each seconds of imports on a loaded 2-core machine)."""
    probe = ("import sys, gem_app.stages.features, gem.features.shards, gem.features.plan; "
             "print(sorted(m for m in ('feast', 'pandas', 'duckdb', 'torch', 'mlflow') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    assert out.strip().splitlines()[-1] == "[]"


def test_the_long_history_presets(tmp_path):
    """Train preset long: the long model (attention the AVX2 kernel takes: softmax,
    non-causal, head dims multiples of 16) on features of histories up to 2,048 events;
    a small copy of its simulated data, windowed as the training benchmark does, averages
    at least 200 history events per example."""
    from benchmarks.training_bench import DATA_PRESETS
    from gem.data.simulate import simulate
    from gem.features.build import build_features
    from gem.features.config import FeaturesConfig
    from gem.training.config import load_train_config

    cfg, model = load_train_config("long")
    assert cfg.model_preset == "long" and cfg.precision == "fp32"
    assert model.attention_form == "softmax" and not model.causal and model.head_dim % 16 == 0
    assert model.attention_backend == "auto"
    names = DATA_PRESETS["long"]
    feats = load_config(FeaturesConfig, section="features", preset=names["features"])
    assert feats.max_seq_len == 2048
    sim = load_config(SimulatorConfig, section="simulator", preset=names["simulator"], overrides=["users=150"])
    simulate(sim, tmp_path / "data", progress=False)
    manifest = build_features(tmp_path / "data", tmp_path / "features", feats,
                              window_start=f"2026-01-{1 + sim.days - names['window_days']:02d}T00:00:00+00:00")
    counts = manifest["counts"]
    assert counts["examples"] > 500
    assert counts["sequence_elements"] / counts["examples"] >= 200


def test_the_noop_pipeline_of_the_floor_runs(tmp_path, monkeypatch):
    # kfp reads a component's source with inspect: the pipeline must run from a file (it
    # ran from `python -c` and failed after a 100-minute scale run, losing its figures)
    monkeypatch.setattr(scale_bench, "NOOP_TASKS", 1)
    assert 0 < scale_bench.noop_task_seconds(tmp_path) < 120


def test_the_features_part_validates_once_and_reports_the_median_of_its_builds(tiny_dataset, tmp_path):
    section = scale_bench.features_builds({"tiny": tiny_dataset}, tmp_path, 1, {"tiny": 3})
    assert section["build_order"] == ["tiny"] * 3
    figures = section["runs"]["tiny"]
    runs = figures["build_s_runs"]
    assert len(runs) == 3 and figures["build_s"] == sorted(runs)[1]
    assert figures["process_s"] >= figures["build_s"]  # each build in its own interpreter, timed inside it
    assert figures["examples"] > 0 and figures["shards"] >= 1 and figures["output_bytes"] > 0
    assert figures["events"] > 0 and figures["validate_peak_rss_gb"] > 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["features-tiny-clean-report"]  # builds, copy removed


def test_the_feast_part_runs_apply_and_materialize_as_separate_processes(tiny_dataset, tmp_path):
    figures = scale_bench.feast_alone(tiny_dataset, tmp_path / "feast")
    assert figures["events"] > 0
    for step in ("feast_apply", "materialize"):  # a child's tree, not this process: an interpreter at least
        assert figures[step]["peak_rss_mb"] > 50 and figures[step]["wall_s"] > 0 and figures[step]["cpu_s"] > 0
    assert not (tmp_path / "feast").exists()


def test_the_sizes_builds_interleave_and_each_large_build_is_set_against_its_neighbours():
    order = scale_bench.interleaved({"10m": 3, "100m": 2})
    assert order == ["10m", "100m", "10m", "100m", "10m"]
    builds = {"10m": [{"build_s": 30.0}, {"build_s": 34.0}, {"build_s": 26.0}],
              "100m": [{"build_s": 320.0}, {"build_s": 300.0}]}
    assert scale_bench.neighbour_ratios(order, builds, "100m", "10m") == [10.0, 10.0]
