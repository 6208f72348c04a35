"""knowledge: run the frozen teacher over each downstream window, write its predictions
and embeddings as Parquet, and register them in the Feast repo."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from gem import tracking
from gem.utils.progress import figure
from gem_app.stages.context import RunContext, StageResult, tracked


@dataclass(kw_only=True)
class KnowledgeResult(StageResult):
    knowledge: list[str]
    teacher_version: str
    examples: int


def knowledge(teacher_uri: str, features: list[str], out_root: str, feast_repo: str, ctx: RunContext,
              preset: str = "default") -> KnowledgeResult:
    import mlflow

    from gem.config import load_config
    from gem.knowledge.config import KnowledgeConfig
    from gem.knowledge.feast import register_knowledge
    from gem.knowledge.generate import generate_knowledge
    from gem.knowledge.teacher import load_teacher

    cfg = load_config(KnowledgeConfig, section="knowledge", preset=preset)
    tracking_uri = ctx.configure()
    teacher = load_teacher(teacher_uri, tracking_uri)
    outputs, examples = [], 0
    with tracked(ctx, "knowledge", tags={tracking.TAG_TEACHER_VERSION: teacher.version}):
        for features_dir in features:
            name = Path(features_dir).name
            out = Path(out_root) / name
            manifest = generate_knowledge(teacher, features_dir, out, cfg)
            outputs.append(str(out))
            examples += manifest["counts"]["examples"]
            mlflow.log_metric(f"knowledge/{name}/examples_per_s", manifest["examples_per_s"])
        register_knowledge(feast_repo, outputs)
        mlflow.set_tag(tracking.TAG_FEATURE_VIEWS, "teacher_predictions,teacher_user_embedding,teacher_item_embedding")
    figure("examples", examples)
    return KnowledgeResult(knowledge=outputs, teacher_version=teacher.version, examples=examples)
