"""Sequence-wide key/value buffers for softmax attention run chunk by chunk (StateFlow, after Eq. 13).

[Note: sequence-wide K/V]
Chunk ``i`` of an attention layer attends to every key of chunks ``0..i``. Carrying that prefix as a
chunk-to-chunk state would copy it for every chunk and keep each copy in that chunk's saved graph: saved
keys and values growing with the square of the chunk count. Instead each microbatch gets, per attention
layer, one buffer of the whole sequence's keys and values ``[B, H, T, D]``, written once by the chunk that
computes them; a chunk's attention reads ``buffer[:, :, :end]`` through an alias that shares the storage
(nothing is copied or saved twice). The backward mirrors it: ``B(a, i)`` adds the gradients it finds for
earlier chunks' keys and values into a sequence-wide gradient buffer, and takes the part for its own chunk
from that buffer, complete because every later chunk's backward ran first (the state edges of Eq. 8
order ``B(a, i + 1)`` before ``B(a, i)``). The executor opens a microbatch's buffers at its first forward
and drops them after ``B(a, 0)``.

Aliases rather than views: a later chunk writes its keys into the same buffer, and a view shares the
buffer's version counter, so autograd would refuse the earlier chunk's saved keys as modified in place; an
alias made with ``set_`` has its own counter, and the region it covers is never written again (with
recomputation it is rewritten with the same values).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F


@dataclass
class LayerKV:
    """One attention layer's buffers for one microbatch: [B, H, T, D] keys and values, and their gradients."""

    keys: torch.Tensor
    values: torch.Tensor
    key_grads: torch.Tensor | None = None
    value_grads: torch.Tensor | None = None

    def gradient_buffers(self) -> tuple[torch.Tensor, torch.Tensor]:
        if self.key_grads is None:
            self.key_grads = torch.zeros_like(self.keys)
            self.value_grads = torch.zeros_like(self.values)
        return self.key_grads, self.value_grads


@dataclass
class SequenceKV:
    """The buffers of every open microbatch, per attention layer."""

    sequence_length: int
    open: dict[tuple[int, int], LayerKV] = field(default_factory=dict)

    def buffers(self, microbatch: int, layer: int, like: torch.Tensor) -> LayerKV:
        """The layer's buffers for this microbatch, opened on first use, shaped like ``like`` [B, H, L, D]."""
        key = (microbatch, layer)
        if key not in self.open:
            batch, heads, _, dim = like.shape
            shape = (batch, heads, self.sequence_length, dim)
            self.open[key] = LayerKV(like.new_empty(shape), like.new_empty(shape))
        return self.open[key]

    def close(self, microbatch: int) -> None:
        for key in [key for key in self.open if key[0] == microbatch]:
            del self.open[key]


@dataclass(frozen=True)
class ChunkPosition:
    """Where the chunk a stage runs sits in its microbatch's sequence, with that microbatch's K/V buffers."""

    kv: SequenceKV
    microbatch: int
    start: int
    end: int


@dataclass(frozen=True)
class AttentionChunk:
    """What one attention layer needs to run a chunk: its position and its layer index."""

    position: ChunkPosition
    layer: int

    def buffers(self, like: torch.Tensor) -> LayerKV:
        return self.position.kv.buffers(self.position.microbatch, self.layer, like)


def _alias(view: torch.Tensor) -> torch.Tensor:
    """A tensor on the same memory as ``view`` with a version counter of its own."""
    alias = view.new_empty(0)
    alias.set_(view.untyped_storage(), view.storage_offset(), view.shape, view.stride())
    return alias


def _attend(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """Queries of the chunk's last q.shape[2] positions over keys [0, end): causal, aligned bottom-right."""
    from torch.nn.attention.bias import causal_lower_right

    return F.scaled_dot_product_attention(q, keys, values, attn_mask=causal_lower_right(q.shape[2], keys.shape[2]))


class BufferedChunkAttention(torch.autograd.Function):
    """Attention of one chunk's q, k, v ([B, H, L, D]) over the sequence-wide buffers; see the note."""

    @staticmethod
    def forward(ctx, q, k, v, chunk: AttentionChunk):
        buffers, start, end = chunk.buffers(k), chunk.position.start, chunk.position.end
        buffers.keys[:, :, start:end] = k
        buffers.values[:, :, start:end] = v
        with torch.enable_grad():
            leaves = [
                tensor.requires_grad_(True)
                for tensor in (q.detach(), _alias(buffers.keys[:, :, :end]), _alias(buffers.values[:, :, :end]))
            ]
            output = _attend(*leaves)
        ctx.leaves, ctx.output, ctx.buffers, ctx.bounds = leaves, output, buffers, (start, end)
        return output.detach()

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, output_grad):
        start, end = ctx.bounds
        dq, dkeys, dvalues = torch.autograd.grad(ctx.output, ctx.leaves, output_grad)
        key_grads, value_grads = ctx.buffers.gradient_buffers()
        key_grads[:, :, :start] += dkeys[:, :, :start]
        value_grads[:, :, :start] += dvalues[:, :, :start]
        dk = dkeys[:, :, start:end] + key_grads[:, :, start:end]
        dv = dvalues[:, :, start:end] + value_grads[:, :, start:end]
        ctx.leaves = ctx.output = ctx.buffers = None
        return dq, dk, dv, None
