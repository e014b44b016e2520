"""Reading and writing files a user names, safely: the primitives of [Note: file safety].

[Note: file safety] Every package that touches a file the user chose (the front end's outputs in
schedlang.outputs, the runtime's metrics, checkpoints, Hugging Face directories and data) follows three rules:

- Only regular files are read or written. A FIFO would block, a device such as ``/dev/zero`` never ends,
  so each is refused with one line naming it. Opening never blocks (``O_NONBLOCK``), and the type is checked
  on the opened descriptor, so a link to a device is refused as the device.
- Every read of user-supplied content is bounded before it is parsed: :func:`read_bounded` reads at most a
  stated number of bytes and refuses a longer file, whatever its size claims to be.
- A file is written to a temporary file in its own directory and renamed over the target
  (:func:`write_replacing`), so a reader never sees half a file and a symbolic link at the target is
  replaced, never written through.

docs/reliability.md lists what each command refuses.
"""

from __future__ import annotations

import contextlib
import math
import os
import stat
import tempfile
from pathlib import Path


class UnsafeFileError(OSError):
    """A path that names something other than a regular file, or content over its bound; one line."""


def file_kind(mode: int) -> str:
    """A word for a file type: ``a FIFO``, ``a character device``, ``a directory`` ..."""
    for test, name in (
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISLNK, "a symbolic link"),
    ):
        if test(mode):
            return name
    return "not a regular file"


def special_file_problem(path: str | os.PathLike) -> str | None:
    """Why ``path`` (followed through links) cannot be read or written as a file; None for a regular file or
    one that does not exist. Uses ``stat``, which never blocks."""
    try:
        info = os.stat(path)
    except FileNotFoundError:
        return None
    except OSError as error:
        return f"{path} cannot be examined: {error.strerror or error}"
    if stat.S_ISREG(info.st_mode):
        return None
    return f"{path} is {file_kind(info.st_mode)}, not a regular file"


def read_bounded(path: str | os.PathLike, limit: int, what: str = "file") -> bytes:
    """The bytes of the regular file ``path``, which must hold at most ``limit`` of them.

    Raises :class:`UnsafeFileError` for a FIFO, device, socket or directory (checked on the open descriptor,
    opened without blocking) and for a file longer than ``limit``; ``FileNotFoundError`` and other
    ``OSError`` as ``open`` raises them.
    """
    descriptor = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    try:
        info = os.fstat(descriptor)
        if not stat.S_ISREG(info.st_mode):
            raise UnsafeFileError(f"{what} {path} is {file_kind(info.st_mode)}, not a regular file")
        chunks, remaining = [], limit + 1
        while remaining > 0:
            chunk = os.read(descriptor, min(remaining, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            remaining -= len(chunk)
    finally:
        os.close(descriptor)
    content = b"".join(chunks)
    if len(content) > limit:
        raise UnsafeFileError(f"{what} {path} is larger than {limit:,} bytes; refusing to read it")
    return content


def read_bounded_text(path: str | os.PathLike, limit: int, what: str = "file") -> str:
    """:func:`read_bounded` decoded as UTF-8 (``UnicodeDecodeError`` for other bytes)."""
    return read_bounded(path, limit, what).decode("utf-8")


def _temporary_beside(target: Path) -> tuple[int, str]:
    """(descriptor, path) of a new empty file in ``target``'s directory, mode 0600, named after ``target``."""
    return tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")


@contextlib.contextmanager
def _renamed_over(temporary: str, target: Path, mode: int | None):
    """Around the writing of ``temporary``: when the block ends, ``temporary`` gets ``mode`` less the umask (by
    default 0666 less the umask, what a plain ``open`` gives) and is renamed over ``target``; on an exception it is
    removed instead."""
    try:
        yield
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(temporary, (0o666 if mode is None else mode) & ~umask)
        os.replace(temporary, target)
    except BaseException:
        try:
            os.unlink(temporary)
        except OSError:
            pass
        raise


@contextlib.contextmanager
def replacing(path: str | os.PathLike, mode: int | None = None):
    """A temporary path in ``path``'s directory for a writer that needs a file name; renamed over ``path`` when
    the block ends without an exception, removed otherwise (as :func:`write_replacing`)."""
    target = Path(path)
    descriptor, temporary = _temporary_beside(target)
    os.close(descriptor)
    with _renamed_over(temporary, target, mode):
        yield Path(temporary)


def write_replacing(path: str | os.PathLike, content: bytes | str, mode: int | None = None) -> None:
    """Write ``content`` to a temporary file in ``path``'s directory and rename it over ``path``.

    A symbolic link at ``path`` is replaced by the new file, its target left untouched. The new file gets
    ``mode`` less the umask; by default the mode a plain ``open`` would give it (0666 less the umask). The content
    goes through the descriptor the temporary file was created with, never reopened by name.
    """
    target = Path(path)
    data = content.encode("utf-8") if isinstance(content, str) else content
    descriptor, temporary = _temporary_beside(target)
    with _renamed_over(temporary, target, mode):
        with os.fdopen(descriptor, "wb") as handle:
            handle.write(data)


def open_for_append(path: str | os.PathLike):
    """A text handle appending to the regular file ``path`` (created if missing), never through a link."""
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0)
    try:
        descriptor = os.open(path, flags, 0o666)
    except OSError as error:
        if os.path.islink(path):
            raise UnsafeFileError(f"{path} is a symbolic link; refusing to write through it") from None
        raise error
    info = os.fstat(descriptor)
    if not stat.S_ISREG(info.st_mode):
        os.close(descriptor)
        raise UnsafeFileError(f"{path} is {file_kind(info.st_mode)}, not a regular file")
    os.set_blocking(descriptor, True)
    return os.fdopen(descriptor, "a", encoding="utf-8")


def finite_or_none(value):
    """``value`` with every non-finite float (in nested dicts, lists and tuples) replaced by None, so
    ``json.dumps(..., allow_nan=False)`` writes strict JSON (``null``)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {key: finite_or_none(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite_or_none(item) for item in value]
    return value
