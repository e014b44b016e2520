"""Shared fixtures of the exporter tests: golden files and the tiny schedule.

``SCHEDLANG_UPDATE_GOLDEN=1 python -m pytest tests/export`` rewrites the files
under ``tests/export/golden/`` instead of comparing; review the diff before
committing it.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from export_programs import tiny_program

GOLDEN_DIRECTORY = Path(__file__).parent / "golden"


def updating_golden() -> bool:
    return os.environ.get("SCHEDLANG_UPDATE_GOLDEN") == "1"


def assert_matches_golden(name: str, text: str) -> None:
    path = GOLDEN_DIRECTORY / name
    if updating_golden():
        path.write_text(text)
        return
    assert path.exists(), f"golden file {path} is missing; create it with SCHEDLANG_UPDATE_GOLDEN=1"
    expected = path.read_text()
    assert text == expected, (
        f"output differs from {path}; if the change is intended, rerun with SCHEDLANG_UPDATE_GOLDEN=1 "
        "and review the diff"
    )


@pytest.fixture
def golden():
    """``golden(name, text)`` compares ``text`` with ``golden/<name>`` (or rewrites it when updating)."""
    return assert_matches_golden


@pytest.fixture
def tiny():
    """The tiny schedule of the golden files: 2 stages x 2 microbatches x 2 chunks, 1F1B."""
    return tiny_program()
