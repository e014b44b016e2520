"""Parameter counts of the runtime's language model, per layer and per pipeline stage.

The FLOPS cost model charges every backward for adding its parameter gradients into ``.grad``
(docs/cost-model.md), which needs how many parameters a stage holds and how many of them are weights of
linear layers (those a CUDA-graph stage accumulates inside its weight-gradient GEMMs instead). The counts
follow ``schedlang.runtime.model``; tests/lowering/test_lowering_parameters.py builds that model and compares.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from schedlang.lowering.program import MlpKind, ModelSpec, ScheduleProgram
from schedlang.vocabulary import LayerKind

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


def mlp_width(model: ModelSpec) -> int:
    """The SwiGLU hidden width the runtime builds (0 without an MLP)."""
    if model.mlp.kind is MlpKind.NONE:
        return 0
    width = max(1, int(round(model.d_model * model.mlp.ratio)))
    return -(-width // MLP_WIDTH_MULTIPLE) * MLP_WIDTH_MULTIPLE


def attention_parameters(model: ModelSpec) -> ParameterCount:
    """An ``attn`` layer's token mixer and its norm, by the layer's own heads (``model.attention_geometry``): q
    and o ``heads`` wide, k and v ``kv_heads`` wide, and with ``qkv_bias`` a bias on each of q, k and v."""
    d, attention = model.d_model, model.attention_geometry
    projected_width = attention.query_width + 2 * attention.key_value_width  # q, k, v
    weights = d * projected_width + attention.query_width * d  # q, k, v; o
    biases = projected_width if model.attention.qkv_bias else 0
    return ParameterCount(weights, d + biases)  # the mixer's norm


def layer_parameters(model: ModelSpec, kind: LayerKind) -> ParameterCount:
    """One block: its norms, token mixer and MLP ([Note: separate MLP layers]: an ``mlp`` layer is only the MLP)."""
    d, heads, width = model.d_model, model.heads, model.heads * model.head_dim
    if kind is LayerKind.ATTN:
        mixer = attention_parameters(model)
        weights, other = mixer.linear_weights, mixer.other
    else:
        weights, other = (4 * d * width, d) if kind.is_mixer else (0, 0)  # q, k, v, o; the mixer's norm
    if kind is LayerKind.GLA:
        weights, other = weights + d * width, other + width  # per-channel gate with bias
    elif kind is LayerKind.SIMPLE_GLA:
        weights, other = weights + d * heads, other + heads  # one scalar gate per head, with bias
    elif kind is LayerKind.GDN:
        # forget gate and write strength per head (with biases), output gate, per-head output norm
        weights, other = weights + 2 * d * heads + d * width, other + 2 * heads + model.head_dim
    hidden = mlp_width(model) if model.has_mlp(kind) else 0
    if hidden:
        weights, other = weights + 3 * d * hidden, other + d  # gate, up, down; the MLP's norm
    return ParameterCount(weights, other)


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
        if not model.tie_embeddings:
            count = count + ParameterCount(model.d_model * model.vocab, model.d_model)
        elif stage > 0:
            count = count + ParameterCount(0, model.vocab * model.d_model + model.d_model)
        else:
            count = count + ParameterCount(0, model.d_model)
    return count
