"""The causal softmax attention token mixer (``attn`` layers)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from schedlang.runtime.attention_parts import read_heads
from schedlang.runtime.kv_buffers import AttentionChunk, BufferedChunkAttention
from schedlang.runtime.mixer_base import HeadMixer, SequenceParallelContext
from schedlang.runtime.packing import ChunkDocuments, block_causal_mask
from schedlang.runtime.rotary import rotate_queries_and_keys
from schedlang.vocabulary import AttentionExchange, ModelConfig


class CausalAttentionMixer(HeadMixer):
    """Causal softmax attention, run over the whole sequence or chunk by chunk.

    Chunk by chunk, a chunk's queries attend to the keys and values of every
    earlier chunk and, causally, to their own, read from its microbatch's
    sequence-wide buffers ([Note: sequence-wide K/V] in
    :mod:`schedlang.runtime.kv_buffers`), which hold the ``kv_heads`` key/value
    heads, shared with their query heads only where the kernels read them
    ([Note: grouped key/value heads] in :mod:`schedlang.runtime.attention_parts`):
    nothing is passed as a state, and
    gradients reach earlier chunks' keys and values through the gradient
    buffers, so chunking changes nothing in the arithmetic except its
    blocking. The prefix grows with the position in the sequence, which is why
    StateFlow balances hybrid chunks (section 3.2). With a ``sequence_context`` the chunk is split over
    that group and its keys and values are all-gathered over it or passed around it, as the context's
    ``attention`` says ([Note: sequence-parallel attention] in
    :mod:`schedlang.runtime.attention_parallel`).

    ``config.options.attention`` (:class:`~schedlang.vocabulary.model_options.AttentionOptions`) sets the
    heads, grouped key/value heads, q/k/v biases and rotary position embeddings; the rotation turns
    queries and keys at their absolute positions before the keys reach the buffers ([Note: rotary
    positions] in :mod:`schedlang.runtime.rotary`). With flash-linear-attention's head layout and a
    ``rope_theta`` this is that library's ``Attention`` layer (``docs/models.md``).
    """

    def __init__(self, config: ModelConfig) -> None:
        options, geometry = config.options.attention, config.attention_geometry
        super().__init__(
            config, kv_heads=geometry.kv_heads, heads=geometry.heads, head_dim=geometry.head_dim,
            qkv_bias=options.qkv_bias,
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
        # k and v keep their kv_heads heads: the kernels share them with the query heads where they read them
        # ([Note: grouped key/value heads] in schedlang.runtime.attention_parts)
        q, k, v = self.project_grouped_qkv(hidden)
        if self.rope_theta is not None:
            q, k = rotate_queries_and_keys(q, k, self.rope_theta, 0 if chunk is None else chunk.position.start)
        # [B, H, L, D]
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        context = self.sequence_context
        group, exchange = (None, AttentionExchange.ALLGATHER) if context is None else (context.group, context.attention)
        if chunk is None:
            if group is not None:
                raise ValueError("sequence-parallel attention runs chunk by chunk: pass the chunk's position")
            mask = None if documents is None else block_causal_mask(documents, q.device)
            k, v = read_heads(k, self.heads), read_heads(v, self.heads)
            mixed = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=mask is None)
        else:
            mixed = BufferedChunkAttention.apply(q, k, v, chunk, group, documents, exchange)
        return self.o_proj(mixed.transpose(1, 2).reshape(batch, length, -1)), None
