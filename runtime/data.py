"""Training data that is identical for every mesh and schedule given the seed.

A step's global batch is a deterministic function of ``(seed, step)`` alone:
every rank builds the same ``[global_batch, length + 1]`` token matrix and
takes the rows of its data-parallel replica, so a run on one device and a run
on any mesh see exactly the same tokens, and a resumed run sees the same
tokens as an uninterrupted one.

``synthetic``: each sequence repeats a random pattern of ``RECALL_PERIOD``
tokens drawn from the first ``SYNTHETIC_ALPHABET`` token ids. Predicting a
token needs the token one period back, so the first period of every sequence
chunk can only be predicted through the recurrent state handed over from the
previous chunk: a broken state hand-off shows up as a higher loss. The small
alphabet gives the loss an early, visible fall (from ln(vocab) towards
ln(alphabet)) before recall sets in.

``bytes``: byte-level language modelling over a text file; with no path, the
Python standard library's own ``.py`` sources, read in sorted order, which
exist on every machine that runs this code.

``tokens``: a flat file of token ids, ``uint16`` or ``uint32``, no header (the
layout nanoGPT and Megatron's ``.bin`` files use), memory-mapped, so a corpus
larger than memory costs only the pages a step reads. Each sequence starts at a
position drawn from the step's generator, as for ``bytes``. ``text``: a text
file tokenised once into such a file (schedlang.runtime.text_data), then read
the same way.

:func:`data_problem` is the one rule for what makes a data source unusable (no
such file, not a regular file, empty, shorter than one sequence, a size that is
not a whole number of ids, an id outside the vocabulary); ``schedlang check``
and ``run`` ask it before any rank starts, and :class:`TokenSource` raises with
its message if a rank still meets one.

``document_end`` (``bytes``, ``tokens``, ``text``): the token id that ends each document packed into the
stream (for ``text``, or the tokenizer's name of that token); the layers then keep packed documents apart
([Note: packed documents] in :mod:`schedlang.runtime.packing`) and :meth:`TokenSource.loss_tokens` counts the
targets of a global batch that carry a loss.
"""

from __future__ import annotations

import os
import stat
import sysconfig
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np
import torch

from schedlang.runtime.packing import loss_token_count
from schedlang.vocabulary import DataConfig, DataKind, TokenFileDType
from schedlang.vocabulary.files import read_bounded

RECALL_PERIOD = 24
SYNTHETIC_ALPHABET = 32
BYTE_VOCAB = 256
DEFAULT_CORPUS_LIMIT_BYTES = 16 * 1024 * 1024
MAX_BYTES_CORPUS = 1 << 32  # a bytes(path) corpus is held in memory; larger data belongs in a tokens file
TOKEN_NUMPY_TYPES = {TokenFileDType.UINT16: np.dtype("<u2"), TokenFileDType.UINT32: np.dtype("<u4")}
VALIDATION_STREAM = 0x9E3779B9  # validation seeds start this far past step 0's (torch seeds its CPU generator
# from the low 32 bits, so the offset must show there); no run trains 2.6e9 steps
SCAN_BLOCK_TOKENS = 1 << 24  # ids read at a time when a tokens file is scanned for ids outside the vocabulary


def step_generator(seed: int, step: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed * 1_000_003 + step)


def validation_generator(seed: int, index: int) -> torch.Generator:
    """A stream of its own for validation batches, disjoint from every training step's."""
    return torch.Generator().manual_seed(seed * 1_000_003 + VALIDATION_STREAM + index)


def validation_size(n_tokens: int, fraction: float) -> int:
    """How many of a file's ``n_tokens`` the last ``fraction`` holds out for validation."""
    return int(n_tokens * fraction)


def default_corpus_files() -> list[Path]:
    """The standard library's ``.py`` files, in a fixed order."""
    root = Path(sysconfig.get_paths()["stdlib"])
    return sorted(path for path in root.rglob("*.py") if "site-packages" not in path.parts)


class DataFileError(ValueError):
    """A data path that is not a readable regular file; the message is one line naming it."""


def data_file_problem(path: str, what: str = "data file") -> str | None:
    """Why ``path`` cannot be a corpus (``what``: how messages name it), or None when it is a readable
    regular file.

    Only regular files are read: a FIFO would block the rank forever and a device such as ``/dev/zero``
    would be read until memory runs out. ``stat`` does not open the file, so asking never blocks.
    """
    try:
        info = os.stat(path)
    except FileNotFoundError:
        return f"{what} {path} does not exist"
    except OSError as error:
        return f"{what} {path} cannot be read: {error.strerror or error}"
    if stat.S_ISDIR(info.st_mode):
        return f"{what} {path} is a directory; name a text file in it"
    if not stat.S_ISREG(info.st_mode):
        return f"{what} {path} is not a regular file (a pipe, socket or device); copy the data into a file"
    if not os.access(path, os.R_OK):
        return f"{what} {path} cannot be read: permission denied"
    return None


def tokens_of(config: DataConfig) -> DataConfig:
    """``config`` as the tokens file its ranks read: text data tokenised (once: the cache of
    :mod:`schedlang.runtime.text_data`), other kinds as they are. Raises what the tokenizer raises."""
    if config.kind is not DataKind.TEXT:
        return config
    from schedlang.runtime.text_data import ensure_tokenised

    from schedlang.runtime.text_data import token_id

    cached = ensure_tokenised(config.path, config.tokenizer)
    document_end = config.document_end
    if isinstance(document_end, str):
        document_end = token_id(config.tokenizer, document_end)
    return DataConfig(
        DataKind.TOKENS, config.seed, str(cached), TokenFileDType.UINT32, None, config.validation, document_end
    )


def data_problem(config: DataConfig, vocab: int, length: int, scan_ids: bool = True) -> str | None:
    """Why ``config`` cannot feed sequences of ``length + 1`` tokens to a model of ``vocab`` ids; None when it
    can. With ``scan_ids`` it reads the whole of a tokens file (in blocks) to find ids outside the vocabulary;
    without, only the file's size and kind are looked at."""
    if config.kind is DataKind.SYNTHETIC:
        return None
    if config.kind is DataKind.BYTES and vocab < BYTE_VOCAB:
        return f"bytes data needs a vocabulary of at least {BYTE_VOCAB}, the model has {vocab}"
    problem = document_end_problem(config, vocab)
    if problem is not None:
        return problem
    if config.path is None:
        return None if config.kind is DataKind.BYTES else f"{config.kind.value} data needs a file"
    problem = data_file_problem(config.path)
    if problem is None and config.kind is DataKind.TEXT:
        problem = data_file_problem(config.tokenizer, "tokenizer file")
    if problem is not None:
        return problem
    if config.kind is DataKind.TEXT:
        from schedlang.runtime.text_data import TokenizerUnavailableError

        try:
            tokens = tokens_of(config)
        except TokenizerUnavailableError as error:
            return str(error)
        problem = data_problem(tokens, vocab, length, scan_ids)
        named = f"the text {config.path} tokenised by {config.tokenizer}"
        return None if problem is None else problem.replace(f"data file {tokens.path}", named)
    size = os.stat(config.path).st_size
    item = 1 if config.kind is DataKind.BYTES else TOKEN_NUMPY_TYPES[config.dtype].itemsize
    if size == 0:
        return f"data file {config.path} is empty"
    if size % item:
        return (
            f"data file {config.path} has {size} bytes, not a whole number of {config.dtype.value} token ids "
            f"({item} bytes each): is the dtype right?"
        )
    held_out = validation_size(size // item, config.validation)
    unit = "bytes" if config.kind is DataKind.BYTES else "token ids"
    if size // item - held_out <= length + 1:
        part = "" if not held_out else f" before its last {held_out} held out for validation"
        return f"data file {config.path} holds {size // item - held_out} {unit}{part}, fewer than one sequence of {length + 1}"
    if config.validation and held_out <= length + 1:
        return (
            f"the validation part of data file {config.path} (validation = {config.validation:g}) holds {held_out} "
            f"{unit}, fewer than one sequence of {length + 1}: hold out more"
        )
    if config.kind is DataKind.TOKENS and scan_ids:
        return _id_outside_vocabulary(config, vocab)
    return None


def document_end_problem(config: DataConfig, vocab: int) -> str | None:
    """Why ``config.document_end`` cannot end documents: a name the text data's tokenizer does not hold, an id
    outside the model's vocabulary, or (bytes data) not a byte; None when it can, or when there is none. A
    tokenizer file that cannot be read is :func:`data_problem`'s to report."""
    end = config.document_end
    if end is None:
        return None
    if isinstance(end, str):
        if config.kind is not DataKind.TEXT:
            return f"document_end = {end!r} names a token, which only text data's tokenizer resolves: give an id"
        if config.tokenizer is None or data_file_problem(config.tokenizer) is not None:
            return None
        from schedlang.runtime.text_data import TokenizerUnavailableError, token_id

        try:
            end = token_id(config.tokenizer, end)
        except TokenizerUnavailableError as error:
            return str(error)
    if config.kind is DataKind.BYTES and not 0 <= end < BYTE_VOCAB:
        return f"document_end = {end} is not a byte (0 .. {BYTE_VOCAB - 1}), and bytes data holds only bytes"
    if not 0 <= end < vocab:
        return f"document_end = {end} is not a token id of the model's vocabulary (0 .. {vocab - 1})"
    return None


def _id_outside_vocabulary(config: DataConfig, vocab: int) -> str | None:
    ids = np.memmap(config.path, dtype=TOKEN_NUMPY_TYPES[config.dtype], mode="r")
    for start in range(0, ids.size, SCAN_BLOCK_TOKENS):
        block = np.asarray(ids[start : start + SCAN_BLOCK_TOKENS])
        outside = np.flatnonzero(block >= vocab)
        if outside.size:
            position = start + int(outside[0])
            return (
                f"data file {config.path} holds token id {int(ids[position])} at position {position}, but "
                f"model.vocab = {vocab}: is the dtype right, or the vocabulary too small?"
            )
    return None


def read_corpus(path: str | None, limit_bytes: int = DEFAULT_CORPUS_LIMIT_BYTES) -> torch.Tensor:
    """The corpus as token ids: the file at ``path`` (a regular file, else :class:`DataFileError`), or with no
    path the first ``limit_bytes`` of the default corpus."""
    return torch.frombuffer(bytearray(corpus_bytes(path, limit_bytes)), dtype=torch.uint8).to(torch.long)


def corpus_bytes(path: str | None, limit_bytes: int = DEFAULT_CORPUS_LIMIT_BYTES) -> bytes:
    """The bytes :func:`read_corpus` reads."""
    if path is not None:
        problem = data_file_problem(path)
        if problem is not None:
            raise DataFileError(problem)
        try:
            return read_bounded(path, MAX_BYTES_CORPUS, "data file")
        except OSError as error:
            raise DataFileError(f"data file {path} cannot be read: {error.strerror or error}") from None
    pieces, total = [], 0
    for file in default_corpus_files():
        content = file.read_bytes()
        pieces.append(content)
        total += len(content)
        if total >= limit_bytes:
            break
    return b"".join(pieces)[:limit_bytes]


def most_document_pieces(config: DataConfig, chunk_lengths: Iterable[int]) -> dict[int, int] | None:
    """For each chunk length ``L``, the most document pieces a chunk of ``L`` tokens of a training window can
    hold ([Note: packed documents]): one plus the most ``document_end`` ids among ``L - 1`` consecutive ids
    of the training part (a window may start anywhere in it: :meth:`TokenSource._rows`). None without packed
    documents (synthetic data has none). ``config`` must be usable (:func:`data_problem`).

    One pass over the training part in blocks of :data:`SCAN_BLOCK_TOKENS` ids, memory-mapped (bytes data
    without a path: the default corpus, read as :func:`read_corpus` reads it).
    """
    if config.kind is DataKind.SYNTHETIC or config.document_end is None:
        return None
    config = tokens_of(config)
    if config.kind is DataKind.BYTES and config.path is None:
        ids = np.frombuffer(corpus_bytes(None), dtype=np.uint8)
    else:
        dtype = np.dtype(np.uint8) if config.kind is DataKind.BYTES else TOKEN_NUMPY_TYPES[config.dtype]
        ids = np.memmap(config.path, dtype=dtype, mode="r")
    end = ids.size - validation_size(ids.size, config.validation)
    lengths = sorted(set(chunk_lengths))
    most = most_occurrences(ids, config.document_end, [length - 1 for length in lengths], end)
    return {length: 1 + most[length - 1] for length in lengths}


def most_occurrences(
    ids, token_id: int, spans: Sequence[int], end: int, block: int = SCAN_BLOCK_TOKENS
) -> dict[int, int]:
    """For each span ``w``, the most times ``token_id`` occurs among ``w`` consecutive ids of ``ids[:end]`` (a
    1-D array or memmap), read ``block`` ids (and the widest span's overlap) at a time."""
    most = dict.fromkeys(spans, 0)
    widest = max(spans, default=0)
    for start in range(0, end, block):
        positions = np.flatnonzero(np.asarray(ids[start : min(start + block + widest, end)]) == token_id)
        firsts = positions[positions < block]  # the spans that start at an occurrence in this block
        if not firsts.size:
            continue
        for span in spans:
            counts = np.searchsorted(positions, firsts + span) - np.arange(firsts.size)
            most[span] = max(most[span], int(counts.max()))
    return most


class TokenSource:
    """Global batches of ``length + 1`` tokens (inputs and shifted targets)."""

    def __init__(self, config: DataConfig, vocab: int, length: int, global_batch: int) -> None:
        self.config = config
        self.vocab = vocab
        self.length = length
        self.global_batch = global_batch
        self.corpus: torch.Tensor | None = None
        self.token_ids: np.memmap | None = None
        # `check` and `run` scanned a tokens file's ids before launch; each batch is checked again as it is read
        problem = data_problem(config, vocab, length, scan_ids=False)
        if problem is not None:
            raise DataFileError(problem)
        config = self.config = tokens_of(config)  # text data: its cached tokens file
        self.document_end: int | None = config.document_end  # an id now, for text data too
        self._last_batch: tuple[tuple[str, int], torch.Tensor] | None = None  # loss_tokens reads it again
        if config.kind is DataKind.BYTES:
            self.corpus = read_corpus(config.path)
            if self.corpus.numel() <= length + 1:
                raise DataFileError(
                    f"the corpus has {self.corpus.numel()} bytes, fewer than one sequence of {length + 1}"
                )
        elif config.kind is DataKind.TOKENS:
            # the handle stays open: each batch checks the mapped file's size first ([Note: truncated tokens])
            self._token_file = open(config.path, "rb")
            self._mapped_bytes = os.fstat(self._token_file.fileno()).st_size
            self.token_ids = np.memmap(self._token_file, dtype=TOKEN_NUMPY_TYPES[config.dtype], mode="r")

    def _check_not_truncated(self) -> None:
        """[Note: truncated tokens] Reading a page of a memory-mapped file past its end kills the process with
        SIGBUS, which no handler turns into a message. So before each batch is read, the mapped file (the
        inode, through the handle kept open) must still be as long as when it was mapped, else
        :class:`DataFileError` names it."""
        size = os.fstat(self._token_file.fileno()).st_size
        if size < self._mapped_bytes:
            raise DataFileError(
                f"data file {self.config.path} was truncated while training ({size} bytes, {self._mapped_bytes} "
                "when the run started); restore it, or write new data under another name"
            )

    def _corpus_size(self) -> int:
        return self.token_ids.size if self.token_ids is not None else self.corpus.numel()

    def training_end(self) -> int:
        """Where the held-out validation part of a file's tokens starts (the end without one)."""
        return self._corpus_size() - validation_size(self._corpus_size(), self.config.validation)

    def global_batch_tokens(self, step: int) -> torch.Tensor:
        return self._remembered(("train", step), self._training_batch)

    def _training_batch(self, step: int) -> torch.Tensor:
        if self.token_ids is None and self.corpus is None:
            return self._synthetic(step_generator(self.config.seed, step))
        return self._rows(step_generator(self.config.seed, step), 0, self.training_end())

    def validation_batch_tokens(self, index: int) -> torch.Tensor:
        """The ``index``-th validation batch: sequences drawn from the held-out part (a generator of its own
        for synthetic data), the same on every mesh."""
        return self._remembered(("validation", index), self._validation_batch)

    def _validation_batch(self, index: int) -> torch.Tensor:
        generator = validation_generator(self.config.seed, index)
        if self.token_ids is None and self.corpus is None:
            return self._synthetic(generator)
        return self._rows(generator, self.training_end(), self._corpus_size())

    def _remembered(self, key: tuple[str, int], read) -> torch.Tensor:
        """The batch ``read(key[1])``, kept until another is read: a step's rows and its loss count read it once."""
        if self._last_batch is None or self._last_batch[0] != key:
            self._last_batch = (key, read(key[1]))
        return self._last_batch[1]

    def loss_tokens(self, step: int) -> int:
        """How many targets of step ``step``'s global batch carry a loss: all of them without packed documents,
        else those whose input is not ``document_end`` ([Note: packed documents])."""
        if self.document_end is None:
            return self.global_batch * self.length
        return loss_token_count(self.global_batch_tokens(step), self.document_end)

    def validation_loss_tokens(self, index: int) -> int:
        """:meth:`loss_tokens` of the ``index``-th validation batch."""
        if self.document_end is None:
            return self.global_batch * self.length
        return loss_token_count(self.validation_batch_tokens(index), self.document_end)

    def _rows(self, generator: torch.Generator, low: int, high: int) -> torch.Tensor:
        """``global_batch`` sequences of ``length + 1`` tokens starting in ``[low, high - length - 1)``."""
        starts = torch.randint(low, high - self.length - 1, (self.global_batch,), generator=generator)
        if self.token_ids is not None:
            self._check_not_truncated()
            rows = np.stack([np.asarray(self.token_ids[start : start + self.length + 1]) for start in starts.tolist()])
            if rows.max() >= self.vocab:
                problem = _id_outside_vocabulary(self.config, self.vocab)
                raise DataFileError(problem or f"data file {self.config.path} changed while it was read")
            return torch.from_numpy(rows.astype(np.int64))
        offsets = torch.arange(self.length + 1)
        return self.corpus[starts[:, None] + offsets[None, :]]

    def _synthetic(self, generator: torch.Generator) -> torch.Tensor:
        alphabet = min(self.vocab, SYNTHETIC_ALPHABET)
        pattern = torch.randint(0, alphabet, (self.global_batch, RECALL_PERIOD), generator=generator)
        repeats = -(-(self.length + 1) // RECALL_PERIOD)
        return pattern.repeat(1, repeats)[:, : self.length + 1]

    def replica_tokens(self, step: int, data_index: int, sequences_per_replica: int) -> torch.Tensor:
        start = data_index * sequences_per_replica
        return self.global_batch_tokens(step)[start : start + sequences_per_replica]

    def validation_replica_tokens(self, index: int, data_index: int, sequences_per_replica: int) -> torch.Tensor:
        start = data_index * sequences_per_replica
        return self.validation_batch_tokens(index)[start : start + sequences_per_replica]
