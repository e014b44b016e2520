"""The host's memory as the runtime reads it (runtime/host_memory.py) and the share offload may pin
(runtime/offload.py, ``PinnedBudget``)."""

from __future__ import annotations

import pytest
import torch

from schedlang.runtime.host_memory import available_memory_bytes, meminfo_bytes, physical_memory_bytes
from schedlang.runtime.offload import PinnedBudget, PinnedMemoryExhaustedError

MEMINFO = """\
MemTotal:       131072000 kB
MemFree:         1000000 kB
MemAvailable:   120000000 kB
HugePages_Total:       0
"""


def test_meminfo_fields_are_read_in_bytes():
    assert meminfo_bytes(MEMINFO, "MemTotal") == 131072000 * 1024
    assert meminfo_bytes(MEMINFO, "MemAvailable") == 120000000 * 1024
    assert meminfo_bytes(MEMINFO, "HugePages_Total") == 0  # no unit: a count
    assert meminfo_bytes(MEMINFO, "SwapTotal") is None
    assert meminfo_bytes("MemAvailable: lots kB\n", "MemAvailable") is None


def test_this_machine_reports_its_memory():
    physical = physical_memory_bytes()
    assert physical is not None and physical > 2**28
    available = available_memory_bytes()
    assert available is None or 0 < available <= physical


def test_the_nodes_ranks_share_what_is_available(monkeypatch):
    if available_memory_bytes() is None:
        pytest.skip("no /proc/meminfo")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")
    alone = PinnedBudget.of_this_host().available
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    shared = PinnedBudget.of_this_host().available
    assert shared == pytest.approx(alone / 4, rel=0.05)  # MemAvailable moves a little between the two reads


def test_a_budget_refuses_what_would_pass_it_and_counts_nothing_then():
    budget = PinnedBudget(available=1000)
    budget.take(600, (0, 0))
    with pytest.raises(PinnedMemoryExhaustedError, match=r"needs 0.00 GiB .* \(at microbatch and chunk \(0, 1\)\)"):
        budget.take(500, (0, 1))
    assert (budget.pinned, budget.most) == (600, 600)
    budget.give_back(600)
    budget.take(1000, (0, 2))
    assert (budget.pinned, budget.most) == (1000, 1000)


def test_the_pinned_host_peak_is_the_host_allocators_and_shows_in_the_step_line(monkeypatch):
    from schedlang.runtime.progress import StepMetrics, progress_line
    from schedlang.runtime.trainer import peak_pinned_host_bytes

    assert peak_pinned_host_bytes(torch.device("cpu")) is None
    monkeypatch.setattr(torch.cuda, "host_memory_stats", lambda: {"allocated_bytes.peak": 3 * 2**30})
    assert peak_pinned_host_bytes(torch.device("cuda")) == 3 * 2**30
    monkeypatch.setattr(torch.cuda, "host_memory_stats", lambda: {})  # a torch that does not say
    assert peak_pinned_host_bytes(torch.device("cuda")) is None
    line = progress_line(StepMetrics(3, 2.5, 1000.0, 0.1, 1 << 20, pinned_host_bytes=3 * 2**30), 10)
    assert line.endswith("peak mem 1.0 MiB  pinned 3.0 GiB")
    assert "pinned" not in progress_line(StepMetrics(3, 2.5, 1000.0, 0.1, 1 << 20), 10)


def test_the_allocators_retries_are_read_from_its_stats_on_cuda_alone(monkeypatch):
    """A step of a nearly full device that released the allocator's cache and retried is the slow one of its
    neighbours: --metrics carries the running count, which the CPU has none of."""
    from schedlang.runtime.trainer import allocator_retries

    assert allocator_retries(torch.device("cpu")) is None
    monkeypatch.setattr(torch.cuda, "memory_stats", lambda device=None: {"num_alloc_retries": 7})
    assert allocator_retries(torch.device("cuda")) == 7
    monkeypatch.setattr(torch.cuda, "memory_stats", lambda device=None: {})  # nothing allocated yet
    assert allocator_retries(torch.device("cuda")) == 0
