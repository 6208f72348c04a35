"""GEM, the library: the data contract (data/), point-in-time sequence features
(features/), the model (model/), its training (training/), knowledge generation
(knowledge/), the registry's names (registry.py) and the time protocol (protocol.py).
The application that drives it is gem_app; `python -m gem` is its entry point."""

__version__ = "0.1.0"

from gem.utils.quiet import quiet_third_party, skip_feast_typechecks_on_import  # noqa: E402

quiet_third_party()
skip_feast_typechecks_on_import()
