"""The host's memory as the operating system reports it: what ``schedlang profile`` records of the machine and
what activation offload checks before it pins more ([Note: activation offload] in
:mod:`schedlang.runtime.offload`).

Contract. :func:`physical_memory_bytes` is the machine's RAM (``sysconf``'s pages times the page size, else
``MemTotal`` of ``/proc/meminfo``); :func:`available_memory_bytes` is ``MemAvailable`` of ``/proc/meminfo``, the
kernel's estimate of what can be allocated without swapping. Either is None where the system does not say.
"""

from __future__ import annotations

import os
from pathlib import Path

MEMINFO = Path("/proc/meminfo")


def meminfo_bytes(text: str, field: str) -> int | None:
    """The value of ``field`` (``MemTotal``, ``MemAvailable``, ...) in ``/proc/meminfo``'s ``text``, in bytes
    (the file states kB, which are KiB); None when the field is missing or unreadable."""
    for line in text.splitlines():
        name, _, rest = line.partition(":")
        if name.strip() != field:
            continue
        parts = rest.split()
        if not parts or not parts[0].isdigit():
            return None
        unit = parts[1].lower() if len(parts) > 1 else "b"
        return int(parts[0]) * (1024 if unit == "kb" else 1)
    return None


def _meminfo(field: str) -> int | None:
    try:
        return meminfo_bytes(MEMINFO.read_text(encoding="ascii", errors="replace"), field)
    except OSError:
        return None


def physical_memory_bytes() -> int | None:
    """The machine's RAM in bytes."""
    try:
        pages, page_size = os.sysconf("SC_PHYS_PAGES"), os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, OSError, ValueError):
        pages = page_size = -1
    if pages > 0 and page_size > 0:
        return pages * page_size
    return _meminfo("MemTotal")


def available_memory_bytes() -> int | None:
    """``MemAvailable``: what the host can still allocate without swapping, in bytes."""
    return _meminfo("MemAvailable")
