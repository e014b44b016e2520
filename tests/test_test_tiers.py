"""The rules that put a test in the default or the full tier ([Note: test tiers] in tests/conftest.py), and
that CI's two runs together select every test once."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

import tiers
from tiers import in_full_tier, stale_patterns


def _item(nodeid: str, *markers: str):
    return SimpleNamespace(nodeid=nodeid, get_closest_marker=lambda name: object() if name in markers else None)


def test_slow_and_full_marks_go_to_the_full_tier_unless_marked_default_tier():
    assert not in_full_tier(_item("tests/frontend/test_x.py::test_a"))
    assert in_full_tier(_item("tests/frontend/test_x.py::test_a", "slow"))
    assert in_full_tier(_item("tests/frontend/test_x.py::test_a", "full"))
    assert not in_full_tier(_item("tests/runtime/test_x.py::test_a", "slow", "default_tier"))


def test_listed_patterns_and_directories_go_to_the_full_tier(monkeypatch):
    monkeypatch.setattr(tiers, "FULL_TIER_TESTS", {"tests/kernels/test_k.py::test_big[*T4096*": "large"})
    monkeypatch.setattr(tiers, "FULL_TIER_DIRECTORIES", ("tests/benchmarks",))
    assert in_full_tier(_item("tests/kernels/test_k.py::test_big[B2-T4096-H4]"))
    assert not in_full_tier(_item("tests/kernels/test_k.py::test_big[B2-T63-H4]"))
    assert in_full_tier(_item("tests/benchmarks/test_b.py::test_a"))
    assert not in_full_tier(_item("tests/benchmarks_other/test_b.py::test_a"))


def test_a_pattern_that_matches_no_test_of_a_collected_file_is_reported(monkeypatch):
    monkeypatch.setattr(tiers, "FULL_TIER_TESTS", {"tests/a.py::test_renamed": "", "tests/b.py::test_b": ""})
    items = [_item("tests/a.py::test_new"), _item("tests/c.py::test_c")]
    assert stale_patterns(items) == ["tests/a.py::test_renamed"]


def test_every_listed_pattern_says_why():
    assert all(reason.strip() for reason in tiers.FULL_TIER_TESTS.values())


def test_this_session_selected_the_tier_it_was_asked_for(request):
    """Without --full no selected test is in the full tier; CI's second run (--full -m full) selects only it."""
    full = request.config.getoption("--full")
    marks = [item.get_closest_marker("full") is not None for item in request.session.items]
    if not full:
        assert not any(marks)
    elif request.config.getoption("-m") == "full":
        assert all(marks)


def test_a_trimmed_file_keeps_the_first_case_of_each_function_in_the_default_tier(monkeypatch):
    monkeypatch.setattr(tiers, "FIRST_PARAMETRISATION_ONLY", {"tests/k.py": "interpreter time"})
    items = [_item(nodeid) for nodeid in (
        "tests/k.py::test_a[small]", "tests/k.py::test_a[large]", "tests/k.py::test_b", "tests/k.py::test_c[x]",
        "tests/other.py::test_a[small]", "tests/other.py::test_a[large]",
    )]
    assert tiers.later_parametrisations(items) == {"tests/k.py::test_a[large]"}
