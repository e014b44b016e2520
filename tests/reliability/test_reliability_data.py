"""Data files: only regular files are read; directories, pipes, devices and missing files get one clear line."""

from __future__ import annotations

import os

import pytest

from reliability_helpers import one_rank_schedule, run_cli
from schedlang.runtime.data import DataFileError, read_corpus


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
