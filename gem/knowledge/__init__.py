"""Knowledge generation: a frozen GEM teacher's predictions and embeddings, offline as
Parquet and in Feast (feature_repo/knowledge.py) for point-in-time retrieval.

    manifest = generate_knowledge("models:/gem-teacher@prod", "features/", "knowledge/")
    register_knowledge(repo, ["knowledge/"])
    frame = historical_knowledge(repo, example_keys("features/"))
"""

from gem.knowledge.config import KnowledgeConfig

__all__ = ["KnowledgeConfig", "Teacher", "example_keys", "generate_knowledge", "historical_knowledge",
           "load_teacher", "prepare_repo", "read_knowledge_manifest", "register_knowledge", "select_shards"]

_LAZY = {
    "Teacher": "gem.knowledge.teacher", "load_teacher": "gem.knowledge.teacher",
    "generate_knowledge": "gem.knowledge.generate", "read_knowledge_manifest": "gem.knowledge.generate",
    "historical_knowledge": "gem.knowledge.feast", "prepare_repo": "gem.knowledge.feast",
    "register_knowledge": "gem.knowledge.feast",
    "example_keys": "gem.knowledge.windows", "select_shards": "gem.knowledge.windows",
}


def __getattr__(name: str):
    # lazy: importing the config must not pull in torch, Feast or MLflow
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'gem.knowledge' has no attribute {name!r}")
