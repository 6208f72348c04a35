from typing import List, NamedTuple

from kfp.dsl import Dataset, Output

from gem_app.components.base import component


@component
def features_finalize(tracking: str, out: str, preset: str, name: str, vocab_from: str, shards: List[str],
                      features: Output[Dataset]) -> NamedTuple("Features", path=str, digest=str):
    """Check every shard, write the validation report and the manifest (last, so no
    reader ever sees an unfinished build); returns the features directory and its
    content digest (the downstream cache keys)."""
    from collections import namedtuple

    from gem.utils.digest import lineage_digest
    from gem_app.components.runtime import run_context
    from gem_app.stages.features import features_finalize as run

    result = run(out, preset, run_context(tracking), name, vocab_from=vocab_from)
    with open(features.path, "w") as f:
        f.write(f"{result.features}\n")
    features.metadata.update({"path": result.features, "digest": lineage_digest(result.digest),
                              "examples": result.examples, "window": result.window, "name": name})
    return namedtuple("Features", ["path", "digest"])(result.features, result.digest)
