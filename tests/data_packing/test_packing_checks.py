"""``document_end`` in the language: read for bytes, tokens and text data, checked by ``schedlang check`` with
``file:line:col`` errors at the argument (an id outside the vocabulary or not a byte, a string for id data, a
token the tokenizer lacks, sequence parallelism, CUDA graphs, synthetic data), and passed to the runtime:
a text corpus's end-of-text token resolved by name, and the global loss count of a step."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import torch

from schedlang.runtime.data import TokenSource
from schedlang.runtime.packing import loss_token_count
from schedlang.vocabulary import DataConfig, DataKind

SCHEDULE = """schedule packed
model {{ vocab = {vocab}  d_model = 32  layers = [{layers}]  heads = 2  head_dim = 16 }}
mesh {{ {mesh} }}
sequence {{ length = 64  chunks = 2  kernel_chunk = 16 }}
pipeline {{ microbatches = 1  microbatch_size = 2  {pipeline} }}
train {{ steps = 2  optimizer = adamw(lr = 1e-2)
  data = {data} }}
"""


def check(tmp_path, data: str, vocab: int = 64, mesh: str = "pipeline = 1", pipeline: str = "", layers="gla, attn"):
    np.tile(np.arange(60), 40).astype("<u2").tofile(tmp_path / "train.bin")
    (tmp_path / "corpus.bin").write_bytes(bytes(range(256)) * 8)
    schedule = tmp_path / "packed.sched"
    text = SCHEDULE.format(vocab=vocab, mesh=mesh, pipeline=pipeline, data=data, layers=layers)
    schedule.write_text(text, encoding="utf-8")
    completed = subprocess.run(
        [sys.executable, "-m", "schedlang", "check", str(schedule)], capture_output=True, text=True, timeout=120
    )
    return schedule, text, completed


def assert_error_at(schedule, text, completed, needle: str, message: str) -> None:
    """One error at line 7, the column where ``needle`` starts, with ``message``, the line and a caret."""
    assert completed.returncode == 1, completed.stdout
    line = text.splitlines()[6]
    column = line.index(needle) + 1
    first, source, caret = completed.stderr.splitlines()[:3]
    assert first == f"{schedule}:7:{column}: error: {message}", completed.stderr
    assert source == line and caret.index("^") == column - 1
    assert "Traceback" not in completed.stderr


@pytest.mark.parametrize(
    "data, vocab, needle, message",
    [
        ('tokens(path = "train.bin", document_end = 64)', 64, "document_end",
         "document_end = 64 is not a token id of the model's vocabulary (0 .. 63)"),
        ('bytes(path = "corpus.bin", document_end = 256)', 300, "document_end",
         "document_end = 256 is not a byte (0 .. 255), and bytes data holds only bytes"),
        ('tokens(path = "train.bin", document_end = "<|endoftext|>")', 64, '"<|endoftext|>"',
         "'train.data.document_end' must be a token id (an integer) for tokens data"),
        ('tokens(path = "train.bin", document_end = -1)', 64, "-1",
         "'train.data.document_end' must be >= 0, found -1"),
    ],
)
def test_check_refuses_a_document_end_at_its_position(tmp_path, data, vocab, needle, message):
    assert_error_at(*check(tmp_path, data, vocab), needle, message)


def test_check_refuses_document_end_with_sequence_parallelism_and_cuda_graphs(tmp_path):
    data = 'tokens(path = "train.bin", document_end = 59)'
    schedule, text, completed = check(tmp_path, data, mesh="sequence = 2")
    message = "packed documents (document_end) do not run sequence-parallel, but mesh.sequence = 2"
    assert_error_at(schedule, text, completed, "document_end", message)
    assert "hint: use mesh.pipeline or mesh.data ranks instead" in completed.stderr
    schedule, text, completed = check(tmp_path, data, pipeline="cuda_graphs = step", layers="gla, simple_gla")
    message = "packed documents (document_end) do not run under CUDA graphs, but pipeline.cuda_graphs = step"
    assert_error_at(schedule, text, completed, "document_end", message)


def test_synthetic_data_has_no_documents(tmp_path):
    schedule, text, completed = check(tmp_path, "synthetic(seed = 0, document_end = 3)")
    assert completed.returncode == 1
    assert f"{schedule}:7:" in completed.stderr and "document_end" in completed.stderr


def test_a_legal_document_end_checks_and_compiles_into_the_data_config(tmp_path):
    schedule, _, completed = check(tmp_path, 'tokens(path = "train.bin", document_end = 59)')
    assert completed.returncode == 0, completed.stderr
    script = tmp_path / "packed.py"
    compiled = subprocess.run(
        [sys.executable, "-m", "schedlang", "compile", str(schedule), "-o", str(script)],
        capture_output=True, text=True, timeout=120,
    )
    assert compiled.returncode == 0, compiled.stderr
    namespace: dict = {}
    exec(compile(script.read_text().split("\ndef parse_args")[0], "packed.py", "exec"), namespace)
    assert namespace["TRAIN"].data.document_end == 59


def test_loss_tokens_count_the_global_batch_and_default_to_every_target(tmp_path):
    path = tmp_path / "ids.bin"
    np.tile(np.arange(10), 300).astype("<u2").tofile(path)  # document_end 9 ends a document every 10 tokens
    packed = TokenSource(DataConfig(DataKind.TOKENS, 1, str(path), "uint16", document_end=9), 16, 31, 8)
    plain = TokenSource(DataConfig(DataKind.TOKENS, 1, str(path), "uint16"), 16, 31, 8)
    batch = packed.global_batch_tokens(3)
    assert torch.equal(batch, plain.global_batch_tokens(3))
    assert packed.loss_tokens(3) == loss_token_count(batch, 9) == 8 * 31 - int((batch[:, :-1] == 9).sum())
    assert 8 * 31 - 8 * 4 <= packed.loss_tokens(3) <= 8 * 31 - 8 * 3  # 3 or 4 ends among 31 inputs per row
    assert plain.loss_tokens(3) == 8 * 31
    replicas = [packed.replica_tokens(3, index, 2) for index in range(4)]
    assert sum(loss_token_count(rows, 9) for rows in replicas) == packed.loss_tokens(3)


@pytest.fixture
def text_with_documents(tmp_path, monkeypatch):
    """A corpus of documents separated by ``<|endoftext|>``, and a BPE tokenizer holding that special token."""
    tokenizers = pytest.importorskip("tokenizers")
    monkeypatch.setenv("SCHEDLANG_CACHE", str(tmp_path / "cache"))
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("".join(f"document {i}: the quick brown fox<|endoftext|>\n" for i in range(200)))
    tokenizer = tokenizers.Tokenizer(tokenizers.models.BPE(unk_token="[UNK]"))
    tokenizer.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel()
    trainer = tokenizers.trainers.BpeTrainer(
        vocab_size=300,
        special_tokens=["[UNK]", "<|endoftext|>"],
        initial_alphabet=tokenizers.pre_tokenizers.ByteLevel.alphabet(),
    )
    tokenizer.train([str(corpus)], trainer)
    tokenizer.save(str(tmp_path / "tokenizer.json"))
    return corpus, tmp_path / "tokenizer.json", tokenizer


def test_text_data_names_its_end_of_text_token(tmp_path, text_with_documents):
    corpus, tokenizer_file, tokenizer = text_with_documents
    end = tokenizer.token_to_id("<|endoftext|>")
    config = DataConfig(DataKind.TEXT, 0, str(corpus), tokenizer=str(tokenizer_file), document_end="<|endoftext|>")
    source = TokenSource(config, 320, 63, 4)
    assert source.document_end == end
    assert int((torch.from_numpy(np.asarray(source.token_ids, dtype=np.int64)) == end).sum()) == 200
    assert source.loss_tokens(0) == loss_token_count(source.global_batch_tokens(0), end) < 4 * 63


def test_check_refuses_a_token_the_tokenizer_lacks(tmp_path, text_with_documents):
    _, tokenizer_file, _ = text_with_documents
    data = 'text(path = "corpus.txt", tokenizer = "tokenizer.json", document_end = "<|eot|>")'
    schedule, text, completed = check(tmp_path, data, vocab=320)
    message = f"tokenizer {tokenizer_file} has no token '<|eot|>' to end documents with"
    assert_error_at(schedule, text, completed, "document_end", message)
    legal = data.replace("<|eot|>", "<|endoftext|>")
    assert check(tmp_path, legal, vocab=320)[2].returncode == 0


def test_check_refuses_document_end_with_short_convolutions(tmp_path):
    """gdn's short convolutions would carry the previous document's last inputs across a document start."""
    data = 'tokens(path = "train.bin", document_end = 59)'
    schedule, text, completed = check(tmp_path, data, layers="gdn, attn")
    assert completed.returncode == 0, completed.stderr
    text = text.replace("head_dim = 16 }", "head_dim = 16  short_conv_size = 4 }")
    schedule.write_text(text, encoding="utf-8")
    completed = subprocess.run(
        [sys.executable, "-m", "schedlang", "check", str(schedule)], capture_output=True, text=True, timeout=120
    )
    message = (
        "packed documents (document_end) reset the recurrent state at each document start, but the gdn layers' "
        "short convolutions (short_conv_size = 4) would still read the previous document's last inputs"
    )
    assert_error_at(schedule, text, completed, "document_end", message)
