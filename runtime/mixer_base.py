"""What every token mixer of the model shares: the q/k/v/o head layout (:class:`HeadMixer`), RMSNorm (a
mixer's per-head output norm, and the blocks' norms in :mod:`schedlang.runtime.model`), the sequence-parallel
context a mixer runs its slice of a chunk in, the kernel backend, and the normal initialisation of a parameter
from its piece's generator.

The mixers themselves live in :mod:`schedlang.runtime.mixer_gla` (gla, simple_gla),
:mod:`schedlang.runtime.mixer_gdn` (gdn) and :mod:`schedlang.runtime.mixer_attention` (attn).
"""

from __future__ import annotations

import os

from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from schedlang.kernels.common.heads import repeat_each_head
from schedlang.kernels.gated_rms_norm import gated_rms_norm
from schedlang.runtime.linear import Linear
from schedlang.vocabulary import AttentionExchange, ModelConfig

INIT_STD = 0.02


@dataclass(frozen=True)
class SequenceParallelContext:
    """Where a mixing layer's tokens are split: the sequence-parallel group, its scan method (recurrent layers)
    and its key/value exchange (attention layers)."""

    group: dist.ProcessGroup
    method: str
    scan_blocks: int
    attention: AttentionExchange = AttentionExchange.ALLGATHER


def _init_normal(parameter: nn.Parameter, std: float, generator: torch.Generator) -> None:
    with torch.no_grad():
        values = torch.empty(parameter.shape, dtype=torch.float32).normal_(0.0, std, generator=generator)
        parameter.copy_(values)


KERNEL_BACKEND_VARIABLE = "SCHEDLANG_KERNEL_BACKEND"


def kernel_backend(device: torch.device) -> str:
    """Always explicit: "auto" would pick Triton's slow interpreter on CPU machines that set TRITON_INTERPRET.

    ``SCHEDLANG_KERNEL_BACKEND=torch`` forces the pure-PyTorch kernels on a GPU
    (to compare, or where Triton is unavailable).
    """
    forced = os.environ.get(KERNEL_BACKEND_VARIABLE)
    if forced:
        return forced
    return "triton" if device.type == "cuda" else "torch"


LOSS_BACKEND_VARIABLE = "SCHEDLANG_LOSS_BACKEND"


def loss_kernel_backend(device: torch.device) -> str:
    """The fused loss's kernels for each block's loss and logits gradient (schedlang.kernels.cross_entropy):
    ``SCHEDLANG_LOSS_BACKEND`` when set ("torch" or "triton"), else Triton's on CUDA and PyTorch's elsewhere
    (Triton's interpreter would be slow, and it is kept off bfloat16). On an H100 the Triton kernel runs the
    fused head and loss 1.9x faster than PyTorch's path (docs/benchmarks.md, "The head and loss, fused");
    ``SCHEDLANG_KERNEL_BACKEND=torch`` still forces every kernel to PyTorch's."""
    if os.environ.get(KERNEL_BACKEND_VARIABLE) == "torch":
        return "torch"
    forced = os.environ.get(LOSS_BACKEND_VARIABLE) or "triton"
    if forced not in ("torch", "triton"):
        raise ValueError(f"{LOSS_BACKEND_VARIABLE}={forced!r}: write 'torch' or 'triton'")
    if forced == "triton" and device.type != "cuda":
        return "torch"
    return forced


class RMSNorm(nn.Module):
    def __init__(self, width: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(width))

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        # torch's own RMSNorm: one fused kernel each way on CUDA (it accumulates 16-bit inputs in float32),
        # where the same formula written in tensor ops took about 20 launches per norm and chunk
        return F.rms_norm(hidden, (hidden.shape[-1],), self.weight, self.eps)

    def gated(self, hidden: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        """``self(hidden) * silu(gate)`` (fla's ``FusedRMSNormGated``) in one launch each way on CUDA, computed in
        float32 and rounded once to hidden's dtype (:func:`schedlang.kernels.gated_rms_norm.gated_rms_norm`)."""
        return gated_rms_norm(hidden, gate, self.weight, 1, self.eps, norm_before_gate=True,
                              backend=kernel_backend(hidden.device))


class HeadMixer(nn.Module):
    """What every token mixer shares: ``heads`` heads of ``head_dim``, q/k/v projections to
    ``heads * head_dim`` and the output projection back (``q_proj``, ``k_proj``, ``v_proj``, ``o_proj``).

    ``heads`` and ``head_dim`` default to the model's; ``head_k_dim`` (default ``head_dim``) narrows queries
    and keys; with ``kv_heads`` (default ``heads``) the key and value projections have ``kv_heads`` heads,
    each shared by ``heads / kv_heads`` consecutive query heads (grouped-query attention); with
    ``query_key_heads`` instead, the query and key projections have that many heads, each shared by ``heads /
    query_key_heads`` consecutive value heads (grouped value attention); ``qkv_bias`` gives the q, k and v
    projections biases.
    """

    def __init__(
        self,
        config: ModelConfig,
        head_k_dim: int | None = None,
        kv_heads: int | None = None,
        heads: int | None = None,
        head_dim: int | None = None,
        qkv_bias: bool = False,
        query_key_heads: int | None = None,
    ) -> None:
        super().__init__()
        if kv_heads is not None and query_key_heads is not None:
            raise ValueError("a mixer groups either its key/value heads or its query/key heads, not both")
        self.heads = heads or config.heads
        self.head_dim = head_dim or config.head_dim
        self.head_k_dim = head_k_dim or self.head_dim
        self.kv_heads = kv_heads or self.heads
        self.query_key_heads = query_key_heads or self.heads
        key_heads = self.kv_heads if query_key_heads is None else self.query_key_heads
        self.q_proj = Linear(config.d_model, self.query_key_heads * self.head_k_dim, bias=qkv_bias)
        self.k_proj = Linear(config.d_model, key_heads * self.head_k_dim, bias=qkv_bias)
        self.v_proj = Linear(config.d_model, self.kv_heads * self.head_dim, bias=qkv_bias)
        self.o_proj = Linear(self.heads * self.head_dim, config.d_model, bias=False)

    def head_shape(self, hidden: torch.Tensor) -> tuple[int, int, int, int]:
        return (hidden.shape[0], hidden.shape[1], self.heads, self.head_dim)

    def share_kv_heads(self, tensor: torch.Tensor) -> torch.Tensor:
        """``[B, L, kv_heads * D]`` (or ``[B, L, kv_heads, D]``) as ``[B, L, heads, D]``, each key/value head
        repeated for its query heads: key/value head ``j`` serves query heads ``j G .. j G + G - 1`` (``G =
        heads / kv_heads``; the attention kernels' ``read_heads`` in schedlang.runtime.attention_parts keeps this
        order)."""
        return repeat_each_head(tensor.view(tensor.shape[0], tensor.shape[1], self.kv_heads, -1), self.heads)

    def project_grouped_qkv(self, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q as [B, L, H, head_k_dim]; k as [B, L, kv_heads, head_k_dim] and v as [B, L, kv_heads, head_dim],
        not yet shared by their query heads."""
        batch, length = hidden.shape[:2]
        q = self.q_proj(hidden).view(batch, length, self.heads, self.head_k_dim)
        k = self.k_proj(hidden).view(batch, length, self.kv_heads, self.head_k_dim)
        return q, k, self.v_proj(hidden).view(batch, length, self.kv_heads, self.head_dim)

    def project_qkv(self, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q, k as [B, L, H, head_k_dim], v as [B, L, H, head_dim]."""
        q, k, v = self.project_grouped_qkv(hidden)
        return q, self.share_kv_heads(k), self.share_kv_heads(v)

    def init_projections(self, generator: torch.Generator, output_std: float, *gates: Linear) -> None:
        """q, k, v, then each gate (a low-rank gate is two), drawn in that order; biases zero; the output
        projection last."""
        for projection in (self.q_proj, self.k_proj, self.v_proj, *gates):
            _init_normal(projection.weight, INIT_STD, generator)
        with torch.no_grad():
            for projection in (self.q_proj, self.k_proj, self.v_proj, *gates):
                if projection.bias is not None:
                    projection.bias.zero_()
        _init_normal(self.o_proj.weight, output_std, generator)
