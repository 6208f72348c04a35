from typing import List

from gem_app.components.base import component


@component
def distill_plan(ctx: str, surfaces: list, available: list, train_features: str, eval_features: str,
                 feast_repo: str, teacher_uri: str, teacher_version: str, out: str, preset: str,
                 min_auc_gain: float, max_ne_increase: float, min_auc: float) -> List[dict]:
    """One job per surface for the students' ParallelFor (every surface of the data when
    ``surfaces`` is empty); each job carries everything its iteration needs."""
    from gem_app.stages.distill import distill_plan as run

    return run(ctx, list(surfaces) or list(available), list(available), train_features=train_features,
               eval_features=eval_features, feast_repo=feast_repo, teacher_uri=teacher_uri,
               teacher_version=teacher_version, out=out, preset=preset,
               gate={"min_auc_gain": min_auc_gain, "max_ne_increase": max_ne_increase, "min_auc": min_auc})
