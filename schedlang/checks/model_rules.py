"""Rules relating the model keys of flash-linear-attention's GLA, Gated DeltaNet and Mamba-2 to the sizes and
the mesh.

Contract: as every rule of ``schedlang.checks.rules`` (:data:`MODEL_RULES` runs among them). A value that
``model.from`` gave rather than the schedule is reported at the ``from`` key.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from schedlang.checks.mesh import build_mesh
from schedlang.checks.schema import FROM_KEY
from schedlang.vocabulary import LayerKind, Span

if TYPE_CHECKING:
    from schedlang.checks.context import Checker


def _span(checker: Checker, path: str) -> Span:
    """Where ``path`` was written, or where ``from`` gave it."""
    return checker.spans.get(path) or checker.span_of(FROM_KEY)


def _number(checker: Checker, path: str) -> float | None:
    """``path``'s number when it is one (written or given by ``from``), else None."""
    value = checker.get(path)
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def key_width_fits_heads(checker: Checker) -> None:
    """``d_model * expand_k`` is a whole multiple of ``heads``."""
    expand_k, d_model, heads = _number(checker, "model.expand_k"), checker.get("model.d_model"), checker.get("model.heads")
    if expand_k is None or d_model is None or heads is None:
        return
    width = d_model * expand_k
    if not math.isclose(width, round(width)) or round(width) < heads or round(width) % heads:
        checker.error(
            f"d_model * expand_k = {width:g} must be a whole multiple of heads = {heads}",
            _span(checker, "model.expand_k"),
            hint="expand_k is the key width over d_model: heads * key head width / d_model",
        )
        checker.reject("model.expand_k")


def value_width_is_heads_times_head_dim(checker: Checker) -> None:
    """``d_model * expand_v`` is ``heads * head_dim`` (``head_dim`` is the value width per head)."""
    expand_v = _number(checker, "model.expand_v")
    d_model, heads, head_dim = (checker.get(path) for path in ("model.d_model", "model.heads", "model.head_dim"))
    if expand_v is None or d_model is None or heads is None or head_dim is None:
        return
    if not math.isclose(d_model * expand_v, heads * head_dim):
        checker.error(
            f"d_model * expand_v = {d_model * expand_v:g}, but heads * head_dim = {heads * head_dim}",
            _span(checker, "model.expand_v"),
            hint=f"expand_v = {heads * head_dim / d_model:g}, or leave it out (head_dim gives the value width)",
        )
        checker.reject("model.expand_v")


def kv_heads_divide_heads(checker: Checker) -> None:
    kv_heads, heads = _number(checker, "model.kv_heads"), checker.get("model.heads")
    if kv_heads is None or heads is None or heads % kv_heads == 0:
        return
    checker.error(
        f"kv_heads = {kv_heads} must divide heads = {heads}: each key/value head serves heads / kv_heads query heads",
        _span(checker, "model.kv_heads"),
    )
    checker.reject("model.kv_heads")


def value_heads_are_a_multiple_of_heads(checker: Checker) -> None:
    """A ``gdn`` layer's value heads are a positive multiple of its q/k heads (fla's ``num_v_heads``): each
    q/k head serves ``value_heads / heads`` value heads."""
    value_heads, heads = _number(checker, "model.value_heads"), checker.get("model.heads")
    if value_heads is None or not isinstance(heads, int) or (value_heads >= heads and value_heads % heads == 0):
        return
    checker.error(
        f"value_heads = {value_heads} must be a multiple of heads = {heads}: each query/key head of a gdn layer "
        "serves value_heads / heads value heads",
        _span(checker, "model.value_heads"),
        hint=f"value_heads = {heads * max(1, round(value_heads / heads))}, or leave it out (value_heads = heads)",
    )
    checker.reject("model.value_heads")


def _attention_size(checker: Checker, path: str, fallback: str) -> int | None:
    """An ``attn`` layer's size ``path``, or the model's ``fallback`` when the schedule leaves it out."""
    value = _number(checker, path)
    return value if value is not None else _number(checker, fallback)


def attention_kv_heads_divide_attention_heads(checker: Checker) -> None:
    kv_heads = _number(checker, "model.attn_kv_heads")
    heads = _attention_size(checker, "model.attn_heads", "model.heads")
    if kv_heads is None or heads is None or heads % kv_heads == 0:
        return
    checker.error(
        f"attn_kv_heads = {kv_heads} must divide the attn layers' {heads} heads: each key/value head serves "
        "attn_heads / attn_kv_heads query heads",
        _span(checker, "model.attn_kv_heads"),
    )
    checker.reject("model.attn_kv_heads")


def rotary_needs_an_even_head_width(checker: Checker) -> None:
    """Rotary position embeddings rotate channel pairs: the ``attn`` layers' head width must be even."""
    theta, layers = _number(checker, "model.rope_theta"), checker.get("model.layers")
    head_dim = _attention_size(checker, "model.attn_head_dim", "model.head_dim")
    has_attention = isinstance(layers, tuple) and LayerKind.ATTN in layers
    if theta is None or head_dim is None or not has_attention or head_dim % 2 == 0:
        return
    checker.error(
        f"rope_theta rotates pairs of channels, but the attn layers' head width is {head_dim}, which is odd",
        _span(checker, "model.rope_theta"),
        hint="an even attn_head_dim (or head_dim), or rope_theta = none",
    )
    checker.reject("model.rope_theta")


def _convolution_history_fits_each_sequence_rank(checker: Checker, key: str, kind: LayerKind, what: str) -> None:
    """Under sequence parallelism a rank's first convolution outputs read the previous rank's last ``size - 1``
    inputs (``size`` the kernel width ``key`` gives the ``kind`` layers), so every rank's slice of a chunk (whole
    kernel chunks) must hold as many: ``kernel_chunk >= size - 1``."""
    size, layers = checker.get(key), checker.get("model.layers")
    kernel_chunk = checker.get("sequence.kernel_chunk")
    if not isinstance(size, int) or not isinstance(kernel_chunk, int):
        return
    if not (isinstance(layers, tuple) and kind in layers):
        return
    mesh = build_mesh(checker)
    if mesh is None or mesh.sequence == 1 or kernel_chunk >= size - 1:
        return
    name = key.removeprefix("model.")
    checker.error(
        f"with mesh.sequence = {mesh.sequence} each rank's slice of a chunk must hold {name} - 1 = "
        f"{size - 1} tokens for the next rank's {what}, but kernel_chunk = {kernel_chunk}",
        _span(checker, key),
        hint=f"use kernel_chunk >= {size - 1}",
    )
    checker.reject(key)


def short_convolutions_fit_each_sequence_rank(checker: Checker) -> None:
    """gdn's short convolutions: under sequence parallelism ``kernel_chunk >= short_conv_size - 1``."""
    _convolution_history_fits_each_sequence_rank(checker, "model.short_conv_size", LayerKind.GDN, "short convolutions")


def _has_grouped_b_and_c(checker: Checker) -> bool:
    """Whether the layers hold a kind that reads B/C groups (``mamba2`` or ``mamba3``)."""
    layers = checker.get("model.layers")
    return isinstance(layers, tuple) and (LayerKind.MAMBA2 in layers or LayerKind.MAMBA3 in layers)


def _has_mamba3(checker: Checker) -> bool:
    layers = checker.get("model.layers")
    return isinstance(layers, tuple) and LayerKind.MAMBA3 in layers


def mamba3_builds_siso_only(checker: Checker) -> None:
    """``is_mimo = true`` asks for Mamba-3's multi-input multi-output variant, which is not built."""
    if checker.get("model.is_mimo") is not True or not _has_mamba3(checker):
        return
    checker.error(
        "is_mimo = true asks for Mamba-3's MIMO variant, which schedlang does not build (only SISO)",
        _span(checker, "model.is_mimo"),
        hint="is_mimo = false",
    )
    checker.reject("model.is_mimo")


def mamba3_rotary_angles_exist(checker: Checker) -> None:
    """``rope_fraction`` is 0.5 or 1.0 (fla's two), and ``state_size * rope_fraction`` makes at least one
    angle (one row pair)."""
    fraction, size = _number(checker, "model.rope_fraction"), checker.get("model.state_size")
    if fraction is None or not _has_mamba3(checker):
        return
    if fraction not in (0.5, 1.0):
        checker.error(
            f"rope_fraction = {fraction:g}, but Mamba-3 turns half or all of the state rows",
            _span(checker, "model.rope_fraction"),
            hint="rope_fraction = 0.5 or rope_fraction = 1.0",
        )
        checker.reject("model.rope_fraction")
    elif isinstance(size, int) and int(size * fraction) < 2:
        checker.error(
            f"state_size * rope_fraction = {size * fraction:g} rows make no rotary angle (each turns a row pair)",
            _span(checker, "model.rope_fraction"),
            hint="state_size * rope_fraction >= 2",
        )
        checker.reject("model.rope_fraction")


def groups_divide_mamba2_heads(checker: Checker) -> None:
    """``n_groups`` divides ``heads``: each B/C group serves ``heads / n_groups`` consecutive heads."""
    groups, heads = checker.get("model.n_groups"), checker.get("model.heads")
    if not isinstance(groups, int) or not isinstance(heads, int) or not _has_grouped_b_and_c(checker):
        return
    if heads % groups == 0:
        return
    checker.error(
        f"n_groups = {groups} must divide heads = {heads} (each B/C group serves heads / n_groups heads)",
        _span(checker, "model.n_groups"),
        hint="a divisor of heads, such as 1",
    )
    checker.reject("model.n_groups")


def time_step_range_is_ordered(checker: Checker) -> None:
    """``dt_min <= dt_max``: the initial time steps are drawn log-uniformly between them."""
    low, high = _number(checker, "model.dt_min"), _number(checker, "model.dt_max")
    if low is None or high is None or low <= high:
        return
    checker.error(
        f"dt_min = {low:g} is above dt_max = {high:g}; dt_bias starts from time steps drawn between them",
        _span(checker, "model.dt_min"),
        hint="dt_min <= dt_max",
    )
    checker.reject("model.dt_min")


def mamba2_convolutions_fit_each_sequence_rank(checker: Checker) -> None:
    """mamba2's convolution: under sequence parallelism ``kernel_chunk >= conv_kernel - 1``."""
    _convolution_history_fits_each_sequence_rank(checker, "model.conv_kernel", LayerKind.MAMBA2, "convolution")


def weights_fit_the_model(checker: Checker) -> None:
    """``model.from``'s safetensors hold a tensor of the right shape for every parameter of the model the
    schedule builds (the directory's config with the keys the schedule writes)."""
    from schedlang.checks.records import build_model

    imported = checker.get(FROM_KEY) if checker.given(FROM_KEY) else None
    if imported is None or not imported.has_weights:
        return
    model = build_model(checker)
    if model is None:
        return
    from schedlang.runtime.hf_weights import HfWeightsError, weights_problem

    try:
        problem = weights_problem(model, imported.directory)
    except HfWeightsError as error:
        problem = str(error)
    if problem is not None:
        checker.error(
            f"the model of '{FROM_KEY}' does not fit its weights: {problem}",
            checker.node(FROM_KEY).span,
            hint="leave the model keys that change the shapes to the directory's config",
        )
        checker.reject(FROM_KEY)


MODEL_RULE_CHECKS = (
    (("model.expand_k", "model.d_model", "model.heads"), key_width_fits_heads),
    (("model.expand_v", "model.d_model", "model.heads", "model.head_dim"), value_width_is_heads_times_head_dim),
    (("model.kv_heads", "model.heads"), kv_heads_divide_heads),
    (("model.value_heads", "model.heads"), value_heads_are_a_multiple_of_heads),
    (("model.attn_kv_heads", "model.attn_heads", "model.heads"), attention_kv_heads_divide_attention_heads),
    (("model.rope_theta", "model.layers", "model.attn_head_dim", "model.head_dim"), rotary_needs_an_even_head_width),
    (
        ("model.short_conv_size", "model.layers", "mesh.sequence", "sequence.kernel_chunk"),
        short_convolutions_fit_each_sequence_rank,
    ),
    (("model.n_groups", "model.heads", "model.layers"), groups_divide_mamba2_heads),
    (("model.dt_min", "model.dt_max"), time_step_range_is_ordered),
    (("model.is_mimo", "model.layers"), mamba3_builds_siso_only),
    (("model.rope_fraction", "model.state_size", "model.layers"), mamba3_rotary_angles_exist),
    (
        ("model.conv_kernel", "model.layers", "mesh.sequence", "sequence.kernel_chunk"),
        mamba2_convolutions_fit_each_sequence_rank,
    ),
    (
        (FROM_KEY, "model.vocab", "model.d_model", "model.layers", "model.heads", "model.head_dim", "model.mlp"),
        weights_fit_the_model,
    ),
)
