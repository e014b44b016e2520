"""Softmax attention of a block of queries over keys in two parts, merged by their log-sum-exp.

[Note: attention in parts]
A chunk's queries (positions ``start .. end - 1``) attend to two blocks of keys: the prefix, every key before
``start``, all of them visible; and the chunk's own keys, a square block under the causal mask. Each part
runs as one fused kernel that returns its output ``O_j`` and, per query, the log-sum-exp ``L_j`` of its
scaled scores. Then

    L = logaddexp(L_1, L_2)        O = exp(L_1 - L) * O_1 + exp(L_2 - L) * O_2

is the attention over both blocks (flash attention's merge). The backward runs each part's fused backward
from the *merged* ``O`` and ``L``: a kernel forms its probabilities as ``exp(S - L)`` and its row terms from
``O``, so it returns that part's exact share of ``dQ`` (the two are added), ``dK`` and ``dV``. Nothing of
size (queries x keys) is formed in memory, nor saved: the forward keeps ``q``, ``O`` and ``L``, and the keys
stay where the caller keeps them. This replaces one call with a lower-right causal bias, which on the CPU
is a materialised ``[queries, keys]`` mask saved by every chunk (growing with the square of the sequence).

Kernels (:class:`PartKernel`): on the CPU torch's flash attention for CPU; on CUDA its flash attention for
16-bit inputs whose head dimension it takes (a multiple of 8, at most 256), in the inputs' dtype, and its
memory-efficient attention in float32 otherwise (16-bit inputs of other head dimensions upcast around each
call: a float32 copy of one part's keys and values at a time, linear in the sequence and never saved);
elsewhere (float64 on CUDA) the same two outputs written in tensor ops, which form one part's scores at a
time and keep none of them. Flash attention's backward takes the merged ``O`` and ``L`` as they are; the
memory-efficient kernels' 16-bit backward did not reproduce the gradients from a merged log-sum-exp, which is
why they run in float32.

[Note: grouped key/value heads]
With grouped-query attention the keys and values have ``kv_heads`` heads, each serving ``heads / kv_heads``
consecutive query heads (key/value head ``j`` serves query heads ``j G .. j G + G - 1``, ``G = heads /
kv_heads``: the order of ``HeadMixer.share_kv_heads`` in :mod:`schedlang.runtime.mixer_base`, which is
flash-linear-attention's). The caller keeps them that narrow (the sequence-wide buffers of
:mod:`schedlang.runtime.kv_buffers`); none of the kernels takes grouped heads, so each call reads one part's
keys and values at query-head width (:func:`read_heads`: one copy of that part, in the kernel's dtype, made
per call and dropped after it) and the backward sums the wide ``dK`` and ``dV`` over each group
(:func:`sum_head_groups`), returning them as narrow as the part's keys. Without groups the kernels read the
caller's keys in place (the CUDA kernels' float32 copy aside).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from enum import Enum

import torch
import torch.nn.functional as F

from schedlang.vocabulary.model_settings import flash_attention_takes

aten = torch.ops.aten


class PartKernel(Enum):
    CPU_FLASH = "cpu_flash"
    CUDA_FLASH = "cuda_flash"
    CUDA_EFFICIENT = "cuda_efficient"
    TENSOR_OPS = "tensor_ops"


EFFICIENT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
FLASH_DTYPES = (torch.float16, torch.bfloat16)
EFFICIENT_LSE_ROWS = 32
"""The memory-efficient kernels keep the log-sum-exp of ``L`` queries in ``ceil(L / 32) * 32`` rows."""


def part_kernel(q: torch.Tensor) -> PartKernel:
    """The fused kernel for ``q``'s device and dtype, or the tensor-op form where none takes them."""
    if q.device.type == "cpu":
        return PartKernel.CPU_FLASH
    if q.device.type == "cuda" and q.dtype in FLASH_DTYPES and _flash_takes(q):
        return PartKernel.CUDA_FLASH
    if q.device.type == "cuda" and q.dtype in EFFICIENT_DTYPES:
        return PartKernel.CUDA_EFFICIENT
    return PartKernel.TENSOR_OPS


def _flash_takes(q: torch.Tensor) -> bool:
    return (
        flash_attention_takes(q.shape[-1])
        and torch.backends.cuda.flash_sdp_enabled()
        and torch.cuda.get_device_capability(q.device) >= (8, 0)
    )


@dataclass(frozen=True)
class AttentionPart:
    """One block of keys and values ``[B, H_kv, S, D]`` (``H_kv`` dividing the queries' heads: [Note: grouped
    key/value heads]), and whether the causal (square) mask applies."""

    keys: torch.Tensor
    values: torch.Tensor
    causal: bool


def read_heads(tensor: torch.Tensor, heads: int, dtype: torch.dtype | None = None) -> torch.Tensor:
    """Keys or values ``[B, H_kv, S, D]`` as ``[B, heads, S, D]`` in ``dtype`` (default theirs), each key/value
    head repeated for its ``heads / H_kv`` consecutive query heads ([Note: grouped key/value heads]).

    ``tensor`` itself when nothing changes; otherwise one new tensor, written once from ``tensor``.
    """
    batch, kv_heads, length, dim = tensor.shape
    dtype = tensor.dtype if dtype is None else dtype
    if kv_heads == heads:
        return tensor.to(dtype)
    if heads % kv_heads:
        raise ValueError(f"{kv_heads} key/value heads do not divide {heads} query heads")
    # [B, H_kv, G, S, D]: group member g of key/value head j is query head j G + g
    wide = tensor.new_empty((batch, kv_heads, heads // kv_heads, length, dim), dtype=dtype)
    wide.copy_(tensor[:, :, None])
    return wide.view(batch, heads, length, dim)


def sum_head_groups(gradient: torch.Tensor, kv_heads: int) -> torch.Tensor:
    """The gradient ``[B, heads, S, D]`` of :func:`read_heads`' result, summed back to ``[B, H_kv, S, D]``."""
    if gradient.shape[1] == kv_heads:
        return gradient
    return gradient.unflatten(1, (kv_heads, gradient.shape[1] // kv_heads)).sum(dim=2)


def _part_forward(q: torch.Tensor, part: AttentionPart, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(output [B, H, L, D], log-sum-exp [B, H, L]) of one part."""
    kernel = part_kernel(q)
    heads = q.shape[1]
    if kernel is PartKernel.CPU_FLASH:
        return aten._scaled_dot_product_flash_attention_for_cpu(
            q, read_heads(part.keys, heads), read_heads(part.values, heads), 0.0, part.causal, scale=scale
        )
    if kernel is PartKernel.CUDA_FLASH:
        output, log_sum_exp = aten._scaled_dot_product_flash_attention(
            q, read_heads(part.keys, heads, q.dtype), read_heads(part.values, heads, q.dtype), 0.0, part.causal,
            scale=scale,
        )[:2]
        return output, log_sum_exp[..., : q.shape[2]]
    if kernel is PartKernel.CUDA_EFFICIENT:
        keys, values = read_heads(part.keys, heads, torch.float32), read_heads(part.values, heads, torch.float32)
        output, log_sum_exp, _, _ = aten._scaled_dot_product_efficient_attention(
            q.float(), keys, values, None, True, 0.0, part.causal, scale=scale
        )
        return output, log_sum_exp[..., : q.shape[2]]
    keys, values = read_heads(part.keys, heads), read_heads(part.values, heads)
    scores = torch.matmul(q, keys.transpose(-1, -2)) * scale
    if part.causal:
        scores = scores.masked_fill(_above_diagonal(scores), -math.inf)
    log_sum_exp = torch.logsumexp(scores, dim=-1)
    return torch.matmul(torch.exp(scores - log_sum_exp[..., None]), values), log_sum_exp


def _part_backward(
    output_grad: torch.Tensor,
    q: torch.Tensor,
    part: AttentionPart,
    output: torch.Tensor,
    log_sum_exp: torch.Tensor,
    scale: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """This part's (dq, dk, dv), from the merged output and log-sum-exp, ``dk`` and ``dv`` at query-head
    width (:func:`attention_parts_backward` sums them over the groups); see the note."""
    kernel = part_kernel(q)
    heads = q.shape[1]
    if kernel is PartKernel.CPU_FLASH:
        return aten._scaled_dot_product_flash_attention_for_cpu_backward(
            output_grad, q, read_heads(part.keys, heads), read_heads(part.values, heads), output, log_sum_exp,
            0.0, part.causal, scale=scale,
        )
    if kernel is PartKernel.CUDA_FLASH:
        keys, values = read_heads(part.keys, heads, q.dtype), read_heads(part.values, heads, q.dtype)
        empty = torch.empty((), dtype=torch.int64, device=q.device)  # no dropout: no random state
        # dk and dv come back in q's dtype; their groups are summed in it
        return aten._scaled_dot_product_flash_attention_backward(
            output_grad, q, keys, values, output.to(q.dtype), log_sum_exp.contiguous(), None, None,
            q.shape[2], keys.shape[2], 0.0, part.causal, empty, empty, scale=scale,
        )
    if kernel is PartKernel.CUDA_EFFICIENT:
        empty = torch.empty((), dtype=torch.int64, device=q.device)
        # the kernel reads the log-sum-exp padded as its forward wrote it (rows to a multiple of 32)
        queries = q.shape[2]
        padding = -(-queries // EFFICIENT_LSE_ROWS) * EFFICIENT_LSE_ROWS - queries
        padded_log_sum_exp = F.pad(log_sum_exp, (0, padding))
        keys, values = read_heads(part.keys, heads, torch.float32), read_heads(part.values, heads, torch.float32)
        dq, dk, dv, _ = aten._scaled_dot_product_efficient_attention_backward(
            output_grad.float(), q.float(), keys, values, None, output.float(),
            padded_log_sum_exp, empty, empty, 0.0, [True, True, True, False], part.causal, scale=scale,
        )
        # dk and dv stay float32 until their groups are summed
        return dq.to(q.dtype), dk, dv
    keys, values = read_heads(part.keys, heads), read_heads(part.values, heads)
    scores = torch.matmul(q, keys.transpose(-1, -2)) * scale
    if part.causal:
        scores = scores.masked_fill(_above_diagonal(scores), -math.inf)
    probabilities = torch.exp(scores - log_sum_exp[..., None])
    row_terms = (output_grad * output).sum(dim=-1, keepdim=True)
    score_grads = probabilities * (torch.matmul(output_grad, values.transpose(-1, -2)) - row_terms) * scale
    dq = torch.matmul(score_grads, keys)
    dk = torch.matmul(score_grads.transpose(-1, -2), q)
    return dq, dk, torch.matmul(probabilities.transpose(-1, -2), output_grad)


def _above_diagonal(scores: torch.Tensor) -> torch.Tensor:
    rows, columns = scores.shape[-2:]
    return torch.ones(rows, columns, dtype=torch.bool, device=scores.device).triu(1)


def attend_in_parts(
    q: torch.Tensor, parts: Iterable[AttentionPart]
) -> tuple[torch.Tensor, torch.Tensor]:
    """The attention of ``q`` ``[B, H, L, D]`` over the union of ``parts``: (output in q's dtype, log-sum-exp).

    Parts with no keys are skipped; at least one must have some. The parts are taken one at a time, in order,
    each after the previous one's kernel has run: an iterator may make a part's keys present only when asked.
    """
    scale = q.shape[-1] ** -0.5
    merged_output = merged_log_sum_exp = None
    for part in parts:
        if part.keys.shape[2] == 0:
            continue
        output, log_sum_exp = _part_forward(q, part, scale)
        if merged_output is None:
            merged_output, merged_log_sum_exp = output.to(log_sum_exp.dtype), log_sum_exp
            continue
        combined = torch.logaddexp(merged_log_sum_exp, log_sum_exp)
        merged_output = (
            torch.exp(merged_log_sum_exp - combined)[..., None] * merged_output
            + torch.exp(log_sum_exp - combined)[..., None] * output.to(log_sum_exp.dtype)
        )
        merged_log_sum_exp = combined
    return merged_output.to(q.dtype), merged_log_sum_exp


def attention_parts_backward(
    output_grad: torch.Tensor,
    q: torch.Tensor,
    parts: tuple[AttentionPart, ...],
    output: torch.Tensor,
    log_sum_exp: torch.Tensor,
) -> tuple[torch.Tensor, list[tuple[torch.Tensor, torch.Tensor] | None]]:
    """``dq`` and, per part, ``(dk, dv)`` as narrow as the part's keys and in their dtype (None for a part
    without keys), from :func:`attend_in_parts`' results."""
    scale = q.shape[-1] ** -0.5
    output_grad = output_grad.contiguous()
    dq = None
    part_grads: list[tuple[torch.Tensor, torch.Tensor] | None] = []
    for part in parts:
        if part.keys.shape[2] == 0:
            part_grads.append(None)
            continue
        part_dq, dk, dv = _part_backward(output_grad, q, part, output, log_sum_exp, scale)
        dq = part_dq if dq is None else dq + part_dq
        kv_heads, dtype = part.keys.shape[1], part.keys.dtype
        part_grads.append((sum_head_groups(dk, kv_heads).to(dtype), sum_head_groups(dv, kv_heads).to(dtype)))
    return dq, part_grads
