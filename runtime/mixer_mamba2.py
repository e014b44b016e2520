"""The Mamba-2 token mixer (``mamba2`` layers), flash-linear-attention's ``Mamba2`` layer math."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from schedlang.kernels.gated_rms_norm import gated_rms_norm
from schedlang.vocabulary import ModelConfig, recurrent_state_geometry
from schedlang.runtime.linear import Linear
from schedlang.runtime.mixer_base import INIT_STD, SequenceParallelContext, _init_normal, kernel_backend
from schedlang.runtime.packing import ChunkDocuments, recurrent_by_document
from schedlang.runtime.short_convolution import PackedDeltaState, ShortConvolution, sequence_parallel_histories
from schedlang.vocabulary import LayerKind

A_INIT_RANGE = (1.0, 16.0)
"""``A = -exp(A_log)`` starts with ``exp(A_log)`` drawn from U(1, 16) (fla's ``A_init_range``)."""


def _at_least_float32(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor`` in float32, or as it is when wider (a float64 model's step stays float64)."""
    return tensor.to(torch.promote_types(tensor.dtype, torch.float32))


class GatedGroupRMSNorm(nn.Module):
    """fla's ``RMSNormGated`` with ``norm_before_gate = False``: ``rmsnorm(y * silu(z)) * weight``, the
    RMS taken over each of ``groups`` runs of ``width / groups`` channels, in float32 (float64 for float64):
    :func:`schedlang.kernels.gated_rms_norm.gated_rms_norm`, one Triton launch each way on CUDA."""

    def __init__(self, width: int, groups: int, eps: float) -> None:
        super().__init__()
        self.groups = groups
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(width))

    def forward(self, values: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        backend = kernel_backend(values.device)
        return gated_rms_norm(values, gate, self.weight, self.groups, self.eps, backend=backend)


class Mamba2Mixer(nn.Module):
    """Mamba-2 (``config.options.mamba2``, :class:`~schedlang.vocabulary.model_options.Mamba2Options`) with the
    model's ``heads`` heads of ``head_dim``.

    ``in_proj`` gives, per token, the gate ``z`` (``heads * head_dim``), then ``x``, ``B`` and ``C``
    (``heads * head_dim + 2 n_groups state_size``, fla's ``conv_dim``), then one time step per head. x, B and
    C pass through one causal depthwise convolution with SiLU, whose last ``conv_kernel - 1`` inputs join the
    state ([Note: short-convolution state] in :mod:`schedlang.runtime.short_convolution`). The SSD runs with
    ``A = -exp(A_log)`` and ``dt = softplus(dt + dt_bias)`` (clamped to ``dt_limit`` when one is given) in
    float32 through simple GLA's chunk kernels (:func:`schedlang.kernels.mamba2.chunk_mamba2`: Triton on CUDA,
    batched PyTorch on the CPU); ``D x`` is added, the result normalised per group after gating with
    ``silu(z)`` (:class:`GatedGroupRMSNorm`), then projected back by ``out_proj``. Head ``h`` reads B/C group
    ``h // (heads / n_groups)``, mamba_ssm's order (fla's CUDA path; its PyTorch path differs for
    ``n_groups > 1``, docs/models.md).

    The layer's state is one packed tensor: the SSD state ``[heads, state_size, head_dim]`` then the
    convolution's history (:class:`PackedDeltaState`).
    """

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        options = config.options.mamba2
        self.options = options
        self.heads, self.head_dim = config.heads, config.head_dim
        self.inner_width = options.inner_width(config.heads, config.head_dim)
        self.convolved_width = options.convolved_width(config.heads, config.head_dim)
        self.in_proj = Linear(
            config.d_model, self.inner_width + self.convolved_width + self.heads, bias=options.use_bias
        )
        self.conv1d = ShortConvolution(self.convolved_width, options.conv_kernel, bias=options.use_conv_bias)
        self.dt_bias = nn.Parameter(torch.empty(self.heads))
        self.A_log = nn.Parameter(torch.empty(self.heads))
        self.D = nn.Parameter(torch.empty(self.heads))
        self.norm = GatedGroupRMSNorm(self.inner_width, options.n_groups, config.norm_eps)
        self.out_proj = Linear(self.inner_width, config.d_model, bias=options.use_bias)
        state = recurrent_state_geometry(LayerKind.MAMBA2, config.heads, config.head_dim, config.options)
        self.packed_state = PackedDeltaState(
            (state.heads, state.key_dim, state.value_dim), state.history_rows, (self.convolved_width,)
        )
        self.sequence_context: SequenceParallelContext | None = None

    def reset_parameters(self, generator: torch.Generator, output_std: float) -> None:
        """``in_proj`` and the convolution normal (``INIT_STD``), ``out_proj`` normal (``output_std``), biases
        zero; as fla draws them: ``A_log = log U(1, 16)``, ``dt_bias`` the inverse softplus of
        ``exp(U(log dt_min, log dt_max))`` raised to at least ``dt_init_floor``, ``D = 1``; the norm's
        weight 1."""
        options = self.options
        _init_normal(self.in_proj.weight, INIT_STD, generator)
        _init_normal(self.conv1d.weight, INIT_STD, generator)
        _init_normal(self.out_proj.weight, output_std, generator)
        rate = torch.empty(self.heads).uniform_(*A_INIT_RANGE, generator=generator)
        uniform = torch.rand(self.heads, generator=generator)
        low, high = math.log(options.dt_min), math.log(options.dt_max)
        step = torch.exp(uniform * (high - low) + low).clamp_min(options.dt_init_floor)
        with torch.no_grad():
            for bias in (self.in_proj.bias, self.out_proj.bias, self.conv1d.bias):
                if bias is not None:
                    bias.zero_()
            self.A_log.copy_(torch.log(rate))
            self.dt_bias.copy_(step + torch.log(-torch.expm1(-step)))
            self.D.fill_(1.0)
            self.norm.weight.fill_(1.0)

    def time_step(self, raw: torch.Tensor) -> torch.Tensor:
        """``[B, L, H]``: ``softplus(raw + dt_bias)`` in float32 (float64 for float64), clamped to ``dt_limit``."""
        step = F.softplus(_at_least_float32(raw) + _at_least_float32(self.dt_bias))
        limit = self.options.dt_limit
        if limit is not None:
            step = step.clamp(min=limit[0], max=limit[1])
        return step

    def forward(
        self, hidden: torch.Tensor, initial_state: torch.Tensor | None, documents: ChunkDocuments | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``documents``: the chunk's packed documents; the SSD state and the convolution's history both start
        afresh at each document start ([Note: packed documents], [Note: short convolutions over packed
        documents])."""
        from schedlang.kernels.mamba2 import chunk_mamba2, ssd_operands, ssd_skip

        batch, length, _ = hidden.shape
        options = self.options
        recurrent_state, history = None, None
        if initial_state is not None:
            recurrent_state, (history,) = self.packed_state.unpack(initial_state)
        gate, convolved, raw_step = self.in_proj(hidden).split(
            (self.inner_width, self.convolved_width, self.heads), dim=-1
        )
        convolved, final_history = self._convolve(convolved, history, documents)
        x, B, C = convolved.split(
            (self.inner_width, options.n_groups * options.state_size, options.n_groups * options.state_size), dim=-1
        )
        x = x.reshape(batch, length, self.heads, self.head_dim)
        B = B.reshape(batch, length, options.n_groups, options.state_size)
        C = C.reshape(batch, length, options.n_groups, options.state_size)
        A = -torch.exp(_at_least_float32(self.A_log))
        backend = kernel_backend(x.device)
        if self.sequence_context is None and (documents is None or not documents.resets_state):
            # the whole SSD as one operator: B and C read by group, both pointwise ends' backward in one pass
            mixed, final_state = chunk_mamba2(x, self.time_step(raw_step), A, B, C, self.D, recurrent_state,
                                              output_final_state=True, backend=backend)
        else:
            # one process reads B and C by group; the sequence-parallel scans take them per head
            operands = ssd_operands(x, self.time_step(raw_step), A, B, C, backend,
                                    grouped=self.sequence_context is None)
            if self.sequence_context is None:
                mixed, final_state = recurrent_by_document(
                    documents, recurrent_state, self._chunk_simple_gla,
                    operands.q, operands.k, operands.v, operands.g, log_gate=3,
                )
            else:
                mixed, final_state = self._sequence_parallel(operands, recurrent_state)
            mixed = ssd_skip(mixed, x, self.D, backend)
        gated = self.norm(mixed.reshape(batch, length, self.inner_width), gate)
        return self.out_proj(gated), self.packed_state.pack(final_state, (final_history,))

    def _chunk_simple_gla(self, state, q, k, v, g):
        """Simple GLA over the SSD's operands, q and k by group."""
        from schedlang.kernels.simple_gla import chunk_simple_gla

        return chunk_simple_gla(
            q, k, v, g, scale=1.0, initial_state=state, output_final_state=True, backend=kernel_backend(q.device)
        )

    def _convolve(self, convolved, history, documents):
        """The convolution of x, B and C from ``history`` (None: zeros) and the history after the chunk, across
        the sequence-parallel group when there is one ([Note: short convolutions across sequence ranks])."""
        if self.sequence_context is None:
            return self.conv1d(convolved, history, documents)
        if history is None:
            history = convolved.new_zeros(convolved.shape[0], self.packed_state.history, convolved.shape[-1])
        (starting,), (final,) = sequence_parallel_histories((convolved,), (history,), self.sequence_context.group)
        return self.conv1d(convolved, starting)[0], final

    def _sequence_parallel(self, operands, initial_state):
        """This rank's slice of the chunk; see [Note: sequence-parallel chunks] in the executor."""
        from schedlang.runtime.sequence_parallel import GateKind, sequence_parallel_chunk_gla

        context = self.sequence_context
        return sequence_parallel_chunk_gla(
            operands.q, operands.k, operands.v, operands.g,
            group=context.group, method=context.method, scan_blocks=context.scan_blocks,
            initial_state=initial_state, output_final_state=True, scale=1.0,
            backend=kernel_backend(operands.q.device), gate=GateKind.SCALAR,
        )
