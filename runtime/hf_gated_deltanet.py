"""flash-linear-attention's Gated DeltaNet checkpoints: ``GatedDeltaNetConfig`` fields and parameter names.

The ``model_type`` ``"gated_deltanet"`` half of :mod:`schedlang.runtime.hf_format` (which dispatches here):
:func:`read_gdn_config` turns a ``config.json`` into the sizes and options of the same network in
schedlang, refusing field by field what schedlang does not build; :func:`gdn_config` is the inverse;
:data:`GDN_RENAMES` maps parameter names. fla's ``GatedDeltaNet`` layer is schedlang's ``gdn`` layer with
``delta_gates = mamba`` and ``short_conv_size = conv_size``; fla's ``head_dim`` is the key width per head
and ``head_dim * expand_v`` the value width, which is schedlang's ``head_dim`` (``docs/models.md``). fla's
``num_v_heads`` (grouped value attention) is ``GdnOptions.value_heads`` (None when it equals ``num_heads``):
``v_proj``, ``a_proj``, ``b_proj``, ``A_log``, ``dt_bias``, ``v_conv1d``, ``g_proj`` and ``o_proj`` are sized by
it, ``q_proj``, ``k_proj``, ``q_conv1d`` and ``k_conv1d`` by ``num_heads``, with the same names and layouts
(value head ``j`` reads q/k head ``j // (num_v_heads // num_heads)``, as fla's kernels index them).
"""

from __future__ import annotations

import math
from typing import Mapping

from schedlang.runtime.hf_attention import read_fla_attention
from schedlang.vocabulary import DeltaGates, GdnOptions, LayerKind, ModelConfig, ModelOptions

GDN_MODEL_TYPE = "gated_deltanet"
GDN_ARCHITECTURE = "GatedDeltaNetForCausalLM"

# (field, the value schedlang builds, what the field selects otherwise)
_FIXED_FIELDS = (
    ("use_gate", True, "no output gate"),
    ("use_short_conv", True, "no short convolutions (q, k and v through SiLU alone)"),
    ("allow_neg_eigval", False, "negative eigenvalues (a write strength up to 2)"),
    ("hidden_act", "swish", "another activation"),
    ("output_gate_activation", "swish", "another output-gate activation"),
    ("attnres_block_size", None, "attention residuals"),
)
_SILU_NAMES = ("swish", "silu")


def read_gdn_config(values: Mapping[str, object]):
    """The schedlang model of a ``gated_deltanet`` ``config.json`` (its defaults are fla 0.6.0's
    ``GatedDeltaNetConfig``'s), as :class:`schedlang.runtime.hf_format.FlaModel`.

    Raises :class:`schedlang.runtime.hf_format.UnsupportedFlaConfig` naming the first field schedlang
    does not build.
    """
    from schedlang.runtime.hf_format import (
        FlaModel,
        UnsupportedFlaConfig,
        fla_mlp_width,
        read_common_fields,
        read_integer,
        read_number,
    )

    for field, built, otherwise in _FIXED_FIELDS:
        if field not in values or values[field] == built:
            continue
        if field in ("hidden_act", "output_gate_activation") and values[field] in _SILU_NAMES:
            continue
        raise UnsupportedFlaConfig(
            field, f"config field '{field}' = {values[field]!r} selects {otherwise}, which schedlang does not build"
        )
    d_model = read_integer(values, "hidden_size", 2048)
    heads = read_integer(values, "num_heads", 6)
    value_heads = None if values.get("num_v_heads") is None else read_integer(values, "num_v_heads")
    if value_heads is not None and (value_heads < heads or value_heads % heads):
        raise UnsupportedFlaConfig(
            "num_v_heads",
            f"config field 'num_v_heads' = {value_heads} is not a multiple of num_heads = {heads} (grouped "
            "value attention gives each q/k head num_v_heads / num_heads value heads)",
        )
    head_k_dim = read_integer(values, "head_dim", 256)
    value_width = head_k_dim * read_number(values, "expand_v", 2.0)
    if not math.isclose(value_width, round(value_width)) or round(value_width) < 1:
        raise UnsupportedFlaConfig(
            "expand_v", f"head_dim * expand_v = {value_width:g} is not a whole value width per head"
        )
    conv_size = read_integer(values, "conv_size", 4)
    hidden_ratio, intermediate_size, norm_eps, tie = read_common_fields(values)
    layers = (LayerKind.GDN,) * read_integer(values, "num_hidden_layers", 21)
    layers, attention = read_fla_attention(values, layers, d_model)
    return FlaModel(
        vocab=read_integer(values, "vocab_size", 32000),
        d_model=d_model,
        layers=layers,
        heads=heads,
        head_dim=round(value_width),
        norm_eps=norm_eps,
        options=ModelOptions(
            gdn=GdnOptions(
                head_k_dim=head_k_dim,
                gates=DeltaGates.MAMBA,
                short_conv_size=conv_size,
                value_heads=None if value_heads == heads else value_heads,
            ),
            attention=attention,
            mlp_width=fla_mlp_width(d_model, hidden_ratio, intermediate_size),
            tie_embeddings=tie,
        ),
    )


def gdn_config_problems(model: ModelConfig) -> list[str]:
    """Why ``model`` is not a flash-linear-attention Gated DeltaNet model; empty when it is."""
    problems = []
    gdn = model.options.gdn
    if any(kind not in (LayerKind.GDN, LayerKind.ATTN) for kind in model.layers):
        problems.append("every layer must be gdn or attn")
    if model.mlp_ratio <= 0 and model.options.mlp_width is None:
        problems.append("the blocks need an MLP (mlp = swiglu(...))")
    if gdn.gates is not DeltaGates.MAMBA:
        problems.append("delta_gates must be mamba")
    if gdn.short_conv_size is None:
        problems.append("short_conv_size must be set (fla's conv_size)")
    return problems


def gdn_config(model: ModelConfig) -> dict[str, object]:
    """The fields of fla's ``GatedDeltaNetConfig`` of ``model`` (which :func:`gdn_config_problems` accepts)
    besides those every fla config shares (:func:`schedlang.runtime.hf_format.fla_config` adds them)."""
    from schedlang.runtime.model import swiglu_width

    gdn = model.options.gdn
    head_k_dim = gdn.head_k_dim or model.head_dim
    return {
        "architectures": [GDN_ARCHITECTURE],
        "model_type": GDN_MODEL_TYPE,
        "vocab_size": model.vocab,
        "hidden_size": model.d_model,
        "num_hidden_layers": len(model.layers),
        "num_heads": model.heads,
        "num_v_heads": gdn.value_heads,
        "head_dim": head_k_dim,
        "expand_v": model.head_dim / head_k_dim,
        "hidden_ratio": 4,
        "intermediate_size": model.options.mlp_width or swiglu_width(model.d_model, model.mlp_ratio),
        "hidden_act": "swish",
        "attn_mode": "chunk",
        "use_gate": True,
        "output_gate_activation": "swish",
        "use_short_conv": True,
        "conv_size": gdn.short_conv_size,
        "allow_neg_eigval": False,
    }


_LAYER = r"layers\.(\d+)\."
GDN_RENAMES: tuple[tuple[str, str], ...] = (
    (_LAYER + r"mixer\.([qkvo])_proj\.weight", r"model.layers.\1.attn.\2_proj.weight"),
    (_LAYER + r"mixer\.gate_proj\.weight", r"model.layers.\1.attn.a_proj.weight"),
    (_LAYER + r"mixer\.beta_proj\.weight", r"model.layers.\1.attn.b_proj.weight"),
    (_LAYER + r"mixer\.gate_log_rate", r"model.layers.\1.attn.A_log"),
    (_LAYER + r"mixer\.gate_time_bias", r"model.layers.\1.attn.dt_bias"),
    (_LAYER + r"mixer\.([qkv])_conv\.weight", r"model.layers.\1.attn.\2_conv1d.weight"),
    (_LAYER + r"mixer\.output_gate_proj\.weight", r"model.layers.\1.attn.g_proj.weight"),
    (_LAYER + r"mixer\.output_norm\.weight", r"model.layers.\1.attn.o_norm.weight"),
)
"""schedlang's ``gdn`` mixer parameters as fla's (patterns over schedlang's names, replacements)."""
