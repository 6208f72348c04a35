"""One function per pipeline step, named as its component and its CLI verb:
ingest, features_plan / features_shard / features_finalize, feast_materialize, train,
knowledge, distill, gate, promote, summary. The kfp components in gem_app/components are
thin typed wrappers over these; the refresh cycle runs them through the same pipeline.
What they share (run context, MLflow runs, content-keyed reuse) is in ``context``."""
