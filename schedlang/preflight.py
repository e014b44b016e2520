"""What ``schedlang check`` and ``run`` check about the schedule's files before anything launches.

The schedule's paths are resolved by the one rule of schedlang.lowering.paths (relative to the schedule
file). Every problem :func:`schedlang.runtime.data.data_problem` finds with the data (no such file, a
directory, a pipe or a device, unreadable, empty, shorter than one sequence, a size that is not a whole
number of token ids, an id outside the vocabulary) is an error at the ``train.data`` key's path (or at the
key), and a ``document_end`` that is no token of the vocabulary or of the tokenizer is one at that argument:
a pipe would block every rank, a device fill its memory, a bad id fail deep inside the embedding.

:func:`with_document_pieces` measures, for ``schedlang simulate``, how many document pieces a chunk of packed
data can hold, which the memory and cost models size the recurrent operators' padded rows by.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

from schedlang.diagnostics import Diagnostic, ScheduleError
from schedlang.lowering import paths
from schedlang.vocabulary import Span

MAX_TIMEOUT_S = 7 * 24 * 3600.0
MIN_TIMEOUT_S = 10.0  # the ranks' rendezvous and first collectives must fit in it, on a loaded machine too


def data_config(program):
    """The runtime's ``DataConfig`` of the schedule's data, its paths resolved."""
    from schedlang.vocabulary import DataConfig

    data = program.train.data
    return DataConfig(
        data.kind,
        data.seed,
        paths.data_path(program),
        data.dtype,
        paths.tokenizer_path(program),
        data.validation,
        data.document_end,
    )


def check_data_file(program, text: str) -> None:
    """Raise ``ScheduleError`` at the data key when the schedule's data cannot feed its model."""
    from schedlang.runtime.data import data_problem, document_end_problem

    config = data_config(program)
    problem = document_end_problem(config, program.model.vocab)
    if problem is not None:
        span = program.spans.get("train.data.document_end") or program.spans.get("train.data")
        span = span or Span(program.source_file, 1, 1, 1, 2)
        raise ScheduleError([Diagnostic.error(problem, span)], {span.file: text})
    problem = data_problem(config, program.model.vocab, program.sequence.length)
    if problem is not None:
        span = program.spans.get("train.data.path") or program.spans.get("train.data")
        span = span or Span(program.source_file, 1, 1, 1, 2)
        hint = missing_file_hint(program, problem)
        raise ScheduleError([Diagnostic.error(problem, span, hint)], {span.file: text})


def missing_file_hint(program, problem: str) -> str | None:
    """For a data or tokenizer file that does not exist: where relative paths are read from, and the data
    that needs no file; None for other problems."""
    if not problem.endswith("does not exist"):
        return None
    source = program.source_file
    where = "the current directory" if source.startswith("<") else Path(source).resolve().parent
    return (
        f"a relative path is read from the schedule file's directory ({where}); "
        "`data = synthetic(seed = 1)` trains on generated tokens without a file"
    )


def check_tensorboard(program, text: str) -> None:
    """Raise ``ScheduleError`` at ``train.log`` when it asks for TensorBoard and the package is missing."""
    import importlib.util

    if program.train.tensorboard_directory is None or importlib.util.find_spec("tensorboard") is not None:
        return
    span = program.spans.get("train.log") or Span(program.source_file, 1, 1, 1, 2)
    message = "train.log = tensorboard(...) writes through the tensorboard package, which is not installed"
    raise ScheduleError([Diagnostic.error(message, span, "pip install tensorboard")], {span.file: text})


def will_resume(program) -> bool:
    """Whether the schedule's checkpoint directory holds a checkpoint its run would resume from."""
    directory = paths.checkpoint_directory(program)
    return directory is not None and (Path(directory) / "latest").exists()


def timeout_problem(timeout_s: float) -> str | None:
    """Why ``--timeout`` is unusable: not a positive, finite number of seconds up to a week, or too short for the
    ranks to meet (:data:`MIN_TIMEOUT_S`)."""
    if not math.isfinite(timeout_s) or timeout_s <= 0 or timeout_s > MAX_TIMEOUT_S:
        return f"--timeout must be a number of seconds above 0 and at most {MAX_TIMEOUT_S:.0f}, got {timeout_s}"
    if timeout_s < MIN_TIMEOUT_S:
        return (
            f"--timeout {timeout_s:g} is too short for the ranks to meet (their rendezvous alone can take "
            f"seconds); give at least {MIN_TIMEOUT_S:g}"
        )
    return None


_measured_pieces: dict[tuple, int] = {}
"""Pieces per chunk length already measured, by data file (its config, size and modification time) and length:
``simulate --chunks`` and ``--fit`` ask again for the lengths their variants share."""


def measure_document_pieces(program, chunk_lengths) -> None:
    """Measure the document pieces of those of ``chunk_lengths`` not measured before when the program's data
    packs documents (:func:`schedlang.runtime.data.most_document_pieces`: one pass over the file for all of
    them), for :func:`with_document_pieces` to read. The data must be usable (:func:`check_data_file`)."""
    from schedlang.runtime.data import most_document_pieces

    config = data_config(program)
    if config.document_end is None:
        return
    identity = _data_identity(config)
    missing = sorted({length for length in chunk_lengths if (identity, length) not in _measured_pieces})
    measured = most_document_pieces(config, missing) if missing else None
    _measured_pieces.update({(identity, length): pieces for length, pieces in (measured or {}).items()})


def with_document_pieces(program):
    """``program`` with ``document_pieces`` for its chunk lengths (:func:`measure_document_pieces`) when its data
    packs documents, else ``program`` unchanged."""
    import dataclasses

    from schedlang.lowering.program import DocumentPieces

    lengths = sorted({program.sequence.chunk_length(chunk) for chunk in range(program.n_chunks)})
    measure_document_pieces(program, lengths)
    identity = _data_identity(data_config(program))
    if any((identity, length) not in _measured_pieces for length in lengths):  # no packed documents
        return program
    pieces = DocumentPieces(tuple((length, _measured_pieces[identity, length]) for length in lengths))
    return dataclasses.replace(program, document_pieces=pieces)


def _data_identity(config) -> tuple:
    """What the measured pieces of ``config``'s data are kept under: the config, and a file's size and time."""
    if config.path is None:
        return (config,)
    info = os.stat(config.path)
    return (config, info.st_size, info.st_mtime_ns)
