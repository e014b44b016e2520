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
"""

from __future__ import annotations

import sysconfig
from pathlib import Path

import torch

from schedlang.runtime.config import DataConfig
from schedlang.vocabulary import DataKind

RECALL_PERIOD = 24
SYNTHETIC_ALPHABET = 32
BYTE_VOCAB = 256
DEFAULT_CORPUS_LIMIT_BYTES = 16 * 1024 * 1024


def step_generator(seed: int, step: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed * 1_000_003 + step)


def default_corpus_files() -> list[Path]:
    """The standard library's ``.py`` files, in a fixed order."""
    root = Path(sysconfig.get_paths()["stdlib"])
    return sorted(path for path in root.rglob("*.py") if "site-packages" not in path.parts)


def read_corpus(path: str | None, limit_bytes: int = DEFAULT_CORPUS_LIMIT_BYTES) -> torch.Tensor:
    if path is not None:
        data = Path(path).read_bytes()
    else:
        pieces, total = [], 0
        for file in default_corpus_files():
            content = file.read_bytes()
            pieces.append(content)
            total += len(content)
            if total >= limit_bytes:
                break
        data = b"".join(pieces)[:limit_bytes]
    return torch.frombuffer(bytearray(data), dtype=torch.uint8).to(torch.long)


class TokenSource:
    """Global batches of ``length + 1`` tokens (inputs and shifted targets)."""

    def __init__(self, config: DataConfig, vocab: int, length: int, global_batch: int) -> None:
        self.config = config
        self.vocab = vocab
        self.length = length
        self.global_batch = global_batch
        self.corpus: torch.Tensor | None = None
        if config.kind is DataKind.BYTES:
            if vocab < BYTE_VOCAB:
                raise ValueError(f"bytes data needs a vocabulary of at least {BYTE_VOCAB}, the model has {vocab}")
            self.corpus = read_corpus(config.path)
            if self.corpus.numel() <= length + 1:
                raise ValueError(
                    f"the corpus has {self.corpus.numel()} bytes, fewer than one sequence of {length + 1}"
                )

    def global_batch_tokens(self, step: int) -> torch.Tensor:
        generator = step_generator(self.config.seed, step)
        if self.corpus is not None:
            starts = torch.randint(0, self.corpus.numel() - self.length - 1, (self.global_batch,), generator=generator)
            offsets = torch.arange(self.length + 1)
            return self.corpus[starts[:, None] + offsets[None, :]]
        alphabet = min(self.vocab, SYNTHETIC_ALPHABET)
        pattern = torch.randint(0, alphabet, (self.global_batch, RECALL_PERIOD), generator=generator)
        repeats = -(-(self.length + 1) // RECALL_PERIOD)
        return pattern.repeat(1, repeats)[:, : self.length + 1]

    def replica_tokens(self, step: int, data_index: int, sequences_per_replica: int) -> torch.Tensor:
        start = data_index * sequences_per_replica
        return self.global_batch_tokens(step)[start : start + sequences_per_replica]
