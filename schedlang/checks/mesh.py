"""The ``mesh`` block: its spec (its keys are plain integers read by the schema's rows).

Contract: :func:`build_mesh` is pure and returns the :class:`MeshSpec` when
every mesh key read cleanly.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from schedlang.lowering.program import MeshSpec

if TYPE_CHECKING:
    from schedlang.checks.context import Checker

# A limit that keeps a typo from asking for an absurd world size.
MAX_MESH_SIZE = 65536


def build_mesh(checker: Checker) -> MeshSpec | None:
    paths = ("mesh.pipeline", "mesh.sequence", "mesh.data")
    if not checker.valid(*paths):
        return None
    return MeshSpec(*(checker.get(path) for path in paths))
