"""Freed memory kept for reuse in our processes: the features build's and the pipeline's
(training, knowledge generation, students).

glibc's malloc gives every block over its mmap threshold (at most 32 MiB) back to the
kernel when it is freed, so each later array of that size is fresh memory that the
kernel faults in and zeroes page by page. A 100M-event build works on 50-100 MB
columns; its NumPy temporaries then cost more per row than the same code on 10M events,
whose columns stay under the threshold and are reused (measured: a 12.4M-row index
bucket after the first took 11 s, with the blocks kept 5.7 s; three buckets made 364k
page faults against 73k). Peak RSS does not change: a kept block is reused, not added to.

Training is the same story at every step: the sequence block's activations and gradients
are (tokens x 256) floats, 50 MB for a late demo batch of 512 users (48k history tokens),
allocated and freed dozens of times a step. With glibc's defaults 6 late demo train steps
made 1.2M page faults and spent 3.6 s of 8.3 s in the kernel; with the blocks kept, 3
faults and 0.70x the time. Over every 4th step of the window, 0.73x
(benchmarks/results/training_heap.json).
"""

from __future__ import annotations

import ctypes
import os
import platform

M_TRIM_THRESHOLD = -1  # glibc mallopt parameters (malloc.h)
M_MMAP_THRESHOLD = -3
KEEP_BLOCKS_UP_TO = 1 << 30
SWITCH_ENV = "GEM_KEEP_FREED_MEMORY"  # "0": glibc's defaults (for A/B runs and diagnosis)


def keep_freed_memory(limit: int = KEEP_BLOCKS_UP_TO) -> bool:
    """Serve blocks up to ``limit`` bytes from the heap and keep up to ``limit`` free
    bytes at its top instead of returning them to the kernel; for this process, for good.
    Called where a process of ours starts (the application's import, gem_app/__init__.py:
    every pipeline task and `python -m gem`; each features pool worker; the benchmarks),
    never inside a library function, whose caller's process is not its own. False where
    the C library is not glibc, or ${SWITCH_ENV} is 0."""
    if os.environ.get(SWITCH_ENV, "1") == "0":
        return False
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return False
    libc = ctypes.CDLL("libc.so.6")
    return bool(libc.mallopt(M_MMAP_THRESHOLD, limit)) and bool(libc.mallopt(M_TRIM_THRESHOLD, limit))
