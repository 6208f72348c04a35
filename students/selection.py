"""Students chosen on validation, and recalibrated when they are worse than a base rate.

    train, valid = validation_split(train, 0.2)          # the newest 20% of the rows, by time
    chosen = select(train, valid, holdout, spec, cfg, surface, grid)
    chosen.result, chosen.point, chosen.trials            # the winner, its point, every point's figures
    with_older_rows(chosen, every_row, valid, holdout, spec, surface)  # the point on the teacher's days too
    recalibrate(chosen, valid, holdout, surface, teacher_ne)  # Platt on validation, folded into the model
    refit(chosen, train_and_valid, holdout, spec, surface)    # or: the chosen point on every row

Every grid point trains one student on ``train`` with early stopping on ``valid``'s label
loss (students.train.train_student); the point with the lowest validation label loss
wins. The holdout is scored for every point (it costs one forward pass) but never read
to choose.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import torch

from gem.config import with_point
from students.data import StudentTable, split_at

CLICK = 0  # the click task's column in labels and probabilities


@dataclass
class Chosen:
    result: object  # students.distill.StudentResult of the winning point
    point: dict
    trials: list[dict] = field(default_factory=list)  # per point: the point, valid loss / AUC / NE, epochs
    calibration: dict = field(default_factory=dict)  # {"applied", "valid_ne_before", "valid_ne_after", "a", "b"}
    windows: dict = field(default_factory=dict)  # the winning run's windows (train, validation, adapter fit, ...)
    cfg: object = None  # the winning point's DistillConfig
    refit: dict = field(default_factory=dict)  # {"epochs", "rows"} when retrained on the whole window
    # a window reaching into the teacher's days: "all" trained on them too, "fresh" on the
    # rows after them only (selection.older_rows, or with_older_rows' choice); "" otherwise
    rows: str = ""


def validation_split(table: StudentTable, share: float, fresh_from: str = "") -> tuple[StudentTable, StudentTable]:
    """(older rows, the newest ``share`` of the rows), cut at one event time, so rows of
    the same instant stay on one side and validation is strictly after training. With
    ``fresh_from`` (ISO), the share is of the rows from then on (a window that overlaps
    the teacher's: its earlier rows always train)."""
    if not 0 < share < 1:
        raise ValueError(f"validation share {share} must be in (0, 1)")
    times = np.sort(table.event_time_us.numpy())
    if fresh_from:
        from students.protocol import to_us

        times = times[times >= to_us(fresh_from)]
    if len(times) < 2:
        raise ValueError(f"the student window holds {len(times)} rows: too few to hold out a validation part")
    at = int(times[min(int(len(times) * (1 - share)), len(times) - 1)])
    if at <= times[0]:  # most rows share the first instant: validation takes what lies after it
        later = times[times > times[0]]
        if not len(later):
            raise ValueError("every row of the student window has one event time: no validation part by time")
        at = int(later[0])
    return split_at(table, at)


def _surface_rows(table: StudentTable, surface: str) -> StudentTable:
    return table.subset(table.surface == list(table.surfaces).index(surface))


def binary_ne(labels: np.ndarray, probs: np.ndarray) -> float:
    """Log loss over the entropy of the base rate (NaN without both labels)."""
    from students.stats import weighted_ne

    return float(weighted_ne(labels.astype(np.float64), probs.astype(np.float64), np.ones((1, len(labels))))[0])


def _valid_figures(model, part: StudentTable) -> dict:
    from students.stats import weighted_auc
    from students.train import predict

    if not len(part):
        return {"valid_auc": math.nan, "valid_ne": math.nan}
    probs = predict(model, part)[:, CLICK].numpy().astype(np.float64)
    labels = part.labels[:, CLICK].numpy().astype(np.float64)
    return {"valid_auc": float(weighted_auc(labels, probs, np.ones((1, len(labels))))[0]),
            "valid_ne": binary_ne(labels, probs)}


def select(train: StudentTable, valid: StudentTable, holdout: StudentTable | None, spec, cfg, surface: str,
           grid: list[dict], *, teacher_model=None) -> Chosen:
    """Train ``cfg`` at every point of ``grid`` ({} alone when empty) for ``surface`` and
    keep the one with the lowest validation label loss."""
    from students.distill import distill

    part = _surface_rows(valid, surface)
    best: Chosen | None = None
    best_loss, trials = math.inf, []
    for point in grid or [{}]:
        point_cfg = with_point(cfg, point).validate()
        out = distill(train, holdout, spec, point_cfg, teacher_model=teacher_model, valid=valid)
        res = out.students[surface]
        trial = {"point": dict(point), "valid_loss": float(res.selection.get("valid_loss", math.inf)),
                 "best_epoch": int(res.selection.get("best_epoch", -1)),
                 "best_epochs": float(res.selection.get("best_epochs", 0.0)),
                 "epochs_run": int(res.selection.get("epochs_run", 0)), **_valid_figures(res.model, part)}
        trials.append(trial)
        if best is None or trial["valid_loss"] < best_loss:
            best, best_loss = Chosen(res, dict(point), windows=dict(out.windows), cfg=point_cfg), trial["valid_loss"]
    assert best is not None
    best.trials = trials
    return best


def with_older_rows(chosen: Chosen, every_row: StudentTable, valid: StudentTable, holdout: StudentTable | None,
                    spec, surface: str, *, teacher_model=None) -> bool:
    """Train the chosen point again on ``every_row`` (the fresh rows it was chosen on and
    the teacher window's days before them) and keep whichever of the two has the lower
    validation label loss; ``chosen.rows`` says which ("all" or "fresh"), and the new
    trial joins ``chosen.trials``. Returns whether the older rows were kept."""
    challenger = select(every_row, valid, holdout, spec, chosen.cfg, surface, [{}], teacher_model=teacher_model)
    trial = {**challenger.trials[0], "point": dict(chosen.point), "rows": "all"}
    better = trial["valid_loss"] < min(t["valid_loss"] for t in chosen.trials)
    trials = [*chosen.trials, trial]
    if better:
        chosen.result, chosen.windows = challenger.result, challenger.windows
    chosen.trials, chosen.rows = trials, "all" if better else "fresh"
    return better


def refit(chosen: Chosen, train: StudentTable, holdout: StudentTable | None, spec, surface: str, *,
          teacher_model=None) -> dict:
    """Retrain the chosen point on the whole student window (training and validation
    rows: the newest rows are the ones most like the holdout) for the epochs validation
    chose, without looking at validation again; the refit student replaces the chosen
    one. Returns what was done."""
    from dataclasses import replace

    from students.distill import distill

    selection = chosen.result.selection
    # the epochs' rows of the best check: a whole number unless validation was checked
    # inside an epoch (optim.check_rows), where a fraction of the first epoch is what
    # validation chose on a large table; one epoch when no check was recorded
    epochs = float(selection.get("best_epochs", int(selection.get("best_epoch", -1)) + 1))
    epochs = epochs if epochs > 0 else 1.0
    optim = replace(chosen.cfg.optim, epochs=math.ceil(epochs), stop_epochs=epochs, patience=0)
    cfg = replace(chosen.cfg, optim=optim, validation_days=0.0)
    out = distill(train, holdout, spec, cfg, teacher_model=teacher_model)
    chosen.result = out.students[surface]
    chosen.windows = dict(out.windows)  # one training window: validation rows are training rows now
    chosen.refit = {"epochs": epochs, "rows": int(chosen.result.train_examples)}  # the surface's rows
    return chosen.refit


def platt(logits: torch.Tensor, labels: torch.Tensor, steps: int = 200) -> tuple[float, float]:
    """(a, b) minimising the log loss of sigmoid(a * logit + b) on the rows (L-BFGS), with
    a > 0: a recalibration keeps the student's ranking. (Unconstrained, a validation part
    of a few hundred rows on which the student ranked near chance gave a = -8.9 on
    MovieLens-1M, and the recalibrated student ranked its holdout at 0.28 instead of 0.72.)"""
    log_a, b = torch.zeros((), requires_grad=True), torch.zeros((), requires_grad=True)
    opt = torch.optim.LBFGS([log_a, b], lr=1.0, max_iter=steps, line_search_fn="strong_wolfe")
    x, y = logits.double(), labels.double()

    def closure():
        opt.zero_grad()
        z = log_a.clamp(-20.0, 20.0).double().exp() * x + b.double()
        loss = torch.nn.functional.binary_cross_entropy_with_logits(z, y)
        loss.backward()
        return loss

    opt.step(closure)
    return float(log_a.detach().clamp(-20.0, 20.0).exp()), float(b.detach())


def fold_platt(model, a: float, b: float) -> None:
    """Fold sigmoid(a * click_logit + b) into the model's output layer, so the served
    model (its pyfunc, its ONNX export) carries the recalibration: the click row of
    ``out`` scaled by ``a``, its bias ``a * bias + b``."""
    with torch.no_grad():
        model.out.weight[CLICK].mul_(a)
        model.out.bias[CLICK].mul_(a).add_(b)


@torch.no_grad()
def _click_logits(model, table: StudentTable) -> torch.Tensor:
    model.eval()
    return torch.cat([model(table.inputs(slice(lo, lo + 8192))).cond_logits[:, CLICK]
                      for lo in range(0, len(table), 8192)]) if len(table) else torch.zeros(0)


def teacher_ne(valid: StudentTable, surface: str) -> float:
    """The teacher's click NE on the surface's validation rows (NaN without its predictions)."""
    part = _surface_rows(valid, surface)
    if part.teacher_logits is None or not len(part):
        return math.nan
    logits = part.teacher_logits[:, CLICK].numpy()
    ok = np.isfinite(logits)
    return binary_ne(part.labels[ok, CLICK].numpy(), 1 / (1 + np.exp(-logits[ok])))


def recalibrate(chosen: Chosen, valid: StudentTable, holdout: StudentTable | None, surface: str,
                teacher_valid_ne: float) -> dict:
    """Platt-recalibrate the chosen student on validation when its validation NE is >= 1
    and its teacher's is not (or is unknown), folding the map into the model and
    re-scoring its holdout rows; records and returns what was done."""
    from students.train import evaluate, predict

    res, part = chosen.result, _surface_rows(valid, surface)
    labels = part.labels[:, CLICK]
    before = binary_ne(labels.numpy(), predict(res.model, part)[:, CLICK].numpy()) if len(part) else math.nan
    info = {"applied": False, "valid_ne_before": before, "teacher_valid_ne": teacher_valid_ne}
    needed = math.isfinite(before) and before >= 1.0 and not (teacher_valid_ne >= 1.0)
    if needed:
        a, b = platt(_click_logits(res.model, part), labels)
        fold_platt(res.model, a, b)
        after = binary_ne(labels.numpy(), predict(res.model, part)[:, CLICK].numpy())
        info.update(applied=True, a=a, b=b, valid_ne_after=after)
        if holdout is not None and res.eval_index is not None:
            rows = holdout.subset(res.eval_index)
            res.eval_probs = predict(res.model, rows)
            metrics = evaluate(res.eval_probs, rows, list(holdout.surfaces), list(holdout.tasks))
            res.metrics = {k.replace(f"/{surface}/", "/"): v for k, v in metrics.items() if f"/{surface}/" in k}
    chosen.calibration = info
    return info
