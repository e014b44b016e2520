"""Per-stage orders <-> the CSV that torch.distributed.pipelining's schedule runtime loads.

torch's ``_PipelineScheduleRuntime._load_csv`` (``format="compute_only"``)
reads one row per pipeline rank; each cell is parsed by ``_Action.from_str``:
``<stage><F|B|I|W><microbatch>`` such as ``0F1``, and an empty cell is
``None``, an idle step. torch's ``B`` is a full backward; a split backward is
``I`` (``BACKWARD_INPUT``, the input gradients) and ``W``
(``BACKWARD_WEIGHT``). A schedule whose orders hold ``W`` tasks
(``pipeline { split_backward = true }``) is written with its ``B`` tasks as
``I`` and its ``W`` tasks as ``W``; reading such a file gives ``B`` and ``W``
tasks back (:func:`splits_backward` tells the orders of a split program by
their ``W`` tasks). A file that mixes ``B`` with ``I`` or ``W``, or has ``I``
without ``W``, is refused: schedlang splits every backward or none. Columns are lockstep time steps: in the schedules torch generates,
rank ``r`` leaves a cell empty while the task it runs next is still waiting
for its inputs, so reading a column shows what every rank does at that step.

[Note: chunks as torch microbatches] The actions of torch have no field for a sequence chunk, so a schedule of
``N`` chunks per microbatch is written with each (microbatch ``a``, chunk ``i``) pair as torch microbatch
``a * N + i`` (:func:`torch_microbatch`); ``N = 1`` is the plain mapping. The recurrent-state order between
a microbatch's chunks (Eq. 8's state edges) is kept by the order of the actions in each row, which the
step grid respects; torch itself sees independent microbatches. Reading the file back with the same ``N``
(:func:`parse_torch_csv`) gives the chunked orders again.

Contract of :func:`torch_csv_rows`: input is one program order per stage
(stage ``r`` runs on rank ``r``, as everywhere in schedlang) and the chunk count;
output is the step grid, each rank's tasks in their
program order with ``None`` where a lockstep simulation (every task takes one
step and may start once its Eq. 8 dependencies, state edges included, finished in earlier steps)
makes the rank wait. :func:`load_torch_csv` is its inverse: it drops the idle
cells and returns the orders.
"""

from __future__ import annotations

import csv
import io
import re
from collections.abc import Sequence
from pathlib import Path

from schedlang.lowering.graph import task_predecessors
from schedlang.vocabulary.actions import ActionKind, TaskId
from schedlang.vocabulary.files import UnsafeFileError, read_bounded

StepGrid = tuple[tuple[TaskId | None, ...], ...]

MAX_TORCH_CSV_BYTES = 16 << 20
"""The largest schedule CSV `schedlang import` reads (torch's for 64 ranks of thousands of actions is well under
1 MiB)."""

_TORCH_COMPUTE_ACTION = re.compile(r"^(\d+)([FBIW])(\d+)$")
_TORCH_KIND = {"F": ActionKind.FORWARD, "B": ActionKind.BACKWARD, "I": ActionKind.BACKWARD, "W": ActionKind.WEIGHT}
_SPLIT_BACKWARD_INPUT = "I"
"""torch's ``BACKWARD_INPUT``: what a split program's ``B`` task is called in the CSV."""
_TORCH_DROPPED_ACTION = re.compile(r"^(\d+)(REDUCE_GRAD|UNSHARD|RESHARD)(\d*)$")
"""torch's end-of-step gradient reduction and FSDP actions (its GPipe and 1F1B orders end in ``REDUCE_GRAD``):
read and dropped, since schedlang reduces gradients itself and does not shard parameters."""
_TORCH_ANY_ACTION = re.compile(r"^(\d+)(F|I|B|W|UNSHARD|RESHARD|REDUCE_GRAD|SEND_F|RECV_F|SEND_B|RECV_B)(\d*)$")


class TorchCsvError(ValueError):
    """A schedule that cannot be written as, or a file that cannot be read as, a torch schedule CSV."""


def splits_backward(orders: Sequence[Sequence[TaskId]]) -> bool:
    """Whether the orders are a split backward's: they hold ``W`` tasks."""
    return any(task.kind is ActionKind.WEIGHT for order in orders for task in order)


def torch_microbatch(task: TaskId, n_chunks: int = 1) -> int:
    """The torch microbatch of a task: ``microbatch * n_chunks + chunk`` ([Note: chunks as torch microbatches])."""
    return task.microbatch * n_chunks + task.chunk


def torch_action_text(task: TaskId, split_backward: bool = False, n_chunks: int = 1) -> str:
    """The torch action for a task: ``1F0.0`` -> ``1F0``, and with 4 chunks ``1F2.3`` -> ``1F11``; with
    ``split_backward``, ``1B0.0`` -> ``1I0`` (torch's ``BACKWARD_INPUT``) and ``1W0.0`` -> ``1W0``."""
    letter = _SPLIT_BACKWARD_INPUT if split_backward and task.kind is ActionKind.BACKWARD else task.kind.value
    return f"{task.stage}{letter}{torch_microbatch(task, n_chunks)}"


def _dependencies(task: TaskId, n_stages: int, n_chunks: int) -> list[TaskId]:
    """Eq. 8: stage-to-stage, F before B, B before W, and the state edges between a microbatch's chunks."""
    return [predecessor for predecessor, _ in task_predecessors(task, n_stages, n_chunks)]


def _check_exportable(orders: Sequence[Sequence[TaskId]], n_chunks: int) -> None:
    if n_chunks < 1:
        raise TorchCsvError(f"a schedule has at least one chunk per microbatch, got {n_chunks}")
    for stage, order in enumerate(orders):
        for task in order:
            if not 0 <= task.chunk < n_chunks:
                raise TorchCsvError(f"task {task} names chunk {task.chunk} but the schedule has {n_chunks}")
            if task.stage != stage:
                raise TorchCsvError(
                    f"task {task} is in stage {stage}'s order; each stage may only run its own tasks"
                )


def torch_csv_rows(orders: Sequence[Sequence[TaskId]], n_chunks: int = 1) -> StepGrid:
    """Lay the orders out on a lockstep step grid (see the module docstring).

    Raises :class:`TorchCsvError` when a task names a chunk outside ``n_chunks`` or runs on another stage's
    rank, and when some rank can never make progress (the order deadlocks or waits for a task no stage runs).
    """
    _check_exportable(orders, n_chunks)
    n_stages = len(orders)
    next_position = [0] * n_stages
    finished_step: dict[TaskId, int] = {}
    rows: list[list[TaskId | None]] = [[] for _ in range(n_stages)]
    step = 0
    while any(next_position[stage] < len(orders[stage]) for stage in range(n_stages)):
        started: list[TaskId] = []
        for stage in range(n_stages):
            if next_position[stage] >= len(orders[stage]):
                rows[stage].append(None)
                continue
            task = orders[stage][next_position[stage]]
            dependencies = _dependencies(task, n_stages, n_chunks)
            ready = all(finished_step.get(dependency, step) < step for dependency in dependencies)
            rows[stage].append(task if ready else None)
            if ready:
                started.append(task)
                next_position[stage] += 1
        if not started:
            raise TorchCsvError(_stuck_message(orders, next_position, finished_step, n_stages, n_chunks, step))
        for task in started:
            finished_step[task] = step
        step += 1
    return tuple(tuple(row) for row in rows)


def _stuck_message(
    orders: Sequence[Sequence[TaskId]],
    next_position: list[int],
    finished_step: dict[TaskId, int],
    n_stages: int,
    n_chunks: int,
    step: int,
) -> str:
    waiting = []
    for stage, order in enumerate(orders):
        if next_position[stage] < len(order):
            task = order[next_position[stage]]
            missing = [
                str(dependency)
                for dependency in _dependencies(task, n_stages, n_chunks)
                if dependency not in finished_step
            ]
            waiting.append(f"rank {stage} waits to run {task} for {', '.join(missing)}")
    return (
        f"the orders cannot be laid out on torch's step grid: at step {step} no rank can make progress "
        f"({'; '.join(waiting)}); run `schedlang check` for the full diagnosis"
    )


def torch_csv_text(orders: Sequence[Sequence[TaskId]], n_chunks: int = 1) -> str:
    """The CSV text: one row per rank, one column per step, empty cells idle; ``B`` as ``I`` when the orders
    hold ``W`` tasks; chunk ``i`` of microbatch ``a`` as torch microbatch ``a * n_chunks + i``."""
    split = splits_backward(orders)
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    for row in torch_csv_rows(orders, n_chunks):
        writer.writerow(["" if task is None else torch_action_text(task, split, n_chunks) for task in row])
    return buffer.getvalue()


def write_torch_csv(orders: Sequence[Sequence[TaskId]], path: str | Path, n_chunks: int = 1) -> None:
    Path(path).write_text(torch_csv_text(orders, n_chunks))


def _parse_cell(text: str, rank: int, location: str, n_chunks: int) -> tuple[TaskId, str]:
    """The task and torch's letter for it (``B`` and ``I`` both give a ``B`` task); torch microbatch ``m`` is
    chunk ``m % n_chunks`` of microbatch ``m // n_chunks``."""
    match = _TORCH_COMPUTE_ACTION.match(text)
    if match is None:
        if _TORCH_ANY_ACTION.match(text) is not None:
            reason = (
                "it is a communication or sharding action; load a compute_only CSV (cells F, B, I and W only), "
                "schedlang places communication itself"
            )
        else:
            reason = "expected <stage><F|B|I|W><microbatch>, e.g. 0F1"
        raise TorchCsvError(f"{location}: error: cannot read action {text!r}: {reason}")
    stage, letter, microbatch = match.groups()
    if int(stage) != rank:
        raise TorchCsvError(
            f"{location}: error: action {text!r} runs stage {stage} on rank {rank}; schedlang runs stage r "
            "on rank r (one stage per rank), so torch's interleaved or looped schedules, which put several "
            "virtual stages on a rank, cannot be imported"
        )
    microbatch, chunk = divmod(int(microbatch), n_chunks)
    return TaskId(_TORCH_KIND[letter], rank, microbatch, chunk), letter


def parse_torch_csv(text: str, source_name: str = "<csv>", n_chunks: int = 1) -> tuple[tuple[TaskId, ...], ...]:
    """Per-stage orders from CSV text; the inverse of :func:`torch_csv_text` with the same ``n_chunks``.

    ``I`` cells become ``B`` tasks and ``W`` cells ``W`` tasks (a split program's orders), and
    ``REDUCE_GRAD``, ``UNSHARD`` and ``RESHARD`` cells are dropped; raises
    :class:`TorchCsvError` for a file that mixes full (``B``) and split (``I``, ``W``) backwards or has ``I``
    cells but no ``W`` cell.
    """
    orders = []
    first_of_letter: dict[str, str] = {}
    for rank, row in enumerate(csv.reader(io.StringIO(text))):
        order = []
        for column, cell in enumerate(row):
            cell_text = cell.strip()
            if cell_text and not _TORCH_DROPPED_ACTION.match(cell_text):
                location = f"{source_name}:{rank + 1}: cell {column + 1}"
                task, letter = _parse_cell(cell_text, rank, location, n_chunks)
                first_of_letter.setdefault(letter, location)
                order.append(task)
        orders.append(tuple(order))
    if not first_of_letter:
        raise TorchCsvError(
            f"{source_name}: error: no compute action (a cell like 0F0, 0B0, 0I0 or 0W0) in {len(orders)} rows: "
            "not a torch schedule CSV"
        )
    _check_backward_kinds(first_of_letter)
    return tuple(orders)


def _check_backward_kinds(first_of_letter: dict[str, str]) -> None:
    """Full backwards or split ones, not both; a split one has W tasks."""
    split_letters = [letter for letter in ("I", "W") if letter in first_of_letter]
    if "B" in first_of_letter and split_letters:
        letter = split_letters[0]
        raise TorchCsvError(
            f"{first_of_letter['B']}: error: a full backward (B) in a file with split backwards "
            f"({letter}, first at {first_of_letter[letter]}); schedlang splits every backward of a schedule or "
            "none (pipeline { split_backward = true }): write I and W for every backward, or B for every one"
        )
    if "I" in first_of_letter and "W" not in first_of_letter:
        raise TorchCsvError(
            f"{first_of_letter['I']}: error: the file splits backwards (I, the input gradients) but has no W "
            "(weight gradient) action; a split backward needs a W for every I"
        )


def load_torch_csv(path: str | Path, n_chunks: int = 1) -> tuple[tuple[TaskId, ...], ...]:
    """Per-stage orders from a torch schedule CSV file, torch microbatches read as ``n_chunks`` chunks each;
    :class:`TorchCsvError` naming the file for one that is missing, unreadable, not a regular file, larger than
    ``MAX_TORCH_CSV_BYTES`` or not UTF-8 (at its line)."""
    try:
        data = read_bounded(path, MAX_TORCH_CSV_BYTES, "schedule CSV")
    except FileNotFoundError:
        raise TorchCsvError(f"{path}: error: no such file") from None
    except UnsafeFileError as error:
        raise TorchCsvError(f"{path}: error: {error}") from None
    except OSError as error:
        raise TorchCsvError(f"{path}: error: cannot be read: {error.strerror or error}") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as error:
        line = data[: error.start].count(b"\n") + 1
        raise TorchCsvError(
            f"{path}:{line}: error: byte 0x{data[error.start]:02x} is not valid UTF-8; a torch schedule CSV is text"
        ) from None
    return parse_torch_csv(text, str(Path(path)), n_chunks)
