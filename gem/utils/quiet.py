"""Third-party chatter silenced where it starts (imported by gem/__init__.py, before any
of those libraries loads): a progress line or a step's log should hold our messages."""

from __future__ import annotations

import logging
import os
import sys

_FBGEMM = ("Successfully loaded", "Registering ")


class _DropFbgemmLoads(logging.Filter):
    """fbgemm_gpu logs one INFO line per shared library it loads, on the root logger."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not ("fbgemm_gpu" in record.pathname and str(record.msg).startswith(_FBGEMM))


def quiet_third_party() -> None:
    root = logging.getLogger()
    if not any(isinstance(f, _DropFbgemmLoads) for f in root.filters):
        root.addFilter(_DropFbgemmLoads())
    for name in ("torchrec.distributed.planner.stats", "feast.infra.registry.registry",
                 "feast.infra.registry.caching_registry"):
        logging.getLogger(name).setLevel(logging.WARNING)


# Feast decorates its classes with typeguard's @typechecked, which re-parses and
# recompiles every method from source when feast is imported: ~5 s of each process
# that loads Feast (measured: `import feast` 11.0 s -> 6.3 s without it). Those checks
# are debug aids (typeguard itself turns them off under `python -O`); feast's own
# validation stays. GEM_FEAST_TYPECHECKS=1 keeps them (and feast's eager torch import).
class _FeastTypecheckHook:
    """A meta-path finder that acts once, just before ``feast`` is first imported."""

    def find_spec(self, name, path=None, target=None):
        if name == "feast":
            sys.meta_path.remove(self)
            _skip_feast_typechecks()
            sys.modules.setdefault("feast.torch_wrapper", _lazy_torch_wrapper())
        return None


def _lazy_torch_wrapper():
    """feast.torch_wrapper imports torch when feast loads (2.5-5 s here), only for the
    ``to_tensor`` conversions GEM never calls: the same API, importing torch on first use."""
    import types

    module = types.ModuleType("feast.torch_wrapper", "feast's torch accessor, importing torch on first use (gem)")

    def get_torch():
        import torch

        return torch

    module.get_torch = get_torch
    return module


def _skip_feast_typechecks() -> None:
    import typeguard

    original = typeguard.typechecked
    if getattr(original, "_gem_skips_feast", False):
        return

    def typechecked(target=None, **options):
        if target is None:
            return lambda t: t if _from_feast(t) else original(t, **options)
        return target if _from_feast(target) else original(target, **options)

    typechecked._gem_skips_feast = True
    typeguard.typechecked = typechecked


def _from_feast(target) -> bool:
    return str(getattr(target, "__module__", "")).split(".")[0] == "feast"


def skip_feast_typechecks_on_import() -> None:
    if os.environ.get("GEM_FEAST_TYPECHECKS") == "1" or "feast" in sys.modules:
        return
    if not any(isinstance(f, _FeastTypecheckHook) for f in sys.meta_path):
        sys.meta_path.insert(0, _FeastTypecheckHook())
