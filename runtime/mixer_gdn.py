"""The Gated DeltaNet token mixer (``gdn`` layers)."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from schedlang.runtime.linear import Linear
from schedlang.runtime.mixer_base import (
    INIT_STD,
    HeadMixer,
    RMSNorm,
    SequenceParallelContext,
    _init_normal,
    kernel_backend,
)
from schedlang.runtime.packing import ChunkDocuments, recurrent_by_document
from schedlang.runtime.short_convolution import PackedDeltaState, ShortConvolution, sequence_parallel_histories
from schedlang.vocabulary import GATE_LOGIT_NORMALIZER, DeltaGates, LayerKind, ModelConfig, recurrent_state_geometry


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

    Grouped value attention (``options.value_heads``, fla's ``num_v_heads``): q and k are projected (and
    convolved) to ``query_key_heads`` (the model's ``heads``) heads of ``head_k_dim``; v, the gates, the write
    strength, the output gate and norm and the state have ``heads`` = ``value_heads`` heads, and value head
    ``j`` reads q/k head ``j // (value_heads // query_key_heads)``: fla's kernels index q and k at
    ``i_hv // (HV // H)``, so each q/k head serves a block of consecutive value heads, einops'
    ``h d -> (h g) d`` ([Note: grouped head order] in schedlang.kernels.common.heads). The chunked operator
    takes q and k that narrow (its Triton path keeps them so for the backward and repeats them only while it
    runs), under sequence parallelism too. The state store and the state have ``value_heads``
    heads throughout.
    """

    def __init__(self, config: ModelConfig) -> None:
        options = config.options.gdn
        value_heads = options.value_heads_of(config.heads)
        super().__init__(config, options.head_k_dim, heads=value_heads, query_key_heads=config.heads)
        self.options = options
        key_width, value_width = config.heads * self.head_k_dim, value_heads * config.head_dim
        mamba = options.gates is DeltaGates.MAMBA
        self.gate_proj = Linear(config.d_model, value_heads, bias=not mamba)
        self.beta_proj = Linear(config.d_model, value_heads, bias=not mamba)
        if mamba:
            self.gate_log_rate = nn.Parameter(torch.empty(value_heads))
            self.gate_time_bias = nn.Parameter(torch.empty(value_heads))
        self.output_gate_proj = Linear(config.d_model, value_width, bias=False)
        self.output_norm = RMSNorm(config.head_dim, config.norm_eps)
        self.packed_state: PackedDeltaState | None = None
        if options.short_conv_size is not None:
            self.q_conv = ShortConvolution(key_width, options.short_conv_size)
            self.k_conv = ShortConvolution(key_width, options.short_conv_size)
            self.v_conv = ShortConvolution(value_width, options.short_conv_size)
            state = recurrent_state_geometry(LayerKind.GDN, config.heads, config.head_dim, config.options)
            self.packed_state = PackedDeltaState(
                (state.heads, state.key_dim, state.value_dim), state.history_rows, (key_width, key_width, value_width)
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
        q = q.view(batch, length, self.query_key_heads, self.head_k_dim)
        k = k.view(batch, length, self.query_key_heads, self.head_k_dim)
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
                log_gate=3,
            )
        else:
            mixed, final_state = self._sequence_parallel(q, k, v, gate, beta, recurrent_state)
        if self.packed_state is not None:
            final_state = self.packed_state.pack(final_state, final_histories)
        gated = self.output_norm.gated(mixed.to(hidden.dtype), self.output_gate_proj(hidden).view(shape))
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
