"""Which surfaces get students, and the student-row cuts.

Students by evidence (``DatasetConfig.student_evidence``, the settings of
``gem.protocol.Evidence``: examples, positives): a surface gets a student only when its
train, validation and evaluation windows each hold at least ``examples`` examples with at
least ``positives`` clicked and ``positives`` unclicked ones (the promotion gate's own
floor), counted from the dataset's cached per-day profile before any model is trained.
Every other surface is teacher-only: GEM trains on it, no student is trained or judged
there. ``{}`` gives every surface a student (the simulator, MovieLens, Taobao).

Row cuts (``DatasetConfig.train_fractions``): the students' training table keeps the
newest ``ceil(fraction x rows)`` rows of each surface (ties: the larger example id, so a
cut is deterministic), as if the student had only known the surface for the end of its
window; the teacher, its knowledge, validation and evaluation are the headline world's.
"""

from __future__ import annotations

import math
from dataclasses import asdict
from pathlib import Path

import numpy as np
import torch

WINDOWS = ("train", "validation", "evaluation")


def window_counts(data_dir: Path, windows: dict[str, tuple[str, str]]) -> dict[str, dict[str, dict[str, int]]]:
    """window -> surface -> {examples, clicks, unclicked} for the train, validation and
    evaluation windows (from the cached daily counts: no event file read again)."""
    from gem.data.profile import profile_dataset
    from students.protocol import to_us

    out = {}
    for name in WINDOWS:
        lo, hi = windows[name]
        profile = profile_dataset(data_dir, start_us=to_us(lo), end_us=to_us(hi))
        out[name] = {s: {"examples": int(profile.examples.get(s, 0)), "clicks": int(profile.clicks.get(s, 0)),
                         "unclicked": int(profile.examples.get(s, 0) - profile.clicks.get(s, 0))}
                     for s in profile.declared_surfaces}
    return out


def student_surfaces(declared: list[str], counts: dict[str, dict[str, dict[str, int]]],
                     evidence: dict) -> tuple[list[str], dict[str, str]]:
    """(surfaces that get a student, in declared order; teacher-only surface -> why).
    ``evidence``: gem.protocol.Evidence settings ({} = every surface gets a student)."""
    if not evidence:
        return list(declared), {}
    from gem.protocol import Evidence

    rule = Evidence.from_dict(evidence)
    chosen, why = [], {}
    for s in declared:
        short = [f"{w} {counts[w][s]['examples']} examples, {counts[w][s]['clicks']} clicked, "
                 f"{counts[w][s]['unclicked']} unclicked" for w in WINDOWS
                 if counts[w][s]["examples"] < rule.examples or counts[w][s]["clicks"] < rule.positives
                 or counts[w][s]["unclicked"] < rule.positives]
        if short:
            why[s] = "; ".join(short)
        else:
            chosen.append(s)
    return chosen, why


def rule_text(evidence: dict) -> str:
    if not evidence:
        return "every surface"
    from gem.protocol import Evidence

    rule = asdict(Evidence.from_dict(evidence))
    return (f">= {rule['examples']} examples with >= {rule['positives']} clicked and >= {rule['positives']} "
            "unclicked in each of the train, validation and evaluation windows")


def newest_rows(table, fraction: float):
    """The StudentTable's newest ``ceil(fraction x n)`` rows of each surface (order kept)."""
    if not 0.0 < fraction <= 1.0:
        raise ValueError(f"train fraction {fraction} must be in (0, 1]")
    keep = torch.zeros(len(table), dtype=torch.bool)
    times, ids, surface = table.event_time_us.numpy(), table.example_id.numpy(), table.surface.numpy()
    for s in np.unique(surface):
        rows = np.flatnonzero(surface == s)
        order = rows[np.lexsort((ids[rows], times[rows]))]  # oldest first, ties by example id
        keep[torch.from_numpy(order[len(order) - math.ceil(fraction * len(order)):])] = True
    out = table.subset(keep)
    out.window_us = table.window_us  # still cut from the same window (check_rows)
    return out


def cut_tables(tables: dict, fraction: float) -> dict:
    """{"train", "validation", "evaluation"} with only the training rows cut."""
    return {**tables, "train": newest_rows(tables["train"], fraction)}


CUT_PREFIX = "rows"


def cut_name(fraction: float) -> str:
    return f"{CUT_PREFIX}{round(fraction * 100)}"


def is_cut(world: str) -> bool:
    return world.startswith(CUT_PREFIX)
