"""gem_pipeline: data -> features -> GEM -> its gate -> knowledge -> per-surface students
-> their gates -> promote (the run's one commit) -> summary, every stage a run nested
under one MLflow parent run. The champions move only in promote, which runs once every
gate and every step before it has succeeded: a failed or killed run moves nothing.

refresh_pipeline is the same graph built with ``refresh=True``: GEM continues from the
champion teacher's weights on the newest days (features built with the champion's
vocabularies), knowledge is regenerated, students re-distilled, gated and promoted.

Caching keys on content: ``start_run`` (never cached) fingerprints the inputs (data
digest, code version, a digest per config preset); every cached task takes those
digests and its upstream tasks' content digests or model versions, never the
run-unique run context, so an unchanged rerun reuses every stage and a changed input
reruns exactly the stages that depend on it."""


from kfp import dsl

from gem_app.components import (
    distill,
    distill_plan,
    feast_materialize,
    gate,
    gate_teacher,
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
    # on a cluster the workspace comes from the compile options; the run id is KFP's own job
    # id unless one is given (KFP 2 resolves its placeholders in task inputs, not in
    # pipeline parameters, so start_run takes it as a task input)
    default_workspace = cluster.workspace + ("/refresh" if refresh else "") if cluster else ""
    distill_parallelism = cluster.distill_parallelism if cluster else 4

    @dsl.pipeline(name=name, description="Contract data to registered per-surface students"
                  + (", continuing the champion teacher on the newest days." if refresh else "."))
    def gem_pipeline(workspace: str = default_workspace, run_id: str = "", tracking_root: str = "",
                     data: str = "", sim_preset: str = "small", features_preset: str = "pipeline",
                     train_preset: str = "pipeline", student_preset: str = "pipeline",
                     surfaces: list = [],  # noqa: B006 (compiled, never mutated)
                     # 0 days: the window is chosen by window_evidence (gem.protocol.Evidence fields)
                     student_days: int = 1 if refresh else 0, holdout_days: int = 1 if refresh else 0,
                     teacher_days: int = 1 if refresh else 0,
                     # the students also train on the teacher window's last N days (-1: its every
                     # day, gem.protocol.ALL_TEACHER_DAYS; 0: only on their own window)
                     student_overlap_days: int = -1,
                     # late or corrected days since the last committed run: refuse | backfill
                     # ("": not checked; the local refresh checks them in its state.json)
                     late_data: str = "refuse" if refresh else "",
                     window_evidence: dict = {},  # noqa: B006 (compiled, never mutated)
                     gate_settings: dict = {},  # noqa: B006 - GateConfig fields (gem_app/promotion.py)
                     pretrain_launcher: str = cluster.pretrain_launcher if cluster else "local",
                     trainjob_namespace: str = ""):
        started = configure_task(start_run(
            pipeline_run_id=run_id, kfp_run_id=dsl.PIPELINE_JOB_ID_PLACEHOLDER, tracking_root=tracking_root,
            workspace=workspace, data=data,
            params={"pipeline": name, "sim_preset": sim_preset, "train_preset": train_preset,
                    "student_preset": student_preset, "features_preset": features_preset}), cluster)
        ctx, tracking, code = started.outputs["ctx"], started.outputs["tracking"], started.outputs["code_version"]
        configs = {k: started.outputs[f"{k}_config"] for k in ("sim", "features", "train", "students")}
        ingested = configure_task(ingest(
            tracking=tracking, data=data, data_digest=started.outputs["data_digest"], sim_preset=sim_preset,
            sim_config=configs["sim"], code_version=code, workspace=workspace, student_days=student_days,
            holdout_days=holdout_days, teacher_days=teacher_days, surfaces=surfaces,
            window_evidence=window_evidence, late_data=late_data, student_overlap_days=student_overlap_days), cluster)
        init_from, teacher_vocab, teacher_vocab_digest = "", "", ""
        if refresh:
            champion = configure_task(resolve_champion(ctx=ctx), cluster)
            init_from, teacher_vocab = champion.outputs["init_from"], champion.outputs["vocab_from"]
            teacher_vocab_digest = champion.outputs["init_from"]  # a registry version names its vocabularies
        clean, clean_digest = ingested.outputs["clean"], ingested.outputs["clean_digest"]
        start, teacher_end = ingested.outputs["start"], ingested.outputs["teacher_end"]
        student_end, end = ingested.outputs["student_end"], ingested.outputs["end"]
        window = dict(tracking=tracking, data=clean, data_digest=clean_digest, preset=features_preset,
                      features_config=configs["features"], code_version=code)
        teacher_feats = features_window(**window, out=ingested.outputs["teacher_features"], start=start,
                                        end=teacher_end, vocab_from=teacher_vocab, vocab_digest=teacher_vocab_digest,
                                        name="teacher")
        teacher_path, teacher_digest = teacher_feats.outputs["path"], teacher_feats.outputs["digest"]
        student_feats = features_window(**window, out=ingested.outputs["student_features"],
                                        start=ingested.outputs["student_start"],
                                        end=student_end, vocab_from=teacher_path, vocab_digest=teacher_digest,
                                        name="student")
        holdout_feats = features_window(**window, out=ingested.outputs["holdout_features"], start=student_end,
                                        end=end, vocab_from=teacher_path, vocab_digest=teacher_digest,
                                        name="holdout")
        repo = configure_task(feast_materialize(tracking=tracking, data=clean, data_digest=clean_digest,
                                                repo_dir=f"{workspace}/feast", end=end, code_version=code), cluster)
        teacher = configure_task(train(
            tracking=tracking, features=teacher_path, features_digest=teacher_digest,
            eval_features=holdout_feats.outputs["path"], eval_digest=holdout_feats.outputs["digest"],
            out=f"{workspace}/teacher", preset=train_preset, train_config=configs["train"], init_from=init_from,
            launcher=pretrain_launcher, trainjob_namespace=trainjob_namespace, code_version=code), cluster)
        teacher_gate = configure_task(gate_teacher(
            tracking=tracking, trained=teacher.outputs["result"], eval_features=holdout_feats.outputs["path"],
            eval_digest=holdout_feats.outputs["digest"], gate=gate_settings, code_version=code), cluster)
        generated = configure_task(knowledge(
            tracking=tracking, teacher_uri=teacher.outputs["model_uri"],
            features=[student_feats.outputs["path"], holdout_feats.outputs["path"]],
            features_digests=[student_feats.outputs["digest"], holdout_feats.outputs["digest"]],
            out_root=f"{workspace}/knowledge", feast_repo=repo.output, code_version=code,
            lead_from=teacher_path, lead_digest=teacher_digest), cluster)
        jobs = configure_task(distill_plan(
            tracking=tracking, surfaces=surfaces, available=ingested.outputs["surfaces"],
            train_features=student_feats.outputs["path"], train_digest=student_feats.outputs["digest"],
            eval_features=holdout_feats.outputs["path"], eval_digest=holdout_feats.outputs["digest"],
            feast_repo=repo.output, teacher_uri=teacher.outputs["model_uri"],
            teacher_version=generated.outputs["Output"],
            out=f"{workspace}/students", preset=student_preset, students_config=configs["students"],
            code_version=code, gate=gate_settings, teacher_gate=teacher_gate.output, fresh_from=teacher_end), cluster)
        # the loop body reads only its job (kfp.local resolves outer task outputs wrongly in loops)
        with dsl.ParallelFor(jobs.output, parallelism=distill_parallelism) as job:
            distilled = configure_task(distill(job=job), cluster)
            decision = configure_task(gate(job=job, challenger=distilled.outputs["Output"]), cluster)
        # the run's one commit: after the teacher's gate and every surface's
        committed = configure_task(promote(ctx=ctx, teacher_gate=teacher_gate.output,
                                           gated=dsl.Collected(decision.outputs["Output"]), data=data,
                                           data_days=ingested.outputs["days"]), cluster)
        configure_task(summary(ctx=ctx, teacher=teacher.outputs["result"], promoted=committed.output,
                               workspace=workspace), cluster)

    return gem_pipeline
