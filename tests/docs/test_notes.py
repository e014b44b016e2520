"""The ``[Note: name]`` cross-references: every cited Note is defined exactly once, and docs/notes.md lists every
Note with the file that defines it.

A Note is *defined* where its tag starts a line (after indentation, a ``#`` or ``//`` comment marker, a
docstring's opening quotes or a Markdown heading) and is followed by the end of the line or by the first
sentence of the note (a capital letter); every other occurrence *cites* it. A tag may wrap across lines.
Run this file with Python to print a fresh index for docs/notes.md.
"""

from __future__ import annotations

import re
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
INDEX = ROOT / "docs" / "notes.md"
SCANNED_SUFFIXES = {".py", ".md", ".jinja", ".sched", ".lark", ".toml"}
SKIPPED_PARTS = {".git", ".venv", "build", "dist", "__pycache__", ".pytest_cache", ".hypothesis"}
TAG = re.compile(r"\[Note:\s+([^\]]+?)\]", re.DOTALL)
LINE_START = re.compile(r'(?:^|\n)[ \t]*(?:(?:#+|//)[ \t]*)?(?:"""|\'\'\')?$')
DEFINITION_FOLLOWS = re.compile(r"[ \t]*(?:\n|$|[ \t][A-Z])")
INDEX_ROW = re.compile(r"^\| `\[Note: (?P<name>[^\]]+)\]` \| `(?P<defined>[^`]+)`", re.MULTILINE)


def note_name(raw: str) -> str:
    """The tag's name with line wraps (and the comment markers of wrapped comment lines) folded to one space."""
    return re.sub(r"\s*\n\s*(?:(?:#+|//)\s*)?", " ", raw).strip()


def scanned_files() -> list[Path]:
    files = []
    for path in sorted(ROOT.rglob("*")):
        relative = path.relative_to(ROOT)
        if path.suffix in SCANNED_SUFFIXES and path.is_file() and not SKIPPED_PARTS & set(relative.parts):
            if path not in (INDEX, Path(__file__).resolve()):
                files.append(path)
    return files


def scan() -> tuple[dict[str, list[str]], dict[str, set[str]]]:
    """(name -> the files defining it, one entry per definition; name -> the files citing it)."""
    definitions: dict[str, list[str]] = defaultdict(list)
    citations: dict[str, set[str]] = defaultdict(set)
    for path in scanned_files():
        text = path.read_text(encoding="utf-8", errors="replace")
        relative = path.relative_to(ROOT).as_posix()
        for match in TAG.finditer(text):
            name = note_name(match.group(1))
            starts_line = LINE_START.search(text[max(0, match.start() - 200) : match.start()]) is not None
            if starts_line and DEFINITION_FOLLOWS.match(text, match.end()):
                definitions[name].append(relative)
            else:
                citations[name].add(relative)
    return definitions, citations


def index_text() -> str:
    """The table of docs/notes.md, from the tree as it is."""
    definitions, citations = scan()
    lines = ["| Note | Defined in | Cited in |", "|---|---|---|"]
    for name in sorted(set(definitions) | set(citations), key=str.lower):
        defined = ", ".join(f"`{path}`" for path in definitions.get(name, [])) or "(nowhere)"
        cited = ", ".join(f"`{path}`" for path in sorted(citations.get(name, set()))) or "-"
        lines.append(f"| `[Note: {name}]` | {defined} | {cited} |")
    return "\n".join(lines) + "\n"


def test_every_cited_note_is_defined_exactly_once():
    definitions, citations = scan()
    undefined = sorted(name for name in citations if name not in definitions)
    repeated = {name: paths for name, paths in definitions.items() if len(paths) > 1}
    assert not undefined, f"cited but never defined: {undefined}"
    assert not repeated, f"defined more than once: {repeated}"


def test_docs_notes_lists_every_note_where_it_is_defined():
    definitions, _ = scan()
    listed = {match["name"]: match["defined"] for match in INDEX_ROW.finditer(INDEX.read_text(encoding="utf-8"))}
    missing = sorted(set(definitions) - set(listed))
    stale = sorted(set(listed) - set(definitions))
    moved = {
        name: (listed[name], paths[0])
        for name, paths in definitions.items()
        if name in listed and listed[name] != paths[0]
    }
    hint = "; run `python tests/docs/test_notes.py` for a fresh table"
    assert not missing, f"docs/notes.md does not list {missing}{hint}"
    assert not stale, f"docs/notes.md lists Notes that no file defines: {stale}{hint}"
    assert not moved, f"docs/notes.md names the wrong defining file (listed, actual): {moved}{hint}"


def test_a_definition_and_a_citation_are_told_apart(tmp_path, monkeypatch):
    (tmp_path / "docs").mkdir()
    (tmp_path / "a.py").write_text('"""Module.\n\n[Note: alpha rule]\nThe rule.\n"""\n# [Note: beta] The other rule.\n')
    (tmp_path / "b.py").write_text("x = 1  # see [Note: alpha\n# rule] in a.py\n\"\"\"[Note: beta]: cited.\"\"\"\n")
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    monkeypatch.setattr(sys.modules[__name__], "INDEX", tmp_path / "docs" / "notes.md")
    definitions, citations = scan()
    assert dict(definitions) == {"alpha rule": ["a.py"], "beta": ["a.py"]}
    assert dict(citations) == {"alpha rule": {"b.py"}, "beta": {"b.py"}}


if __name__ == "__main__":
    sys.stdout.write(index_text())
