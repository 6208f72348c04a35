from typing import List

from components.base import component


@component
def finalize_features(ctx: str, out: str, preset: str, name: str, vocab_from: str, shards: List[str]) -> str:
    """Check every shard, write the validation report and the manifest (last, so no
    reader ever sees an unfinished build); returns the features directory."""
    from gem.stages import RunContext, features_finalize_stage

    features_finalize_stage(out, preset, RunContext.loads(ctx), name, vocab_from=vocab_from)
    return out
