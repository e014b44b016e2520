"""``schedlang export-model CHECKPOINT -o DIR``: a checkpoint's model as a Hugging Face directory.

Reads the model of a schedlang checkpoint (``train.checkpoint``'s directory, whose newest complete step
is taken, or one ``step-N`` directory; any mesh, since parameter names carry global layer indices) and
writes ``config.json`` and ``model.safetensors`` in flash-linear-attention's ``GLAForCausalLM`` form (its
``GatedDeltaNetForCausalLM`` form for a model of ``gdn`` layers), so
``AutoModelForCausalLM.from_pretrained(DIR)`` loads it after ``import fla`` and ``model { from = hf(DIR) }``
trains from it again. The checkpoint is trusted as a resume trusts it ([Note: checkpoint trust
boundary] in ``schedlang.runtime.checkpoint``). An existing non-empty ``DIR`` is left alone unless
``--force``. Needs the ``safetensors`` package (``pip install 'schedlang[fla]'``).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

HELP = "write a checkpoint's model as a Hugging Face directory of flash-linear-attention's GLA or Gated DeltaNet"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("checkpoint", help="a checkpoint directory (its newest complete step) or one step-N directory")
    parser.add_argument("-o", "--output", required=True, help="the Hugging Face directory to write")
    parser.add_argument("--force", action="store_true", help="write into a non-empty output directory")


def _fail(message: str) -> int:
    print(f"schedlang export-model: error: {message}", file=sys.stderr)
    return 1


def step_directory(checkpoint: Path) -> Path | None:
    """``checkpoint`` itself when it is a step directory, else the newest complete step in it (None: none)."""
    from schedlang.runtime.checkpoint import candidate_steps, checkpoint_path

    if (checkpoint / ".metadata").is_file():
        return checkpoint
    for step in candidate_steps(str(checkpoint)):
        if checkpoint_path(str(checkpoint), step).is_dir():
            return checkpoint_path(str(checkpoint), step)
    return None


def run(args: argparse.Namespace) -> int:
    from schedlang.runtime.checkpoint import CheckpointError, check_trusted_checkpoint, checksum_problem
    from schedlang.runtime.hf_weights import HfWeightsError, read_checkpoint_model, write_hf_directory

    checkpoint, output = Path(args.checkpoint), Path(args.output)
    if args.output == "-":
        return _fail("export-model writes a directory (config.json and model.safetensors); -o - cannot hold one")
    if not checkpoint.is_dir():
        return _fail(f"{checkpoint} is not a directory")
    if output.exists() and not output.is_dir():
        return _fail(f"{output} exists and is not a directory")
    if output.is_dir() and any(output.iterdir()) and not args.force:
        return _fail(f"{output} is not empty; give --force to write config.json and model.safetensors into it")
    try:
        step = step_directory(checkpoint)
    except CheckpointError as error:
        return _fail(str(error))
    if step is None:
        return _fail(f"{checkpoint} holds no complete checkpoint (no 'latest' naming a step directory)")
    try:
        check_trusted_checkpoint(step)
        problem = checksum_problem(step)
        if problem is not None:
            return _fail(f"checkpoint {problem}")
        model, tensors = read_checkpoint_model(step)
        write_hf_directory(output, model, tensors)
    except (CheckpointError, HfWeightsError, ValueError) as error:
        return _fail(str(error))
    print(f"wrote {output / 'config.json'} and {output / 'model.safetensors'} from {step}")
    return 0
