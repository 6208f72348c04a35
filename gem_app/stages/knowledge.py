"""knowledge: run the frozen teacher over each downstream window, write its predictions
and embeddings as Parquet, and register them in the Feast repo."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from gem import tracking
from gem.utils.progress import figure
from gem_app.stages.context import RunContext, StageResult, fault_point, log_model_input, tracked
from gem_app.stages.features import log_features_input

KNOWLEDGE_VIEWS = "teacher_predictions,teacher_user_embedding,teacher_item_embedding"


@dataclass(kw_only=True)
class KnowledgeResult(StageResult):
    knowledge: list[str]
    teacher_version: str
    examples: int


def knowledge(teacher_uri: str, features: list[str], out_root: str, feast_repo: str, ctx: RunContext,
              preset: str = "default", lead_from: str = "") -> KnowledgeResult:
    """``lead_from``: the window before the first of ``features`` (the teacher's); its last
    ``knowledge.lead_days`` are covered too, as the knowledge lead."""
    import mlflow

    from gem.config import load_config, run_params
    from gem.knowledge.config import KnowledgeConfig
    from gem.knowledge.feast import register_knowledge
    from gem.knowledge.generate import generate_knowledge
    from gem.knowledge.teacher import load_teacher
    from gem.training.threads import thread_tuner

    cfg = load_config(KnowledgeConfig, section="knowledge", preset=preset)
    tracking_uri = ctx.configure()
    teacher = load_teacher(teacher_uri, tracking_uri)
    outputs, examples = [], 0
    # one for every window: the threads are tried once, not per window, and checked again
    # every ~8 batches (a window is 6-12 of them in the demo) as the machine's load changes.
    # The first round waits 8 batches: a fresh process's first forwards run 2 threads at half
    # their later speed (the heap still grows; 2.8-3.3 against 1.4 us a token on the demo),
    # so a round on batches 2-5 took 1 thread in each of three demo pipelines, ~6 s at 1.4x.
    tuner = thread_tuner(cfg.threads, recheck_every=8, warmup_steps=8)
    with tracked(ctx, "knowledge", tags={tracking.TAG_TEACHER_VERSION: teacher.version,
                                         tracking.TAG_FEATURE_VIEWS: KNOWLEDGE_VIEWS}):
        windows = _windows(features, lead_from, cfg.lead_days)
        mlflow.log_params({**run_params(cfg), "teacher_version": teacher.version,
                           "windows": ",".join(name for _, name, _, _ in windows)})
        log_model_input(teacher.version)
        for features_dir, name, start, end in windows:
            log_features_input(features_dir, "scoring" if name != "lead" else "scoring (lead)")
            out = Path(out_root) / name
            manifest = generate_knowledge(teacher, features_dir, out, cfg, start=start, end=end, tuner=tuner)
            outputs.append(str(out))
            examples += manifest["counts"]["examples"]
            mlflow.log_metric(f"knowledge/{name}/examples_per_s", manifest["examples_per_s"])
            mlflow.log_metric(f"knowledge/{name}/examples", manifest["counts"]["examples"])
            fault_point("knowledge:window-written")  # killed mid-generation: some windows written, none registered
        register_knowledge(feast_repo, outputs)
    figure("examples", examples)
    return KnowledgeResult(knowledge=outputs, teacher_version=teacher.version, examples=examples)


def _windows(features: list[str], lead_from: str, lead_days: int) -> list[tuple[str, str, str | None, str | None]]:
    """(features dir, output name, start, end) per window the knowledge covers."""
    import datetime as dt

    from gem.data.contract import parse_utc
    from gem.features.loader import read_manifest

    windows: list[tuple[str, str, str | None, str | None]] = [(f, Path(f).name, None, None) for f in features]
    if lead_from and lead_days:  # up to the first downstream window (earlier than the teacher's end: overlapped)
        teacher = read_manifest(lead_from)["window"]
        ends = [teacher["end"], *(read_manifest(f)["window"]["start"] for f in features[:1])]
        end = min(parse_utc(e) for e in ends)
        if end <= parse_utc(teacher["start"]):
            return windows  # the students' window starts with the teacher's: nothing before it to lead with
        windows.insert(0, (lead_from, "lead", (end - dt.timedelta(days=lead_days)).isoformat(), end.isoformat()))
    return windows
