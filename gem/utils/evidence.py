"""How much a ranking figure must rest on before it is shown: an AUC over fewer than
``MIN_AUC_EVIDENCE`` positives or negatives is written "n/a (k positives)" in step lines
and summaries and left out of the logged metrics (the counts are logged instead), never
shown as 0.0000 or 1.0000."""

from __future__ import annotations

import math

MIN_AUC_EVIDENCE = 10  # positives, and negatives, an AUC needs


def enough_for_auc(positives: float, negatives: float) -> bool:
    return positives >= MIN_AUC_EVIDENCE and negatives >= MIN_AUC_EVIDENCE


def auc_text(auc: float | None, positives: float | None = None, negatives: float | None = None,
             sign: bool = False) -> str:
    """The AUC (or an AUC lift, ``sign``) to 4 places, or "n/a (k positives)" when its
    evidence is short or it is missing."""
    short = [f"{int(n)} {name}" for n, name in ((positives, "positives"), (negatives, "negatives"))
             if n not in (None, "") and float(n) < MIN_AUC_EVIDENCE]
    try:
        value = float(auc)  # type: ignore[arg-type]
    except (TypeError, ValueError):  # missing: None, or "" as kfp carries it
        value = math.nan
    if short or not math.isfinite(value):
        return "n/a" + (f" ({', '.join(short)})" if short else "")
    return f"{value:+.4f}" if sign else f"{value:.4f}"


def computed(figures: dict) -> dict[str, float]:
    """The figures that were computed, as floats: a figure left out (NaN, as an AUC short
    of evidence is; "" or None, as a kfp output carries it) is dropped, for MLflow and
    kfp metrics, which take no NaN."""
    out = {}
    for key, value in figures.items():
        try:
            number = float(value)
        except (TypeError, ValueError):
            continue
        if math.isfinite(number):
            out[key] = number
    return out
