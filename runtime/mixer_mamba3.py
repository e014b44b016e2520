"""The Mamba-3 token mixer (``mamba3`` layers): flash-linear-attention's ``Mamba3`` layer math, SISO."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from schedlang.kernels.common.heads import repeat_each_head
from schedlang.runtime.linear import Linear
from schedlang.runtime.mixer_base import INIT_STD, SequenceParallelContext, _init_normal, kernel_backend
from schedlang.runtime.packing import ChunkDocuments, recurrent_by_document
from schedlang.runtime.short_convolution import PackedDeltaState, sequence_parallel_histories
from schedlang.vocabulary import LayerKind, ModelConfig, recurrent_state_geometry


def _at_least_float32(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor`` in float32, or as it is when wider (a float64 model's step stays float64)."""
    return tensor.to(torch.promote_types(tensor.dtype, torch.float32))


class WeightedRMSNorm(nn.Module):
    """fla's ``RMSNormGated`` as Mamba-3 uses it: ``rmsnorm(x) * weight`` over runs of ``group`` channels (the
    whole last dimension when None), then ``* silu(gate)`` when a gate is given (norm before gate), in float32
    (float64 for float64); the result stays in that precision."""

    def __init__(self, width: int, eps: float, group: int | None = None) -> None:
        super().__init__()
        self.eps = eps
        self.group = group
        self.weight = nn.Parameter(torch.ones(width))

    def forward(self, values: torch.Tensor, gate: torch.Tensor | None = None) -> torch.Tensor:
        values = _at_least_float32(values)
        grouped = values if self.group is None else values.unflatten(-1, (-1, self.group))
        normed = F.rms_norm(grouped, (grouped.shape[-1],), eps=self.eps).reshape(values.shape)
        normed = normed * _at_least_float32(self.weight)
        return normed if gate is None else normed * F.silu(_at_least_float32(gate))


class Mamba3Mixer(nn.Module):
    """Mamba-3 SISO (``config.options.mamba3``, :class:`~schedlang.vocabulary.model_options.Mamba3Options`) with
    the model's ``heads`` heads of ``head_dim``; fla's ``Mamba3`` parameters and names.

    ``in_proj`` gives, per token, the gate ``z`` and ``x`` (``heads * head_dim`` each), B and C (``n_groups *
    state_size`` each), then per head ``dd_dt``, ``dd_A`` and ``trap``, then the ``angle_count`` rotary angle
    rates. There is no convolution. B and C are RMS-normalised over each group's ``state_size`` (``B_norm``,
    ``C_norm``), repeated for their heads (head ``h`` reads group ``h // (heads / n_groups)``) and given each
    head's bias (``B_bias``, ``C_bias``). ``A = min(-softplus(dd_A), -A_floor)``, ``dt = softplus(dd_dt +
    dt_bias)``, ``trap = sigmoid(trap)``, the angle rates ``pi tanh(angles)``; the recurrence is
    :func:`schedlang.kernels.mamba3.chunk_mamba3`'s (kernels/mamba3/README.md), run as one simple-GLA call
    (Triton on CUDA, batched PyTorch on the CPU). ``D x`` is added, the result gated by ``silu(z)`` (or, with
    ``is_outproj_norm``, normalised per head and then gated) and projected back by ``out_proj``.

    The layer's state is one packed tensor (:class:`PackedDeltaState`): the SSM state ``[heads, state_size,
    head_dim]``, then one row of the cumulative angles ``[heads, angle_count]``, the last token's rotated key
    ``[heads, state_size]`` and its input ``[heads, head_dim]``.
    """

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        options = config.options.mamba3
        if options.is_mimo:
            raise ValueError("is_mimo: Mamba-3's MIMO variant is not built (only SISO)")
        self.options = options
        self.heads, self.head_dim = config.heads, config.head_dim
        self.inner_width = options.inner_width(config.heads, config.head_dim)
        self.angle_count = options.angle_count()
        self.in_proj = Linear(
            config.d_model, options.projected_width(config.heads, config.head_dim), bias=options.use_bias
        )
        self.dt_bias = nn.Parameter(torch.empty(self.heads))
        self.B_bias = nn.Parameter(torch.empty(self.heads, 1, options.state_size))
        self.C_bias = nn.Parameter(torch.empty(self.heads, 1, options.state_size))
        self.B_norm = WeightedRMSNorm(options.state_size, config.norm_eps)
        self.C_norm = WeightedRMSNorm(options.state_size, config.norm_eps)
        self.D = nn.Parameter(torch.empty(self.heads))
        self.norm = None
        if options.is_outproj_norm:
            self.norm = WeightedRMSNorm(self.inner_width, config.norm_eps, self.head_dim)
        self.out_proj = Linear(self.inner_width, config.d_model, bias=options.use_bias)
        state = recurrent_state_geometry(LayerKind.MAMBA3, config.heads, config.head_dim, config.options)
        self.packed_state = PackedDeltaState(
            (state.heads, state.key_dim, state.value_dim),
            1,
            (self.heads * self.angle_count, self.heads * options.state_size, self.heads * self.head_dim),
        )
        self.sequence_context: SequenceParallelContext | None = None

    def reset_parameters(self, generator: torch.Generator, output_std: float) -> None:
        """``in_proj`` normal (``INIT_STD``), ``out_proj`` normal (``output_std``), biases zero; as fla draws
        them: ``dt_bias`` the inverse softplus of ``exp(U(log dt_min, log dt_max))`` raised to at least
        ``dt_init_floor``, ``D``, ``B_bias``, ``C_bias`` and the norms' weights 1."""
        options = self.options
        _init_normal(self.in_proj.weight, INIT_STD, generator)
        _init_normal(self.out_proj.weight, output_std, generator)
        uniform = torch.rand(self.heads, generator=generator)
        low, high = math.log(options.dt_min), math.log(options.dt_max)
        step = torch.exp(uniform * (high - low) + low).clamp_min(options.dt_init_floor)
        with torch.no_grad():
            for bias in (self.in_proj.bias, self.out_proj.bias):
                if bias is not None:
                    bias.zero_()
            self.dt_bias.copy_(step + torch.log(-torch.expm1(-step)))
            for parameter in (self.D, self.B_bias, self.C_bias, self.B_norm.weight, self.C_norm.weight):
                parameter.fill_(1.0)
            if self.norm is not None:
                self.norm.weight.fill_(1.0)

    def forward(
        self, hidden: torch.Tensor, initial_state: torch.Tensor | None, documents: ChunkDocuments | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``documents``: the chunk's packed documents; at each document start the SSM state, the carried
        previous-token term and the angles all start afresh ([Note: packed documents])."""
        from schedlang.kernels.mamba3 import cumulative_angles, entry_state, rotate_pairs, trapezoid_operands

        batch, length, _ = hidden.shape
        options = self.options
        ssm, angle, key, value = None, None, None, None
        if initial_state is not None:
            ssm, (angle, key, value) = self.packed_state.unpack(initial_state)
            angle = angle.reshape(batch, self.heads, self.angle_count)
            key = key.reshape(batch, self.heads, options.state_size)
            value = value.reshape(batch, self.heads, self.head_dim)
        groups = options.n_groups * options.state_size
        gate, x, B, C, dd_dt, dd_A, trap, angles = self.in_proj(hidden).split(
            (self.inner_width, self.inner_width, groups, groups, self.heads, self.heads, self.heads,
             self.angle_count),
            dim=-1,
        )
        x = x.reshape(batch, length, self.heads, self.head_dim)
        B = self._per_head(self.B_norm, B, self.B_bias)
        C = self._per_head(self.C_norm, C, self.C_bias)
        A = (-F.softplus(_at_least_float32(dd_A))).clamp(max=-options.A_floor)
        dt = F.softplus(_at_least_float32(dd_dt) + _at_least_float32(self.dt_bias))
        trap = torch.sigmoid(_at_least_float32(trap))
        rates = (math.pi * torch.tanh(_at_least_float32(angles)))[:, :, None, :].expand(-1, -1, self.heads, -1)
        if self.sequence_context is not None:
            mixed, final = self._sequence_parallel(x, dt, A * dt, trap, B, C, rates, (ssm, angle, key, value))
        else:
            starts = None if documents is None else self._document_starts(documents, batch, hidden.device)
            theta = cumulative_angles(rates, dt, angle, restarts=starts)
            q, k = rotate_pairs(C, theta), rotate_pairs(B, theta)
            operands = trapezoid_operands(q, k, x, dt, A * dt, trap, starts)
            start = None if ssm is None else entry_state(ssm, key, value, operands.entry)
            mixed, final_ssm = recurrent_by_document(
                documents, start, self._chunk_simple_gla,
                operands.q.to(x.dtype), operands.k.to(x.dtype), operands.v, operands.g,
                log_gate=3,
            )
            mixed = mixed.to(operands.diagonal.dtype) - operands.diagonal
            final = (final_ssm, theta[:, -1], k[:, -1], x[:, -1])
        mixed = mixed + _at_least_float32(self.D)[:, None] * _at_least_float32(x)
        mixed = mixed.reshape(batch, length, self.inner_width)
        if self.norm is None:
            gated = mixed * F.silu(_at_least_float32(gate))
        else:
            gated = self.norm(mixed, gate)
        final_ssm, final_angle, final_key, final_value = final
        packed = self.packed_state.pack(final_ssm, (final_angle, final_key, final_value))
        return self.out_proj(gated.to(hidden.dtype)), packed

    def _per_head(self, norm: WeightedRMSNorm, projected: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        """B or C ``[B, L, heads, state_size]``: each group normalised, repeated for its heads, plus the bias."""
        grouped = projected.unflatten(-1, (self.options.n_groups, self.options.state_size))
        return repeat_each_head(norm(grouped), self.heads) + _at_least_float32(bias[:, 0])

    @staticmethod
    def _document_starts(documents: ChunkDocuments, batch: int, device: torch.device) -> torch.Tensor:
        """``[B, L]`` bool: the chunk's tokens that start a document (a row's first token when its document
        does not continue from the previous chunk)."""
        starts = torch.zeros(batch, documents.end - documents.start, dtype=torch.bool)
        for row in range(documents.rows):
            if not documents.continues(row):
                starts[row, 0] = True
            for position in documents.inner_starts[row]:
                starts[row, position - documents.start] = True
        return starts.to(device)

    def _chunk_simple_gla(self, state, q, k, v, g):
        from schedlang.kernels import chunk_simple_gla

        return chunk_simple_gla(
            q, k, v, g, scale=1.0, initial_state=state, output_final_state=True, backend=kernel_backend(q.device)
        )

    def _sequence_parallel(self, x, dt, adt, trap, B, C, rates, carried):
        """This rank's slice of the chunk (see [Note: sequence-parallel chunks] in the executor). The ranks scan
        their angle sums (each rank's sum turns every later rank's keys), hand each rank the previous rank's
        last rotated key and input (the trapezoid's previous-token term), and run the simple-GLA scan with one
        leading token per rank that adds that term: ``q = 0``, ``k = e_0 k_prev``, ``v = x_prev``, ``g = 0``.
        Returns the mixed values and the parts of the state after the whole chunk, on every rank."""
        from schedlang.kernels.mamba3 import cumulative_angles, rotate_pairs, trapezoid_operands, wrap_angle
        from schedlang.runtime.scan_common import DiagonalDecay
        from schedlang.runtime.sequence_parallel import (
            GateKind,
            ScanConfig,
            StateScanFunction,
            sequence_parallel_chunk_gla,
        )

        context = self.sequence_context
        ssm, angle, key, value = carried
        batch = x.shape[0]
        steps = _at_least_float32(rates) * dt[..., None]
        local_sum = wrap_angle(steps.sum(dim=1))[:, :, None, :]
        if angle is None:
            angle = torch.zeros_like(local_sum[:, :, 0])
        scan = ScanConfig(group=context.group, method=context.method, scan_blocks=1, output_final_state=True)
        entering, final_angle = StateScanFunction.apply(
            local_sum.contiguous(), torch.ones_like(local_sum[..., :1]), angle[:, :, None, :].to(local_sum.dtype),
            DiagonalDecay, scan,
        )
        theta = cumulative_angles(rates, dt, entering[:, :, 0])
        q, k = rotate_pairs(C, theta), rotate_pairs(B, theta)
        operands = trapezoid_operands(q, k, x, dt, adt, trap)
        if key is None:
            key = k.new_zeros(batch, self.heads, k.shape[-1])
            value = x.new_zeros(batch, self.heads, self.head_dim)
        (previous_key, previous_value), (final_key, final_value) = sequence_parallel_histories(
            (k[:, -1:].flatten(2), x[:, -1:].flatten(2).to(k.dtype)),
            (key.reshape(batch, 1, -1).to(k.dtype), value.reshape(batch, 1, -1).to(k.dtype)),
            context.group,
        )
        previous_key = previous_key.view(batch, 1, self.heads, -1)
        previous_value = previous_value.view(batch, 1, self.heads, -1)
        lead_k = operands.entry[:, None, :, None] * previous_key
        mixed, final_ssm = sequence_parallel_chunk_gla(
            torch.cat((torch.zeros_like(lead_k), operands.q), dim=1).to(x.dtype),
            torch.cat((lead_k, operands.k), dim=1).to(x.dtype),
            torch.cat((previous_value.to(x.dtype), operands.v), dim=1),
            torch.cat((torch.zeros_like(operands.g[:, :1]), operands.g), dim=1),
            group=context.group, method=context.method, scan_blocks=context.scan_blocks,
            initial_state=ssm, output_final_state=True, scale=1.0,
            backend=kernel_backend(x.device), gate=GateKind.SCALAR,
        )
        mixed = mixed[:, 1:].to(operands.diagonal.dtype) - operands.diagonal
        final = (final_ssm, wrap_angle(final_angle[:, :, 0]), final_key.view(batch, self.heads, -1),
                 final_value.view(batch, self.heads, -1))
        return mixed, final
