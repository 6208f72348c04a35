"""Defect 7a: models are saved and loaded through gem.model.store only: a replaced
weights file is refused by digest before anything reads it, and a weights-only load
refuses a pickle that would run code."""

from __future__ import annotations

import json
import os
import pickle
import shutil

import pytest
import torch

from gem.model.store import DIGESTS, WEIGHTS, ModelStoreError, load_model, load_state, verify


class _Payload:
    """Unpickling this runs os.system: it would create the ``flag`` file."""

    def __init__(self, flag):
        self.flag = str(flag)

    def __reduce__(self):
        return os.system, (f"touch {self.flag}",)


def _poison(path, flag):
    with open(path, "wb") as f:
        pickle.dump({"weights": _Payload(flag)}, f)


def test_a_replaced_weights_file_is_refused_by_digest_and_never_run(tiny_teacher, tmp_path):
    model = tmp_path / "teacher"
    shutil.copytree(tiny_teacher, model)
    flag = tmp_path / "pwned"
    _poison(model / "model" / WEIGHTS, flag)
    with pytest.raises(ModelStoreError, match="does not match digests.json"):
        load_model(model)
    from gem.knowledge.teacher import load_teacher

    with pytest.raises(ModelStoreError, match=WEIGHTS):
        load_teacher(model)
    assert not flag.exists()


def test_weights_only_refuses_a_malicious_pickle_even_with_matching_digests(tiny_teacher, tmp_path):
    model = tmp_path / "teacher" / "model"
    shutil.copytree(tiny_teacher / "model", model)
    flag = tmp_path / "pwned"
    _poison(model / WEIGHTS, flag)
    digests = json.loads((model / DIGESTS).read_text())
    import hashlib

    digests[WEIGHTS] = hashlib.sha256((model / WEIGHTS).read_bytes()).hexdigest()  # an attacker rewrote both
    (model / DIGESTS).write_text(json.dumps(digests))
    with pytest.raises(ModelStoreError, match="weights-only"):
        load_state(model)
    (model / DIGESTS).unlink()  # a folder without digests: still weights-only
    with pytest.raises(ModelStoreError, match="weights-only"):
        load_state(model)
    assert not flag.exists()


def test_export_writes_digests_and_round_trips(tiny_teacher):
    digest = verify(tiny_teacher / "model")
    stored = load_model(tiny_teacher)
    assert stored.digest == digest and stored.version.endswith(digest[:12])
    assert set(json.loads((tiny_teacher / "model" / DIGESTS).read_text())) == {WEIGHTS, "model_config.json",
                                                                              "feature_spec.json"}


def test_mlflow_models_are_logged_as_files_and_load_without_unpickling(tiny_teacher, tmp_path):
    import mlflow

    from gem.model.store import log_model

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    mlflow.set_tracking_uri(uri)
    experiment = mlflow.create_experiment("store", artifact_location=(tmp_path / "art").as_uri())
    with mlflow.start_run(experiment_id=experiment) as run:
        log_model(tiny_teacher, registered_name="gem-store-test")
    for source in (f"runs:/{run.info.run_id}/model", "models:/gem-store-test/1"):
        stored = load_model(source, tracking_uri=uri)
        reference = load_model(tiny_teacher)
        for key, value in reference.model.state_dict().items():
            torch.testing.assert_close(stored.model.state_dict()[key], value, rtol=0, atol=0)
    assert stored.version == "models:/gem-store-test/1" and stored.run_id == run.info.run_id
    # the artifact store's copy replaced by a pickle: refused on download, never run
    flag = tmp_path / "pwned"
    stored_weights = [p for p in (tmp_path / "art").rglob(WEIGHTS)]
    assert stored_weights
    for path in stored_weights:
        _poison(path, flag)
    with pytest.raises(ModelStoreError):
        load_model("models:/gem-store-test/1", tracking_uri=uri)
    assert not flag.exists()


def test_training_does_not_import_knowledge():
    import subprocess
    import sys

    code = "import sys, gem.training.trainer; print(any(m.startswith('gem.knowledge') for m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"
    source = open(__import__("gem.training.trainer", fromlist=["x"]).__file__).read()
    assert "gem.knowledge" not in source


def test_a_student_is_stored_as_tensors_and_json_and_an_altered_file_is_refused(tmp_path):
    import torch

    from gem.model.store import WEIGHTS, ModelStoreError
    from students.config import StudentModelConfig
    from students.model import VerticalStudent
    from students.store import STUDENT_FILES, load_student, save_student

    torch.manual_seed(0)
    student = VerticalStudent(StudentModelConfig(), {"user_id": 7, "item_id": 11, "item_format": 3}, 2,
                              teacher_emb_dim=4, num_surfaces=2)
    folder = save_student(student, tmp_path / "student")
    assert sorted(p.name for p in folder.iterdir()) == sorted([*STUDENT_FILES, "digests.json"])
    loaded = load_student(folder)
    assert loaded.keys == student.keys  # the input columns keep their order
    for (k, a), (_, b) in zip(student.state_dict().items(), loaded.state_dict().items(), strict=True):
        assert torch.equal(a, b), k
    (folder / WEIGHTS).write_bytes((folder / WEIGHTS).read_bytes()[:-8] + b"\0" * 8)
    with pytest.raises(ModelStoreError, match="sha256"):
        load_student(folder)
