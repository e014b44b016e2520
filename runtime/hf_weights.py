"""Weights in and out of Hugging Face directories, in flash-linear-attention's names and safetensors files.

In: :func:`load_initial_weights` copies into one pipeline stage the tensors of its own parameters, read
from the directory's ``*.safetensors`` (each rank of the stage reads the same ones, so sequence and data
ranks start identical). Out: :func:`read_checkpoint_model` reads the model of a schedlang checkpoint (any
mesh: parameter names carry global layer indices) and :func:`write_hf_directory` writes it with fla's
``config.json`` and names. Both need the ``safetensors`` package (``pip install 'schedlang[fla]'``).
"""

from __future__ import annotations

import ast
import json
import os
import warnings
from pathlib import Path
from typing import Mapping

import torch
from torch import nn

from schedlang.vocabulary import ModelConfig, ModelOptions
from schedlang.runtime.hf_format import FLA_UNFUSED_NAMES, fla_config, fla_sources, to_fla_tensors
from schedlang.vocabulary.files import replacing, write_replacing

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"


class HfWeightsError(Exception):
    """A Hugging Face directory whose weights do not fit the model; the message is one line."""


def safetensors_files(directory: str | Path) -> list[Path]:
    """The directory's ``*.safetensors`` files, in name order."""
    return sorted(Path(directory).glob("*.safetensors"))


def _safetensors():
    try:
        import safetensors.torch
    except ImportError:
        raise HfWeightsError(
            "reading and writing Hugging Face weights needs the safetensors package: pip install 'schedlang[fla]'"
        ) from None
    return safetensors


PICKLE_WEIGHT_PATTERNS = ("pytorch_model*.bin", "*.pt", "*.pth", "*.ckpt")
SAFETENSORS_HEADER_LIMIT = 100 << 20  # the safetensors format's own limit on a header


def pickle_weight_files(directory: str | Path) -> list[Path]:
    """The directory's weight files in torch's pickle format, which schedlang never loads (unpickling can run
    code its writer chose)."""
    return sorted({path for pattern in PICKLE_WEIGHT_PATTERNS for path in Path(directory).glob(pattern)})


def safetensors_header_problem(path: Path) -> str | None:
    """Why ``path`` is not a safetensors file (followed through links: not a regular file, shorter than its
    header says, a header that is not a JSON object), reading at most the header; None when it is one."""
    from schedlang.vocabulary.files import special_file_problem

    problem = special_file_problem(path)
    if problem:
        return problem
    try:
        with open(path, "rb") as handle:
            size = os.fstat(handle.fileno()).st_size
            prefix = handle.read(8)
            length = int.from_bytes(prefix, "little") if len(prefix) == 8 else -1
            if length < 2 or length > SAFETENSORS_HEADER_LIMIT or 8 + length > size:
                return f"{path} is not a safetensors file (its first 8 bytes do not give a header it holds)"
            header = json.loads(handle.read(length))
    except OSError as error:
        return f"{path} cannot be read: {error.strerror or error}"
    except (ValueError, RecursionError):
        return f"{path} is not a safetensors file (its header is not JSON)"
    if not isinstance(header, dict):
        return f"{path} is not a safetensors file (its header is not a JSON object)"
    return None


def _tensor_files(safetensors, directory: str | Path) -> dict[str, Path]:
    """Each tensor name of the directory's safetensors files, with the file that holds it; :class:`HfWeightsError`
    for a file that is not one."""
    where: dict[str, Path] = {}
    for path in safetensors_files(directory):
        problem = safetensors_header_problem(path)
        if problem:
            raise HfWeightsError(problem)
        try:
            with safetensors.safe_open(str(path), framework="pt") as handle:
                for key in handle.keys():
                    where.setdefault(key, path)
        except Exception as error:  # safetensors' own SafetensorError has no importable base in every version
            raise HfWeightsError(f"{path} cannot be read as safetensors: {str(error)[:200]}") from None
    return where


def _source_name(source: str, where: Mapping[str, Path]) -> str:
    """``source``, or its name in a model saved with ``fuse_norm = false`` when only that is there."""
    for fused, unfused in FLA_UNFUSED_NAMES.items():
        if source not in where and source.endswith(fused):
            return source.removesuffix(fused) + unfused
    return source


def weights_problem(config: ModelConfig, directory: str) -> str | None:
    """Why ``directory``'s tensors cannot be the weights of ``config`` (a missing tensor, another shape), or
    None when every parameter of the whole model has its tensors. Reads only the files' headers."""
    from schedlang.runtime.model import StageModel

    safetensors = _safetensors()
    where = _tensor_files(safetensors, directory)
    with torch.device("meta"):
        model = StageModel(config, tuple(range(len(config.layers))), True, True)
    for name, parameter in model.named_parameters():
        try:
            sources = fla_sources(name, config.layers)
        except KeyError as error:
            return str(error.args[0])
        rows = 0
        for source in (_source_name(written, where) for written in sources):
            if source not in where:
                return f"its weights have no tensor {source} (for schedlang's {name})"
            with safetensors.safe_open(str(where[source]), framework="pt") as handle:
                shape = tuple(handle.get_slice(source).get_shape())
            if shape[1:] != tuple(parameter.shape[1:]):
                return f"its tensor {source} has shape {shape}, but schedlang's {name} is {tuple(parameter.shape)}"
            rows += shape[0] if shape else 0
        if parameter.dim() and rows != parameter.shape[0]:
            return f"its tensors for schedlang's {name} have {rows} rows, but the model's have {parameter.shape[0]}"
    return None


def load_initial_weights(model: nn.Module, directory: str) -> None:
    """Copy fla's tensors of every parameter of ``model`` (a stage) from ``directory``'s safetensors.

    Raises :class:`HfWeightsError` naming the missing tensor or the shapes that differ.
    """
    safetensors = _safetensors()
    if not safetensors_files(directory):
        raise HfWeightsError(f"{directory} holds no *.safetensors file")
    where = _tensor_files(safetensors, directory)
    for name, parameter in model.named_parameters():
        sources = fla_sources(name, model.config.layers)
        parts = []
        for source in (_source_name(written, where) for written in sources):
            if source not in where:
                raise HfWeightsError(f"{directory} has no tensor {source} (for schedlang's {name})")
            with safetensors.safe_open(str(where[source]), framework="pt") as handle:
                parts.append(handle.get_tensor(source))
        value = torch.cat(parts, dim=0) if len(parts) > 1 else parts[0]
        if tuple(value.shape) != tuple(parameter.shape):
            raise HfWeightsError(
                f"{directory}: {' + '.join(sources)} has shape {tuple(value.shape)}, but schedlang's {name} "
                f"is {tuple(parameter.shape)}"
            )
        with torch.no_grad():
            parameter.copy_(value.to(device=parameter.device, dtype=parameter.dtype))


def read_checkpoint_model(step_directory: Path) -> tuple[ModelConfig, dict[str, torch.Tensor]]:
    """The model record and the model's tensors (by schedlang name) of one checkpoint step directory.

    The caller checks the directory is trusted first ([Note: checkpoint trust boundary] in
    :mod:`schedlang.runtime.checkpoint`).
    """
    import torch.distributed.checkpoint as dcp

    from schedlang.runtime.checkpoint_manifest import RUN_RECORD_KEY

    reader = dcp.FileSystemReader(str(step_directory))
    stored = reader.read_metadata().state_dict_metadata
    record_prefix = f"{RUN_RECORD_KEY}."
    model_state = {}
    for key, metadata in stored.items():
        if key.startswith("model.") and hasattr(metadata, "size"):
            model_state[key.removeprefix("model.")] = torch.empty(
                tuple(metadata.size), dtype=metadata.properties.dtype
            )
    record = {key.removeprefix(record_prefix): "" for key in stored if key.startswith(record_prefix)}
    state = {"model": model_state, RUN_RECORD_KEY: record}
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        dcp.load(state, checkpoint_id=str(step_directory), no_dist=True)
    return model_config_of_record(state[RUN_RECORD_KEY]), model_state


def model_config_of_record(record: Mapping[str, str]) -> ModelConfig:
    """The :class:`ModelConfig` a checkpoint's run record describes (schedlang.runtime.checkpoint_manifest);
    a record without ``model.norm_eps`` and ``model.options`` is of a model with their defaults."""
    if "model.vocab" not in record:
        raise HfWeightsError("the checkpoint holds no run record: it was written by an older schedlang")
    values = {key: ast.literal_eval(text) for key, text in record.items() if key.startswith("model.")}
    defaults = ModelConfig(vocab=1, d_model=1, layers=(), heads=1, head_dim=1)
    return ModelConfig(
        vocab=values["model.vocab"],
        d_model=values["model.d_model"],
        layers=values["model.layers"],
        heads=values["model.heads"],
        head_dim=values["model.head_dim"],
        mlp_ratio=values["model.mlp_ratio"],
        norm_eps=values.get("model.norm_eps", defaults.norm_eps),
        options=(
            ModelOptions.from_architecture_record(values["model.options"]) if "model.options" in values else ModelOptions()
        ),
    )


def write_hf_directory(directory: Path, model: ModelConfig, tensors: Mapping[str, torch.Tensor]) -> None:
    """``config.json`` and ``model.safetensors`` of ``model`` in fla's form; ``ValueError`` when ``model``
    is not a flash-linear-attention GLA or Gated DeltaNet model (the message says why)."""
    dtypes = {tensor.dtype for tensor in tensors.values()}
    config = fla_config(model, torch_dtype=dtypes.pop() if len(dtypes) == 1 else torch.float32)
    safetensors = _safetensors()
    directory.mkdir(parents=True, exist_ok=True)
    # each file is written whole and renamed into place, so a link at its name is replaced, not followed
    # ([Note: file safety] in schedlang.vocabulary.files)
    with replacing(directory / WEIGHTS_FILE) as temporary:
        safetensors.torch.save_file(to_fla_tensors(tensors, model.layers), str(temporary), metadata={"format": "pt"})
    write_replacing(directory / CONFIG_FILE, json.dumps(config, indent=2) + "\n")
