from typing import List

from gem_app.components.base import component


@component
def features_finalize(ctx: str, out: str, preset: str, name: str, vocab_from: str, shards: List[str]) -> str:
    """Check every shard, write the validation report and the manifest (last, so no
    reader ever sees an unfinished build); returns the features directory."""
    from gem_app.stages.context import RunContext
    from gem_app.stages.features import features_finalize as run

    return run(out, preset, RunContext.loads(ctx), name, vocab_from=vocab_from).features
