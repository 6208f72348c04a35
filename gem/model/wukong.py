"""Wukong-style interaction stack over non-sequence embedding tokens.

Shapes: B batch, n_in input tokens, D embedding dim, k FM rank,
n_f FM-block tokens, n_l linear-compress tokens, n_out = n_f + n_l.

One layer: ``LN(concat(FMB(X), LCB(X)) + residual(X))`` where
- FMB: optimized FM ``X (X^T Y)`` with a learned Y (n_in, k) -> (B, n_in, k)
  -> flatten -> LayerNorm -> MLP -> (B, n_f, D);
- LCB: a linear map over the token axis -> (B, n_l, D);
- residual: identity when n_in == n_out, else a linear map over the token axis.

The layer runs every map over the token axis (the FM's Y, the LCB, a learned residual)
as one batched matmul on x, with the LCB folded into the residual's rows (a sum of two
linear maps is one): the same function as the three separate products, without their
transposed copies of x.
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

    def forward(self, x_BND: torch.Tensor, xty_BDK: torch.Tensor | None = None) -> torch.Tensor:
        """``xty_BDK``: X^T Y when the caller computed it already."""
        if xty_BDK is None:
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
        self.fm_tokens, self.rank = fm_tokens, rank
        self.fmb = FactorizationMachineBlock(num_in, fm_tokens, dim, rank, hidden, dropout) if fm_tokens else None
        self.lcb = LinearCompressBlock(num_in, lcb_tokens) if lcb_tokens else None
        self.residual = None if num_in == num_out else LinearCompressBlock(num_in, num_out)
        self.norm = nn.LayerNorm(dim)

    def token_maps(self) -> torch.Tensor:
        """(rows, n_in): Y^T (k rows, when an FM block), then the output tokens' maps: the
        learned residual with the LCB added to its last n_l rows, or the LCB alone when
        the residual is the identity (added afterwards: folding it in would be fake work)."""
        maps = [self.fmb.proj_Y.t()] if self.fmb is not None else []
        if self.residual is None:
            maps += [self.lcb.weight] if self.lcb is not None else []
        elif self.lcb is None:
            maps.append(self.residual.weight)
        else:
            res = self.residual.weight
            maps += [res[:self.fm_tokens], res[self.fm_tokens:] + self.lcb.weight]
        return torch.cat(maps)

    def forward(self, x_BND: torch.Tensor) -> torch.Tensor:
        maps_RN = self.token_maps()
        # Batched over examples, so x is read in place (a (B*D, n_in) matmul needs a
        # transposed copy of x, and its output another): half the time, forward + backward.
        mixed_BRD = torch.bmm(maps_RN.expand(x_BND.shape[0], -1, -1), x_BND)
        # split, not slicing: a slice's backward zero-fills a full-size gradient per slice.
        k = self.rank if self.fmb is not None else 0
        ytx_BKD, tokens_BTD = mixed_BRD.split([k, mixed_BRD.shape[1] - k], dim=1)
        fm_BFD = self.fmb(x_BND, ytx_BKD.transpose(1, 2)) if self.fmb is not None else None
        if self.residual is None:  # tokens: the LCB's
            parts = [p for p in (fm_BFD, tokens_BTD) if p is not None]
            out = x_BND + (torch.cat(parts, dim=1) if len(parts) > 1 else parts[0])
        elif fm_BFD is None:  # tokens: the residual's (+ LCB)
            out = tokens_BTD
        else:
            out = tokens_BTD.clone(memory_format=torch.contiguous_format)
            out[:, :self.fm_tokens] += fm_BFD
        return self.norm(out)


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
