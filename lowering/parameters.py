"""Parameter counts of the runtime's language model, per layer and per pipeline stage.

The FLOPS cost model charges every backward for adding its parameter gradients into ``.grad``
(docs/cost-model.md), which needs how many parameters a stage holds and how many of them are weights of
linear layers (those a CUDA-graph stage accumulates inside its weight-gradient GEMMs instead). A layer's count
is read off the runtime's own block (:func:`layer_parameters`); tests/lowering/test_lowering_parameters.py builds
the whole model and compares.
"""

from __future__ import annotations

import functools
from collections import Counter
from dataclasses import dataclass

from schedlang.lowering.program import ScheduleProgram
from schedlang.vocabulary import LayerKind, MlpKind, ModelConfig

MLP_WIDTH_MULTIPLE = 8
"""The runtime rounds SwiGLU widths up to a multiple of 8 (``schedlang.runtime.model.swiglu_width``)."""


@dataclass(frozen=True)
class ParameterCount:
    linear_weights: int  # weights of linear layers (projections, MLP, LM head)
    other: int  # embedding, norms, biases

    @property
    def total(self) -> int:
        return self.linear_weights + self.other

    def __add__(self, other: ParameterCount) -> ParameterCount:
        return ParameterCount(self.linear_weights + other.linear_weights, self.other + other.other)


def mlp_width(model: ModelConfig) -> int:
    """The SwiGLU hidden width the runtime builds (0 without an MLP): ``options.mlp_width`` as is, else from
    ``mlp_ratio``."""
    if model.mlp_kind is MlpKind.NONE:
        return 0
    if model.options.mlp_width is not None:
        return model.options.mlp_width
    width = max(1, int(round(model.d_model * model.mlp_ratio)))
    return -(-width // MLP_WIDTH_MULTIPLE) * MLP_WIDTH_MULTIPLE


@functools.lru_cache(maxsize=64)
def _meta_block(model: ModelConfig, kind: LayerKind):
    """The runtime's own ``Block`` of ``kind`` for ``model``, built on torch's meta device
    (shapes, no memory, no values)."""
    import torch

    from schedlang.runtime.model import Block

    with torch.device("meta"):
        return Block(model, kind)


def _linear_weights(module) -> int:
    from schedlang.runtime.linear import Linear

    return sum(part.weight.numel() for part in module.modules() if isinstance(part, Linear))


@functools.lru_cache(maxsize=64)
def layer_parameters(model: ModelConfig, kind: LayerKind) -> ParameterCount:
    """One block (its norms, token mixer and MLP; [Note: separate MLP layers]: an ``mlp`` layer is only the MLP)
    counted on the runtime's own ``Block`` (:func:`_meta_block`): every option the runtime honours (narrow keys,
    grouped heads, low-rank gates, output gates, short convolutions, attention heads, MLP widths) counts as the
    runtime builds it."""
    block = _meta_block(model, kind)
    weights = _linear_weights(block)
    return ParameterCount(weights, sum(parameter.numel() for parameter in block.parameters()) - weights)


def mixer_linear_weights(model: ModelConfig, kind: LayerKind) -> int:
    """The weights of the linear layers of a ``kind`` layer's token mixer as the runtime builds it (its q, k, v
    and output projections and its gates; 0 for ``mlp``): each costs 2 FLOPs per token forward."""
    mixer = _meta_block(model, kind).mixer
    return 0 if mixer is None else _linear_weights(mixer)


def stage_parameters(program: ScheduleProgram, stage: int) -> ParameterCount:
    """The layers of ``stage``, plus the embedding on the first stage and the final norm and head on the last.

    With ``tie_embeddings`` the head has no weight of its own: on one stage it reads the embedding's, and a
    last stage after the first holds a copy of the embedding's ([Note: tied embeddings across stages] in
    schedlang.runtime.model), counted like the embedding (not a linear layer's weight)."""
    model = program.model
    count = ParameterCount(0, 0)
    kinds = Counter(model.layers[layer] for layer in program.stage_layers[stage])
    for kind, n_layers in kinds.items():  # once per kind: layer_parameters looks at the whole model
        one = layer_parameters(model, kind)
        count = count + ParameterCount(one.linear_weights * n_layers, one.other * n_layers)
    if stage == 0:
        count = count + ParameterCount(0, model.vocab * model.d_model)
    if stage == program.n_stages - 1:
        if not model.options.tie_embeddings:
            count = count + ParameterCount(model.d_model * model.vocab, model.d_model)
        elif stage > 0:
            count = count + ParameterCount(0, model.vocab * model.d_model + model.d_model)
        else:
            count = count + ParameterCount(0, model.d_model)
    return count
