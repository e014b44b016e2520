"""pyproject.toml's package list names every package of the tree: a wheel (not the editable install the tests
run from) carries only the packages listed, so a folder left out imports here and fails once installed."""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_every_package_folder_is_listed_in_pyproject():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    setuptools = project["tool"]["setuptools"]
    listed = set(setuptools["packages"])
    folders = {}
    for package, folder in setuptools["package-dir"].items():
        for init in (ROOT / folder).rglob("__init__.py"):
            relative = init.parent.relative_to(ROOT / folder)
            name = ".".join([package, *relative.parts])
            folders[name] = init.parent
    missing = sorted(set(folders) - listed)
    assert not missing, f"packages missing from pyproject.toml's list: {missing}"
    assert not sorted(listed - set(folders)), "pyproject.toml lists packages with no folder"
