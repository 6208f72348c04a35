"""Timing and peak-memory measurement for the CPU benchmarks.

Time: best (minimum) of `reps` runs after `warmup` runs; the minimum is the figure
least disturbed by other processes sharing the cores. The median is kept too.
Memory is measured on the first timed run (so a 1-run figure includes the cost of
getting its memory back from the OS).

Memory: tracemalloc doesn't see torch's allocations, and torch has no CPU allocator
statistics, so peak memory is the growth of this process's resident set during one
run: free heap is handed back to the OS first (glibc malloc_trim), the kernel's
high-water mark is reset (/proc/self/clear_refs = 5), and peak = VmHWM - VmRSS before
the run. It counts everything the step touches (tensors, MKL/OpenMP scratch), Linux only.
"""

from __future__ import annotations

import ctypes
import math
import re
import statistics
import time
from pathlib import Path
from typing import Callable

_STATUS = Path("/proc/self/status")


def time_best(fn: Callable[[], object], reps: int, warmup: int = 1,
              measure_memory: bool = False) -> dict[str, float | None]:
    """{'best_s', 'median_s', 'best_cpu_s'} over `reps` calls of fn after `warmup` calls,
    plus 'peak_mb' (peak_rss_growth_mb of the first timed call) when measure_memory.
    best_cpu_s is process CPU time (all threads), which other processes inflate less."""
    for _ in range(warmup):
        fn()
    seconds, cpu_seconds = [], []
    result: dict[str, float | None] = {}

    def timed() -> None:
        start, cpu_start = time.perf_counter(), time.process_time()
        fn()
        seconds.append(time.perf_counter() - start)
        cpu_seconds.append(time.process_time() - cpu_start)

    for rep in range(reps):
        if rep == 0 and measure_memory:
            result["peak_mb"] = peak_rss_growth_mb(timed)
        else:
            timed()
    result.update(best_s=min(seconds), median_s=statistics.median(seconds),
                  best_cpu_s=min(cpu_seconds))
    return result


def _status_bytes(key: str) -> int:
    match = re.search(rf"^{key}:\s+(\d+) kB", _STATUS.read_text(), re.MULTILINE)
    if match is None:
        raise RuntimeError(f"{key} not in {_STATUS}")
    return int(match.group(1)) * 1024


def peak_rss_growth_mb(fn: Callable[[], object]) -> float | None:
    """Peak resident-set growth (MiB) while fn runs once; None where Linux /proc is missing."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
        Path("/proc/self/clear_refs").write_text("5")
        before = _status_bytes("VmRSS")
        fn()
        return (_status_bytes("VmHWM") - before) / 2**20
    except (OSError, RuntimeError):
        return None


def median_interval(values: list[float], level: float = 0.95
                    ) -> tuple[float, float | None, float | None]:
    """(median, low, high): a distribution-free interval for the median of what `values`
    sample, from their order statistics. [x_(j), x_(n+1-j)] covers the median with
    probability 1 - 2 P(Binomial(n, 1/2) < j); j is the largest that keeps it >= level.
    Below 6 values no pair of order statistics reaches 95%: low and high are None."""
    xs, n = sorted(values), len(values)
    below = 0.0  # P(Binomial(n, 1/2) < j)
    j = 0
    while j < n // 2 and 1 - 2 * (below + math.comb(n, j) / 2**n) >= level:
        below += math.comb(n, j) / 2**n
        j += 1
    median = statistics.median(xs)
    return (median, xs[j - 1], xs[n - j]) if j else (median, None, None)
