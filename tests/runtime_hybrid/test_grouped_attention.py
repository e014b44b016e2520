"""Grouped key/value heads in chunked softmax attention ([Note: grouped key/value heads] in
schedlang.runtime.attention_parts): the sequence-wide K/V buffers, their gradient buffers and the
sequence-parallel messages hold the ``H_kv`` key/value heads, the kernels read them at query-head width.

* In parts and chunk by chunk (several chunk counts, packed documents), with each CPU kernel: outputs and the
  q, k, v gradients (k and v as narrow as the projections make them) equal float64 naive attention that
  repeats each key/value head for its query heads in ``HeadMixer.share_kv_heads``' order.
* The ``attn`` mixer: chunked, whole-sequence and naive attention give the same outputs and q/k/v/o
  projection gradients.
* Under ``mesh.sequence = 2`` and 3 on gloo: every rank's outputs and gradients are the one-device ones.
* The buffers and gradient buffers a microbatch opens are ``H / H_kv`` times smaller than without groups.
* On CUDA (skipped without one): the efficient kernels in 16 and 32 bits against float64.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from schedlang.runtime import attention_parts
from schedlang.runtime.attention_parts import (
    AttentionPart,
    PartKernel,
    attend_in_parts,
    attention_parts_backward,
    read_heads,
)
from schedlang.vocabulary import AttentionOptions, ModelConfig, ModelOptions
from schedlang.runtime.kv_buffers import AttentionChunk, BufferedChunkAttention, ChunkPosition, SequenceKV
from schedlang.runtime.mixer_attention import CausalAttentionMixer
from schedlang.runtime.packing import DocumentLayout

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "runtime_sp"))

from sp_harness import chunk_slices, run_on_ranks  # noqa: E402

BATCH, HEADS, DIM = 2, 4, 16
LAYOUT = DocumentLayout(((11, 12), (4, 20, 26)))  # document starts per row: inside and across chunks


def grouped_sequence(length: int, kv_heads: int, dtype=torch.float64, seed: int = 0):
    """q and the output gradient ``[B, H, T, D]``, k and v ``[B, H_kv, T, D]``."""
    generator = torch.Generator().manual_seed(seed)

    def draw(heads):
        return torch.randn(BATCH, heads, length, DIM, dtype=dtype, generator=generator)

    return draw(HEADS), draw(kv_heads), draw(kv_heads), draw(HEADS)


def share_heads(tensor: torch.Tensor, heads: int) -> torch.Tensor:
    """``[B, H_kv, T, D]`` as ``[B, heads, T, D]`` by ``HeadMixer.share_kv_heads``' rule (repeat_interleave)."""
    return tensor.repeat_interleave(heads // tensor.shape[1], dim=1)


def allowed(length: int, layout: DocumentLayout | None) -> torch.Tensor:
    """``[B, 1, T, T]``: True where a query sees a key, causal and (with ``layout``) in its own document."""
    positions = torch.arange(length)
    causal = positions[None, :] <= positions[:, None]
    if layout is None:
        return causal.expand(BATCH, 1, length, length)
    documents = torch.stack(
        [(positions[:, None] >= torch.tensor((0, *starts))[None, :]).sum(dim=1) for starts in layout.starts]
    )
    same = documents[:, None, :, None] == documents[:, None, None, :]
    return same & causal


def naive_attention(q, k, v, mask):
    """Softmax attention written out, each key/value head shared by its consecutive query heads."""
    keys, values = share_heads(k, q.shape[1]), share_heads(v, q.shape[1])
    scores = torch.matmul(q, keys.transpose(-1, -2)) * q.shape[-1] ** -0.5
    return torch.matmul(torch.softmax(scores.masked_fill(~mask, -torch.inf), dim=-1), values)


def naive_reference(q, k, v, output_grad, layout=None):
    """(output, dq, dk, dv) of float64 naive attention."""
    leaves = [tensor.detach().double().requires_grad_(True) for tensor in (q, k, v)]
    output = naive_attention(*leaves, allowed(q.shape[2], layout))
    output.backward(output_grad.double())
    return output.detach(), *(leaf.grad for leaf in leaves)


def test_read_heads_is_the_order_of_share_kv_heads():
    tensor = torch.randn(2, 3, 5, 4)
    assert torch.equal(read_heads(tensor, 6), share_heads(tensor, 6))
    assert torch.equal(read_heads(tensor, 3, torch.float64), tensor.double())
    assert read_heads(tensor, 3) is tensor


@pytest.mark.parametrize("kernel", [PartKernel.CPU_FLASH, PartKernel.TENSOR_OPS])
@pytest.mark.parametrize("kv_heads", [1, 2])
@pytest.mark.parametrize("start, end", [(0, 37), (23, 37), (1, 63)])
def test_grouped_attention_in_parts_equals_naive_float64(kernel, kv_heads, start, end, monkeypatch):
    monkeypatch.setattr(attention_parts, "part_kernel", lambda q: kernel)
    q, k, v, output_grad = grouped_sequence(end, kv_heads)
    expected, dq_expected, dk_expected, dv_expected = naive_reference(q, k, v, output_grad)
    parts = (
        AttentionPart(k[:, :, :start], v[:, :, :start], causal=False),
        AttentionPart(k[:, :, start:], v[:, :, start:], causal=True),
    )
    output, log_sum_exp = attend_in_parts(q[:, :, start:], parts)
    torch.testing.assert_close(output, expected[:, :, start:], rtol=1e-12, atol=1e-12)
    dq, part_grads = attention_parts_backward(output_grad[:, :, start:], q[:, :, start:], parts, output, log_sum_exp)
    torch.testing.assert_close(dq, dq_expected[:, :, start:], rtol=1e-10, atol=1e-12)
    grads = [grads for grads in part_grads if grads is not None]
    dk, dv = torch.cat([dk for dk, _ in grads], dim=2), torch.cat([dv for _, dv in grads], dim=2)
    assert dk.shape == dv.shape == (BATCH, kv_heads, end, DIM)
    # keys before ``start`` receive only the gradients of the queries from ``start`` on: the naive run's
    # gradients from the queries before ``start`` are taken out by running them alone
    if start:
        _, _, dk_before, dv_before = naive_reference(
            q[:, :, :start], k[:, :, :start], v[:, :, :start], output_grad[:, :, :start]
        )
        dk_expected, dv_expected = dk_expected.clone(), dv_expected.clone()
        dk_expected[:, :, :start] -= dk_before
        dv_expected[:, :, :start] -= dv_before
    torch.testing.assert_close(dk, dk_expected, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(dv, dv_expected, rtol=1e-10, atol=1e-12)


def chunk_by_chunk(q, k, v, output_grad, bounds, layout=None):
    """(output, dq, dk, dv) of the chunks through one microbatch's buffers, backwards in reverse chunk order;
    and the buffers."""
    kv = SequenceKV(bounds[-1])
    leaves = [tensor.clone().requires_grad_(True) for tensor in (q, k, v)]
    outputs = []
    for start, end in zip(bounds, bounds[1:]):
        chunk = AttentionChunk(ChunkPosition(kv, 0, start, end), layer=0)
        documents = None if layout is None else layout.chunk(0, BATCH, start, end)
        mine = [leaf[:, :, start:end] * 1.0 for leaf in leaves]
        outputs.append(BufferedChunkAttention.apply(*mine, chunk, None, documents))
    for (start, end), output in reversed(list(zip(zip(bounds, bounds[1:]), outputs))):
        output.backward(output_grad[:, :, start:end])
    (buffers,) = kv.open.values()
    return torch.cat(outputs, dim=2).detach(), *(leaf.grad for leaf in leaves), buffers


@pytest.mark.parametrize("kernel", [PartKernel.CPU_FLASH, PartKernel.TENSOR_OPS])
@pytest.mark.parametrize("kv_heads", [1, 2])
@pytest.mark.parametrize("bounds", [(0, 30), (0, 15, 30), (0, 7, 19, 30), (0, 1, 2, 11, 29, 30)])
@pytest.mark.parametrize("packed", [False, True])
def test_grouped_chunks_equal_naive_float64(kernel, kv_heads, bounds, packed, monkeypatch):
    monkeypatch.setattr(attention_parts, "part_kernel", lambda q: kernel)
    layout = LAYOUT if packed else None
    q, k, v, output_grad = grouped_sequence(bounds[-1], kv_heads, seed=len(bounds))
    *ours, buffers = chunk_by_chunk(q, k, v, output_grad, bounds, layout)
    for name, got, expected in zip(("output", "dq", "dk", "dv"), ours, naive_reference(q, k, v, output_grad, layout)):
        torch.testing.assert_close(got, expected, rtol=1e-10, atol=1e-12, msg=name)
    narrow = (BATCH, kv_heads, bounds[-1], DIM)
    assert buffers.keys.shape == buffers.values.shape == buffers.key_grads.shape == buffers.value_grads.shape == narrow


@pytest.mark.parametrize("kv_heads", [1, 2, 4])
def test_buffers_shrink_by_the_group(kv_heads):
    """One microbatch's buffers and gradient buffers hold ``H_kv`` heads: ``H / H_kv`` times fewer bytes."""
    length = 24
    q, k, v, output_grad = grouped_sequence(length, kv_heads, torch.float32)
    *_, buffers = chunk_by_chunk(q, k, v, output_grad, (0, 8, 24))
    per_buffer = BATCH * HEADS * length * DIM * 4 // (HEADS // kv_heads)
    assert buffers.keys.nbytes == buffers.values.nbytes == per_buffer
    assert buffers.key_grads.nbytes == buffers.value_grads.nbytes == per_buffer


def _mixer(kv_heads: int) -> CausalAttentionMixer:
    options = AttentionOptions(heads=HEADS, head_dim=8, kv_heads=kv_heads, qkv_bias=True)
    config = ModelConfig(
        vocab=8, d_model=24, layers=("attn",), heads=1, head_dim=1, options=ModelOptions(attention=options)
    )
    mixer = CausalAttentionMixer(config).double()
    with torch.no_grad():
        for name, parameter in mixer.named_parameters():
            parameter.copy_(torch.randn(parameter.shape, generator=torch.Generator().manual_seed(len(name))) * 0.3)
    return mixer


def _mixer_run(mixer, hidden, bounds, layout):
    """(output, gradients of every parameter) of ``(output ** 2).sum()``; ``bounds`` None: the whole sequence."""
    mixer.zero_grad()
    if bounds is None:
        documents = None if layout is None else layout.chunk(0, BATCH, 0, hidden.shape[1])
        outputs = [mixer(hidden, None, documents)[0]]
    else:
        kv, outputs = SequenceKV(hidden.shape[1]), []
        for start, end in zip(bounds, bounds[1:]):
            documents = None if layout is None else layout.chunk(0, BATCH, start, end)
            chunk = AttentionChunk(ChunkPosition(kv, 0, start, end), layer=0)
            outputs.append(mixer(hidden[:, start:end], chunk, documents)[0])
    for output in reversed(outputs):
        (output**2).sum().backward()
    return torch.cat(outputs, dim=1).detach(), {name: p.grad.clone() for name, p in mixer.named_parameters()}


def _mixer_naive(mixer, hidden, layout):
    """The same through the mixer's projections and ``share_kv_heads``, then naive attention."""
    mixer.zero_grad()
    q, k, v = mixer.project_qkv(hidden)
    q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
    mixed = naive_attention(q, k, v, allowed(hidden.shape[1], layout))
    output = mixer.o_proj(mixed.transpose(1, 2).reshape(hidden.shape[0], hidden.shape[1], -1))
    (output**2).sum().backward()
    return output.detach(), {name: p.grad.clone() for name, p in mixer.named_parameters()}


@pytest.mark.parametrize("kv_heads", [1, 2])
@pytest.mark.parametrize("packed", [False, True])
def test_grouped_attn_mixer_chunked_whole_and_naive_agree(kv_heads, packed):
    layout = LAYOUT if packed else None
    mixer = _mixer(kv_heads)
    hidden = torch.randn(BATCH, 30, 24, dtype=torch.float64, generator=torch.Generator().manual_seed(4))
    expected, expected_grads = _mixer_naive(mixer, hidden, layout)
    assert {"q_proj.weight", "k_proj.weight", "v_proj.weight", "k_proj.bias"} <= set(expected_grads)
    for bounds in (None, (0, 30), (0, 13, 30), (0, 5, 17, 22, 30)):
        output, grads = _mixer_run(mixer, hidden, bounds, layout)
        torch.testing.assert_close(output, expected, rtol=0, atol=1e-10, msg=str(bounds))
        for name, gradient in grads.items():
            torch.testing.assert_close(gradient, expected_grads[name], rtol=0, atol=1e-10, msg=f"{bounds} {name}")


def _sequence_parallel_worker(rank: int, world_size: int, kv_heads: int, chunk_bounds: tuple[int, ...]) -> None:
    import torch.distributed as dist

    length = chunk_bounds[-1]
    q, k, v, output_grad = grouped_sequence(length, kv_heads, seed=3)
    expected, *expected_grads = naive_reference(q, k, v, output_grad)
    kv, group = SequenceKV(length), dist.group.WORLD
    leaves = [tensor.clone().requires_grad_(True) for tensor in (q, k, v)]
    outputs = []
    for chunk_start, chunk_end in zip(chunk_bounds, chunk_bounds[1:]):
        slices = chunk_slices(chunk_start, chunk_end, world_size)
        start, end = slices[rank]
        chunk = AttentionChunk(ChunkPosition(kv, 0, start, end, slices), layer=0)
        mine = [leaf[:, :, start:end] for leaf in leaves]
        outputs.append(((start, end), BufferedChunkAttention.apply(*mine, chunk, group)))
    (buffers,) = kv.open.values()
    assert buffers.keys.shape == (BATCH, kv_heads, length, DIM)
    for (start, end), output in reversed(outputs):  # B(a, i + 1) before B(a, i), as Eq. 8 orders them
        torch.testing.assert_close(output, expected[:, :, start:end], rtol=1e-12, atol=1e-12)
        output.backward(output_grad[:, :, start:end])
    assert buffers.key_grads.shape == (BATCH, kv_heads, length, DIM)
    for (start, end), _ in outputs:
        for leaf, expected_grad in zip(leaves, expected_grads):
            torch.testing.assert_close(
                leaf.grad[:, :, start:end], expected_grad[:, :, start:end], rtol=1e-10, atol=1e-12
            )


@pytest.mark.slow
@pytest.mark.parametrize(
    "world_size, kv_heads, chunk_bounds", [(2, 2, (0, 13, 40, 61)), (2, 1, (0, 30, 47)), (3, 2, (0, 30, 47))]
)
def test_grouped_sequence_parallel_attention_equals_naive(world_size, kv_heads, chunk_bounds):
    run_on_ranks(world_size, _sequence_parallel_worker, kv_heads, chunk_bounds)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("kv_heads", [1, 2])
def test_gpu_grouped_chunks_match_float64(dtype, kv_heads):
    """The CUDA kernels (flash attention for 16-bit inputs, float32 memory-efficient attention for float32)
    chunk by chunk with grouped heads: outputs and q/k/v gradients against float64 naive attention, within
    the input dtype's tolerance."""
    bounds = (0, 384, 700, 1024)
    q, k, v, output_grad = grouped_sequence(bounds[-1], kv_heads)
    expected = naive_reference(q, k, v, output_grad)
    inputs = [tensor.to(device="cuda", dtype=dtype) for tensor in (q, k, v, output_grad)]
    expected_kernel = PartKernel.CUDA_EFFICIENT if dtype is torch.float32 else PartKernel.CUDA_FLASH
    assert attention_parts.part_kernel(inputs[0]) is expected_kernel
    *ours, buffers = chunk_by_chunk(*inputs, bounds)
    assert buffers.keys.shape == (BATCH, kv_heads, bounds[-1], DIM) and buffers.keys.dtype == dtype
    tolerance = {torch.bfloat16: 2e-2, torch.float16: 4e-3, torch.float32: 1e-4}[dtype]
    for name, got, reference in zip(("output", "dq", "dk", "dv"), ours, expected):
        assert torch.isfinite(got).all(), name
        error = ((got.double().cpu() - reference).norm() / reference.norm()).item()
        assert error < tolerance, (name, error)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
@pytest.mark.parametrize("kv_heads", [1, 2])
def test_gpu_grouped_whole_sequence_path_matches_float64(kv_heads):
    """The whole-sequence path (``F.scaled_dot_product_attention`` over the shared heads) on CUDA."""
    mixer = _mixer(kv_heads)
    hidden = torch.randn(BATCH, 300, 24, dtype=torch.float64, generator=torch.Generator().manual_seed(4))
    expected, _ = _mixer_naive(mixer, hidden, None)
    with torch.no_grad():
        output = mixer.float().cuda()(hidden.float().cuda(), None)[0]
    assert ((output.double().cpu() - expected).norm() / expected.norm()).item() < 1e-4


def test_the_whole_sequence_path_takes_grouped_heads_as_f_scaled_dot_product_attention_with_enable_gqa():
    """``read_heads`` then plain attention is torch's own grouped-query attention (which shares heads in the
    same order), forward and gradients."""
    q, k, v, output_grad = grouped_sequence(19, 2)
    leaves = [tensor.clone().requires_grad_(True) for tensor in (q, k, v)]
    keys, values = read_heads(leaves[1], HEADS), read_heads(leaves[2], HEADS)
    ours = F.scaled_dot_product_attention(leaves[0], keys, values, is_causal=True)
    ours.backward(output_grad)
    torch_leaves = [tensor.clone().requires_grad_(True) for tensor in (q, k, v)]
    theirs = F.scaled_dot_product_attention(*torch_leaves, is_causal=True, enable_gqa=True)
    theirs.backward(output_grad)
    torch.testing.assert_close(ours, theirs, rtol=1e-12, atol=1e-12)
    for leaf, torch_leaf in zip(leaves, torch_leaves):
        torch.testing.assert_close(leaf.grad, torch_leaf.grad, rtol=1e-12, atol=1e-12)
