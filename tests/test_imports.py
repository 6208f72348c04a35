"""What importing gem does to third-party libraries: Feast's classes load without
typeguard's per-method recompilation (~5 s per process), unless asked for; the students'
steps never load torchrec (~4 s per process)."""

from __future__ import annotations

import os
import subprocess
import sys

PROBE = "import gem, feast; print('typeguard' in feast.Entity.__init__.__code__.co_names)"


def _instrumented(**env: str) -> bool:
    out = subprocess.run([sys.executable, "-c", PROBE], env={**os.environ, **env}, capture_output=True, text=True,
                         check=True).stdout
    return out.strip().splitlines()[-1] == "True"


def test_feast_loads_without_typeguard_instrumentation_unless_asked():
    assert not _instrumented()
    assert _instrumented(GEM_FEAST_TYPECHECKS="1")


def test_feast_does_not_import_torch_until_asked():
    probe = ("import sys, gem, feast, feast.infra.offline_stores.offline_store; print('torch' in sys.modules); "
             "from feast.torch_wrapper import get_torch; print(get_torch().__name__)")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout.split()
    assert out[-2:] == ["False", "torch"]


def test_student_steps_do_not_import_torchrec():
    probe = ("import sys, gem_app.stages.distill, gem_app.stages.gate, students.distill, students.train, "
             "students.data, students.serving; print('torchrec' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout.split()
    assert out[-1] == "False"
