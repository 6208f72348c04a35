"""InterFormer-style layers: sequence block, interaction block and gated cross block.

Shapes: B batch, N history tokens (jagged, offsets (B+1,)), D dim,
n non-sequence tokens, s = C + P + R sequence-summary tokens
(C CLS tokens kept in front of every sequence, P attention-pooled, R most recent).

One ``InterFormerLayer``:
1. sequence block: personalized FFN (FiLM-conditioned on the non-sequence summary)
   then multi-head jagged self-attention, both pre-LN residual;
2. summary: (B, s, D) from CLS tokens, attention pooling and the most recent tokens;
3. interaction block: Wukong stack over concat(non-sequence tokens, summary);
4. cross block: gated exchange of the two summaries (sequence -> non-sequence tokens,
   non-sequence -> CLS tokens);
5. pyramid: keep only the most recent tokens for the next layer.
"""

from __future__ import annotations

import torch
from torch import nn

from gem.model.attention import JaggedMultiHeadAttention
from gem.model.config import ModelConfig
from gem.model.jagged import attention_pool, gather_prefix, gather_recent, keep_recent, segment_ids, target_pool
from gem.model.wukong import WukongArch
from kernels.film_ffn import film_ffn
from kernels.film_silu import ROWS as FILM_ROWS
from kernels.film_silu import film_silu


class PersonalizedFFN(nn.Module):
    """(N, D) tokens + (B, D) context -> (N, D): FFN whose hidden units are scaled and
    shifted per example by the non-sequence context."""

    def __init__(self, dim: int, hidden: int, dropout: float) -> None:
        super().__init__()
        self.film_rows = FILM_ROWS  # tokens per block of film_silu; 0: the reference (one pass per op)
        self.film_native = True  # film_silu's C kernel where it runs (False: the blocks; A/B runs)
        self.fused = True  # the whole FFN in C token blocks where it runs (kernels/film_ffn.py; False: A/B runs)
        self.up = nn.Linear(dim, hidden)
        self.film = nn.Linear(dim, 2 * hidden)
        self.down = nn.Linear(hidden, dim)
        self.drop = nn.Dropout(dropout)
        nn.init.zeros_(self.film.weight)
        nn.init.zeros_(self.film.bias)

    def forward(self, x_ND: torch.Tensor, ctx_BD: torch.Tensor, seg_N: torch.Tensor,
                offsets: torch.Tensor | None = None) -> torch.Tensor:
        if (self.fused and self.film_native and self.film_rows > 0 and offsets is not None
                and not (self.training and self.drop.p > 0)):
            return film_ffn(x_ND, self.film(ctx_BD), offsets, seg_N, self.up, self.down)
        # silu(up * (1 + scale) + shift) in one pass each way (kernels/film_silu.py: its C
        # kernel, else token blocks whose (N, H) intermediates stay in cache)
        act = film_silu(self.up(x_ND), self.film(ctx_BD), seg_N, rows=self.film_rows, native=self.film_native,
                        offsets=offsets)
        return self.down(self.drop(act))


class SequenceBlock(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        dim = cfg.embedding_dim
        self.ffn_norm, self.attn_norm = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.ffn = PersonalizedFFN(dim, cfg.ffn_hidden, cfg.dropout)
        self.attn = JaggedMultiHeadAttention(
            dim, cfg.num_heads, cfg.head_dim, form=cfg.attention_form, causal=cfg.causal,
            backend=cfg.attention_backend,
        )

    def forward(self, seq_ND, offsets, ctx_BD, max_seq_len: int) -> torch.Tensor:
        seg_N = segment_ids(offsets, seq_ND.shape[0])
        seq_ND = seq_ND + self.ffn(self.ffn_norm(seq_ND), ctx_BD, seg_N, offsets)
        return seq_ND + self.attn(self.attn_norm(seq_ND), offsets, max_seq_len)


class SequenceSummary(nn.Module):
    """(N, D) jagged -> (B, C + P + R, D)."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.num_cls, self.num_recent = cfg.num_cls_tokens, cfg.num_recent_tokens
        dim = cfg.embedding_dim
        self.pool_queries = nn.Parameter(torch.randn(cfg.num_pool_tokens, dim) * 0.02) if cfg.num_pool_tokens else None
        self.target_query = nn.Linear(dim, dim) if cfg.target_attention else None
        self.norm = nn.LayerNorm(dim)

    @property
    def num_tokens(self) -> int:
        return (self.num_cls + self.num_recent + (0 if self.pool_queries is None else self.pool_queries.shape[0])
                + (self.target_query is not None))

    def forward(self, seq_ND: torch.Tensor, offsets: torch.Tensor, target_BD: torch.Tensor | None = None
                ) -> torch.Tensor:
        parts = []
        if self.target_query is not None:  # the history's prefix (CLS) tokens take part, as in the pooling
            parts.append(target_pool(seq_ND, offsets, self.target_query(target_BD))[:, None, :])
        if self.num_cls:
            parts.append(gather_prefix(seq_ND, offsets, self.num_cls))
        if self.pool_queries is not None:
            parts.append(attention_pool(seq_ND, offsets, self.pool_queries))
        if self.num_recent:
            parts.append(gather_recent(seq_ND, offsets, self.num_cls, self.num_recent))
        return self.norm(torch.cat(parts, dim=1))


class GatedCrossBlock(nn.Module):
    """Exchanges the two summaries: returns updated non-sequence tokens (B, n, D) and a
    (B, C, D) update for the CLS tokens."""

    def __init__(self, num_x_tokens: int, num_cls: int, dim: int) -> None:
        super().__init__()
        self.num_cls = num_cls
        self.x_summary = nn.Linear(num_x_tokens * dim, dim)
        self.gate_to_x = nn.Linear(2 * dim, dim)
        self.seq_to_x = nn.Linear(dim, dim)
        self.gate_to_seq = nn.Linear(2 * dim, dim) if num_cls else None
        self.x_to_seq = nn.Linear(dim, num_cls * dim) if num_cls else None

    def forward(self, x_BnD: torch.Tensor, summary_BsD: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        x_BD = self.x_summary(x_BnD.flatten(1))
        s_BD = summary_BsD.mean(dim=1)
        both = torch.cat([x_BD, s_BD], dim=-1)
        x_BnD = x_BnD + (torch.sigmoid(self.gate_to_x(both)) * self.seq_to_x(s_BD))[:, None, :]
        if self.x_to_seq is None:
            return x_BnD, None
        gated_BD = torch.sigmoid(self.gate_to_seq(both)) * x_BD
        return x_BnD, self.x_to_seq(gated_BD).view(x_BD.shape[0], self.num_cls, -1)


class InterFormerLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, num_x_tokens: int, last: bool = False) -> None:
        super().__init__()
        dim = cfg.embedding_dim
        # The last layer's sequence output is unused: no CLS update (DDP needs every
        # parameter to get a gradient).
        self.num_cls = 0 if last else cfg.num_cls_tokens
        self.context = nn.Sequential(nn.Linear(num_x_tokens * dim, dim), nn.LayerNorm(dim))
        self.sequence = SequenceBlock(cfg)
        self.summary = SequenceSummary(cfg)
        self.interaction = WukongArch(
            num_x_tokens + self.summary.num_tokens, num_layers=cfg.wukong_layers,
            fm_tokens=cfg.fm_tokens, lcb_tokens=cfg.lcb_tokens, dim=dim, rank=cfg.fm_rank,
            hidden=cfg.fm_mlp_hidden, dropout=cfg.dropout,
        )
        self.cross = GatedCrossBlock(self.interaction.num_out, self.num_cls, dim)

    def forward(self, x_BnD, seq_ND, offsets, max_seq_len: int, target_BD=None):
        """Returns (x (B, n_out, D), seq (N, D), summary (B, s, D)); ``target_BD``: the
        target item's input embedding (for the target-attention token)."""
        seq_ND = self.sequence(seq_ND, offsets, self.context(x_BnD.flatten(1)), max_seq_len)
        summary_BsD = self.summary(seq_ND, offsets, target_BD)
        x_BnD = self.interaction(torch.cat([x_BnD, summary_BsD], dim=1))
        x_BnD, cls_update = self.cross(x_BnD, summary_BsD)
        if cls_update is not None:
            idx = (offsets[:-1, None] + torch.arange(self.num_cls, device=offsets.device)[None, :]).reshape(-1)
            seq_ND = seq_ND.index_add(0, idx, cls_update.reshape(-1, seq_ND.shape[1]).to(seq_ND.dtype))
        return x_BnD, seq_ND, summary_BsD


def apply_pyramid(seq_ND, offsets, num_cls: int, budget: int | None):
    if budget is None:
        return seq_ND, offsets
    return keep_recent(seq_ND, offsets, num_cls, budget)
