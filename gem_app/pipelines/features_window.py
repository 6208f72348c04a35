"""The features sub-pipeline: plan a window, build its shards in parallel, finalize.

Every task's cache key is content: the clean data's digest, the window, the features
config's digest, the digest of the features whose vocabularies it borrows, the code
version; a shard's key adds the plan's key (carried in its loop item)."""

from typing import NamedTuple

from kfp import dsl

from gem_app.components import features_finalize, features_plan, features_shard
from gem_app.pipelines.settings import ClusterSettings, configure_task


def make_features_window(cluster: ClusterSettings | None):
    parallelism = cluster.shard_parallelism if cluster else 8

    @dsl.pipeline(name="features-window")
    def features_window(tracking: str, data: str, data_digest: str, out: str, start: str, end: str, preset: str,
                        features_config: str, vocab_from: str, vocab_digest: str, name: str,
                        code_version: str) -> NamedTuple("Window", path=str, digest=str):
        plan = configure_task(features_plan(data=data, data_digest=data_digest, out=out, start=start, end=end,
                                            preset=preset, features_config=features_config, vocab_from=vocab_from,
                                            vocab_digest=vocab_digest, code_version=code_version), cluster)
        with dsl.ParallelFor(plan.output, parallelism=parallelism) as shard:
            built = configure_task(features_shard(out=out, shard=shard), cluster)
        done = configure_task(features_finalize(tracking=tracking, out=out, preset=preset, name=name,
                                                vocab_from=vocab_from, shards=dsl.Collected(built.output)), cluster)
        return NamedTuple("Window", path=str, digest=str)(path=done.outputs["path"], digest=done.outputs["digest"])

    return features_window
