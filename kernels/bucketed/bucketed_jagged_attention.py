"""Jagged attention as length-bucketed batched matmuls (the CPU fast path).

Per chunk of similar-length sequences (planning.py): gather q, k, v to (H, n, Lp, D),
then per head group S = Q K^T / sqrt(D) (+ bias), mask, softmax or act(S)/L, O = P V,
and scatter O back to its tokens. The backward recomputes S chunk by chunk instead of
saving the weights, so peak extra memory is one chunk's score buffers whatever the batch.
Softmax without bias, without dropout and with Dv == D (float32 and half types, on CPU)
is "fused": non-causal sequences without targets, windows or contextual tokens, up to
NATIVE_MAX_LEN tokens, run the AVX2 kernel (kernels/avx2) in one call; the rest run torch's
fused CPU flash-attention kernels per chunk, forward and backward. The forward then
returns the per-token log-sum-exp that both fused backwards need.
Padding positions read zeros (never another token), so a non-finite value stays in its
own sequence.
Shape legend: kernels/attention_spec.py (n sequences in a chunk, Lp its padded size).
Half types compute in float32.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

import kernels.avx2.loader as native
import kernels.bucketed.planning as planning
from kernels.attention_spec import (
    ACTIVATIONS,
    Spec,
    allowed_mask,
    bias_radius,
    dropout_keep,
    history_lengths,
    kept_spans,
    relative_position_index,
)
from kernels.bucketed.planning import Chunk, plan_chunks

Tensor = torch.Tensor
FUSED_SOFTMAX = True  # False forces the bmm path everywhere (for comparisons)
# Query rows per block of causal scores in the bmm path (see _Problem.query_blocks).
CAUSAL_QUERY_BLOCK = 128
# The AVX2 kernel takes fused non-causal sequences up to this kept length (None: all);
# longer ones go to torch's flash kernels, which overtake it between 2,048 and 4,096
# tokens (its score blocks then outgrow L2; measured on a 2-core AMD EPYC, 1 and 2
# threads). NATIVE = False leaves everything to the flash kernels.
NATIVE = True
NATIVE_MAX_LEN: int | None = 2048
_FLASH = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
_FLASH_BACKWARD = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward


def native_applies(spec: Spec, q: Tensor, with_targets: bool) -> bool:
    """Whether the AVX2 kernel (kernels/avx2) takes a fused call's short sequences:
    non-causal, no targets, window or contextual tokens."""
    return (NATIVE and not spec.causal and not with_targets and spec.plain_mask
            and native.supports(q))


def uses_fused_softmax(spec: Spec, attn_bias: Tensor | None, q: Tensor, v: Tensor) -> bool:
    """Whether softmax runs through torch's fused CPU kernels (and returns a log-sum-exp).

    Those kernels need Dv == D ("Q/K/V should have the same head size") and have no
    dropout that matches ours; float64 has no fused kernel.
    """
    return (FUSED_SOFTMAX and spec.form == "softmax" and attn_bias is None
            and spec.dropout_p == 0.0 and v.shape[2] == q.shape[2]
            and q.dtype != torch.float64 and q.device.type == "cpu")


@dataclass
class _ChunkMasks:
    """What a chunk's scores need besides q and k, built once for all its heads.

    softmax_fill: (n, Lp, Lp) bool, True where the score becomes -inf (softmax form).
    gdpa_norm: (n, Lp, Lp) allowed / L (gdpa form): mask and normalization in one factor.
    bias_index: (n or 1, Lp, Lp) index into the bias table, or None.
    """

    softmax_fill: Tensor | None
    gdpa_norm: Tensor | None
    bias_index: Tensor | None


class _Problem:
    """Everything the forward and the backward share for one call."""

    def __init__(self, q: Tensor, offsets: Tensor, attn_bias: Tensor | None,
                 num_targets: Tensor | None, spec: Spec, fused: bool = False):
        self.num_tokens, self.num_heads, dim = q.shape
        self.spec = spec
        self.scale = spec.score_scale(dim)
        self.dtype = torch.float64 if q.dtype == torch.float64 else torch.float32
        self.form, self.causal, self.activation = spec.form, spec.causal, ACTIVATIONS[spec.activation]
        self.bias = None if attn_bias is None else attn_bias.to(self.dtype)
        self.with_targets = num_targets is not None
        starts, lengths = kept_spans(offsets, spec.max_seq_len)
        history = history_lengths(lengths, num_targets)
        self.num_seqs = offsets.shape[0] - 1
        self.uncovered = None  # rows no chunk writes (truncated tokens), which must be 0
        kept = lengths
        self.native = None  # (starts, lengths) of the sequences the AVX2 kernel takes
        if fused and native_applies(spec, q, self.with_targets):
            takes = lengths <= (NATIVE_MAX_LEN or self.num_tokens)
            self.native = (starts[takes], lengths[takes])
            lengths = torch.where(takes, 0, lengths)  # planned below: nothing or the longest
        if fused:
            self.chunks = plan_chunks(starts, lengths, history, self.num_tokens, self.num_heads,
                                      solo_min=planning.FUSED_SOLO_MIN,
                                      overhead=planning.FUSED_CHUNK_OVERHEAD_SCORES)
            dropped = offsets[1:] - offsets[:-1] - kept
            spans = torch.nonzero(dropped).flatten()
            # (first token, count) of each run of truncated tokens, which get zeros
            self.dropped = list(zip(offsets[spans].tolist(), dropped[spans].tolist()))
            return
        self.chunks = plan_chunks(starts, lengths, history, self.num_tokens, self.num_heads)
        if int(lengths.sum()) != self.num_tokens:
            covered = torch.zeros(self.num_tokens + 1, dtype=torch.bool, device=q.device)
            for chunk in self.chunks:
                covered[chunk.scatter] = True
            self.uncovered = torch.nonzero(~covered[:self.num_tokens]).flatten()

    def compute(self, x: Tensor) -> Tensor:
        """x contiguous in the compute dtype (a no-op for contiguous float32)."""
        return x.to(self.dtype).contiguous()

    def solo_view(self, x: Tensor, chunk: Chunk) -> Tensor:
        """(T, H, D) -> (1, H, L, D) view of a solo chunk's rows, the fused kernels' layout."""
        return x[chunk.start:chunk.start + chunk.size].unsqueeze(0).transpose(1, 2)

    def fused_buffers(self, *likes: Tensor) -> list[Tensor]:
        """Uninitialized (T, ...) result buffers shaped like `likes`, truncated tokens zeroed
        (every other row is written once by exactly one chunk)."""
        buffers = [torch.empty(like.shape, dtype=self.dtype, device=like.device) for like in likes]
        for first, count in self.dropped:
            for buffer in buffers:
                buffer[first:first + count].zero_()
        return buffers

    def gather_rows(self, x: Tensor, chunk: Chunk) -> Tensor:
        """(T, H, D) -> (n, H, Lp, D) in the compute dtype: a transposed view of the
        gathered (n, Lp, H, D) rows, the layout torch's fused CPU kernels read and write."""
        rows = x.view(x.shape[0], -1).index_select(0, chunk.gather)  # 2-D: a row memcpy
        if rows.dtype != self.dtype:
            rows = rows.to(self.dtype)
        if chunk.padding.numel():
            rows.index_fill_(0, chunk.padding, 0)  # padding reads zeros, not token 0
        return rows.view(-1, chunk.size, self.num_heads, x.shape[2]).transpose(1, 2)

    def fused_mask(self, chunk: Chunk) -> tuple[Tensor | None, bool]:
        """(additive float mask or None, is_causal) for torch's fused kernels.

        Without targets, windows or contextual tokens, causal needs no mask (padding keys
        follow every real query) and non-causal only a (n, 1, 1, Lp) key-padding mask.
        """
        if self.with_targets or not self.spec.plain_mask:
            fill = self.masks(chunk).softmax_fill.unsqueeze(1)
            mask = torch.zeros(fill.shape, dtype=self.dtype, device=fill.device)
            return mask.masked_fill_(fill, float("-inf")), False
        if self.causal:
            return None, True
        if bool((chunk.lengths == chunk.size).all()):
            return None, False
        pos = torch.arange(chunk.size, device=chunk.lengths.device).view(1, 1, 1, -1)
        padding = pos >= chunk.lengths.view(-1, 1, 1, 1)
        mask = torch.zeros(padding.shape, dtype=self.dtype, device=padding.device)
        return mask.masked_fill_(padding, float("-inf")), False

    def gather(self, x: Tensor, chunk: Chunk, scale: float | None = None) -> Tensor:
        """(T, H, D) -> (H, n, Lp, D) in the compute dtype, times `scale` if given.

        Rows are gathered from the contiguous (T, H, D) tensor, then transposed chunk by
        chunk: index_select on a transposed view would copy the whole tensor every call.
        """
        rows = x.index_select(0, chunk.gather)  # (n*Lp, H, D)
        if chunk.padding.numel():
            rows.index_fill_(0, chunk.padding, 0)  # padding reads zeros, not token 0
        out = torch.empty(self.num_heads, rows.shape[0], x.shape[2], dtype=self.dtype,
                          device=x.device)
        if scale is None:
            out.copy_(rows.transpose(0, 1))
        else:
            torch.mul(rows.transpose(0, 1), scale, out=out)
        return out.view(self.num_heads, -1, chunk.size, x.shape[2])

    def new_output(self, like: Tensor) -> Tensor:
        """(T+1, H, D) buffer for the chunks to fill; row T takes the writes of padding
        positions. Only rows no chunk writes are zeroed (a full memset costs ~5%)."""
        out = like.new_empty(self.num_tokens + 1, self.num_heads, like.shape[2], dtype=self.dtype)
        if self.uncovered is not None:
            out.index_fill_(0, self.uncovered, 0)
        return out

    def masks(self, chunk: Chunk) -> _ChunkMasks:
        size = chunk.size
        allowed = allowed_mask(chunk.lengths, chunk.history, size, self.causal,
                               self.spec.max_attn_len, self.spec.contextual_len)
        fill = norm = index = None
        if self.form == "softmax":
            # Padding queries keep their diagonal, so no row is all -inf.
            eye = torch.eye(size, dtype=torch.bool, device=allowed.device)
            fill = ~(allowed | eye)
        else:
            inv_len = 1.0 / chunk.lengths.clamp(min=1).to(self.dtype)
            norm = allowed.to(self.dtype) * inv_len.view(-1, 1, 1)
        if self.bias is not None:
            history = chunk.history if self.with_targets else chunk.history.new_full((1,), size)
            index = relative_position_index(history, size, bias_radius(self.bias))
        return _ChunkMasks(fill, norm, index)

    def query_blocks(self, chunk: Chunk) -> list[tuple[slice, slice]]:
        """(query rows, key columns) blocks covering the chunk's scores.

        Causal attention (without contextual tokens, which see later keys) splits the
        queries into blocks of CAUSAL_QUERY_BLOCK rows that read only the keys up to their
        last row: ~half the score work of the full square on long sequences.
        """
        size, step = chunk.size, CAUSAL_QUERY_BLOCK
        if not self.causal or self.spec.contextual_len > 0 or size < 2 * step:
            return [(slice(0, size), slice(0, size))]
        return [(slice(r, min(r + step, size)), slice(0, min(r + step, size)))
                for r in range(0, size, step)]

    def scores(self, q_g: Tensor, k_g: Tensor, masks: _ChunkMasks, heads: slice,
               rows: slice, keys: slice) -> Tensor:
        """S (h, n, rows, keys) for the head group: q_g (h, n, rows, D) already scaled."""
        s = torch.matmul(q_g, k_g.transpose(-1, -2))
        if masks.bias_index is not None:
            s += self.bias[heads][:, masks.bias_index[:, rows, keys]]
        if masks.softmax_fill is not None:
            s.masked_fill_(masks.softmax_fill[:, rows, keys], float("-inf"))
        return s

    def dropout_scale(self, chunk: Chunk, heads: slice, rows: slice,
                      keys: slice) -> Tensor | None:
        """(h, n, rows, keys) keep / (1 - p) for the head group, or None without dropout."""
        p = self.spec.dropout_p
        if p == 0.0:
            return None
        tokens = chunk.gather.view(-1, chunk.size)
        head_ids = torch.arange(heads.start, heads.stop, device=tokens.device)
        keep = dropout_keep(self.spec.dropout_seed, p, head_ids, tokens[:, rows], tokens[:, keys])
        return keep.to(self.dtype).mul_(1.0 / (1.0 - p))


def _accumulate(dest: Tensor, a: Tensor, b: Tensor, num_blocks: int) -> None:
    """dest (h, n, r, d) = a @ b with one query block, else += (a view of a chunk buffer)."""
    if num_blocks == 1:
        dest.copy_(torch.matmul(a, b))
    else:
        dest.add_(torch.matmul(a, b))


def _scatter(dest: Tensor, chunk: Chunk, values: Tensor) -> None:
    """values (H, n, Lp, D) -> rows of dest (T+1, H, D); padding lands on row T."""
    num_heads, _, _, dim = values.shape
    rows = values.permute(1, 2, 0, 3).reshape(-1, num_heads, dim)  # (n*Lp, H, D)
    dest.index_copy_(0, chunk.scatter, rows)


def _store(chunk: Chunk, rows: Tensor, dest: Tensor) -> None:
    """rows (n, Lp, ...) computed for a chunk -> their tokens' rows of dest (T, ...).

    A copy per sequence of its first L rows: padding rows are never written anywhere.
    """
    if chunk.solo:
        dest[chunk.start:chunk.start + chunk.size].copy_(rows[0])
        return
    flat = rows.reshape(-1, *rows.shape[2:])
    parts = flat.split([part for n in chunk.kept for part in (n, chunk.size - n)])
    for first, n, part in zip(chunk.firsts, chunk.kept, parts[::2]):
        dest[first:first + n].copy_(part)


def _fused_forward(pb: "_Problem", q: Tensor, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
    """Every chunk through torch's fused CPU flash-attention forward: (out, lse (T, H)).

    Each kernel result is copied to its tokens at once, so the kernels' buffers are freed
    and reused from chunk to chunk rather than all held (and paged in) until the end.
    """
    q, k, v = pb.compute(q), pb.compute(k), pb.compute(v)
    out, lse = pb.fused_buffers(v, q[:, :, 0])
    if pb.native is not None:
        native.forward(q, k, v, out, lse, *pb.native, pb.scale)
    for chunk in pb.chunks:
        mask, is_causal = pb.fused_mask(chunk)
        inputs = [pb.solo_view(x, chunk) if chunk.solo else pb.gather_rows(x, chunk)
                  for x in (q, k, v)]
        o_c, lse_c = _FLASH(*inputs, 0.0, is_causal, attn_mask=mask, scale=pb.scale)
        _store(chunk, o_c.transpose(1, 2), out)
        _store(chunk, lse_c.transpose(1, 2), lse)
    return out, lse


def _fused_backward(pb: "_Problem", grad_out: Tensor, q: Tensor, k: Tensor, v: Tensor,
                    out: Tensor, lse: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Every chunk through torch's fused CPU backward: (dq, dk, dv)."""
    grad_out, q, k, v, out = (pb.compute(x) for x in (grad_out, q, k, v, out))
    lse = lse.contiguous()
    grads = pb.fused_buffers(q, k, v)
    if pb.native is not None:
        native.backward(grad_out, q, k, v, out, lse, *grads, *pb.native, pb.scale)
    for chunk in pb.chunks:
        mask, is_causal = pb.fused_mask(chunk)
        if chunk.solo:
            inputs = [pb.solo_view(x, chunk) for x in (grad_out, q, k, v, out)]
            lse_c = lse[chunk.start:chunk.start + chunk.size].t().unsqueeze(0)
        else:
            inputs = [pb.gather_rows(x, chunk) for x in (grad_out, q, k, v, out)]
            lse_rows = lse.index_select(0, chunk.gather)
            if chunk.padding.numel():
                lse_rows.index_fill_(0, chunk.padding, 0)
            lse_c = lse_rows.view(-1, chunk.size, pb.num_heads).transpose(1, 2)
        chunk_grads = _FLASH_BACKWARD(*inputs, lse_c, 0.0, is_causal, attn_mask=mask,
                                      scale=pb.scale)
        for dest, grad in zip(grads, chunk_grads):
            _store(chunk, grad.transpose(1, 2), dest)
    return tuple(grads)


def _finish(buffer: Tensor, num_tokens: int, dtype: torch.dtype) -> Tensor:
    """(T+1, H, D) compute buffer -> (T, H, D) result in `dtype`."""
    return buffer[:num_tokens].to(dtype)


def _head_groups(num_heads: int, chunk: Chunk) -> list[slice]:
    step = chunk.heads_per_group
    return [slice(h, min(h + step, num_heads)) for h in range(0, num_heads, step)]


def bucketed_forward(q: Tensor, k: Tensor, v: Tensor, offsets: Tensor,
                     attn_bias: Tensor | None, num_targets: Tensor | None,
                     spec: Spec) -> tuple[Tensor, Tensor]:
    """q, k: (T, H, D), v: (T, H, Dv) -> (out (T, H, Dv), lse): lse is the (T, H) float32
    log-sum-exp when uses_fused_softmax(...), else empty. No autograd; see bucketed_backward."""
    fused = uses_fused_softmax(spec, attn_bias, q, v)
    pb = _Problem(q, offsets, attn_bias, num_targets, spec, fused=fused)
    if fused:
        out, lse = _fused_forward(pb, q, k, v)
        return out.to(q.dtype), lse
    form = spec.form
    out = pb.new_output(v)
    for chunk in pb.chunks:
        q_c, k_c, v_c = pb.gather(q, chunk, pb.scale), pb.gather(k, chunk), pb.gather(v, chunk)
        masks = pb.masks(chunk)
        o_c = torch.empty_like(v_c)
        for heads in _head_groups(pb.num_heads, chunk):
            for rows, keys in pb.query_blocks(chunk):
                s = pb.scores(q_c[heads, :, rows], k_c[heads, :, keys], masks, heads, rows, keys)
                if form == "softmax":
                    weights = torch.softmax(s, dim=-1)
                else:
                    weights = pb.activation.fn(s).mul_(masks.gdpa_norm[:, rows, keys])
                drop = pb.dropout_scale(chunk, heads, rows, keys)
                if drop is not None:
                    weights = weights * drop
                o_c[heads, :, rows] = torch.matmul(weights, v_c[heads, :, keys])
        _scatter(out, chunk, o_c)
    return _finish(out, pb.num_tokens, q.dtype), q.new_zeros(0, dtype=torch.float32)


def bucketed_backward(grad_out: Tensor, q: Tensor, k: Tensor, v: Tensor, offsets: Tensor,
                      out: Tensor, lse: Tensor, attn_bias: Tensor | None,
                      num_targets: Tensor | None, spec: Spec
                      ) -> tuple[Tensor, Tensor, Tensor, Tensor | None]:
    """Gradients (dq, dk, dv, d attn_bias or None) for grad_out (T, H, Dv); out and lse
    are the forward's results (used by the fused softmax path only)."""
    if lse.numel() > 0:  # the forward ran the fused kernels
        pb = _Problem(q, offsets, attn_bias, num_targets, spec, fused=True)
        grads = _fused_backward(pb, grad_out, q, k, v, out, lse)
        return (*(g.to(q.dtype) for g in grads), None)
    pb = _Problem(q, offsets, attn_bias, num_targets, spec)
    form = spec.form
    dq, dk, dv = pb.new_output(q), pb.new_output(k), pb.new_output(v)
    dbias = None if pb.bias is None else torch.zeros_like(pb.bias)
    for chunk in pb.chunks:
        q_c, k_c = pb.gather(q, chunk, pb.scale), pb.gather(k, chunk)
        v_c, do_c = pb.gather(v, chunk), pb.gather(grad_out, chunk)
        masks = pb.masks(chunk)
        blocks = pb.query_blocks(chunk)
        # Key gradients sum over query blocks; with one block each is written once.
        new = torch.empty_like if len(blocks) == 1 else torch.zeros_like
        dq_c, dk_c, dv_c = torch.empty_like(q_c), new(k_c), new(v_c)
        for heads in _head_groups(pb.num_heads, chunk):
            for rows, keys in blocks:
                s = pb.scores(q_c[heads, :, rows], k_c[heads, :, keys], masks, heads, rows, keys)
                do_b = do_c[heads, :, rows]
                d_weights = torch.matmul(do_b, v_c[heads, :, keys].transpose(-1, -2))
                drop = pb.dropout_scale(chunk, heads, rows, keys)
                if drop is not None:
                    d_weights.mul_(drop)
                if form == "softmax":
                    weights = torch.softmax(s, dim=-1)
                    ds = torch._softmax_backward_data(d_weights, weights, -1, weights.dtype)
                else:
                    norm = masks.gdpa_norm[:, rows, keys]
                    weights = pb.activation.fn(s).mul_(norm)
                    ds = pb.activation.grad(d_weights.mul_(norm), s)
                if drop is not None:
                    weights = weights * drop
                _accumulate(dv_c[heads, :, keys], weights.transpose(-1, -2), do_b, len(blocks))
                dq_c[heads, :, rows] = torch.matmul(ds, k_c[heads, :, keys])
                _accumulate(dk_c[heads, :, keys], ds.transpose(-1, -2), q_c[heads, :, rows],
                            len(blocks))
                if dbias is not None:
                    index = masks.bias_index[:, rows, keys]
                    ds_h = ds.reshape(heads.stop - heads.start, ds.shape[1], -1)
                    if index.shape[0] == 1:  # no targets: one index for the whole chunk
                        ds_h = ds_h.sum(dim=1)
                    dbias[heads].index_add_(1, index.reshape(-1), ds_h.reshape(ds_h.shape[0], -1))
        dq_c.mul_(pb.scale)
        for dest, values in ((dq, dq_c), (dk, dk_c), (dv, dv_c)):
            _scatter(dest, chunk, values)
    grads = tuple(_finish(x, pb.num_tokens, q.dtype) for x in (dq, dk, dv))
    return (*grads, None if dbias is None else dbias.to(attn_bias.dtype))
