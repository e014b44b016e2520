"""Softmax attention over a sequence-parallel group: keys and values all-gathered, their gradients reduce-scattered.

[Note: sequence-parallel attention]
Under ``mesh.sequence = S`` every chunk is split contiguously over the ``S`` ranks of the group
([Note: sequence-parallel chunks] in :mod:`schedlang.runtime.executor`): rank ``r`` holds the queries,
keys and values of positions ``s_r .. e_r - 1`` of the chunk ``c .. c'``. Its queries need every key
before ``e_r``: those of earlier chunks and of the earlier ranks' slices of this chunk. As LASP-2H does for
hybrids, the forward of each chunk all-gathers the slices' keys and values over the group (one collective
moving the chunk's K/V, each slice padded to the longest) into every rank's sequence-wide buffers
([Note: sequence-wide K/V] in :mod:`schedlang.runtime.kv_buffers`). Since every chunk's forward gathers
before the next chunk runs, each rank's buffers hold the whole prefix of the sequence without any further
message, and rank ``r`` attends to ``buffer[:e_r]`` in parts ([Note: attention in parts]).

The backward is the adjoint. Each rank accumulates the gradients its queries give to keys and values before
its slice into its own sequence-wide gradient buffers (positions of earlier chunks and of earlier ranks'
slices of this chunk alike). When ``B(a, i)`` runs, every later chunk's backward has run on every rank, so
the chunk's region of each rank's gradient buffers is complete; one reduce-scatter over the group sums the
region over the ranks and hands each rank the total for its own slice, which is what its keys and values
receive. The gather buffers hold, per attention layer and open microbatch, ``2 x B x H_kv x T x D`` elements of
keys and values and as many of their gradients (the whole sequence on every rank), plus one chunk's padded
slices in flight (``2 x S x B x H_kv x ceil(L / S) x D`` each way): ``H_kv`` key/value heads, shared with
the query heads only inside the kernels ([Note: grouped key/value heads] in
:mod:`schedlang.runtime.attention_parts`).

Every rank of the group runs the same action list, so the collectives of each chunk and layer meet.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

Slices = tuple[tuple[int, int], ...]


def _width(slices: Slices) -> int:
    return max(end - start for start, end in slices)


def gather_chunk(keys: torch.Tensor, values: torch.Tensor, slices: Slices, group: dist.ProcessGroup) -> None:
    """Write every rank's slice of the chunk, ``slices[r]`` of group rank ``r``, into this rank's sequence-wide
    buffers ``keys`` and ``values`` ``[B, H_kv, T, D]``.

    On entry this rank's own slice is in the buffers; one ``all_gather`` brings the others'.
    """
    rank = dist.get_rank(group)
    width = _width(slices)
    start, end = slices[rank]
    batch, heads, _, dim = keys.shape
    # [2 (keys, values), B, H_kv, width, D]
    local = keys.new_zeros((2, batch, heads, width, dim))
    local[0, :, :, : end - start] = keys[:, :, start:end]
    local[1, :, :, : end - start] = values[:, :, start:end]
    gathered = [torch.empty_like(local) for _ in slices]
    dist.all_gather(gathered, local, group=group)
    for other, (other_start, other_end) in enumerate(slices):
        if other != rank:
            keys[:, :, other_start:other_end] = gathered[other][0, :, :, : other_end - other_start]
            values[:, :, other_start:other_end] = gathered[other][1, :, :, : other_end - other_start]


def reduce_scatter_chunk_gradients(
    key_grads: torch.Tensor, value_grads: torch.Tensor, slices: Slices, group: dist.ProcessGroup
) -> tuple[torch.Tensor, torch.Tensor]:
    """The chunk's key and value gradients summed over the group, this rank's slice ``[B, H_kv, e - s, D]`` of each.

    ``key_grads`` and ``value_grads`` are this rank's sequence-wide gradient buffers, complete over the
    chunk's region ``slices[0][0] .. slices[-1][1]``.
    """
    rank = dist.get_rank(group)
    width = _width(slices)
    batch, heads, _, dim = key_grads.shape
    contributions = []
    for start, end in slices:
        # [2 (keys, values), B, H_kv, width, D]
        contribution = key_grads.new_zeros((2, batch, heads, width, dim))
        contribution[0, :, :, : end - start] = key_grads[:, :, start:end]
        contribution[1, :, :, : end - start] = value_grads[:, :, start:end]
        contributions.append(contribution)
    total = torch.empty_like(contributions[0])
    dist.reduce_scatter(total, contributions, group=group)
    length = slices[rank][1] - slices[rank][0]
    return total[0, :, :, :length], total[1, :, :, :length]
