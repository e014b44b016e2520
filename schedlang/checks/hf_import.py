"""``model { from = hf("dir") }``: a Hugging Face model directory as the defaults of the model block.

Contract: :func:`read_from` follows ``schedlang.checks.readers`` (returns the value or reports and returns
``None``). It reads ``dir/config.json`` (a flash-linear-attention GLA, Gated DeltaNet, Mamba-2 or Mamba-3 config, through
``schedlang.runtime.hf_format.read_fla_config``) into the value of every model key it decides, as that
key's reader would return it; ``schedlang.checks.schema.read_key`` gives those values to the keys the
schedule does not write, so a written key wins and is checked as usual. Every problem with the directory
or its config (missing, unreadable, a field schedlang does not build) is reported at the ``from`` value.
The directory is resolved like every path of a schedule (``schedlang.lowering.paths``): relative to the
schedule file.

Bounds: ``config.json`` is read only as a regular file of at most :data:`MAX_CONFIG_BYTES`; its integer
fields are held to the bounds of the schedule keys they fill before anything is built from them (a
``num_hidden_layers`` over ``model.MAX_LAYERS`` is refused before a layer list is made), and every value it
gives is then held to its key's reader's bounds, as if the schedule had written it. A directory whose weights
are only torch pickles (``pytorch_model.bin``) is refused: schedlang loads safetensors only.
"""

from __future__ import annotations

import importlib.util
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from schedlang import ast
from schedlang.checks.readers import read_call
from schedlang.vocabulary import LayerKind, ModelConfig

if TYPE_CHECKING:
    from schedlang.checks.context import Checker

HF_SOURCE = "hf"
MAX_CONFIG_BYTES = 1 << 20
# config.json's integer fields -> the schedule key whose bounds hold them (num_hidden_layers: model.MAX_LAYERS)
CONFIG_FIELD_KEYS = {
    "vocab_size": "model.vocab",
    "hidden_size": "model.d_model",
    "num_heads": "model.heads",
    "num_kv_heads": "model.kv_heads",
    "num_v_heads": "model.value_heads",
    "head_dim": "model.head_dim",
    "conv_size": "model.short_conv_size",
}


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
        "mlp": (0.0, None) if model.mlp_ratio == 0 else (ModelConfig.mlp_ratio, model.options.mlp_width),
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
    if LayerKind.MAMBA3 in model.layers:
        mamba3 = model.options.mamba3
        for name in ("state_size", "n_groups", "use_bias", "dt_min", "dt_max", "dt_init_floor", "rope_fraction",
                     "A_floor", "is_outproj_norm", "is_mimo", "mimo_rank"):
            values[name] = getattr(mamba3, name)
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


def _integer_bounds(path: str) -> tuple[int | None, int | None]:
    from schedlang.vocabulary.keys import Integer
    from schedlang.checks.schema import KEYS

    reader = KEYS[path].reader
    return (reader.minimum, reader.maximum) if isinstance(reader, Integer) else (None, None)


def _outside(value: object, minimum, maximum) -> bool:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    return (minimum is not None and value < minimum) or (maximum is not None and value > maximum)


def config_bounds_problem(config: dict) -> str | None:
    """The first integer field of ``config`` outside the bounds of the schedule key it fills, checked before any
    model is built from it; None when all are inside."""
    from schedlang.checks.model import MAX_LAYERS
    from schedlang.limits import MAX_MLP_RATIO

    bounds = {field: _integer_bounds(key) for field, key in CONFIG_FIELD_KEYS.items()}
    bounds["num_hidden_layers"] = (1, MAX_LAYERS)
    hidden_size = config.get("hidden_size", 2048)
    if isinstance(hidden_size, int) and not isinstance(hidden_size, bool):
        bounds["intermediate_size"] = (1, int(MAX_MLP_RATIO * hidden_size))
    for field, (minimum, maximum) in bounds.items():
        if _outside(config.get(field), minimum, maximum):
            return f"config field '{field}' = {config[field]!r} is outside {minimum} .. {maximum}"
    return None


def value_bounds_problem(values: dict[str, object]) -> str | None:
    """The first model key ``values`` gives outside its reader's bounds, as if the schedule had written it."""
    from schedlang.vocabulary.keys import Integer, Number
    from schedlang.checks.schema import KEYS

    for name, given in values.items():
        key = KEYS.get(f"model.{name}")
        reader = None if key is None else key.reader
        if isinstance(reader, Integer) and _outside(given, reader.minimum, reader.maximum):
            return f"it gives model.{name} = {given!r}, outside {reader.minimum} .. {reader.maximum}"
        if isinstance(reader, Number) and isinstance(given, float):
            minimum, below = reader.minimum, reader.below
            too_low = minimum is not None and (given <= minimum if reader.above else given < minimum)
            too_high = below is not None and given >= below
            if too_low or too_high or given != given:
                return f"it gives model.{name} = {given!r}, outside what the key accepts"
    return None


def read_from(checker: Checker, value: ast.Value, path: str) -> ImportedModel | None:
    """``hf("dir")`` (or ``hf(path = "dir")``): a directory with a GLA, Gated DeltaNet or Mamba-2 ``config.json``."""
    # the runtime's modules import torch: only a schedule that names a directory pays for it
    from schedlang.runtime.hf_format import UnsupportedFlaConfig, read_fla_config
    from schedlang.runtime.hf_weights import CONFIG_FILE, pickle_weight_files, safetensors_files
    from schedlang.vocabulary.files import read_bounded_text

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
        config = json.loads(read_bounded_text(config_path, MAX_CONFIG_BYTES, CONFIG_FILE))
    except FileNotFoundError:
        checker.error(f"'{written}' has no {CONFIG_FILE}", value.span, hint="a directory written by save_pretrained")
        return None
    except RecursionError:
        checker.error(f"cannot read {config_path}: its JSON is nested too deeply", value.span)
        return None
    except (OSError, UnicodeDecodeError, ValueError) as error:  # ValueError: bad JSON, or an integer too long
        checker.error(f"cannot read {config_path}: {str(error)[:200]}", value.span)
        return None
    if not isinstance(config, dict):
        checker.error(f"{config_path} is not a JSON object", value.span)
        return None
    problem = config_bounds_problem(config)
    if problem is None:
        try:
            model = read_fla_config(config)
        except UnsupportedFlaConfig as error:
            problem = str(error)
        else:
            values = _model_values(model)
            problem = value_bounds_problem(values)
    if problem is not None:
        checker.error(f"{CONFIG_FILE} of '{written}': {problem}", value.span)
        return None
    has_weights = bool(safetensors_files(directory))
    pickles = pickle_weight_files(directory)
    if pickles and not has_weights:
        checker.error(
            f"'{written}' holds its weights only as torch pickles ({pickles[0].name}), which schedlang does not "
            "load: unpickling can run code chosen by whoever wrote the file",
            value.span,
            hint="save them as safetensors (save_pretrained(..., safe_serialization=True)), or remove them "
            "to train from the seed",
        )
        return None
    if has_weights and importlib.util.find_spec("safetensors") is None:
        checker.error(
            f"'{written}' holds *.safetensors weights, and reading them needs the safetensors package",
            value.span,
            hint="pip install 'schedlang[fla]'",
        )
        return None
    return ImportedModel(str(directory), values, has_weights)
