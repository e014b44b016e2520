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

import fnmatch
from pathlib import Path

import torch

FULL_TIER_DIRECTORIES: tuple[str, ...] = ("tests/benchmarks",)
"""Directories (relative to the repository root) whose tests are all in the full tier."""

_LONG_KERNEL = "a long case in Triton's interpreter (5-35 CPU s); the kernel's other tests stay in the default tier"
_TRAINS = "a full CPU training run through the CLI (13-18 CPU s); tests/runtime/test_runtime_evaluation.py trains"
_OFFLOAD = "real copies through pinned memory, every recompute mode (12-19 CPU s each); the offload hooks stay"

FULL_TIER_TESTS: dict[str, str] = {
    "tests/kernels/test_kernels_torch_path.py::test_torch_path_at_a_length_far_from_the_chunk_grid*": _LONG_KERNEL,
    "tests/kernels/test_kernels_torch_path.py::test_torch_path_in_float32_stays_within_float32_error*": _LONG_KERNEL,
    "tests/kernels/test_kernels_triton_path.py::test_gla_launch_table_variants_stay_exact*": _LONG_KERNEL,
    "tests/kernels/test_kernels_gdn.py::test_float32_stays_within_float32_error": _LONG_KERNEL,
    "tests/kernels/test_kernels_gdn.py::test_the_backward_state_pass_can_form_the_output_terms_itself*": _LONG_KERNEL,
    "tests/kernels/test_kernels_gdn.py::test_stored_value_operands_give_16_bit_inputs_the_same_gradients": _LONG_KERNEL,
    "tests/reliability/test_reliability_data.py::test_text_data_is_tokenised_once_into_the_cache_and_trains": _TRAINS,
    "tests/reliability/test_reliability_data.py::test_tokens_data_reads_sequences_of_the_file_and_trains": _TRAINS,
    "tests/runtime/test_runtime_tensorboard.py::test_a_run_writes_its_losses_as_scalars_in_the_schedule_relative_*": (
        _TRAINS
    ),
    "tests/runtime/test_runtime_recompute.py::test_offload_through_real_copies_changes_nothing*": _OFFLOAD,
}
"""Node-id pattern -> why the tests it matches are in the full tier (their time, and what the default tier
keeps instead)."""

_INTERPRETED = "Triton's interpreter runs every kernel case for seconds on a CPU; one case per test checks each kernel"

FIRST_PARAMETRISATION_ONLY: dict[str, str] = {
    "tests/kernels/test_kernels_gdn.py": _INTERPRETED,
    "tests/kernels/test_kernels_pointwise.py": _INTERPRETED,
    "tests/kernels/test_kernels_span_phases.py": _INTERPRETED,
    "tests/kernels/test_kernels_torch_path.py": _INTERPRETED,
    "tests/kernels/test_kernels_triton_path.py": _INTERPRETED,
    "tests/runtime/test_runtime_recompute.py": "each case builds and runs a model through every hook (10-12 CPU s)",
    "tests/runtime_hybrid/test_rotary_attention.py": "each case runs chunked attention against the whole (4-7 CPU s)",
    "tests/data_packing/test_fused_documents.py": "float64 references of every operator, one to four documents",
    "tests/reliability/test_reliability_data.py": "each case starts `schedlang check` as a process (3.4 CPU s)",
    "tests/reliability/test_reliability_security.py": "each case starts `schedlang compile` as a process (3.5 CPU s)",
    "tests/models/test_fla_gdn_math.py": "each case runs fla's Gated DeltaNet math chunked and whole (5-13 CPU s)",
}
"""Test file -> why the default tier keeps only the first parametrisation of each of its test functions."""


def in_full_tier(item) -> bool:
    """Whether ``item`` belongs to the full tier by the rules of tests/tiers.py."""
    if item.get_closest_marker("default_tier") is not None:
        return False
    if item.get_closest_marker("full") is not None or item.get_closest_marker("slow") is not None:
        return True
    path = Path(item.nodeid.split("::", 1)[0]).as_posix()
    if any(path.startswith(directory.rstrip("/") + "/") for directory in FULL_TIER_DIRECTORIES):
        return True
    return any(fnmatch.fnmatchcase(item.nodeid, pattern) for pattern in FULL_TIER_TESTS)


def later_parametrisations(items) -> set[str]:
    """Node ids of FIRST_PARAMETRISATION_ONLY's files that are not the first collected case of their function
    (none on a GPU)."""
    seen: set[tuple[str, str]] = set()
    later: set[str] = set()
    if torch.cuda.is_available():  # the files' cases are slow only in Triton's interpreter (tests/tiers.py)
        return later
    for item in items:
        path, _, rest = item.nodeid.partition("::")
        if path not in FIRST_PARAMETRISATION_ONLY or "[" not in rest:
            continue
        function = (path, rest.split("[", 1)[0])
        if function in seen:
            later.add(item.nodeid)
        seen.add(function)
    return later


def stale_patterns(items) -> list[str]:
    """Patterns of FULL_TIER_TESTS whose file was collected but which match none of its tests, and files or
    directories of tests/tiers.py that do not exist."""
    collected_files = {item.nodeid.split("::", 1)[0] for item in items}
    root = Path(__file__).resolve().parent.parent
    named = [*FIRST_PARAMETRISATION_ONLY, *FULL_TIER_DIRECTORIES]
    missing_files = [path for path in named if not (root / path).exists()]
    return missing_files + [
        pattern
        for pattern in FULL_TIER_TESTS
        if pattern.split("::", 1)[0] in collected_files
        and not any(fnmatch.fnmatchcase(item.nodeid, pattern) for item in items)
    ]
