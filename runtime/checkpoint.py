"""Save and resume model, optimizer and step with torch.distributed.checkpoint.

Each save goes to ``<directory>/step-<n>``; a ``latest`` file written by rank 0
after every rank has finished names the newest complete one, so a run killed
during a save resumes from the previous checkpoint. Parameter names carry
global layer indices, so a stage's keys are unique across the pipeline and
data-parallel replicas save identical, deduplicated entries. With master
weights the trainer saves and loads the fp32 copies, which carry the model's
parameter names ([Note: master weights] in schedlang.runtime.master_weights).
Every checkpoint also holds the run record of schedlang.runtime.checkpoint_manifest, compared
with the schedule before any tensor is loaded, and, with fp16's loss scaling, the loss scale under
``loss_scale`` ([Note: loss scaling] in schedlang.runtime.loss_scale; a checkpoint without one leaves the
run's initial scale). A tied embedding's two copies share one name, so the weight is saved once
([Note: tied embeddings across stages] in schedlang.runtime.model).

[Note: checkpoint trust boundary] The checkpoint metadata torch writes (``.metadata``)
is a pickle, so loading a checkpoint can run code its writer chose. A resume
therefore trusts only what the user running it wrote: the checkpoint
directory, the step directory and every file in it must be owned by the
current user and writable by nobody else, or the resume is refused
(:class:`UntrustedCheckpointError`). Saves take group and other write
permission off what they create. The directories above the checkpoint
directory are not checked. docs/reliability.md states the rule for users.

The checkpoint directory and ``latest`` are checked before ``latest`` is read, and ``latest`` is read
as a regular file of at most :data:`MAX_LATEST_BYTES` (a FIFO or a link to a device is refused, never
read).

[Note: shard checksums] After every rank has saved, rank 0 writes ``checksums.json`` into the step
directory (the SHA-256 and size of every file torch wrote) before ``latest`` names the step. A resume
verifies them before torch opens any of the files, so a shard that was truncated or overwritten is named
(``step-N/__0_0.distcp does not match its checksum``) and the previous checkpoint is tried. A step directory
without ``checksums.json`` (written before checksums were recorded) is loaded unverified.

Faults: a ``latest`` that names a checkpoint that cannot be read (truncated,
corrupt, missing) is reported in one line and the newest earlier complete
checkpoint is loaded instead; when none loads, the resume fails
(:class:`CheckpointError`) rather than train from half-loaded weights.

[Note: no overwriting another run's checkpoints] A run starts from the seed only in a checkpoint directory
that holds no complete step directory (one with torch's ``.metadata``): with ``latest`` removed, a directory of
checkpoints is refused rather than silently overwritten step by step by a fresh run. A resumed run may write
over step directories newer than the one it resumed from, which are interrupted saves or ones it reported as
unreadable.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import re
import stat
import sys
from pathlib import Path
from typing import Callable, Mapping

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

from schedlang.runtime.checkpoint_manifest import RUN_RECORD_KEY, first_mismatch
from schedlang.vocabulary.files import UnsafeFileError, read_bounded, read_bounded_text, write_replacing

LOSS_SCALE_KEY = "loss_scale"
LATEST_FILE = "latest"
CHECKSUM_FILE = "checksums.json"
MAX_LATEST_BYTES = 256
MAX_CHECKSUM_FILE_BYTES = 1 << 20
METADATA_FILE = ".metadata"
TRUSTED_FILE_MODE = 0o644  # what rank 0 writes itself: no write permission for group and others
STEP_DIRECTORY = re.compile(r"step-(\d{8,})")
FOREIGN_WRITE_BITS = stat.S_IWGRP | stat.S_IWOTH


class CheckpointError(Exception):
    """A checkpoint that cannot be resumed from; the message is one line naming the path."""


class UntrustedCheckpointError(CheckpointError):
    """A checkpoint path another user owns or can write ([Note: checkpoint trust boundary])."""


class CheckpointMismatchError(CheckpointError):
    """A checkpoint written for another model, mesh or schedule."""


def checkpoint_path(directory: str, step: int) -> Path:
    return Path(directory) / f"step-{step:08d}"


def _is_rank_zero() -> bool:
    return not dist.is_initialized() or dist.get_rank() == 0


def _barrier() -> None:
    if dist.is_initialized():
        dist.barrier()


def check_trusted(path: Path) -> None:
    """Refuse ``path`` unless the current user owns it and neither group nor others can write it."""
    try:
        info = path.stat()
    except OSError as error:
        raise CheckpointError(f"cannot read checkpoint path {path}: {error.strerror or error}") from None
    if info.st_uid != os.getuid():
        raise UntrustedCheckpointError(
            f"refusing to resume from {path}: it is owned by user id {info.st_uid}, not by you ({os.getuid()}), "
            "and a checkpoint can run code when loaded"
        )
    if info.st_mode & FOREIGN_WRITE_BITS:
        who = "group and others" if info.st_mode & FOREIGN_WRITE_BITS == FOREIGN_WRITE_BITS else (
            "its group" if info.st_mode & stat.S_IWGRP else "all users"
        )
        raise UntrustedCheckpointError(
            f"refusing to resume from {path}: it is writable by {who}, and a checkpoint can run code when loaded "
            f"(chmod go-w {path} if you trust its contents)"
        )


def check_trusted_checkpoint(step_directory: Path) -> None:
    """The checkpoint directory, the step directory and every entry of the step directory."""
    check_trusted(step_directory.parent)
    check_trusted(step_directory)
    for entry in sorted(step_directory.iterdir()):
        check_trusted(entry)


def _remove_foreign_write(path: Path) -> None:
    try:
        info = path.stat()
        if info.st_uid == os.getuid() and info.st_mode & FOREIGN_WRITE_BITS:
            path.chmod(stat.S_IMODE(info.st_mode) & ~FOREIGN_WRITE_BITS)
    except OSError:
        pass  # not ours to change: the resume's trust check will name it


def _file_digest(path: Path) -> str:
    with open(path, "rb") as handle:
        return hashlib.file_digest(handle, "sha256").hexdigest()


def write_checksums(step_directory: Path) -> None:
    """``checksums.json``: ``{file name: {"sha256": ..., "bytes": ...}}`` of every file of ``step_directory``
    ([Note: shard checksums])."""
    entries = {
        entry.name: {"sha256": _file_digest(entry), "bytes": entry.stat().st_size}
        for entry in sorted(step_directory.iterdir())
        if entry.name != CHECKSUM_FILE and entry.is_file() and not entry.is_symlink()
    }
    text = json.dumps(entries, indent=1, sort_keys=True) + "\n"
    write_replacing(step_directory / CHECKSUM_FILE, text, mode=TRUSTED_FILE_MODE)


def checksum_problem(step_directory: Path) -> str | None:
    """``<file> does not match its checksum ...`` for the first file of ``step_directory`` that differs from
    ``checksums.json``, or is missing; None when all match or there is no ``checksums.json``."""
    manifest = step_directory / CHECKSUM_FILE
    if not os.path.lexists(manifest):
        return None
    try:
        entries = json.loads(read_bounded(manifest, MAX_CHECKSUM_FILE_BYTES, "checkpoint checksums"))
    except (OSError, ValueError, RecursionError) as error:
        return f"{manifest} cannot be read ({str(error)[:200]})"
    if not isinstance(entries, dict):
        return f"{manifest} is not a JSON object"
    for name, expected in sorted(entries.items()):
        path = step_directory / name
        if not isinstance(expected, dict) or Path(name).name != name:
            return f"{manifest} has an entry {name[:100]!r} that names no file of the directory"
        try:
            size = path.stat().st_size
            if size != expected.get("bytes"):
                recorded = expected.get("bytes")
                return f"{path} does not match its checksum ({size} bytes, {recorded} recorded: truncated?)"
            if _file_digest(path) != expected.get("sha256"):
                return f"{path} does not match its checksum (its content changed: corrupt)"
        except OSError as error:
            return f"{path} cannot be read ({error.strerror or error})"
    return None


def save_checkpoint(
    directory: str,
    step: int,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    record: Mapping[str, str] | None = None,
    loss_scale: Mapping[str, torch.Tensor] | None = None,
) -> None:
    """``step`` is the number of optimizer steps taken; resuming starts at that step.

    ``record`` (schedlang.runtime.checkpoint_manifest.run_record) is saved with the tensors, and so is
    ``loss_scale`` (``LossScaler.state_dict()``, the same on every rank).
    """
    model_state, optimizer_state = get_state_dict(model, optimizer)
    target = checkpoint_path(directory, step)
    state = {"model": model_state, "optimizer": optimizer_state}
    if record is not None:
        state[RUN_RECORD_KEY] = dict(record)
    if loss_scale is not None:
        state[LOSS_SCALE_KEY] = dict(loss_scale)
    dcp.save(state, checkpoint_id=str(target))
    _barrier()
    if _is_rank_zero():
        for path in (Path(directory), target, *target.iterdir()):
            _remove_foreign_write(path)
        write_checksums(target)
        # renamed into place, never written through a link; group and others never get write permission
        write_replacing(Path(directory) / LATEST_FILE, target.name + "\n", mode=TRUSTED_FILE_MODE)
    _barrier()


def latest_step(directory: str) -> int | None:
    """The step ``latest`` names; None when there is no ``latest``, or it does not name a step directory.

    ``latest`` is read bounded, as a regular file only (:class:`CheckpointError` for a FIFO or a device).
    """
    latest = Path(directory) / LATEST_FILE
    try:
        name = read_bounded_text(latest, MAX_LATEST_BYTES, "checkpoint file").strip()
    except UnsafeFileError as error:
        raise CheckpointError(str(error)) from None
    except (OSError, UnicodeDecodeError):
        return None
    match = STEP_DIRECTORY.fullmatch(name)
    return int(match.group(1)) if match else None


def candidate_steps(directory: str) -> list[int]:
    """Steps to try, newest first: the one ``latest`` names, then every earlier step directory.

    Step directories newer than ``latest`` are saves a kill interrupted. Without a ``latest`` file there is
    no complete checkpoint; with one that names no step directory, every step directory is a candidate.
    """
    root = Path(directory)
    latest = root / LATEST_FILE
    if not os.path.lexists(root):
        return []
    check_trusted(root)  # [Note: checkpoint trust boundary]: before anything in it is opened
    if not os.path.lexists(latest):
        return []
    check_trusted(latest)
    newest = latest_step(directory)
    steps = sorted(
        (int(match.group(1)) for entry in root.iterdir() if (match := STEP_DIRECTORY.fullmatch(entry.name))),
        reverse=True,
    )
    if newest is None:
        return steps
    return [newest] + [step for step in steps if step < newest]


def _read_record(step_directory: Path, keys) -> dict[str, str]:
    reader = dcp.FileSystemReader(str(step_directory))
    stored = reader.read_metadata().state_dict_metadata
    present = [key for key in keys if f"{RUN_RECORD_KEY}.{key}" in stored]
    record = {RUN_RECORD_KEY: {key: "" for key in present}}
    if present:
        dcp.load(record, checkpoint_id=str(step_directory))
    return record[RUN_RECORD_KEY]


def _load_tensors(
    step_directory: Path,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    loss_scale: Mapping[str, torch.Tensor] | None = None,
) -> None:
    model_state, optimizer_state = get_state_dict(model, optimizer)
    # Hyperparameters come from the schedule, not the checkpoint: the flattened
    # param_groups DCP reads back lose tuple-valued entries such as Adam's betas.
    param_groups = copy.deepcopy(optimizer_state["param_groups"])
    state = {"model": model_state, "optimizer": optimizer_state}
    if loss_scale is not None:
        stored = dcp.FileSystemReader(str(step_directory)).read_metadata().state_dict_metadata
        saved = {key: tensor for key, tensor in loss_scale.items() if f"{LOSS_SCALE_KEY}.{key}" in stored}
        if saved:
            state[LOSS_SCALE_KEY] = saved  # loaded in place
    dcp.load(state, checkpoint_id=str(step_directory))
    state["optimizer"]["param_groups"] = param_groups
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"])


def _unreadable_file(step_directory: Path) -> Path:
    """The file to name when a checkpoint does not load: its metadata, or the directory when that is missing."""
    metadata = step_directory / ".metadata"
    return metadata if metadata.exists() else step_directory


def complete_steps(directory: str) -> list[int]:
    """Steps of ``directory`` whose save finished (torch wrote ``.metadata``), newest first; looks at names only."""
    root = Path(directory)
    if not root.is_dir():
        return []
    found = (STEP_DIRECTORY.fullmatch(entry.name) for entry in root.iterdir())
    steps = [int(match.group(1)) for match in found if match]
    return sorted((step for step in steps if os.path.lexists(checkpoint_path(directory, step) / METADATA_FILE)),
                  reverse=True)


def refuse_overwriting(directory: str) -> None:
    """:class:`CheckpointError` when a run that resumes nothing would write over ``directory``'s complete
    checkpoints ([Note: no overwriting another run's checkpoints])."""
    steps = complete_steps(directory)
    if steps:
        name = checkpoint_path(directory, steps[0]).name
        raise CheckpointError(
            f"{directory} holds checkpoints ({name}, {len(steps)} in all) but no '{LATEST_FILE}' names one, so this "
            f"run would start from the seed and write over them; to start fresh, give train.checkpoint another "
            f"directory (or move {directory} away); to resume, write {name} into {Path(directory) / LATEST_FILE}"
        )


def load_checkpoint(
    directory: str,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    record: Mapping[str, str] | None = None,
    say: Callable[[str], None] | None = None,
    loss_scale: Mapping[str, torch.Tensor] | None = None,
) -> int:
    """Load the newest complete checkpoint in place; returns its step (0 when there is none).

    Before anything is read, every path is checked ([Note: checkpoint trust boundary]); before any
    tensor is loaded, the checkpoint's run record is compared with ``record``
    (:class:`CheckpointMismatchError` naming the first key that differs). An unreadable checkpoint is
    reported through ``say`` in one line and the next earlier one is tried.
    """
    candidates = candidate_steps(directory)
    if not candidates:
        refuse_overwriting(directory)
        return 0
    for step in candidates:
        step_directory = checkpoint_path(directory, step)
        if not step_directory.is_dir():
            if say is not None:
                say(f"schedlang: checkpoint {step_directory} is missing; trying an earlier one")
            continue
        check_trusted_checkpoint(step_directory)
        problem = checksum_problem(step_directory)
        if problem is not None:
            if say is not None:
                say(f"schedlang: checkpoint {problem}; trying an earlier one")
            continue
        try:
            if record is not None:
                recorded = _read_record(step_directory, record)
                mismatch = first_mismatch(recorded, dict(record))
                if mismatch is not None:
                    key, was, now = mismatch
                    raise CheckpointMismatchError(
                        f"checkpoint {step_directory} was written for {key} = {was}, "
                        f"but this schedule has {key} = {now}"
                    )
            _load_tensors(step_directory, model, optimizer, loss_scale)
        except CheckpointError:
            raise
        except (Exception, CheckpointException) as error:  # any failure to read a checkpoint is reported alike
            if say is not None:
                reason = str(error).strip().splitlines()[-1] if str(error).strip() else type(error).__name__
                say(f"schedlang: checkpoint {_unreadable_file(step_directory)} cannot be read ({reason[:200]}); "
                    "trying an earlier one")
            continue
        return step
    raise CheckpointError(f"no checkpoint in {directory} can be read; move the directory away to start afresh")


def resume_or_exit(
    directory: str,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    record: Mapping[str, str] | None,
    steps: int | None,
    loss_scale: Mapping[str, torch.Tensor] | None = None,
) -> int:
    """What a training script does before its first step: load, say where it resumes, or stop cleanly.

    Rank 0 prints ``resuming from step N of <checkpoint>``. A refused or unreadable checkpoint, and a
    ``steps`` the checkpoint has already reached, end the process with ``SystemExit``: one line on rank 0
    and exit status 1 on every rank, not a traceback per rank.
    """
    rank_zero = _is_rank_zero()

    def say(line: str) -> None:
        if rank_zero:
            print(line, file=sys.stderr, flush=True)

    try:
        step = load_checkpoint(directory, model, optimizer, record, say, loss_scale)
    except CheckpointError as error:
        raise SystemExit(f"schedlang: error: {error}" if rank_zero else 1) from None
    if step and rank_zero:
        print(f"schedlang: resuming from step {step} of {checkpoint_path(directory, step)}", flush=True)
    if step and steps is not None and step >= steps:
        raise SystemExit(
            f"schedlang: error: {checkpoint_path(directory, step)} has already trained {step} steps and --steps "
            f"is {steps}: nothing to train (give a larger --steps to go on)"
            if rank_zero
            else 1
        )
    return step


def read_run_record(step_directory: Path, keys) -> dict[str, str]:
    """The run record ``step_directory`` holds for those of ``keys`` it has, read without any tensor: what
    ``schedlang run`` compares before it starts the ranks (schedlang.resume_preflight)."""
    return _read_record(Path(step_directory), keys)
