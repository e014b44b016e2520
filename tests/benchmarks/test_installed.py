"""benchmarks/installed.py: an installed package named ``kernels`` wins over the checkout's own ``kernels``."""

import importlib
import sys

import pytest

from benchmarks.installed import CHECKOUT, import_installed


@pytest.fixture
def installed_site(tmp_path, monkeypatch):
    """A site folder, second on sys.path, with a distribution ``kernels`` and a package that imports from it
    (as transformers 5 imports Hugging Face's ``kernels``); the checkout first on sys.path, as pytest and
    ``python -m`` put it."""
    (tmp_path / "kernels").mkdir()
    (tmp_path / "kernels" / "__init__.py").write_text("MARKER = 'installed'\n")
    (tmp_path / "kernels-1.0.dist-info").mkdir()
    (tmp_path / "kernels-1.0.dist-info" / "METADATA").write_text("Metadata-Version: 2.1\nName: kernels\nVersion: 1.0\n")
    (tmp_path / "peer_package").mkdir()
    (tmp_path / "peer_package" / "__init__.py").write_text("from kernels import MARKER\n")
    monkeypatch.setattr(sys, "path", [str(CHECKOUT), str(tmp_path), *sys.path])
    for name in ("kernels", "peer_package"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    importlib.invalidate_caches()
    yield
    for name in ("kernels", "peer_package"):
        sys.modules.pop(name, None)


def test_a_plain_import_finds_the_checkouts_kernels(installed_site):
    with pytest.raises(ImportError, match="MARKER"):
        importlib.import_module("peer_package")


def test_import_installed_finds_the_installed_kernels_and_restores_the_path(installed_site):
    path = list(sys.path)
    peer = import_installed("peer_package")
    assert peer.MARKER == "installed"
    assert sys.modules["kernels"].MARKER == "installed"
    assert sys.path == path
