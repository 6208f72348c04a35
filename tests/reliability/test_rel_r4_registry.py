"""Issue 42, case 3: the registry's states follow the documented rules after every
commit, rerun and recovery (docs/pipelines.md: ``@champion`` serves, ``@challenger`` is
the newest gated version not promoted, never the champion), and the commit checks them
(gem_app.promotion ``registry_problems``) before it is done. Against a real MLflow
registry (sqlite); the model versions are records only (the commit never loads them)."""

from __future__ import annotations

import itertools

import mlflow
import numpy as np
import pytest
from mlflow import MlflowClient

from gem import tracking
from gem.registry import CHALLENGER, CHAMPION
from gem_app import promotion
from gem_app.promotion import (
    JOURNAL,
    KEEP,
    NOT_ENOUGH_EVIDENCE,
    PROMOTE,
    GateConfig,
    GateDecision,
    Holdout,
    RegistryInvariantError,
    commit,
    decide_paired,
    recover,
    registry_problems,
)

_COUNT = itertools.count()


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> str:
    """One sqlite registry for the module (creating one takes seconds); each test names its own models."""
    uri = tracking.configure(tmp_path_factory.mktemp("r4-registry"), experiment="r4-registry")
    mlflow.set_tracking_uri("")
    return uri


@pytest.fixture()
def client(store):
    mlflow.set_tracking_uri(store)  # tests/conftest.py resets it after each test
    return MlflowClient()


@pytest.fixture()
def names(client) -> tuple[str, str]:
    """(teacher, student) model names of this test's own."""
    i = next(_COUNT)
    return f"gem_teacher_{i}", f"student_feed_{i}"


def _versions(client, name: str, n: int) -> list[str]:
    client.create_registered_model(name)
    return [str(client.create_model_version(name, source=f"file:///nowhere/{name}/{i}").version) for i in range(n)]


def _aliases(client, name: str) -> dict[str, str]:
    return {k: str(v) for k, v in client.get_registered_model(name).aliases.items()}


def _decision(name, version, outcome=PROMOTE, champion=None, teacher=""):
    return GateDecision(name, version, champion, outcome, f"{outcome} (test)", teacher_version=teacher,
                        config={"require_champion_teacher": True})


def test_a_promoted_version_is_never_left_the_challenger(client, names, tmp_path):
    """What the adversarial pass saw: a first run keeps v1 (its teacher was not promoted
    yet), a rerun promotes the same v1: it held both aliases."""
    teacher, feed = names
    journal = tmp_path / "journal"
    (t1,) = _versions(client, teacher, 1)
    (s1,) = _versions(client, feed, 1)
    commit([_decision(teacher, t1, KEEP), _decision(feed, s1, KEEP, teacher=f"models:/{teacher}/{t1}")],
           journal)
    assert _aliases(client, feed) == {CHALLENGER: s1}
    commit([_decision(teacher, t1), _decision(feed, s1, teacher=f"models:/{teacher}/{t1}")], journal)
    assert _aliases(client, feed) == {CHAMPION: s1}
    assert _aliases(client, teacher) == {CHAMPION: t1}
    assert registry_problems([teacher, feed], journal_dir=journal) == []


def test_a_challenger_is_newer_than_the_champion_after_every_commit_and_rerun(client, names, tmp_path):
    teacher, feed = names
    journal = tmp_path / "journal"
    v1, v2, v3, v4 = _versions(client, feed, 4)
    commit([_decision(feed, v1)], journal)
    commit([_decision(feed, v2, NOT_ENOUGH_EVIDENCE, champion=v1)], journal)
    assert _aliases(client, feed) == {CHAMPION: v1, CHALLENGER: v2}
    commit([_decision(feed, v3, champion=v1)], journal)  # gated after v2: v2 is older than it now
    assert _aliases(client, feed) == {CHAMPION: v3}
    commit([_decision(feed, v2, KEEP, champion=v1)], journal)  # an older run's decision again
    assert _aliases(client, feed) == {CHAMPION: v3}
    commit([_decision(feed, v4, KEEP, champion=v3)], journal)
    commit([_decision(feed, v3, champion=v3)], journal)  # a rerun: already the champion
    assert _aliases(client, feed) == {CHAMPION: v3, CHALLENGER: v4}
    assert registry_problems([teacher, feed], journal_dir=journal) == []


def test_a_recovered_commit_leaves_the_champions_own_decision(client, names, tmp_path):
    """A rerun's commit killed half-way gates the champion again: the recovery restores
    its tags as they were (it used to delete them: a champion with no recorded decision)."""
    teacher, feed = names
    journal = tmp_path / "journal"
    (t1,) = _versions(client, teacher, 1)
    (s1,) = _versions(client, feed, 1)
    commit([_decision(teacher, t1), _decision(feed, s1, teacher=f"models:/{teacher}/{t1}")], journal,
           pipeline_run_id="run-1")
    before = client.get_model_version(feed, s1).tags

    def die(where):
        if where == "moved":
            raise KeyboardInterrupt("killed with every alias moved, no decision written")

    rerun = [_decision(teacher, t1, champion=t1), _decision(feed, s1, champion=s1,
                                                            teacher=f"models:/{teacher}/{t1}")]
    with pytest.raises(KeyboardInterrupt):
        commit(rerun, journal, pipeline_run_id="run-2", fault=die)
    assert (journal / JOURNAL).is_file()
    assert registry_problems([teacher, feed], journal_dir=journal)  # the journal is pending
    recover(journal)
    after = client.get_model_version(feed, s1).tags
    assert after["gate.decision"] == PROMOTE and after["gate.pipeline_run_id"] == before["gate.pipeline_run_id"]
    assert registry_problems([teacher, feed], journal_dir=journal) == []


def test_the_commit_checks_the_registrys_rules_and_undoes_a_commit_that_breaks_them(client, names, tmp_path,
                                                                                     monkeypatch):
    teacher, feed = names
    journal = tmp_path / "journal"
    old, new = _versions(client, feed, 2)
    commit([_decision(feed, old)], journal)
    move = promotion._move

    def broken(client_, d):  # an alias move with the defect the pass saw: both aliases on one version
        move(client_, d)
        client_.set_registered_model_alias(d.model_name, CHALLENGER, d.challenger_version)

    monkeypatch.setattr(promotion, "_move", broken)
    with pytest.raises(RegistryInvariantError, match=f"v{new} is both champion and challenger"):
        commit([_decision(feed, new, champion=old)], journal)
    assert _aliases(client, feed) == {CHAMPION: old}  # undone
    assert client.get_model_version(feed, new).tags.get("gate.decision") is None
    assert not (journal / JOURNAL).exists()


def test_registry_problems_names_each_broken_rule(client, names, tmp_path):
    teacher, feed = names
    (t1, t2) = _versions(client, teacher, 2)
    client.set_registered_model_alias(teacher, CHAMPION, t2)
    client.set_registered_model_alias(teacher, CHALLENGER, t1)
    client.set_model_version_tag(teacher, t2, "gate.decision", KEEP)
    (s1,) = _versions(client, feed, 1)
    client.set_registered_model_alias(feed, CHAMPION, s1)
    client.set_registered_model_alias(feed, CHALLENGER, s1)
    (tmp_path / "journal").mkdir()
    (tmp_path / "journal" / JOURNAL).write_text("{}")
    problems = registry_problems([teacher, feed], journal_dir=tmp_path / "journal")
    assert any("journal is left" in p for p in problems)
    assert f"{teacher}: the challenger v{t1} is older than the champion v{t2}" in problems
    assert f"{teacher}: the champion v{t2} was recorded 'keep', not promoted" in problems
    assert f"{feed}: v{s1} is both champion and challenger" in problems
    client.delete_registered_model_alias(feed, CHAMPION)
    applied = registry_problems([feed], decisions=[_decision(feed, s1)])
    assert f"{feed}: v{s1} was promoted but the champion is none" in applied


def test_a_champion_whose_knowledge_no_store_holds_is_not_compared_and_the_reason_says_so(client, names):
    teacher, feed = names
    (t1,) = _versions(client, teacher, 1)
    client.set_registered_model_alias(teacher, CHAMPION, t1)
    old, new = _versions(client, feed, 2)
    client.set_registered_model_alias(feed, CHAMPION, old)
    rng = np.random.default_rng(0)
    n = 4000
    x = rng.normal(size=n)
    p = 1 / (1 + np.exp(-(1.5 * x - 2)))
    y = (rng.random(n) < p).astype(float)
    holdout = {"feed": Holdout(y, rng.integers(0, n // 4, n), p, np.full(n, y.mean()))}
    cfg = GateConfig(bootstrap=200)
    why = "it reads teacher X's embeddings"
    d = decide_paired(feed, new, holdout, cfg, teacher_version=f"models:/{teacher}/{t1}",
                      champion_unavailable=why)
    assert d.promote and f"champion v{old} not compared: {why}" in d.reason and d.champion_version == old
    compared = decide_paired(feed, new, holdout, cfg, teacher_version=f"models:/{teacher}/{t1}")
    assert not compared.promote and "vs champion: no predictions" in compared.reason
