"""ModelConfig: every size of the GEM model and of the DLRM baseline.

Presets live in ``gem/configs/model/<name>.yaml`` (tiny, small, base, large) and are
loaded with ``load_config(ModelConfig, section="model", preset=...)``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

ARCHS = ("gem", "dlrm")
ATTENTION_FORMS = ("softmax", "gdpa")
# kernels' backends (gem/model/attention.py); the last three are older names kept working:
# kernels = auto, loop = pytorch, padded = bucketed.
ATTENTION_BACKENDS = ("auto", "pytorch", "bucketed", "triton", "kernels", "loop", "padded")


@dataclass(kw_only=True)
class ModelConfig:
    arch: str = "gem"
    embedding_dim: int = 16
    # Non-sequence interaction (Wukong): each layer emits fm_tokens + lcb_tokens tokens.
    wukong_layers: int = 1  # Wukong layers per interaction block
    fm_tokens: int = 4
    lcb_tokens: int = 4
    fm_rank: int = 4  # k of the optimized FM X (X^T Y)
    fm_mlp_hidden: int = 64
    # Sequence (InterFormer): layers interleave sequence, interaction and cross blocks.
    num_layers: int = 1
    num_heads: int = 2
    head_dim: int = 8
    attention_form: str = "softmax"
    attention_backend: str = "auto"
    causal: bool = False
    ffn_hidden: int = 32
    num_cls_tokens: int = 1
    num_pool_tokens: int = 1
    num_recent_tokens: int = 2
    # one more summary token: the history attended by the target item (its embedding
    # projected to a query per example), as DIN's target attention
    target_attention: bool = False
    # Pyramid: history tokens kept (most recent) at the input of each layer; [] keeps all.
    pyramid: list[int] = field(default_factory=list)
    age_buckets: int = 32
    # Shared trunk, per-surface towers, two-tower embeddings for encode().
    trunk_hidden: list[int] = field(default_factory=lambda: [64])
    tower_hidden: list[int] = field(default_factory=lambda: [32])
    encode_dim: int = 16
    dropout: float = 0.0
    # a first-order weight per id of every sparse key, summed into the click logit (the
    # linear part of a factorization machine: per-user and per-item biases)
    first_order: bool = False
    # point-in-time counters (dense features cnt_*): counter_norm batch-normalises each key
    # kind's inputs before its token's MLP (off: it scaled up features whose spread was
    # small in the train window, and a later window's drift with them; docs/model-quality.md);
    # counter_wide: also a linear term of them in the click logit
    counter_norm: bool = False
    counter_wide: bool = False
    # Sparse keys treated as item-side in encode(); None: guessed from the key names.
    item_features: list[str] | None = None
    # DLRM baseline only.
    dlrm_over_hidden: list[int] = field(default_factory=lambda: [128, 64])

    def validate(self) -> "ModelConfig":
        if self.arch not in ARCHS:
            raise ValueError(f"arch={self.arch!r} must be one of {ARCHS}")
        if self.attention_form not in ATTENTION_FORMS:
            raise ValueError(f"attention_form={self.attention_form!r} must be one of {ATTENTION_FORMS}")
        if self.attention_backend not in ATTENTION_BACKENDS:
            raise ValueError(
                f"attention_backend={self.attention_backend!r} must be one of {ATTENTION_BACKENDS}"
            )
        positive = {
            "embedding_dim": self.embedding_dim, "fm_rank": self.fm_rank,
            "num_heads": self.num_heads, "head_dim": self.head_dim,
            "fm_tokens + lcb_tokens": self.fm_tokens + self.lcb_tokens,
            "encode_dim": self.encode_dim, "age_buckets": self.age_buckets,
        }
        for name, value in positive.items():
            if value <= 0:
                raise ValueError(f"{name}={value} must be > 0")
        if self.num_layers < 1 or self.wukong_layers < 1:
            raise ValueError(
                f"num_layers={self.num_layers} and wukong_layers={self.wukong_layers} must be >= 1"
            )
        if self.pyramid and len(self.pyramid) != self.num_layers:
            raise ValueError(
                f"pyramid={self.pyramid} must list one token budget per layer "
                f"(num_layers={self.num_layers}) or be empty"
            )
        if any(b < max(self.num_recent_tokens, 1) for b in self.pyramid):
            raise ValueError(
                f"pyramid={self.pyramid}: each budget must be >= num_recent_tokens "
                f"({self.num_recent_tokens}) and >= 1"
            )
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout={self.dropout} must be in [0, 1)")
        return self
