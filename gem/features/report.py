"""The validation report of a build: lengths, truncation, unknown ids, label rates, drift.

Built from the per-shard ``stats.json`` files; written as ``OUT/report.json`` and, when
an MLflow run is active, logged as metrics plus the JSON as an artifact.
Length percentiles are histogram based: "p90 <= 64" means the bin holding the 90th
percentile ends at 64 (bins: 0, 1, 2-3, 4-7, ..., max_seq_len).
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import numpy as np

EPS = 1e-6


def merge_stats(stats: list[dict]) -> dict:
    total = {"examples": 0, "history_events_stored": 0, "sequence_elements": 0, "truncated": 0,
             "sequence_item_unknown": 0}
    hist = np.zeros(len(stats[0]["length_hist"]), dtype=np.int64) if stats else np.zeros(0, np.int64)
    unknown: dict[str, int] = {}
    labels: dict[str, dict[str, int]] = {}
    for s in stats:
        for key in total:
            total[key] += s[key]
        hist += np.asarray(s["length_hist"], dtype=np.int64)
        for name, count in s["unknown"].items():
            unknown[name] = unknown.get(name, 0) + count
        for surface, counts in s["labels_by_surface"].items():
            acc = labels.setdefault(surface, {"examples": 0, "clicks": 0, "conversions": 0})
            for key, value in counts.items():
                acc[key] += value
    total.update(length_bins=stats[0]["length_bins"] if stats else [], length_hist=hist.tolist(),
                 unknown=unknown, labels_by_surface=labels)
    return total


def _percentile_edge(bins: list[int], hist: list[int], q: float) -> int:
    counts = np.cumsum(hist)
    if not len(counts) or counts[-1] == 0:
        return 0
    i = int(np.searchsorted(counts, q * counts[-1]))
    return int(bins[min(i + 1, len(bins) - 1)] - 1)


def psi(expected: list[float], actual: list[float]) -> float:
    """Population stability index between two distributions (counts or shares)."""
    p = np.asarray(expected, dtype=float)
    q = np.asarray(actual, dtype=float)
    if p.sum() <= 0 or q.sum() <= 0 or p.shape != q.shape:
        return float("nan")
    p = np.clip(p / p.sum(), EPS, None)
    q = np.clip(q / q.sum(), EPS, None)
    return float(np.sum((q - p) * np.log(q / p)))


def build_report(stats: list[dict], *, window: dict, max_seq_len: int, previous: dict | None = None) -> dict:
    merged = merge_stats(stats)
    n = merged["examples"]
    bins, hist = merged["length_bins"], merged["length_hist"]
    report = {
        "window": window,
        "examples": n,
        "history_events_stored": merged["history_events_stored"],
        "sequence_length": {
            "max_seq_len": max_seq_len,
            "mean": merged["sequence_elements"] / n if n else 0.0,
            "p50_at_most": _percentile_edge(bins, hist, 0.5),
            "p90_at_most": _percentile_edge(bins, hist, 0.9),
            "p99_at_most": _percentile_edge(bins, hist, 0.99),
            "bins": bins,
            "hist": hist,
            "empty_share": hist[0] / n if n else 0.0,
        },
        "truncation_rate": merged["truncated"] / n if n else 0.0,
        "unknown_share": {k: v / n if n else 0.0 for k, v in sorted(merged["unknown"].items())},
        "sequence_item_unknown_share": (merged["sequence_item_unknown"] / merged["sequence_elements"]
                                        if merged["sequence_elements"] else 0.0),
        "label_rates": {
            surface: {
                "examples": c["examples"],
                "click_rate": c["clicks"] / c["examples"] if c["examples"] else 0.0,
                "conversion_rate": c["conversions"] / c["examples"] if c["examples"] else 0.0,
            }
            for surface, c in sorted(merged["labels_by_surface"].items())
        },
    }
    report["drift"] = drift(previous, report) if previous else None
    return report


def drift(previous: dict, current: dict) -> dict:
    """PSI of the length histogram and surface mix; PSI of each surface's click and
    conversion rates (as Bernoulli distributions); absolute rate changes."""
    out = {"previous_window": previous.get("window")}
    prev_len, cur_len = previous["sequence_length"], current["sequence_length"]
    out["psi_sequence_length"] = psi(prev_len["hist"], cur_len["hist"]) if prev_len["bins"] == cur_len["bins"] else None
    surfaces = sorted(set(previous["label_rates"]) & set(current["label_rates"]))
    out["psi_surface_mix"] = psi([previous["label_rates"][s]["examples"] for s in surfaces],
                                 [current["label_rates"][s]["examples"] for s in surfaces])
    per_surface = {}
    for s in surfaces:
        p, c = previous["label_rates"][s], current["label_rates"][s]
        per_surface[s] = {
            f"psi_{rate}": psi([p[rate], 1 - p[rate]], [c[rate], 1 - c[rate]])
            for rate in ("click_rate", "conversion_rate")
        } | {f"delta_{rate}": c[rate] - p[rate] for rate in ("click_rate", "conversion_rate")}
    out["by_surface"] = per_surface
    out["delta_truncation_rate"] = current["truncation_rate"] - previous["truncation_rate"]
    out["delta_sequence_item_unknown_share"] = (current["sequence_item_unknown_share"]
                                                - previous["sequence_item_unknown_share"])
    return out


def read_report(path: str | Path) -> dict:
    """A report.json, or the report of a features directory."""
    path = Path(path)
    if path.is_dir():
        path = path / "report.json"
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no features report")
    return json.loads(path.read_text())


def report_metrics(report: dict) -> dict[str, float]:
    """Flat numeric metrics (MLflow keys) from a report."""
    metrics = {
        "features/examples": report["examples"],
        "features/seq_len_mean": report["sequence_length"]["mean"],
        "features/seq_len_p90_at_most": report["sequence_length"]["p90_at_most"],
        "features/truncation_rate": report["truncation_rate"],
        "features/sequence_item_unknown_share": report["sequence_item_unknown_share"],
    }
    metrics.update({f"features/unknown_share/{k}": v for k, v in report["unknown_share"].items()})
    for surface, rates in report["label_rates"].items():
        metrics[f"features/click_rate/{surface}"] = rates["click_rate"]
        metrics[f"features/conversion_rate/{surface}"] = rates["conversion_rate"]
    drift_ = report.get("drift") or {}
    for key in ("psi_sequence_length", "psi_surface_mix"):
        if drift_.get(key) is not None:
            metrics[f"features/{key}"] = drift_[key]
    for surface, values in (drift_.get("by_surface") or {}).items():
        metrics.update({f"features/{k}/{surface}": v for k, v in values.items()})
    return {k: float(v) for k, v in metrics.items() if v is not None and math.isfinite(float(v))}


def log_to_mlflow(report: dict) -> bool:
    """Log the report to the active MLflow run, if any; returns whether it logged."""
    if "mlflow" not in sys.modules:  # nobody started a run in this process (saves ~1.5 s import)
        return False
    import mlflow

    if mlflow.active_run() is None:
        return False
    mlflow.log_metrics(report_metrics(report))
    mlflow.log_dict(report, "features/report.json")
    return True


def report_warnings(report: dict, data_warnings: list[str] | None = None) -> list[str]:
    """Degenerate features of the window, one sentence each: a sparse feature unknown (0)
    for every example, a surface without a positive click, a constant click label;
    plus the dataset's own warnings (gem.data.profile)."""
    out = list(data_warnings or [])
    n = report["examples"]
    if not n:
        return out + ["the window has no example"]
    for name, share in report["unknown_share"].items():
        if share >= 1.0:
            out.append(f"feature {name!r} is unknown (id 0) for every example of the window")
    clicks = 0.0
    for surface, rates in report["label_rates"].items():
        clicks += rates["click_rate"] * rates["examples"]
        if rates["examples"] and rates["click_rate"] == 0.0:
            out.append(f"surface {surface!r} has no positive click in the window ({rates['examples']} examples)")
    if clicks in (0.0, float(n)):
        out.append(f"label 'click' is constant over the window's {n} examples")
    from gem.limits import build_warning

    long_histories = build_warning(report)
    if long_histories:
        out.append(long_histories)
    return list(dict.fromkeys(out))
