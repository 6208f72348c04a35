"""gem_pipeline: data -> features -> GEM -> knowledge -> per-surface students -> gate ->
promotion, every stage a run nested under one MLflow parent run.

refresh_pipeline is the same graph built with ``refresh=True``: GEM continues from the
champion teacher's weights on the newest days (features built with the champion's
vocabularies), knowledge is regenerated, students re-distilled, gated and promoted."""


from kfp import dsl

from gem_app.components import (
    distill,
    distill_plan,
    feast_materialize,
    gate,
    ingest,
    knowledge,
    promote,
    resolve_champion,
    start_run,
    summary,
    train,
)
from gem_app.pipelines.features_window import make_features_window
from gem_app.pipelines.settings import ClusterSettings, configure_task


def make_gem_pipeline(cluster: ClusterSettings | None = None, *, refresh: bool = False):
    features_window = make_features_window(cluster)
    name = "refresh-pipeline" if refresh else "gem-pipeline"

    @dsl.pipeline(name=name, description="Contract data to registered per-surface students"
                  + (", continuing the champion teacher on the newest days." if refresh else "."))
    def gem_pipeline(workspace: str, run_id: str, tracking_root: str = "", data: str = "",
                     sim_preset: str = "small", features_preset: str = "pipeline", train_preset: str = "pipeline",
                     student_preset: str = "pipeline", surfaces: list = [],  # noqa: B006 (compiled, never mutated)
                     student_days: int = 1,
                     holdout_days: int = 1, teacher_days: int = 1 if refresh else 0, min_auc_gain: float = 0.0,
                     max_ne_increase: float = 0.0, min_auc: float = 0.55,
                     pretrain_launcher: str = "trainjob:1:1" if cluster else "local"):
        ctx = configure_task(start_run(pipeline_run_id=run_id, tracking_root=tracking_root, workspace=workspace,
                                       params={"data": data, "sim_preset": sim_preset, "train_preset": train_preset,
                                               "student_preset": student_preset, "features_preset": features_preset}),
                             "light", cluster).output
        ingested = configure_task(ingest(ctx=ctx, data=data, sim_preset=sim_preset, workspace=workspace,
                                         student_days=student_days, holdout_days=holdout_days,
                                         teacher_days=teacher_days), "heavy", cluster)
        init_from, teacher_vocab = "", ""
        if refresh:
            champion = configure_task(resolve_champion(ctx=ctx), "light", cluster)
            init_from, teacher_vocab = champion.outputs["init_from"], champion.outputs["vocab_from"]
        clean = ingested.outputs["clean"]
        start, teacher_end = ingested.outputs["start"], ingested.outputs["teacher_end"]
        student_end, end = ingested.outputs["student_end"], ingested.outputs["end"]
        teacher_feats = features_window(ctx=ctx, data=clean, out=ingested.outputs["teacher_features"],
                                        start=start, end=teacher_end, preset=features_preset,
                                        vocab_from=teacher_vocab, name="teacher")
        student_feats = features_window(ctx=ctx, data=clean, out=ingested.outputs["student_features"],
                                        start=teacher_end, end=student_end,
                                        preset=features_preset, vocab_from=teacher_feats.output, name="student")
        holdout_feats = features_window(ctx=ctx, data=clean, out=ingested.outputs["holdout_features"],
                                        start=student_end, end=end, preset=features_preset,
                                        vocab_from=teacher_feats.output, name="holdout")
        repo = configure_task(feast_materialize(ctx=ctx, data=clean, repo_dir=f"{workspace}/feast",
                                                end=end), "light", cluster)
        teacher = configure_task(train(ctx=ctx, features=teacher_feats.output, eval_features=holdout_feats.output,
                                              out=f"{workspace}/teacher", preset=train_preset, init_from=init_from,
                                              launcher=pretrain_launcher),
                                 "pretrain", cluster)
        generated = configure_task(knowledge(ctx=ctx, teacher_uri=teacher.outputs["model_uri"],
                                                      features=[student_feats.output, holdout_feats.output],
                                                      out_root=f"{workspace}/knowledge", feast_repo=repo.output),
                                   "heavy", cluster)
        jobs = configure_task(distill_plan(
            ctx=ctx, surfaces=surfaces, available=ingested.outputs["surfaces"], train_features=student_feats.output,
            eval_features=holdout_feats.output,
            feast_repo=repo.output, teacher_uri=teacher.outputs["model_uri"], teacher_version=generated.output,
            out=f"{workspace}/students", preset=student_preset, min_auc_gain=min_auc_gain,
            max_ne_increase=max_ne_increase, min_auc=min_auc), "light", cluster)
        # the loop body reads only its job (kfp.local resolves outer task outputs wrongly in loops)
        with dsl.ParallelFor(jobs.output, parallelism=4) as job:
            distilled = configure_task(distill(job=job), "heavy", cluster)
            decision = configure_task(gate(job=job, challenger=distilled.outputs["Output"]),
                                      "light", cluster)
            promoted = configure_task(promote(job=job, gated=decision.output), "light", cluster)
        configure_task(summary(ctx=ctx, teacher=teacher.outputs["result"],
                                 surfaces=dsl.Collected(promoted.output), workspace=workspace), "light", cluster)

    return gem_pipeline
