from typing import List

from components.base import component


@component
def plan_students(ctx: str, surfaces: list, train_features: str, eval_features: str, feast_repo: str,
                  teacher_uri: str, teacher_version: str, out: str, preset: str, min_auc_gain: float,
                  max_ne_increase: float, min_auc: float) -> List[dict]:
    """One job per surface for the students' ParallelFor; each job carries everything its
    iteration needs (the loop body reads nothing else from upstream tasks)."""
    from gem.data.contract import SURFACES

    unknown = sorted(set(surfaces) - set(SURFACES))
    if unknown:
        raise ValueError(f"surfaces {unknown} are not in the declared vocabulary {SURFACES}")
    return [{"ctx": ctx, "surface": s, "train_features": train_features, "eval_features": eval_features,
             "feast_repo": feast_repo, "teacher_uri": teacher_uri, "teacher_version": teacher_version,
             "out": out, "preset": preset, "gate": {"min_auc_gain": min_auc_gain,
                                                   "max_ne_increase": max_ne_increase, "min_auc": min_auc}}
            for s in surfaces]
