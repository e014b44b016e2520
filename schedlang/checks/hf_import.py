"""``model { from = hf("dir") }``: a Hugging Face model directory as the defaults of the model block.

Contract: :func:`read_from` follows ``schedlang.checks.readers`` (returns the value or reports and returns
``None``). It reads ``dir/config.json`` (a flash-linear-attention GLA, Gated DeltaNet or Mamba-2 config, through
``schedlang.runtime.hf_format.read_fla_config``) into the value of every model key it decides, as that
key's reader would return it; ``schedlang.checks.schema.read_key`` gives those values to the keys the
schedule does not write, so a written key wins and is checked as usual. Every problem with the directory
or its config (missing, unreadable, a field schedlang does not build) is reported at the ``from`` value.
The directory is resolved like every path of a schedule (``schedlang.lowering.paths``): relative to the
schedule file.
"""

from __future__ import annotations

import importlib.util
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from schedlang import ast
from schedlang.checks.readers import read_call
from schedlang.lowering.program import MlpKind, MlpSpec
from schedlang.vocabulary import LayerKind

if TYPE_CHECKING:
    from schedlang.checks.context import Checker

HF_SOURCE = "hf"


@dataclass(frozen=True)
class ImportedModel:
    """A checked Hugging Face directory: its absolute path, the model keys it gives (key name -> value as
    the key's reader returns it), and whether it holds weights (``*.safetensors``)."""

    directory: str
    values: dict[str, object] = field(hash=False)
    has_weights: bool


def _resolve(checker: Checker, written: str) -> Path:
    if Path(written).is_absolute() or checker.filename.startswith("<"):
        return Path(written)
    return (Path(checker.filename).parent / written).resolve()


def _model_values(model) -> dict[str, object]:
    """The model keys an fla model (``schedlang.runtime.hf_format.FlaModel``) decides."""
    values = {
        "vocab": model.vocab,
        "d_model": model.d_model,
        "layers": model.layers,
        "heads": model.heads,
        "head_dim": model.head_dim,
        "mlp": (
            MlpSpec(MlpKind.NONE, 0.0)
            if model.mlp_ratio == 0
            else MlpSpec(MlpKind.SWIGLU, width=model.options.mlp_width)
        ),
        "norm_eps": model.norm_eps,
        "expand_v": model.head_dim * model.heads / model.d_model,
        "tie_embeddings": model.options.tie_embeddings,
    }
    if LayerKind.ATTN in model.layers:
        attention = model.options.attention
        values["attn_heads"] = attention.heads
        values["attn_head_dim"] = attention.head_dim
        values["attn_kv_heads"] = attention.kv_heads
        values["qkv_bias"] = attention.qkv_bias
        values["rope_theta"] = attention.rope_theta
    if LayerKind.MAMBA2 in model.layers:
        mamba2 = model.options.mamba2
        for name in ("state_size", "n_groups", "conv_kernel", "use_conv_bias", "use_bias", "dt_min", "dt_max",
                     "dt_init_floor", "dt_limit"):
            values[name] = getattr(mamba2, name)
        return values
    if LayerKind.GDN in model.layers:
        gdn = model.options.gdn
        values["expand_k"] = gdn.head_k_dim * model.heads / model.d_model
        values["delta_gates"] = gdn.gates
        values["short_conv_size"] = gdn.short_conv_size
        values["value_heads"] = gdn.value_heads_of(model.heads)
        return values
    gla = model.options.gla
    values["expand_k"] = gla.head_k_dim * model.heads / model.d_model
    values["kv_heads"] = gla.kv_heads
    values["gate_low_rank_dim"] = gla.gate_rank
    values["gate_logit_normalizer"] = gla.gate_logit_normalizer
    values["clamp_min"] = gla.gate_clamp_min
    values["output_gate"] = gla.output_gate
    return values


def read_from(checker: Checker, value: ast.Value, path: str) -> ImportedModel | None:
    """``hf("dir")`` (or ``hf(path = "dir")``): a directory with a GLA, Gated DeltaNet or Mamba-2 ``config.json``."""
    # the runtime's modules import torch: only a schedule that names a directory pays for it
    from schedlang.runtime.hf_format import UnsupportedFlaConfig, read_fla_config
    from schedlang.runtime.hf_weights import CONFIG_FILE, safetensors_files

    call = read_call(checker, value, path, {HF_SOURCE: ("path",)}, "model source", positional=True)
    if call is None:
        return None
    argument = call.arguments.get("path")
    if argument is None or not isinstance(argument.value, ast.StringLiteral) or not argument.value.value:
        checker.error(
            f"'{path}' needs the model directory as a string", value.span, hint='e.g. `from = hf("models/gla")`'
        )
        return None
    written = argument.value.value
    directory = _resolve(checker, written)
    if not directory.is_dir():
        checker.error(f"Hugging Face model directory '{written}' does not exist", value.span)
        return None
    config_path = directory / CONFIG_FILE
    try:
        config = json.loads(config_path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        checker.error(f"'{written}' has no {CONFIG_FILE}", value.span, hint="a directory written by save_pretrained")
        return None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        checker.error(f"cannot read {config_path}: {error}", value.span)
        return None
    if not isinstance(config, dict):
        checker.error(f"{config_path} is not a JSON object", value.span)
        return None
    try:
        model = read_fla_config(config)
    except UnsupportedFlaConfig as error:
        checker.error(f"{CONFIG_FILE} of '{written}': {error}", value.span)
        return None
    values = _model_values(model)
    has_weights = bool(safetensors_files(directory))
    if has_weights and importlib.util.find_spec("safetensors") is None:
        checker.error(
            f"'{written}' holds *.safetensors weights, and reading them needs the safetensors package",
            value.span,
            hint="pip install 'schedlang[fla]'",
        )
        return None
    return ImportedModel(str(directory), values, has_weights)
