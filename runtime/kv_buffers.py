"""Sequence-wide key/value buffers for softmax attention run chunk by chunk (StateFlow, after Eq. 13).

[Note: sequence-wide K/V]
Chunk ``i`` of an attention layer attends to every key of chunks ``0..i``. Carrying that prefix as a
chunk-to-chunk state would copy it for every chunk and keep each copy in that chunk's saved graph: saved
keys and values growing with the square of the chunk count. Instead each microbatch gets, per attention
layer, one buffer of the whole sequence's keys and values ``[B, H_kv, T, D]``, written once by the chunk that
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

Each chunk's attention runs in two parts, the prefix and its own square causal block, merged by their
log-sum-exp ([Note: attention in parts] in :mod:`schedlang.runtime.attention_parts`): what autograd saves
per chunk is its queries, output and log-sum-exp, and aliases of the buffers, so the saved bytes of a
sequence are linear in its length whatever the chunk count. Under sequence parallelism each chunk's forward
also gathers the other ranks' slices into the buffers, by an all-gather or a ring, and its backward
reduce-scatters the chunk's region of the gradient buffers or accumulates it around the ring ([Note:
sequence-parallel attention] in :mod:`schedlang.runtime.attention_parallel`).

The buffers, their gradient buffers and the sequence-parallel messages hold the ``H_kv`` key/value heads as
the k and v projections make them (grouped-query attention): each kernel call reads its part at query-head
width and the backward sums each group's gradients back ([Note: grouped key/value heads] in
:mod:`schedlang.runtime.attention_parts`), so what persists per layer is ``H_kv`` heads wide, not ``H``.

[Note: documents in the K/V buffers]
With packed documents ([Note: packed documents] in :mod:`schedlang.runtime.packing`) a query sees only the keys
of its own document. Each row's chunk is cut into its document pieces; a piece's queries attend to the same two
parts, narrowed: the prefix from its document's start to the chunk's start (empty unless the piece is the
row's first and its document began in an earlier chunk) and its own square causal block. So the fused kernels
still run unmasked, nothing of size (queries x keys) is formed, and the backward adds each piece's key and
value gradients into the same sequence-wide gradient buffers, only inside its document.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from schedlang.runtime.attention_parallel import (
    Slices,
    gather_chunk,
    reduce_scatter_chunk_gradients,
    ring_chunk_gradients,
    ring_gather_stages,
)
from schedlang.runtime.attention_parts import AttentionPart, attend_in_parts, attention_parts_backward
from schedlang.runtime.packing import ChunkDocuments
from schedlang.vocabulary import AttentionExchange


@dataclass
class LayerKV:
    """One attention layer's buffers for one microbatch: [B, H_kv, T, D] keys and values, and their gradients."""

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
        """The layer's buffers for this microbatch, opened on first use, shaped like ``like`` [B, H_kv, L, D]."""
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
    """Where the chunk a stage runs sits in its microbatch's sequence, with that microbatch's K/V buffers.

    ``start .. end`` are the positions this rank holds; under sequence parallelism ``sequence_slices`` are
    the chunk's positions on each rank of the group, in group-rank order (None: this rank holds the chunk).
    """

    kv: SequenceKV
    microbatch: int
    start: int
    end: int
    sequence_slices: Slices | None = None


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


def _parts(
    keys: torch.Tensor, values: torch.Tensor, start: int, prefix_start: int = 0, end: int | None = None
) -> tuple[AttentionPart, AttentionPart]:
    """The prefix ``prefix_start .. start`` (all visible) and the own block ``start .. end`` (causal)."""
    return (
        AttentionPart(keys[:, :, prefix_start:start], values[:, :, prefix_start:start], causal=False),
        AttentionPart(keys[:, :, start:end], values[:, :, start:end], causal=True),
    )


def _parts_during_ring(
    keys: torch.Tensor, values: torch.Tensor, start: int, chunk_start: int, ring: Iterator[None]
) -> Iterator[AttentionPart]:
    """The keys of :func:`_parts` in the order the ring makes them present: the earlier chunks' and this
    rank's own block while the ring's first step travels, then, once the ring has run to its end, the earlier
    ranks' slices of this chunk (``chunk_start .. start``)."""
    next(ring, None)
    yield AttentionPart(keys[:, :, :chunk_start], values[:, :, :chunk_start], causal=False)
    yield AttentionPart(keys[:, :, start:], values[:, :, start:], causal=True)
    for _ in ring:
        pass
    yield AttentionPart(keys[:, :, chunk_start:start], values[:, :, chunk_start:start], causal=False)


def _exchanged_parts(
    keys, values, start, buffers: LayerKV, slices, group, exchange: AttentionExchange
) -> Iterable[AttentionPart]:
    """The parts of :func:`_parts`, the other ranks' slices of the chunk brought into ``buffers`` over ``group``
    (None: nothing to bring) by ``exchange`` ([Note: sequence-parallel attention]); the ring's parts come as it
    runs (:func:`_parts_during_ring`)."""
    if group is not None and exchange is AttentionExchange.RING:
        ring = ring_gather_stages(buffers.keys, buffers.values, slices, group)
        return _parts_during_ring(keys, values, start, slices[0][0], ring)
    if group is not None:
        gather_chunk(buffers.keys, buffers.values, slices, group)
    return _parts(keys, values, start)


def _document_pieces(documents: ChunkDocuments):
    """Per row and document piece: (row, the piece's first and end position, where its prefix starts)."""
    for row in range(documents.rows):
        for first, end in documents.pieces(row):
            prefix_start = documents.first_starts[row] if first == documents.start else first
            yield row, first, end, prefix_start


def _attend_by_document(q, keys, values, documents: ChunkDocuments):
    """(output, log-sum-exp) of the chunk's queries, each over its own document's keys: see the note."""
    output = torch.empty_like(q)
    log_sum_exp = None
    for row, first, end, prefix_start in _document_pieces(documents):
        rows, local = slice(row, row + 1), slice(first - documents.start, end - documents.start)
        piece_output, piece_log_sum_exp = attend_in_parts(
            q[rows, :, local], _parts(keys[rows], values[rows], first, prefix_start, end)
        )
        if log_sum_exp is None:
            log_sum_exp = q.new_empty(q.shape[:3], dtype=piece_log_sum_exp.dtype)
        output[rows, :, local] = piece_output
        log_sum_exp[rows, :, local] = piece_log_sum_exp
    return output, log_sum_exp


def _attention_backward_by_document(output_grad, q, keys, values, output, log_sum_exp, documents, gradients):
    """``dq``; adds each piece's key and value gradients into ``gradients`` (the sequence-wide buffers)."""
    key_grads, value_grads = gradients
    dq = torch.empty_like(q)
    for row, first, end, prefix_start in _document_pieces(documents):
        rows, local = slice(row, row + 1), slice(first - documents.start, end - documents.start)
        piece_dq, (prefix_grads, own_grads) = attention_parts_backward(
            output_grad[rows, :, local],
            q[rows, :, local],
            _parts(keys[rows], values[rows], first, prefix_start, end),
            output[rows, :, local],
            log_sum_exp[rows, :, local].contiguous(),
        )
        dq[rows, :, local] = piece_dq
        if prefix_grads is not None:
            key_grads[rows, :, prefix_start:first] += prefix_grads[0]
            value_grads[rows, :, prefix_start:first] += prefix_grads[1]
        key_grads[rows, :, first:end] += own_grads[0]
        value_grads[rows, :, first:end] += own_grads[1]
    return dq


class BufferedChunkAttention(torch.autograd.Function):
    """Attention of one chunk's q ([B, H, L, D]) and k, v ([B, H_kv, L, D], ``H_kv`` dividing ``H``) over the
    sequence-wide buffers; see the note.

    ``group``: the sequence-parallel group the chunk is split over (then ``chunk.position.sequence_slices``
    says how), or None. ``documents``: the chunk's packed documents ([Note: documents in the K/V buffers]), or
    None. ``exchange``: how the group's ranks exchange their slices ([Note: sequence-parallel attention]).
    """

    @staticmethod
    def forward(
        ctx,
        q,
        k,
        v,
        chunk: AttentionChunk,
        group: dist.ProcessGroup | None,
        documents: ChunkDocuments | None = None,
        exchange: AttentionExchange = AttentionExchange.ALLGATHER,
    ):
        buffers, start, end = chunk.buffers(k), chunk.position.start, chunk.position.end
        slices, exchange = chunk.position.sequence_slices, AttentionExchange(exchange)
        if group is not None and slices is None:
            raise ValueError("sequence-parallel attention needs the chunk's sequence_slices")
        if documents is not None and not documents.masks_keys:
            documents = None
        if documents is not None and group is not None:
            raise ValueError("packed documents do not run sequence-parallel")
        buffers.keys[:, :, start:end] = k
        buffers.values[:, :, start:end] = v
        keys, values = _alias(buffers.keys[:, :, :end]), _alias(buffers.values[:, :, :end])
        if documents is None:
            parts = _exchanged_parts(keys, values, start, buffers, slices, group, exchange)
            output, log_sum_exp = attend_in_parts(q, parts)
        else:
            output, log_sum_exp = _attend_by_document(q, keys, values, documents)
        ctx.save_for_backward(q, keys, values, output, log_sum_exp)
        ctx.buffers, ctx.start, ctx.end, ctx.slices, ctx.group = buffers, start, end, slices, group
        ctx.documents, ctx.exchange = documents, exchange
        return output

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, output_grad):
        q, keys, values, output, log_sum_exp = ctx.saved_tensors
        start, end = ctx.start, ctx.end
        key_grads, value_grads = ctx.buffers.gradient_buffers()
        if ctx.documents is not None:
            dq = _attention_backward_by_document(
                output_grad, q, keys, values, output, log_sum_exp, ctx.documents, (key_grads, value_grads)
            )
        else:
            dq, (prefix_grads, own_grads) = attention_parts_backward(
                output_grad, q, _parts(keys, values, start), output, log_sum_exp
            )
            if prefix_grads is not None:
                key_grads[:, :, :start] += prefix_grads[0]
                value_grads[:, :, :start] += prefix_grads[1]
            key_grads[:, :, start:end] += own_grads[0]
            value_grads[:, :, start:end] += own_grads[1]
        if ctx.group is not None:
            ring = ctx.exchange is AttentionExchange.RING
            exchange_gradients = ring_chunk_gradients if ring else reduce_scatter_chunk_gradients
            dk, dv = exchange_gradients(key_grads, value_grads, ctx.slices, ctx.group)
        else:
            dk, dv = key_grads[:, :, start:end], value_grads[:, :, start:end]
        ctx.buffers = ctx.documents = None
        return dq, dk, dv, None, None, None, None
