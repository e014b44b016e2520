"""Moving between the user layout `[B, T, H, D]` and the chunked layout `[B, H, N, C, D]`.

The sequence is padded at its end to a multiple of the chunk size with zeros. Padding is harmless for every
operator here: a padded token has q = k = v = 0 (it adds nothing to the state and reads nothing) and a
log-gate of 0 (no decay), so the state after the last real token equals the state after the padding.
"""

from __future__ import annotations

from typing import NamedTuple

import torch


class ChunkStates(NamedTuple):
    """States (or state gradients) at every chunk boundary, [B, H, N + 1, K, V], and the cumulative log
    decay to each boundary ([B, H, N + 1, K] for GLA, [B, H, N + 1] for simple GLA)."""

    states: torch.Tensor
    log_decay: torch.Tensor


def chunk_count(length: int, chunk_size: int) -> int:
    return -(-length // chunk_size)


def to_chunks(x: torch.Tensor, chunk_size: int, dtype: torch.dtype) -> torch.Tensor:
    """[B, T, H, *D] -> [B, H, N, C, *D] in `dtype`, zero-padded along T."""
    batch, length, heads = x.shape[:3]
    n_chunks = chunk_count(length, chunk_size)
    padding = n_chunks * chunk_size - length
    x = x.to(dtype)
    if padding:
        pad_shape = (batch, padding) + tuple(x.shape[2:])
        x = torch.cat([x, x.new_zeros(pad_shape)], dim=1)
    x = x.transpose(1, 2)
    return x.reshape((batch, heads, n_chunks, chunk_size) + tuple(x.shape[3:]))


def from_chunks(x: torch.Tensor, length: int) -> torch.Tensor:
    """[B, H, N, C, *D] -> [B, T, H, *D], dropping the padding."""
    batch, heads, n_chunks, chunk_size = x.shape[:4]
    x = x.reshape((batch, heads, n_chunks * chunk_size) + tuple(x.shape[4:]))
    return x.transpose(1, 2)[:, :length]
