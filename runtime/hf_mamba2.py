"""flash-linear-attention's Mamba-2 checkpoints: ``Mamba2Config`` fields and parameter names.

The ``model_type`` ``"mamba2"`` part of :mod:`schedlang.runtime.hf_format` (which dispatches here):
:func:`read_mamba2_config` turns a ``config.json`` into the sizes and options of the same network in schedlang,
refusing field by field what schedlang does not build; :func:`mamba2_config` is the inverse;
:func:`mamba2_sources` maps parameter names. fla's ``Mamba2ForCausalLM`` is ``layers = [mamba2] * L`` with
``mlp = none`` (each block is a pre-norm residual around the mixer alone), ``heads = expand * hidden_size /
head_dim`` heads of ``head_dim``, and :class:`~schedlang.vocabulary.model_options.Mamba2Options` from the config's
fields of the same names. Its tensors live under ``backbone.`` (``embeddings``, ``layers.i.norm``,
``layers.i.mixer.*`` with the mixer's names unchanged, ``norm_f``) and ``lm_head`` (``docs/models.md``).
"""

from __future__ import annotations

import math
from typing import Mapping

from schedlang.runtime.hf_mamba_backbone import (
    SILU_NAMES, backbone_config, backbone_problems, backbone_renames, backbone_sources, read_backbone,
    read_boolean, read_head_layout,
)
from schedlang.runtime.mixer_mamba2 import A_INIT_RANGE
from schedlang.vocabulary import LayerKind, Mamba2Options, ModelConfig

MAMBA2_MODEL_TYPE = "mamba2"
MAMBA2_ARCHITECTURE = "Mamba2ForCausalLM"

# (field, the value schedlang builds, what the field selects otherwise)
_FIXED_FIELDS = (
    ("hidden_act", "silu", "another activation after the convolution"),
    ("rmsnorm", True, "no gated RMSNorm (y * act(z) instead)"),
    ("norm_before_gate", False, "the norm before the gate"),
    ("D_has_hdim", False, "a skip D per channel rather than per head"),
    ("conv_init", None, "a uniform convolution initialisation"),
    ("A_init_range", list(A_INIT_RANGE), "another initial range of exp(A_log)"),
    ("attn", None, "attention layers, which fla's Mamba2ForCausalLM does not build"),
    ("is_mimo", False, "multi-input multi-output SSMs (Mamba-3's MIMO), which schedlang does not build"),
    ("mimo_rank", None, "multi-input multi-output SSMs (Mamba-3's MIMO), which schedlang does not build"),
)


def _fixed_field_problem(values: Mapping[str, object]):
    from schedlang.runtime.hf_format import UnsupportedFlaConfig

    for field, built, otherwise in _FIXED_FIELDS:
        if field not in values or values[field] == built:
            continue
        if field == "hidden_act" and values[field] in SILU_NAMES:
            continue
        if field == "A_init_range" and isinstance(values[field], (list, tuple)) and list(values[field]) == built:
            continue
        return UnsupportedFlaConfig(
            field, f"config field '{field}' = {values[field]!r} selects {otherwise}, which schedlang does not build"
        )
    return None



def _dt_limit(values: Mapping[str, object]) -> tuple[float, float | None] | None:
    """fla's ``dt_limit`` as :attr:`Mamba2Options.dt_limit`: None for ``(0, inf)``, an infinite top as None."""
    from schedlang.runtime.hf_format import UnsupportedFlaConfig

    limit = values.get("dt_limit", (0.0, math.inf))
    numbers = isinstance(limit, (list, tuple)) and len(limit) == 2 and all(
        isinstance(end, (int, float)) and not isinstance(end, bool) for end in limit
    )
    if not numbers or not math.isfinite(limit[0]) or limit[0] < 0 or not limit[0] < limit[1]:
        raise UnsupportedFlaConfig(
            "dt_limit", f"config field 'dt_limit' must be [low, high], 0 <= low < high, found {limit!r}"
        )
    low, high = float(limit[0]), float(limit[1])
    if low == 0.0 and math.isinf(high):
        return None
    return (low, None if math.isinf(high) else high)


def read_mamba2_config(values: Mapping[str, object]):
    """The schedlang model of a ``mamba2`` ``config.json`` (its defaults are fla 0.6.0's ``Mamba2Config``'s),
    as :class:`schedlang.runtime.hf_format.FlaModel`.

    Raises :class:`schedlang.runtime.hf_format.UnsupportedFlaConfig` naming the first field schedlang does not
    build.
    """
    from schedlang.runtime.hf_format import (
        UnsupportedFlaConfig, read_integer, read_number, read_positive,
    )

    problem = _fixed_field_problem(values)
    if problem is not None:
        raise problem
    layout = read_head_layout(values)
    dt_min, dt_max = read_number(values, "dt_min", 0.001), read_number(values, "dt_max", 0.1)
    if not 0 < dt_min <= dt_max:
        raise UnsupportedFlaConfig("dt_min", f"dt_min = {dt_min:g} and dt_max = {dt_max:g} need 0 < dt_min <= dt_max")
    options = Mamba2Options(
        state_size=read_integer(values, "state_size", 128),
        n_groups=layout.groups,
        conv_kernel=read_integer(values, "conv_kernel", 4),
        use_conv_bias=read_boolean(values, "use_conv_bias", True),
        use_bias=read_boolean(values, "use_bias", False),
        dt_min=dt_min,
        dt_max=dt_max,
        dt_init_floor=read_positive(values, "dt_init_floor", 1e-4),
        dt_limit=_dt_limit(values),
    )
    return read_backbone(values, layout, LayerKind.MAMBA2, mamba2=options)


def mamba2_config_problems(model: ModelConfig) -> list[str]:
    """Why ``model`` is not a flash-linear-attention Mamba-2 model; empty when it is."""
    return backbone_problems(model, LayerKind.MAMBA2, MAMBA2_ARCHITECTURE)


def mamba2_config(model: ModelConfig) -> dict[str, object]:
    """fla's ``Mamba2Config`` of ``model`` (which :func:`mamba2_config_problems` accepts)."""
    mamba2 = model.options.mamba2
    limit = (0.0, math.inf) if mamba2.dt_limit is None else mamba2.dt_limit
    return backbone_config(model, MAMBA2_ARCHITECTURE, MAMBA2_MODEL_TYPE, {
        "state_size": mamba2.state_size,
        "n_groups": mamba2.n_groups,
        "conv_kernel": mamba2.conv_kernel,
        "use_conv_bias": mamba2.use_conv_bias,
        "use_bias": mamba2.use_bias,
        "hidden_act": "silu",
        "rmsnorm": True,
        "norm_before_gate": False,
        "D_has_hdim": False,
        "A_init_range": list(A_INIT_RANGE),
        "dt_min": mamba2.dt_min,
        "dt_max": mamba2.dt_max,
        "dt_init_floor": mamba2.dt_init_floor,
        "dt_limit": [limit[0], math.inf if limit[1] is None else limit[1]],
    })


_RENAMES = backbone_renames(
    ("in_proj.weight", "in_proj.bias", "out_proj.weight", "out_proj.bias", "conv1d.weight", "conv1d.bias",
     "dt_bias", "A_log", "D", "norm.weight")
)


def mamba2_sources(name: str) -> tuple[str, ...]:
    """The fla tensor schedlang's parameter ``name`` of a Mamba-2 model is; ``KeyError`` for one fla's model
    has no counterpart of (an MLP's)."""
    return backbone_sources(_RENAMES, name, "Mamba-2")
