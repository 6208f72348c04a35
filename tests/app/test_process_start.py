"""What every application process (a pipeline task, `python -m gem`, a torchrun worker)
sets when it imports gem_app: the collector's threshold for its heavy imports."""

from __future__ import annotations

import subprocess
import sys

COUNT_COLLECTIONS = """
import gc, sys
collections = []
gc.callbacks.append(lambda phase, info: phase == "stop" and collections.append(info["generation"]))
import gem_app
gc.collect()  # a full collection still runs when asked
import mlflow
print(gc.get_threshold()[0], len(collections))
"""


def test_importing_the_application_raises_the_collection_threshold():
    """With the default threshold, importing MLflow runs the collector hundreds of
    times (about 0.5 s here); after gem_app, a few dozen times."""
    out = subprocess.run([sys.executable, "-c", COUNT_COLLECTIONS], capture_output=True, text=True, check=True)
    threshold, collections = map(int, out.stdout.split())
    assert threshold == 10_000
    assert 1 <= collections < 150, collections
    default = subprocess.run([sys.executable, "-c", COUNT_COLLECTIONS.replace("import gem_app", "")],
                             capture_output=True, text=True, check=True)
    assert int(default.stdout.split()[1]) > 5 * collections
