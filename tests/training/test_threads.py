"""The thread tuner keeps the thread count whose steps cost least per FLOP, checks less often
while its choice holds, and changes it when the machine's load does."""

import torch

from gem.training.threads import ThreadTuner


def run_steps(tuner: ThreadTuner, steps: int, cost: dict[int, float]) -> list[int]:
    used = []
    for _ in range(steps):
        threads = tuner.before_step()
        assert torch.get_num_threads() == threads
        used.append(threads)
        tuner.after_step(cost[threads] * 1e9, 1e9)
    return used


def test_tuner_picks_the_faster_count_and_follows_a_change_of_load():
    saved = torch.get_num_threads()
    try:
        tuner = ThreadTuner(choices=(2, 1), trial_steps=2, recheck_every=10)
        used = run_steps(tuner, 45, {2: 5.0, 1: 1.0})  # a loaded machine: 1 thread is faster
        # warm-up, the first round, then a check (one step with 2) after 10 steps, the next after 20
        assert used[:5] == [2, 2, 1, 2, 1] and tuner.best == 1
        assert [i for i, n in enumerate(used) if n == 2][3:] == [15, 37]
        run_steps(tuner, 40, {2: 0.5, 1: 1.0})  # the other jobs ended
        assert tuner.best == 2 and run_steps(tuner, 5, {2: 0.5, 1: 1.0}).count(2) >= 4
    finally:
        torch.set_num_threads(saved)
