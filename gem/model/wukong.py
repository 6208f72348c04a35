"""Wukong-style interaction stack over non-sequence embedding tokens.

Shapes: B batch, n_in input tokens, D embedding dim, k FM rank,
n_f FM-block tokens, n_l linear-compress tokens, n_out = n_f + n_l.

One layer: ``LN(concat(FMB(X), LCB(X)) + residual(X))`` where
- FMB: optimized FM ``X (X^T Y)`` with a learned Y (n_in, k) -> (B, n_in, k)
  -> flatten -> LayerNorm -> MLP -> (B, n_f, D);
- LCB: a linear map over the token axis -> (B, n_l, D);
- residual: identity when n_in == n_out, else a linear map over the token axis.
"""

from __future__ import annotations

import torch
from torch import nn


class FactorizationMachineBlock(nn.Module):
    def __init__(self, num_in: int, num_out: int, dim: int, rank: int, hidden: int,
                 dropout: float = 0.0) -> None:
        super().__init__()
        self.num_out, self.dim = num_out, dim
        self.proj_Y = nn.Parameter(torch.randn(num_in, rank) / num_in**0.5)
        self.norm = nn.LayerNorm(num_in * rank)
        self.mlp = nn.Sequential(
            nn.Linear(num_in * rank, hidden), nn.GELU(), nn.Dropout(dropout),
            nn.Linear(hidden, num_out * dim),
        )

    def forward(self, x_BND: torch.Tensor) -> torch.Tensor:
        xty_BDK = torch.matmul(x_BND.transpose(1, 2), self.proj_Y)  # X^T Y
        fm_BNK = torch.bmm(x_BND, xty_BDK)  # X (X^T Y): never forms the n x n X X^T
        out = self.mlp(self.norm(fm_BNK.flatten(1)))
        return out.view(-1, self.num_out, self.dim)


class LinearCompressBlock(nn.Module):
    """(B, n_in, D) -> (B, n_out, D): a learned mix of tokens."""

    def __init__(self, num_in: int, num_out: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(num_out, num_in) / num_in**0.5)

    def forward(self, x_BND: torch.Tensor) -> torch.Tensor:
        return torch.matmul(self.weight, x_BND)


class WukongLayer(nn.Module):
    def __init__(self, num_in: int, fm_tokens: int, lcb_tokens: int, dim: int, rank: int,
                 hidden: int, dropout: float = 0.0) -> None:
        super().__init__()
        num_out = fm_tokens + lcb_tokens
        self.fmb = FactorizationMachineBlock(num_in, fm_tokens, dim, rank, hidden, dropout) if fm_tokens else None
        self.lcb = LinearCompressBlock(num_in, lcb_tokens) if lcb_tokens else None
        self.residual = None if num_in == num_out else LinearCompressBlock(num_in, num_out)
        self.norm = nn.LayerNorm(dim)

    def forward(self, x_BND: torch.Tensor) -> torch.Tensor:
        parts = [block(x_BND) for block in (self.fmb, self.lcb) if block is not None]
        skip = x_BND if self.residual is None else self.residual(x_BND)
        return self.norm(torch.cat(parts, dim=1) + skip)


class WukongArch(nn.Module):
    """A stack of Wukong layers: (B, n_in, D) -> (B, fm_tokens + lcb_tokens, D)."""

    def __init__(self, num_in: int, *, num_layers: int, fm_tokens: int, lcb_tokens: int, dim: int,
                 rank: int, hidden: int, dropout: float = 0.0) -> None:
        super().__init__()
        num_out = fm_tokens + lcb_tokens
        self.layers = nn.ModuleList(
            WukongLayer(num_in if i == 0 else num_out, fm_tokens, lcb_tokens, dim, rank, hidden, dropout)
            for i in range(num_layers)
        )
        self.num_out = num_out

    def forward(self, x_BND: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x_BND = layer(x_BND)
        return x_BND
