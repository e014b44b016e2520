"""The language model, cut into pipeline stages, run one sequence chunk at a time.

Every linear-recurrence layer takes the recurrent state left by the previous
chunk and returns the state after this one ([Note: state passing] in
:mod:`schedlang.runtime.executor`). Parameter initialisation depends only on
the seed and the index of the piece (embedding, layer ``l``, head), drawn from
a generator of its own, so a model split into any number of stages starts
from the same weights as the single-device model.
"""

from __future__ import annotations

import math
import os

from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from schedlang.runtime.config import ModelConfig
from schedlang.runtime.kv_buffers import AttentionChunk, BufferedChunkAttention, ChunkPosition
from schedlang.runtime.linear import Linear, active_weight_gradient_recorder, recording_weight_gradients
from schedlang.runtime.model_options import GATE_LOGIT_NORMALIZER, DeltaGates, GlaOptions, OutputGate
from schedlang.runtime.packing import ChunkDocuments, block_causal_mask, recurrent_by_document
from schedlang.runtime.rotary import rotate_queries_and_keys
from schedlang.runtime.short_convolution import PackedDeltaState, ShortConvolution, sequence_parallel_histories
from schedlang.vocabulary import LayerKind, Recompute

INIT_STD = 0.02


@dataclass(frozen=True)
class SequenceParallelContext:
    """Where a mixing layer's tokens are split: the sequence-parallel group and its scan method."""

    group: dist.ProcessGroup
    method: str
    scan_blocks: int


def piece_generator(seed: int, piece_index: int) -> torch.Generator:
    """The generator for one piece of the model: embedding = 0, layer ``l`` = l + 1, head = n_layers + 1."""
    return torch.Generator().manual_seed(seed * 1_000_003 + piece_index)


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


class RMSNorm(nn.Module):
    def __init__(self, width: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(width))

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        # torch's own RMSNorm: one fused kernel each way on CUDA (it accumulates 16-bit inputs in float32),
        # where the same formula written in tensor ops took about 20 launches per norm and chunk
        return F.rms_norm(hidden, (hidden.shape[-1],), self.weight, self.eps)


class HeadMixer(nn.Module):
    """What every token mixer shares: ``heads`` heads of ``head_dim``, q/k/v projections to
    ``heads * head_dim`` and the output projection back (``q_proj``, ``k_proj``, ``v_proj``, ``o_proj``).

    ``heads`` and ``head_dim`` default to the model's; ``head_k_dim`` (default ``head_dim``) narrows queries
    and keys; with ``kv_heads`` (default ``heads``) the key and value projections have ``kv_heads`` heads,
    each shared by ``heads / kv_heads`` consecutive query heads; ``qkv_bias`` gives the q, k and v
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
    ) -> None:
        super().__init__()
        self.heads = heads or config.heads
        self.head_dim = head_dim or config.head_dim
        self.head_k_dim = head_k_dim or self.head_dim
        self.kv_heads = kv_heads or self.heads
        self.q_proj = Linear(config.d_model, self.heads * self.head_k_dim, bias=qkv_bias)
        self.k_proj = Linear(config.d_model, self.kv_heads * self.head_k_dim, bias=qkv_bias)
        self.v_proj = Linear(config.d_model, self.kv_heads * self.head_dim, bias=qkv_bias)
        self.o_proj = Linear(self.heads * self.head_dim, config.d_model, bias=False)

    def head_shape(self, hidden: torch.Tensor) -> tuple[int, int, int, int]:
        return (hidden.shape[0], hidden.shape[1], self.heads, self.head_dim)

    def share_kv_heads(self, tensor: torch.Tensor) -> torch.Tensor:
        """``[B, L, kv_heads * D]`` as ``[B, L, heads, D]``, each key/value head repeated for its query heads."""
        per_head = tensor.view(tensor.shape[0], tensor.shape[1], self.kv_heads, -1)
        groups = self.heads // self.kv_heads
        return per_head if groups == 1 else per_head.repeat_interleave(groups, dim=2)

    def project_qkv(self, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q, k as [B, L, H, head_k_dim], v as [B, L, H, head_dim]."""
        q = self.q_proj(hidden).view(hidden.shape[0], hidden.shape[1], self.heads, self.head_k_dim)
        return q, self.share_kv_heads(self.k_proj(hidden)), self.share_kv_heads(self.v_proj(hidden))

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


class GatedLinearMixer(HeadMixer):
    """GLA (gate per key channel) or simple GLA (one scalar gate per head).

    q/k/v projections, a log-sigmoid forget gate, the chunked kernel with state in and out, and an output
    projection. A GLA layer follows ``config.options.gla`` (:class:`GlaOptions`): with its defaults q, k, v
    and the gate are ``heads * head_dim`` wide and the gate is ``logsigmoid(gate_proj(x)) / 16``; with
    flash-linear-attention's choices it is that library's ``GatedLinearAttention`` (``docs/models.md``):
    ``o_proj(rmsnorm_per_head(o) * silu(output_gate_proj(x)))`` over a low-rank, clamped gate.
    """

    def __init__(self, config: ModelConfig, kind: LayerKind) -> None:
        options = config.options.gla if kind is LayerKind.GLA else GlaOptions()
        super().__init__(config, options.head_k_dim, options.kv_heads)
        self.kind = kind
        self.options = options
        if kind is LayerKind.GLA:
            gate_width = self.kv_heads * self.head_k_dim
        else:
            gate_width = config.heads
        if options.gate_rank is None:
            self.gate_proj = Linear(config.d_model, gate_width, bias=True)
        else:
            self.gate_proj = nn.Sequential(
                Linear(config.d_model, options.gate_rank, bias=False), Linear(options.gate_rank, gate_width, bias=True)
            )
        if options.output_gate is OutputGate.SWISH:
            self.output_gate_proj = Linear(config.d_model, config.heads * config.head_dim, bias=False)
            self.output_norm = RMSNorm(config.head_dim, config.norm_eps)
        else:
            self.output_gate_proj = None
            self.output_norm = None
        self.sequence_context: SequenceParallelContext | None = None

    def reset_parameters(self, generator: torch.Generator, output_std: float) -> None:
        gates = tuple(self.gate_proj) if isinstance(self.gate_proj, nn.Sequential) else (self.gate_proj,)
        if self.output_gate_proj is not None:
            gates = gates + (self.output_gate_proj,)
        self.init_projections(generator, output_std, *gates)

    def forward(
        self, hidden: torch.Tensor, initial_state: torch.Tensor | None, documents: ChunkDocuments | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``documents``: the chunk's packed documents, the state reset at each start ([Note: packed documents])."""
        from schedlang.kernels import chunk_gla, chunk_simple_gla
        from schedlang.kernels.log_sigmoid_gate import log_sigmoid_gate

        batch, length, _ = hidden.shape
        q, k, v = self.project_qkv(hidden)
        options = self.options
        gate = log_sigmoid_gate(self.gate_proj(hidden), options.gate_logit_normalizer, kernel_backend(hidden.device))
        if options.gate_clamp_min is not None:
            gate = gate.clamp_min(options.gate_clamp_min)
        kernel = chunk_gla if self.kind is LayerKind.GLA else chunk_simple_gla
        gate = self.share_kv_heads(gate) if self.kind is LayerKind.GLA else gate.view(batch, length, self.heads)
        if self.sequence_context is None:
            mixed, final_state = recurrent_by_document(
                documents,
                initial_state,
                lambda state, q, k, v, gate: kernel(
                    q,
                    k,
                    v,
                    gate,
                    scale=self.head_k_dim**-0.5,
                    initial_state=state,
                    output_final_state=True,
                    backend=kernel_backend(hidden.device),
                ),
                q,
                k,
                v,
                gate,
            )
        else:
            mixed, final_state = self._sequence_parallel(q, k, v, gate, initial_state)
        mixed = mixed.to(hidden.dtype)
        if self.output_gate_proj is not None:
            mixed = self.output_norm(mixed) * F.silu(self.output_gate_proj(hidden).view(self.head_shape(hidden)))
        return self.o_proj(mixed.reshape(batch, length, -1)), final_state

    def _sequence_parallel(self, q, k, v, gate, initial_state):
        """This rank's slice of the chunk; see [Note: sequence-parallel chunks] in the executor."""
        from schedlang.runtime.sequence_parallel import GateKind, sequence_parallel_chunk_gla

        context = self.sequence_context
        return sequence_parallel_chunk_gla(
            q,
            k,
            v,
            gate,
            group=context.group,
            method=context.method,
            scan_blocks=context.scan_blocks,
            initial_state=initial_state,
            output_final_state=True,
            scale=self.head_k_dim**-0.5,
            backend=kernel_backend(q.device),
            gate=GateKind.VECTOR if self.kind is LayerKind.GLA else GateKind.SCALAR,
        )


def _at_least_float32(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor`` in float32, or as it is when wider (a float64 model's gates stay float64)."""
    return tensor.to(torch.promote_types(tensor.dtype, torch.float32))


class GatedDeltaMixer(HeadMixer):
    """Gated DeltaNet: the gated delta rule with state in and out (``schedlang.kernels.chunk_gated_delta_rule``).

    q and k are L2-normalised per head; a forget gate and a sigmoid write strength are one scalar each per
    head and token (``config.options.gdn.gates``, :class:`DeltaGates`); the output is RMS-normalised per
    head, gated by SiLU of its own projection, then projected back. With ``short_conv_size`` the projected
    q, k and v first pass through short convolutions, whose last inputs join the state
    ([Note: short-convolution state] in :mod:`schedlang.runtime.short_convolution`); with Mamba2's gates
    and short convolutions this is flash-linear-attention's ``GatedDeltaNet`` layer (``docs/models.md``).
    The chunked operator runs as Triton kernels on CUDA (the WY solve, the state pass, the outputs and
    their backward) and as batched PyTorch on the CPU (``kernel_backend``).
    """

    def __init__(self, config: ModelConfig) -> None:
        options = config.options.gdn
        super().__init__(config, options.head_k_dim)
        self.options = options
        mamba = options.gates is DeltaGates.MAMBA
        self.gate_proj = Linear(config.d_model, config.heads, bias=not mamba)
        self.beta_proj = Linear(config.d_model, config.heads, bias=not mamba)
        if mamba:
            self.gate_log_rate = nn.Parameter(torch.empty(config.heads))
            self.gate_time_bias = nn.Parameter(torch.empty(config.heads))
        self.output_gate_proj = Linear(config.d_model, config.heads * config.head_dim, bias=False)
        self.output_norm = RMSNorm(config.head_dim, config.norm_eps)
        self.packed_state: PackedDeltaState | None = None
        if options.short_conv_size is not None:
            key_width, value_width = config.heads * self.head_k_dim, config.heads * config.head_dim
            self.q_conv = ShortConvolution(key_width, options.short_conv_size)
            self.k_conv = ShortConvolution(key_width, options.short_conv_size)
            self.v_conv = ShortConvolution(value_width, options.short_conv_size)
            self.packed_state = PackedDeltaState(
                (config.heads, self.head_k_dim, config.head_dim),
                options.short_conv_size - 1,
                (key_width, key_width, value_width),
            )
        self.sequence_context: SequenceParallelContext | None = None

    def reset_parameters(self, generator: torch.Generator, output_std: float) -> None:
        """The projections as every mixer's; then the convolutions (normal, ``INIT_STD``) and Mamba2's gate
        parameters as flash-linear-attention draws them: ``A_log = log(U(0, 16))`` and ``dt_bias`` the
        inverse softplus of ``dt = exp(U(log 0.001, log 0.1))`` raised to at least ``1e-4``."""
        self.init_projections(generator, output_std, self.gate_proj, self.beta_proj, self.output_gate_proj)
        if self.packed_state is not None:
            for convolution in (self.q_conv, self.k_conv, self.v_conv):
                _init_normal(convolution.weight, INIT_STD, generator)
        if self.options.gates is DeltaGates.MAMBA:
            heads = self.gate_log_rate.shape[0]
            rate = torch.empty(heads).uniform_(0.0, 16.0, generator=generator)
            uniform = torch.rand(heads, generator=generator)
            step = torch.exp(uniform * (math.log(0.1) - math.log(0.001)) + math.log(0.001)).clamp_min(1e-4)
            with torch.no_grad():
                self.gate_log_rate.copy_(torch.log(rate))
                self.gate_time_bias.copy_(step + torch.log(-torch.expm1(-step)))

    def forward(
        self, hidden: torch.Tensor, initial_state: torch.Tensor | None, documents: ChunkDocuments | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``documents``: the chunk's packed documents, the state reset at each start ([Note: packed documents])."""
        from schedlang.kernels import chunk_gated_delta_rule

        batch, length, _ = hidden.shape
        shape = self.head_shape(hidden)
        recurrent_state, histories = initial_state, (None, None, None)
        if self.packed_state is not None and initial_state is not None:
            recurrent_state, histories = self.packed_state.unpack(initial_state)
        q, k, v = self.q_proj(hidden), self.k_proj(hidden), self.v_proj(hidden)
        if self.packed_state is not None:
            q, k, v, final_histories = self._convolve(q, k, v, histories)
        q = q.view(batch, length, self.heads, self.head_k_dim)
        k = k.view(batch, length, self.heads, self.head_k_dim)
        v = v.view(shape)
        q, k = F.normalize(q, dim=-1), F.normalize(k, dim=-1)
        gate = self._log_forget_gate(hidden)
        beta = torch.sigmoid(_at_least_float32(self.beta_proj(hidden)))
        if self.sequence_context is None:
            mixed, final_state = recurrent_by_document(
                documents,
                recurrent_state,
                lambda state, q, k, v, gate, beta: chunk_gated_delta_rule(
                    q, k, v, gate, beta, scale=self.head_k_dim**-0.5, initial_state=state, output_final_state=True,
                    backend=kernel_backend(q.device),
                ),
                q, k, v, gate, beta,
            )
        else:
            mixed, final_state = self._sequence_parallel(q, k, v, gate, beta, recurrent_state)
        if self.packed_state is not None:
            final_state = self.packed_state.pack(final_state, final_histories)
        gated = self.output_norm(mixed.to(hidden.dtype)) * F.silu(self.output_gate_proj(hidden).view(shape))
        return self.o_proj(gated.reshape(batch, length, -1)), final_state

    def _convolve(self, q, k, v, histories):
        """The short convolutions of the projected q, k, v from ``histories`` (None: zeros); returns their
        outputs and the histories after the chunk, across the sequence-parallel group when there is one
        ([Note: short convolutions across sequence ranks] in :mod:`schedlang.runtime.short_convolution`)."""
        convolutions = (self.q_conv, self.k_conv, self.v_conv)
        if self.sequence_context is None:
            (q, q_history), (k, k_history), (v, v_history) = (
                convolution(projected, history)
                for convolution, projected, history in zip(convolutions, (q, k, v), histories)
            )
            return q, k, v, (q_history, k_history, v_history)
        if histories[0] is None:
            histories = tuple(
                projected.new_zeros(projected.shape[0], self.packed_state.history, projected.shape[-1])
                for projected in (q, k, v)
            )
        starting, final_histories = sequence_parallel_histories((q, k, v), histories, self.sequence_context.group)
        q, k, v = (
            convolution(projected, history)[0]
            for convolution, projected, history in zip(convolutions, (q, k, v), starting)
        )
        return q, k, v, final_histories

    def _log_forget_gate(self, hidden: torch.Tensor) -> torch.Tensor:
        """``[B, L, H]``: ``logsigmoid(gate_proj(x)) / 16``, or Mamba2's ``-exp(A_log) * softplus(a + dt_bias)``
        in float32 (float64 for a float64 model)."""
        from schedlang.kernels.log_sigmoid_gate import log_sigmoid_gate

        if self.options.gates is DeltaGates.LOG_SIGMOID:
            return log_sigmoid_gate(self.gate_proj(hidden), GATE_LOGIT_NORMALIZER, kernel_backend(hidden.device))
        logits = _at_least_float32(self.gate_proj(hidden)) + _at_least_float32(self.gate_time_bias)
        return -torch.exp(_at_least_float32(self.gate_log_rate)) * F.softplus(logits)

    def _sequence_parallel(self, q, k, v, gate, beta, initial_state):
        """This rank's slice of the chunk; see [Note: sequence-parallel chunks] in the executor."""
        from schedlang.runtime.sequence_parallel import sequence_parallel_gated_delta_rule

        context = self.sequence_context
        return sequence_parallel_gated_delta_rule(
            q, k, v, gate, beta, group=context.group, method=context.method, scan_blocks=context.scan_blocks,
            initial_state=initial_state, output_final_state=True, scale=self.head_k_dim**-0.5,
            backend=kernel_backend(q.device),
        )


class CausalAttentionMixer(HeadMixer):
    """Causal softmax attention, run over the whole sequence or chunk by chunk.

    Chunk by chunk, a chunk's queries attend to the keys and values of every
    earlier chunk and, causally, to their own, read from its microbatch's
    sequence-wide buffers ([Note: sequence-wide K/V] in
    :mod:`schedlang.runtime.kv_buffers`): nothing is passed as a state, and
    gradients reach earlier chunks' keys and values through the gradient
    buffers, so chunking changes nothing in the arithmetic except its
    blocking. The prefix grows with the position in the sequence, which is why
    StateFlow balances hybrid chunks (section 3.2). With a ``sequence_context`` the chunk is split over
    that group and its keys and values are all-gathered over it ([Note: sequence-parallel attention] in
    :mod:`schedlang.runtime.attention_parallel`).

    ``config.options.attention`` (:class:`~schedlang.runtime.model_options.AttentionOptions`) sets the
    heads, grouped key/value heads, q/k/v biases and rotary position embeddings; the rotation turns
    queries and keys at their absolute positions before the keys reach the buffers ([Note: rotary
    positions] in :mod:`schedlang.runtime.rotary`). With flash-linear-attention's head layout and a
    ``rope_theta`` this is that library's ``Attention`` layer (``docs/models.md``).
    """

    def __init__(self, config: ModelConfig) -> None:
        options = config.options.attention
        super().__init__(
            config, kv_heads=options.kv_heads, heads=options.heads, head_dim=options.head_dim, qkv_bias=options.qkv_bias
        )
        self.rope_theta = options.rope_theta
        self.sequence_context: SequenceParallelContext | None = None

    def reset_parameters(self, generator: torch.Generator, output_std: float) -> None:
        self.init_projections(generator, output_std)

    def forward(
        self, hidden: torch.Tensor, chunk: AttentionChunk | None, documents: ChunkDocuments | None = None
    ) -> tuple[torch.Tensor, None]:
        """``chunk`` None: ``hidden`` is the whole sequence. Returns (output, None): attention has no state.
        ``documents``: the chunk's packed documents, each query seeing only its own ([Note: packed documents])."""
        batch, length, _ = hidden.shape
        q, k, v = self.project_qkv(hidden)
        if self.rope_theta is not None:
            q, k = rotate_queries_and_keys(q, k, self.rope_theta, 0 if chunk is None else chunk.position.start)
        # [B, H, L, D]
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        group = None if self.sequence_context is None else self.sequence_context.group
        if chunk is None:
            if group is not None:
                raise ValueError("sequence-parallel attention runs chunk by chunk: pass the chunk's position")
            mask = None if documents is None else block_causal_mask(documents, q.device)
            mixed = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=mask is None)
        else:
            mixed = BufferedChunkAttention.apply(q, k, v, chunk, group, documents)
        return self.o_proj(mixed.transpose(1, 2).reshape(batch, length, -1)), None


MLP_WIDTH_MULTIPLE = 8
"""SwiGLU widths are rounded up to a multiple of 8: bf16 matrices whose rows are not 16-byte aligned
send cuBLAS to its slow unaligned kernels (docs/benchmarks.md, "Measurements behind the runtime")."""


def swiglu_width(d_model: int, ratio: float) -> int:
    """The SwiGLU hidden width: d_model * ratio rounded, then up to a multiple of MLP_WIDTH_MULTIPLE."""
    width = max(1, int(round(d_model * ratio)))
    return -(-width // MLP_WIDTH_MULTIPLE) * MLP_WIDTH_MULTIPLE


class SwiGLU(nn.Module):
    """``down(silu(gate(x)) * up(x))`` with the gate and up projections fused into one: ``gate_up_proj``'s
    weight is the gate projection's rows, then the up projection's.

    One GEMM each way instead of two (and no sum of two input gradients), and the activation is one kernel
    each way (``schedlang.kernels.swiglu``) whose backward writes the fused projection's output gradient
    whole; it keeps only the projection's output for the backward, where ``silu(g) * u`` in tensor ops kept
    ``silu(g)`` as well.
    """

    def __init__(self, d_model: int, ratio: float, width: int | None = None) -> None:
        """``width`` (flash-linear-attention's ``intermediate_size``) is the hidden width as is; None:
        :func:`swiglu_width` of ``ratio``."""
        super().__init__()
        self.hidden = swiglu_width(d_model, ratio) if width is None else width
        self.gate_up_proj = Linear(d_model, 2 * self.hidden, bias=False)
        self.down_proj = Linear(self.hidden, d_model, bias=False)

    def reset_parameters(self, generator: torch.Generator, output_std: float) -> None:
        gate, up = self.gate_up_proj.weight.split(self.hidden)
        _init_normal(gate, INIT_STD, generator)
        _init_normal(up, INIT_STD, generator)
        _init_normal(self.down_proj.weight, output_std, generator)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        from schedlang.kernels.swiglu import swiglu

        return self.down_proj(swiglu(self.gate_up_proj(hidden), backend=kernel_backend(hidden.device)))


class Block(nn.Module):
    """Pre-norm residual block: mixing layer, then SwiGLU MLP (if any); an ``mlp`` layer is the MLP alone.

    ``recompute`` (``mlp`` or ``mixer``; set by :func:`build_stage_model`) names the part, norm included, whose
    activations the backward recomputes: [Note: recompute modes] in :mod:`schedlang.runtime.executor`.
    """

    def __init__(self, config: ModelConfig, kind: LayerKind) -> None:
        super().__init__()
        self.mixer_norm = RMSNorm(config.d_model, config.norm_eps) if kind is not LayerKind.MLP else None
        if kind is LayerKind.MLP:
            self.mixer = None
        elif kind is LayerKind.ATTN:
            self.mixer = CausalAttentionMixer(config)
        elif kind is LayerKind.GDN:
            self.mixer = GatedDeltaMixer(config)
        else:
            self.mixer = GatedLinearMixer(config, kind)
        has_mlp = config.has_mlp(kind)
        self.mlp_norm = RMSNorm(config.d_model, config.norm_eps) if has_mlp else None
        self.mlp = SwiGLU(config.d_model, config.mlp_ratio, config.options.mlp_width) if has_mlp else None
        self.recompute = Recompute.NONE

    def reset_parameters(self, generator: torch.Generator, init_depth: int) -> None:
        output_std = INIT_STD / math.sqrt(init_depth)
        if self.mixer is not None:
            self.mixer.reset_parameters(generator, output_std)
        if self.mlp is not None:
            self.mlp.reset_parameters(generator, output_std)

    def forward(
        self, hidden: torch.Tensor, initial_state: torch.Tensor | None, documents: ChunkDocuments | None = None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        final_state = None
        if self.mixer is not None:
            mixed, final_state = self._run_part(Recompute.MIXER, self._mix, hidden, initial_state, documents)
            hidden = hidden + mixed
        if self.mlp is not None:
            hidden = hidden + self._run_part(Recompute.MLP, self._feed_forward, hidden)
        return hidden, final_state

    def _mix(self, hidden: torch.Tensor, initial_state, documents=None) -> tuple[torch.Tensor, torch.Tensor | None]:
        return self.mixer(self.mixer_norm(hidden), initial_state, documents)

    def _feed_forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.mlp(self.mlp_norm(hidden))

    def _run_part(self, part: Recompute, function, *inputs):
        """``function(*inputs)``; when ``part`` is recomputed, autograd keeps only ``inputs`` for the backward,
        which reruns ``function`` (with the forward's weight-gradient recorder, so it saves the same tensors)."""
        if self.recompute is not part or not torch.is_grad_enabled():
            return function(*inputs)
        recorder = active_weight_gradient_recorder()

        def run_with_the_forwards_recorder(*inputs):
            with recording_weight_gradients(recorder):
                return function(*inputs)

        return checkpoint(run_with_the_forwards_recorder, *inputs, use_reentrant=False)


class StageModel(nn.Module):
    """The layers one pipeline stage owns, plus the embedding (first) and head (last).

    Layers are stored under their global index (``layers.3``), so parameter
    names, and therefore checkpoints, do not depend on how the model is split.
    With ``options.tie_embeddings`` the LM head uses the embedding's weight and has none of its own:
    [Note: tied embeddings across stages].

    [Note: tied embeddings across stages]
    As Megatron-LM does, the first stage owns the embedding and a last stage that is not also the first holds
    a copy of the same weight for its head. The copy is an ``nn.Embedding`` under the same name,
    ``embedding.weight``, drawn from the same seed piece (or loaded from the same tensor), so the two start
    equal; the trainer sums the two gradients over the pair of ranks after the backward
    (``Trainer.reduce_gradients``, the group of :func:`schedlang.runtime.mesh.tied_embedding_group`), so they
    stay bit-identical. Only the first stage looks tokens up (``is_first``). Because the copy has the
    embedding's name, a checkpoint holds the weight (and its optimizer state) once, deduplicated like a data
    replica's, and loads into any pipeline size, one stage included.
    """

    def __init__(self, config: ModelConfig, layer_indices: tuple[int, ...], is_first: bool, is_last: bool) -> None:
        super().__init__()
        self.config = config
        self.layer_indices = tuple(layer_indices)
        self.is_first = is_first
        self.is_last = is_last
        tied = config.options.tie_embeddings
        holds_embedding = is_first or (is_last and tied)  # [Note: tied embeddings across stages]
        self.embedding = nn.Embedding(config.vocab, config.d_model) if holds_embedding else None
        self.layers = nn.ModuleDict({str(index): Block(config, config.layers[index]) for index in layer_indices})
        self.final_norm = RMSNorm(config.d_model, config.norm_eps) if is_last else None
        self.lm_head = Linear(config.d_model, config.vocab, bias=False) if is_last and not tied else None

    def reset_parameters(self, seed: int) -> None:
        n_layers = len(self.config.layers)
        if self.embedding is not None:
            _init_normal(self.embedding.weight, INIT_STD, piece_generator(seed, 0))
        for index in self.layer_indices:
            self.layers[str(index)].reset_parameters(piece_generator(seed, index + 1), self.config.init_depth)
        if self.lm_head is not None:
            _init_normal(self.lm_head.weight, INIT_STD, piece_generator(seed, n_layers + 1))

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """The LM head's logits of the final-normed ``hidden`` (the embedding's weight when tied)."""
        normed = self.final_norm(hidden)
        if self.lm_head is None:
            return F.linear(normed, self.embedding.weight)
        return self.lm_head(normed)

    @property
    def holds_embedding_copy(self) -> bool:
        """A last stage's copy of the first stage's tied embedding: [Note: tied embeddings across stages]."""
        return self.embedding is not None and not self.is_first

    @property
    def n_states(self) -> int:
        return len(self.layer_indices)

    def forward(
        self,
        inputs: torch.Tensor,
        initial_states: list[torch.Tensor | None],
        position: ChunkPosition | None = None,
        documents: ChunkDocuments | None = None,
    ) -> tuple[torch.Tensor, list[torch.Tensor | None]]:
        """Run one chunk: token ids (first stage) or hidden states in, hidden states out.

        Returns the chunk's output and each layer's recurrent state after the
        chunk, in layer order (None for attention and mlp layers, which keep no state).
        Attention layers need ``position`` whenever the sequence runs in more
        than one chunk; without it they see ``inputs`` as the whole sequence. ``documents``: the chunk's packed
        documents, or None ([Note: packed documents] in :mod:`schedlang.runtime.packing`).
        """
        hidden = self.embedding(inputs) if self.is_first else inputs
        final_states = []
        for index, initial_state in zip(self.layer_indices, initial_states):
            block = self.layers[str(index)]
            if isinstance(block.mixer, CausalAttentionMixer):
                initial_state = None if position is None else AttentionChunk(position, index)
            hidden, final_state = block(hidden, initial_state, documents)
            final_states.append(final_state)
        return hidden, final_states

    @property
    def has_attention(self) -> bool:
        return any(isinstance(block.mixer, CausalAttentionMixer) for block in self.layers.values())

    def loss(self, hidden: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Summed cross-entropy over the chunk's tokens (the caller normalises by the global count)."""
        logits = self.logits(hidden).float()
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), reduction="sum")


def build_stage_model(
    config: ModelConfig,
    layer_indices: tuple[int, ...],
    is_first: bool,
    is_last: bool,
    seed: int,
    device: torch.device,
    dtype: torch.dtype,
    sequence_context: SequenceParallelContext | None = None,
    recompute: Recompute = Recompute.NONE,
) -> StageModel:
    """Build a stage on the meta device, then materialise it with its seed-determined weights, or with the
    weights of ``config.options.initial_weights`` (every rank of the stage reads the same tensors).

    With a ``sequence_context`` every mixing layer runs its slice of each chunk
    sequence-parallel over that group. ``recompute`` ``mlp`` or ``mixer`` makes
    every block recompute that part in the backward; ``full`` is the executor's
    (the blocks keep everything when their forward runs with grad).
    """
    with torch.device("meta"):
        model = StageModel(config, layer_indices, is_first, is_last)
    model.to_empty(device=device)
    for module in model.modules():
        if isinstance(module, RMSNorm):
            with torch.no_grad():
                module.weight.fill_(1.0)
    model.reset_parameters(seed)
    if config.options.initial_weights is not None:
        from schedlang.runtime.hf_weights import load_initial_weights

        load_initial_weights(model, config.options.initial_weights)
    for module in model.modules():
        if isinstance(module, (GatedLinearMixer, GatedDeltaMixer, CausalAttentionMixer)):
            module.sequence_context = sequence_context
        if isinstance(module, Block) and recompute in (Recompute.MLP, Recompute.MIXER):
            module.recompute = Recompute(recompute)
    return model.to(dtype)
