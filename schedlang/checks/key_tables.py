"""docs/language.md's key tables, written from the key schema: ``python -m schedlang.checks.key_tables``.

Each block's table stands between ``<!-- key table: BLOCK -->`` and ``<!-- end key table -->`` in
docs/language.md; this module rewrites what lies between them from the rows of ``schema.SCHEMA``
(``Key.table_row``), so a key is described once, in its row. ``--check`` rewrites nothing and exits 1 when a
table differs from its rows (tests/docs/test_key_tables.py runs the same comparison).
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

from schedlang.checks.schema import BLOCKS

LANGUAGE_MD = Path(__file__).resolve().parents[1].parent / "docs" / "language.md"
HEADER = ("| Key | Value | Default | Constraints |", "|---|---|---|---|")
LINE_ROWS = {
    "pipeline": ("| `stage R: TASK ...` | one line per stage | none | only with `order = explicit` |",),
}
"""Rows of a block's table that document a line form, not a key."""

_TABLE = re.compile(r"(<!-- key table: (?P<block>[a-z_]+) -->\n)(?P<body>.*?)(<!-- end key table -->)", re.DOTALL)


def block_table(block: str) -> str:
    """The Markdown table of ``block``'s keys, one row per schema row in schema order."""
    rows = (*HEADER, *(key.table_row() for key in BLOCKS[block]), *LINE_ROWS.get(block, ()))
    return "\n".join(rows) + "\n"


def with_tables(text: str) -> str:
    """``text`` (docs/language.md) with every marked table rewritten from the schema."""
    return _TABLE.sub(lambda match: match.group(1) + block_table(match.group("block")) + match.group(4), text)


def marked_blocks(text: str) -> list[str]:
    return [match.group("block") for match in _TABLE.finditer(text)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only report whether the tables are up to date")
    parser.add_argument("--path", type=Path, default=LANGUAGE_MD, help="the language reference to rewrite")
    args = parser.parse_args(argv)
    text = args.path.read_text(encoding="utf-8")
    rewritten = with_tables(text)
    if args.check:
        if rewritten != text:
            print(f"{args.path}: the key tables differ from the schema; run python -m schedlang.checks.key_tables")
            return 1
        return 0
    if rewritten != text:
        args.path.write_text(rewritten, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
