"""flash-linear-attention's softmax-attention layers in GLA and Gated DeltaNet checkpoints (hybrids).

fla 0.6.0's ``GLAConfig`` and ``GatedDeltaNetConfig`` have an ``attn`` field: None, or a spec (or a list of
specs) ``{layers, num_heads, num_kv_heads, qkv_bias, window_size, rope_theta}`` that puts fla's
``Attention`` layer at the listed layer indices in place of the model's own mixer, in the same block (the
same ``attn_norm``, ``mlp_norm`` and MLP). That layer is schedlang's ``attn`` layer with
:class:`~schedlang.vocabulary.model_options.AttentionOptions` ``heads = num_heads``,
``head_dim = hidden_size // num_heads``, ``kv_heads = num_kv_heads``, ``qkv_bias`` and ``rope_theta`` (fla
always applies rotary position embeddings, base 10000 by default). :func:`read_fla_attention` reads the field
(refusing what schedlang does not build: sliding windows, query/key norms, specs that differ between
layers), :func:`fla_attention_config` writes it back, :data:`ATTENTION_RENAMES` maps parameter names.
"""

from __future__ import annotations

import math
from typing import Mapping

from schedlang.vocabulary import AttentionOptions, LayerKind, ModelConfig

ATTENTION_FIELD = "attn"
FLA_ROPE_THETA = 10000.0
"""fla's default rotary base for an ``attn`` spec that does not give ``rope_theta``."""

_SPEC_FIELDS = ("layers", "num_heads", "num_kv_heads", "qkv_bias", "window_size", "rope_theta")
# (spec field, the value schedlang builds, what the field selects otherwise)
_FIXED_SPEC_FIELDS = (
    ("window_size", None, "sliding-window attention"),
    ("qk_norm", False, "RMS-normalised queries and keys"),
)


def _problem(message: str):
    from schedlang.runtime.hf_format import UnsupportedFlaConfig

    return UnsupportedFlaConfig(ATTENTION_FIELD, f"config field 'attn': {message}")


def _positive_integer(spec: Mapping[str, object], field: str) -> int:
    value = spec.get(field)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise _problem(f"'{field}' must be a positive integer, found {value!r}")
    return value


def _read_spec(spec: object, n_layers: int, d_model: int) -> tuple[tuple[int, ...], AttentionOptions]:
    if not isinstance(spec, dict):
        raise _problem(f"each attention spec must be an object, found {spec!r}")
    for field, built, otherwise in _FIXED_SPEC_FIELDS:
        if spec.get(field, built) != built:
            raise _problem(f"'{field}' = {spec[field]!r} selects {otherwise}, which schedlang does not build")
    unknown = sorted(set(spec) - set(_SPEC_FIELDS) - {field for field, _, _ in _FIXED_SPEC_FIELDS})
    if unknown:
        raise _problem(f"unknown attention spec field(s) {', '.join(map(repr, unknown))}")
    layers = spec.get("layers")
    if not isinstance(layers, list) or not all(
        isinstance(index, int) and not isinstance(index, bool) and 0 <= index < n_layers for index in layers
    ):
        raise _problem(f"'layers' must list layer indices in 0 .. {n_layers - 1}, found {layers!r}")
    heads = _positive_integer(spec, "num_heads")
    kv_heads = heads if spec.get("num_kv_heads") is None else _positive_integer(spec, "num_kv_heads")
    if heads % kv_heads:
        raise _problem(f"num_kv_heads = {kv_heads} does not divide num_heads = {heads}")
    if d_model % heads or (d_model // heads) % 2:
        raise _problem(
            f"hidden_size = {d_model} over num_heads = {heads} must be a whole, even head width (fla's Attention "
            "rotates channel pairs of hidden_size // num_heads)"
        )
    qkv_bias = spec.get("qkv_bias", False)
    if not isinstance(qkv_bias, bool):
        raise _problem(f"'qkv_bias' must be true or false, found {qkv_bias!r}")
    theta = spec.get("rope_theta", FLA_ROPE_THETA)
    if isinstance(theta, bool) or not isinstance(theta, (int, float)) or not math.isfinite(theta) or theta <= 0:
        raise _problem(f"'rope_theta' must be a positive number, found {theta!r}")
    options = AttentionOptions(
        heads=heads, head_dim=d_model // heads, kv_heads=kv_heads, qkv_bias=qkv_bias, rope_theta=float(theta)
    )
    return tuple(layers), options


def read_fla_attention(
    values: Mapping[str, object], layers: tuple[LayerKind, ...], d_model: int
) -> tuple[tuple[LayerKind, ...], AttentionOptions]:
    """``layers`` (the model's own kind at every index) with ``attn`` at the indices the config's ``attn``
    field lists, and the options of those layers (the defaults when the field is None or absent).

    Raises :class:`schedlang.runtime.hf_format.UnsupportedFlaConfig` for what schedlang does not build; a
    list of specs must agree on everything but their layers (schedlang's ``attn`` layers share one set of
    options).
    """
    field = values.get(ATTENTION_FIELD)
    if field is None:
        return layers, AttentionOptions()
    specs = field if isinstance(field, list) else [field]
    if not specs:
        return layers, AttentionOptions()
    read = [_read_spec(spec, len(layers), d_model) for spec in specs]
    options = read[0][1]
    if any(other != options for _, other in read):
        raise _problem(
            "the attention specs differ in more than their layers, and schedlang's attn layers share one set"
        )
    indices = [index for spec_layers, _ in read for index in spec_layers]
    if len(set(indices)) != len(indices):
        raise _problem(f"a layer is listed twice: {sorted(indices)}")
    kinds = list(layers)
    for index in indices:
        kinds[index] = LayerKind.ATTN
    return tuple(kinds), options


def fla_attention_problems(model: ModelConfig) -> list[str]:
    """Why the ``attn`` layers of ``model`` are not fla's ``Attention``; empty when they are (or there are none)."""
    if LayerKind.ATTN not in model.layers:
        return []
    options = model.options.attention
    heads, head_dim = options.heads or model.heads, options.head_dim or model.head_dim
    problems = []
    if heads * head_dim != model.d_model:
        problems.append(
            f"attn layers need attn_heads * attn_head_dim = d_model (fla's head width is hidden_size // num_heads), "
            f"found {heads} * {head_dim} and d_model = {model.d_model}"
        )
    if options.rope_theta is None:
        problems.append("attn layers need rope_theta (fla's Attention always applies rotary position embeddings)")
    return problems


def fla_attention_config(model: ModelConfig) -> dict[str, object] | None:
    """The ``attn`` field of ``model``'s fla config (which :func:`fla_attention_problems` accepts): None
    without ``attn`` layers."""
    indices = [index for index, kind in enumerate(model.layers) if kind is LayerKind.ATTN]
    if not indices:
        return None
    options = model.options.attention
    heads = options.heads or model.heads
    return {
        "layers": indices,
        "num_heads": heads,
        "num_kv_heads": options.kv_heads or heads,
        "qkv_bias": options.qkv_bias,
        "window_size": None,
        "rope_theta": options.rope_theta,
    }


_LAYER = r"layers\.(\d+)\."
ATTENTION_RENAMES: tuple[tuple[str, str], ...] = (
    (_LAYER + r"mixer\.([qkvo])_proj\.weight", r"model.layers.\1.attn.\2_proj.weight"),
    (_LAYER + r"mixer\.([qkv])_proj\.bias", r"model.layers.\1.attn.\2_proj.bias"),
)
"""schedlang's ``attn`` mixer parameters as fla's (patterns over schedlang's names, replacements)."""
