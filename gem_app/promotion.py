"""Promotion gate: challenger vs champion on the same holdout, per surface.

The champion of a registered model is the version holding the ``champion`` alias.

Students (``decide_paired``): the gate reads every model's predictions on the same
holdout rows. Per surface the challenger must beat each reference by a paired-bootstrap
margin (users resampled, students/stats.py): the lower end of the 95% interval of its
click-AUC lift must be above ``min_auc_gain`` (so a tie never passes), and the NE lift's
interval must reach ``-max_ne_increase`` (NE not significantly worse). The references are
the no-teacher student trained on the same rows (always, the first champion included)
and the champion (when there is one).

Metric-only comparison (``compare``, the teacher's gate): the AUC gain must be strictly
above ``min_auc_gain`` and the NE increase at most ``max_ne_increase``; with no champion
the challenger must clear ``min_auc``. Ties do not pass.

A model is promoted only if it wins every surface it is evaluated on
(``require_all_surfaces``) or at least one (otherwise).

The decision and every figure are recorded either way: as tags on the challenger's
model version here, and as metrics and ``gate_decision.json`` on the gate's MLflow run
(gem_app/stages/gate.py).
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Iterator

import numpy as np

from gem.registry import CHALLENGER, CHAMPION, champion_version


@dataclass(kw_only=True)
class GateConfig:
    min_auc_gain: float = 0.0
    max_ne_increase: float = 0.0
    min_auc: float = 0.55
    require_all_surfaces: bool = True
    bootstrap: int = 500  # paired bootstrap replicates (users resampled)
    level: float = 0.95
    seed: int = 0


@dataclass
class Holdout:
    """One surface's holdout rows and every model's click probability on them (same
    row order): the paired gate's evidence."""
    labels: np.ndarray
    users: np.ndarray
    challenger: np.ndarray
    no_teacher: np.ndarray | None = None
    champion: np.ndarray | None = None


@dataclass
class SurfaceVerdict:
    surface: str
    challenger: dict[str, float]
    champion: dict[str, float] | None
    wins: bool
    reason: str


@dataclass
class GateDecision:
    model_name: str
    challenger_version: str
    champion_version: str | None
    promote: bool
    surfaces: list[SurfaceVerdict] = field(default_factory=list)
    stale: str = ""  # why a win was not applied (the champion moved after the gate)

    def to_dict(self) -> dict:
        return asdict(self)

    def summary(self) -> str:
        head = (f"{self.model_name} v{self.challenger_version} vs "
                f"{'v' + self.champion_version if self.champion_version else 'no champion'}: "
                f"{'PROMOTE' if self.promote else 'keep champion'}")
        lines = [f"  {v.surface:<10} {'win ' if v.wins else 'lose'} {v.reason}" for v in self.surfaces]
        return "\n".join([head, *lines])


def compare(challenger: dict[str, dict[str, float]], champion: dict[str, dict[str, float]] | None,
            cfg: GateConfig) -> tuple[bool, list[SurfaceVerdict]]:
    """Per-surface verdicts from metrics dicts ``{surface: {"auc": .., "ne": ..}}``."""
    if not challenger:
        raise ValueError("challenger has no evaluated surface; nothing to gate")
    verdicts = []
    for surface, metrics in sorted(challenger.items()):
        reference = (champion or {}).get(surface)
        if reference is None:
            wins = metrics["auc"] >= cfg.min_auc
            reason = f"auc {metrics['auc']:.4f} {'>=' if wins else '<'} min_auc {cfg.min_auc} (no champion figure)"
        else:
            auc_gain = metrics["auc"] - reference["auc"]
            ne_increase = metrics["ne"] - reference["ne"]
            wins = auc_gain > cfg.min_auc_gain and ne_increase <= cfg.max_ne_increase
            reason = (f"auc {metrics['auc']:.4f} vs {reference['auc']:.4f} "
                      f"(gain {auc_gain:+.4f}, need > {cfg.min_auc_gain}); "
                      f"ne {metrics['ne']:.4f} vs {reference['ne']:.4f} "
                      f"(increase {ne_increase:+.4f}, allow <= {cfg.max_ne_increase})")
        verdicts.append(SurfaceVerdict(surface, metrics, reference, wins, reason))
    wins = [v.wins for v in verdicts]
    promote = all(wins) if cfg.require_all_surfaces else any(wins)
    return promote, verdicts


def _paired(h: Holdout, reference: np.ndarray, cfg: GateConfig, weights: np.ndarray) -> tuple[bool, dict, str]:
    from students.stats import paired_difference, weighted_auc, weighted_ne

    rows = np.arange(len(h.labels))
    run = [(rows, h.labels, h.challenger, reference)]
    auc = paired_difference(run, weights, "auc", cfg.level)
    ne = paired_difference(run, weights, "ne", cfg.level)
    ones = np.ones(len(h.labels))
    ref = {"auc": float(weighted_auc(h.labels, reference, ones)[0]),
           "ne": float(weighted_ne(h.labels, reference, ones)[0])}
    ok_auc = auc["lo"] > cfg.min_auc_gain  # NaN (no positives) compares False: no pass
    ok_ne = ne["hi"] >= -cfg.max_ne_increase
    figures = {"auc": ref["auc"], "ne": ref["ne"], "auc_lift": auc["mean"], "auc_lift_lo": auc["lo"],
               "auc_lift_hi": auc["hi"], "ne_lift": ne["mean"], "ne_lift_lo": ne["lo"], "ne_lift_hi": ne["hi"]}
    reason = (f"auc lift {auc['mean']:+.4f} [{auc['lo']:+.4f}, {auc['hi']:+.4f}] "
              f"(need lower end > {cfg.min_auc_gain}); "
              f"ne lift {ne['mean']:+.4f} [{ne['lo']:+.4f}, {ne['hi']:+.4f}] (need upper end >= "
              f"{-cfg.max_ne_increase})")
    return bool(ok_auc and ok_ne), figures, reason


def compare_paired(holdouts: dict[str, Holdout], cfg: GateConfig, *, has_champion: bool
                   ) -> tuple[bool, list[SurfaceVerdict]]:
    """Per-surface verdicts from per-row predictions: the challenger must beat the
    no-teacher student and (``has_champion``) the champion by a paired-bootstrap margin."""
    from students.stats import user_weights, weighted_auc, weighted_ne

    if not holdouts:
        raise ValueError("challenger has no evaluated surface; nothing to gate")
    verdicts = []
    for surface, h in sorted(holdouts.items()):
        ones = np.ones(len(h.labels))
        mine = {"auc": float(weighted_auc(h.labels, h.challenger, ones)[0]),
                "ne": float(weighted_ne(h.labels, h.challenger, ones)[0])}
        weights = user_weights(h.users, cfg.bootstrap, cfg.seed)
        references = {"no_teacher": h.no_teacher}
        if has_champion:
            references["champion"] = h.champion
        wins, reasons, champion_figures = True, [], None
        for who, preds in references.items():
            if preds is None:
                wins = False
                reasons.append(f"{who}: no predictions on the holdout; cannot gate")
                continue
            ok, figures, reason = _paired(h, preds, cfg, weights)
            mine.update({f"vs_{who}_{k}": v for k, v in figures.items() if "lift" in k})
            if who == "champion":
                champion_figures = {k: figures[k] for k in ("auc", "ne")}
            else:
                mine.update({"no_teacher_auc": figures["auc"], "no_teacher_ne": figures["ne"]})
            wins = wins and ok
            reasons.append(f"vs {who}: {'win' if ok else 'lose'}: {reason}")
        verdicts.append(SurfaceVerdict(surface, mine, champion_figures, wins, "; ".join(reasons)))
    wins = [v.wins for v in verdicts]
    promote = all(wins) if cfg.require_all_surfaces else any(wins)
    return promote, verdicts


def decide_paired(model_name: str, challenger_version: str, holdouts: dict[str, Holdout],
                  cfg: GateConfig) -> GateDecision:
    """The paired gate, without side effects (the champion's predictions are used only
    when the model has a champion)."""
    current = champion_version(model_name)
    promote, verdicts = compare_paired(holdouts, cfg, has_champion=bool(current))
    return GateDecision(model_name, str(challenger_version), current, promote, verdicts)


def decide(model_name: str, challenger_version: str, challenger_metrics: dict[str, dict[str, float]],
           champion_metrics: dict[str, dict[str, float]] | None, cfg: GateConfig) -> GateDecision:
    """Compare without side effects (champion figures are ignored when no champion exists)."""
    current = champion_version(model_name)
    promote, verdicts = compare(challenger_metrics, champion_metrics if current else None, cfg)
    return GateDecision(model_name, str(challenger_version), current, promote, verdicts)


@contextlib.contextmanager
def _registry_lock(name: str) -> Iterator[None]:
    """Serialise promotions of one model: a file lock beside a sqlite store (every local
    process shares it); a server store has no shared folder, so there the re-read just
    before the alias moves is the only guard."""
    import mlflow

    uri = mlflow.get_tracking_uri()
    if not uri.startswith("sqlite:///"):
        yield
        return
    from filelock import FileLock

    with FileLock(Path(uri[len("sqlite:///"):]).parent / f".promote-{name}.lock", timeout=600):
        yield


def apply_decision(decision: GateDecision) -> GateDecision:
    """Record the decision on the model version and move the ``champion`` alias only when
    the challenger won; a loser gets ``challenger``.

    Compare-and-set: under the model's lock the champion is read again, and a win against
    a champion that has moved since the gate (another run promoted meanwhile) is not
    applied: that challenger was never compared with the new champion."""
    from mlflow import MlflowClient

    client = MlflowClient()
    name, version = decision.model_name, decision.challenger_version
    with _registry_lock(name):
        current = champion_version(name)
        if decision.promote and current == version:
            pass  # this decision was applied before (a rerun after a kill): applying it again changes nothing
        elif decision.promote and current != decision.champion_version:
            decision = replace(decision, promote=False, stale=(
                f"champion moved from {decision.champion_version or 'none'} to v{current} after the gate; "
                "not promoted (gate again against the new champion)"))
        client.set_model_version_tag(name, version, "gate.decision", "promoted" if decision.promote else "rejected")
        client.set_model_version_tag(name, version, "gate.against", decision.champion_version or "none")
        if decision.stale:
            client.set_model_version_tag(name, version, "gate.stale", decision.stale)
        for verdict in decision.surfaces:
            client.set_model_version_tag(name, version, f"gate.{verdict.surface}", verdict.reason[:5000])
        client.set_registered_model_alias(name, CHAMPION if decision.promote else CHALLENGER, version)
    return decision


def gate_and_promote(model_name: str, challenger_version: str, challenger_metrics: dict[str, dict[str, float]],
                     champion_metrics: dict[str, dict[str, float]] | None, cfg: GateConfig) -> GateDecision:
    return apply_decision(decide(model_name, challenger_version, challenger_metrics, champion_metrics, cfg))


def decision_from_dict(raw: dict) -> GateDecision:
    """Inverse of ``to_dict`` (also after kfp turned None into "")."""
    surfaces = [SurfaceVerdict(v["surface"], v["challenger"], v.get("champion") or None, v["wins"], v["reason"])
                for v in raw.get("surfaces", [])]
    return GateDecision(raw["model_name"], str(raw["challenger_version"]), raw.get("champion_version") or None,
                        bool(raw["promote"]), surfaces, raw.get("stale") or "")


def decision_json(decision: GateDecision) -> str:
    return json.dumps(decision.to_dict(), indent=2, sort_keys=True)
