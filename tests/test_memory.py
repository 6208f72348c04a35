"""Our processes keep freed memory (the features build's workers, every process of the
application: pipeline tasks, `python -m gem`): a large array comes from the heap, not
from a fresh mapping the kernel faults in anew each time."""

import ctypes
import os
import platform
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from gem.utils.pool import process_pool

ROOT = Path(__file__).resolve().parents[1]  # where `tests` imports from, whatever the cwd
LARGE = 100 * 2**20  # bytes: over glibc's largest default mmap threshold (32 MiB)


def glibc_with_mallinfo2() -> bool:
    return platform.libc_ver()[0] == "glibc" and hasattr(ctypes.CDLL("libc.so.6"), "mallinfo2")  # glibc 2.33+


pytestmark = pytest.mark.skipif(not glibc_with_mallinfo2(), reason="mallopt and mallinfo2 are glibc's (2.33+)")


class MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                                     "fsmblks", "uordblks", "fordblks", "keepcost")]


def mapped_bytes_of_a_large_array(_=None) -> int:
    """Bytes malloc serves from separate mappings (mmap) while a 100 MiB array lives."""
    info = ctypes.CDLL("libc.so.6").mallinfo2
    info.restype = MallInfo2
    before = info().hblkhd
    array = np.ones(LARGE // 8)
    during = info().hblkhd
    del array
    return during - before


def in_a_fresh_process(code: str, **env: str) -> int:
    """mapped_bytes_of_a_large_array() in a new interpreter, after ``code``."""
    script = f"{code}\nfrom tests.test_memory import mapped_bytes_of_a_large_array as m\nprint(m())"
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT,
                          env={**os.environ, **env})
    assert done.returncode == 0, done.stderr[-2000:]
    return int(done.stdout.split()[-1])


def test_pool_workers_serve_large_arrays_from_the_heap():
    with process_pool(2) as pool:
        assert list(pool.map(mapped_bytes_of_a_large_array, range(2))) == [0, 0]


def test_the_callers_process_is_left_as_it_was_and_the_features_cli_sets_its_own(tmp_path):
    assert in_a_fresh_process("from gem.utils.pool import process_pool\n"
                              "with process_pool(1) as pool: list(pool.map(abs, [1]))") >= LARGE
    missing = tmp_path / "no-such-dataset"  # the command fails as a user error after its setting
    assert in_a_fresh_process(f"from gem_app.cli import main\nmain(['features', 'build', '{missing}', "
                              f"'{tmp_path / 'out'}'])") == 0


@pytest.mark.parametrize("stage_call", ["features_plan('{missing}', '{out}', '', '', 'small')",
                                        "features_shard('{missing}', 'bucket=0')"])
def test_the_features_pipeline_stages_set_their_task_process(tmp_path, stage_call):
    call = stage_call.format(missing=tmp_path / "no-such-dataset", out=tmp_path / "out")
    assert in_a_fresh_process("from gem_app.stages.features import features_plan, features_shard\n"
                              f"try:\n    {call}\nexcept Exception:\n    pass  # failed after the setting") == 0


@pytest.mark.parametrize("module", ["gem_app.stages.train", "gem_app.stages.knowledge", "gem_app.stages.distill",
                                    "gem_app.cli"])
def test_every_process_of_the_application_keeps_freed_memory(module):
    """The train, knowledge and distill tasks' processes (and the CLI's) import the
    application, which sets it: a train step's 50 MB activations are reused, not faulted in."""
    assert in_a_fresh_process(f"import {module}") == 0


def test_the_switch_leaves_glibcs_defaults_for_an_ab_run():
    assert in_a_fresh_process("import gem_app", GEM_KEEP_FREED_MEMORY="0") >= LARGE
