"""The thread tuner keeps the thread count whose steps cost least per FLOP, checks less often
while its choice holds, and changes it when the machine's load does."""

import pytest
import torch

from gem.training.threads import ThreadTuner


@pytest.fixture
def kept_threads():
    """torch's thread count as it was before the test."""
    saved = torch.get_num_threads()
    yield
    torch.set_num_threads(saved)


def run_steps(tuner: ThreadTuner, steps: int, cost: dict[int, float]) -> list[int]:
    used = []
    for _ in range(steps):
        threads = tuner.before_step()
        assert torch.get_num_threads() == threads
        used.append(threads)
        tuner.after_step(cost[threads] * 1e9, 1e9)
    return used


def test_tuner_picks_the_faster_count_and_follows_a_change_of_load(kept_threads):
    tuner = ThreadTuner(choices=(2, 1), trial_steps=2, recheck_every=10)
    used = run_steps(tuner, 45, {2: 5.0, 1: 1.0})  # a loaded machine: 1 thread is faster
    # warm-up, one step of each (5x: decisive), then a check (two steps with 2) after
    # 10 steps, the next after 20
    assert used[:4] == [2, 2, 1, 1] and tuner.best == 1
    assert [i for i, n in enumerate(used) if n == 2][2:] == [13, 14, 35, 36]
    run_steps(tuner, 40, {2: 0.5, 1: 1.0})  # the other jobs ended
    assert tuner.best == 2 and run_steps(tuner, 5, {2: 0.5, 1: 1.0}).count(2) >= 4


def test_a_difference_within_the_noise_keeps_the_current_choice(kept_threads):
    tuner = ThreadTuner(choices=(2, 1), trial_steps=2, recheck_every=10)
    used = run_steps(tuner, 30, {2: 1.02, 1: 1.0})  # 1 thread 2% faster: torch's default holds
    assert tuner.best == 2 and used[5:].count(1) <= 2
    run_steps(tuner, 40, {2: 1.2, 1: 1.0})  # 20% faster: taken
    assert tuner.best == 1


def test_the_default_kept_is_tried_against_one_thread_only_once_its_steps_grow_dearer(kept_threads):
    """Trial steps with 1 thread cost (~1.8x a demo step): with the default kept, they
    wait for its own steps to slow down (other jobs' load), not for a step count."""
    tuner = ThreadTuner(choices=(2, 1), trial_steps=2, recheck_every=10)
    used = run_steps(tuner, 200, {2: 0.55, 1: 1.0})  # an idle machine, the demo's ratio
    assert used[:3] == [2, 2, 1] and tuner.best == 2 and used[3:] == [2] * 197
    run_steps(tuner, 10, {2: 0.60, 1: 1.0})  # 9% dearer: within the run's drift
    assert tuner.best == 2 and tuner.before_step() == 2
    tuner.after_step(0.6e9, 1e9)
    used = run_steps(tuner, 12, {2: 1.5, 1: 1.0})  # other jobs arrived: 2.7x dearer
    assert 1 in used[:6] and tuner.best == 1


def test_close_first_trials_take_the_whole_round(kept_threads):
    tuner = ThreadTuner(choices=(2, 1), trial_steps=2, recheck_every=10)
    used = run_steps(tuner, 6, {2: 1.3, 1: 1.0})  # 1.3x: not decisive after one step each
    assert used[:5] == [2, 2, 1, 2, 1] and tuner.best == 1


def test_one_fast_trial_step_does_not_switch(kept_threads):
    """A check's every step must beat the median of the kept choice's ordinary steps: one
    lucky step (noise) against one unlucky one took a tiny run to 2 threads at 0.7x the speed."""
    tuner = ThreadTuner(choices=(2, 1), trial_steps=2, recheck_every=10)
    run_steps(tuner, 15, {2: 1.3, 1: 1.0})  # warm-up, first round, ordinary steps up to the check
    assert tuner.best == 1
    lucky = iter([0.8, 1.3])  # the check's two steps with 2 threads: one lucky, one as usual
    for _ in range(2):
        threads = tuner.before_step()
        assert threads == 2
        tuner.after_step(next(lucky) * 1e9, 1e9)
    assert tuner.best == 1 and tuner.before_step() == 1


def test_warmup_steps_run_the_default_count_before_any_trial(kept_threads):
    tuner = ThreadTuner(choices=(2, 1), trial_steps=2, recheck_every=10, warmup_steps=8)
    used = run_steps(tuner, 14, {2: 5.0, 1: 1.0})
    assert used[:8] == [2] * 8 and used[8:12] == [2, 1, 1, 1] and tuner.best == 1


def test_training_tunes_threads_for_its_steps_and_restores_them(tmp_path):
    from gem.training.config import load_train_config
    from gem.training.trainer import train

    saved = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        cfg, model_cfg = load_train_config("tiny", ["max_steps=6", "checkpoint_every=0", "log_model=false",
                                                    "system_metrics=false", "measure_peak=false"])
        perf = train("synthetic://512", tmp_path, cfg, model_cfg).perf
        assert perf["perf/threads"] in (1.0, 2.0) and torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(saved)
