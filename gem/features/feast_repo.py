"""The Feast repo as seen from the package: load its definitions, open, apply, materialize.

``feature_repo/`` holds the declarations (one file per kind). ``feast apply`` imports
those files with the repo directory as the working directory; ``load_definitions``
does the same without changing the working directory, so a build can apply the same
objects to a private copy of the repo (``OUT/_work/feast``) and leave the project's
registry alone.

Store configuration by environment (``GEM_FEAST_ENV``): ``local`` (the default) is
``feature_store.yaml`` (duckdb offline, sqlite online, everything in the repo folder);
``cluster`` is ``feature_store.cluster.yaml`` (Redis online, Ray offline, the registry on
the shared workspace volume), which the compiled pipelines select on every task. A
repo copy made for an environment holds that environment's file as its
``feature_store.yaml``; a private scratch copy (a features build's) stays local.

Feast itself is imported only by the functions that use it: importing this module
(e.g. through ``gem.features.build``) costs no ``import feast``.
"""

from __future__ import annotations

import copy
import datetime as dt
import importlib
import os
import re
import shutil
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

PROJECT_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_REPO = PROJECT_ROOT / "feature_repo"
STORE_YAML = "feature_store.yaml"
ENV_VAR = "GEM_FEAST_ENV"
LOCAL = "local"
_VARIABLE = re.compile(r"\$\{(\w+)\}|\$(\w+)")


def definition_types() -> tuple:
    from feast import Entity, FeatureService, FeatureView
    from feast.data_source import DataSource

    return Entity, DataSource, FeatureView, FeatureService


def feast_env(env: str | None = None) -> str:
    """The store environment: ``env``, else ``$GEM_FEAST_ENV``, else ``local``."""
    return (env or os.environ.get(ENV_VAR) or LOCAL).strip()


def store_yaml(repo: str | Path | None = None, env: str | None = None) -> Path:
    """The repo's store configuration for an environment: ``feature_store.yaml`` for
    ``local``, ``feature_store.<env>.yaml`` otherwise."""
    repo, env = resolve_repo(repo), feast_env(env)
    path = repo / (STORE_YAML if env == LOCAL else f"feature_store.{env}.yaml")
    if not path.is_file():
        known = sorted([LOCAL] + [p.name.split(".")[1] for p in repo.glob("feature_store.*.yaml")])
        raise FileNotFoundError(f"{path}: no Feast store configuration for {ENV_VAR}={env!r}; "
                                f"this repo has {', '.join(known)}")
    return path


def missing_variables(path: str | Path) -> list[str]:
    """Environment variables the store file names (Feast substitutes ``${VAR}`` when it
    reads it) that are unset here; comment lines are skipped."""
    text = "\n".join(line.split("#", 1)[0] for line in Path(path).read_text().splitlines())
    names = {a or b for a, b in _VARIABLE.findall(text)}
    return sorted(n for n in names if n not in os.environ)


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
    kinds = definition_types()
    for module in modules:
        for attr in sorted(vars(module)):
            obj = getattr(module, attr)
            if isinstance(obj, kinds):
                found.setdefault((type(obj).__name__, obj.name), obj)
    return list(found.values())


def copy_repo(repo: str | Path | None, target: Path, env: str = LOCAL) -> Path:
    """A private repo directory: the source repo's store configuration for ``env``
    (relative paths) as its ``feature_store.yaml``, with its own data/, registry and
    (local) online store."""
    source = store_yaml(repo, env)
    target = Path(target)
    (target / "data").mkdir(parents=True, exist_ok=True)
    shutil.copyfile(source, target / STORE_YAML)
    return target


def open_store(repo_dir: str | Path, env: str | None = None):
    """The repo's FeatureStore, on its own ``feature_store.yaml`` or, with ``env``, on that
    environment's file. Refuses, naming them, while variables the file uses are unset."""
    from feast import FeatureStore

    repo = resolve_repo(repo_dir)
    path = store_yaml(repo, env) if env else repo / STORE_YAML
    missing = missing_variables(path)
    if missing:
        raise RuntimeError(f"{path} reads {', '.join(missing)} from the environment; set "
                           f"{'it' if len(missing) == 1 else 'them'} (the compiled pipelines do, from the cluster "
                           f"settings' feast_* fields)")
    return FeatureStore(repo_path=str(repo), fs_yaml_file=path)


def bind_sources(definitions: list, repo_dir: Path) -> list:
    """A copy of the definitions whose relative FileSource paths point into ``repo_dir``.

    Feast's duckdb store reads a relative source path against the *working directory*
    (the ``feast`` CLI runs inside the repo); binding makes the registry independent
    of where Python runs."""
    from feast import FeatureView, FileSource

    bound = copy.deepcopy(definitions)  # one memo: views keep pointing at the same sources
    for obj in bound:
        sources = [obj] if isinstance(obj, FileSource) else []
        if isinstance(obj, FeatureView) and isinstance(obj.batch_source, FileSource):
            sources.append(obj.batch_source)
        for source in sources:
            if not Path(source.path).is_absolute():
                source.file_options.uri = str(Path(repo_dir).resolve() / source.path)
    return bound


def apply(repo_dir: str | Path, definitions_repo: str | Path | None = None):
    """Register the definitions of ``definitions_repo`` (default: ``repo_dir`` itself),
    with source paths bound to ``repo_dir``."""
    store = open_store(repo_dir)
    store.apply(bind_sources(load_definitions(definitions_repo or repo_dir), Path(repo_dir)))
    return store


def materializable_views(store, repo_dir: Path) -> list[str]:
    """Online feature views whose offline source file exists (other stages' views, e.g.
    teacher knowledge, appear once their stage has written its files)."""
    from feast import FileSource

    names = []
    for view in store.list_feature_views():
        source = view.batch_source
        if view.online and isinstance(source, FileSource):
            path = Path(source.path)
            if (path if path.is_absolute() else Path(repo_dir) / path).exists():
                names.append(view.name)
    return sorted(names)


def materialize(repo_dir: str | Path, end: dt.datetime, start: dt.datetime | None = None,
                feature_views: list[str] | None = None):
    """Load the latest row per entity with event_timestamp in [start, end] into the online
    store (start defaults to the Unix epoch: everything up to ``end``); by default every
    materializable view."""
    store = open_store(repo_dir)
    start = start or dt.datetime(1970, 1, 2, tzinfo=dt.timezone.utc)
    views = feature_views if feature_views is not None else materializable_views(store, Path(repo_dir))
    if not views:
        raise ValueError(f"{repo_dir}: no feature view has its source file yet; export the sources first")
    with bounded_offline_reads(store, Path(repo_dir)):
        store.materialize(start_date=start, end_date=end, feature_views=views)
    return store


@contextmanager
def bounded_offline_reads(store, repo_dir: Path) -> Iterator[None]:
    """Hold the duckdb offline store to the source export's memory limit while inside.

    Feast's duckdb offline store reads sources through ibis's default DuckDB connection,
    which may take 80% of the machine's memory for the latest-row-per-entity window; a
    connection with a limit spills to ``repo_dir/data`` instead. Other offline stores
    (Ray on the cluster) are left as configured."""
    if store.config.offline_store.type != "duckdb":
        yield
        return
    import ibis

    from gem.features.feast_sources import MEMORY_LIMIT

    spill = repo_dir / "data" / ".offline.spill"
    previous = ibis.options.default_backend
    backend = ibis.duckdb.connect(memory_limit=MEMORY_LIMIT, temp_directory=str(spill))
    ibis.set_backend(backend)
    try:
        yield
    finally:
        ibis.options.default_backend = previous
        backend.disconnect()
        shutil.rmtree(spill, ignore_errors=True)
