"""Both pipelines compile to IR YAML that the kfp client loads, with the cluster settings
applied per stage; the TrainJob the train task would create validates against the
Trainer's published API models; the KFP cache keys of the compiled graph change when
and only when an input's content changes."""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path

import pytest
import yaml
from google.protobuf import json_format
from kfp.pipeline_spec import pipeline_spec_pb2

from gem_app.launch import OPTIONS_ENV, train_args, trainjob_manifest, validate_trainjob
from gem_app.pipelines.compile import (
    GEM_YAML,
    REFRESH_YAML,
    RUN_ID_PLACEHOLDER,
    compile_all,
    default_workspace,
    recurring_run_params,
)
from gem_app.pipelines.settings import ClusterSettings, load_cluster_settings

ROOT = Path(__file__).resolve().parents[2]
OPTIONS = ["node_selector.pool=ml", "image_pull_secrets=[regcred]", "gpu_node_selector.accelerator=h100",
           'tolerations=[{"key": "dedicated", "operator": "Equal", "value": "ml", "effect": "NoSchedule"}]',
           "resources.shard.cpu_limit=1"]


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    out = tmp_path_factory.mktemp("compiled")
    paths = compile_all(out, mlflow_uri="http://mlflow.test:5000", overrides=OPTIONS)
    return {p.name: list(yaml.safe_load_all(p.read_text())) for p in paths}, paths


def executor_of(spec: dict, task: str, dag: dict | None = None) -> str:
    """The executor label of a task, looked up in the root DAG and every sub-DAG."""
    for comp in [spec["root"], *spec["components"].values()]:
        tasks = comp.get("dag", {}).get("tasks", {})
        if task in tasks:
            return spec["components"][tasks[task]["componentRef"]["name"]]["executorLabel"]
    raise KeyError(task)


def test_both_pipelines_load_with_the_kfp_client(compiled):
    from kfp import components

    docs, paths = compiled
    assert [p.name for p in paths] == [GEM_YAML, REFRESH_YAML]
    for path in paths:
        loaded = components.load_component_from_file(str(path))
        spec, platform = docs[path.name]
        json_format.ParseDict(spec, pipeline_spec_pb2.PipelineSpec())
        json_format.ParseDict(platform, pipeline_spec_pb2.PlatformSpec())
        inputs = spec["root"]["inputDefinitions"]["parameters"]
        # the run id: KFP's job id, resolved by KFP in a task input (not in pipeline parameters)
        assert inputs["run_id"].get("defaultValue", "") == ""
        start = spec["root"]["dag"]["tasks"]["start-run"]["inputs"]["parameters"]
        assert start["kfp_run_id"]["runtimeValue"]["constant"] == RUN_ID_PLACEHOLDER
        assert start["pipeline_run_id"]["componentInputParameter"] == "run_id"
        assert inputs["workspace"]["defaultValue"] == default_workspace(path)
        assert default_workspace(path) == ("/workspace/gem/refresh" if "refresh" in path.name else "/workspace/gem")
        assert loaded.name in ("gem-pipeline", "refresh-pipeline")
        # the recurring refresh refuses late data by default (gem_app.stages.late_data); the
        # full pipeline reads every day anyway
        assert inputs["late_data"].get("defaultValue", "") == ("refuse" if "refresh" in path.name else "")
        ingest = spec["root"]["dag"]["tasks"]["ingest"]["inputs"]["parameters"]
        assert ingest["late_data"]["componentInputParameter"] == "late_data"
        days = spec["root"]["dag"]["tasks"]["promote"]["inputs"]["parameters"]["data_days"]
        assert days["taskOutputParameter"] == {"producerTask": "ingest", "outputParameterKey": "days"}
    assert "resolve-champion" in paths[1].read_text() and "resolve-champion" not in paths[0].read_text()
    scheduled = recurring_run_params(default_workspace(paths[1]))
    assert scheduled == {"workspace": "/workspace/gem/refresh", "data": "/workspace/gem/refresh/incoming"}
    assert "{{workflow.uid}}" not in paths[0].read_text() + paths[1].read_text()  # KFP v1's placeholder


def test_resources_placement_and_artifacts_per_stage(compiled):
    docs, _ = compiled
    cluster = load_cluster_settings(overrides=OPTIONS)
    for spec, platform in docs.values():
        executors = spec["deploymentSpec"]["executors"]
        k8s = platform["platforms"]["kubernetes"]["deploymentSpec"]["executors"]
        for label, executor in executors.items():
            container = executor["container"]
            name = re.sub(r"-\d+$", "", label.removeprefix("exec-")).replace("-", "_")
            res, want = container["resources"], cluster.profile(name)
            assert res["resourceCpuRequest"] == want.cpu and res["resourceMemoryRequest"] == want.memory, label
            # a GPU only where it is used: the train task trains through a TrainJob by default
            assert "accelerator" not in res, label
            plat = k8s[label]
            assert plat["pvcMount"][0]["mountPath"] == "/workspace"
            assert plat["nodeSelector"]["labels"] == {"pool": "ml"}
            assert plat["tolerations"][0]["key"] == "dedicated"
            assert [s["secretName"] for s in plat["imagePullSecret"]] == ["regcred"]
            assert plat["fieldPathAsEnv"] == [{"name": "GEM_KFP_RUN_ID",
                                               "fieldPath": "metadata.labels['pipeline/runid']"}]
            assert {"name": "MLFLOW_TRACKING_URI", "value": "http://mlflow.test:5000"} in container["env"]
            env = {e["name"]: e["value"] for e in container["env"]}  # the shared Feast stores
            assert (env["GEM_FEAST_ENV"], env["FEAST_REDIS_CONNECTION"]) == ("cluster", cluster.feast_redis)
        assert executors["exec-features-shard"]["container"]["resources"]["resourceCpuLimit"] == "1"
        assert executors["exec-train"]["container"]["resources"]["resourceCpuRequest"] == cluster.resources.launch.cpu
        outputs = {n: c.get("outputDefinitions", {}).get("artifacts", {}) for n, c in spec["components"].items()}
        types = {name: a["artifactType"]["schemaTitle"] for arts in outputs.values() for name, a in arts.items()}
        assert types["clean_data"] == types["features"] == types["knowledge_data"] == "system.Dataset"
        assert types["teacher"] == types["student"] == "system.Model"
        assert types["metrics"] == "system.Metrics" and types["roc"] == "system.ClassificationMetrics"
        assert types["report"] == "system.Markdown" and types["report_html"] == "system.HTML"


def test_in_task_pretraining_holds_the_gpu(tmp_path):
    cluster = load_cluster_settings(overrides=["pretrain_launcher=local", "gpu_node_selector.accelerator=h100"])
    compile_all(tmp_path, cluster=cluster)
    spec, platform = yaml.safe_load_all((tmp_path / GEM_YAML).read_text())
    res = spec["deploymentSpec"]["executors"]["exec-train"]["container"]["resources"]
    assert res["accelerator"]["resourceType"] == "nvidia.com/gpu" and res["accelerator"]["resourceCount"] == "1"
    train = platform["platforms"]["kubernetes"]["deploymentSpec"]["executors"]["exec-train"]
    assert train["nodeSelector"]["labels"] == {"accelerator": "h100"}
    assert spec["root"]["inputDefinitions"]["parameters"]["pretrain_launcher"]["defaultValue"] == "local"


def test_a_redis_password_comes_from_a_secret_and_ray_from_its_address(tmp_path):
    cluster = load_cluster_settings(overrides=["feast_redis_secret=gem-feast-redis",
                                               "feast_ray_address=ray://gem-ray-head:10001"])
    compile_all(tmp_path, cluster=cluster)
    spec, platform = yaml.safe_load_all((tmp_path / GEM_YAML).read_text())
    for label, executor in spec["deploymentSpec"]["executors"].items():
        env = {e["name"]: e["value"] for e in executor["container"]["env"]}
        assert "FEAST_REDIS_CONNECTION" not in env and env["RAY_ADDRESS"] == "ray://gem-ray-head:10001"
        secret = platform["platforms"]["kubernetes"]["deploymentSpec"]["executors"][label]["secretAsEnv"]
        assert secret[0]["secretName"] == "gem-feast-redis"
        assert secret[0]["keyToEnv"] == [{"secretKey": "connection_string", "envVar": "FEAST_REDIS_CONNECTION"}]


def test_the_trainjob_of_the_compiled_pipeline_validates_against_the_trainer_api(compiled, monkeypatch):
    docs, _ = compiled
    spec, _ = docs[GEM_YAML]
    env = {e["name"]: e["value"] for e in spec["deploymentSpec"]["executors"]["exec-train"]["container"]["env"]}
    monkeypatch.setenv(OPTIONS_ENV, env[OPTIONS_ENV])  # what the train task runs with
    launcher = spec["root"]["inputDefinitions"]["parameters"]["pretrain_launcher"]["defaultValue"]
    _, nodes, gpus = launcher.split(":")
    args = train_args("/workspace/gem/features/teacher", "/workspace/gem/features/holdout", "/workspace/gem/teacher",
                      "pipeline", ["tracking_uri=http://mlflow.test:5000"])
    manifest = trainjob_manifest("gem-pretrain-abc", env["GEM_IMAGE"], args, nodes=int(nodes),
                                 gpus_per_node=int(gpus), namespace="team-a", env={"MLFLOW_RUN_ID": "r1"})
    assert validate_trainjob(manifest) == manifest
    spec_ = manifest["spec"]
    assert "podTemplateOverrides" in spec_ and "podSpecOverrides" not in spec_
    assert spec_["trainer"]["command"][:2] == ["torchrun", "-m"]
    pod = spec_["podTemplateOverrides"][0]["spec"]
    assert pod["nodeSelector"] == {"pool": "ml", "accelerator": "h100"}
    assert pod["imagePullSecrets"] == [{"name": "regcred"}]
    assert manifest["metadata"]["namespace"] == "team-a"
    assert spec_["trainer"]["resourcesPerNode"]["limits"]["nvidia.com/gpu"] == gpus
    broken = json.loads(json.dumps(manifest))
    broken["spec"]["podSpecOverrides"] = broken["spec"].pop("podTemplateOverrides")  # the pre-v2.1 name
    with pytest.raises(ValueError, match="podSpecOverrides"):
        validate_trainjob(broken)


def test_deploy_manifests_validate():
    from kubeflow_trainer_api.models import TrainerV1alpha1TrainingRuntime
    from kubernetes import client

    api = client.ApiClient()
    kinds = {"Role": "V1Role", "RoleBinding": "V1RoleBinding", "ServiceAccount": "V1ServiceAccount",
             "PersistentVolumeClaim": "V1PersistentVolumeClaim", "Deployment": "V1Deployment", "Service": "V1Service"}
    seen = set()
    for path in sorted((ROOT / "deploy").rglob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if not doc or doc.get("kind") in (None, "Kustomization"):
                continue
            seen.add(doc["kind"])
            if doc["kind"] == "TrainingRuntime":
                assert TrainerV1alpha1TrainingRuntime.from_dict(doc).to_dict() == doc, path
                assert doc["spec"]["template"]["spec"]["failurePolicy"]["maxRestarts"] >= 1
            elif doc["kind"] in kinds:
                api._ApiClient__deserialize(doc, kinds[doc["kind"]])
    assert {"TrainingRuntime", "Role", "RoleBinding", "PersistentVolumeClaim"} <= seen
    load_cluster_settings(ROOT / "deploy" / "cluster-settings.yaml")  # the example compile options load
    rules = [r for p in (ROOT / "deploy").rglob("*.yaml") for d in yaml.safe_load_all(p.read_text())
             if d and d.get("kind") == "Role" for r in d["rules"]]
    assert any("trainjobs" in r["resources"] and "create" in r["verbs"] for r in rules)


# ---- cache keys ---------------------------------------------------------------------------------

def _tasks(spec: dict):
    """Every executor task of the compiled graph (sub-DAGs inlined), with its inputs'
    sources: (name, component, {input: ("const", v) | ("param", name) | ("task", task, output)})."""
    def walk(comp_name: str, prefix: str, bindings: dict):
        comp = spec["root"] if comp_name == "root" else spec["components"][comp_name]
        for name, task in comp["dag"]["tasks"].items():
            full = f"{prefix}{name}"
            sources = {}
            for key, value in task.get("inputs", {}).get("parameters", {}).items():
                if "runtimeValue" in value:
                    sources[key] = ("const", json.dumps(value["runtimeValue"]["constant"], sort_keys=True))
                elif "componentInputParameter" in value:
                    sources[key] = bindings.get(value["componentInputParameter"],
                                                ("param", value["componentInputParameter"]))
                elif "taskOutputParameter" in value:
                    ref = value["taskOutputParameter"]
                    sources[key] = ("task", f"{prefix}{ref['producerTask']}", ref["outputParameterKey"])
                else:  # a loop item or a collected output: depends on the producing tasks
                    sources[key] = ("opaque", json.dumps(value, sort_keys=True))
            ref = task["componentRef"]["name"]
            if "dag" in spec["components"][ref]:
                loop = task.get("parameterIterator")
                if loop:  # a loop item is a function of the list it is drawn from
                    sources[loop["itemInput"]] = sources[loop["items"]["inputParameter"]]
                yield from walk(ref, f"{full}/", sources)
            else:
                deps = [f"{prefix}{t}" for t in task.get("dependentTasks", [])]
                yield full, ref, sources, deps
    return list(walk("root", "", {}))


def cache_keys(spec: dict, params: dict, content: dict, run: str) -> dict[str, str]:
    """What KFP hashes per task, evaluated for one run: the component and its resolved
    input values (upstream outputs from the producer's key, as a cache hit returns the
    producer's recorded outputs). Uncached tasks produce what they compute: start_run
    the run context (unique per run) and the content digests of ``content``."""
    from gem_app.pipelines.settings import UNCACHED

    tasks = _tasks(spec)
    keys: dict[str, str] = {}
    outputs: dict[tuple[str, str], str] = {}
    pending = list(tasks)
    while pending:
        for item in list(pending):
            name, comp, sources, deps = item
            producers = {s[1] for s in sources.values() if s[0] == "task"} | set(deps)
            if not all(any(k == p or k.startswith(p + "/") for k in keys) for p in producers):
                continue
            pending.remove(item)
            resolved = {}
            for key, src in sorted(sources.items()):
                if src[0] == "const":
                    resolved[key] = src[1]
                elif src[0] == "param":
                    resolved[key] = json.dumps(params.get(src[1], ""))
                elif src[0] == "task":
                    resolved[key] = outputs.get((src[1], src[2])) or _sub_output(keys, src[1], src[2])
                else:
                    resolved[key] = src[1] + "|" + "|".join(keys[k] for k in sorted(keys) if k in deps)
            # KFP hashes the component and its resolved inputs, not which tasks ran before it
            key = hashlib.sha256(json.dumps([comp, resolved], sort_keys=True).encode()).hexdigest()[:16]
            if comp.removeprefix("comp-").replace("-", "_") in UNCACHED:
                key = f"{key}-{run}"  # never reused: what it returns is computed again
                if comp == "comp-start-run":
                    for out in ("ctx",):
                        outputs[(name, out)] = f"ctx-{run}"
                    for out in ("data_digest", "code_version", "sim_config", "features_config", "train_config",
                                "students_config", "tracking"):
                        outputs[(name, out)] = content.get(out, "-")
            keys[name] = key
        assert len(pending) < len(tasks) + 1
    return keys


def _sub_output(keys: dict, task: str, output: str) -> str:
    # a task's output is a function of its cache key (a hit returns what that key recorded);
    # a sub-pipeline's, of the keys of the tasks inside it
    inner = [keys[task]] if task in keys else [keys[k] for k in sorted(keys) if k.startswith(task + "/")]
    return hashlib.sha256(("|".join(inner) + output).encode()).hexdigest()[:16]


CONTENT = {"data_digest": "d1", "code_version": "c1", "sim_config": "s1", "features_config": "f1",
           "train_config": "t1", "students_config": "st1", "tracking": "/workspace/gem"}


def test_cache_keys_change_when_and_only_when_content_changes(compiled):
    docs, _ = compiled
    spec, _ = docs[GEM_YAML]
    params = {"workspace": "/workspace/gem", "data": "/workspace/gem/incoming"}
    first = cache_keys(spec, {**params, "run_id": "run-1"}, CONTENT, "run-1")
    cached = {t for t in first if not t.endswith(("start-run", "promote", "summary"))}
    assert {"ingest", "train", "gate-teacher", "knowledge", "feast-materialize", "distill-plan",
            "for-loop-1/distill", "for-loop-1/gate"} <= cached
    again = cache_keys(spec, {**params, "run_id": "run-2"}, CONTENT, "run-2")
    assert {t: first[t] for t in cached} == {t: again[t] for t in cached}  # a rerun reuses every stage
    assert first["summary"] != again["summary"] and first["start-run"] != again["start-run"]
    assert first["promote"] != again["promote"]  # the run's commit runs in every run

    def changed(**content) -> set[str]:
        keys = cache_keys(spec, {**params, "run_id": "run-3"}, {**CONTENT, **content}, "run-3")
        return {t for t in cached if keys[t] != first[t]}

    everything = set(cached)
    assert changed(data_digest="d2") == everything  # new data: every stage
    assert changed(code_version="c2") == everything
    train_and_after = changed(train_config="t2")
    assert "train" in train_and_after and "ingest" not in train_and_after
    assert not any(t.startswith("teacher-") or t.startswith("features-window") for t in train_and_after)
    assert "feast-materialize" not in train_and_after
    students = changed(students_config="st2")
    assert students and all("distill" in t or "gate" in t or "promote" in t for t in students)
    features = changed(features_config="f2")
    assert "ingest" not in features and "feast-materialize" not in features and "train" in features
    assert changed(sim_config="s2") == everything  # a simulated dataset: new simulator settings, new data


def test_the_students_window_starts_where_ingest_says_and_validation_where_the_teacher_ends(compiled):
    """``student_overlap_days``: the student features window starts at ingest's
    ``student_start`` (the teacher's end unless overlapped), the holdout at the students'
    end, and the distill plan learns where the fresh rows begin (``teacher_end``)."""
    docs, _ = compiled
    spec, _ = docs[GEM_YAML]
    assert spec["root"]["inputDefinitions"]["parameters"]["student_overlap_days"]["defaultValue"] == -1
    root = spec["root"]["dag"]["tasks"]

    def source(task: str, name: str) -> str:
        return root[task]["inputs"]["parameters"][name]["taskOutputParameter"]["outputParameterKey"]

    windows = {root[t]["inputs"]["parameters"]["name"]["runtimeValue"]["constant"]: t
               for t in root if t.startswith("features-window")}
    assert (source(windows["student"], "start"), source(windows["student"], "end")) == ("student_start",
                                                                                        "student_end")
    assert source(windows["teacher"], "end") == source("distill-plan", "fresh_from") == "teacher_end"
    assert source(windows["holdout"], "start") == "student_end"


def test_the_simulator_config_is_no_key_of_a_run_on_given_data(tmp_path):
    from gem_app.components.runtime import fingerprint

    presets = {"sim_preset": "tiny", "features_preset": "smoke", "train_preset": "tiny", "student_preset": "pipeline"}
    (tmp_path / "manifest.json").write_text("{}")
    given, simulated = fingerprint(str(tmp_path), presets), fingerprint("", presets)
    assert given["sim"] == "" and given["data"] and simulated["sim"] and simulated["data"] == ""
    assert {k: given[k] for k in ("features", "train", "students")} == {
        k: simulated[k] for k in ("features", "train", "students")}


def test_a_student_preset_reading_counters_needs_a_features_preset_that_builds_them():
    from gem_app.components.runtime import fingerprint

    presets = {"sim_preset": "tiny", "features_preset": "tiny", "train_preset": "tiny", "student_preset": "pipeline"}
    with pytest.raises(ValueError, match=r"student preset 'pipeline' reads dense features \['cnt_item_all_ctr_lift'"
                                         r".*features preset 'tiny'.*counters: true"):
        fingerprint("", presets)


def test_cluster_settings_reject_unknown_keys_and_a_workspace_off_the_volume():
    from gem.config import ConfigError

    with pytest.raises(ConfigError, match="unknown key"):
        load_cluster_settings(overrides=["resources.shard.cpus=1"])
    with pytest.raises(ValueError, match="must lie under the volume"):
        ClusterSettings(workspace="/data/gem")
    shard = load_cluster_settings(overrides=["resources.shard.cpu=2"]).resources.shard
    assert (shard.cpu, shard.memory, shard.memory_limit) == ("2", "512Mi", "4Gi")  # the rest of the profile kept
    with pytest.raises(ValueError, match="limit 4Gi below the request 8Gi"):
        load_cluster_settings(overrides=["resources.shard.memory=8Gi"])
    os.environ.pop(OPTIONS_ENV, None)
