"""Promotion gate against a real MLflow registry (sqlite): a worse challenger is never
promoted, a better one is, and the decision is recorded either way."""

from __future__ import annotations

import mlflow
import numpy as np
import pytest
from mlflow import MlflowClient
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import log_loss, roc_auc_score

from gem import tracking
from gem.registry import CHAMPION
from gem_app.promotion import GateConfig, compare, gate_and_promote

SURFACES = ("feed", "video")


def _holdout(seed: int):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(4000, 3))
    y = (rng.random(4000) < 1 / (1 + np.exp(-(2 * x[:, 0] - 1.5)))).astype(int)
    surface = rng.integers(0, len(SURFACES), 4000)
    return x, y, surface


def _evaluate(model_uri: str, x, y, surface) -> dict[str, dict[str, float]]:
    """Per-surface AUC and normalized entropy of a registered model on the holdout."""
    p = np.clip(mlflow.pyfunc.load_model(model_uri).predict(x).astype(float), 1e-6, 1 - 1e-6)
    out = {}
    for s, name in enumerate(SURFACES):
        m = surface == s
        base = y[m].mean()
        entropy = -(base * np.log(base) + (1 - base) * np.log(1 - base))
        out[name] = {"auc": roc_auc_score(y[m], p[m]), "ne": log_loss(y[m], p[m]) / entropy}
    return out


class _Scores(mlflow.pyfunc.PythonModel):
    def __init__(self, model, flip: bool):
        self.model, self.flip = model, flip

    def predict(self, context, model_input, params=None):
        p = self.model.predict_proba(np.asarray(model_input))[:, 1]
        return 1 - p if self.flip else p


def _register(name: str, x, y, *, flip: bool, features: list[int]) -> str:
    model = LogisticRegression().fit(x * np.isin(np.arange(3), features), y)
    with mlflow.start_run():
        info = mlflow.pyfunc.log_model(name="model", python_model=_Scores(model, flip),
                                       registered_model_name=name, pip_requirements=["scikit-learn"])
    return str(info.registered_model_version)


@pytest.fixture()
def registry(tmp_path):
    tracking.configure(tmp_path, experiment="gate-test")
    yield MlflowClient()
    mlflow.set_tracking_uri("")  # leave no global state for other tests


def test_worse_challenger_is_never_promoted(registry):
    x, y, _ = _holdout(0)
    hx, hy, hs = _holdout(1)
    cfg = GateConfig(min_auc=0.6)
    name = "student_demo"
    v1 = _register(name, x, y, flip=False, features=[0])
    first = gate_and_promote(name, v1, _evaluate(f"models:/{name}/{v1}", hx, hy, hs), None, cfg)
    assert first.promote and str(registry.get_model_version_by_alias(name, CHAMPION).version) == v1

    worse = _register(name, x, y, flip=True, features=[0])  # deliberately inverted scores
    champion_metrics = _evaluate(f"models:/{name}@{CHAMPION}", hx, hy, hs)
    decision = gate_and_promote(name, worse, _evaluate(f"models:/{name}/{worse}", hx, hy, hs), champion_metrics, cfg)
    assert not decision.promote and not any(v.wins for v in decision.surfaces)
    assert str(registry.get_model_version_by_alias(name, CHAMPION).version) == v1
    tags = registry.get_model_version(name, worse).tags
    assert tags["gate.decision"] == "rejected" and tags["gate.against"] == v1 and "auc" in tags["gate.feed"]


def test_better_challenger_is_promoted_a_tie_is_not_and_thresholds_apply():
    better = {"feed": {"auc": 0.75, "ne": 0.90}}
    champion = {"feed": {"auc": 0.74, "ne": 0.91}}
    assert compare(better, champion, GateConfig())[0]
    assert not compare(champion, champion, GateConfig())[0]  # a tie does not pass
    assert not compare(better, champion, GateConfig(min_auc_gain=0.02))[0]
    mixed = {"feed": {"auc": 0.75, "ne": 0.90}, "video": {"auc": 0.60, "ne": 1.2}}
    ref = {"feed": champion["feed"], "video": {"auc": 0.70, "ne": 0.95}}
    assert not compare(mixed, ref, GateConfig())[0]
    assert compare(mixed, ref, GateConfig(require_all_surfaces=False))[0]
    with pytest.raises(ValueError, match="no evaluated surface"):
        compare({}, None, GateConfig())


def test_promotion_is_compare_and_set(registry):
    """Two challengers gated against the same champion: the first win moves the alias, the
    second (never compared with the new champion) is not applied."""
    from gem_app.promotion import apply_decision, decide

    x, y, _ = _holdout(0)
    hx, hy, hs = _holdout(1)
    name, cfg = "student_cas", GateConfig(min_auc=0.6)
    v1 = _register(name, x, y, flip=False, features=[0])
    gate_and_promote(name, v1, _evaluate(f"models:/{name}/{v1}", hx, hy, hs), None, cfg)
    a, b = (_register(name, x, y, flip=False, features=[0, 1]) for _ in range(2))
    champion = _evaluate(f"models:/{name}@{CHAMPION}", hx, hy, hs)
    better = {s: {"auc": m["auc"] + 0.01, "ne": m["ne"] - 0.01} for s, m in champion.items()}
    first, second = decide(name, a, better, champion, cfg), decide(name, b, better, champion, cfg)
    assert first.promote and second.promote and first.champion_version == second.champion_version == v1
    assert apply_decision(first).promote
    applied = apply_decision(second)
    assert not applied.promote and "champion moved" in applied.stale
    assert str(registry.get_model_version_by_alias(name, CHAMPION).version) == a
    assert registry.get_model_version(name, b).tags["gate.decision"] == "rejected"


def _paired_holdout(n=6000, seed=3):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 3))
    y = (rng.random(n) < 1 / (1 + np.exp(-(1.5 * x[:, 0] + x[:, 1] - 2.0)))).astype(float)
    users = rng.integers(0, n // 4, n)
    return x, y, users


def _fit_predict(x, y, features, shuffle=False):
    labels = np.random.default_rng(9).permutation(y) if shuffle else y
    model = LogisticRegression().fit(x[:, features], labels)
    return model


def test_paired_gate_refuses_a_challenger_trained_on_shuffled_labels_even_as_first_champion():
    from gem_app.promotion import Holdout, compare_paired

    x, y, _ = _paired_holdout(seed=1)
    hx, hy, users = _paired_holdout(seed=2)
    no_teacher = _fit_predict(x, y, [0]).predict_proba(hx[:, [0]])[:, 1]
    shuffled = _fit_predict(x, y, [0, 1], shuffle=True).predict_proba(hx[:, [0, 1]])[:, 1]
    good = _fit_predict(x, y, [0, 1]).predict_proba(hx[:, [0, 1]])[:, 1]
    cfg = GateConfig(bootstrap=300)
    refused, verdicts = compare_paired({"feed": Holdout(hy, users, shuffled, no_teacher)}, cfg, has_champion=False)
    assert not refused and "vs no_teacher: lose" in verdicts[0].reason
    # the old rule (no champion: auc >= min_auc) would have let a weak model through
    assert compare({"feed": {"auc": 0.56, "ne": 1.5}}, None, GateConfig())[0]
    assert compare_paired({"feed": Holdout(hy, users, good, no_teacher)}, cfg, has_champion=False)[0]
    missing, why = compare_paired({"feed": Holdout(hy, users, good, None)}, cfg, has_champion=False)
    assert not missing and "no predictions" in why[0].reason


def test_paired_gate_refuses_a_tie_with_the_champion_and_promotes_a_real_win(registry):
    from gem_app.promotion import Holdout, apply_decision, decide_paired

    x, y, _ = _paired_holdout(seed=1)
    hx, hy, users = _paired_holdout(seed=2)
    no_teacher = _fit_predict(x, y, [1]).predict_proba(hx[:, [1]])[:, 1]
    champion = _fit_predict(x, y, [0]).predict_proba(hx[:, [0]])[:, 1]
    better = _fit_predict(x, y, [0, 1]).predict_proba(hx[:, [0, 1]])[:, 1]
    name, cfg = "student_paired", GateConfig(bootstrap=300)
    v1 = _register(name, x, y, flip=False, features=[0])
    first = apply_decision(decide_paired(name, v1, {"feed": Holdout(hy, users, champion, no_teacher)}, cfg))
    assert first.promote and first.champion_version is None
    v2 = _register(name, x, y, flip=False, features=[0])
    tie = decide_paired(name, v2, {"feed": Holdout(hy, users, champion.copy(), no_teacher, champion)}, cfg)
    assert not tie.promote and "vs champion: lose" in tie.surfaces[0].reason
    assert tie.surfaces[0].challenger["vs_champion_auc_lift"] == 0.0
    assert not apply_decision(tie).promote
    v3 = _register(name, x, y, flip=False, features=[0, 1])
    win = apply_decision(decide_paired(name, v3, {"feed": Holdout(hy, users, better, no_teacher, champion)}, cfg))
    assert win.promote and win.champion_version == v1
    assert str(registry.get_model_version_by_alias(name, CHAMPION).version) == v3
