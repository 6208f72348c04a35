"""precision: auto trains its first steps in fp32 and bf16 alternately, keeps the one with
fewer seconds per FLOP, skips the trial where bf16 matmuls are not faster, and evaluates
(and keeps holdout predictions) in fp32, as the exported weights are scored."""

import math

import pytest
import torch

from gem.config import ConfigError
from gem.training import precision as precision_mod
from gem.training.precision import PrecisionTrial, fixed_precision, precision_trial


def run_trial(trial: PrecisionTrial, steps: int, cost: dict[str, float]) -> list[str]:
    used = []
    for _ in range(steps):
        p = trial.precision()
        used.append(p)
        trial.after_step(cost[p] * 1e9, 1e9)
    return used


@pytest.mark.parametrize("cost, chosen", [({"fp32": 1.0, "bf16": 0.6}, "bf16"), ({"fp32": 1.0, "bf16": 1.5}, "fp32")])
def test_trial_alternates_then_keeps_the_cheaper_precision(cost, chosen):
    trial = PrecisionTrial(trial_steps=2, warmup_steps=1)
    used = run_trial(trial, 9, cost)
    assert used[:5] == ["fp32", "fp32", "bf16", "fp32", "bf16"]  # warm-up, then alternating
    assert trial.chosen == chosen and used[5:] == [chosen] * 4
    assert trial.ratio == pytest.approx(cost["bf16"] / cost["fp32"])
    assert trial.steps_needed == 5


def test_ranks_decide_on_their_summed_costs():
    seen = []

    def reduce(medians):  # another rank found bf16 much slower
        seen.append(list(medians))
        return [medians[0] + 1.0, medians[1] + 3.0]

    trial = PrecisionTrial(trial_steps=1, warmup_steps=0, reduce=reduce)
    run_trial(trial, 3, {"fp32": 1.0, "bf16": 0.9})
    assert len(seen) == 1 and trial.chosen == "fp32"


def test_auto_skips_the_trial_where_bf16_matmuls_are_not_faster(monkeypatch):
    cpu = torch.device("cpu")
    assert precision_trial("fp32", cpu).chosen == "fp32" and precision_trial("bf16", cpu).chosen == "bf16"
    assert precision_trial("bf16", cpu).precision() == "bf16" and precision_trial("fp32", cpu).steps_needed == 0
    monkeypatch.setattr(precision_mod, "bf16_matmul_gain", lambda: 0.1)  # an AVX2 host: bf16 in software
    assert precision_trial("auto", cpu).chosen == "fp32"
    monkeypatch.setattr(precision_mod, "bf16_matmul_gain", lambda: 2.0)
    assert precision_trial("auto", cpu).chosen is None  # a trial over the first steps
    assert fixed_precision("auto") == "fp32" and fixed_precision("bf16") == "bf16"


def test_matmul_gain_is_a_positive_ratio():
    gain = precision_mod.bf16_matmul_gain(size=64, repeats=1)
    assert math.isfinite(gain) and gain > 0


def test_config_takes_auto_and_refuses_others():
    from gem.training.config import load_train_config

    assert load_train_config("pipeline")[0].precision == "auto"
    with pytest.raises(ConfigError, match="precision='fp16'"):
        load_train_config("tiny", ["precision=fp16"])


def test_training_tries_both_then_keeps_one_and_evaluates_in_fp32(tmp_path, monkeypatch):
    import gem.training.trainer as trainer
    from gem.training.config import load_train_config

    monkeypatch.setattr(precision_mod, "bf16_matmul_gain", lambda: 2.0)  # the trial runs on any host
    steps, evals = [], []
    real_step, real_eval = trainer.train_step, trainer.evaluate

    def recording_step(*args, precision, **kwargs):
        steps.append(precision)
        return real_step(*args, precision=precision, **kwargs)

    def recording_eval(*args, precision, **kwargs):
        evals.append(precision)
        return real_eval(*args, precision=precision, **kwargs)

    monkeypatch.setattr(trainer, "train_step", recording_step)
    monkeypatch.setattr(trainer, "evaluate", recording_eval)
    cfg, model_cfg = load_train_config("tiny", ["precision=auto", "max_steps=8", "checkpoint_every=0",
                                                "log_model=false", "system_metrics=false", "measure_peak=false",
                                                "threads=1"])
    result = trainer.train("synthetic://512", tmp_path, cfg, model_cfg, eval_features="synthetic://128")
    assert steps[:5] == ["fp32", "fp32", "bf16", "fp32", "bf16"]
    assert len(set(steps[5:])) == 1 and result.perf["perf/bf16"] == float(steps[-1] == "bf16")
    assert result.perf["perf/bf16_step_time_ratio"] > 0
    assert evals == ["fp32"] and math.isfinite(result.eval_metrics["eval/auc/all/click"])


def test_a_run_raises_a_stale_low_peak_and_its_mfu_uses_it(tmp_path, monkeypatch):
    """A peak first measured while other jobs held the cores stays in the cache as the
    best seen; every run measures again after its last step, so the MFU is not read
    against a peak the machine beats."""
    import json

    from gem.training.config import load_train_config
    from gem.training.efficiency import _device_key, cached_peak_flops
    from gem.training.trainer import train

    monkeypatch.setenv("GEM_CACHE_DIR", str(tmp_path / "cache"))
    (tmp_path / "cache").mkdir()
    stale = 1e6  # 1 MFLOP/s: far below any CPU's matmul rate
    cfg, model_cfg = load_train_config("tiny", ["max_steps=4", "checkpoint_every=0", "log_model=false",
                                                "system_metrics=false", "threads=1"])
    saved = torch.get_num_threads()
    try:
        torch.set_num_threads(1)  # the peak is kept per thread count
        key = _device_key(torch.device("cpu"), torch.float32)
        (tmp_path / "cache" / "peak_flops.json").write_text(json.dumps({key: stale}))
        perf = train("synthetic://256", tmp_path / "run", cfg, model_cfg).perf
        peak = cached_peak_flops("cpu", torch.float32)
    finally:
        torch.set_num_threads(saved)
    assert peak > 100 * stale
    assert perf["perf/mfu"] == pytest.approx(perf["perf/model_flops_per_s"] / peak, rel=1e-6)


def _rank_trial(rank: int, init_file: str, results) -> None:
    import torch.distributed as dist

    from gem.training.distributed import DistEnv
    from gem.training.trainer import _sum_over_ranks

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
    try:
        env = DistEnv(rank, 2, rank, torch.device("cpu"), "gloo", False)
        trial = PrecisionTrial(trial_steps=1, warmup_steps=0, reduce=_sum_over_ranks(env))
        # rank 0 finds bf16 a little faster, rank 1 much slower: the sum says fp32
        run_trial(trial, 3, {"fp32": 1.0, "bf16": 0.9 if rank == 0 else 2.0})
        results.put((rank, trial.chosen))
    finally:
        dist.destroy_process_group()


def test_two_ranks_keep_the_same_precision(tmp_path):
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    procs = [ctx.Process(target=_rank_trial, args=(rank, str(tmp_path / "store"), results)) for rank in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=120)
    assert [p.exitcode for p in procs] == [0, 0]
    assert sorted(results.get(timeout=5) for _ in procs) == [(0, "fp32"), (1, "fp32")]


def test_the_pipeline_console_gets_the_training_steps_as_a_bar(tmp_path, monkeypatch, capfd):
    # the teacher's training, the longest step of a pipeline run, showed no bar in the
    # console (a blank live line for half an hour on MovieLens-1M)
    import json

    from gem.training.config import load_train_config
    from gem.training.trainer import train
    from gem.utils.progress import EVENT_PREFIX

    monkeypatch.setenv("GEM_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("GEM_PROGRESS", "events")
    cfg, model_cfg = load_train_config("tiny", ["max_steps=6", "checkpoint_every=0", "log_model=false",
                                                "system_metrics=false", "threads=1", "measure_peak=false"])
    train("synthetic://512", tmp_path / "run", cfg, model_cfg)
    events = [json.loads(line.split(EVENT_PREFIX, 1)[1]) for line in capfd.readouterr().out.split("\n")
              if EVENT_PREFIX in line]
    steps = [e for e in events if e["kind"] == "progress" and e["desc"] == "train"]
    assert steps and all(e["total"] == 6 for e in steps)
    assert steps[-1].get("done") and steps[-1]["n"] == 6
