"""The decorator every component uses: the project image, no kfp install at run time.

What the component bodies share at run time lives in ``runtime.py`` (kfp's executor
imports a reduced ``kfp.dsl``, without the decorators, so run-time code must not import
this module)."""

from __future__ import annotations

import functools
import os

from kfp import dsl

# The image built from the project's Dockerfile; override at compile time.
BASE_IMAGE = os.environ.get("GEM_IMAGE", "gem:latest")

component = functools.partial(dsl.component, base_image=BASE_IMAGE, install_kfp_package=False)
