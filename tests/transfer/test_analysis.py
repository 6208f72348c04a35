"""The benchmark's protocol pieces without training: worlds' windows, equal grids, and
lifts paired by run with intervals that see both the users and the runs."""

from __future__ import annotations

import datetime as dt

import numpy as np
import pytest

from benchmarks.transfer.analysis import Evidence
from benchmarks.transfer.arms import ArmConfig, check_arms
from benchmarks.transfer.worlds import FRESH, DatasetConfig, check_world_windows, windows, world_names

START = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)


def test_every_world_shares_the_student_windows_and_only_the_teacher_moves():
    ds = DatasetConfig(name="sim", source="simulator", teacher_periods=3, train_periods=2, validation_periods=1,
                       gap=0, staleness_gaps=[1, 3, 7], fresh_control=True)
    names = world_names(ds)
    assert names == ["gap0", "gap1", "gap3", "gap7", FRESH]
    all_windows = {n: windows(ds, START, n) for n in names}
    for name, w in all_windows.items():
        check_world_windows(name, w)
        for key in ("train", "validation", "evaluation"):
            assert w[key] == all_windows["gap0"][key]
    s = dt.datetime.fromisoformat(all_windows["gap0"]["train"][0])
    assert s == START + dt.timedelta(days=10)  # room for the largest gap before the student window
    for gap in (0, 1, 3, 7):
        lo, hi = (dt.datetime.fromisoformat(x) for x in all_windows[f"gap{gap}"]["teacher"])
        assert hi == s - dt.timedelta(days=gap) and hi - lo == dt.timedelta(days=3)
    fresh = all_windows[FRESH]
    assert fresh["teacher"][1] == fresh["validation"][0]  # it has seen train, never validation or evaluation
    with pytest.raises(ValueError, match="overlap"):
        check_world_windows("gap0", fresh)


def test_arms_must_search_grids_of_one_size():
    grid = [{"optim.weight_decay": 0.0}, {"optim.weight_decay": 0.3}]
    check_arms({"no_teacher": ArmConfig(grid=grid), "kd": ArmConfig(transfer={"kd": {"weight": 0.5}}, grid=grid)})
    with pytest.raises(ValueError, match="same size"):
        check_arms({"no_teacher": ArmConfig(grid=grid), "kd": ArmConfig(transfer={"kd": {"weight": 0.5}},
                                                                         grid=grid[:1])})
    with pytest.raises(ValueError, match="must not use the teacher"):
        check_arms({"no_teacher": ArmConfig(),
                    "x": ArmConfig(transfer={"kd": {"weight": 0.5}}, capacity_of="no_teacher")})


def _world(n=3000, seed=0):
    rng = np.random.default_rng(seed)
    users = rng.integers(0, 400, n)
    x = rng.normal(size=n)
    y = (rng.random(n) < 1 / (1 + np.exp(-(1.5 * x - 2)))).astype(float)
    surfaces = {"feed": np.arange(0, n, 2), "video": np.arange(1, n, 2)}
    return users, x, y, surfaces, rng


def test_lifts_are_paired_by_run_and_the_interval_sees_runs_and_users():
    users, x, y, surfaces, rng = _world()
    ev = Evidence(y, users, n=400, seed=0)
    for seed in range(4):
        noise = rng.normal(scale=1.5, size=len(x))
        base = 1 / (1 + np.exp(-(x + noise)))
        ev.add("no_teacher", None, seed, {s: (i, base[i]) for s, i in surfaces.items()})
        for teacher in ("t0", "t1"):
            better = 1 / (1 + np.exp(-(x + 0.5 * noise)))
            ev.add("kd", teacher, seed, {s: (i, better[i]) for s, i in surfaces.items()})
            ev.add("copy", teacher, seed, {s: (i, better[i]) for s, i in surfaces.items()})
    lift = ev.lift("kd", "no_teacher", "auc")
    assert lift["runs"] == 8 and lift["excludes_zero"] and lift["lo"] > 0  # matched by seed to the baseline
    assert lift["sd_runs"] == pytest.approx(np.std(lift["per_run"], ddof=1), rel=1e-4)
    same = ev.lift("copy", "kd", "auc")  # matched by (teacher, seed): identical predictions, no difference
    assert same["mean"] == 0 and same["lo"] == same["hi"] == 0 and not same["excludes_zero"]
    assert ev.lift("kd", "no_teacher", "ne")["mean"] > 0  # lower NE is a positive lift
    ratio = ev.ratio(("copy", "no_teacher"), ("kd", "no_teacher"), "auc")
    assert ratio["defined"] and ratio["mean"] == pytest.approx(1.0) and ratio["lo"] == pytest.approx(1.0)
    undefined = ev.ratio(("kd", "no_teacher"), ("copy", "kd"), "auc")  # a denominator of zero
    assert not undefined["defined"] and "does not exclude zero" in undefined["why"]


def test_run_to_run_spread_widens_the_interval():
    users, x, y, surfaces, rng = _world(seed=1)
    narrow, wide = Evidence(y, users, n=400, seed=0), Evidence(y, users, n=400, seed=0)
    base = 1 / (1 + np.exp(-(x + rng.normal(scale=1.5, size=len(x)))))
    for seed in range(6):
        for ev in (narrow, wide):
            ev.add("no_teacher", None, seed, {s: (i, base[i]) for s, i in surfaces.items()})
        steady = 1 / (1 + np.exp(-(x + 1.0 * rng.normal(scale=1.0, size=len(x)))))
        shaky = 1 / (1 + np.exp(-(x + (0.2 if seed % 2 else 2.5) * rng.normal(size=len(x)))))
        narrow.add("kd", "t0", seed, {s: (i, steady[i]) for s, i in surfaces.items()})
        wide.add("kd", "t0", seed, {s: (i, shaky[i]) for s, i in surfaces.items()})
    a, b = narrow.lift("kd", "no_teacher", "auc"), wide.lift("kd", "no_teacher", "auc")
    assert b["sd_runs"] > 3 * a["sd_runs"] and (b["hi"] - b["lo"]) > (a["hi"] - a["lo"])


def test_the_goal_is_judged_in_every_world_of_the_staleness_sweep():
    from benchmarks.transfer.figures import staleness_curve
    from benchmarks.transfer.report import _goal

    lift = {"mean": 0.02, "lo": 0.01, "hi": 0.03, "excludes_zero": True}
    ratios = {"gap0": {"defined": True, "mean": 1.5, "lo": 0.9, "hi": 3.0},
              "gap3": {"defined": True, "mean": 2.4, "lo": 1.2, "hi": 5.0},
              "gap7": {"defined": False, "why": "denominator's interval includes zero"}}
    figures = {name: {"teachers": {"t0": {"auc_click_surface_mean": 0.7}},
                      "arms": {a: {"lift_auc": lift, "lift_ne": lift} for a in ("kd", "adapter", "combined")},
                      "differences": {"combined_vs_kd": {"auc": lift, "ne": lift}},
                      "ratios": {"transfer_ratio_combined": {"auc": r}}} for name, r in ratios.items()}
    figures = {"gap0": figures["gap0"], "rows10": figures["gap0"], **figures}  # a row cut is no staleness world
    rows = {r["world"]: r for r in staleness_curve(figures)}
    assert rows["gap3"]["combined_lift_auc"] == lift and rows["gap3"]["combined_vs_kd_auc"] == lift
    assert {w: _goal(r["transfer_ratio_combined_auc"]) for w, r in rows.items()} == {
        "gap0": False, "gap3": True, "gap7": False}  # below 2; met; a ratio that is not defined never meets it


def test_serving_waits_for_the_other_jobs(tmp_path):
    import threading
    import time

    from benchmarks.transfer.serving import wait_quiet

    other = tmp_path / "part-1.json"
    threading.Timer(0.3, other.write_text, args=("{}",)).start()
    assert wait_quiet([other], timeout_s=30, poll_s=0.05) >= 0.2 and other.is_file()
    t0 = time.perf_counter()
    wait_quiet([tmp_path / "never.json"], timeout_s=0.2, poll_s=0.05)
    assert time.perf_counter() - t0 < 5  # gives up


def test_the_combined_variants_check_runs_the_bench_headline_world():
    """gem/configs/students/combined_variants.yaml claims to reproduce the bench's gap-0
    world (its windows, teachers and the kd / combined arms): it must stay in step."""
    from dataclasses import asdict

    from benchmarks.transfer.experiment import load_experiment_config
    from gem.config import from_dict
    from gem.data.contract import parse_utc
    from gem.data.simulate import SimulatorConfig

    bench, check = load_experiment_config("bench"), load_experiment_config("combined_variants")
    sim = next(d for d in bench.datasets if d.name == "simulator")
    (ds,) = check.datasets
    data_start = parse_utc(from_dict(SimulatorConfig, sim.simulator).start_date)
    assert windows(ds, data_start, "gap0") == windows(sim, data_start, "gap0")
    assert ds.simulator == sim.simulator and ds.num_buckets == sim.num_buckets
    for key in ("seeds", "teacher_seeds", "teacher_preset", "teacher_overrides", "max_seq_len", "threads",
                "student", "optim", "knowledge", "bootstrap"):
        assert getattr(check, key) == getattr(bench, key), key
    for arm in ("no_teacher", "kd", "combined"):
        assert asdict(check.arms[arm]) == asdict(bench.arms[arm]), arm
    assert len(check.arms["combined_frozen_light"].grid) == len(bench.arms["combined"].grid)
