"""Chunked softmax attention over the sequence-wide K/V buffers: exact in parts, linear saved memory, and exact
across a sequence-parallel group.

* [Note: attention in parts]: the prefix and the chunk's own causal block merged by log-sum-exp equal one
  causal attention over the whole sequence, forward and gradients, with each kernel (torch's CPU flash
  attention, and the tensor-op form used where no fused kernel takes the dtype).
* [Note: sequence-wide K/V]: the bytes autograd saves for a sequence (distinct storages seen by
  ``saved_tensors_hooks``: an alias of a buffer is not a copy) do not grow with the chunk count and grow
  linearly with the sequence: no chunk saves its prefix, nor a (queries x keys) mask or matrix.
* [Note: sequence-parallel attention]: chunks split over 2 and 3 gloo ranks, uneven slices, give every rank's
  outputs and q/k/v gradients of the single-device attention, with the slices all-gathered or passed around a
  ring; the ring leaves the buffers and gradient slices the all-gather and the reduce-scatter leave.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from schedlang.runtime import attention_parts
from schedlang.runtime.attention_parallel import (
    gather_chunk,
    reduce_scatter_chunk_gradients,
    ring_chunk_gradients,
    ring_gather_chunk,
)
from schedlang.runtime.attention_parts import AttentionPart, PartKernel, attend_in_parts, attention_parts_backward
from schedlang.runtime.kv_buffers import (
    AttentionChunk,
    BufferedChunkAttention,
    ChunkPosition,
    SequenceKV,
    _parts_during_ring,
)
from schedlang.vocabulary import AttentionExchange

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "runtime_sp"))

from sp_harness import chunk_slices, run_on_ranks  # noqa: E402

BATCH, HEADS, DIM = 2, 2, 16


def whole_sequence(length: int, dtype=torch.float64, seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    return [torch.randn(BATCH, HEADS, length, DIM, dtype=dtype, generator=generator) for _ in range(4)]


@pytest.mark.parametrize("kernel", [PartKernel.CPU_FLASH, PartKernel.TENSOR_OPS])
@pytest.mark.parametrize("start, end", [(0, 37), (23, 37), (36, 37), (1, 63)])
def test_attention_in_parts_equals_causal_attention(kernel, start, end, monkeypatch):
    monkeypatch.setattr(attention_parts, "part_kernel", lambda q: kernel)
    q, k, v, output_grad = whole_sequence(end)
    reference_leaves = [tensor.clone().requires_grad_(True) for tensor in (q, k, v)]
    reference = F.scaled_dot_product_attention(*reference_leaves, is_causal=True)[:, :, start:]
    reference.backward(output_grad[:, :, start:])
    parts = (
        AttentionPart(k[:, :, :start], v[:, :, :start], causal=False),
        AttentionPart(k[:, :, start:], v[:, :, start:], causal=True),
    )
    output, log_sum_exp = attend_in_parts(q[:, :, start:], parts)
    torch.testing.assert_close(output, reference.detach(), rtol=1e-12, atol=1e-12)
    dq, part_grads = attention_parts_backward(output_grad[:, :, start:], q[:, :, start:], parts, output, log_sum_exp)
    torch.testing.assert_close(dq, reference_leaves[0].grad[:, :, start:], rtol=1e-10, atol=1e-12)
    assert (part_grads[0] is None) == (start == 0)
    for index, (dk, dv) in enumerate(grads for grads in part_grads if grads is not None):
        keys = slice(0, start) if start and index == 0 else slice(start, end)
        torch.testing.assert_close(dk, reference_leaves[1].grad[:, :, keys], rtol=1e-10, atol=1e-12)
        torch.testing.assert_close(dv, reference_leaves[2].grad[:, :, keys], rtol=1e-10, atol=1e-12)


CUDA_CASES = [
    (torch.bfloat16, PartKernel.CUDA_FLASH),
    (torch.float16, PartKernel.CUDA_FLASH),
    (torch.float32, PartKernel.CUDA_EFFICIENT),
    (torch.bfloat16, PartKernel.CUDA_EFFICIENT),  # head dimensions flash does not take
]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
@pytest.mark.parametrize("dtype, kernel", CUDA_CASES)
def test_attention_in_parts_on_cuda_matches_float64(dtype, kernel, monkeypatch):
    """The CUDA kernels in 16 and 32 bits (flash attention for 16-bit inputs, the float32 memory-efficient
    kernels otherwise): outputs and gradients against float64 causal attention, relative errors within the
    input dtype's tolerance."""
    start, end = 384, 1024
    q, k, v, output_grad = [tensor.cuda() for tensor in whole_sequence(end)]
    reference_leaves = [tensor.clone().requires_grad_(True) for tensor in (q, k, v)]
    reference = F.scaled_dot_product_attention(*reference_leaves, is_causal=True)[:, :, start:]
    reference.backward(output_grad[:, :, start:])
    q16, k16, v16, g16 = (tensor.to(dtype) for tensor in (q, k, v, output_grad))
    parts = (
        AttentionPart(k16[:, :, :start], v16[:, :, :start], causal=False),
        AttentionPart(k16[:, :, start:], v16[:, :, start:], causal=True),
    )
    chosen = attention_parts.part_kernel(q16)
    if kernel is PartKernel.CUDA_FLASH or dtype is torch.float32:
        assert chosen is kernel
    monkeypatch.setattr(attention_parts, "part_kernel", lambda q: kernel)
    output, log_sum_exp = attend_in_parts(q16[:, :, start:], parts)
    dq, ((dk_prefix, dv_prefix), (dk_own, dv_own)) = attention_parts_backward(
        g16[:, :, start:], q16[:, :, start:], parts, output, log_sum_exp
    )
    tolerance = {torch.bfloat16: 2e-2, torch.float16: 4e-3, torch.float32: 1e-4}[dtype]

    def relative_error(ours, theirs):
        assert torch.isfinite(ours).all()
        return ((ours.double() - theirs).norm() / theirs.norm()).item()

    assert relative_error(output, reference.detach()) < tolerance
    assert relative_error(dq, reference_leaves[0].grad[:, :, start:]) < tolerance
    assert relative_error(torch.cat([dk_prefix, dk_own], 2), reference_leaves[1].grad) < tolerance
    assert relative_error(torch.cat([dv_prefix, dv_own], 2), reference_leaves[2].grad) < tolerance


def saved_bytes_of_chunks(length: int, n_chunks: int) -> int:
    """Distinct storage bytes autograd saves running one attention layer's chunks of one sequence."""
    q, k, v, _ = whole_sequence(length, torch.float32)
    kv, saved = SequenceKV(length), {}

    def pack(tensor):
        storage = tensor.untyped_storage()
        saved[storage.data_ptr()] = storage.nbytes()
        return tensor

    bounds = [length * index // n_chunks for index in range(n_chunks + 1)]
    leaves = [tensor.requires_grad_(True) for tensor in (q, k, v)]
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        for start, end in zip(bounds, bounds[1:]):
            chunk = AttentionChunk(ChunkPosition(kv, 0, start, end), layer=0)
            # the projections' outputs as the model hands them on: fresh tensors per chunk
            q_chunk, k_chunk, v_chunk = (leaf[:, :, start:end] * 1.0 for leaf in leaves)
            BufferedChunkAttention.apply(q_chunk, k_chunk, v_chunk, chunk, None)
    return sum(saved.values())


def test_saved_bytes_do_not_grow_with_the_chunk_count_and_are_linear_in_the_sequence():
    four, sixteen = saved_bytes_of_chunks(512, 4), saved_bytes_of_chunks(512, 16)
    assert sixteen <= four, (four, sixteen)
    double = saved_bytes_of_chunks(1024, 16)
    assert double <= 2.1 * sixteen, (sixteen, double)  # the (queries x keys) mask made this 3x


def _sequence_parallel_worker(
    rank: int, world_size: int, chunk_bounds: tuple[int, ...], exchange: AttentionExchange
) -> None:
    import torch.distributed as dist

    length = chunk_bounds[-1]
    q, k, v, output_grad = whole_sequence(length, seed=3)
    reference_leaves = [tensor.clone().requires_grad_(True) for tensor in (q, k, v)]
    reference = F.scaled_dot_product_attention(*reference_leaves, is_causal=True)
    reference.backward(output_grad)
    kv, group = SequenceKV(length), dist.group.WORLD
    leaves = [tensor.clone().requires_grad_(True) for tensor in (q, k, v)]
    outputs = []
    for chunk_start, chunk_end in zip(chunk_bounds, chunk_bounds[1:]):
        slices = chunk_slices(chunk_start, chunk_end, world_size)
        start, end = slices[rank]
        chunk = AttentionChunk(ChunkPosition(kv, 0, start, end, slices), layer=0)
        mine = [leaf[:, :, start:end] for leaf in leaves]
        outputs.append(((start, end), BufferedChunkAttention.apply(*mine, chunk, group, None, exchange)))
    for (start, end), output in reversed(outputs):  # B(a, i + 1) before B(a, i), as Eq. 8 orders them
        torch.testing.assert_close(output, reference[:, :, start:end].detach(), rtol=1e-12, atol=1e-12)
        output.backward(output_grad[:, :, start:end])
    for (start, end), _ in outputs:
        for leaf, reference_leaf in zip(leaves, reference_leaves):
            torch.testing.assert_close(
                leaf.grad[:, :, start:end], reference_leaf.grad[:, :, start:end], rtol=1e-10, atol=1e-12
            )


@pytest.mark.slow
@pytest.mark.parametrize("exchange", list(AttentionExchange))
@pytest.mark.parametrize("world_size, chunk_bounds", [(2, (0, 13, 40, 41 + 20)), (3, (0, 30, 47))])
def test_sequence_parallel_attention_equals_one_device(world_size, chunk_bounds, exchange):
    run_on_ranks(world_size, _sequence_parallel_worker, chunk_bounds, exchange)


def _rank_tensors(seed: int, length: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(BATCH, HEADS, length, DIM, dtype=torch.float64, generator=generator) for _ in range(2))


def _exchange_worker(rank: int, world_size: int, slices: tuple[tuple[int, int], ...], length: int) -> None:
    import torch.distributed as dist

    group = dist.group.WORLD
    whole_keys, whole_values = _rank_tensors(0, length)
    start, end = slices[rank]
    gathered = {}
    for name, gather in (("allgather", gather_chunk), ("ring", ring_gather_chunk)):
        # NaN where this rank holds nothing: a position the exchange does not write shows
        keys, values = torch.full_like(whole_keys, float("nan")), torch.full_like(whole_values, float("nan"))
        keys[:, :, start:end], values[:, :, start:end] = whole_keys[:, :, start:end], whole_values[:, :, start:end]
        gather(keys, values, slices, group)
        gathered[name] = keys, values
    region = slice(slices[0][0], slices[-1][1])
    for keys, values in gathered.values():
        torch.testing.assert_close(keys[:, :, region], whole_keys[:, :, region], rtol=0, atol=0)
        torch.testing.assert_close(values[:, :, region], whole_values[:, :, region], rtol=0, atol=0)
    for ring, allgather in zip(gathered["ring"], gathered["allgather"]):
        torch.testing.assert_close(ring, allgather, rtol=0, atol=0, equal_nan=True)

    # each rank's gradient buffers from a seed of its own; the reference sums every rank's in one process
    key_grads, value_grads = _rank_tensors(100 + rank, length)
    every_rank = [_rank_tensors(100 + other, length) for other in range(world_size)]
    expected = [sum(tensors[index] for tensors in every_rank)[:, :, start:end] for index in range(2)]
    for reduce in (reduce_scatter_chunk_gradients, ring_chunk_gradients):
        for ours, theirs in zip(reduce(key_grads.clone(), value_grads.clone(), slices, group), expected):
            torch.testing.assert_close(ours, theirs, rtol=1e-12, atol=1e-12)


@pytest.mark.slow
@pytest.mark.parametrize(
    "slices", [((3, 10), (10, 14)), ((5, 9), (9, 20), (20, 22))], ids=["S2-unequal", "S3-unequal"]
)
def test_ring_exchange_leaves_what_the_collectives_leave(slices):
    run_on_ranks(len(slices), _exchange_worker, slices, 25)


def test_the_ring_attends_to_what_is_present_while_its_first_step_travels():
    """The earlier chunks' keys (0 .. 4) and the rank's own block (10 .. 16) are handed to the kernels after the
    first step is posted and before the ring is awaited; the earlier ranks' slices (4 .. 10) after it ends."""
    events = []

    def ring():
        events.append("posted")
        yield
        events.append("ring ended")

    keys, values, _, _ = whole_sequence(16)
    spans = []
    for part in _parts_during_ring(keys, values, 10, 4, ring()):
        events.append("part")
        width = part.keys.shape[2]
        start = next(index for index in range(17) if torch.equal(keys[:, :, index : index + width], part.keys))
        spans.append((start, start + width, part.causal))
    assert events == ["posted", "part", "part", "ring ended", "part"]
    assert spans == [(0, 4, False), (10, 16, True), (4, 10, False)]
