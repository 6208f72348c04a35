"""Intra-op threads chosen by measurement while training.

On a 2-core machine shared with other jobs, torch's default (one OpenMP thread per core)
can be many times slower than one thread: every op's parallel region waits at a barrier
for a thread the OS has given to another process (seen: a tiny-preset step 18x slower
with 2 threads than with 1 at a load average of 6; a small-preset step 2.5x). On an idle
machine the large matmuls of bigger models gain from every core. The tuner times steps
under each choice (seconds per exact model FLOP, so steps of different sizes compare) and
keeps the fastest. Trial steps with the slower count cost (a 1-thread demo step takes
~1.8x a 2-thread one), so it spends few: its first round stops after one step of each
choice when one is 1.5x faster; 1 thread kept, it tries the default again now and then
(less often while the choice holds: the load may have gone); the default kept, it tries 1
thread only once the default's own steps have grown 15% dearer than when it chose them,
the sign of new load (other jobs slow every multi-threaded step).

    tuner = ThreadTuner()              # choices: torch's default and 1
    tuner.before_step()                # sets torch's threads for this step
    ...; tuner.after_step(seconds, flops)
"""

from __future__ import annotations

import logging
import statistics
from collections import deque

import torch

log = logging.getLogger(__name__)
# the other count must be this much faster to be taken: a first trial that read 1 thread
# at 1.02x the time of 2 switched the demo's knowledge stage to 1 thread for 7 s, where
# 2 threads then measured 2.01x faster
SWITCH_MARGIN = 0.05
# the first round stops after one step of each choice when one is this much faster
DECISIVE = 1.5
# the default (all threads) kept: its steps this much dearer than when it was chosen
# (median of its latest) before 1 thread is tried again
LOAD_MARGIN = 0.15
LOAD_STEPS = 3  # the latest ordinary steps that say what the kept choice costs now


class ThreadTuner:
    def __init__(self, choices: tuple[int, ...] | None = None, trial_steps: int = 2, recheck_every: int = 40,
                 warmup_steps: int = 1, recent: int = 8) -> None:
        default = torch.get_num_threads()
        self.choices = tuple(dict.fromkeys(choices or (default, 1)))
        self.trial_steps, self.recheck_every, self.warmup = trial_steps, recheck_every, warmup_steps
        self.best = self.choices[0]
        self.cost: dict[int, list[float]] = {n: [] for n in self.choices}  # seconds per FLOP of the trial steps
        self.recent: deque[float] = deque(maxlen=recent)  # the kept choice's latest ordinary steps
        self.steps = 0
        self._interval, self._next_check = 0, 0  # steps between checks, doubled while the choice holds
        self._current = self.best
        self._trial: list[int] = []  # thread counts of the coming trial steps
        self._chosen_cost = float("inf")  # the kept choice's cost per FLOP when it was chosen

    def _latest_cost(self) -> float:
        """The kept choice's cost now: the median of its last few ordinary steps."""
        return statistics.median(list(self.recent)[-LOAD_STEPS:])

    def _check_due(self) -> bool:
        if self.best != self.choices[0]:  # fewer threads kept: the load may have gone, look again
            return self.steps >= self._next_check
        return len(self.recent) >= LOAD_STEPS and self._latest_cost() > self._chosen_cost * (1 + LOAD_MARGIN)

    def before_step(self) -> int:
        if self.steps >= self.warmup and len(self.choices) > 1 and not self._trial:
            if self.steps == self.warmup:  # the first round: every choice, interleaved
                self._trial = [n for _ in range(self.trial_steps) for n in self.choices]
            elif self._check_due():  # a few steps of each other choice
                self._trial = [n for n in self.choices if n != self.best for _ in range(self.trial_steps)]
        self._current = self._trial[0] if self._trial else self.best
        torch.set_num_threads(self._current)
        return self._current

    def after_step(self, seconds: float, flops: float) -> None:
        self.steps += 1
        cost = seconds / max(flops, 1.0)
        if not self._trial or self.steps <= self.warmup:
            if self.steps > self.warmup:
                self.recent.append(cost)
            return
        self.cost[self._trial.pop(0)].append(cost)
        first_round = self._interval == 0
        if first_round and self._trial and all(len(self.cost[n]) == 1 for n in self.choices):
            ones = [self.cost[n][0] for n in self.choices]
            if max(ones) > DECISIVE * min(ones):  # one step each was enough
                self._trial = []
        if self._trial:
            return
        if first_round:  # the lower median of each choice's steps
            latest = {n: sorted(c)[(len(c) - 1) // 2] for n, c in self.cost.items() if c}
        else:
            # a check: every trial step of another choice must beat the median of the kept
            # choice's latest ordinary steps (one step against one misread ~10% run-to-run
            # noise: a tiny run went to 2 threads on a 1.08x and stayed, 0.7x the speed)
            latest = {n: max(c[-self.trial_steps:]) for n, c in self.cost.items() if c and n != self.best}
            if self.best == self.choices[0]:  # a check for new load: against the default's cost since
                latest[self.best] = self._latest_cost()
            else:
                latest[self.best] = statistics.median(self.recent) if self.recent else self.cost[self.best][-1]
        best = min(latest, key=latest.get)
        if latest[best] > latest[self.best] * (1 - SWITCH_MARGIN):
            best = self.best  # within the noise of a few steps: the choice holds
        if best != self.best:
            log.info("intra-op threads: %d (a step took %.2fx the time with %d)", best,
                     latest[self.best] / latest[best], self.best)
            self._interval = self.recheck_every
            self.recent.clear()
        else:  # the choice held: look again less often (a trial step with the slower count costs)
            self._interval = 2 * self._interval if self._interval else self.recheck_every
        self.best = best
        self._chosen_cost = latest[best]
        self._next_check = self.steps + self._interval
        torch.set_num_threads(best)


def thread_tuner(threads: int, env=None, recheck_every: int = 40, warmup_steps: int = 1) -> ThreadTuner | None:
    """``threads`` (the train or knowledge config's) > 0: that many, fixed; 0: a tuner
    between torch's default and 1 for one CPU process (``env``: training's DistEnv, None
    for one process; torchrun's ranks get OMP_NUM_THREADS=1), checking again after
    ``recheck_every`` steps (doubled while the choice holds), its first trials after
    ``warmup_steps`` (a precision trial's steps come first)."""
    if threads > 0:
        torch.set_num_threads(threads)
        return None
    if env is not None and (env.device.type != "cpu" or env.world_size > 1):
        return None
    return (ThreadTuner(recheck_every=recheck_every, warmup_steps=warmup_steps)
            if torch.get_num_threads() > 1 else None)
