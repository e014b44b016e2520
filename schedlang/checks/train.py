"""The ``train`` block: readers of its calls and its checkpoint clause.

Contract: the readers follow ``schedlang.checks.readers``; an argument left out
keeps the default of the vocabulary's record (:class:`OptimizerConfig`, :class:`DataConfig`, ...).
The block's record, :class:`TrainConfig`, is built from the key schema's rows (``schema.build_record``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from schedlang import ast
from schedlang.checks.readers import read_call, read_choice, read_integer, read_number
from schedlang.vocabulary import (
    DataConfig,
    DataKind,
    DType,
    LearningRateScheduleConfig,
    LearningRateScheduleKind,
    LossScaleConfig,
    OptimizerConfig,
    OptimizerKind,
    TokenFileDType,
)
from schedlang.vocabulary.train_settings import MAX_SEED

if TYPE_CHECKING:
    from schedlang.checks.context import Checker

OPTIMIZER_ARGUMENTS = {
    OptimizerKind.ADAMW.value: ("lr", "weight_decay", "betas"),
    OptimizerKind.SGD.value: ("lr", "momentum", "weight_decay"),
}
DATA_ARGUMENTS = {
    DataKind.SYNTHETIC.value: ("seed",),
    DataKind.BYTES.value: ("path", "seed", "validation", "document_end"),
    DataKind.TOKENS.value: ("path", "dtype", "seed", "validation", "document_end"),
    DataKind.TEXT.value: ("path", "tokenizer", "seed", "validation", "document_end"),
}
MAX_TOKEN_ID = (1 << 32) - 1  # the largest id a uint32 tokens file holds
SCHEDULE_ARGUMENTS = {kind.value: ("warmup", "min_lr") for kind in LearningRateScheduleKind}


def read_optimizer(checker: Checker, value: ast.Value, path: str) -> OptimizerConfig | None:
    """``adamw(lr, weight_decay, betas)`` or ``sgd(lr, momentum, weight_decay)``."""
    call = read_call(checker, value, path, OPTIMIZER_ARGUMENTS, "optimizer")
    if call is None:
        return None
    readers = {
        "lr": lambda item, where: read_number(checker, item, where, 0.0, above=True),
        "weight_decay": lambda item, where: read_number(checker, item, where, 0.0),
        "momentum": lambda item, where: read_number(checker, item, where, 0.0, below=1.0),
        "betas": lambda item, where: read_betas(checker, item, where),
    }
    fields: dict[str, object] = {"kind": OptimizerKind(call.name)}
    for name, reader in readers.items():
        if name in call.arguments:
            fields[name] = reader(call.arguments[name].value, f"{path}.{name}")
    if any(field is None for field in fields.values()):
        return None
    return OptimizerConfig(**fields)


def read_betas(checker: Checker, value: ast.Value, path: str) -> tuple[float, float] | None:
    if not isinstance(value, ast.ListLiteral) or len(value.items) != 2:
        checker.error(f"'{path}' must be a list of two numbers, e.g. [0.9, 0.95]", value.span)
        return None
    betas = [read_number(checker, item, path, 0.0, below=1.0) for item in value.items]
    return None if None in betas else (betas[0], betas[1])


def read_data(checker: Checker, value: ast.Value, path: str) -> DataConfig | None:
    """``synthetic(seed = s)``, ``bytes(path = "file", seed = s)`` or ``tokens(path = "file", dtype = t, seed = s)``
    (``path`` required), or ``text(path, tokenizer)``; file data may name its ``document_end``."""
    call = read_call(checker, value, path, DATA_ARGUMENTS, "data source")
    if call is None:
        return None
    if call.name == DataKind.TOKENS.value and "path" not in call.arguments:
        checker.error(
            "tokens data needs the file of token ids", call.span, hint='write `tokens(path = "train.bin")`'
        )
        return None
    if call.name == DataKind.TEXT.value and not {"path", "tokenizer"} <= set(call.arguments):
        checker.error(
            "text data needs the text file and the tokenizer",
            call.span,
            hint='write `text(path = "corpus.txt", tokenizer = "tokenizer.json")`',
        )
        return None
    tokenizer = None
    if "tokenizer" in call.arguments:
        tokenizer = read_file_name(checker, call.arguments["tokenizer"].value, f"{path}.tokenizer", "tokenizer.json")
        if tokenizer is None:
            return None
    dtype = DataConfig.dtype
    if "dtype" in call.arguments:
        dtype = read_choice(checker, call.arguments["dtype"].value, f"{path}.dtype", TokenFileDType, "token dtype")
        if dtype is None:
            return None
    seed = DataConfig.seed
    if "seed" in call.arguments:
        seed = read_integer(checker, call.arguments["seed"].value, f"{path}.seed", 0, MAX_SEED)
    data_path = DataConfig.path
    if "path" in call.arguments:
        data_path = read_file_name(checker, call.arguments["path"].value, f"{path}.path", "data.txt")
        if data_path is None:
            return None
    validation = DataConfig.validation
    if "validation" in call.arguments:
        validation = read_number(checker, call.arguments["validation"].value, f"{path}.validation", 0.0, below=1.0)
    document_end = DataConfig.document_end
    if "document_end" in call.arguments:
        document_end = read_document_end(checker, call.arguments["document_end"].value, f"{path}.document_end", call.name)
        if document_end is None:
            return None
    if seed is None or validation is None:
        return None
    return DataConfig(DataKind(call.name), seed, data_path, dtype, tokenizer, validation, document_end)


def read_document_end(checker: Checker, value: ast.Value, path: str, kind: str) -> int | str | None:
    """A token id ``>= 0``; for ``text`` data also the tokenizer's name of the token, such as ``"<|endoftext|>"``.
    Whether the id is in the vocabulary (or the name in the tokenizer) is the file checks' question."""
    if kind == DataKind.TEXT.value and isinstance(value, ast.StringLiteral):
        if value.value:
            return value.value
        checker.error(f"'{path}' must name a token of the tokenizer, such as \"<|endoftext|>\"", value.span)
        return None
    if kind != DataKind.TEXT.value and isinstance(value, ast.StringLiteral):
        checker.error(
            f"'{path}' must be a token id (an integer) for {kind} data",
            value.span,
            hint="only text data names the token, through its tokenizer",
        )
        return None
    return read_integer(checker, value, path, 0, MAX_TOKEN_ID)


def read_file_name(checker: Checker, value: ast.Value, path: str, example: str) -> str | None:
    if isinstance(value, ast.StringLiteral) and value.value:
        return value.value
    checker.error(f"'{path}' must be a non-empty string such as \"{example}\"", value.span)
    return None


def read_lr_schedule(checker: Checker, value: ast.Value, path: str) -> LearningRateScheduleConfig | None:
    """``constant``, ``cosine(warmup = N, min_lr = x)`` or ``linear(warmup = N, min_lr = x)``."""
    call = read_call(checker, value, path, SCHEDULE_ARGUMENTS, "learning-rate schedule")
    if call is None:
        return None
    fields: dict[str, object] = {"kind": LearningRateScheduleKind(call.name)}
    if "warmup" in call.arguments:
        fields["warmup"] = read_integer(checker, call.arguments["warmup"].value, f"{path}.warmup", 0, 1 << 40)
    if "min_lr" in call.arguments:
        fields["min_lr"] = read_number(checker, call.arguments["min_lr"].value, f"{path}.min_lr", 0.0)
    if any(field is None for field in fields.values()):
        return None
    return LearningRateScheduleConfig(**fields)


def read_log(checker: Checker, value: ast.Value, path: str) -> str | None:
    """``tensorboard(directory = "runs/x")``: the TensorBoard directory (``none``, the default, is read by the
    schema row)."""
    call = read_call(checker, value, path, {"tensorboard": ("directory",)}, "log")
    if call is None:
        return None
    if "directory" not in call.arguments:
        checker.error("tensorboard needs the directory it writes to", call.span, hint='write `tensorboard(directory = "runs/x")`')
        return None
    return read_file_name(checker, call.arguments["directory"].value, f"{path}.directory", "runs/x")


def read_checkpoint(checker: Checker, value: ast.Value, path: str) -> tuple[str, int] | None:
    """``"dir" every N``: a non-empty directory and ``N >= 1``, as ``(directory, N)``."""
    if not isinstance(value, ast.EveryClause):
        checker.error(
            f"'{path}' must be a directory and an interval, found '{checker.text_of(value.span)}'",
            value.span,
            hint='write `checkpoint = "checkpoints" every 50`',
        )
        return None
    directory = value.value
    every = read_integer(checker, value.every, f"{path} every", 1)
    if not isinstance(directory, ast.StringLiteral) or not directory.value:
        checker.error('the checkpoint directory must be a non-empty string, e.g. "checkpoints"', directory.span)
        return None
    if every is None:
        return None
    return directory.value, every


def read_loss_scale(checker: Checker, value: ast.Value, path: str) -> LossScaleConfig | None:
    """``dynamic`` or a fixed scale > 0 (``none``, no scaling, is read by the schema row)."""
    if isinstance(value, ast.Call) and not value.arguments:
        value = ast.Identifier(value.name, value.span)
    if isinstance(value, ast.Identifier) and value.name == "dynamic":
        return LossScaleConfig()
    if isinstance(value, (ast.IntLiteral, ast.FloatLiteral)):
        scale = read_number(checker, value, path, 0.0, above=True)
        return None if scale is None else LossScaleConfig(dynamic=False, initial=scale)
    checker.error(
        f"'{path}' must be dynamic, a number or none, found '{checker.text_of(value.span)}'",
        value.span,
        hint="write `loss_scale = dynamic` (the default with fp16) or a fixed scale such as `loss_scale = 1024`",
    )
    return None


def loss_scale_needs_fp16(checker: Checker) -> None:
    """``loss_scale`` keeps small fp16 gradients from flushing to zero; bf16, fp32 and fp64 have fp32's
    exponent range and take no scale."""
    dtype = checker.get("train.dtype")
    if not checker.given("train.loss_scale") or dtype is None or dtype is DType.FP16:
        return
    checker.error(
        f"'train.loss_scale' scales fp16 gradients, but train.dtype = {dtype.value}",
        checker.span_of("train.loss_scale"),
        hint="drop loss_scale, or write `dtype = fp16`",
    )
    checker.reject("train.loss_scale")
