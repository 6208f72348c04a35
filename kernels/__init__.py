"""Custom kernels for GEM. Public API: `jagged_attention` and its `Backend` choice."""

from kernels.attention import jagged_attention
from kernels.attention_spec import register_activation
from kernels.common import BACKEND_ENV_VAR, Backend

__all__ = ["BACKEND_ENV_VAR", "Backend", "jagged_attention", "register_activation"]
