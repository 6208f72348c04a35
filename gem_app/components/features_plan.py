from typing import List

from gem_app.components.base import component


@component
def features_plan(data: str, out: str, start: str, end: str, preset: str, vocab_from: str) -> List[str]:
    """Stage one window's inputs into ``out``; returns the shards to fan out over."""
    from gem_app.stages.features import features_plan as run

    return run(data, out, start, end, preset, vocab_from=vocab_from)
