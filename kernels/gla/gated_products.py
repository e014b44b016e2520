"""Causal products under a per-key-dimension decay, computed without overflow.

Inside one chunk, with `gc` the gate's cumulative sum from the chunk start, the intra-chunk terms all have
the form  sum over j <= i of  a_i[k] b_j[k] exp(gc_i[k] - gc_j[k]).  Splitting exp(gc_i - gc_j) into
exp(gc_i) * exp(-gc_j) overflows under strong decay, so each chunk is cut into sub-chunks of 16 tokens: a
pair of different sub-chunks (rows x > columns y) factors around a reference r_x, the cumulative gate at
the first token of sub-chunk x, giving two factors exp(gc_i - r_x) <= 1 and exp(r_x - gc_j) <= 1 and a
matrix product; a sub-chunk with itself is summed exactly over the key dimension. kernels/gla/README.md
derives this; the Triton kernels use the same split.

Most chunks do not need the split: where no key's cumulative gate spans more than SPAN_LIMIT over the
chunk ("smooth" chunks), exp(gc_i - gc_j) = exp(gc_i - mid) exp(mid - gc_j) around the midpoint of the
range, with both factors within exp(+-SPAN_LIMIT / 2), and each product is one matrix product over the
whole chunk. The public functions take that path for smooth chunks and the sub-chunk split for the others
("steep"), as the Triton kernels do.
"""

from __future__ import annotations

import torch

SUB_CHUNK = 16
SPAN_LIMIT = 60.0


def _split(x: torch.Tensor, sub_chunk: int) -> torch.Tensor:
    return x.unflatten(-2, (x.shape[-2] // sub_chunk, sub_chunk))


def _pair_factors(
    b: torch.Tensor, gc: torch.Tensor, sub_chunk: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Sub-chunk views and the factored decays for pairs (row block x, column block y < x)."""
    b_blocks = _split(b, sub_chunk)
    gc_blocks = _split(gc, sub_chunk)
    reference = gc_blocks[..., :, 0, :]
    n_blocks = gc_blocks.shape[-3]
    index = torch.arange(n_blocks, device=gc.device)
    lower_pairs = (index[None, :] < index[:, None])[:, :, None, None]
    exponent = reference[..., :, None, None, :] - gc_blocks[..., None, :, :, :]
    column_decay = torch.where(lower_pairs, exponent, float("-inf")).exp()
    row_decay = (gc_blocks - reference[..., :, None, :]).exp()
    return b_blocks, gc_blocks, row_decay, column_decay


def _diagonal_decay(gc_blocks: torch.Tensor) -> torch.Tensor:
    """exp(gc_i - gc_j) for j <= i inside each sub-chunk, 0 above the diagonal: [..., n, S, S, K]."""
    size = gc_blocks.shape[-2]
    causal = torch.ones(size, size, dtype=torch.bool, device=gc_blocks.device).tril()[:, :, None]
    exponent = gc_blocks[..., :, :, None, :] - gc_blocks[..., :, None, :, :]
    return torch.where(causal, exponent, float("-inf")).exp()


def _sub_chunk_scores(a: torch.Tensor, b: torch.Tensor, gc: torch.Tensor, sub_chunk: int = SUB_CHUNK) -> torch.Tensor:
    """scores[i, j] = sum_k a_i b_j exp(gc_i - gc_j) for j <= i, else 0.

    a, b, gc: [..., C, K] with C a multiple of sub_chunk. Returns [..., C, C]. Differentiable.
    """
    length = a.shape[-2]
    b_blocks, gc_blocks, row_decay, column_decay = _pair_factors(b, gc, sub_chunk)
    a_blocks = _split(a, sub_chunk)
    scaled_rows = a_blocks * row_decay
    scaled_columns = b_blocks[..., None, :, :, :] * column_decay
    off_diagonal = torch.einsum("...xik,...xyjk->...xiyj", scaled_rows, scaled_columns)
    diagonal = (a_blocks[..., :, :, None, :] * b_blocks[..., :, None, :, :] * _diagonal_decay(gc_blocks)).sum(-1)
    n_blocks = gc_blocks.shape[-3]
    eye = torch.eye(n_blocks, dtype=a.dtype, device=a.device)[:, None, :, None]
    scores = off_diagonal + diagonal[..., :, :, None, :] * eye
    return scores.reshape(scores.shape[:-4] + (length, length))


def _sub_chunk_rows(weights: torch.Tensor, b: torch.Tensor, gc: torch.Tensor, sub_chunk: int = SUB_CHUNK) -> torch.Tensor:
    """out[i] = sum_{j <= i} weights[i, j] * b_j * exp(gc_i - gc_j): [..., C, K] (weights: [..., C, C])."""
    b_blocks, gc_blocks, row_decay, column_decay = _pair_factors(b, gc, sub_chunk)
    weight_blocks = weights.unflatten(-1, (b_blocks.shape[-3], sub_chunk)).unflatten(-3, (b_blocks.shape[-3], sub_chunk))
    scaled_columns = b_blocks[..., None, :, :, :] * column_decay
    off_diagonal = torch.einsum("...xiyj,...xyjk->...xik", weight_blocks, scaled_columns) * row_decay
    diagonal_weights = torch.diagonal(weight_blocks, dim1=-4, dim2=-2).movedim(-1, -3)
    diagonal = (diagonal_weights[..., None] * b_blocks[..., :, None, :, :] * _diagonal_decay(gc_blocks)).sum(-2)
    return (off_diagonal + diagonal).flatten(-3, -2)


def _sub_chunk_columns(weights: torch.Tensor, a: torch.Tensor, gc: torch.Tensor, sub_chunk: int = SUB_CHUNK) -> torch.Tensor:
    """out[j] = sum_{i >= j} weights[i, j] * a_i * exp(gc_i - gc_j): [..., C, K] (weights: [..., C, C])."""
    _, gc_blocks, row_decay, column_decay = _pair_factors(a, gc, sub_chunk)
    a_blocks = _split(a, sub_chunk)
    n_blocks = gc_blocks.shape[-3]
    weight_blocks = weights.unflatten(-1, (n_blocks, sub_chunk)).unflatten(-3, (n_blocks, sub_chunk))
    scaled_rows = a_blocks * row_decay
    off_diagonal = (torch.einsum("...xiyj,...xik->...xyjk", weight_blocks, scaled_rows) * column_decay).sum(-4)
    diagonal_weights = torch.diagonal(weight_blocks, dim1=-4, dim2=-2).movedim(-1, -3)
    diagonal = (diagonal_weights[..., None] * a_blocks[..., :, :, None, :] * _diagonal_decay(gc_blocks)).sum(-3)
    return (off_diagonal + diagonal).flatten(-3, -2)


def _chunk_references(gc: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(smooth [...]: the chunk's cumulative gate spans at most SPAN_LIMIT in every key;
    mid [..., 1, K]: the midpoint of each key's range, 0 on steep chunks so every factor stays finite)."""
    top, bottom = gc.amax(-2, keepdim=True), gc.amin(-2, keepdim=True)
    smooth = ((top - bottom) <= SPAN_LIMIT).all(-1).squeeze(-1)
    mid = torch.where(smooth[..., None, None], (top + bottom) / 2, torch.zeros_like(top))
    return smooth, mid


def _factors(gc: torch.Tensor, smooth: torch.Tensor, mid: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """exp(gc - mid) and exp(mid - gc), set to 0 on steep chunks (whose results come from the split)."""
    keep = smooth[..., None, None]
    up = torch.where(keep, (gc - mid).clamp(max=SPAN_LIMIT).exp(), torch.zeros_like(gc))
    down = torch.where(keep, (mid - gc).clamp(max=SPAN_LIMIT).exp(), torch.zeros_like(gc))
    return up, down


def _causal(length: int, device: torch.device) -> torch.Tensor:
    return torch.ones(length, length, dtype=torch.bool, device=device).tril()


def _by_chunk_kind(smooth: torch.Tensor, smooth_result: torch.Tensor, steep, *inputs: torch.Tensor) -> torch.Tensor:
    """smooth_result on smooth chunks, steep(*inputs restricted to the steep chunks) on the others."""
    if bool(smooth.all()):
        return smooth_result
    batch_shape = smooth.shape
    steep_index = (~smooth).flatten().nonzero().squeeze(-1)
    flat = [tensor.flatten(0, len(batch_shape) - 1) for tensor in inputs]
    steep_values = steep(*(tensor.index_select(0, steep_index) for tensor in flat))
    merged = smooth_result.flatten(0, len(batch_shape) - 1).index_put((steep_index,), steep_values)
    return merged.unflatten(0, batch_shape)


def gated_causal_scores(a: torch.Tensor, b: torch.Tensor, gc: torch.Tensor, sub_chunk: int = SUB_CHUNK) -> torch.Tensor:
    """scores[i, j] = sum_k a_i b_j exp(gc_i - gc_j) for j <= i, else 0.

    a, b, gc: [..., C, K] with C a multiple of sub_chunk. Returns [..., C, C]. Differentiable.
    """
    smooth, mid = _chunk_references(gc)
    up, down = _factors(gc, smooth, mid)
    scores = ((a * up) @ (b * down).transpose(-1, -2)).masked_fill(~_causal(a.shape[-2], a.device), 0.0)
    return _by_chunk_kind(smooth, scores, lambda *x: _sub_chunk_scores(*x, sub_chunk), a, b, gc)


def gated_causal_rows(weights: torch.Tensor, b: torch.Tensor, gc: torch.Tensor, sub_chunk: int = SUB_CHUNK) -> torch.Tensor:
    """out[i] = sum_{j <= i} weights[i, j] * b_j * exp(gc_i - gc_j): [..., C, K] (weights: [..., C, C])."""
    smooth, mid = _chunk_references(gc)
    up, down = _factors(gc, smooth, mid)
    causal_weights = weights.masked_fill(~_causal(b.shape[-2], b.device), 0.0)
    rows = (causal_weights @ (b * down)) * up
    return _by_chunk_kind(smooth, rows, lambda *x: _sub_chunk_rows(*x, sub_chunk), weights, b, gc)


def gated_causal_columns(weights: torch.Tensor, a: torch.Tensor, gc: torch.Tensor, sub_chunk: int = SUB_CHUNK) -> torch.Tensor:
    """out[j] = sum_{i >= j} weights[i, j] * a_i * exp(gc_i - gc_j): [..., C, K] (weights: [..., C, C])."""
    smooth, mid = _chunk_references(gc)
    up, down = _factors(gc, smooth, mid)
    causal_weights = weights.masked_fill(~_causal(a.shape[-2], a.device), 0.0)
    columns = (causal_weights.transpose(-1, -2) @ (a * up)) * down
    return _by_chunk_kind(smooth, columns, lambda *x: _sub_chunk_columns(*x, sub_chunk), weights, a, gc)
