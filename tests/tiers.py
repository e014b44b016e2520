"""Which tests run in the default tier and which only in the full tier ([Note: test tiers] in
tests/conftest.py).

A test is in the full tier when any of these holds, unless it is marked ``default_tier``:

* it is marked ``full``;
* it is marked ``slow`` (a multi-process run: torchrun or several gloo ranks);
* its file lies under one of ``FULL_TIER_DIRECTORIES``;
* its node id matches a pattern of ``FULL_TIER_TESTS`` (``fnmatch``: ``*`` and ``?`` work as in shells, so a
  pattern can name one parametrisation, ``test_x[B2-T4096*``, and keep the others in the default tier);
* without a GPU, its file is one of ``FIRST_PARAMETRISATION_ONLY`` and it is not the first collected
  parametrisation of its test function (the default tier keeps one case of each test there, the full tier
  the others; on a GPU the kernels run compiled, and every case stays in the default tier).

Everything else is in the default tier, so a new test lands there unless it is slow or marked. The
default tier must still touch every module: the front end, every pass, codegen of every example, one CPU
training run per mesh shape (``default_tier`` keeps those among the ``slow`` tests) and the kernels
against their references at small sizes. A pattern that matches no test of a collected file is an error
at collection, so the table cannot go stale silently.
"""

from __future__ import annotations

FULL_TIER_DIRECTORIES: tuple[str, ...] = ("tests/benchmarks",)
"""Directories (relative to the repository root) whose tests are all in the full tier."""

FULL_TIER_TESTS: dict[str, str] = {}
"""Node-id pattern -> why the tests it matches are in the full tier (their time, and what the default tier
keeps instead)."""

_INTERPRETED = "Triton's interpreter runs every kernel case for seconds on a CPU; one case per test checks each kernel"

FIRST_PARAMETRISATION_ONLY: dict[str, str] = {
    "tests/kernels/test_kernels_gdn.py": _INTERPRETED,
    "tests/kernels/test_kernels_pointwise.py": _INTERPRETED,
    "tests/kernels/test_kernels_span_phases.py": _INTERPRETED,
    "tests/kernels/test_kernels_torch_path.py": _INTERPRETED,
    "tests/kernels/test_kernels_triton_path.py": _INTERPRETED,
}
"""Test file -> why the default tier keeps only the first parametrisation of each of its test functions."""
