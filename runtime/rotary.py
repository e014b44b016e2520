"""Rotary position embeddings (RoFormer) of an ``attn`` layer's queries and keys.

The non-interleaved ("rotate half") layout of flash-linear-attention's ``RotaryEmbedding`` (GPT-NeoX's):
channel ``i < D / 2`` of a head and channel ``i + D / 2`` are rotated together by the angle
``position * theta ** (-2 i / D)``. Its precision choices are kept: the inverse frequencies, the positions
and their products are float32, the cosine and sine tables are cast to the compute dtype, and the rotation
itself runs in at least float32 before the result is cast back.

[Note: rotary positions]
A token is rotated at its absolute position in the sequence, whichever piece of the sequence the layer runs:
the whole sequence starts at 0, a chunk at its first position, a sequence-parallel rank's slice of a chunk at
the slice's first position (``ChunkPosition.start`` holds exactly that). So the keys a chunk writes into the
sequence-wide buffers ([Note: sequence-wide K/V] in :mod:`schedlang.runtime.kv_buffers`) are already
rotated, the buffers, their gradients and the all-gather of sequence-parallel keys stay as they are, and
every chunking computes the same scores as the whole sequence. Packed documents keep these absolute
positions too: a rotated score depends only on ``query position - key position`` and attention never
crosses a document, so restarting positions at each document would change no score (fla's ``cu_seqlens``
restarts them; the outputs agree up to rounding).

[Note: cached rotary tables]
The cosine and sine tables of one geometry (head width, base, dtype, device) are built once, for positions
``0 .. n``, and every call slices its positions out of them (:class:`RotaryTableCache`): each entry is
elementwise the same float32 arithmetic of its own position, so a slice equals the table built for that range
alone. A longer range than the table holds rebuilds it at least twice as long. Tables are CUDA-graph safe:
a graph captured while reading a table keeps reading that memory at every replay, so a table is never freed
(one that a longer table replaces stays referenced by the cache), and a table is never built during a capture
(whose kernels would only run at replay): a range that the cache cannot serve while the current stream
captures is built for that call alone, inside the graph, as an uncached table would be. Capture after a
warm-up call over the same positions (CUDA graphs need one anyway) and the captured graph reads the cached
table.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


def rotary_tables(
    head_dim: int, theta: float, start: int, end: int, dtype: torch.dtype, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """The cosine and sine of positions ``start .. end`` ([end - start, head_dim / 2]), computed in float32
    and cast to ``dtype``."""
    if head_dim % 2:
        raise ValueError(f"rotary position embeddings need an even head width, found {head_dim}")
    inverse_frequencies = 1.0 / (theta ** (torch.arange(0, head_dim, 2, device=device, dtype=torch.float32) / head_dim))
    positions = torch.arange(start, end, device=device, dtype=torch.float32)
    angles = torch.outer(positions, inverse_frequencies)
    return torch.cos(angles).to(dtype), torch.sin(angles).to(dtype)


@dataclass(frozen=True)
class RotaryGeometry:
    """What a rotary table depends on besides its positions."""

    head_dim: int
    theta: float
    dtype: torch.dtype
    device: torch.device


class RotaryTableCache:
    """Cosine and sine tables of positions ``0 .. n`` per :class:`RotaryGeometry`, sliced per call
    ([Note: cached rotary tables])."""

    def __init__(self) -> None:
        self.tables: dict[RotaryGeometry, tuple[torch.Tensor, torch.Tensor]] = {}
        self.replaced: list[tuple[torch.Tensor, torch.Tensor]] = []  # kept alive for captured graphs

    def lookup(
        self, head_dim: int, theta: float, start: int, end: int, dtype: torch.dtype, device: torch.device
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``rotary_tables(head_dim, theta, start, end, dtype, device)``, as views of the cached table."""
        geometry = RotaryGeometry(head_dim, theta, dtype, torch.device(device))
        table = self.tables.get(geometry)
        if table is None or table[0].shape[0] < end:
            if _capturing(geometry.device):
                return rotary_tables(head_dim, theta, start, end, dtype, device)
            length = end if table is None else max(end, 2 * table[0].shape[0])
            if table is not None:
                self.replaced.append(table)
            with torch.inference_mode(False):  # a table made in inference mode could not be saved for backward
                table = rotary_tables(head_dim, theta, 0, length, dtype, device)
            self.tables[geometry] = table
        cosine, sine = table
        return cosine[start:end], sine[start:end]


def _capturing(device: torch.device) -> bool:
    return device.type == "cuda" and torch.cuda.is_current_stream_capturing()


ROTARY_TABLES = RotaryTableCache()
"""The process's tables, which :func:`rotate_queries_and_keys` reads."""


def apply_rotary(tensor: torch.Tensor, cosine: torch.Tensor, sine: torch.Tensor) -> torch.Tensor:
    """``tensor`` ([B, L, H, D]) rotated half against half by the tables of its ``L`` positions
    ([L, D / 2]), in at least float32, returned in ``tensor``'s dtype."""
    work = torch.promote_types(tensor.dtype, torch.float32)
    first, second = tensor.to(work).chunk(2, dim=-1)
    cosine, sine = cosine.to(work)[None, :, None, :], sine.to(work)[None, :, None, :]
    rotated = torch.cat((first * cosine - second * sine, first * sine + second * cosine), dim=-1)
    return rotated.to(tensor.dtype)


def rotate_queries_and_keys(
    queries: torch.Tensor, keys: torch.Tensor, theta: float, start: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Queries and keys ([B, L, H, D], any number of key heads) of the tokens at positions
    ``start .. start + L``, rotated ([Note: rotary positions])."""
    length = queries.shape[1]
    cosine, sine = ROTARY_TABLES.lookup(queries.shape[-1], theta, start, start + length, queries.dtype, queries.device)
    return apply_rotary(queries, cosine, sine), apply_rotary(keys, cosine, sine)
