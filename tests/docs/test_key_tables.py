"""docs/language.md's key tables are the key schema's rows, written by ``python -m schedlang.checks.key_tables``."""

from __future__ import annotations

from schedlang.checks import key_tables
from schedlang.checks.schema import BLOCKS, KEYS


def test_the_key_tables_are_written_from_the_schema():
    text = key_tables.LANGUAGE_MD.read_text(encoding="utf-8")
    assert key_tables.marked_blocks(text) == list(BLOCKS)
    assert key_tables.with_tables(text) == text, "run python -m schedlang.checks.key_tables"


def test_a_changed_row_changes_its_table(tmp_path):
    """The generator reads the rows: a table edited by hand is rewritten, and --check reports it."""
    text = key_tables.LANGUAGE_MD.read_text(encoding="utf-8")
    row = KEYS["train.grad_clip"].table_row()
    edited = tmp_path / "language.md"
    edited.write_text(text.replace(row, row.replace("global gradient-norm clip", "clip")), encoding="utf-8")
    assert key_tables.main(["--check", "--path", str(edited)]) == 1
    assert key_tables.main(["--path", str(edited)]) == 0
    assert edited.read_text(encoding="utf-8") == text
    assert key_tables.main(["--check", "--path", str(edited)]) == 0
