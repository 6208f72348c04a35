"""The transfer goals restated after the simulator run (docs/transfer.md, issue 29), each
checked from the recorded figures: a goal's verdict and the figures it rests on.

- combined minus KD above 0 with its interval above 0 at every staleness gap, on the
  simulator and pooled over Ciao's student surfaces;
- combined minus its capacity-matched no-teacher student (nt_combined) with its interval
  above 0 on a majority of Ciao's student surfaces, and pooled at 10% of their rows;
- the Student Adapter minus KD above 0 at the stale gaps (gap > 0) on Ciao as on the
  simulator (the point estimate; whether the interval is above 0 is recorded beside it).
"""

from __future__ import annotations

LIFT = ("mean", "lo", "hi")


def _lift(entry: dict | None) -> dict | None:
    return {k: entry.get(k) for k in LIFT} if entry and entry.get("mean") is not None else None


def _above(entry: dict | None) -> bool:
    return bool(entry and entry.get("lo") is not None and entry["mean"] > 0 and entry["lo"] > 0)


def _gaps(dataset: dict, key: str) -> dict[str, dict | None]:
    return {row["world"]: _lift(row.get(key)) for row in dataset.get("staleness", [])
            if row.get("gap_periods") is not None}


def combined_minus_kd_every_gap(dataset: dict) -> dict:
    by_gap = _gaps(dataset, "combined_vs_kd_auc")
    return {"met": bool(by_gap) and all(_above(v) for v in by_gap.values()), "auc_by_gap": by_gap}


def adapter_minus_kd_stale_gaps(dataset: dict) -> dict:
    stale = {w: v for w, v in _gaps(dataset, "adapter_vs_kd_auc").items() if w != "gap0"}
    ne = {w: v for w, v in _gaps(dataset, "adapter_vs_kd_ne").items() if w != "gap0"}
    return {"met": bool(stale) and all(v is not None and v["mean"] > 0 for v in stale.values()),
            "interval_above_0": bool(stale) and all(_above(v) for v in stale.values()),
            "auc_by_gap": stale, "ne_by_gap": ne}


def combined_minus_capacity_by_surface(dataset: dict) -> dict:
    surfaces = {s: _lift(e["arms"]["combined"].get("lift_auc_vs_capacity"))
                for s, e in dataset.get("per_surface", {}).items()
                if e.get("student") and "combined" in e.get("arms", {})}
    above = sorted(s for s, v in surfaces.items() if _above(v))
    return {"met": len(above) > len(surfaces) / 2 if surfaces else False, "above": above,
            "count": len(above), "of": len(surfaces), "auc_by_surface": surfaces}


def combined_minus_capacity_at(dataset: dict, fraction: float) -> dict:
    row = next((r for r in dataset.get("row_cuts", []) if abs(r["train_fraction"] - fraction) < 1e-9), None)
    lift = _lift((row or {}).get("combined_vs_capacity_auc"))
    return {"met": _above(lift), "train_fraction": fraction, "auc": lift,
            "world": row["world"] if row else None}


def restated(simulator: dict | None, ciao: dict | None) -> dict:
    """Every restated goal from the simulator's and Ciao's dataset entries (None: not run)."""
    out: dict = {"simulator": {}, "ciao": {}}
    if simulator:
        out["simulator"]["combined_minus_kd_every_gap"] = combined_minus_kd_every_gap(simulator)
        out["simulator"]["adapter_minus_kd_stale_gaps"] = adapter_minus_kd_stale_gaps(simulator)
    if ciao:
        out["ciao"]["combined_minus_kd_every_gap"] = combined_minus_kd_every_gap(ciao)
        out["ciao"]["combined_minus_capacity_majority_of_surfaces"] = combined_minus_capacity_by_surface(ciao)
        out["ciao"]["combined_minus_capacity_at_10pct_rows"] = combined_minus_capacity_at(ciao, 0.1)
        out["ciao"]["adapter_minus_kd_stale_gaps"] = adapter_minus_kd_stale_gaps(ciao)
    return out
