"""The glue of a chunked gated recurrence whose variants differ only by the gate's shape (GLA, simple GLA).

As flash-linear-attention composes its ``simple_gla`` from the common chunk passes, an operator here is its
gate layout (:mod:`schedlang.kernels.common.gate_layout`), its two intra-chunk pieces (the only code of its
own: how the decay inside a chunk meets the scores) and where its Triton implementation lives. Everything
else is written once below: the state passes of :mod:`schedlang.kernels.common.chunk_state_passes` bound to
the gate, the PyTorch forward, the backend choice and the public call through
:class:`~schedlang.kernels.common.function.ChunkRecurrenceFunction`.

Shapes (the user layout): q, k [B, T, H, K]; v [B, T, H, V]; g [B, T, H, K] with a gate per key, [B, T, H]
with a scalar gate; states [B, H, N + 1, K, V] (entry n enters chunk n, entry N is the final state); the
cumulative log decay [B, H, N + 1, K] or [B, H, N + 1]. A grouped call (``grouped_queries``) takes q and k
[B, T, G, K], G dividing H ([Note: grouped head order] in schedlang.kernels.common.heads): an operator whose
Triton kernels read q and k by group (``triton_reads_groups``) hands them over as they are on its Triton path;
every other path repeats them per head first, and autograd sums their gradients back.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property

import torch

from schedlang.kernels.common import chunk_state_passes
from schedlang.kernels.common.arguments import Backend, CHUNK_SIZE, check_recurrence_arguments, resolve_backend
from schedlang.kernels.common.chunking import ChunkStates
from schedlang.kernels.common.function import ChunkRecurrenceFunction, Implementation, torch_implementation
from schedlang.kernels.common.gate_layout import GateLayout
from schedlang.kernels.common.heads import repeat_each_head


@dataclass(frozen=True)
class ChunkOperator:
    """One gated chunk recurrence: its gate layout, its intra-chunk pieces, the module of its Triton path."""

    gate: GateLayout
    intra_chunk_output: Callable[..., torch.Tensor]  # (q, k, v, g, scale, chunk_size) -> [B, T, H, V]
    intra_chunk_gradients: Callable[..., tuple[torch.Tensor, ...]]  # -> dq, dk, dv, dg
    triton_module: str  # a module with TRITON_IMPLEMENTATION, imported on first use
    triton_reads_groups: bool = False  # its Triton implementation takes q, k [B, T, G, K] with G dividing H

    def local_chunk_states(
        self, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, chunk_size: int = CHUNK_SIZE
    ) -> ChunkStates:
        """ZeCO Algorithm 1, phase 1: chunk states from a zero initial state (``states[:, :, 0] = 0``), and the
        cumulative log decay (entry n the sum of g over chunks 0..n-1, the log of ZeCO's gamma_tilde)."""
        return chunk_state_passes.local_chunk_states(self.gate, k, v, g, chunk_size)

    def update_state_rows(
        self,
        incoming_state: torch.Tensor,
        local_state: torch.Tensor,
        log_decay: torch.Tensor,
        row_start: int = 0,
        row_end: int | None = None,
    ) -> torch.Tensor:
        """The All-Scan step on key rows [row_start, row_end): exp(log_decay) * S_in + S_local.

        incoming_state: [B, H, K, V]; local_state: [B, H, K, V] or [B, H, M, K, V] (then every boundary is
        updated); log_decay: the decay of local_state's boundaries. Returns the updated rows, float32/64.
        """
        return chunk_state_passes.update_state_rows(
            self.gate, incoming_state, local_state, log_decay, row_start, row_end
        )

    def chunk_states(
        self,
        k: torch.Tensor,
        v: torch.Tensor,
        g: torch.Tensor,
        initial_state: torch.Tensor | None = None,
        chunk_size: int = CHUNK_SIZE,
    ) -> torch.Tensor:
        """States entering every chunk and the final state, from initial_state (zeros if None): [B, H, N + 1, K,
        V]. This is also the backward's recomputation of states."""
        return chunk_state_passes.chunk_states(self.gate, k, v, g, initial_state, chunk_size)

    def output_from_states(
        self, q: torch.Tensor, g: torch.Tensor, states: torch.Tensor, scale: float, chunk_size: int = CHUNK_SIZE
    ) -> torch.Tensor:
        """The part of the output read from the state entering each chunk (states[:, :, :N]): [B, T, H, V]."""
        return chunk_state_passes.output_from_states(self.gate, q, g, states, scale, chunk_size)

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        g: torch.Tensor,
        scale: float,
        initial_state: torch.Tensor | None = None,
        chunk_size: int = CHUNK_SIZE,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Output [B, T, H, V] (v's dtype) and final state [B, H, K, V]; differentiable through autograd."""
        states = self.chunk_states(k, v, g, initial_state, chunk_size)
        intra = self.intra_chunk_output(q, k, v, g, scale, chunk_size)
        output = intra + self.output_from_states(q, g, states, scale, chunk_size)
        return output.to(v.dtype), states[:, :, -1]

    def local_chunk_state_gradients(
        self, q: torch.Tensor, g: torch.Tensor, do: torch.Tensor, scale: float, chunk_size: int = CHUNK_SIZE
    ) -> ChunkStates:
        """Backward state pass from a zero final-state gradient (the backward All-Scan's local phase).

        Returns ChunkStates(states = dS [B, H, N + 1, K, V], the gradient of the loss with respect to the
        state entering each chunk with dS[:, :, N] = 0, and the log decay with entry n the sum of g from chunk
        n to the end). The global gradients are update_state_rows(dS_final, dS, log_decay).
        """
        return chunk_state_passes.local_chunk_state_gradients(self.gate, q, g, do, scale, chunk_size)

    def chunk_state_gradients(
        self,
        q: torch.Tensor,
        g: torch.Tensor,
        do: torch.Tensor,
        scale: float,
        final_state_grad: torch.Tensor | None = None,
        chunk_size: int = CHUNK_SIZE,
    ) -> torch.Tensor:
        """Gradient with respect to the state at every chunk boundary: [B, H, N + 1, K, V]; entry 0 is
        d initial_state."""
        return chunk_state_passes.chunk_state_gradients(self.gate, q, g, do, scale, final_state_grad, chunk_size)

    @cached_property
    def torch_implementation(self) -> Implementation:
        return torch_implementation(
            self.forward, self.chunk_states, self.chunk_state_gradients, self.intra_chunk_gradients
        )

    def implementation_for(self, backend: str, q: torch.Tensor) -> Implementation:
        """The Implementation ``backend`` ("auto", "triton" or "torch") picks for operands like ``q``."""
        chosen = resolve_backend(backend, q.device, matmul_dtype=q.dtype)
        if chosen is Backend.TORCH:
            return self.torch_implementation
        return importlib.import_module(self.triton_module).TRITON_IMPLEMENTATION

    def reads_groups(self, implementation: Implementation) -> bool:
        """Whether ``implementation`` takes q and k by group ([B, T, G, K]); otherwise the caller repeats them
        per head."""
        return self.triton_reads_groups and implementation is not self.torch_implementation

    def __call__(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        g: torch.Tensor,
        scale: float | None = None,
        initial_state: torch.Tensor | None = None,
        output_final_state: bool = False,
        backend: str = "auto",
        save_states: bool = False,
        grouped_queries: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The public operator: checked arguments through ChunkRecurrenceFunction (see ``chunk_gla``). With
        ``grouped_queries`` q and k may have G heads, G dividing v's H (the module docstring says which path
        reads them by group)."""
        shape = check_recurrence_arguments(
            q, k, v, g, initial_state, gate_per_key=self.gate.gate_per_key, grouped_queries=grouped_queries
        )
        implementation = self.implementation_for(backend, q)
        if grouped_queries and not self.reads_groups(implementation):
            q, k = repeat_each_head(q, shape.heads), repeat_each_head(k, shape.heads)
        if scale is None:
            scale = shape.key_dim**-0.5
        output, final_state = ChunkRecurrenceFunction.apply(
            q, k, v, g, initial_state, float(scale), implementation, bool(save_states)
        )
        return output, (final_state if output_final_state else None)
