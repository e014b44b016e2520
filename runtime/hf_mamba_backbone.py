"""What flash-linear-attention's Mamba checkpoints (``Mamba2ForCausalLM``, ``Mamba3ForCausalLM``) share.

Contract. Both keep their tensors under ``backbone.`` (``embeddings``, ``layers.i.norm``, ``layers.i.mixer.*``
with the mixer's parameter names unchanged, ``norm_f``) and ``lm_head``: :func:`backbone_renames` builds the
name map from the mixer's own tensor names, :func:`backbone_sources` reads it (``KeyError`` for a schedlang
parameter fla's model has no counterpart of). :func:`backbone_problems` says why a model is not such a backbone
(another layer kind, an MLP, a width fla's integer ``expand`` cannot give). :func:`read_boolean` reads a
boolean config field or raises ``UnsupportedFlaConfig`` naming it; :func:`read_head_layout`
reads the width, heads and groups both configs describe alike; :func:`read_backbone` and :func:`backbone_config`
read and write the fields around the mixer's own. ``SILU_NAMES`` are the activation names both configs accept.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Mapping

from schedlang.vocabulary import LayerKind, ModelConfig, ModelOptions

SILU_NAMES = ("silu", "swish")
_LAYER = r"layers\.(\d+)\."


def read_boolean(values: Mapping[str, object], field: str, default: bool) -> bool:
    from schedlang.runtime.hf_format import UnsupportedFlaConfig

    value = values.get(field, default)
    if not isinstance(value, bool):
        raise UnsupportedFlaConfig(field, f"config field '{field}' must be true or false, found {value!r}")
    return value


@dataclass(frozen=True)
class HeadLayout:
    """A Mamba mixer's width and heads: ``heads * head_dim = expand * d_model``, B and C in ``groups``."""

    d_model: int
    head_dim: int
    heads: int
    groups: int


def read_head_layout(values: Mapping[str, object]) -> HeadLayout:
    """``hidden_size``, ``head_dim``, ``expand``, ``num_heads`` and ``n_groups`` (fla 0.6.0's defaults) as a
    :class:`HeadLayout`; raises ``UnsupportedFlaConfig`` naming the field whose value does not divide or agree."""
    from schedlang.runtime.hf_format import UnsupportedFlaConfig, read_integer, read_number

    d_model = read_integer(values, "hidden_size", 2048)
    head_dim = read_integer(values, "head_dim", 64)
    inner = read_number(values, "expand", 2) * d_model
    if not math.isclose(inner, round(inner)) or round(inner) % head_dim:
        raise UnsupportedFlaConfig(
            "expand", f"expand * hidden_size = {inner:g} is not a whole multiple of head_dim = {head_dim}"
        )
    heads = round(inner) // head_dim
    if values.get("num_heads") not in (None, 0, heads):
        raise UnsupportedFlaConfig(
            "num_heads",
            f"config field 'num_heads' = {values['num_heads']!r}, but expand * hidden_size / head_dim = {heads}",
        )
    groups = read_integer(values, "n_groups", 1)
    if heads % groups:
        raise UnsupportedFlaConfig("n_groups", f"config field 'n_groups' = {groups} does not divide the {heads} heads")
    return HeadLayout(d_model=d_model, head_dim=head_dim, heads=heads, groups=groups)


def backbone_renames(mixer_tensors: tuple[str, ...]) -> tuple[tuple[re.Pattern, str], ...]:
    """(schedlang name pattern, fla name) pairs for a Mamba backbone whose mixers hold ``mixer_tensors``."""
    mixer = "|".join(re.escape(name) for name in mixer_tensors)
    return tuple(
        (re.compile(pattern), replacement)
        for pattern, replacement in (
            (r"embedding\.weight", "backbone.embeddings.weight"),
            (r"final_norm\.weight", "backbone.norm_f.weight"),
            (r"lm_head\.weight", "lm_head.weight"),
            (_LAYER + r"mixer_norm\.weight", r"backbone.layers.\1.norm.weight"),
            (_LAYER + rf"mixer\.({mixer})", r"backbone.layers.\1.mixer.\2"),
        )
    )


def backbone_sources(renames, name: str, family: str) -> tuple[str, ...]:
    """The fla tensor schedlang's parameter ``name`` is, by ``renames``; ``KeyError`` naming ``family``."""
    for pattern, replacement in renames:
        if pattern.fullmatch(name):
            return (pattern.sub(replacement, name),)
    raise KeyError(f"flash-linear-attention's {family} has no tensor for schedlang's {name}")


def backbone_problems(model: ModelConfig, kind: LayerKind, architecture: str) -> list[str]:
    """Why ``model`` is not fla's ``architecture``, a stack of ``kind`` layers alone; empty when it is."""
    problems = []
    if any(layer is not kind for layer in model.layers):
        problems.append(f"every layer must be {kind.value} (fla's {architecture} has no other kind)")
    if model.mlp_ratio > 0 or model.options.mlp_width is not None:
        problems.append("the blocks must have no MLP (mlp = none)")
    if (model.heads * model.head_dim) % model.d_model:
        problems.append("heads * head_dim must be a whole multiple of d_model (fla's integer expand)")
    return problems


def read_backbone(values: Mapping[str, object], layout: HeadLayout, kind: LayerKind, **mixer_options):
    """The :class:`schedlang.runtime.hf_format.FlaModel` of a Mamba backbone's ``config.json``: ``layout``'s sizes,
    ``num_hidden_layers`` blocks of ``kind`` without an MLP, and ``ModelOptions(**mixer_options)`` (``mamba2=`` or
    ``mamba3=``) with the config's ``tie_word_embeddings``; fla 0.6.0's defaults where a field is absent."""
    from schedlang.runtime.hf_format import FlaModel, read_integer, read_positive

    return FlaModel(
        vocab=read_integer(values, "vocab_size", 32000),
        d_model=layout.d_model,
        layers=(kind,) * read_integer(values, "num_hidden_layers", 48),
        heads=layout.heads,
        head_dim=layout.head_dim,
        norm_eps=read_positive(values, "norm_eps", 1e-5),
        options=ModelOptions(**mixer_options, tie_embeddings=read_boolean(values, "tie_word_embeddings", False)),
        mlp_ratio=0.0,
    )


def backbone_config(model: ModelConfig, architecture: str, model_type: str,
                    mixer_fields: Mapping[str, object]) -> dict[str, object]:
    """fla's ``config.json`` fields of a Mamba backbone ``model``: its sizes, then ``mixer_fields`` (the mixer's
    own), then the norm, the tied embedding and the fused-kernel flags fla's models read."""
    return {
        "architectures": [architecture],
        "model_type": model_type,
        "vocab_size": model.vocab,
        "hidden_size": model.d_model,
        "num_hidden_layers": len(model.layers),
        "head_dim": model.head_dim,
        "num_heads": model.heads,
        "expand": model.heads * model.head_dim // model.d_model,
        **mixer_fields,
        "norm_eps": model.norm_eps,
        "tie_word_embeddings": model.options.tie_embeddings,
        "residual_in_fp32": True,
        "fuse_norm": True,
        "fuse_cross_entropy": True,
    }
