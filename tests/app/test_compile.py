"""Both pipelines compile to IR YAML with the cluster settings applied."""

from __future__ import annotations

import yaml

from gem_app.pipelines.compile import GEM_YAML, REFRESH_YAML, compile_all


def test_compile_gem_and_refresh_pipelines(tmp_path):
    paths = compile_all(tmp_path, mlflow_uri="http://mlflow.test:5000")
    assert [p.name for p in paths] == [GEM_YAML, REFRESH_YAML]
    gem_text, refresh_text = (p.read_text() for p in paths)
    for text in (gem_text, refresh_text):
        docs = list(yaml.safe_load_all(text))
        spec, platform = docs[0], docs[1]
        tasks = spec["root"]["dag"]["tasks"]
        assert {"ingest", "train", "knowledge", "summary"} <= set(tasks)
        executors = platform["platforms"]["kubernetes"]["deploymentSpec"]["executors"]
        assert all(e["pvcMount"][0]["mountPath"] == "/workspace" for e in executors.values())
        pretrain = spec["deploymentSpec"]["executors"]["exec-train"]["container"]
        assert pretrain["resources"]["accelerator"]["resourceType"] == "nvidia.com/gpu"
        assert any(env["value"] == "http://mlflow.test:5000" for env in pretrain["env"])
        assert tasks["train"]["retryPolicy"]["maxRetryCount"] == 2
    assert "resolve-champion" in refresh_text and "resolve-champion" not in gem_text
