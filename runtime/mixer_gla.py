"""The GLA and simple GLA token mixers (``gla`` and ``simple_gla`` layers)."""

from __future__ import annotations

import torch
from torch import nn

from schedlang.runtime.linear import Linear
from schedlang.runtime.mixer_base import HeadMixer, RMSNorm, SequenceParallelContext, kernel_backend
from schedlang.runtime.packing import ChunkDocuments, recurrent_by_document
from schedlang.vocabulary import GlaOptions, LayerKind, ModelConfig, OutputGate


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
                log_gate=3,
            )
        else:
            mixed, final_state = self._sequence_parallel(q, k, v, gate, initial_state)
        mixed = mixed.to(hidden.dtype)
        if self.output_gate_proj is not None:
            mixed = self.output_norm.gated(mixed, self.output_gate_proj(hidden).view(self.head_shape(hidden)))
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
