"""Causal products under a per-key-dimension decay, computed without overflow.

Inside one chunk, with `gc` the gate's cumulative sum from the chunk start, the intra-chunk terms all have
the form  sum over j <= i of  a_i[k] b_j[k] exp(gc_i[k] - gc_j[k]).  Splitting exp(gc_i - gc_j) into
exp(gc_i) * exp(-gc_j) overflows under strong decay, so each chunk is cut into sub-chunks of 16 tokens: a
pair of different sub-chunks (rows x > columns y) factors around a reference r_x, the cumulative gate at
the first token of sub-chunk x, giving two factors exp(gc_i - r_x) <= 1 and exp(r_x - gc_j) <= 1 and a
matrix product; a sub-chunk with itself is summed exactly over the key dimension. kernels/gla/README.md
derives this; the Triton kernels use the same split.
"""

from __future__ import annotations

import torch

SUB_CHUNK = 16


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


def gated_causal_scores(a: torch.Tensor, b: torch.Tensor, gc: torch.Tensor, sub_chunk: int = SUB_CHUNK) -> torch.Tensor:
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


def gated_causal_rows(weights: torch.Tensor, b: torch.Tensor, gc: torch.Tensor, sub_chunk: int = SUB_CHUNK) -> torch.Tensor:
    """out[i] = sum_{j <= i} weights[i, j] * b_j * exp(gc_i - gc_j): [..., C, K] (weights: [..., C, C])."""
    b_blocks, gc_blocks, row_decay, column_decay = _pair_factors(b, gc, sub_chunk)
    weight_blocks = weights.unflatten(-1, (b_blocks.shape[-3], sub_chunk)).unflatten(-3, (b_blocks.shape[-3], sub_chunk))
    scaled_columns = b_blocks[..., None, :, :, :] * column_decay
    off_diagonal = torch.einsum("...xiyj,...xyjk->...xik", weight_blocks, scaled_columns) * row_decay
    diagonal_weights = torch.diagonal(weight_blocks, dim1=-4, dim2=-2).movedim(-1, -3)
    diagonal = (diagonal_weights[..., None] * b_blocks[..., :, None, :, :] * _diagonal_decay(gc_blocks)).sum(-2)
    return (off_diagonal + diagonal).flatten(-3, -2)


def gated_causal_columns(weights: torch.Tensor, a: torch.Tensor, gc: torch.Tensor, sub_chunk: int = SUB_CHUNK) -> torch.Tensor:
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
