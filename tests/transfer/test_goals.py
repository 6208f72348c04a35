"""Per-surface and pooled figures (benchmarks/transfer/figures.py), the restated goals
(benchmarks/transfer/goals.py) and a run written as one section of transfer.json."""

from __future__ import annotations

import json
from dataclasses import asdict
from types import SimpleNamespace

import numpy as np
import pytest

from benchmarks.transfer.analysis import Evidence
from benchmarks.transfer.arms import ArmConfig
from benchmarks.transfer.figures import cut_curve, world_figures
from benchmarks.transfer.goals import restated

SURFACES = {"cat01": 0, "cat02": 1, "cat03": 2}


def _result(gain: dict[str, float], seed: int = 0):
    """A world of three student surfaces (and a teacher-only cat04) whose combined arm beats
    nt_combined by ``gain[surface]`` of signal on each surface."""
    rng = np.random.default_rng(seed)
    n = 1800
    users, x = rng.integers(0, 600, n), rng.normal(size=n)
    y = (rng.random(n) < 1 / (1 + np.exp(-(2 * x - 1)))).astype(float)
    index = {s: np.arange(k, n, 3) for s, k in SURFACES.items()}
    ev = Evidence(y, users, n=200, seed=0)
    arms = {}
    for arm in ("no_teacher", "kd", "combined", "nt_combined"):
        for teacher in ((None,) if arm in ("no_teacher", "nt_combined") else ("t0", "t1")):
            for seed in range(3):
                noise = rng.normal(size=n)
                probs = {}
                for s, i in index.items():
                    quality = {"no_teacher": 0.0, "nt_combined": 0.0, "kd": 0.1, "combined": gain[s]}[arm]
                    probs[s] = (i, 1 / (1 + np.exp(-(x[i] * (0.3 + quality) + noise[i]))))
                ev.add(arm, teacher, seed, probs)
        arms[arm] = [SimpleNamespace(teacher=None, point={}, trials=[], runs={})]
    teacher_metrics = {t: {f"auc/{s}/click": 0.7 for s in SURFACES} | {"auc/cat04/click": 0.4, "auc/all/click": 0.9}
                       for t in ("t0", "t1")}
    world = SimpleNamespace(name="gap0", timings={}, windows={},
                            teachers=[SimpleNamespace(id="t0", seed=0, version="1"),
                                      SimpleNamespace(id="t1", seed=1, version="2")])
    rows = {"train": {**{s: 100 for s in SURFACES}, "cat04": 5}, "evaluation": {**{s: n // 3 for s in SURFACES},
                                                                             "cat04": 3}}
    return SimpleNamespace(evidence=ev, arms=arms, world=world, teacher_metrics=teacher_metrics,
                           surfaces=list(SURFACES), teacher_only={"cat04": "train 5 examples"},
                           examples_by_surface=rows, examples={"train": 305, "validation": 0, "evaluation": n})


CFG = SimpleNamespace(arms={"no_teacher": ArmConfig(), "kd": ArmConfig(transfer={"kd": {"weight": 0.5}}),
                            "combined": ArmConfig(transfer={"kd": {"weight": 0.5}}),
                            "nt_combined": ArmConfig(capacity_of="combined")},
                      differences={"combined_vs_kd": ["combined", "kd"]})


def test_per_surface_figures_have_intervals_and_pool_to_the_headline_lift():
    res = _result({"cat01": 1.5, "cat02": 1.5, "cat03": 0.0})
    f = world_figures(res, CFG)
    per = f["per_surface"]
    assert f["student_surfaces"] == list(SURFACES) and f["teacher_only_surfaces"] == {"cat04": "train 5 examples"}
    assert not per["cat04"]["student"] and "arms" not in per["cat04"] and per["cat04"]["teacher_auc_mean"] == 0.4
    lifts = {s: per[s]["arms"]["combined"]["lift_auc_vs_capacity"] for s in SURFACES}
    assert lifts["cat01"]["lo"] > 0 and lifts["cat02"]["lo"] > 0 and lifts["cat03"]["lo"] < 0 < lifts["cat03"]["hi"]
    pooled = f["arms"]["combined"]["lift_auc_vs_capacity"]  # the pooled lift: the mean over the student surfaces
    assert pooled["mean"] == pytest.approx(np.mean([v["mean"] for v in lifts.values()]))
    # over the student surfaces: neither the teacher-only one nor the "all" figure
    assert f["teachers"]["t0"]["auc_click_surface_mean"] == pytest.approx(0.7)
    assert per["cat01"]["rows"]["evaluation_clicks"] + per["cat01"]["rows"]["evaluation_unclicked"] == 600
    assert "combined_vs_kd" in per["cat02"]["differences"]

    cut = world_figures(_result({"cat01": 0.0, "cat02": 0.0, "cat03": 0.0}, seed=1), CFG)
    cut["examples"]["train"] = 31
    curve = cut_curve({"gap0": f, "rows10": cut}, {"rows10": 0.1})
    assert [(r["world"], r["train_fraction"], r["train_rows"]) for r in curve] == [("gap0", 1.0, 305),
                                                                                     ("rows10", 0.1, 31)]
    assert curve[0]["combined_vs_capacity_surfaces_above_0"] == {"above": ["cat01", "cat02"], "count": 2, "of": 3}
    assert curve[1]["combined_vs_capacity_surfaces_above_0"]["count"] <= 1


def _lift(mean, lo, hi):
    return {"mean": mean, "lo": lo, "hi": hi}


def _dataset(combined_vs_kd, adapter_vs_kd, surfaces_lo, at_10):
    staleness = [{"world": f"gap{g}", "gap_periods": g, "combined_vs_kd_auc": c, "adapter_vs_kd_auc": a,
                  "adapter_vs_kd_ne": a} for g, c, a in zip((0, 1, 2), combined_vs_kd, adapter_vs_kd)]
    staleness.append({"world": "fresh", "gap_periods": None, "combined_vs_kd_auc": _lift(-1, -2, 0)})
    per = {f"cat{i:02d}": {"student": True, "arms": {"combined": {"lift_auc_vs_capacity": _lift(0.01, lo, 0.02)}}}
           for i, lo in enumerate(surfaces_lo)}
    per["cat99"] = {"student": False}
    return {"staleness": staleness, "per_surface": per,
            "row_cuts": [{"world": "gap0", "train_fraction": 1.0},
                         {"world": "rows10", "train_fraction": 0.1, "combined_vs_capacity_auc": at_10}]}


def test_the_restated_goals_read_the_intervals():
    up, flat = _lift(0.02, 0.01, 0.03), _lift(0.01, 0.0, 0.02)
    met = restated(_dataset([up, up, up], [up, up, up], [0.001, 0.002, -0.01], up),
                   _dataset([up, up, up], [flat, up, flat], [0.001, 0.002, -0.01], up))
    assert met["simulator"]["combined_minus_kd_every_gap"]["met"]  # the fresh control is no gap
    ciao = met["ciao"]
    assert ciao["combined_minus_kd_every_gap"]["met"]
    assert ciao["combined_minus_capacity_majority_of_surfaces"] == {
        "met": True, "above": ["cat00", "cat01"], "count": 2, "of": 3,
        "auc_by_surface": {"cat00": _lift(0.01, 0.001, 0.02), "cat01": _lift(0.01, 0.002, 0.02),
                           "cat02": _lift(0.01, -0.01, 0.02)}}
    assert ciao["combined_minus_capacity_at_10pct_rows"]["met"]
    stale = ciao["adapter_minus_kd_stale_gaps"]
    assert stale["met"] and not stale["interval_above_0"] and set(stale["auc_by_gap"]) == {"gap1", "gap2"}

    missed = restated(None, _dataset([up, flat, up], [up, _lift(-0.01, -0.02, 0.0), up], [0.001, -0.01, -0.02, 0.3],
                                     _lift(0.01, 0.0, 0.02)))["ciao"]
    assert not missed["combined_minus_kd_every_gap"]["met"]  # an interval touching 0 at one gap
    assert not missed["combined_minus_capacity_majority_of_surfaces"]["met"]  # 2 of 4 is no majority
    assert not missed["combined_minus_capacity_at_10pct_rows"]["met"]
    assert not missed["adapter_minus_kd_stale_gaps"]["met"]


def test_a_section_keeps_the_rest_of_the_result_file(tmp_path, monkeypatch):
    from benchmarks.transfer.bench import write_section

    monkeypatch.setenv("GEM_BENCH_RESULTS", str(tmp_path))
    up = _lift(0.02, 0.01, 0.03)
    simulator = _dataset([up, up, up], [up, up, up], [0.01], up)
    before = {"datasets": {"simulator": simulator}, "serving": {"paths": {"cached": 1}}, "wall_seconds": 9.0}
    (tmp_path / "transfer.json").write_text(json.dumps(before))
    ciao = _dataset([up, up, up], [up, up, up], [0.01, 0.02, 0.03], up)
    path = write_section("transfer", "ciao", {"datasets": {"ciao": ciao}, "wall_seconds": 5.0}, {"ciao": {}})
    after = json.loads(path.read_text())
    assert {k: after[k] for k in before} == before
    assert after["ciao"]["datasets"]["ciao"] == ciao and after["ciao"]["wall_seconds"] == 5.0
    assert after["goals"]["simulator"]["combined_minus_kd_every_gap"]["met"]
    assert after["goals"]["ciao"]["combined_minus_capacity_majority_of_surfaces"]["count"] == 3


def test_the_ciao_preset_runs_the_simulator_protocol_and_arms():
    from benchmarks.transfer.experiment import load_experiment_config

    bench, ciao = load_experiment_config("bench"), load_experiment_config("ciao")
    assert {k: asdict(v) for k, v in ciao.arms.items()} == {k: asdict(v) for k, v in bench.arms.items()}
    for key in ("teacher_preset", "teacher_overrides", "max_seq_len", "threads", "student", "optim", "knowledge",
                "bootstrap", "differences", "staleness_arms"):
        assert getattr(ciao, key) == getattr(bench, key), key


def test_the_serving_preset_measures_the_bench_runs_student():
    """gem/configs/students/serving.yaml claims the bench's headline world, its first
    teacher and the representation student at the point the bench run selected."""
    from benchmarks.transfer.experiment import load_experiment_config
    from benchmarks.transfer.worlds import windows
    from gem.config import from_dict
    from gem.data.contract import parse_utc
    from gem.data.simulate import SimulatorConfig

    bench, serving = load_experiment_config("bench"), load_experiment_config("serving")
    sim = next(d for d in bench.datasets if d.name == "simulator")
    (ds,) = serving.datasets
    start = parse_utc(from_dict(SimulatorConfig, sim.simulator).start_date)
    assert windows(ds, start, "gap0") == windows(sim, start, "gap0") and ds.simulator == sim.simulator
    assert serving.teacher_seeds == bench.teacher_seeds[:1] and serving.seeds == bench.seeds[:1]
    assert asdict(serving.serving) == asdict(bench.serving)
    for key in ("teacher_preset", "teacher_overrides", "max_seq_len", "threads", "student", "optim", "knowledge"):
        assert getattr(serving, key) == getattr(bench, key), key
    arm = serving.arms["representation"]
    assert arm.transfer == bench.arms["representation"].transfer and arm.grid[0] in bench.arms["representation"].grid
