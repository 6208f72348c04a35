"""Promotion gate: one decision per model under test, in one vocabulary, and promotion
as one transaction per run.

Decisions (``outcome``): ``promote``, ``keep`` (the champion, or no champion, stays
as it is) or ``not enough evidence`` (the holdout has too few positives or negatives
to decide; the reason says how many it needs). Each comes with a one-line ``reason``.

Floors, for teacher and students alike (``GateConfig``): no model is promoted whose
holdout predictions are not finite probabilities, whose holdout NE is >= ``max_ne``
(1: no better than predicting the base rate), or whose calibration (mean prediction /
base rate) is outside [``min_calibration``, ``max_calibration``]; a student is
promoted only from a teacher that is the champion, or that this run promotes
(``require_champion_teacher``).

Comparisons, on top of the floors:

- students (``decide_paired``): every model's predictions on the same holdout rows;
  the challenger must beat each reference by a paired-bootstrap margin (users
  resampled, students/stats.py): the lower end of the 95% interval of its click-AUC
  lift above ``min_auc_gain`` (a tie never passes) and the NE lift's interval reaching
  ``-max_ne_increase``. References: the no-teacher student trained on the same rows
  (always) and the champion (when there is one);
- the teacher (``decide``): AUC gain over the champion strictly above ``min_auc_gain``
  and NE increase at most ``max_ne_increase``; with no champion, AUC >= ``min_auc``.

A model evaluated on several surfaces is promoted only if it wins every one
(``require_all_surfaces``) or at least one (otherwise).

Gating has no side effect on the registry. ``commit`` applies every decision of one
run at once, after every step the run depends on has succeeded: under a lock it
re-reads the champions (a win against a champion that moved since the gate is not
applied), re-checks each student's teacher against the champions the commit leaves,
writes a journal of the aliases (and the versions' decision tags) as they were, moves
the aliases, records the words on each model version, checks the registry's invariants
(``registry_problems``: one champion per model, a challenger never the champion and
newer than it, the recorded decisions matching the aliases; a violation the commit made
is undone and raised), and removes the journal. A commit killed half-way leaves its
journal; the next commit (or the next pipeline run's start) restores the aliases and
tags it recorded (``recover``), so a failed or killed run leaves the registry as it was.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Iterator

import numpy as np

from gem.registry import CHALLENGER, CHAMPION, champion_version
from gem.utils.evidence import auc_text, enough_for_auc

log = logging.getLogger(__name__)

PROMOTE, KEEP, NOT_ENOUGH_EVIDENCE = "promote", "keep", "not enough evidence"
OUTCOMES = (PROMOTE, KEEP, NOT_ENOUGH_EVIDENCE)
# the model-version tags a commit writes (and a recovered commit removes)
DECISION_TAG, REASON_TAG, AGAINST_TAG, GATE_RUN_TAG, COMMIT_RUN_TAG = (
    "gate.decision", "gate.reason", "gate.against", "gate.run_id", "gate.pipeline_run_id")
VERSION_TAGS = (DECISION_TAG, REASON_TAG, AGAINST_TAG, GATE_RUN_TAG, COMMIT_RUN_TAG)
JOURNAL = "promotion-journal.json"


@dataclass(kw_only=True)
class GateConfig:
    min_auc_gain: float = 0.0  # a challenger's AUC lift must be above this (a tie never passes)
    max_ne_increase: float = 0.0  # its NE may be at most this much worse
    min_auc: float = 0.55  # the teacher's AUC when there is no champion to beat
    max_ne: float = 1.0  # holdout NE must be below this: 1 = no better than the base rate
    min_calibration: float = 0.5  # mean prediction / base rate must lie in this band
    max_calibration: float = 1.5
    min_positives: int = 30  # fewer positives (or negatives) on the holdout: not enough evidence
    min_negatives: int = 30
    require_champion_teacher: bool = True  # a student only from the champion teacher (or this run's)
    require_all_surfaces: bool = True
    bootstrap: int = 500  # paired bootstrap replicates (users resampled)
    level: float = 0.95
    seed: int = 0

    def validate(self) -> "GateConfig":
        for name in ("min_auc_gain", "max_ne_increase", "min_auc", "max_ne", "min_calibration", "max_calibration",
                     "level"):
            if not math.isfinite(float(getattr(self, name))):
                raise ValueError(f"gate setting {name}={getattr(self, name)!r} must be a finite number")
        if not 0 <= self.min_auc <= 1:
            raise ValueError(f"gate setting min_auc={self.min_auc} must lie in [0, 1]")
        if self.max_ne <= 0:
            raise ValueError(f"gate setting max_ne={self.max_ne} must be > 0 (1 = the base rate's NE)")
        if not 0 <= self.min_calibration <= 1 <= self.max_calibration:
            raise ValueError(f"gate settings min_calibration={self.min_calibration} and max_calibration="
                             f"{self.max_calibration} must bracket 1 (a calibrated model), min >= 0")
        for name in ("min_positives", "min_negatives", "bootstrap"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"gate setting {name}={getattr(self, name)} must be >= 1")
        if not 0 < self.level < 1:
            raise ValueError(f"gate setting level={self.level} must lie in (0, 1)")
        return self

    def params(self) -> dict[str, str]:
        """The settings as MLflow params (``gate.<name>``)."""
        return {f"gate.{f.name}": str(getattr(self, f.name)) for f in fields(self)}

    @classmethod
    def from_dict(cls, raw: dict | None) -> "GateConfig":
        """From pipeline parameters (kfp turns ints into floats); unknown keys refused."""
        raw = dict(raw or {})
        known = {f.name: f for f in fields(cls)}
        unknown = sorted(set(raw) - set(known))
        if unknown:
            raise ValueError(f"unknown gate settings {unknown}; known: {sorted(known)}")
        cast = {"int": lambda v: int(float(v)), "float": float,
                "bool": lambda v: v if isinstance(v, bool) else str(v).lower() in ("1", "true", "yes")}
        return cls(**{k: cast[str(known[k].type)](v) for k, v in raw.items()}).validate()


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
    outcome: str = KEEP


@dataclass
class GateDecision:
    model_name: str
    challenger_version: str
    champion_version: str | None
    outcome: str
    reason: str
    surfaces: list[SurfaceVerdict] = field(default_factory=list)
    teacher_version: str = ""  # a student's teacher (models:/<name>/<version>)
    gate_run_id: str = ""
    stale: str = ""  # why the commit did not apply a win (the champion moved after the gate)
    config: dict = field(default_factory=dict)
    # False: a kept model no better than a constant (NE >= max_ne) is not offered as the
    # challenger either (issue 43: a vertical is calibrated or not offered)
    offered: bool = True

    @property
    def promote(self) -> bool:
        return self.outcome == PROMOTE

    def to_dict(self) -> dict:
        return {**asdict(self), "promote": self.promote}

    def summary(self) -> str:
        against = f"v{self.champion_version}" if self.champion_version else "no champion"
        return f"{self.model_name} v{self.challenger_version} vs {against}: {self.outcome}: {self.reason}"


# -- holdout figures and the floors --------------------------------------------------------
def holdout_figures(labels: np.ndarray, probs: np.ndarray) -> dict[str, float]:
    """Click AUC, NE, calibration and the evidence (examples, positives, negatives,
    predictions that are not finite probabilities) of one model on holdout rows; the AUC
    NaN where gem.utils.evidence finds its positives or negatives too few."""
    from students.stats import weighted_auc, weighted_ne

    y = np.asarray(labels, dtype=np.float64) > 0.5
    p = np.asarray(probs, dtype=np.float64)
    valid = np.isfinite(p) & (p >= 0) & (p <= 1)
    figures = {"examples": float(len(y)), "positives": float(y.sum()), "negatives": float((~y).sum()),
               "invalid": float((~valid).sum())}
    nan = float("nan")
    if not len(y) or not valid.all():
        return {**figures, "auc": nan, "ne": nan, "calibration": nan}
    ones = np.ones(len(y))
    # no AUC on a handful of positives or negatives (gem.utils.evidence): it reads "n/a"
    auc = float(weighted_auc(y, p, ones)[0]) if enough_for_auc(y.sum(), (~y).sum()) else nan
    return {**figures, "auc": auc, "ne": float(weighted_ne(y, p, ones)[0]),
            "calibration": float(p.mean() / y.mean()) if y.any() else nan}


def evidence_shortfall(figures: dict[str, float], cfg: GateConfig) -> str:
    """'' when the holdout has enough positives and negatives to decide, else why not."""
    if "positives" not in figures or "negatives" not in figures:
        return "the holdout's positives and negatives are unknown"
    pos, neg = int(figures["positives"]), int(figures["negatives"])
    if pos >= cfg.min_positives and neg >= cfg.min_negatives:
        return ""
    needs = (f"{cfg.min_positives} of each" if cfg.min_positives == cfg.min_negatives
             else f"{cfg.min_positives} positives and {cfg.min_negatives} negatives")
    has = f"{pos} positive{'s' * (pos != 1)} and {neg} negative{'s' * (neg != 1)}"
    return f"the holdout has {has}; needs at least {needs}"


def floor_failures(figures: dict[str, float], cfg: GateConfig) -> list[str]:
    """What keeps a model from promotion whatever it is compared with."""
    fails = []
    if figures.get("invalid", 0):
        fails.append(f"{int(figures['invalid'])} of {int(figures.get('examples', 0))} predictions are not finite "
                     "probabilities in [0, 1]")
        return fails
    ne, calibration = figures.get("ne", float("nan")), figures.get("calibration", float("nan"))
    if not ne < cfg.max_ne:  # NaN fails too
        fails.append(f"NE {ne:.4f} >= {cfg.max_ne:g} (a constant base rate does as well)")
    if not cfg.min_calibration <= calibration <= cfg.max_calibration:
        fails.append(f"calibration {calibration:.2f} outside [{cfg.min_calibration:g}, {cfg.max_calibration:g}]")
    return fails


def _verdict(surface: str, figures: dict, champion: dict | None, fails: list[str], wins_text: str,
             cfg: GateConfig) -> SurfaceVerdict:
    short = evidence_shortfall(figures, cfg)
    if short:
        return SurfaceVerdict(surface, figures, champion, False, "; ".join([short, *fails]), NOT_ENOUGH_EVIDENCE)
    if fails:
        return SurfaceVerdict(surface, figures, champion, False, "; ".join(fails), KEEP)
    return SurfaceVerdict(surface, figures, champion, True, wins_text, PROMOTE)


def _model_outcome(verdicts: list[SurfaceVerdict], model_fails: list[str], cfg: GateConfig) -> tuple[str, str]:
    """One outcome and one line for the model from its surfaces' verdicts and the
    model-level checks (its teacher)."""
    wins = [v.wins for v in verdicts]
    won = all(wins) if cfg.require_all_surfaces else any(wins)
    multi = len(verdicts) > 1
    reasons = [f"{v.surface}: {v.reason}" if multi else v.reason for v in verdicts
               if not won or v.wins]
    if won and not model_fails:
        return PROMOTE, "; ".join(reasons)
    losing = [v for v in verdicts if not v.wins]
    evidence_only = not won and all(v.outcome == NOT_ENOUGH_EVIDENCE for v in losing)
    outcome = NOT_ENOUGH_EVIDENCE if evidence_only else KEEP
    failed = [f"{v.surface}: {v.reason}" if multi else v.reason for v in losing]
    return outcome, "; ".join([*failed, *model_fails])


# -- the teacher: metrics against the champion's --------------------------------------------
def compare(challenger: dict[str, dict[str, float]], champion: dict[str, dict[str, float]] | None,
            cfg: GateConfig) -> tuple[bool, list[SurfaceVerdict]]:
    """Per-surface verdicts from figures ``{surface: {"auc", "ne", "calibration",
    "positives", "negatives", ...}}`` (``holdout_figures``): the floors, then the AUC
    gain and NE increase over the champion's figures, or ``min_auc`` without them."""
    if not challenger:
        raise ValueError("challenger has no evaluated surface; nothing to gate")
    verdicts = []
    for surface, metrics in sorted(challenger.items()):
        reference = (champion or {}).get(surface)
        fails = floor_failures(metrics, cfg)
        auc = metrics.get("auc", float("nan"))
        if reference is None:
            # min_auc 0 is no AUC floor: then an AUC left out for short evidence (gem.utils.evidence) is not needed
            if cfg.min_auc > 0 and not auc >= cfg.min_auc:
                fails.append(f"AUC {auc_text(auc)} < min_auc {cfg.min_auc:g} (no champion to compare with)")
            ne = metrics.get("ne", float("nan"))
            text = f"AUC {auc_text(auc)} >= min_auc {cfg.min_auc:g}, NE {ne:.4f}; no champion"
        else:
            auc_gain = auc - reference["auc"]
            ne_increase = metrics.get("ne", float("nan")) - reference["ne"]
            if not auc_gain > cfg.min_auc_gain:
                fails.append(f"AUC {auc:.4f} vs champion {reference['auc']:.4f} (gain {auc_gain:+.4f}, "
                             f"needs > {cfg.min_auc_gain:g})")
            if not ne_increase <= cfg.max_ne_increase:
                fails.append(f"NE {metrics['ne']:.4f} vs champion {reference['ne']:.4f} (increase "
                             f"{ne_increase:+.4f}, allows <= {cfg.max_ne_increase:g})")
            text = (f"AUC {auc:.4f} vs champion {reference['auc']:.4f} (gain {auc_gain:+.4f}); "
                    f"NE {metrics['ne']:.4f} vs {reference['ne']:.4f}")
        verdicts.append(_verdict(surface, metrics, reference, fails, text, cfg))
    wins = [v.wins for v in verdicts]
    return (all(wins) if cfg.require_all_surfaces else any(wins)), verdicts


def decide(model_name: str, challenger_version: str, challenger_metrics: dict[str, dict[str, float]],
           champion_metrics: dict[str, dict[str, float]] | None, cfg: GateConfig) -> GateDecision:
    """The teacher's gate, without side effects (champion figures are ignored when no
    champion exists)."""
    current = champion_version(model_name)
    against = current if current != str(challenger_version) else None
    _, verdicts = compare(challenger_metrics, champion_metrics if against else None, cfg)
    outcome, reason = _model_outcome(verdicts, [], cfg)
    if current == str(challenger_version):
        outcome, reason = PROMOTE, f"already the champion (kept as it is); {reason}"
    return _offer(GateDecision(model_name, str(challenger_version), current, outcome, reason, verdicts,
                               config=asdict(cfg)), cfg)


# -- students: paired on the same rows ------------------------------------------------------
def _paired(h: Holdout, reference: np.ndarray, cfg: GateConfig, weights: np.ndarray) -> tuple[bool, dict, str]:
    from students.stats import paired_difference

    rows = np.arange(len(h.labels))
    run = [(rows, h.labels, h.challenger, reference)]
    auc = paired_difference(run, weights, "auc", cfg.level)
    ne = paired_difference(run, weights, "ne", cfg.level)
    ref = holdout_figures(h.labels, reference)
    ok_auc = auc["lo"] > cfg.min_auc_gain  # NaN (no positives) compares False: no pass
    ok_ne = ne["hi"] >= -cfg.max_ne_increase
    figures = {"auc": ref["auc"], "ne": ref["ne"], "auc_lift": auc["mean"], "auc_lift_lo": auc["lo"],
               "auc_lift_hi": auc["hi"], "ne_lift": ne["mean"], "ne_lift_lo": ne["lo"], "ne_lift_hi": ne["hi"]}
    words = [f"AUC lift {auc['mean']:+.4f} [{auc['lo']:+.4f}, {auc['hi']:+.4f}]"
             + ("" if ok_auc else f", lower end not > {cfg.min_auc_gain:g}")]
    if not ok_ne:
        words.append(f"NE lift {ne['mean']:+.4f} [{ne['lo']:+.4f}, {ne['hi']:+.4f}], upper end not >= "
                     f"{-cfg.max_ne_increase + 0.0:g}")  # + 0.0: no "-0"
    return bool(ok_auc and ok_ne), figures, "; ".join(words)


def compare_paired(holdouts: dict[str, Holdout], cfg: GateConfig, *, has_champion: bool
                   ) -> tuple[bool, list[SurfaceVerdict]]:
    """Per-surface verdicts from per-row predictions: the floors, then the challenger
    must beat the no-teacher student and (``has_champion``) the champion by a
    paired-bootstrap margin."""
    from students.stats import user_weights

    if not holdouts:
        raise ValueError("challenger has no evaluated surface; nothing to gate")
    verdicts = []
    for surface, h in sorted(holdouts.items()):
        mine = holdout_figures(h.labels, h.challenger)
        fails = floor_failures(mine, cfg)
        weights = user_weights(h.users, cfg.bootstrap, cfg.seed)
        references = {"no_teacher": h.no_teacher}
        if has_champion:
            references["champion"] = h.champion
        passed, champion_figures = [], None
        for who, preds in references.items():
            if preds is None:
                fails.append(f"vs {who}: no predictions on the holdout to compare with")
                continue
            ok, figures, words = _paired(h, preds, cfg, weights)
            mine.update({f"vs_{who}_{k}": v for k, v in figures.items() if "lift" in k})
            if who == "champion":
                champion_figures = {k: figures[k] for k in ("auc", "ne")}
            else:
                mine.update({"no_teacher_auc": figures["auc"], "no_teacher_ne": figures["ne"]})
            (passed if ok else fails).append(f"{'beats' if ok else 'vs'} {who}: {words}")
        text = f"NE {mine['ne']:.4f}, calibration {mine['calibration']:.2f}; " + "; ".join(passed)
        verdicts.append(_verdict(surface, mine, champion_figures, fails, text, cfg))
    wins = [v.wins for v in verdicts]
    return (all(wins) if cfg.require_all_surfaces else any(wins)), verdicts


def teacher_failure(teacher_version: str, staged_teacher: "GateDecision | None" = None) -> str:
    """'' when a student's teacher (``models:/<name>/<version>``) is the champion, or is
    promoted by ``staged_teacher`` (this run's teacher decision); else why not."""
    rest = teacher_version[len("models:/"):] if teacher_version.startswith("models:/") else ""
    name, _, version = rest.partition("/")
    if not name or not version.isdigit():
        return f"teacher {teacher_version or '(none)'} is no registered version (only a champion's students pass)"
    if staged_teacher is not None and staged_teacher.model_name == name \
            and staged_teacher.challenger_version == version:
        if staged_teacher.promote:
            return ""
        return f"teacher {name} v{version} not promoted (its gate: {staged_teacher.outcome})"
    current = champion_version(name)
    if current == version:
        return ""
    return f"teacher {name} v{version} is not the champion ({'v' + current if current else 'none'} is)"


def decide_paired(model_name: str, challenger_version: str, holdouts: dict[str, Holdout], cfg: GateConfig, *,
                  teacher_version: str = "", staged_teacher: GateDecision | None = None,
                  champion_unavailable: str = "") -> GateDecision:
    """The students' gate, without side effects (the champion's predictions are used
    only when the model has a champion). ``champion_unavailable``: why the champion could
    not be scored on this holdout (it reads an earlier teacher's embeddings, which no
    store holds any more: it could not be served from this run's knowledge either); it
    is then not compared, and the reason says so."""
    current = champion_version(model_name)
    already = current == str(challenger_version)
    compared = bool(current) and not already and not champion_unavailable
    _, verdicts = compare_paired(holdouts, cfg, has_champion=compared)
    model_fails = []
    if cfg.require_champion_teacher and (why := teacher_failure(teacher_version, staged_teacher)):
        model_fails.append(why)
    outcome, reason = _model_outcome(verdicts, model_fails, cfg)
    if current and not already and champion_unavailable:
        reason = f"{reason}; champion v{current} not compared: {champion_unavailable}"
    if already:
        outcome, reason = PROMOTE, f"already the champion (kept as it is); {reason}"
    return _offer(GateDecision(model_name, str(challenger_version), current, outcome, reason, verdicts,
                               teacher_version=teacher_version, config=asdict(cfg)), cfg)


NOT_OFFERED = "not offered as challenger"


def shown_outcome(outcome: str, offered: bool = True) -> str:
    """An outcome as the step lines and the summary show it: ``keep (not offered)`` for a
    kept model that gets no challenger alias."""
    return outcome if offered else f"{outcome} (not offered)"


def _offer(d: GateDecision, cfg: GateConfig) -> GateDecision:
    """A model that is not promoted and whose holdout NE on some surface is not below
    ``max_ne`` (no better than a constant base rate, or not measurable) gets no
    challenger alias; its reason says so."""
    worse = [v.surface for v in d.surfaces if not v.challenger.get("ne", float("nan")) < cfg.max_ne]
    if d.promote or not worse:
        return d
    return replace(d, offered=False, reason=f"{d.reason}; {NOT_OFFERED} (NE not below {cfg.max_ne:g} on "
                                            f"{', '.join(worse)})")


# -- the commit -------------------------------------------------------------------------------
def default_journal_dir() -> Path | None:
    """Beside a sqlite store (every local process shares it); a server store has none:
    the pipeline passes its tracking root."""
    import mlflow

    uri = mlflow.get_tracking_uri()
    return Path(uri[len("sqlite:///"):]).parent / ".runs" if uri.startswith("sqlite:///") else None


@contextlib.contextmanager
def _commit_lock(journal_dir: Path | None) -> Iterator[None]:
    if journal_dir is None:
        yield
        return
    from filelock import FileLock

    journal_dir.mkdir(parents=True, exist_ok=True)
    with FileLock(journal_dir / ".promotion.lock", timeout=600):
        yield


def _aliases(client, name: str) -> dict[str, str]:
    from mlflow.exceptions import MlflowException

    try:
        return {k: str(v) for k, v in client.get_registered_model(name).aliases.items()}
    except MlflowException:
        return {}


def recover(journal_dir: Path | None) -> dict | None:
    """Undo a commit that died half-way: restore the aliases its journal recorded and
    the version tags as they were (a version that already held a decision, e.g. the
    champion a rerun gated again, keeps it). Returns the journal, or None."""
    from mlflow import MlflowClient
    from mlflow.exceptions import MlflowException

    path = journal_dir / JOURNAL if journal_dir else None
    if path is None or not path.is_file():
        return None
    journal = json.loads(path.read_text())
    client = MlflowClient()
    for name, aliases in journal["before"].items():
        for alias in (CHAMPION, CHALLENGER):
            version = aliases.get(alias)
            try:
                if version:
                    client.set_registered_model_alias(name, alias, version)
                elif alias in _aliases(client, name):
                    client.delete_registered_model_alias(name, alias)
            except MlflowException as exc:
                log.warning("recovering %s@%s: %s", name, alias, exc)
    before_tags = journal.get("tags", {})
    for name, version in journal.get("versions", []):
        kept = before_tags.get(name, {}).get(str(version), {})  # a journal without them: none were there
        for key in VERSION_TAGS:
            with contextlib.suppress(MlflowException):
                if key in kept:
                    client.set_model_version_tag(name, version, key, kept[key])
                else:
                    client.delete_model_version_tag(name, version, key)
    path.unlink()
    log.warning("promotion: a commit of pipeline run %s died half-way; the aliases it had moved were restored",
                journal.get("pipeline_run_id", "?"))
    return journal


def _resolve(decisions: list[GateDecision]) -> list[GateDecision]:
    """The decisions as they apply now: a win against a champion that has moved since
    the gate is not applied; a student's promotion needs its teacher to be champion
    once this commit is done."""
    resolved = []
    for d in decisions:
        current = champion_version(d.model_name)
        if d.promote and current not in (d.champion_version, d.challenger_version):
            d = replace(d, outcome=KEEP, stale=(
                f"champion moved from {('v' + d.champion_version) if d.champion_version else 'none'} to v{current} "
                "after the gate; not promoted (gate again against the new champion)"))
            d = replace(d, reason=f"{d.stale}; gated: {d.reason}")
        resolved.append(d)
    after = {d.model_name: d.challenger_version for d in resolved if d.promote}
    final = []
    for d in resolved:
        if d.promote and d.teacher_version and d.config.get("require_champion_teacher", True):
            name, _, version = d.teacher_version[len("models:/"):].partition("/")
            champion = after.get(name) or champion_version(name)
            if champion != version:
                now = f"v{champion}" if champion else "none"
                why = f"teacher {name} v{version} is not the champion after this run ({now} is)"
                d = replace(d, outcome=KEEP, reason=f"{why}; gated: {d.reason}")
        final.append(d)
    return final


def commit(decisions: list[GateDecision], journal_dir: Path | None = None, *, pipeline_run_id: str = "",
           fault=None) -> list[GateDecision]:
    """Apply every decision of one run at once (see the module docstring); returns them
    as applied. ``fault``: the fault-injection hook, called with where the commit is:
    ``"mid"`` between two decisions' alias moves, ``"moved"`` once every alias moved (no
    decision written on the versions yet), ``"recorded"`` once the decisions are written
    and the invariants checked (the journal not yet removed).

    Aliases (docs/pipelines.md): a promoted version becomes the champion, and a challenger
    at or below it is removed (it was gated before the champion, or is the champion now);
    a version kept and offered becomes the challenger only when it is newer than the
    champion and than the current challenger (a rerun of an older decision moves none).
    Before the journal is removed the registry's invariants are checked for the models
    of the commit (``registry_problems``); a violation the commit made (not one it found
    there, which is logged) restores the aliases and tags as they were and raises
    RegistryInvariantError."""
    from mlflow import MlflowClient

    if journal_dir is None:
        journal_dir = default_journal_dir()
    client = MlflowClient()
    with _commit_lock(journal_dir):
        recover(journal_dir)
        final = _resolve(decisions)
        names = sorted({d.model_name for d in final})
        earlier = set(registry_problems(names))  # what an older commit (or a hand) left: not this commit's
        for problem in sorted(earlier):
            log.warning("registry before the commit: %s", problem)
        if journal_dir is not None:
            from gem.utils.atomic import write_json

            journal_dir.mkdir(parents=True, exist_ok=True)
            write_json({"pipeline_run_id": pipeline_run_id,
                        "before": {d.model_name: _aliases(client, d.model_name) for d in final},
                        "versions": [[d.model_name, d.challenger_version] for d in final],
                        "tags": _version_tags(client, final)}, journal_dir / JOURNAL)
        for i, d in enumerate(final):
            if i and fault is not None:
                fault("mid")
            _move(client, d)
        if fault is not None:
            fault("moved")
        for d in final:
            _record(client, d, pipeline_run_id)
        problems = [p for p in registry_problems(names, decisions=final) if p not in earlier]
        if problems:
            if journal_dir is not None:
                recover(journal_dir)
            raise RegistryInvariantError("the commit would leave the registry breaking its rules, so it was undone: "
                                         + "; ".join(problems))
        if fault is not None:
            fault("recorded")
        if journal_dir is not None:
            (journal_dir / JOURNAL).unlink()
    return final


class RegistryInvariantError(RuntimeError):
    """The registry's aliases break the documented rules (``registry_problems``)."""


def _number(version: str | None) -> int:
    return int(version) if version and str(version).isdigit() else -1


def _version_tags(client, decisions: list[GateDecision]) -> dict:
    """{model: {version: {tag: value}}}: the decision tags each version holds before a commit."""
    out: dict = {}
    for d in decisions:
        tags = client.get_model_version(d.model_name, d.challenger_version).tags
        out.setdefault(d.model_name, {})[str(d.challenger_version)] = {k: v for k, v in tags.items()
                                                                         if k in VERSION_TAGS}
    return out


def _move(client, d: GateDecision) -> None:
    """One decision's alias moves (see ``commit``)."""
    version = str(d.challenger_version)
    if d.promote:
        client.set_registered_model_alias(d.model_name, CHAMPION, version)
        challenger = _aliases(client, d.model_name).get(CHALLENGER)
        if challenger and _number(challenger) <= _number(version):
            client.delete_registered_model_alias(d.model_name, CHALLENGER)
        return
    aliases = _aliases(client, d.model_name)
    champion, challenger = aliases.get(CHAMPION), aliases.get(CHALLENGER)
    if d.offered and _number(version) > _number(champion) and _number(version) >= _number(challenger):
        client.set_registered_model_alias(d.model_name, CHALLENGER, version)
    elif challenger and champion and _number(challenger) <= _number(champion):
        client.delete_registered_model_alias(d.model_name, CHALLENGER)  # left by an older commit


def registry_problems(names: list[str] | None = None, journal_dir: Path | None = None,
                      decisions: list[GateDecision] | None = None) -> list[str]:
    """What breaks the registry's rules (docs/pipelines.md), one line each; [] when none.

    Per model (``names``, default every registered model): at most one champion (MLflow
    keeps one version per alias: the check is that it names a version that exists), a
    challenger that exists, is never the champion and is newer than it; the decision a
    commit wrote on each version matches its alias (the champion's ``gate.decision``, when
    written, is ``promote``; the challenger's is not). The aliases match the journal: with
    ``journal_dir``, no commit's journal is left (a commit died half-way and was not yet
    recovered); with ``decisions`` (a commit's, as applied), each promoted version is the
    champion and each kept, offered one is the challenger unless the champion or the
    challenger is a newer version."""
    from mlflow import MlflowClient
    from mlflow.exceptions import MlflowException

    client = MlflowClient()
    problems = []
    if journal_dir is not None and (Path(journal_dir) / JOURNAL).is_file():
        problems.append(f"a commit's journal is left in {journal_dir} (a commit died half-way; the next start "
                        "restores the aliases it recorded)")
    if names is None:
        names = sorted(m.name for m in client.search_registered_models())
    aliases = {}
    for name in names:
        aliases[name] = moved = {k: v for k, v in _aliases(client, name).items() if k in (CHAMPION, CHALLENGER)}
        champion, challenger = moved.get(CHAMPION), moved.get(CHALLENGER)
        for alias, version in moved.items():
            try:
                decision = client.get_model_version(name, version).tags.get(DECISION_TAG, "")
            except MlflowException:
                problems.append(f"{name}@{alias} names v{version}, which does not exist")
                continue
            if alias == CHAMPION and decision and decision != PROMOTE:
                problems.append(f"{name}: the champion v{version} was recorded '{decision}', not promoted")
            if alias == CHALLENGER and decision == PROMOTE:
                problems.append(f"{name}: the challenger v{version} was recorded 'promote'")
        if challenger and champion and challenger == champion:
            problems.append(f"{name}: v{champion} is both champion and challenger")
        elif challenger and champion and _number(challenger) < _number(champion):
            problems.append(f"{name}: the challenger v{challenger} is older than the champion v{champion}")
    for d in decisions or []:
        moved = aliases.get(d.model_name)
        if moved is None:
            moved = {k: v for k, v in _aliases(client, d.model_name).items() if k in (CHAMPION, CHALLENGER)}
        version = str(d.challenger_version)
        if d.promote and moved.get(CHAMPION) != version:
            problems.append(f"{d.model_name}: v{version} was promoted but the champion is "
                            f"{'v' + moved[CHAMPION] if moved.get(CHAMPION) else 'none'}")
        newer = max(_number(moved.get(CHAMPION)), _number(moved.get(CHALLENGER)))
        if not d.promote and d.offered and moved.get(CHALLENGER) != version and newer < _number(version):
            problems.append(f"{d.model_name}: v{version} was kept and offered but is not the challenger")
    return problems


def _record(client, d: GateDecision, pipeline_run_id: str) -> None:
    """The decision's words on its model version (and on its gate run when the commit
    changed them)."""
    tags = {DECISION_TAG: d.outcome, REASON_TAG: d.reason[:5000], AGAINST_TAG: d.champion_version or "none",
            GATE_RUN_TAG: d.gate_run_id, COMMIT_RUN_TAG: pipeline_run_id}
    # a version that stays the champion without this decision promoting it (a rerun whose
    # teacher is no longer the champion) keeps its promotion's words; the gate run has these
    stays_champion = not d.promote and champion_version(d.model_name) == str(d.challenger_version)
    for key, value in tags.items():
        if value and not stays_champion:
            client.set_model_version_tag(d.model_name, d.challenger_version, key, value)
    if d.gate_run_id:
        staged = client.get_run(d.gate_run_id).data.tags.get(DECISION_TAG, "")
        if staged != d.outcome:
            client.set_tag(d.gate_run_id, DECISION_TAG, d.outcome)
            client.set_tag(d.gate_run_id, "mlflow.note.content", f"{d.outcome}: {d.reason}")


def apply_decision(decision: GateDecision, journal_dir: Path | None = None) -> GateDecision:
    """``commit`` of one decision."""
    return commit([decision], journal_dir)[0]


def decision_from_dict(raw: dict) -> GateDecision:
    """Inverse of ``to_dict`` (also after kfp turned None into "")."""
    surfaces = [SurfaceVerdict(v["surface"], v["challenger"], v.get("champion") or None, bool(v["wins"]),
                               v["reason"], v.get("outcome") or (PROMOTE if v["wins"] else KEEP))
                for v in raw.get("surfaces", [])]
    outcome = raw.get("outcome") or (PROMOTE if raw.get("promote") else KEEP)
    if outcome not in OUTCOMES:
        raise ValueError(f"gate decision outcome {outcome!r} is not one of {OUTCOMES}")
    return GateDecision(raw["model_name"], str(raw["challenger_version"]), raw.get("champion_version") or None,
                        outcome, raw.get("reason", ""), surfaces, raw.get("teacher_version") or "",
                        raw.get("gate_run_id") or "", raw.get("stale") or "", dict(raw.get("config") or {}),
                        bool(raw.get("offered", True)))


def decision_json(decision: GateDecision) -> str:
    return json.dumps(decision.to_dict(), indent=2, sort_keys=True)
