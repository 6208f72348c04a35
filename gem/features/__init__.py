"""Features stage: point-in-time sequence features, their loader, and the Feast repo.

Public API (the model team codes against these names): ``FeaturesConfig``,
``build_features`` (gem.features.build), ``FeatureLoader`` and ``load_feature_spec``
(gem.features.loader). Docs: docs/features.md.
"""

from gem.features.config import FeaturesConfig

__all__ = ["FeaturesConfig", "build_features", "FeatureLoader", "load_feature_spec"]


def __getattr__(name: str):
    # lazy: importing the config must not pull in Feast, duckdb or torch
    if name == "build_features":
        from gem.features.build import build_features
        return build_features
    if name in ("FeatureLoader", "load_feature_spec"):
        from gem.features import loader
        return getattr(loader, name)
    raise AttributeError(f"module 'gem.features' has no attribute {name!r}")
