"""flash-linear-attention's Mamba-3 checkpoints: ``Mamba3Config`` fields and parameter names.

The ``model_type`` ``"mamba3"`` part of :mod:`schedlang.runtime.hf_format` (which dispatches here):
:func:`read_mamba3_config` turns a ``config.json`` into the sizes and options of the same network in schedlang,
refusing field by field what schedlang does not build (``is_mimo``, another activation); :func:`mamba3_config`
is the inverse; :func:`mamba3_sources` maps parameter names. fla's ``Mamba3ForCausalLM`` is ``layers = [mamba3]
* L`` with ``mlp = none`` (each block is a pre-norm residual around the mixer alone), ``heads = expand *
hidden_size / head_dim`` heads of ``head_dim``, and :class:`~schedlang.vocabulary.model_options.Mamba3Options`
from the config's fields of the same names. Its tensors live under ``backbone.`` (``embeddings``,
``layers.i.norm``, ``layers.i.mixer.*`` with the mixer's names unchanged, ``norm_f``) and ``lm_head``
(``docs/models.md``).
"""

from __future__ import annotations

from typing import Mapping

from schedlang.runtime.hf_mamba_backbone import (
    SILU_NAMES, backbone_config, backbone_problems, backbone_renames, backbone_sources, read_backbone,
    read_boolean, read_head_layout,
)

from schedlang.vocabulary import LayerKind, Mamba3Options, ModelConfig

MAMBA3_MODEL_TYPE = "mamba3"
MAMBA3_ARCHITECTURE = "Mamba3ForCausalLM"


def read_mamba3_config(values: Mapping[str, object]):
    """The schedlang model of a ``mamba3`` ``config.json`` (its defaults are fla 0.6.0's ``Mamba3Config``'s),
    as :class:`schedlang.runtime.hf_format.FlaModel`.

    Raises :class:`schedlang.runtime.hf_format.UnsupportedFlaConfig` naming the first field schedlang does not
    build: ``is_mimo`` true (Mamba-3's multi-input multi-output variant), a ``hidden_act`` other than SiLU,
    a ``rope_fraction`` other than 0.5 or 1.0, sizes that do not divide.
    """
    from schedlang.runtime.hf_format import (
        UnsupportedFlaConfig, read_integer, read_number, read_positive,
    )

    if read_boolean(values, "is_mimo", False):
        raise UnsupportedFlaConfig(
            "is_mimo", "config field 'is_mimo' = True selects Mamba-3's MIMO variant, which schedlang does not build"
        )
    act = values.get("hidden_act", "silu")
    if act not in SILU_NAMES:
        raise UnsupportedFlaConfig(
            "hidden_act", f"config field 'hidden_act' = {act!r} selects another activation, which schedlang does "
            "not build"
        )
    layout = read_head_layout(values)
    fraction = read_number(values, "rope_fraction", 0.5)
    if fraction not in (0.5, 1.0):
        raise UnsupportedFlaConfig("rope_fraction", f"config field 'rope_fraction' must be 0.5 or 1.0, found {fraction!r}")
    dt_min, dt_max = read_positive(values, "dt_min", 0.001), read_positive(values, "dt_max", 0.1)
    if dt_min > dt_max:
        raise UnsupportedFlaConfig("dt_min", f"dt_min = {dt_min:g} and dt_max = {dt_max:g} need dt_min <= dt_max")
    options = Mamba3Options(
        state_size=read_integer(values, "state_size", 128),
        n_groups=layout.groups,
        use_bias=read_boolean(values, "use_bias", False),
        dt_min=dt_min,
        dt_max=dt_max,
        dt_init_floor=read_positive(values, "dt_init_floor", 1e-4),
        rope_fraction=float(fraction),
        A_floor=read_positive(values, "A_floor", 1e-4),
        is_outproj_norm=read_boolean(values, "is_outproj_norm", False),
        is_mimo=False,
        mimo_rank=read_integer(values, "mimo_rank", 4),
    )
    if options.angle_count() < 1:
        raise UnsupportedFlaConfig("rope_fraction", "state_size * rope_fraction makes no rotary angle")
    return read_backbone(values, layout, LayerKind.MAMBA3, mamba3=options)


def mamba3_config_problems(model: ModelConfig) -> list[str]:
    """Why ``model`` is not a flash-linear-attention Mamba-3 model; empty when it is."""
    return backbone_problems(model, LayerKind.MAMBA3, MAMBA3_ARCHITECTURE)


def mamba3_config(model: ModelConfig) -> dict[str, object]:
    """fla's ``Mamba3Config`` of ``model`` (which :func:`mamba3_config_problems` accepts)."""
    mamba3 = model.options.mamba3
    return backbone_config(model, MAMBA3_ARCHITECTURE, MAMBA3_MODEL_TYPE, {
        "state_size": mamba3.state_size,
        "n_groups": mamba3.n_groups,
        "use_bias": mamba3.use_bias,
        "rope_fraction": mamba3.rope_fraction,
        "A_floor": mamba3.A_floor,
        "is_outproj_norm": mamba3.is_outproj_norm,
        "is_mimo": False,
        "mimo_rank": mamba3.mimo_rank,
        "hidden_act": "silu",
        "dt_min": mamba3.dt_min,
        "dt_max": mamba3.dt_max,
        "dt_init_floor": mamba3.dt_init_floor,
    })


_RENAMES = backbone_renames(
    ("in_proj.weight", "in_proj.bias", "out_proj.weight", "out_proj.bias", "dt_bias", "B_bias", "C_bias",
     "B_norm.weight", "C_norm.weight", "D", "norm.weight")
)


def mamba3_sources(name: str) -> tuple[str, ...]:
    """The fla tensor schedlang's parameter ``name`` of a Mamba-3 model is; ``KeyError`` for one fla's model
    has no counterpart of (an MLP's)."""
    return backbone_sources(_RENAMES, name, "Mamba-3")
