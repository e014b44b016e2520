"""The ``model`` block: readers of its structured values, and its spec.

Contract: the readers follow ``schedlang.checks.readers`` (return the value or
report and return ``None``); :func:`build_model` is pure and returns the
:class:`ModelSpec` when every model key read cleanly and no rule refused one.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from schedlang import ast
from schedlang.checks.readers import choice_hint, read_call, read_integer, read_number
from schedlang.lowering.program import MlpKind, MlpSpec, ModelSpec
from schedlang.vocabulary import LayerKind

if TYPE_CHECKING:
    from schedlang.checks.context import Checker

# Limits that keep a typo such as `layers = [gla] * 100000000` from exhausting memory.
MAX_LAYERS = 4096
MAX_HEAD_DIM = 1024

StageAssignment = tuple[tuple[tuple[int, ...], ...], list]


def read_layers(checker: Checker, value: ast.Value, path: str) -> tuple[LayerKind, ...] | None:
    """``[gla] * 4``, ``[gla, gla, gla, attn] * 2``, nested lists: at most ``MAX_LAYERS`` layer kinds."""
    if not isinstance(value, (ast.ListLiteral, ast.RepeatList)):
        checker.error(
            f"'{path}' must be a list of layer kinds such as [gla] * 4, found '{checker.text_of(value.span)}'",
            value.span,
        )
        return None
    kinds: list[LayerKind] = []
    if not _flatten_layers(checker, value, path, kinds):
        return None
    if not kinds:
        checker.error(
            f"'{path}' is empty; a model needs at least one layer", value.span, hint="e.g. `layers = [gla] * 4`"
        )
        return None
    return tuple(kinds)


def _flatten_layers(checker: Checker, value: ast.Value, path: str, out: list[LayerKind]) -> bool:
    options = [kind.value for kind in LayerKind]
    if isinstance(value, ast.Identifier):
        if value.name not in options:
            checker.error(f"unknown layer kind '{value.name}'", value.span, hint=choice_hint(value.name, options))
            return False
        out.append(LayerKind(value.name))
        return True
    if isinstance(value, ast.ListLiteral):
        ok = True
        for item in value.items:
            ok = _flatten_layers(checker, item, path, out) and ok
            if len(out) > MAX_LAYERS:
                checker.error(f"'{path}' has more than {MAX_LAYERS} layers", value.span)
                return False
        return ok
    if isinstance(value, ast.RepeatList):
        count = read_integer(checker, value.count, f"the repeat count of {path}", 1)
        inner: list[LayerKind] = []
        ok = _flatten_layers(checker, value.list, path, inner)
        if count is None or not ok:
            return False
        if len(out) + len(inner) * count > MAX_LAYERS:
            checker.error(f"'{path}' has more than {MAX_LAYERS} layers", value.span)
            return False
        out.extend(inner * count)
        return True
    checker.error(
        f"expected a layer kind, found '{checker.text_of(value.span)}'",
        value.span,
        hint=f"layer kinds: {', '.join(options)}",
    )
    return False


def read_mlp(checker: Checker, value: ast.Value, path: str) -> MlpSpec | None:
    """``swiglu(ratio = r)`` (``r > 0``, default :class:`MlpSpec`'s) or ``none``."""
    call = read_call(checker, value, path, {MlpKind.SWIGLU.value: ("ratio",), MlpKind.NONE.value: ()}, "mlp")
    if call is None:
        return None
    if call.name == MlpKind.NONE.value:
        return MlpSpec(MlpKind.NONE, 0.0)
    if "ratio" not in call.arguments:
        return MlpSpec(MlpKind.SWIGLU)
    ratio = read_number(checker, call.arguments["ratio"].value, f"{path}.ratio", 0.0, above=True)
    return None if ratio is None else MlpSpec(MlpKind.SWIGLU, ratio)


def read_stage_assignment(checker: Checker, value: ast.Value, path: str) -> StageAssignment | None:
    """``[[0, 1], [2, 3]]``: the layer indices of each stage, with each stage's span.

    Only the shape is read here; whether the lists cover the layers in order is
    the stage-assignment rule's question (``schedlang.checks.rules``).
    """
    if not isinstance(value, ast.ListLiteral) or not all(isinstance(item, ast.ListLiteral) for item in value.items):
        checker.error(
            f"'{path}' must be a list of layer-index lists, one per stage, e.g. [[0, 1], [2, 3]]", value.span
        )
        return None
    stages = []
    ok = True
    for stage_list in value.items:
        indices = []
        for item in stage_list.items:
            index = read_integer(checker, item, f"a layer index in {path}", 0, MAX_LAYERS)
            if index is None:
                ok = False
            else:
                indices.append(index)
        stages.append(tuple(indices))
    if not ok:
        return None
    return tuple(stages), [item.span for item in value.items]


def build_model(checker: Checker) -> ModelSpec | None:
    paths = ("model.vocab", "model.d_model", "model.layers", "model.heads", "model.head_dim", "model.mlp")
    if not checker.valid(*paths):
        return None
    return ModelSpec(*(checker.get(path) for path in paths))
