import math

import pytest
import torch
from sklearn.metrics import roc_auc_score

from gem.config import ConfigError
from gem.data.batch import synthetic_batch
from gem.training.config import load_train_config
from gem.training.data import SyntheticLoader, default_synthetic_spec, rank_slice
from gem.training.efficiency import EfficiencyMeter, measure_peak_flops
from gem.training.metrics import SurfaceTaskMetrics


def test_metrics_match_definitions():
    gen = torch.Generator().manual_seed(0)
    n = 400
    probs = torch.rand(n, 2, generator=gen) * 0.6
    labels = (torch.rand(n, 2, generator=gen) < probs).float()
    surface = torch.randint(0, 4, (n,), generator=gen)
    metrics = SurfaceTaskMetrics(["feed", "video", "stories", "messaging"], ["click", "conversion"])
    metrics.update(probs[:150], labels[:150], surface[:150])
    metrics.update(probs[150:], labels[150:], surface[150:])
    out = metrics.compute()
    mask = surface == 1
    p, y = probs[mask, 0].double(), labels[mask, 0].double()
    assert out["auc/video/click"] == pytest.approx(roc_auc_score(y, p), abs=1e-6)
    rate = float(y.mean())
    logloss = float(-(y * p.log() + (1 - y) * (1 - p).log()).mean())
    entropy = -(rate * math.log(rate) + (1 - rate) * math.log(1 - rate))
    assert out["ne/video/click"] == pytest.approx(logloss / entropy, rel=1e-6)
    assert out["calibration/video/click"] == pytest.approx(float(p.mean()) / rate, rel=1e-6)
    assert out["count/all/conversion"] == n
    curves = metrics.calibration_curve()
    assert sum(curves["click"][2]) == n


def test_an_auc_on_a_handful_of_positives_is_not_shown():
    """Issue 31, item 2: below gem.utils.evidence.MIN_AUC_EVIDENCE positives or negatives a
    group gets no AUC (so no MLflow metric) and reads "n/a (k positives)"; its counts stay."""
    from gem.utils.evidence import MIN_AUC_EVIDENCE, auc_text

    metrics = SurfaceTaskMetrics(["feed", "video"], ["click"])
    labels = torch.zeros(200, 1)
    labels[:40] = 1  # feed (even rows) 20 clicks; video (odd rows) 20 clicks, but only 3 on video
    labels[1:40:2] = 0
    labels[[1, 3, 5]] = 1
    surface = torch.arange(200) % 2
    metrics.update(torch.rand(200, 1, generator=torch.Generator().manual_seed(0)), labels, surface)
    out = metrics.compute()
    assert out["positives/video/click"] == 3 < MIN_AUC_EVIDENCE and "auc/video/click" not in out
    assert out["positives/feed/click"] == 20 and 0 <= out["auc/feed/click"] <= 1
    assert out["negatives/feed/click"] == 80 and "ne/video/click" in out
    assert auc_text(out.get("auc/video/click"), 3, 97) == "n/a (3 positives)"
    assert auc_text(1.0, 2, 1) == "n/a (2 positives, 1 negatives)" and auc_text(float("nan")) == "n/a"
    assert auc_text(0.71234, 20, 80) == "0.7123" and auc_text(0.012, 50, 50, sign=True) == "+0.0120"
    # as a kfp step passes it on: the NaN and the missing count become "" (kfp carries no NaN)
    from gem_app.stages.context import without_nulls

    carried = without_nulls({"auc": float("nan"), "positives": None, "ne": 0.5, "list": [float("inf"), 1.0]})
    assert carried == {"auc": "", "positives": "", "ne": 0.5, "list": ["", 1.0]}
    assert auc_text(carried["auc"], carried["positives"], 40) == "n/a"
    # and on a kfp Metrics artifact, from a fresh result or a recorded one (a rerun's reuse)
    from kfp.dsl import Metrics

    from gem_app.components.runtime import log_figures

    artifact = Metrics(name="metrics", uri="/tmp/unused")
    log_figures(artifact, {"auc": float("nan"), "ne": 0.5, "positives": 3}, prefix="student.")
    log_figures(artifact, carried, prefix="recorded.")
    assert artifact.metadata == {"student.ne": 0.5, "student.positives": 3.0, "recorded.ne": 0.5}
    from gem.utils.evidence import computed

    assert computed({"auc": float("nan"), "lift": "", "n": None, "ne": 0.5, "k": 3}) == {"ne": 0.5, "k": 3.0}


def test_the_summary_shows_short_evidence_as_not_available():
    from gem_app.stages.summary import markdown_table

    row = {"surface": "video", "teacher_auc": 1.0, "teacher_ne": 0.5, "teacher_positives": 2.0,
           "teacher_negatives": 40.0, "student_auc": float("nan"), "student_ne": 0.9, "no_teacher_auc": float("nan"),
           "lift_auc": float("nan"), "lift_ne": 0.01, "holdout_positives": 2.0, "holdout_negatives": 40.0,
           "student": "student_video v1", "decision": "not enough evidence", "why": "2 positives, needs 30"}
    table = markdown_table("run", "models:/gem_teacher/1", [row])
    line = next(line for line in table.splitlines() if line.startswith("| video"))
    assert "1.0000" not in line and "0.0000" not in line and line.count("n/a (2 positives)") == 5


def test_the_summary_shows_students_against_their_teacher_with_intervals_and_pooled():
    from gem_app.stages.summary import markdown_table, pooled_vs_teacher

    def row(surface, auc, lo, hi, rows):
        return {"surface": surface, "teacher_auc": 0.7, "teacher_ne": 0.9, "teacher_positives": 50.0,
                "teacher_negatives": 400.0, "student_auc": 0.7 + auc, "student_ne": 0.95, "no_teacher_auc": 0.6,
                "lift_auc": 0.1, "lift_ne": 0.02, "holdout_positives": 50.0, "holdout_negatives": 400.0,
                "vs_teacher_auc": auc, "vs_teacher_auc_lo": lo, "vs_teacher_auc_hi": hi, "vs_teacher_ne": 0.05,
                "vs_teacher_ne_lo": 0.01, "vs_teacher_ne_hi": 0.09, "vs_teacher_rows": rows,
                "student": f"student_{surface} v1 (recalibrated)", "decision": "keep", "why": "-"}

    rows = [row("feed", -0.02, -0.04, 0.0, 300.0), row("video", 0.01, -0.01, 0.03, 100.0)]
    table = markdown_table("run", "models:/gem_teacher/1", rows)
    line = next(line for line in table.splitlines() if line.startswith("| feed"))
    assert "-0.0200 [-0.0400, +0.0000]" in line and "+0.0500 [+0.0100, +0.0900]" in line
    pooled = pooled_vs_teacher(rows)
    assert pooled["auc"] == pytest.approx(0.75 * -0.02 + 0.25 * 0.01) and pooled["surfaces"] == 2
    assert pooled["auc_lo"] < pooled["auc"] < pooled["auc_hi"]
    # independent surfaces: the pooled interval is narrower than the widest surface's
    assert pooled["auc_hi"] - pooled["auc_lo"] < 0.04
    assert "pooled over 2 surfaces (400 holdout rows" in table
    assert pooled_vs_teacher([{**rows[0], "vs_teacher_auc": None}]) == {}


def test_rank_slices_partition_the_global_batch():
    batch = synthetic_batch(default_synthetic_spec(), 10, mean_len=5.0)
    parts = [rank_slice(batch, r, 3) for r in range(3)]
    assert [p.batch_size for p in parts] == [3, 3, 4]
    assert torch.equal(torch.cat([p.sequence_age for p in parts]), batch.sequence_age)
    assert torch.equal(torch.cat([p.sequence.values() for p in parts]).sort().values,
                       batch.sequence.values().sort().values)
    assert torch.equal(torch.cat([p.labels for p in parts]), batch.labels)


def test_synthetic_loader_state_resumes_mid_epoch():
    spec = default_synthetic_spec()
    loader = SyntheticLoader(spec, 256, batch_size=32, seed=3)
    it = iter(loader)
    [next(it) for _ in range(3)]
    state = loader.state_dict()
    expected = next(it)
    other = SyntheticLoader(spec, 256, batch_size=32, seed=3)
    other.load_state_dict(state)
    assert torch.equal(next(iter(other)).example_id, expected.example_id)


def test_efficiency_meter_and_peak():
    peak = measure_peak_flops("cpu", torch.float32, size=256, repeats=1, use_cache=False)
    assert peak > 1e8
    meter = EfficiencyMeter(train_flops_per_example=1e6, peak_flops=1e10, launch_time=None, warmup_steps=0)
    meter.step_begin()
    sum(range(10000))
    meter.step_end(100)
    figures = meter.summary()
    expected_mfu = figures["perf/examples_per_s"] * 1e6 / 1e10
    assert figures["perf/mfu"] == pytest.approx(expected_mfu)
    assert figures["perf/startup_seconds"] > 0 and 0 < figures["perf/effective_training_time"] <= 1


def test_train_config_overrides_route_to_model():
    cfg, model_cfg = load_train_config("tiny", ["batch_size=32", "model.num_layers=3", "optim.dense_lr=0.01"])
    assert cfg.batch_size == 32 and model_cfg.num_layers == 3 and cfg.optim.dense_lr == 0.01
    with pytest.raises(ValueError, match="precision='fp16' must be one of"):
        load_train_config("tiny", ["precision=fp16"])
    with pytest.raises(ConfigError, match="unknown key"):
        load_train_config("tiny", ["model.no_such_knob=1"])


def test_lightning_engine_trains_with_the_shared_step(tmp_path):
    from gem.training.lightning_module import train_lightning

    cfg, model_cfg = load_train_config("tiny", ["engine=lightning", "max_steps=3", "precision=bf16"])
    result = train_lightning("synthetic://256", tmp_path, cfg, model_cfg, eval_features="synthetic://128")
    assert result.steps == 3
    assert 0.0 <= result.eval_metrics["eval/auc/all/click"] <= 1.0


def test_bf16_compile_and_checkpointing_step_runs():
    from gem.model import build_model
    from gem.training.distributed import attach_embedding_optimizer
    from gem.training.parallelize import apply_activation_checkpointing, apply_compile
    from gem.training.step import build_dense_optimizer, train_step

    cfg, model_cfg = load_train_config("tiny")
    spec = default_synthetic_spec()
    model = build_model(model_cfg, spec)
    assert apply_activation_checkpointing(model) == model_cfg.num_layers
    assert apply_compile(model) > 0
    attach_embedding_optimizer(model, 0.05)
    opt, _ = build_dense_optimizer(model, 1e-3, 0.0, [0.9, 0.999])
    loader = SyntheticLoader(spec, 128, batch_size=64)
    before = model.heads.trunk[0].weight.detach().clone()
    losses = [float(train_step(model, b, opt, precision="bf16").loss) for b in loader]
    assert all(math.isfinite(x) for x in losses)
    assert not torch.equal(before, model.heads.trunk[0].weight)


def test_lr_schedule_warms_up_then_decays_to_the_floor_at_the_last_step():
    from gem.training.step import build_dense_optimizer, lr_factor

    kw = dict(warmup_steps=4, total_steps=20, min_ratio=0.1)
    assert [lr_factor(s, **kw) for s in range(4)] == [0.25, 0.5, 0.75, 1.0]
    for decay in ("linear", "cosine"):
        curve = [lr_factor(s, decay=decay, **kw) for s in range(4, 20)]
        assert curve[0] == 1.0 and all(a > b for a, b in zip(curve, curve[1:]))
        assert 0.1 < curve[-1] < 0.2 and lr_factor(25, decay=decay, **kw) == pytest.approx(0.1)
    assert lr_factor(19, decay="none", **kw) == 1.0
    model = torch.nn.Linear(2, 1)
    opt, sched = build_dense_optimizer(model, 1e-2, 0.0, [0.9, 0.999], decay="cosine", total_steps=10)
    lrs = []
    for _ in range(10):
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    assert lrs[0] == pytest.approx(1e-2) and lrs[-1] < 1e-3 and lrs == sorted(lrs, reverse=True)
    assert build_dense_optimizer(model, 1e-2, 0.0, [0.9, 0.999])[1] is None
    with pytest.raises(ValueError, match="lr decay"):
        build_dense_optimizer(model, 1e-2, 0.0, [0.9, 0.999], decay="step")


def test_gpu_benchmark_measures_one_preset_on_any_device():
    """The H200 script's per-preset path, run small on the CPU so that it can't rot
    between the sessions that have a GPU."""
    from benchmarks.training_bench_gpu import run_one

    figures = run_one("tiny", steps=3, batch_size=32, extra=("compile=false", "measure_peak=false"))
    assert figures["steps"] == 3 and figures["batch_size"] == 32
    assert figures["examples_per_s"] > 0 and figures["train_flops_per_example"] > 0
    assert figures["startup_seconds"] > 0 and 0 < figures["effective_training_time"] <= 1
    assert math.isnan(figures["mfu"]) or 0 < figures["mfu"] < 1


def test_the_summary_says_in_the_decision_column_which_kept_students_are_not_offered():
    # issue 43: on Ciao five kept students (NE >= 1, their teacher's below 1) read "keep"
    # in the table; that they got no challenger alias was only at the end of a long reason
    from gem_app.stages.summary import _row, headline, markdown_table

    def distilled(surface, offered):
        return {"surface": surface, "metrics": {"student": {"auc": 0.6, "ne": 1.02 if not offered else 0.95},
                                                "no_teacher": {"auc": 0.55}},
                "lift": {"auc": 0.05}, "model_name": f"student_{surface}", "version": "1", "decision": "keep",
                "why": "NE 1.0200 >= 1", "gate": {"outcome": "keep", "offered": offered}}

    rows = [_row({"metrics": {}}, distilled("cat08", False)), _row({"metrics": {}}, distilled("cat01", True))]
    lines = markdown_table("run", "models:/gem_teacher/1", rows).splitlines()
    assert "| keep (not offered) |" in next(line for line in lines if line.startswith("| cat08"))
    assert "| keep |" in next(line for line in lines if line.startswith("| cat01"))
    figures = headline({"metrics": {}}, rows)
    assert figures["decisions/not_offered"] == 1.0 and figures["decisions/keep"] == 2.0


def test_the_summary_names_the_students_that_kept_the_teachers_days():
    # issue 43: with the students' window reaching into the teacher's days, validation
    # decides per surface whether those rows train the student; the table says where it did
    from gem_app.stages.summary import _row, headline, markdown_table

    def distilled(surface, rows):
        return {"surface": surface, "metrics": {"student": {"auc": 0.6, "ne": 0.9}, "no_teacher": {"auc": 0.55}},
                "lift": {"auc": 0.05}, "model_name": f"student_{surface}", "version": "1", "decision": "promote",
                "why": "-", "selection": {"student": {"point": {}, "rows": rows}}}

    rows = [_row({"metrics": {}}, distilled("books", "all")), _row({"metrics": {}}, distilled("games", "fresh"))]
    lines = markdown_table("run", "models:/gem_teacher/1", rows).split("\n")
    said = next(line for line in lines if line.startswith("Students trained on the teacher's days"))
    assert said.endswith(": books (1 of 2; the others on their own window only)"), said
    assert headline({"metrics": {}}, rows)["students/on_teacher_days"] == 1.0
    own = [_row({"metrics": {}}, distilled("books", ""))]  # no overlap: no such figure
    assert "students/on_teacher_days" not in headline({"metrics": {}}, own)


def test_the_metrics_import_is_not_in_the_throughput_window(tmp_path, monkeypatch):
    """The training metrics (torchmetrics' ~0.7 s import) are built after the first step,
    before the window the run's examples/s is read over opens; their predictions are all kept."""
    import time

    from gem.training import metrics
    from gem.training.config import load_train_config
    from gem.training.trainer import train

    built = metrics.SurfaceTaskMetrics.__init__

    def slow_init(self, *args, **kwargs):
        time.sleep(3.0)  # an import far slower than the run's steps together
        built(self, *args, **kwargs)

    monkeypatch.setattr(metrics.SurfaceTaskMetrics, "__init__", slow_init)
    # past the 64 steps after which the deferred metrics first fold their predictions in
    cfg, model_cfg = load_train_config("tiny", ["max_steps=70", "checkpoint_every=0", "log_model=false",
                                                "system_metrics=false", "measure_peak=false", "threads=1"])
    result = train("synthetic://8192", tmp_path, cfg, model_cfg)
    assert result.perf["perf/step_time_share"] > 0.6, result.perf
    assert result.train_metrics["train_epoch/count/all/click"] == 70 * cfg.batch_size
