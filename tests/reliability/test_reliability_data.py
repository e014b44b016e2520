"""Data files: only regular files are read; directories, pipes, devices, missing, empty, short and malformed
files get one clear line at the data key, from `check` as from `run`; tokens files are memory-mapped ids."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

from reliability_helpers import one_rank_schedule, run_cli
from schedlang.runtime.data import DataFileError, TokenSource, read_corpus
from schedlang.vocabulary import DataConfig, DataKind


def bytes_schedule(path: str) -> str:
    return one_rank_schedule(train=f'data = bytes(path = "{path}")').replace("vocab = 64", "vocab = 256")


@pytest.fixture
def fifo(tmp_path):
    path = tmp_path / "corpus.fifo"
    os.mkfifo(path)
    return path


@pytest.mark.parametrize(
    "kind, expected",
    [
        ("fifo", "is not a regular file (a pipe, socket or device); copy the data into a file"),
        ("device", "is not a regular file (a pipe, socket or device); copy the data into a file"),
        ("directory", "is a directory; name a text file in it"),
        ("missing", "does not exist"),
    ],
)
def test_read_corpus_reads_only_regular_files(tmp_path, fifo, kind, expected):
    path = {"fifo": fifo, "device": "/dev/zero", "directory": tmp_path, "missing": tmp_path / "nothing.txt"}[kind]
    with pytest.raises(DataFileError) as error:
        read_corpus(str(path))
    assert str(error.value) == f"data file {path} {expected}"


def test_run_refuses_a_pipe_as_data_at_the_key_without_launching(tmp_path, fifo):
    schedule = tmp_path / "fifo.sched"
    text = bytes_schedule(fifo.name)  # relative to the schedule file
    schedule.write_text(text, encoding="utf-8")
    completed = run_cli("run", schedule, "--device", "cpu", timeout=60)
    assert completed.returncode == 1
    line = text.splitlines()[5]
    column = line.index("path =") + 1
    assert completed.stderr.startswith(
        f"{schedule}:6:{column}: error: data file {fifo} is not a regular file (a pipe, socket or device)"
    ), completed.stderr
    assert "training" not in completed.stdout


def test_a_regular_file_still_trains_its_bytes(tmp_path):
    corpus = tmp_path / "text.txt"
    corpus.write_bytes(b"abcdefgh" * 64)
    tokens = read_corpus(str(corpus))
    assert tokens.numel() == 512 and int(tokens[0]) == ord("a")


def tokens_schedule(path: str, dtype: str = "uint16", vocab: int = 64) -> str:
    return one_rank_schedule(train=f'data = tokens(path = "{path}", dtype = {dtype})').replace(
        "vocab = 64", f"vocab = {vocab}"
    )


def write_ids(path, ids, dtype="<u2") -> None:
    np.asarray(ids, dtype=dtype).tofile(path)


@pytest.mark.parametrize(
    "case, expected",
    [
        ("missing", "data file {path} does not exist"),
        ("empty", "data file {path} is empty"),
        ("short", "data file {path} holds 20 token ids, fewer than one sequence of 33"),
        ("odd_size", "data file {path} has 201 bytes, not a whole number of uint16 token ids (2 bytes each): is the dtype right?"),
        ("outside_vocabulary", "data file {path} holds token id 64 at position 70, but model.vocab = 64: is the dtype right, or the vocabulary too small?"),
        ("bytes_short", "data file {path} holds 10 bytes, fewer than one sequence of 33"),
        ("bytes_small_vocabulary", "bytes data needs a vocabulary of at least 256, the model has 64"),
    ],
)
def test_check_finds_each_data_problem_at_the_data_key_before_anything_runs(tmp_path, case, expected):
    """Issue 20: missing, empty, too short, wrong dtype and ids outside the vocabulary, all at check time."""
    data = tmp_path / "train.bin"
    text = tokens_schedule(data.name)
    if case == "empty":
        data.write_bytes(b"")
    elif case == "short":
        write_ids(data, range(20))
    elif case == "odd_size":
        data.write_bytes(bytes(201))
    elif case == "outside_vocabulary":
        write_ids(data, [7] * 70 + [64] + [3] * 60)
    elif case.startswith("bytes"):
        data.write_bytes(b"abcdefghij" if case == "bytes_short" else b"x" * 1000)
        text = bytes_schedule(data.name)
        if case == "bytes_small_vocabulary":
            text = text.replace("vocab = 256", "vocab = 64")
    schedule = tmp_path / "data.sched"
    schedule.write_text(text, encoding="utf-8")
    completed = run_cli("check", schedule, timeout=60)
    assert completed.returncode == 1, completed.stdout
    line = text.splitlines()[5]
    column = line.index("path =") + 1
    assert completed.stderr.startswith(
        f"{schedule}:6:{column}: error: {expected.format(path=data)}\n"
    ), completed.stderr


def test_tokens_data_reads_sequences_of_the_file_and_trains(tmp_path):
    """Rows are consecutive ids of the file at the step's drawn positions, the same on every call; and the
    generated script trains on them."""
    data = tmp_path / "train.bin"
    write_ids(data, np.arange(3000) % 61, dtype="<u4")
    config = DataConfig(DataKind.TOKENS, seed=3, path=str(data), dtype="uint32")
    source = TokenSource(config, vocab=64, length=32, global_batch=4)
    batch = source.global_batch_tokens(5)
    assert batch.shape == (4, 33) and batch.dtype == torch.int64
    for row in batch:  # the file holds i % 61 at position i: a row is 33 consecutive positions
        assert torch.equal(row, (torch.arange(33) + int(row[0])) % 61)
    assert torch.equal(batch, source.global_batch_tokens(5))
    assert not torch.equal(batch, source.global_batch_tokens(6))
    schedule = tmp_path / "tokens.sched"
    schedule.write_text(tokens_schedule(data.name, dtype="uint32"), encoding="utf-8")
    assert run_cli("check", schedule, timeout=60).returncode == 0
    completed = run_cli("run", schedule, "--device", "cpu", timeout=240)
    assert completed.returncode == 0, completed.stderr
    assert "done: loss" in completed.stdout


def test_a_batch_with_an_id_outside_the_vocabulary_stops_the_rank_with_its_position(tmp_path):
    """A script launched without `schedlang run` skips the scan; the rank still names the bad id."""
    data = tmp_path / "train.bin"
    write_ids(data, [5] * 100)
    config = DataConfig(DataKind.TOKENS, seed=0, path=str(data), dtype="uint16")
    source = TokenSource(config, vocab=64, length=32, global_batch=2)
    write_ids(data, [5] * 50 + [900] + [5] * 49)  # the file changes after the check
    with pytest.raises(DataFileError, match="holds token id 900 at position 50, but model.vocab = 64"):
        for step in range(50):
            source.global_batch_tokens(step)


@pytest.fixture
def text_corpus(tmp_path, monkeypatch):
    """A corpus, a byte-level BPE tokenizer trained on it (vocabulary about 290) and a private cache."""
    tokenizers = pytest.importorskip("tokenizers")
    monkeypatch.setenv("SCHEDLANG_CACHE", str(tmp_path / "cache"))
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("".join(f"line {i}: the quick brown fox jumps over the lazy dog\n" for i in range(300)))
    tokenizer = tokenizers.Tokenizer(tokenizers.models.BPE(unk_token="[UNK]"))
    tokenizer.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel()
    trainer = tokenizers.trainers.BpeTrainer(
        vocab_size=300, special_tokens=["[UNK]"], initial_alphabet=tokenizers.pre_tokenizers.ByteLevel.alphabet()
    )
    tokenizer.train([str(corpus)], trainer)
    tokenizer.save(str(tmp_path / "tokenizer.json"))
    return corpus, tmp_path / "tokenizer.json", tokenizer


def text_schedule(vocab: int = 320, tokenizer: str = "tokenizer.json") -> str:
    train = f'data = text(path = "corpus.txt", tokenizer = "{tokenizer}")'
    return one_rank_schedule(train=train).replace("vocab = 64", f"vocab = {vocab}")


def test_text_data_is_tokenised_once_into_the_cache_and_trains(tmp_path, text_corpus):
    from schedlang.runtime.text_data import tokenised_path

    corpus, tokenizer_file, tokenizer = text_corpus
    schedule = tmp_path / "text.sched"
    schedule.write_text(text_schedule(), encoding="utf-8")
    first = run_cli("check", schedule, timeout=120)
    assert first.returncode == 0, first.stderr
    cached = tokenised_path(str(corpus), str(tokenizer_file))
    assert str(cached).startswith(str(tmp_path / "cache"))
    expected = [i for line in corpus.read_text().splitlines(keepends=True) for i in tokenizer.encode(line).ids]
    assert np.fromfile(cached, dtype="<u4").tolist() == expected
    written = cached.stat().st_mtime_ns
    assert run_cli("check", schedule, timeout=120).returncode == 0
    assert cached.stat().st_mtime_ns == written  # not tokenised again
    completed = run_cli("run", schedule, "--device", "cpu", timeout=240)
    assert completed.returncode == 0, completed.stderr
    assert "done: loss" in completed.stdout and "tokenising" not in completed.stderr
    corpus.write_text(corpus.read_text() + "one more line\n")
    assert tokenised_path(str(corpus), str(tokenizer_file)) != cached  # an edited corpus is tokenised again


@pytest.mark.parametrize(
    "case, expected",
    [
        ("missing_tokenizer", "tokenizer file {tokenizer} does not exist"),
        ("broken_tokenizer", "tokenizer {tokenizer} does not load: "),
        ("small_vocabulary", "the text {corpus} tokenised by {tokenizer} holds token id "),
    ],
)
def test_text_data_problems_are_found_at_check_time(tmp_path, text_corpus, case, expected):
    corpus, tokenizer_file, _ = text_corpus
    text = text_schedule()
    if case == "missing_tokenizer":
        tokenizer_file = tmp_path / "nothing.json"
        text = text_schedule(tokenizer="nothing.json")
    elif case == "broken_tokenizer":
        tokenizer_file.write_text("{not json", encoding="utf-8")
    else:
        text = text_schedule(vocab=100)
    schedule = tmp_path / "text.sched"
    schedule.write_text(text, encoding="utf-8")
    completed = run_cli("check", schedule, timeout=120)
    assert completed.returncode == 1
    column = text.splitlines()[5].index("path =") + 1
    error = f"{schedule}:6:{column}: error: {expected.format(tokenizer=tokenizer_file, corpus=corpus)}"
    assert f"\n{error}" in f"\n{completed.stderr}", completed.stderr  # after the tokeniser's progress lines
