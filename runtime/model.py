"""The language model, cut into pipeline stages, run one sequence chunk at a time.

Every linear-recurrence layer takes the recurrent state left by the previous
chunk and returns the state after this one ([Note: state passing] in
:mod:`schedlang.runtime.executor`). Parameter initialisation depends only on
the seed and the index of the piece (embedding, layer ``l``, head), drawn from
a generator of its own, so a model split into any number of stages starts
from the same weights as the single-device model.

This module assembles the model (blocks, SwiGLU MLP, stages); each block's token mixer lives in a module of its
own: :mod:`schedlang.runtime.mixer_gla` (gla, simple_gla), :mod:`schedlang.runtime.mixer_gdn` (gdn),
:mod:`schedlang.runtime.mixer_mamba2` (mamba2), :mod:`schedlang.runtime.mixer_mamba3` (mamba3),
:mod:`schedlang.runtime.mixer_attention` (attn), over what they share in :mod:`schedlang.runtime.mixer_base`.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from schedlang.runtime.embedding import TokenEmbedding
from schedlang.runtime.kv_buffers import AttentionChunk, ChunkPosition
from schedlang.runtime.linear import Linear, active_weight_gradient_recorder, recording_weight_gradients
from schedlang.runtime.linear_cross_entropy import linear_cross_entropy
from schedlang.runtime.mixer_attention import CausalAttentionMixer
from schedlang.runtime.mixer_base import (
    INIT_STD, RMSNorm, SequenceParallelContext, _init_normal, kernel_backend, loss_kernel_backend,
)
from schedlang.runtime.mixer_gdn import GatedDeltaMixer
from schedlang.runtime.mixer_mamba2 import Mamba2Mixer
from schedlang.runtime.mixer_mamba3 import Mamba3Mixer
from schedlang.runtime.mixer_gla import GatedLinearMixer
from schedlang.runtime.packing import ChunkDocuments
from schedlang.vocabulary import LayerKind, ModelConfig, Recompute


def piece_generator(seed: int, piece_index: int) -> torch.Generator:
    """The generator for one piece of the model: embedding = 0, layer ``l`` = l + 1, head = n_layers + 1."""
    return torch.Generator().manual_seed(seed * 1_000_003 + piece_index)


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
        elif kind is LayerKind.MAMBA2:
            self.mixer = Mamba2Mixer(config)
        elif kind is LayerKind.MAMBA3:
            self.mixer = Mamba3Mixer(config)
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
    a copy of the same weight for its head. The copy is a ``TokenEmbedding`` under the same name,
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
        self.embedding = TokenEmbedding(config.vocab, config.d_model) if holds_embedding else None
        self.layers = nn.ModuleDict({str(index): Block(config, config.layers[index]) for index in layer_indices})
        self.final_norm = RMSNorm(config.d_model, config.norm_eps) if is_last else None
        self.lm_head = Linear(config.d_model, config.vocab, bias=False) if is_last and not tied else None
        self.loss_block_tokens: int | None = None  # rows per block of the fused loss; None: its default

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

    @property
    def head_weight(self) -> torch.Tensor:
        """The LM head's weight ``[vocab, d_model]``: the embedding's when tied."""
        return self.embedding.weight if self.lm_head is None else self.lm_head.weight

    def loss(self, hidden: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Summed float32 cross-entropy over the chunk's tokens (the caller normalises by the global count);
        targets equal to :data:`schedlang.runtime.packing.IGNORED_TARGET` carry none. The final norm, then
        the head and the loss fused, block by block of tokens, never holding the whole logits ([Note: fused
        head and loss] in :mod:`schedlang.runtime.linear_cross_entropy`); ``loss_block_tokens`` (None: that
        module's default) sets the block. The head's weight gradient is added into an existing ``.grad`` in
        place (that Note's ``add_into_existing_grad``)."""
        accumulate = self.lm_head is not None and self.lm_head.accumulate_into_grad
        return linear_cross_entropy(
            self.final_norm(hidden),
            self.head_weight,
            targets,
            block_tokens=self.loss_block_tokens,
            accumulate_into_grad=accumulate,
            add_into_existing_grad=True,
            backend=loss_kernel_backend(hidden.device),
        )

    def reference_loss(self, hidden: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """:meth:`loss` through the whole logits: ``F.cross_entropy`` of :meth:`logits` in float32 (the
        reference the fused loss is measured against)."""
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
        if isinstance(module, (GatedLinearMixer, GatedDeltaMixer, Mamba2Mixer, Mamba3Mixer, CausalAttentionMixer)):
            module.sequence_context = sequence_context
        if isinstance(module, Block) and recompute in (Recompute.MLP, Recompute.MIXER):
            module.recompute = Recompute(recompute)
    return model.to(dtype)
