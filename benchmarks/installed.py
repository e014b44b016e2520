"""Importing an installed package (flash-linear-attention, transformers) from inside this checkout.

Contract. :func:`import_installed` imports the module ``name`` with this checkout's folders off ``sys.path`` while
it runs, so the module and everything it imports then come from the installed packages, and returns it; what it
imported stays in ``sys.modules`` for later imports. ImportError is the module's own.

Why. The repository root and benchmarks/ hold a top-level ``kernels`` (the ``kernels/`` folder, installed as
``schedlang.kernels``, and benchmarks/kernels.py). Both are on ``sys.path`` in the usual runs: pytest puts the root
there (pyproject.toml, ``pythonpath``), ``python -m`` the working directory, ``python3 benchmarks/X.py`` the
script's folder. transformers 5 imports Hugging Face's PyPI package ``kernels`` where it is installed
(transformers 5.25 requires it), finds ours instead, and fla's models fail to import with ``cannot import name
'CUDAProperties' from 'kernels'``. The real ``kernels`` is imported here too, in the same window, so that a
later import of it inside transformers finds it in ``sys.modules``.

    python3 -c "import sys; sys.path.insert(0, '.'); import fla.models"    # fails in a checkout, transformers 5.25
"""

from __future__ import annotations

import importlib
import importlib.metadata
import os
import sys
from pathlib import Path
from types import ModuleType

CHECKOUT = Path(__file__).resolve().parent.parent
_SHADOWING_FOLDERS = (CHECKOUT, CHECKOUT / "benchmarks")


def _ours(entry: str) -> bool:
    try:
        return Path(entry or os.getcwd()).resolve() in _SHADOWING_FOLDERS
    except OSError:
        return False


def _has_distribution(name: str) -> bool:
    try:
        importlib.metadata.distribution(name)
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


def import_installed(name: str) -> ModuleType:
    """The module ``name`` imported from the installed packages, never from this checkout (module docstring)."""
    saved = list(sys.path)
    sys.path[:] = [entry for entry in saved if not _ours(entry)]
    try:
        if _has_distribution("kernels") and "kernels" not in sys.modules:
            importlib.import_module("kernels")
        return importlib.import_module(name)
    finally:
        sys.path[:] = saved
