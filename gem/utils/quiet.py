"""Third-party chatter silenced where it starts (imported by gem/__init__.py, before any
of those libraries loads): a progress line or a step's log should hold our messages."""

from __future__ import annotations

import logging

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
