"""Root test configuration.

Without a GPU, Triton kernels can only run under its interpreter, and TRITON_INTERPRET is read when
triton is first imported, so it is set here, before any test module imports triton. It changes nothing
for code that picks the PyTorch path explicitly (backend="torch").

Under pytest-xdist every worker would otherwise start one PyTorch thread per core: 16 workers on a 16-core
machine would run 256 threads (the likely reason GPU-machine runs of tests/kernels stalled on their CPU-heavy
tests). Each worker gets its share of the cores instead.

[Note: test tiers] The default tier is what ``python -m pytest tests`` runs: every module, in a few minutes
on two cores. The full tier holds the rest (long multi-process runs, large sizes, extra parametrisations);
tests/tiers.py says which tests are in it and why, and the hook below marks them ``full``. ``--full`` runs
both tiers; ``--full -m full`` the full tier alone, which is what .ci/run runs after the default tier, so
that CI runs every test exactly once.
"""

import os

import pytest
import torch

from tiers import in_full_tier, later_parametrisations, stale_patterns

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

if os.environ.get("PYTEST_XDIST_WORKER"):
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // max(1, workers)))


def pytest_addoption(parser) -> None:
    parser.addoption(
        "--full", action="store_true", default=False,
        help="also run the full tier (slow multi-process runs, large sizes); with -m full, only it "
        "([Note: test tiers] in tests/conftest.py)",
    )


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items) -> None:
    """Mark the full tier ``full`` (before ``-m`` selects), then, without ``--full``, deselect it."""
    stale = stale_patterns(items)
    if stale:
        raise pytest.UsageError(f"tests/tiers.py names tests that do not exist (renamed?): {', '.join(stale)}")
    later = later_parametrisations(items)
    for item in items:
        if in_full_tier(item) or (item.nodeid in later and item.get_closest_marker("default_tier") is None):
            item.add_marker(pytest.mark.full)
    if config.getoption("--full"):
        return
    kept = [item for item in items if item.get_closest_marker("full") is None]
    if len(kept) < len(items):
        config.hook.pytest_deselected(items=[item for item in items if item.get_closest_marker("full") is not None])
        items[:] = kept
