"""PT2 compile caching: Inductor's on-disk caches (FX graphs, AOTAutograd graphs, the
compiled C++ kernels) kept in a folder of the workspace, so a second run or a refresh
cycle with the same model and shapes loads the compiled code instead of compiling it
again (Inductor's default folder, /tmp/torchinductor_<user>, does not survive a new pod
or container; the workspace does).

    folder = use_compile_cache(workspace / "compile-cache")   # before the first compile
    ...; compile_cache_counts()   # {"fxgraph_hit": .., "fxgraph_miss": .., "aot_hit": ..}
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

log = logging.getLogger(__name__)
ENV = "TORCHINDUCTOR_CACHE_DIR"
COMPILE_CACHE = "compile-cache"  # beside a run folder: <workspace>/compile-cache in the pipeline


def use_compile_cache(folder: str | Path) -> Path:
    """Point Inductor's caches at ``folder`` unless $TORCHINDUCTOR_CACHE_DIR names one
    already (the user's choice, or a folder this process compiled into: the compiled
    code already loaded stays there); returns the folder in use."""
    chosen = Path(os.environ.get(ENV) or folder).resolve()
    chosen.mkdir(parents=True, exist_ok=True)
    os.environ[ENV] = str(chosen)
    warm = any(chosen.iterdir())
    log.info("torch.compile cache: %s (%s)", chosen, "warm: compiled code of earlier runs" if warm else "cold")
    return chosen


def compile_cache_counts() -> dict[str, int]:
    """This process's hits and misses of Inductor's FX-graph cache and AOTAutograd's cache."""
    from torch._dynamo.utils import counters

    return {"fxgraph_hit": counters["inductor"]["fxgraph_cache_hit"],
            "fxgraph_miss": counters["inductor"]["fxgraph_cache_miss"],
            "aot_hit": counters["aot_autograd"]["autograd_cache_hit"],
            "aot_miss": counters["aot_autograd"]["autograd_cache_miss"]}
