"""Issue 28, item 2: a model is never paired with a features window whose ids mean other
users, items or attributes. Scoring, knowledge, the gate's evaluation and continued
pretraining refuse it naming both vocabulary digests; a window built with the model's
vocabularies (vocab_from) is accepted; two datasets cannot share a store's champion."""

from __future__ import annotations

import json
import shutil

import pytest

from gem.features.vocab import ALLOW_UNRECORDED, VocabularyMismatch, vocabulary_digest
from gem_app.cli import main


def _simulate(tmp_path_factory, name: str, **sizes):
    from gem.data.simulate import SimulatorConfig, simulate

    out = tmp_path_factory.mktemp("vocab-data") / name
    simulate(SimulatorConfig(days=4, topics=8, advertisers=40, seed=7, workers=1, **sizes), out, progress=False)
    return out


def _build(data, out, **cfg):
    from gem.features.build import build_features
    from tests.features.conftest import tiny_cfg

    build_features(data, out, tiny_cfg(max_seq_len=8, num_buckets=1, workers=1, **cfg))
    return out


@pytest.fixture(scope="module")
def smaller(tmp_path_factory):
    """Another dataset with fewer users and items: its own vocabularies, smaller tables."""
    return _simulate(tmp_path_factory, "smaller", users=150, items=300)


@pytest.fixture(scope="module")
def smaller_features(smaller, tmp_path_factory):
    return _build(smaller, tmp_path_factory.mktemp("vocab") / "smaller")


@pytest.fixture(scope="module")
def larger_features(tmp_path_factory):
    data = _simulate(tmp_path_factory, "larger", users=450, items=900)
    return _build(data, tmp_path_factory.mktemp("vocab") / "larger")


@pytest.fixture(scope="module")
def on_teacher_vocab(smaller, tiny_features, tmp_path_factory):
    """The smaller dataset's window built with the teacher's vocabularies."""
    return _build(smaller, tmp_path_factory.mktemp("vocab") / "on-teacher", vocab_from=str(tiny_features))


def _digests(features):
    from gem.features.loader import load_feature_spec

    return load_feature_spec(features).vocab_digests


@pytest.mark.parametrize("window", ["smaller_features", "larger_features"])
def test_score_refuses_another_datasets_window_naming_both_digests(window, tiny_teacher, tiny_features, tmp_path,
                                                                   capsys, request):
    """Before: smaller vocabularies scored 455 examples with the wrong embeddings (rc 0),
    larger ones died in `Expected i < index_size`."""
    features = request.getfixturevalue(window)
    out = tmp_path / "preds.parquet"
    rc = main(["score", "--model", str(tiny_teacher), "--features", str(features), "--out", str(out)])
    err = capsys.readouterr().err
    assert rc == 2 and not out.exists()
    assert vocabulary_digest(_digests(tiny_features)) in err and vocabulary_digest(_digests(features)) in err
    assert "user_id" in err and "Traceback" not in err and len(err.strip().splitlines()) <= 2


def test_a_window_built_with_the_models_vocabularies_scores(tiny_teacher, tiny_features, on_teacher_vocab, tmp_path,
                                                            capsys):
    assert _digests(on_teacher_vocab) == _digests(tiny_features)
    out = tmp_path / "preds.parquet"
    assert main(["score", "--model", str(tiny_teacher), "--features", str(on_teacher_vocab), "--out", str(out)]) == 0
    assert out.is_file() and "scored" in capsys.readouterr().out


def test_knowledge_generation_refuses_another_vocabulary(tiny_teacher, smaller_features, tmp_path):
    from gem.knowledge.generate import generate_knowledge

    with pytest.raises(VocabularyMismatch, match=vocabulary_digest(_digests(smaller_features))):
        generate_knowledge(tiny_teacher, smaller_features, tmp_path / "knowledge")
    assert not (tmp_path / "knowledge" / "manifest.json").exists()


def test_continued_pretraining_refuses_another_vocabulary(tiny_teacher, smaller_features):
    from gem.features.loader import load_feature_spec
    from gem.model import build_model, load_model_config
    from gem.training.trainer import init_weights

    spec = load_feature_spec(smaller_features)
    model = build_model(load_model_config("tiny", ["attention_backend=padded"]), spec)
    with pytest.raises(VocabularyMismatch, match=f"init_from={tiny_teacher}"):
        init_weights(model, str(tiny_teacher), spec, str(smaller_features))


def test_the_gate_refuses_a_champion_of_another_dataset_in_the_same_store(tiny_teacher, smaller_features, tmp_path):
    """Two datasets sharing one MLflow store: the teacher gate scores dataset A's
    champion on B's holdout (the gate's own scoring function)."""
    import mlflow
    from mlflow import MlflowClient

    from gem import registry, tracking
    from gem.model.store import log_model
    from gem_app.stages import gate

    # teacher_predictions (issue 27's gate) replaces _teacher_holdout (library evaluate)
    score = getattr(gate, "teacher_predictions", None) or gate._teacher_holdout

    tracking.configure(tmp_path, experiment=registry.EXPERIMENT)
    with mlflow.start_run():
        log_model(tiny_teacher, registered_name=registry.TEACHER_MODEL)
    MlflowClient().set_registered_model_alias(registry.TEACHER_MODEL, registry.CHAMPION, "1")
    champion = registry.model_uri(registry.TEACHER_MODEL, alias=registry.CHAMPION)
    with pytest.raises(VocabularyMismatch, match="models:/gem_teacher.* was trained with vocabularies"):
        score(champion, str(smaller_features))


def test_a_model_without_recorded_vocabularies_is_refused_unless_allowed(tiny_teacher, tiny_features, tmp_path,
                                                                         capsys, monkeypatch):
    """A model saved before digests existed: refused by default, used with a warning
    under GEM_ALLOW_UNRECORDED_VOCABULARIES=1 (docs/features.md)."""
    from gem.model.store import SPEC, write_digests

    old = tmp_path / "old"
    shutil.copytree(tiny_teacher / "model", old)
    spec = json.loads((old / SPEC).read_text())
    spec.pop("vocab_digests")
    (old / SPEC).write_text(json.dumps(spec))
    write_digests(old)
    out = tmp_path / "preds.parquet"
    assert main(["score", "--model", str(old), "--features", str(tiny_features), "--out", str(out)]) == 2
    assert "saved without the digests of its vocabularies" in capsys.readouterr().err and not out.exists()
    monkeypatch.setenv(ALLOW_UNRECORDED, "1")
    assert main(["score", "--model", str(old), "--features", str(tiny_features), "--out", str(out)]) == 0
    assert out.is_file()


def test_vocabulary_digests_are_the_content_not_the_file(tiny_features, on_teacher_vocab):
    """vocab_from rewrites the files; the identity is their values, the same."""
    from gem.features.vocab import Vocabularies

    assert Vocabularies.read(on_teacher_vocab).digests() == Vocabularies.read(tiny_features).digests()
    assert json.loads((tiny_features / "manifest.json").read_text())["spec"]["vocab_digests"] == _digests(tiny_features)


@pytest.fixture(scope="module")
def saved_student(tiny_features, tmp_path_factory):
    """A student built on the teacher's window (its vocabularies recorded) and saved as the
    registry stores it."""
    from gem.features.loader import load_feature_spec
    from students.config import StudentModelConfig
    from students.distill import cardinalities
    from students.model import VerticalStudent
    from students.store import save_student

    spec, cfg = load_feature_spec(tiny_features), StudentModelConfig()
    model = VerticalStudent(cfg, cardinalities(spec, cfg), len(cfg.dense_features), vocab_digests=spec.vocab_digests)
    return save_student(model, tmp_path_factory.mktemp("student") / "student")


def test_a_student_records_its_vocabularies_and_refuses_another_window(saved_student, tiny_features,
                                                                       smaller_features, on_teacher_vocab):
    """The student gate scores the champion student on the run's holdout through
    score_window: a champion of another dataset's vocabularies is refused there, naming
    both digests; a window built with the student's vocabularies scores."""
    from students.pyfunc import score_window
    from students.store import load_student

    student = load_student(saved_student)
    assert student.vocab_digests == _digests(tiny_features)
    with pytest.raises(VocabularyMismatch) as refused:
        score_window(student, str(smaller_features), surface="feed", name="champion models:/student_feed/1")
    text = str(refused.value)
    assert "champion models:/student_feed/1" in text and vocabulary_digest(_digests(tiny_features)) in text
    assert vocabulary_digest(_digests(smaller_features)) in text
    rows, probs = score_window(student, str(on_teacher_vocab), surface="feed")
    assert len(rows) == len(probs) > 0


def test_a_student_saved_without_vocabularies_is_refused_unless_allowed(saved_student, tiny_features, tmp_path,
                                                                        monkeypatch):
    from students.pyfunc import score_window
    from students.store import STUDENT_CONFIG, STUDENT_FILES, load_student

    old = tmp_path / "old-student"
    shutil.copytree(saved_student, old)
    args = json.loads((old / STUDENT_CONFIG).read_text())
    args.pop("vocab_digests")
    (old / STUDENT_CONFIG).write_text(json.dumps(args))
    from gem.model.store import write_digests

    write_digests(old, STUDENT_FILES)
    with pytest.raises(VocabularyMismatch, match="saved without the digests of its vocabularies"):
        score_window(load_student(old), str(tiny_features), surface="feed")
    monkeypatch.setenv(ALLOW_UNRECORDED, "1")
    rows, probs = score_window(load_student(old), str(tiny_features), surface="feed")
    assert len(rows) == len(probs) > 0
