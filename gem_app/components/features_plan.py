from typing import List

from gem_app.components.base import component


@component
def features_plan(data: str, data_digest: str, out: str, start: str, end: str, preset: str, features_config: str,
                  vocab_from: str, vocab_digest: str, code_version: str) -> List[dict]:
    """Stage one window's inputs into ``out``; returns the shards to fan out over, each
    with the plan's content key (so a shard's cache key changes with the plan's)."""
    from gem.utils.digest import value_digest
    from gem_app.stages.features import features_plan as run

    names = run(data, out, start, end, preset, vocab_from=vocab_from)
    key = value_digest([data_digest, start, end, features_config, vocab_digest, code_version])
    return [{"shard": name, "plan": key} for name in names]
