from gem_app.components.base import component


@component
def features_shard(out: str, shard: dict) -> str:
    """Build one (user bucket, day) shard of a planned window (written atomically)."""
    from gem_app.stages.features import features_shard as run

    run(out, shard["shard"])
    return shard["shard"]
