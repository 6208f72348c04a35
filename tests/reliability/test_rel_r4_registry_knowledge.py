"""Issue 42, case 1: a student reads only its own teacher's knowledge.

A registered student (the pipeline's distill stage on the tiny world, as served in
tests/app) records the knowledge it learned from (teacher version, teacher weights
digest, vocabulary digest, content digest, window, store); given a Feast store of
another dataset (other vocabularies) or of another teacher (another model under the
same version name), the pyfunc model's predict, the gate's scoring and the serving
check refuse it, naming both; the same teacher's knowledge re-registered for other days
(another content digest) is read as before. The rule: students/lineage.py.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import mlflow
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from students.lineage import ALLOW_UNRECORDED, KnowledgeMismatch, check_serving, knowledge_problem
from tests.app.serving_support import registered_student
from tests.students.fixtures import tiny_world

EMBEDDING_SOURCES = ("teacher_user_embedding.parquet", "teacher_item_embedding.parquet")


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    return registered_student(tmp_path_factory.mktemp("r4-knowledge"))


@pytest.fixture(autouse=True)
def _registry(store):
    mlflow.set_tracking_uri(store.tracking_uri)  # tests/conftest.py resets it after each test


def _retagged(repo: Path, out: Path, **tags: str) -> Path:
    """A copy of ``repo`` whose knowledge tables carry other tag values (the same rows
    as another dataset's or another teacher's knowledge would be tagged)."""
    shutil.copytree(repo, out)
    for name in EMBEDDING_SOURCES + ("teacher_predictions.parquet",):
        path = out / "data" / name
        table = pq.read_table(path)
        for column, value in tags.items():
            table = table.set_column(table.schema.get_field_index(column), column,
                                     pa.array([value] * table.num_rows, pa.string()))
        pq.write_table(table, path)
    return out


@pytest.fixture(scope="module")
def other_dataset(store, tmp_path_factory) -> Path:
    return _retagged(store.feast_repo, tmp_path_factory.mktemp("other-dataset") / "feast", vocab_digest="0123456789ab")


@pytest.fixture(scope="module")
def other_teacher(store, tmp_path_factory) -> Path:
    """A real store of another teacher's knowledge on the evaluation window: a GEM of the
    same spec and version name, other weights (what a second workspace's
    models:/<name>/1 is)."""
    import torch

    from gem.knowledge import generate_knowledge, prepare_repo, register_knowledge
    from gem.knowledge.teacher import Teacher, load_teacher
    from gem.model import build_model

    world = tiny_world(Path(store.tracking_root).parent / "world")  # built with the store (cached)
    mine = load_teacher(world.teacher_uri, world.tracking_uri)
    torch.manual_seed(1)
    model = build_model(mine.model.cfg, mine.spec).eval()
    other = Teacher(model, mine.uri, mine.version, digest="f" * 64)
    root = tmp_path_factory.mktemp("other-teacher")
    generate_knowledge(other, store.features, root / "knowledge")
    repo = prepare_repo(root / "feast")
    register_knowledge(repo, [root / "knowledge"])
    return repo


def registered_teacher(store) -> str:
    from mlflow import MlflowClient

    return MlflowClient().get_model_version(store.model, "1").tags["teacher_version"]


def _predict(store, repo: Path) -> pd.DataFrame:
    model = mlflow.pyfunc.load_model(f"models:/{store.model}/1")
    return model.predict(pd.DataFrame({"features": [str(store.features)], "feast_repo": [str(repo)]}),
                         params={"max_examples": 40})


def test_a_student_records_the_knowledge_it_learned_from(store):
    from students.store import load_student

    student = load_student(f"models:/{store.model}/1")
    recorded = student.knowledge
    assert student.teacher_emb_dim > 0
    assert recorded["teacher_versions"] == [registered_teacher(store)]
    assert len(recorded["teacher_digests"]) == 1 and len(recorded["teacher_digests"][0]) == 64
    assert len(recorded["vocab_digests"]) == 1 and recorded["digest"] and len(recorded["window"]) == 2
    from gem.utils.paths import located

    # the store, as the run records paths (outside the run's workspace here: a file URI)
    assert recorded["feast_repo"].startswith("file://")
    assert located(recorded["feast_repo"]) == Path(store.feast_repo).resolve()
    tags = mlflow.MlflowClient().get_model_version(store.model, "1").tags  # and on the version, for the UI
    assert tags["knowledge.teacher_digest"] == recorded["teacher_digests"][0]
    assert tags["knowledge.digest"] == recorded["digest"]


def test_pyfunc_predict_refuses_another_datasets_feast_store_naming_both(store, other_dataset):
    from gem.features.vocab import vocabulary_digest
    from students.store import load_student

    own = _predict(store, store.feast_repo)
    assert len(own) > 0 and np.isfinite(own["p_click"]).all()
    with pytest.raises(KnowledgeMismatch) as refused:
        _predict(store, other_dataset)
    text = str(refused.value)
    ours = vocabulary_digest(load_student(f"models:/{store.model}/1").vocab_digests)
    assert "another dataset's" in text and "0123456789ab" in text and ours in text  # both vocabularies
    assert str(other_dataset) in text and registered_teacher(store) in text


def test_pyfunc_predict_refuses_another_teachers_store_and_reads_its_own_teachers_later_days(
        store, other_teacher, tmp_path):
    from gem.knowledge import prepare_repo, register_knowledge
    from students.store import load_student

    with pytest.raises(KnowledgeMismatch, match="another teacher's") as refused:
        _predict(store, other_teacher)
    recorded = load_student(f"models:/{store.model}/1").knowledge["teacher_digests"][0]
    assert recorded[:12] in str(refused.value) and "f" * 12 in str(refused.value)  # both teachers' weights
    # the same teacher's knowledge registered again for other days: another content digest, read as before
    knowledge = sorted(p for p in Path(store.feast_repo).parent.glob("knowledge_*") if p.name != "knowledge_teacher")
    later = prepare_repo(tmp_path / "later")
    register_knowledge(later, knowledge)
    from gem.knowledge.feast import registered_knowledge

    assert registered_knowledge(later)["digest"] != load_student(f"models:/{store.model}/1").knowledge["digest"]
    assert len(_predict(store, later)) > 0


def test_the_gate_refuses_a_challenger_on_another_store_and_scores_the_champion_on_its_own(
        store, other_dataset, monkeypatch):
    import students.store
    from gem_app.stages.gate import holdout_predictions

    uri = f"models:/{store.model}/1"
    with pytest.raises(KnowledgeMismatch, match="another dataset's"):
        holdout_predictions({"challenger": uri}, store.surface, str(store.features), str(other_dataset), "default")
    # the champion learned from an earlier teacher (the run's store holds another's): scored
    # with the store it was trained with, as serving it would read
    _, own = holdout_predictions({"challenger": uri}, store.surface, str(store.features), str(store.feast_repo),
                                 "default")
    unavailable: dict[str, str] = {}
    _, fallback = holdout_predictions({"champion": uri}, store.surface, str(store.features), str(other_dataset),
                                      "default", unavailable=unavailable)
    assert np.allclose(fallback["champion"], own["challenger"]) and not unavailable
    # ... and when no store holds its teacher's knowledge any more, it is left out, saying why
    load = students.store.load_student

    def moved(source, tracking_uri=None):
        model = load(source, tracking_uri)
        model.knowledge = {**model.knowledge, "feast_repo": (Path(other_dataset).parent / "gone").as_uri()}
        return model

    monkeypatch.setattr(students.store, "load_student", moved)
    _, left = holdout_predictions({"champion": uri}, store.surface, str(store.features), str(other_dataset),
                                  "default", unavailable=unavailable)
    assert left == {} and "another dataset's" in unavailable["champion"]


def test_the_serving_check_refuses_another_store_and_a_student_reading_no_knowledge_is_not_checked(
        store, other_dataset, other_teacher, monkeypatch):
    from students.store import load_student

    student = load_student(f"models:/{store.model}/1")
    check_serving(student, store.feast_repo, store.vocab)
    for repo, what in ((other_dataset, "another dataset's"), (other_teacher, "another teacher's")):
        with pytest.raises(KnowledgeMismatch, match=what):
            check_serving(student, repo, store.vocab)
    # unrecorded lineage cannot be checked: refused unless allowed
    student.knowledge = {}
    assert "saved without the lineage" in knowledge_problem(student, store.feast_repo)
    monkeypatch.setenv(ALLOW_UNRECORDED, "1")
    assert knowledge_problem(student, store.feast_repo) == ""
    monkeypatch.delenv(ALLOW_UNRECORDED)
    # a student reading no teacher embeddings reads no knowledge: the store is not its input
    student.teacher_emb_dim = 0
    assert knowledge_problem(student, other_dataset) == ""


def test_the_online_scorer_refuses_another_datasets_store(store, other_dataset):
    from students.serving import Scorer
    from students.store import load_student

    with pytest.raises(KnowledgeMismatch, match="another dataset's"):
        Scorer(load_student(f"models:/{store.model}/1"), other_dataset, store.vocab, surface=store.surface)
