"""Data read bounded: a tokens file truncated while training is an error naming it, not a bus error in every rank;
a tokenizer that is a FIFO or a device is refused without reading it."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from schedlang.runtime.text_data import TokenizerUnavailableError, load_tokenizer, tokenised_path

TRUNCATE_WHILE_READING = textwrap.dedent(
    """
    import sys
    import numpy as np
    from schedlang.vocabulary import DataConfig
    from schedlang.runtime.data import DataFileError, TokenSource
    from schedlang.vocabulary import DataKind

    path = sys.argv[1]
    np.arange(1 << 20, dtype=np.uint16).__mod__(1000).astype(np.uint16).tofile(path)
    source = TokenSource(DataConfig(DataKind.TOKENS, seed=1, path=path, dtype="uint16"), 1000, 255, 8)
    source.global_batch_tokens(0)
    with open(path, "r+b") as handle:
        handle.truncate(4096)
    try:
        for step in range(1, 50):
            source.global_batch_tokens(step)
    except DataFileError as error:
        print(error)
        sys.exit(3)
    """
)


def test_a_tokens_file_truncated_while_training_is_an_error_not_a_bus_error(tmp_path):
    path = tmp_path / "tokens.bin"
    completed = subprocess.run(
        [sys.executable, "-c", TRUNCATE_WHILE_READING, str(path)], capture_output=True, text=True, timeout=120
    )
    assert completed.returncode == 3, (completed.returncode, completed.stderr[-2000:])
    assert completed.stdout.strip() == (
        f"data file {path} was truncated while training (4096 bytes, 2097152 when the run started); "
        "restore it, or write new data under another name"
    )


@pytest.mark.parametrize("kind", ["fifo", "device"])
def test_a_tokenizer_that_is_not_a_regular_file_is_refused_unread(tmp_path, kind):
    tokenizer = tmp_path / "tokenizer.json"
    if kind == "fifo":
        os.mkfifo(tokenizer)
    else:
        tokenizer.symlink_to("/dev/zero")
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("hello\n", encoding="utf-8")
    with pytest.raises(TokenizerUnavailableError, match="not a regular file"):
        tokenised_path(str(corpus), str(tokenizer))
    pytest.importorskip("tokenizers")
    with pytest.raises(TokenizerUnavailableError, match="not a regular file"):
        load_tokenizer(str(tokenizer))
