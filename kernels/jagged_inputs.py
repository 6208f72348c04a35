"""Random jagged inputs for tests and benchmarks (not used by the ops themselves)."""

from __future__ import annotations

import math

import torch


def long_tailed_lengths(batch: int, mean: float, max_len: int, sigma: float,
                        generator: torch.Generator) -> torch.Tensor:
    """(batch,) int64 log-normal lengths with about this mean, clipped to [1, max_len];
    the first sequence is max_len long so the batch max (and padding) is fixed."""
    mu = math.log(mean) - sigma**2 / 2
    normal = torch.randn(batch, generator=generator, dtype=torch.float64)
    lengths = torch.exp(mu + sigma * normal).round().clamp(1, max_len).to(torch.int64)
    lengths[0] = max_len
    return lengths


def offsets_from_lengths(lengths: torch.Tensor) -> torch.Tensor:
    """(B,) lengths -> (B+1,) int64 offsets."""
    return torch.cat([lengths.new_zeros(1), lengths.cumsum(0)]).to(torch.int64)


def padding_fraction(lengths: torch.Tensor) -> float:
    """Share of a (B, max length) padded batch that is padding."""
    if lengths.numel() == 0 or int(lengths.max()) == 0:
        return 0.0
    return 1.0 - float(lengths.sum()) / (lengths.numel() * int(lengths.max()))


def random_qkv(num_tokens: int, num_heads: int, dim: int, dtype: torch.dtype,
               generator: torch.Generator, value_dim: int | None = None
               ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q, k: (T, H, D), v: (T, H, Dv), standard normal, in `dtype`."""
    def draw(d: int) -> torch.Tensor:
        return torch.randn(num_tokens, num_heads, d, generator=generator).to(dtype)

    return draw(dim), draw(dim), draw(value_dim or dim)
