from components.base import component


@component
def build_feature_shard(out: str, shard: str) -> str:
    """Build one (user bucket, day) shard of a planned window (written atomically)."""
    from gem.stages import features_shard_stage

    features_shard_stage(out, shard)
    return shard
