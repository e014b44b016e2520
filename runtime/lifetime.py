"""A rank's life is bound to its launcher's ([Note: stopping a run] in schedlang.launch).

torchrun starts each rank in a session of its own; if torchrun itself is killed (SIGKILL gives it no
chance to end its ranks) they would go on training as orphans. On Linux each rank asks the kernel for
SIGTERM when its parent dies (``PR_SET_PDEATHSIG``). Elsewhere this does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import signal
import sys

PR_SET_PDEATHSIG = 1


def die_with_parent() -> bool:
    """Ask for SIGTERM when the parent process exits; True when the kernel agreed."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    except OSError:
        return False
    parent = os.getppid()
    if libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0) != 0:
        return False
    if os.getppid() != parent:  # the parent died before the request took effect
        os.kill(os.getpid(), signal.SIGTERM)
    return True
