"""A block's settings record, built from what its key schema rows read.

Contract: :func:`record_values` reads every row of a block that fills fields (``Key.fills``) through
``schema.read_key`` and returns each field's value by its dotted path in the block's record
(``"options.gla.gate_rank"``); a row that fills several fields reads as a tuple of their values, or as None
for "leave them at their defaults". A row whose default is derived from other keys (``Derived``) leaves its
fields at the record's defaults when the file does not write it, for the block's own rule to set.
:func:`build_record` makes the record, nested records included; it returns None when a key of the block was
refused (its problem is reported). The blocks' rules that go beyond one row (``expand_k`` makes key widths,
an fp16 run scales its loss) are applied by :func:`build_model` and :func:`build_train` after it.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, TypeVar

from schedlang.checks.schema import BLOCKS, FROM_KEY, Derived
from schedlang.vocabulary import (
    DType,
    LayerKind,
    LossScaleConfig,
    Mamba2Options,
    Mamba3Options,
    ModelConfig,
    TrainConfig,
)

if TYPE_CHECKING:
    from schedlang.checks.context import Checker

RecordType = TypeVar("RecordType")


def record_values(checker: Checker, block: str) -> dict[str, object] | None:
    """``dotted field path -> value`` of the rows of ``block`` that fill fields; None if a key was refused."""
    keys = [key for key in BLOCKS[block] if key.filled_fields]
    if not checker.valid(*(key.path for key in keys)):
        return None
    values: dict[str, object] = {}
    for key in keys:
        value = checker.get(key.path)
        if isinstance(value, Derived):
            continue
        if len(key.filled_fields) == 1:
            values[key.filled_fields[0]] = value
        elif value is not None:
            values.update(zip(key.filled_fields, value, strict=True))
    return values


def with_fields(record: RecordType, values: dict[str, object]) -> RecordType:
    """``record`` with the fields named by dotted paths replaced, nested records rebuilt around them."""
    direct = {path: value for path, value in values.items() if "." not in path}
    nested: dict[str, dict[str, object]] = {}
    for path, value in values.items():
        if "." in path:
            head, rest = path.split(".", 1)
            nested.setdefault(head, {})[rest] = value
    for head, inner in nested.items():
        direct[head] = with_fields(getattr(record, head), inner)
    return dataclasses.replace(record, **direct)


def build_record(checker: Checker, block: str, record_type: type[RecordType]) -> RecordType | None:
    """``record_type`` filled from the rows of ``block`` (see the module docstring)."""
    values = record_values(checker, block)
    if values is None:
        return None
    required = {field.name for field in dataclasses.fields(record_type) if field.init and _has_no_default(field)}
    record = record_type(**{name: values.pop(name) for name in required})
    return with_fields(record, values)


def _has_no_default(field: dataclasses.Field) -> bool:
    return field.default is dataclasses.MISSING and field.default_factory is dataclasses.MISSING


def build_train(checker: Checker) -> TrainConfig | None:
    """The train record; ``loss_scale`` left out is ``dynamic`` with fp16 and none otherwise."""
    train = build_record(checker, "train", TrainConfig)
    if train is None or checker.given("train.loss_scale"):
        return train
    return dataclasses.replace(train, loss_scale=LossScaleConfig() if train.dtype is DType.FP16 else None)


MAMBA3_SHARED_OPTIONS = ("state_size", "n_groups", "use_bias", "dt_min", "dt_max", "dt_init_floor")
"""The ``mamba3`` options whose keys Mamba-2's rows fill (``options.mamba2.*``): one key each for both kinds."""


def _mamba3_options(model: ModelConfig) -> Mamba3Options:
    if LayerKind.MAMBA3 not in model.layers:
        return Mamba3Options()
    shared = {name: getattr(model.options.mamba2, name) for name in MAMBA3_SHARED_OPTIONS}
    return dataclasses.replace(model.options.mamba3, **shared)


def build_model(checker: Checker) -> ModelConfig | None:
    """The model record: the rows' fields, then the rules of three keys that fill no field as they are.
    ``expand_k`` becomes the per-head key width of ``gla`` and ``gdn`` layers (the rules of
    ``checks.model_rules`` have checked it divides evenly; a model without ``gdn`` layers records none for
    them); ``value_heads`` becomes ``GdnOptions.value_heads`` unless it is ``heads`` or there are no ``gdn``
    layers, so such a model records no grouped values; a model without ``mamba2`` layers records no
    ``mamba2`` options and one without ``mamba3`` layers no ``mamba3`` options (a ``mamba3`` layer's
    ``state_size``, ``n_groups``, ``use_bias`` and ``dt_*`` come from the keys Mamba-2 shares); ``model.from``'s weights, when it has any, become the
    initial weights."""
    if not checker.valid(*(key.path for key in BLOCKS["model"] if key.name != "stages")):
        return None
    model = build_record(checker, "model", ModelConfig)
    if model is None:
        return None
    expand_k, value_heads, imported = (
        checker.get(path) for path in ("model.expand_k", "model.value_heads", FROM_KEY)
    )
    has_gdn = LayerKind.GDN in model.layers
    head_k_dim = None if isinstance(expand_k, Derived) else round(model.d_model * expand_k) // model.heads
    value_heads = None if isinstance(value_heads, Derived) or value_heads == model.heads or not has_gdn else value_heads
    return with_fields(
        model,
        {
            "options.gla.head_k_dim": head_k_dim,
            "options.gdn.head_k_dim": head_k_dim if has_gdn else None,
            "options.gdn.value_heads": value_heads,
            "options.mamba2": model.options.mamba2 if LayerKind.MAMBA2 in model.layers else Mamba2Options(),
            "options.mamba3": _mamba3_options(model),
            "options.initial_weights": imported.directory if imported is not None and imported.has_weights else None,
        },
    )
