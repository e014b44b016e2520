"""The ``model`` block: readers of its structured values, and its spec.

Contract: the readers follow ``schedlang.checks.readers`` (return the value or
report and return ``None``); :func:`build_model` is pure and returns the
:class:`ModelSpec` when every model key read cleanly and no rule refused one.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from schedlang import ast
from schedlang.checks.readers import choice_hint, read_call, read_integer, read_number
from schedlang.lowering.program import MlpKind, MlpSpec, ModelSpec
from schedlang.runtime.model_options import AttentionOptions, GdnOptions, GlaOptions, Mamba2Options
from schedlang.vocabulary import LayerKind

if TYPE_CHECKING:
    from schedlang.checks.context import Checker

# Limits that keep a typo such as `layers = [gla] * 100000000` from exhausting memory.
MAX_LAYERS = 4096
MAX_HEAD_DIM = 1024
MAX_SHORT_CONV_SIZE = 64

StageAssignment = tuple[tuple[tuple[int, ...], ...], list]


def read_layers(checker: Checker, value: ast.Value, path: str) -> tuple[LayerKind, ...] | None:
    """``[gla] * 4``, ``[gla, gla, gla, attn] * 2``, nested lists: at most ``MAX_LAYERS`` layer kinds."""
    if not isinstance(value, (ast.ListLiteral, ast.RepeatList)):
        checker.error(
            f"'{path}' must be a list of layer kinds such as [gla] * 4, found '{checker.text_of(value.span)}'",
            value.span,
        )
        return None
    kinds: list[LayerKind] = []
    if not _flatten_layers(checker, value, path, kinds):
        return None
    if not kinds:
        checker.error(
            f"'{path}' is empty; a model needs at least one layer", value.span, hint="e.g. `layers = [gla] * 4`"
        )
        return None
    return tuple(kinds)


def _flatten_layers(checker: Checker, value: ast.Value, path: str, out: list[LayerKind]) -> bool:
    options = [kind.value for kind in LayerKind]
    if isinstance(value, ast.Identifier):
        if value.name not in options:
            checker.error(f"unknown layer kind '{value.name}'", value.span, hint=choice_hint(value.name, options))
            return False
        out.append(LayerKind(value.name))
        return True
    if isinstance(value, ast.ListLiteral):
        ok = True
        for item in value.items:
            ok = _flatten_layers(checker, item, path, out) and ok
            if len(out) > MAX_LAYERS:
                checker.error(f"'{path}' has more than {MAX_LAYERS} layers", value.span)
                return False
        return ok
    if isinstance(value, ast.RepeatList):
        count = read_integer(checker, value.count, f"the repeat count of {path}", 1)
        inner: list[LayerKind] = []
        ok = _flatten_layers(checker, value.list, path, inner)
        if count is None or not ok:
            return False
        if len(out) + len(inner) * count > MAX_LAYERS:
            checker.error(f"'{path}' has more than {MAX_LAYERS} layers", value.span)
            return False
        out.extend(inner * count)
        return True
    checker.error(
        f"expected a layer kind, found '{checker.text_of(value.span)}'",
        value.span,
        hint=f"layer kinds: {', '.join(options)}",
    )
    return False


def read_mlp(checker: Checker, value: ast.Value, path: str) -> MlpSpec | None:
    """``swiglu(ratio = r)`` (``r > 0``, default :class:`MlpSpec`'s), ``swiglu(intermediate_size = n)``
    (the hidden width as is) or ``none``."""
    signatures = {MlpKind.SWIGLU.value: ("ratio", "intermediate_size"), MlpKind.NONE.value: ()}
    call = read_call(checker, value, path, signatures, "mlp")
    if call is None:
        return None
    if call.name == MlpKind.NONE.value:
        return MlpSpec(MlpKind.NONE, 0.0)
    if "ratio" in call.arguments and "intermediate_size" in call.arguments:
        checker.error(
            "give swiglu a ratio or an intermediate_size, not both", call.arguments["intermediate_size"].span
        )
        return None
    if "intermediate_size" in call.arguments:
        width = read_integer(checker, call.arguments["intermediate_size"].value, f"{path}.intermediate_size", 1, 1 << 24)
        return None if width is None else MlpSpec(MlpKind.SWIGLU, width=width)
    if "ratio" not in call.arguments:
        return MlpSpec(MlpKind.SWIGLU)
    ratio = read_number(checker, call.arguments["ratio"].value, f"{path}.ratio", 0.0, above=True)
    return None if ratio is None else MlpSpec(MlpKind.SWIGLU, ratio)


def read_stage_assignment(checker: Checker, value: ast.Value, path: str) -> StageAssignment | None:
    """``[[0, 1], [2, 3]]``: the layer indices of each stage, with each stage's span.

    Only the shape is read here; whether the lists cover the layers in order is
    the stage-assignment rule's question (``schedlang.checks.rules``).
    """
    if not isinstance(value, ast.ListLiteral) or not all(isinstance(item, ast.ListLiteral) for item in value.items):
        checker.error(
            f"'{path}' must be a list of layer-index lists, one per stage, e.g. [[0, 1], [2, 3]]", value.span
        )
        return None
    stages = []
    ok = True
    for stage_list in value.items:
        indices = []
        for item in stage_list.items:
            index = read_integer(checker, item, f"a layer index in {path}", 0, MAX_LAYERS)
            if index is None:
                ok = False
            else:
                indices.append(index)
        stages.append(tuple(indices))
    if not ok:
        return None
    return tuple(stages), [item.span for item in value.items]


def read_dt_limit(checker: Checker, value: ast.Value, path: str) -> tuple[float, float] | None:
    """``[low, high]``: two numbers, ``0 <= low < high`` (fla's ``dt_limit``)."""
    if not isinstance(value, ast.ListLiteral) or len(value.items) != 2:
        checker.error(
            f"'{path}' must be a list of two numbers [low, high], found '{checker.text_of(value.span)}'",
            value.span,
            hint="e.g. `dt_limit = [0.001, 0.1]`, or `none` for no clamp",
        )
        return None
    low = read_number(checker, value.items[0], f"{path}'s low end", 0.0)
    high = read_number(checker, value.items[1], f"{path}'s high end", 0.0, above=True)
    if low is None or high is None:
        return None
    if low >= high:
        checker.error(f"'{path}' must have low < high, found {low:g} >= {high:g}", value.span)
        return None
    return (low, high)


GLA_OPTION_PATHS = (
    "model.expand_k",
    "model.expand_v",
    "model.kv_heads",
    "model.gate_low_rank_dim",
    "model.gate_logit_normalizer",
    "model.clamp_min",
    "model.output_gate",
)
GDN_OPTION_PATHS = ("model.delta_gates", "model.short_conv_size", "model.value_heads")
MAMBA2_OPTION_PATHS = (
    "model.state_size",
    "model.n_groups",
    "model.conv_kernel",
    "model.use_conv_bias",
    "model.use_bias",
    "model.dt_min",
    "model.dt_max",
    "model.dt_init_floor",
    "model.dt_limit",
)
ATTENTION_OPTION_PATHS = (
    "model.attn_heads",
    "model.attn_head_dim",
    "model.attn_kv_heads",
    "model.qkv_bias",
    "model.rope_theta",
)


def _written_or_none(value: object) -> object:
    """A value read, or None for a default derived from other keys (``schema.Derived``)."""
    return value if value is None or isinstance(value, (int, float, str)) else None


def _value_heads(written: object, base: ModelSpec) -> int | None:
    """``model.value_heads`` as ``GdnOptions.value_heads``: None when it is the default (``heads``) or the
    model has no ``gdn`` layers, so such a model records no grouped values."""
    value_heads = _written_or_none(written)
    if value_heads == base.heads or LayerKind.GDN not in base.layers:
        return None
    return value_heads


def build_model(checker: Checker) -> ModelSpec | None:
    """The spec; ``expand_k`` becomes the per-head key width of ``gla`` and ``gdn`` layers (the rules of
    ``checks.model_rules`` have checked it divides evenly), and ``model.from``'s weights, when it has any,
    the initial weights."""
    paths = ("model.vocab", "model.d_model", "model.layers", "model.heads", "model.head_dim", "model.mlp")
    others = (
        "model.norm_eps",
        "model.tie_embeddings",
        "model.from",
        *GLA_OPTION_PATHS,
        *GDN_OPTION_PATHS,
        *MAMBA2_OPTION_PATHS,
        *ATTENTION_OPTION_PATHS,
    )
    if not checker.valid(*paths, *others):
        return None
    base = ModelSpec(*(checker.get(path) for path in paths))
    expand_k, kv_heads, rank, normalizer, clamp_min, output_gate = (
        _written_or_none(checker.get(path)) for path in GLA_OPTION_PATHS if path != "model.expand_v"
    )
    head_k_dim = None if expand_k is None else round(base.d_model * expand_k) // base.heads
    gla = GlaOptions(
        head_k_dim=head_k_dim,
        kv_heads=kv_heads,
        gate_rank=rank,
        gate_logit_normalizer=normalizer,
        gate_clamp_min=clamp_min,
        output_gate=output_gate,
    )
    gdn = GdnOptions(
        head_k_dim=head_k_dim if LayerKind.GDN in base.layers else None,  # a model without gdn layers records none
        gates=checker.get("model.delta_gates"),
        short_conv_size=checker.get("model.short_conv_size"),
        value_heads=_value_heads(checker.get("model.value_heads"), base),
    )
    heads, head_dim, kv_heads, qkv_bias, rope_theta = (
        _written_or_none(checker.get(path)) for path in ATTENTION_OPTION_PATHS
    )
    attention = AttentionOptions(
        heads=heads, head_dim=head_dim, kv_heads=kv_heads, qkv_bias=bool(qkv_bias), rope_theta=rope_theta
    )
    mamba2 = Mamba2Options()
    if LayerKind.MAMBA2 in base.layers:  # a model without mamba2 layers records none
        mamba2 = Mamba2Options(**{path.removeprefix("model."): checker.get(path) for path in MAMBA2_OPTION_PATHS})
    imported = checker.get("model.from")
    return dataclasses.replace(
        base,
        norm_eps=checker.get("model.norm_eps"),
        gla=gla,
        gdn=gdn,
        attention=attention,
        mamba2=mamba2,
        tie_embeddings=checker.get("model.tie_embeddings"),
        initial_weights=imported.directory if imported is not None and imported.has_weights else None,
    )
