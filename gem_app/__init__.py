"""The application over the GEM library: the CLI (`python -m gem`), one stage function per
pipeline step (stages/), the Kubeflow components over them (components/), the pipelines
(pipelines/), continuous refresh (refresh/), the promotion gate and the pretraining
launchers. Nothing in gem/, students/ or kernels/ imports it (tests/test_layers.py)."""
