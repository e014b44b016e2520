"""The ``model`` block: readers of its structured values.

Contract: the readers follow ``schedlang.checks.readers`` (return the value or
report and return ``None``); the model record is built from the key schema's rows by
``checks.records.build_model``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from schedlang import ast
from schedlang.checks.readers import choice_hint, read_call, read_integer, read_number
from schedlang.vocabulary import LayerKind, MlpKind, ModelConfig

if TYPE_CHECKING:
    from schedlang.checks.context import Checker

# Limits that keep a typo such as `layers = [gla] * 100000000` from exhausting memory (and MAX_HEAD_DIM,
# MAX_SHORT_CONV_SIZE of vocabulary.model_settings, which its key rows name).
MAX_LAYERS = 4096

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


MlpFields = tuple[float, "int | None"]
"""What ``model.mlp`` fills: the model record's ``mlp_ratio`` (0: ``none``) and ``options.mlp_width``."""

DEFAULT_MLP_RATIO = ModelConfig.mlp_ratio


def read_mlp(checker: Checker, value: ast.Value, path: str) -> MlpFields | None:
    """``swiglu(ratio = r)`` (``r > 0``, default the model record's), ``swiglu(intermediate_size = n)``
    (the hidden width as is) or ``none`` (ratio 0)."""
    signatures = {MlpKind.SWIGLU.value: ("ratio", "intermediate_size"), MlpKind.NONE.value: ()}
    call = read_call(checker, value, path, signatures, "mlp")
    if call is None:
        return None
    if call.name == MlpKind.NONE.value:
        return 0.0, None
    if "ratio" in call.arguments and "intermediate_size" in call.arguments:
        checker.error(
            "give swiglu a ratio or an intermediate_size, not both", call.arguments["intermediate_size"].span
        )
        return None
    if "intermediate_size" in call.arguments:
        width = read_integer(checker, call.arguments["intermediate_size"].value, f"{path}.intermediate_size", 1, 1 << 24)
        return None if width is None else (DEFAULT_MLP_RATIO, width)
    if "ratio" not in call.arguments:
        return DEFAULT_MLP_RATIO, None
    ratio = read_number(checker, call.arguments["ratio"].value, f"{path}.ratio", 0.0, above=True)
    return None if ratio is None else (ratio, None)


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


def read_dt_limit(checker: Checker, value: ast.Value, path: str) -> tuple[float, float] | None:
    """``[low, high]``: two numbers, ``0 <= low < high`` (fla's ``dt_limit``)."""
    if not isinstance(value, ast.ListLiteral) or len(value.items) != 2:
        checker.error(
            f"'{path}' must be a list of two numbers [low, high], found '{checker.text_of(value.span)}'",
            value.span,
            hint="e.g. `dt_limit = [0.001, 0.1]`, or `none` for no clamp",
        )
        return None
    low = read_number(checker, value.items[0], f"{path}'s low end", 0.0)
    high = read_number(checker, value.items[1], f"{path}'s high end", 0.0, above=True)
    if low is None or high is None:
        return None
    if low >= high:
        checker.error(f"'{path}' must have low < high, found {low:g} >= {high:g}", value.span)
        return None
    return (low, high)
