"""Softmax attention over a sequence-parallel group: keys and values all-gathered or passed around a ring, their
gradients reduce-scattered or accumulated around the ring.

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

``sequence.attention = ring`` exchanges the same slices point to point instead: ``S - 1`` steps, in each of
which every rank sends the slice it last received (its own first) to the next rank of the group and receives
the previous rank's, so after the last step the buffers hold exactly what the all-gather leaves. While the
first step travels a rank already attends to the keys it holds, the earlier chunks' and its own block's,
and to the earlier ranks' slices once the ring has ended (the parts merged by log-sum-exp as ever). The
backward is its adjoint: ``S - 1`` steps the other way round, each rank adding its own contribution for the
slice it receives and passing the partial sum on, so that after the last step each rank holds its own
slice's total, what the reduce-scatter hands it (summed in another order). In flight are one padded slice
arriving and one leaving (``2 x 2 x B x H_kv x ceil(L / S) x D`` each way) instead of ``S``, at ``S - 1``
message latencies instead of the all-gather's ``ceil(log2 S)``: the ring suits large groups and long chunks,
where the all-gather's staging would not fit, or links that serve neighbours best; the all-gather suits
small groups.

Every rank of the group runs the same action list, so the collectives of each chunk and layer meet, and the
ring's steps post their sends and receives as one batch in the same order on every rank.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
import torch.distributed as dist

Slices = tuple[tuple[int, int], ...]


def _width(slices: Slices) -> int:
    return max(end - start for start, end in slices)


def _pack(keys: torch.Tensor, values: torch.Tensor, slice_bounds: tuple[int, int], width: int) -> torch.Tensor:
    """The slice ``slice_bounds`` of ``keys`` and ``values`` ``[B, H_kv, T, D]``, padded with zeros to ``width``
    positions: ``[2 (keys, values), B, H_kv, width, D]``."""
    start, end = slice_bounds
    batch, heads, _, dim = keys.shape
    packed = keys.new_zeros((2, batch, heads, width, dim))
    packed[0, :, :, : end - start] = keys[:, :, start:end]
    packed[1, :, :, : end - start] = values[:, :, start:end]
    return packed


def _unpack_into(keys: torch.Tensor, values: torch.Tensor, packed: torch.Tensor, slice_bounds: tuple[int, int]) -> None:
    """Write a slice packed by :func:`_pack` back at ``slice_bounds`` of ``keys`` and ``values``."""
    start, end = slice_bounds
    keys[:, :, start:end] = packed[0, :, :, : end - start]
    values[:, :, start:end] = packed[1, :, :, : end - start]


def gather_chunk(keys: torch.Tensor, values: torch.Tensor, slices: Slices, group: dist.ProcessGroup) -> None:
    """Write every rank's slice of the chunk, ``slices[r]`` of group rank ``r``, into this rank's sequence-wide
    buffers ``keys`` and ``values`` ``[B, H_kv, T, D]``.

    On entry this rank's own slice is in the buffers; one ``all_gather`` brings the others'.
    """
    rank = dist.get_rank(group)
    local = _pack(keys, values, slices[rank], _width(slices))
    gathered = [torch.empty_like(local) for _ in slices]
    dist.all_gather(gathered, local, group=group)
    for other, other_slice in enumerate(slices):
        if other != rank:
            _unpack_into(keys, values, gathered[other], other_slice)


def reduce_scatter_chunk_gradients(
    key_grads: torch.Tensor, value_grads: torch.Tensor, slices: Slices, group: dist.ProcessGroup
) -> tuple[torch.Tensor, torch.Tensor]:
    """The chunk's key and value gradients summed over the group, this rank's slice ``[B, H_kv, e - s, D]`` of each.

    ``key_grads`` and ``value_grads`` are this rank's sequence-wide gradient buffers, complete over the
    chunk's region ``slices[0][0] .. slices[-1][1]``.
    """
    rank = dist.get_rank(group)
    width = _width(slices)
    contributions = [_pack(key_grads, value_grads, slice_bounds, width) for slice_bounds in slices]
    total = torch.empty_like(contributions[0])
    dist.reduce_scatter(total, contributions, group=group)
    length = slices[rank][1] - slices[rank][0]
    return total[0, :, :, :length], total[1, :, :, :length]


def _post_ring_step(
    outgoing: torch.Tensor, incoming: torch.Tensor, step: int, group: dist.ProcessGroup, forward: bool
) -> list:
    """Start sending ``outgoing`` to the next group rank and receiving ``incoming`` from the previous one
    (``forward``), or the other way round; returns the works to wait on. Both messages are posted as one batch,
    the send first, on every rank alike, and tagged with the step so that a transport matching by tag pairs
    them."""
    size, rank = dist.get_world_size(group), dist.get_rank(group)
    shift = 1 if forward else -1
    operations = [
        dist.P2POp(dist.isend, outgoing, group=group, group_peer=(rank + shift) % size, tag=step),
        dist.P2POp(dist.irecv, incoming, group=group, group_peer=(rank - shift) % size, tag=step),
    ]
    return dist.batch_isend_irecv(operations)


def _wait(works: list) -> None:
    for work in works:
        work.wait()


def ring_gather_stages(
    keys: torch.Tensor, values: torch.Tensor, slices: Slices, group: dist.ProcessGroup
) -> Iterator[None]:
    """:func:`ring_gather_chunk` as a generator that pauses once, after posting the first step's messages and
    before awaiting them: the caller works on what the buffers already hold while they travel, then runs the
    generator to its end, which leaves the buffers complete. Every rank must run it to its end."""
    size, rank = len(slices), dist.get_rank(group)
    width = _width(slices)
    outgoing = _pack(keys, values, slices[rank], width)
    incoming = torch.empty_like(outgoing)
    for step in range(1, size):
        works = _post_ring_step(outgoing, incoming, step, group, forward=True)
        if step == 1:
            yield
        _wait(works)
        _unpack_into(keys, values, incoming, slices[(rank - step) % size])
        outgoing, incoming = incoming, outgoing


def ring_gather_chunk(keys: torch.Tensor, values: torch.Tensor, slices: Slices, group: dist.ProcessGroup) -> None:
    """What :func:`gather_chunk` does, by ``S - 1`` ring steps: at step ``t`` group rank ``r`` passes slice
    ``r - t + 1`` on to rank ``r + 1`` and receives slice ``r - t`` from rank ``r - 1`` (modulo ``S``)."""
    for _ in ring_gather_stages(keys, values, slices, group):
        pass


def ring_chunk_gradients(
    key_grads: torch.Tensor, value_grads: torch.Tensor, slices: Slices, group: dist.ProcessGroup
) -> tuple[torch.Tensor, torch.Tensor]:
    """What :func:`reduce_scatter_chunk_gradients` returns, by ``S - 1`` ring steps the other way round: at step
    ``t`` group rank ``r`` sends the partial sum of slice ``r + t`` to rank ``r - 1`` and receives that of slice
    ``r + t + 1`` from rank ``r + 1``, adding its own contribution (modulo ``S``); the partial sum of a slice
    grows by one rank's contribution per step, and the last step brings each rank its own slice's total."""
    size, rank = len(slices), dist.get_rank(group)
    width = _width(slices)
    outgoing = _pack(key_grads, value_grads, slices[(rank + 1) % size], width)
    incoming = torch.empty_like(outgoing)
    for step in range(1, size):
        _wait(_post_ring_step(outgoing, incoming, step, group, forward=False))
        incoming += _pack(key_grads, value_grads, slices[(rank + step + 1) % size], width)
        outgoing, incoming = incoming, outgoing
    length = slices[rank][1] - slices[rank][0]
    return outgoing[0, :, :, :length], outgoing[1, :, :, :length]
