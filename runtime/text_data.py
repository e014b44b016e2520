"""``data = text(path, tokenizer)``: a text corpus tokenised once by a Hugging Face ``tokenizer.json``.

Contract: :func:`tokenised_path` names the cache file of ``(corpus, tokenizer)``: it changes when the
corpus's path, size or modification time changes, or the tokenizer file's bytes do, so an edited corpus is
tokenised again and an unchanged one never is. :func:`ensure_tokenised` writes that file when it is missing,
as a flat ``uint32`` array of ids (the ``tokens`` layout, read by :class:`schedlang.runtime.data.TokenSource`),
through a temporary file renamed into place, so ranks that race to write it leave one whole file. The corpus
is read and encoded in blocks of lines (each line keeps its newline), with a progress line on stderr. A
document end written in the text as the tokenizer's special token (``<|endoftext|>``) is encoded as that
token's id; :func:`token_id` names it for ``document_end``.

The cache lives in ``$SCHEDLANG_CACHE`` or ``$XDG_CACHE_HOME/schedlang`` (``~/.cache/schedlang``), never next
to the user's files. The ``tokenizers`` library is an optional dependency (``pip install schedlang[text]``).
"""

from __future__ import annotations

import hashlib
import os
import sys
import tempfile
from pathlib import Path

import numpy as np

from schedlang.vocabulary.files import read_bounded

LINES_PER_BLOCK = 4096
MAX_TOKENIZER_BYTES = 256 << 20  # a tokenizer.json of a 250K-token vocabulary is about 20 MB


class TokenizerUnavailableError(ValueError):
    """The ``tokenizers`` library is not installed, or the tokenizer file does not load."""


def cache_directory() -> Path:
    if os.environ.get("SCHEDLANG_CACHE"):
        return Path(os.environ["SCHEDLANG_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "schedlang"


def tokenised_path(corpus: str, tokenizer: str) -> Path:
    """The cache file holding ``corpus`` tokenised by ``tokenizer`` (both existing regular files)."""
    info = os.stat(corpus)
    key = hashlib.sha256()
    key.update(os.path.abspath(corpus).encode())
    key.update(f"{info.st_size}:{info.st_mtime_ns}".encode())
    try:
        key.update(read_bounded(tokenizer, MAX_TOKENIZER_BYTES, "tokenizer"))
    except OSError as error:
        raise TokenizerUnavailableError(str(error)) from None
    return cache_directory() / "tokens" / f"{Path(corpus).name}.{key.hexdigest()[:20]}.u32.bin"


def load_tokenizer(tokenizer: str):
    try:
        from tokenizers import Tokenizer
    except ImportError:
        raise TokenizerUnavailableError(
            "text data needs the tokenizers library: pip install tokenizers (or schedlang[text])"
        ) from None
    try:
        text = read_bounded(tokenizer, MAX_TOKENIZER_BYTES, "tokenizer").decode("utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise TokenizerUnavailableError(f"tokenizer {tokenizer} cannot be read: {error}") from None
    try:
        return Tokenizer.from_str(text)
    except Exception as error:  # the library raises a bare Exception for a file it cannot parse
        raise TokenizerUnavailableError(f"tokenizer {tokenizer} does not load: {str(error).splitlines()[0]}") from None


def token_id(tokenizer: str, name: str) -> int:
    """The id ``tokenizer`` gives the token written ``name`` (such as its end-of-text token ``"<|endoftext|>"``);
    raises :class:`TokenizerUnavailableError` when it has no such token."""
    found = load_tokenizer(tokenizer).token_to_id(name)
    if found is None:
        raise TokenizerUnavailableError(f"tokenizer {tokenizer} has no token {name!r} to end documents with")
    return int(found)


def ensure_tokenised(corpus: str, tokenizer: str, show_progress: bool = True) -> Path:
    """The cache file of ``(corpus, tokenizer)``, written first if it does not exist yet."""
    target = tokenised_path(corpus, tokenizer)
    if target.exists():
        return target
    encoder = load_tokenizer(tokenizer)
    target.parent.mkdir(parents=True, exist_ok=True)
    total = max(os.stat(corpus).st_size, 1)
    done = 0
    handle, temporary = tempfile.mkstemp(dir=target.parent, prefix=target.name, suffix=".partial")
    try:
        with os.fdopen(handle, "wb") as out, open(corpus, encoding="utf-8", errors="replace", newline="") as text:
            while True:
                lines = [line for _, line in zip(range(LINES_PER_BLOCK), text)]
                if not lines:
                    break
                for encoding in encoder.encode_batch(lines, add_special_tokens=False):
                    np.asarray(encoding.ids, dtype="<u4").tofile(out)
                done += sum(len(line.encode("utf-8", errors="replace")) for line in lines)
                if show_progress:
                    print(f"\rschedlang: tokenising {corpus}: {min(done / total, 1.0):5.1%}", end="", file=sys.stderr)
        os.replace(temporary, target)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    if show_progress:
        print(f"\rschedlang: tokenised {corpus} into {target}", file=sys.stderr)
    return target
