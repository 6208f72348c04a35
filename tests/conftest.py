"""Shared fixtures: small generated datasets and the real-data location."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

# Triton kernels run on CPU only in interpreter mode, which must be chosen before triton
# is first imported (torch.compile may import it early in a full run).
try:
    import torch

    if not torch.cuda.is_available():
        os.environ.setdefault("TRITON_INTERPRET", "1")
    if os.environ.get("PYTEST_XDIST_WORKER"):  # one worker per core (make test): one thread each
        os.environ.setdefault("OMP_NUM_THREADS", "1")
        torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
except ImportError:  # pragma: no cover
    pass

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO.parent / "shared" / "data"
MOVIELENS_DIR = SHARED_DATA / "movielens-100k"
TAOBAO_CSV = SHARED_DATA / "taobao-userbehavior" / "UserBehavior.csv"


def pytest_collection_modifyitems(items):
    """The files holding `slow` tests first, the longest first (`slow(minutes=...)`), so that
    under `make test` (xdist, --dist loadfile, --no-loadscope-reorder) the multi-minute
    pipeline runs start at the beginning on different workers instead of being left for
    last behind the many short files."""
    minutes: dict = {}
    for item in items:
        marker = item.get_closest_marker("slow")
        if marker:
            minutes[item.path] = max(minutes.get(item.path, 0.0), float(marker.kwargs.get("minutes", 1.0)))
    items.sort(key=lambda item: -minutes.get(item.path, -1.0))  # stable: collection order otherwise


def require_real_data(path: Path) -> Path:
    """Skip (with the reason shown in the summary) when a real dataset is absent."""
    if not path.exists():
        pytest.skip(f"real dataset not found at {path} (see ../shared/data/README.md)")
    return path


@pytest.fixture(scope="session")
def tiny_dataset(tmp_path_factory) -> Path:
    """A simulator dataset of a few thousand events (seed 0), shared read-only."""
    from gem.config import load_config
    from gem.data.simulate import SimulatorConfig, simulate

    out = tmp_path_factory.mktemp("data") / "tiny"
    simulate(load_config(SimulatorConfig, section="simulator", preset="tiny"), out, progress=False)
    return out


@pytest.fixture(scope="session")
def movielens_dataset(tmp_path_factory) -> Path:
    from gem.data.adapters.movielens import convert_movielens

    out = tmp_path_factory.mktemp("data") / "movielens"
    convert_movielens(require_real_data(MOVIELENS_DIR), out)
    return out


@pytest.fixture(scope="session")
def taobao_dataset(tmp_path_factory) -> Path:
    from gem.data.adapters.taobao import convert_taobao

    out = tmp_path_factory.mktemp("data") / "taobao"
    convert_taobao(require_real_data(TAOBAO_CSV), out)
    return out


@pytest.fixture(autouse=True)
def _isolated_mlflow():
    """Each test starts and ends with MLflow's default store, whatever it set."""
    import mlflow

    yield
    if mlflow.active_run() is not None:
        mlflow.end_run()
    mlflow.set_tracking_uri("")
    mlflow.set_registry_uri("")
