from typing import List

from components.base import component


@component
def plan_features(data: str, out: str, start: str, end: str, preset: str, vocab_from: str) -> List[str]:
    """Stage one window's inputs into ``out``; returns the shards to fan out over."""
    from gem.stages import features_plan_stage

    return features_plan_stage(data, out, start, end, preset, vocab_from=vocab_from)
