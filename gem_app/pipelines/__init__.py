"""Kubeflow pipelines: ``gem_pipeline`` (data to registered students) and
``refresh_pipeline`` (new days -> GEM continued from the champion -> knowledge ->
students -> gate -> promotion). ``compile.py`` writes their IR YAML with cluster
settings; ``local.py`` runs them through kfp.local in this environment."""
