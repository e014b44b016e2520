"""The host's memory as the runtime reads it (runtime/host_memory.py) and the share offload may pin
(runtime/offload.py, ``PinnedBudget``)."""

from __future__ import annotations

import pytest

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
