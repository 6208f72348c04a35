"""The arms of the transfer experiment and the one model-selection rule they all share.

An arm is a transfer configuration (students/config.py switches), optionally a student
size (the capacity-matched no-teacher baselines) and a grid of equal size for every arm.
For each (arm, teacher) the grid is searched with the first seed: every point trains one
student per surface with early stopping on the validation slice (the last period(s) of
the student window, never trained on), and the point with the lowest validation label
loss (the same criterion for every arm: the joint click / conversion log loss on the
labels, no soft targets) is kept. The other seeds rerun that point. The evaluation
window is only scored.

    selected = run_arm("kd", arm, arms, tables, spec, base, [0, 1, 2], teacher_model=gem, teacher_id="t0")
    selected.runs[seed] -> {surface: SurfaceRun}
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from gem.config import from_dict, with_point

TEACHER_FREE = "no_teacher"


@dataclass(kw_only=True)
class ArmConfig:
    transfer: dict[str, Any] = field(default_factory=dict)  # TransferConfig overrides ({} = no teacher)
    # "": the experiment's student; "<arm>": a no-teacher student as large as that arm's
    # student (students.distill.capacity_matched: teacher-embedding width, teacher's embedding_dim)
    capacity_of: str = ""
    # the capacity-matched baseline this arm is also reported against ("" = the arm whose
    # capacity_of names this one, if any)
    capacity_baseline: str = ""
    refresh_every: str = ""  # "" = the experiment's knowledge cadence; "impression": the labelled upper bound
    grid: list[dict[str, Any]] = field(default_factory=list)  # points of dotted DistillConfig overrides
    label: str = ""  # shown in the tables, e.g. "upper bound: knowledge per impression"


@dataclass
class SurfaceRun:
    index: np.ndarray  # positions of the surface's rows in the evaluation table
    probs: np.ndarray  # (n,) click probabilities on them
    metrics: dict[str, float]
    valid_loss: float
    valid_rows: int
    best_epoch: int
    epochs_run: int
    size: dict[str, int]
    flops: float


@dataclass
class ArmResult:
    name: str
    teacher: str | None  # the teacher id ("t0", "t1"), None for teacher-free arms
    point: dict[str, Any]  # the selected grid point
    trials: list[dict] = field(default_factory=list)  # every point's validation loss (first seed)
    runs: dict[int, dict[str, SurfaceRun]] = field(default_factory=dict)  # seed -> surface -> run
    windows: dict[str, list[int]] = field(default_factory=dict)
    models: dict[int, dict] = field(default_factory=dict)  # seed -> {surface: StudentResult} (kept seeds only)


def needs_teacher(arm: ArmConfig) -> bool:
    from students.config import TransferConfig

    return from_dict(TransferConfig, copy.deepcopy(arm.transfer)).needs_teacher()


def capacity_baselines(arms: dict[str, ArmConfig]) -> dict[str, str]:
    """arm -> its capacity-matched no-teacher baseline (the arm whose capacity_of names it)."""
    return {a.capacity_of: name for name, a in arms.items() if a.capacity_of}


def check_arms(arms: dict[str, ArmConfig]) -> None:
    """Every arm gets the same budget: grids of one size; capacity references exist."""
    sizes = {name: max(len(a.grid), 1) for name, a in arms.items()}
    if len(set(sizes.values())) > 1:
        raise ValueError(f"every arm must search a grid of the same size (same budget); got {sizes}")
    if TEACHER_FREE not in arms:
        raise ValueError(f"the arms must include the {TEACHER_FREE!r} baseline")
    for name, arm in arms.items():
        if arm.capacity_of and arm.capacity_of not in arms:
            raise ValueError(f"arm {name}: capacity_of={arm.capacity_of!r} is not an arm")
        if arm.capacity_baseline and arm.capacity_baseline not in arms:
            raise ValueError(f"arm {name}: capacity_baseline={arm.capacity_baseline!r} is not an arm")
        if arm.capacity_of and needs_teacher(arm):
            raise ValueError(f"arm {name}: a capacity-matched baseline must not use the teacher")


def arm_config(arm: ArmConfig, arms: dict[str, ArmConfig], base: dict, point: dict, seed: int,
               teacher_dims: tuple[int, int]):
    """The DistillConfig of one arm at one grid point and seed. ``base``: the experiment's
    DistillConfig as a dict; ``teacher_dims``: (teacher-embedding width, teacher embedding_dim)."""
    from students.config import DistillConfig
    from students.distill import capacity_matched

    raw = copy.deepcopy(base)
    raw["transfer"] = copy.deepcopy(arm.transfer)
    raw["seed"] = seed
    cfg = with_point(from_dict(DistillConfig, raw), point).validate()
    if arm.capacity_of:
        ref = copy.deepcopy(raw)
        ref["transfer"] = copy.deepcopy(arms[arm.capacity_of].transfer)
        cfg = capacity_matched(with_point(from_dict(DistillConfig, ref), point), teacher_emb_width=teacher_dims[0],
                               teacher_embedding_dim=teacher_dims[1])
    return cfg


def total_valid_loss(out, valid) -> float:
    """Row-weighted validation label loss over the surfaces (the selection criterion)."""
    total, rows = 0.0, 0
    for name, res in out.students.items():
        n = int((valid.surface == list(valid.surfaces).index(name)).sum())
        loss = res.selection.get("valid_loss", math.inf)
        total, rows = total + loss * n, rows + n
    return total / rows if rows else math.inf


def _collect(out, valid) -> dict[str, SurfaceRun]:
    runs = {}
    for name, res in out.students.items():
        if res.eval_index is None:
            continue
        runs[name] = SurfaceRun(
            index=res.eval_index.numpy(), probs=res.eval_probs[:, 0].numpy().astype(np.float64),
            metrics=dict(res.metrics), valid_loss=float(res.selection.get("valid_loss", math.nan)),
            valid_rows=int((valid.surface == list(valid.surfaces).index(name)).sum()),
            best_epoch=int(res.selection.get("best_epoch", -1)), epochs_run=int(res.selection.get("epochs_run", 0)),
            size=dict(res.size), flops=float(res.flops_per_example))
    return runs


def run_arm(name: str, arm: ArmConfig, arms: dict[str, ArmConfig], tables: dict, spec, base: dict,
            seeds: list[int], *, teacher_model=None, teacher_id: str | None = None,
            teacher_dims: tuple[int, int] = (0, 0), keep_models: tuple[int, ...] = ()) -> ArmResult:
    """Select the arm's grid point on the validation slice with ``seeds[0]``, then rerun it
    with the other seeds. ``tables``: {"train", "validation", "evaluation"} StudentTables
    (with the teacher's knowledge when the arm reads it)."""
    from students.distill import distill

    train, valid, evaluation = tables["train"], tables["validation"], tables["evaluation"]
    model = teacher_model
    result = ArmResult(name, teacher_id, {})
    best = None
    for point in arm.grid or [{}]:
        cfg = arm_config(arm, arms, base, point, seeds[0], teacher_dims)
        out = distill(train, evaluation, spec, cfg, teacher_model=model, valid=valid)
        loss = total_valid_loss(out, valid)
        result.trials.append({"point": point, "valid_loss": loss})
        if best is None or loss < best[0]:
            best = (loss, point, out)
    _, result.point, out = best
    result.windows = dict(out.windows)
    result.runs[seeds[0]] = _collect(out, valid)
    if seeds[0] in keep_models:
        result.models[seeds[0]] = out.students
    for seed in seeds[1:]:
        out = distill(train, evaluation, spec, arm_config(arm, arms, base, result.point, seed, teacher_dims),
                      teacher_model=model, valid=valid)
        result.runs[seed] = _collect(out, valid)
        if seed in keep_models:
            result.models[seed] = out.students
    return result
