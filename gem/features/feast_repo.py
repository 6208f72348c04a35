"""The Feast repo as seen from the package: load its definitions, open, apply, materialize.

``feature_repo/`` holds the declarations (one file per kind). ``feast apply`` imports
those files with the repo directory as the working directory; ``load_definitions``
does the same without changing the working directory, so a build can apply the same
objects to a private copy of the repo (``OUT/_work/feast``) and leave the project's
registry alone.
"""

from __future__ import annotations

import copy
import datetime as dt
import importlib
import shutil
import sys
from pathlib import Path

from feast import Entity, FeatureService, FeatureStore, FeatureView, FileSource
from feast.data_source import DataSource

PROJECT_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_REPO = PROJECT_ROOT / "feature_repo"
STORE_YAML = "feature_store.yaml"
DEFINITION_TYPES = (Entity, DataSource, FeatureView, FeatureService)


def resolve_repo(repo: str | Path | None) -> Path:
    path = Path(repo) if repo else DEFAULT_REPO
    if not (path / STORE_YAML).is_file():
        raise FileNotFoundError(f"{path / STORE_YAML}: missing; not a Feast repo directory")
    return path.resolve()


def _definition_files(repo: Path) -> list[Path]:
    ignored = {line.strip().rstrip("/") for line in (repo / ".feastignore").read_text().splitlines()
               if line.strip() and not line.startswith("#")} if (repo / ".feastignore").is_file() else set()
    return sorted(p for p in repo.glob("*.py") if p.name != "__init__.py" and p.name not in ignored)


def load_definitions(repo: str | Path | None = None) -> list:
    """Every Entity, DataSource, FeatureView and FeatureService declared in the repo,
    de-duplicated by (type, name), in file then name order."""
    repo = resolve_repo(repo)
    files = _definition_files(repo)
    names = [p.stem for p in files]
    for name in names:  # a same-named module from another repo must not be reused
        module = sys.modules.get(name)
        if module is not None and Path(getattr(module, "__file__", "") or "").parent != repo:
            del sys.modules[name]
    sys.path.insert(0, str(repo))
    try:
        modules = [importlib.import_module(name) for name in names]
    finally:
        sys.path.remove(str(repo))
    found: dict[tuple[str, str], object] = {}
    for module in modules:
        for attr in sorted(vars(module)):
            obj = getattr(module, attr)
            if isinstance(obj, DEFINITION_TYPES):
                found.setdefault((type(obj).__name__, obj.name), obj)
    return list(found.values())


def copy_repo(repo: str | Path | None, target: Path) -> Path:
    """A private repo directory: the source repo's feature_store.yaml (relative paths)
    with its own data/, registry and online store."""
    repo = resolve_repo(repo)
    target = Path(target)
    (target / "data").mkdir(parents=True, exist_ok=True)
    shutil.copyfile(repo / STORE_YAML, target / STORE_YAML)
    return target


def open_store(repo_dir: str | Path) -> FeatureStore:
    return FeatureStore(repo_path=str(resolve_repo(repo_dir)))


def bind_sources(definitions: list, repo_dir: Path) -> list:
    """A copy of the definitions whose relative FileSource paths point into ``repo_dir``.

    Feast's duckdb store reads a relative source path against the *working directory*
    (the ``feast`` CLI runs inside the repo); binding makes the registry independent
    of where Python runs."""
    bound = copy.deepcopy(definitions)  # one memo: views keep pointing at the same sources
    for obj in bound:
        sources = [obj] if isinstance(obj, FileSource) else []
        if isinstance(obj, FeatureView) and isinstance(obj.batch_source, FileSource):
            sources.append(obj.batch_source)
        for source in sources:
            if not Path(source.path).is_absolute():
                source.file_options.uri = str(Path(repo_dir).resolve() / source.path)
    return bound


def apply(repo_dir: str | Path, definitions_repo: str | Path | None = None) -> FeatureStore:
    """Register the definitions of ``definitions_repo`` (default: ``repo_dir`` itself),
    with source paths bound to ``repo_dir``."""
    store = open_store(repo_dir)
    store.apply(bind_sources(load_definitions(definitions_repo or repo_dir), Path(repo_dir)))
    return store


def materializable_views(store: FeatureStore, repo_dir: Path) -> list[str]:
    """Online feature views whose offline source file exists (other stages' views, e.g.
    teacher knowledge, appear once their stage has written its files)."""
    names = []
    for view in store.list_feature_views():
        source = view.batch_source
        if view.online and isinstance(source, FileSource):
            path = Path(source.path)
            if (path if path.is_absolute() else Path(repo_dir) / path).exists():
                names.append(view.name)
    return sorted(names)


def materialize(repo_dir: str | Path, end: dt.datetime, start: dt.datetime | None = None,
                feature_views: list[str] | None = None) -> FeatureStore:
    """Load the latest row per entity with event_timestamp in [start, end] into the online
    store (start defaults to the Unix epoch: everything up to ``end``); by default every
    materializable view."""
    store = open_store(repo_dir)
    start = start or dt.datetime(1970, 1, 2, tzinfo=dt.timezone.utc)
    views = feature_views if feature_views is not None else materializable_views(store, Path(repo_dir))
    if not views:
        raise ValueError(f"{repo_dir}: no feature view has its source file yet; export the sources first")
    store.materialize(start_date=start, end_date=end, feature_views=views)
    return store
