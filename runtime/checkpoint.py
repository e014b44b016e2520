"""Save and resume model, optimizer and step with torch.distributed.checkpoint.

Each save goes to ``<directory>/step-<n>``; a ``latest`` file written by rank 0
after every rank has finished names the newest complete one, so a run killed
during a save resumes from the previous checkpoint. Parameter names carry
global layer indices, so a stage's keys are unique across the pipeline and
data-parallel replicas save identical, deduplicated entries.
"""

from __future__ import annotations

import copy
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

LATEST_FILE = "latest"


def checkpoint_path(directory: str, step: int) -> Path:
    return Path(directory) / f"step-{step:08d}"


def save_checkpoint(directory: str, step: int, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
    """``step`` is the number of optimizer steps taken; resuming starts at that step."""
    model_state, optimizer_state = get_state_dict(model, optimizer)
    target = checkpoint_path(directory, step)
    dcp.save({"model": model_state, "optimizer": optimizer_state}, checkpoint_id=str(target))
    dist.barrier()
    if dist.get_rank() == 0:
        latest = Path(directory) / LATEST_FILE
        temporary = latest.with_suffix(".tmp")
        temporary.write_text(target.name + "\n", encoding="utf-8")
        temporary.replace(latest)
    dist.barrier()


def latest_step(directory: str) -> int | None:
    latest = Path(directory) / LATEST_FILE
    if not latest.exists():
        return None
    name = latest.read_text(encoding="utf-8").strip()
    return int(name.removeprefix("step-"))


def load_checkpoint(directory: str, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> int:
    """Load the newest complete checkpoint in place; returns its step (0 when there is none)."""
    step = latest_step(directory)
    if step is None:
        return 0
    model_state, optimizer_state = get_state_dict(model, optimizer)
    # Hyperparameters come from the schedule, not the checkpoint: the flattened
    # param_groups DCP reads back lose tuple-valued entries such as Adam's betas.
    param_groups = copy.deepcopy(optimizer_state["param_groups"])
    state = {"model": model_state, "optimizer": optimizer_state}
    dcp.load(state, checkpoint_id=str(checkpoint_path(directory, step)))
    state["optimizer"]["param_groups"] = param_groups
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"])
    return step
