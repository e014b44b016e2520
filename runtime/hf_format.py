"""flash-linear-attention's GLA, Gated DeltaNet, Mamba-2 and Mamba-3 checkpoints: ``config.json`` fields and parameter
names.

A Hugging Face directory written by ``GLAForCausalLM.save_pretrained``,
``GatedDeltaNetForCausalLM.save_pretrained``, ``Mamba2ForCausalLM.save_pretrained`` or
``Mamba3ForCausalLM.save_pretrained`` (fla 0.6.0) holds a ``config.json`` of ``model_type`` ``"gla"``,
``"gated_deltanet"``, ``"mamba2"`` or ``"mamba3"`` and ``*.safetensors``
weights. :func:`read_fla_config` turns the config into the sizes and
:class:`~schedlang.vocabulary.model_options.ModelOptions` of the same network in schedlang (refusing, field by
field, what schedlang does not build); :func:`fla_config` is the inverse; :func:`fla_sources` names the fla
tensors each schedlang parameter is made of. This module holds GLA and what they share;
:mod:`schedlang.runtime.hf_gated_deltanet` the Gated DeltaNet part, :mod:`schedlang.runtime.hf_mamba3` the Mamba-3 part and :mod:`schedlang.runtime.hf_mamba2` the
Mamba-2 part. The math behind the correspondence is in ``docs/models.md``.
"""

from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass
from typing import Mapping

import torch

from schedlang.runtime.hf_attention import (
    ATTENTION_RENAMES,
    fla_attention_config,
    fla_attention_problems,
    read_fla_attention,
)
from schedlang.runtime.hf_gated_deltanet import (
    GDN_MODEL_TYPE,
    GDN_RENAMES,
    gdn_config,
    gdn_config_problems,
    read_gdn_config,
)
from schedlang.runtime.hf_mamba3 import (
    MAMBA3_MODEL_TYPE,
    mamba3_config,
    mamba3_config_problems,
    mamba3_sources,
    read_mamba3_config,
)
from schedlang.runtime.hf_mamba2 import (
    MAMBA2_MODEL_TYPE,
    mamba2_config,
    mamba2_config_problems,
    mamba2_sources,
    read_mamba2_config,
)
from schedlang.vocabulary import GATE_LOGIT_NORMALIZER, GlaOptions, LayerKind, ModelConfig, ModelOptions, OutputGate

FLA_MODEL_TYPE = "gla"
FLA_ARCHITECTURE = "GLAForCausalLM"
FLA_GATE_LOW_RANK_DIM = 16
"""fla's GLA layer builds its forget-gate projection with rank 16; its config has no field for it."""
FLA_MLP_WIDTH_MULTIPLE = 256


class UnsupportedFlaConfig(ValueError):
    """A config.json schedlang does not build; ``field`` names the config field at fault."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


@dataclass(frozen=True)
class FlaModel:
    """What a GLA or Gated DeltaNet ``config.json`` describes, in schedlang's terms."""

    vocab: int
    d_model: int
    layers: tuple[LayerKind, ...]
    heads: int
    head_dim: int
    norm_eps: float
    options: ModelOptions
    mlp_ratio: float = 4.0  # 0: blocks without an MLP (fla's Mamba2); with an MLP, options.mlp_width sizes it

    def model_config(self, initial_weights: str | None = None) -> ModelConfig:
        """The runtime's record of this model (its weights from ``initial_weights`` when given)."""
        options = dataclasses.replace(self.options, initial_weights=initial_weights)
        return ModelConfig(
            vocab=self.vocab,
            d_model=self.d_model,
            layers=self.layers,
            heads=self.heads,
            head_dim=self.head_dim,
            mlp_ratio=self.mlp_ratio,
            norm_eps=self.norm_eps,
            options=options,
        )


def fla_mlp_width(hidden_size: int, hidden_ratio: float | None, intermediate_size: int | None) -> int:
    """fla's GatedMLP width: ``intermediate_size``, else 2/3 of ``hidden_ratio * hidden_size`` (ratio 4 when
    None) rounded up to a multiple of 256."""
    if intermediate_size is not None:
        return int(intermediate_size)
    ratio = 4 if hidden_ratio is None else hidden_ratio
    width = int(hidden_size * ratio * 2 / 3)
    return FLA_MLP_WIDTH_MULTIPLE * -(-width // FLA_MLP_WIDTH_MULTIPLE)


# (field, the value schedlang builds, what the field selects otherwise)
_FIXED_FIELDS = (
    ("feature_map", None, "a feature map on queries and keys"),
    ("use_short_conv", False, "short convolutions"),
    ("use_output_gate", True, "no output gate"),
    ("hidden_act", "swish", "another activation"),
    ("elementwise_affine", True, "norms without weights"),
    ("use_gv", False, "a value gate"),
    ("attnres_block_size", None, "attention residuals"),
)


def read_integer(values: Mapping[str, object], field: str, default: object = None) -> int:
    value = values.get(field, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise UnsupportedFlaConfig(field, f"config field '{field}' must be a positive integer, found {value!r}")
    return value


def read_number(values: Mapping[str, object], field: str, default: float) -> float:
    value = values.get(field, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise UnsupportedFlaConfig(field, f"config field '{field}' must be a number, found {value!r}")
    return float(value)


def read_positive(values: Mapping[str, object], field: str, default: float) -> float:
    value = read_number(values, field, default)
    if value <= 0:
        raise UnsupportedFlaConfig(field, f"config field '{field}' must be positive, found {value!r}")
    return value


def _per_head(total: float, heads: int, field: str) -> int:
    width = round(total)
    if not math.isclose(total, width) or width < heads or width % heads:
        raise UnsupportedFlaConfig(
            field, f"config field '{field}' gives a width of {total:g}, not a whole multiple of num_heads = {heads}"
        )
    return width // heads


def read_common_fields(values: Mapping[str, object]) -> tuple[float | None, int | None, float, bool]:
    """``hidden_ratio``, ``intermediate_size``, ``norm_eps`` and ``tie_word_embeddings``, checked (the
    fields every fla model shares)."""
    hidden_ratio = values.get("hidden_ratio", 4)
    if hidden_ratio is not None:
        hidden_ratio = read_number(values, "hidden_ratio", 4)
    intermediate_size = values.get("intermediate_size")
    if intermediate_size is not None:
        intermediate_size = read_integer(values, "intermediate_size")
    norm_eps = read_positive(values, "norm_eps", 1e-6)
    tie = values.get("tie_word_embeddings", False)
    if not isinstance(tie, bool):
        raise UnsupportedFlaConfig("tie_word_embeddings", f"tie_word_embeddings must be true or false, found {tie!r}")
    return hidden_ratio, intermediate_size, norm_eps, tie


def read_fla_config(values: Mapping[str, object]) -> FlaModel:
    """The schedlang model of a GLA or Gated DeltaNet ``config.json`` (its defaults are fla 0.6.0's
    ``GLAConfig``'s or ``GatedDeltaNetConfig``'s).

    Raises :class:`UnsupportedFlaConfig` naming the first field schedlang does not build.
    """
    model_type = values.get("model_type")
    if model_type == GDN_MODEL_TYPE:
        return read_gdn_config(values)
    if model_type == MAMBA2_MODEL_TYPE:
        return read_mamba2_config(values)
    if model_type == MAMBA3_MODEL_TYPE:
        return read_mamba3_config(values)
    if model_type != FLA_MODEL_TYPE:
        raise UnsupportedFlaConfig(
            "model_type",
            f"model_type is {model_type!r}; schedlang reads flash-linear-attention's "
            f"'{FLA_MODEL_TYPE}', '{GDN_MODEL_TYPE}', '{MAMBA2_MODEL_TYPE}' and '{MAMBA3_MODEL_TYPE}' models",
        )
    for field, built, otherwise in _FIXED_FIELDS:
        if field in values and values[field] != built:
            raise UnsupportedFlaConfig(
                field, f"config field '{field}' = {values[field]!r} selects {otherwise}, which schedlang does not build"
            )
    d_model = read_integer(values, "hidden_size", 2048)
    heads = read_integer(values, "num_heads", 4)
    kv_heads = values.get("num_kv_heads")
    kv_heads = heads if kv_heads is None else read_integer(values, "num_kv_heads")
    if heads % kv_heads:
        raise UnsupportedFlaConfig("num_kv_heads", f"num_kv_heads = {kv_heads} does not divide num_heads = {heads}")
    head_k_dim = _per_head(d_model * read_number(values, "expand_k", 0.5), heads, "expand_k")
    head_dim = _per_head(d_model * read_number(values, "expand_v", 1.0), heads, "expand_v")
    clamp_min = values.get("clamp_min")
    if clamp_min is not None:
        clamp_min = read_number(values, "clamp_min", 0.0)
    hidden_ratio, intermediate_size, norm_eps, tie = read_common_fields(values)
    layers = (LayerKind.GLA,) * read_integer(values, "num_hidden_layers", 24)
    layers, attention = read_fla_attention(values, layers, d_model)
    gla = GlaOptions(
        head_k_dim=head_k_dim,
        kv_heads=kv_heads,
        gate_rank=FLA_GATE_LOW_RANK_DIM,
        gate_logit_normalizer=GATE_LOGIT_NORMALIZER,
        gate_clamp_min=clamp_min,
        output_gate=OutputGate.SWISH,
    )
    return FlaModel(
        vocab=read_integer(values, "vocab_size", 32000),
        d_model=d_model,
        layers=layers,
        heads=heads,
        head_dim=head_dim,
        norm_eps=norm_eps,
        options=ModelOptions(
            gla=gla,
            attention=attention,
            mlp_width=fla_mlp_width(d_model, hidden_ratio, intermediate_size),
            tie_embeddings=tie,
        ),
    )


def is_mamba2(model: ModelConfig) -> bool:
    """Whether ``model`` is written as fla's Mamba-2 (it has a ``mamba2`` layer)."""
    return LayerKind.MAMBA2 in model.layers


def is_mamba3(model: ModelConfig) -> bool:
    """Whether ``model`` is written as fla's Mamba-3 (it has a ``mamba3`` layer)."""
    return LayerKind.MAMBA3 in model.layers


def is_gated_deltanet(model: ModelConfig) -> bool:
    """Whether ``model`` is written as fla's Gated DeltaNet (it has a ``gdn`` layer), else as its GLA."""
    return LayerKind.GDN in model.layers


def fla_config_problems(model: ModelConfig) -> list[str]:
    """Why ``model`` is not a flash-linear-attention GLA or Gated DeltaNet model (its ``attn`` layers fla's
    ``Attention``); empty when it is."""
    if is_gated_deltanet(model):
        return gdn_config_problems(model) + fla_attention_problems(model)
    if is_mamba2(model):
        return mamba2_config_problems(model)
    if is_mamba3(model):
        return mamba3_config_problems(model)
    problems = []
    gla = model.options.gla
    if any(kind not in (LayerKind.GLA, LayerKind.ATTN) for kind in model.layers):
        problems.append("every layer must be gla or attn")
    if model.mlp_ratio <= 0 and model.options.mlp_width is None:
        problems.append("the blocks need an MLP (mlp = swiglu(...))")
    if gla.gate_rank != FLA_GATE_LOW_RANK_DIM:
        problems.append(f"gate_low_rank_dim must be {FLA_GATE_LOW_RANK_DIM}")
    if gla.gate_logit_normalizer != GATE_LOGIT_NORMALIZER:
        problems.append(f"gate_logit_normalizer must be {GATE_LOGIT_NORMALIZER:g}")
    if gla.output_gate is not OutputGate.SWISH:
        problems.append("output_gate must be swish")
    return problems + fla_attention_problems(model)


def fla_config(model: ModelConfig, torch_dtype: torch.dtype = torch.float32) -> dict[str, object]:
    """The ``config.json`` of ``model`` as fla's ``GLAConfig`` or ``GatedDeltaNetConfig``; ``ValueError``
    listing :func:`fla_config_problems` when it is neither."""
    from schedlang.runtime.model import swiglu_width

    problems = fla_config_problems(model)
    if problems:
        kind = "Gated DeltaNet" if is_gated_deltanet(model) else "Mamba-2" if is_mamba2(model) else "GLA"
        kind = "Mamba-3" if is_mamba3(model) and not is_gated_deltanet(model) and not is_mamba2(model) else kind
        raise ValueError(f"not a flash-linear-attention {kind} model: " + "; ".join(problems))
    if is_mamba2(model):
        return {**mamba2_config(model), "dtype": str(torch_dtype).removeprefix("torch.")}
    if is_mamba3(model):
        return {**mamba3_config(model), "dtype": str(torch_dtype).removeprefix("torch.")}
    shared = {
        "norm_eps": model.norm_eps,
        "tie_word_embeddings": model.options.tie_embeddings,
        "fuse_norm": True,
        "fuse_swiglu": True,
        "fuse_cross_entropy": True,
        "dtype": str(torch_dtype).removeprefix("torch."),
        "attn": fla_attention_config(model),
    }
    if is_gated_deltanet(model):
        return {**gdn_config(model), **shared}
    gla = model.options.gla
    head_k_dim = gla.head_k_dim or model.head_dim
    mlp_width = model.options.mlp_width or swiglu_width(model.d_model, model.mlp_ratio)
    return {
        "architectures": [FLA_ARCHITECTURE],
        "model_type": FLA_MODEL_TYPE,
        "vocab_size": model.vocab,
        "hidden_size": model.d_model,
        "num_hidden_layers": len(model.layers),
        "num_heads": model.heads,
        "num_kv_heads": gla.kv_heads,
        "expand_k": head_k_dim * model.heads / model.d_model,
        "expand_v": model.head_dim * model.heads / model.d_model,
        "hidden_ratio": 4,
        "intermediate_size": mlp_width,
        "hidden_act": "swish",
        "attn_mode": "chunk",
        "use_output_gate": True,
        "use_short_conv": False,
        "feature_map": None,
        "clamp_min": gla.gate_clamp_min,
        "elementwise_affine": True,
        **shared,
    }


def fla_peer_config(model: ModelConfig, torch_dtype: torch.dtype = torch.float32) -> dict[str, object]:
    """The ``GLAConfig`` keys of the fla GLA nearest to ``model``, a GLA model that fla may not build exactly,
    for a speed peer (benchmarks/one_device.py's ``fla``): :func:`fla_config` of ``model`` with the GLA
    options fla's config cannot express set to fla's, and ``use_output_gate`` as ``model`` has it.

    Equal: hidden size, layers, heads, query/key and value widths, SwiGLU width, vocabulary, tied or untied
    embeddings, RMSNorm epsilon, no short convolution, the output gate (none or swish). Different where
    ``model`` differs from fla's GLA layer: the forget gate is fla's low-rank projection
    (:data:`FLA_GATE_LOW_RANK_DIM`) whatever ``model.options.gla.gate_rank`` is; the mixer's output passes
    fla's per-head RMSNorm, which schedlang's GLA without an output gate does not have; the loss is fla's
    fused cross entropy. ``ValueError`` as :func:`fla_config` for what fla cannot approach at all (layers
    other than ``gla`` and ``attn``, no MLP).
    """
    gla = model.options.gla
    nearest = dataclasses.replace(
        gla, gate_rank=FLA_GATE_LOW_RANK_DIM, gate_logit_normalizer=GATE_LOGIT_NORMALIZER, output_gate=OutputGate.SWISH
    )
    config = fla_config(dataclasses.replace(model, options=dataclasses.replace(model.options, gla=nearest)), torch_dtype)
    return {**config, "use_output_gate": gla.output_gate is OutputGate.SWISH, "use_cache": False}


_LAYER = r"layers\.(\d+)\."


def _compiled(renames) -> tuple[tuple[re.Pattern, str], ...]:
    return tuple((re.compile(pattern), replacement) for pattern, replacement in renames)


_SHARED_RENAMES = _compiled(
    (
        (r"embedding\.weight", "model.embeddings.weight"),
        (r"final_norm\.weight", "model.norm.weight"),
        (r"lm_head\.weight", "lm_head.weight"),
        (_LAYER + r"mixer_norm\.weight", r"model.layers.\1.attn_norm.weight"),
        (_LAYER + r"mlp_norm\.weight", r"model.layers.\1.mlp_norm.weight"),
        (_LAYER + r"mlp\.down_proj\.weight", r"model.layers.\1.mlp.down_proj.weight"),
    )
)
_MIXER_RENAMES: dict[LayerKind, tuple[tuple[re.Pattern, str], ...]] = {
    LayerKind.GLA: _compiled(
        (
            (_LAYER + r"mixer\.([qkvo])_proj\.weight", r"model.layers.\1.attn.\2_proj.weight"),
            (_LAYER + r"mixer\.gate_proj\.(0\.weight|1\.weight|1\.bias)", r"model.layers.\1.attn.gk_proj.\2"),
            (_LAYER + r"mixer\.output_gate_proj\.weight", r"model.layers.\1.attn.g_proj.weight"),
            (_LAYER + r"mixer\.output_norm\.weight", r"model.layers.\1.attn.g_norm_swish_gate.weight"),
        )
    ),
    LayerKind.GDN: _compiled(GDN_RENAMES),
    LayerKind.ATTN: _compiled(ATTENTION_RENAMES),
}
_FUSED_GATE_UP = re.compile(_LAYER + r"mlp\.gate_up_proj\.weight")

FLA_UNFUSED_NAMES = {".attn.g_norm_swish_gate.weight": ".attn.g_norm.weight"}
"""The output norm's name in a model saved with ``fuse_norm = false`` (the same weight, the same math)."""


def fla_sources(name: str, layers: tuple[LayerKind, ...]) -> tuple[str, ...]:
    """The fla tensors schedlang's parameter ``name`` of a model of ``layers`` is, concatenated along
    dimension 0 when there are two (the MLP's fused ``gate_up_proj`` is fla's ``gate_proj`` then ``up_proj``).

    ``KeyError`` for a parameter fla's model has no counterpart of (a full-rank GLA gate projection, a
    layer kind fla's model does not build).
    """
    if LayerKind.MAMBA2 in layers:
        return mamba2_sources(name)
    if LayerKind.MAMBA3 in layers:
        return mamba3_sources(name)
    fused = _FUSED_GATE_UP.fullmatch(name)
    if fused is not None:
        layer = fused.group(1)
        return (f"model.layers.{layer}.mlp.gate_proj.weight", f"model.layers.{layer}.mlp.up_proj.weight")
    layer = re.match(_LAYER + "mixer\\.", name)
    kind = layers[int(layer.group(1))] if layer is not None and int(layer.group(1)) < len(layers) else None
    for pattern, replacement in _SHARED_RENAMES + _MIXER_RENAMES.get(kind, ()):
        if pattern.fullmatch(name):
            return (pattern.sub(replacement, name),)
    model = "Gated DeltaNet" if LayerKind.GDN in layers else "GLA"
    raise KeyError(f"flash-linear-attention's {model} has no tensor for schedlang's {name}")


def to_fla_tensors(tensors: Mapping[str, torch.Tensor], layers: tuple[LayerKind, ...]) -> dict[str, torch.Tensor]:
    """schedlang's parameters of a model of ``layers`` by name, as fla's (each contiguous and owning its
    memory, for safetensors)."""
    out: dict[str, torch.Tensor] = {}
    for name, tensor in tensors.items():
        sources = fla_sources(name, layers)
        parts = tensor.chunk(len(sources), dim=0) if len(sources) > 1 else (tensor,)
        for source, part in zip(sources, parts):
            out[source] = part.detach().clone().contiguous()
    return out
