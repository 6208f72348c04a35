"""The features sub-pipeline: plan a window, build its shards in parallel, finalize."""


from kfp import dsl

from gem_app.components import features_finalize, features_plan, features_shard
from gem_app.pipelines.settings import ClusterSettings, configure_task


def make_features_window(cluster: ClusterSettings | None):
    @dsl.pipeline(name="features-window")
    def features_window(ctx: str, data: str, out: str, start: str, end: str, preset: str, vocab_from: str,
                        name: str) -> str:
        plan = configure_task(features_plan(data=data, out=out, start=start, end=end, preset=preset,
                                            vocab_from=vocab_from), "heavy", cluster)
        with dsl.ParallelFor(plan.output, parallelism=8) as shard:
            built = configure_task(features_shard(out=out, shard=shard), "heavy", cluster)
        done = configure_task(features_finalize(ctx=ctx, out=out, preset=preset, name=name,
                                                vocab_from=vocab_from, shards=dsl.Collected(built.output)),
                              "light", cluster)
        return done.output

    return features_window
