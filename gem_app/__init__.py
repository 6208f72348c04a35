"""The application over the GEM library: the CLI (`python -m gem`), one stage function per
pipeline step (stages/), the Kubeflow components over them (components/), the pipelines
(pipelines/), continuous refresh (refresh/), the promotion gate and the pretraining
launchers. Nothing in gem/, students/ or kernels/ imports it (tests/test_layers.py)."""

import atexit
import gc

from gem.utils.memory import keep_freed_memory

# A pipeline task is a process that has imported torch, MLflow, Feast...: millions of
# objects, which the interpreter's shutdown runs full garbage collections over while it
# tears the modules down (1.5-3 s of every task, after its outputs were written; seen in
# the demo's logs). Frozen when the process exits, they are left to the OS instead.
# atexit runs this after the handlers registered later (MLflow's, logging's flushes
# still run); objects freed by reference counting are still freed, only unreachable
# cycles are no longer collected at exit.
atexit.register(gc.freeze)

# Its imports (torch, torchrec, MLflow, Feast) allocate millions of long-lived objects,
# and at the default threshold (a collection every 700 allocations) the collector walks
# the growing heap ~1,300 times while they load: 1.0-1.3 s of the ~5 s a task spends
# importing them, 0.3 s with a collection every 10,000 (gc.callbacks, timed). Cyclic
# garbage is still collected, only in larger batches.
GC_THRESHOLD = 10_000
gc.set_threshold(GC_THRESHOLD, 10, 10)

# Every process of the application (a pipeline task, `python -m gem`, a torchrun worker)
# keeps its freed large blocks for reuse instead of faulting fresh pages in at every
# train or scoring step (gem/utils/memory.py: 0.70x the late demo train step's time).
keep_freed_memory()
