"""Syntax tree to checked program: the semantic pass of the front end.

Contract: :func:`lower_to_program` takes any :class:`schedlang.ast.ScheduleFile`
the parser produced. It checks every block, key and value (names, types,
ranges, divisibility, chunk boundaries, the stage-to-layer assignment, the
shape of explicit ``stage r:`` lines), collects every problem, and either
raises one :class:`~schedlang.diagnostics.ScheduleError` listing them all in
file order or returns a :class:`~schedlang.lowering.program.ScheduleProgram`
satisfying [Note: program contract], with ``spans`` holding where each key was
written (``"pipeline.order"``, ``"train.optimizer.lr"``, ``"pipeline.stage.1"``).

Explicit orders are only checked token by token here (form ``F<mb>.<chunk>``,
microbatch and chunk in range, one line per stage); whether they are complete
and legal is the legality pass's question.

[Note: sequence-parallel alignment]
With ``mesh.sequence = S`` every pipeline chunk is split contiguously over the
S ranks of its sequence-parallel group, each rank taking an equal run of whole
kernel chunks. So every chunk length, and therefore the sequence length, must be
a multiple of ``S * kernel_chunk``, and chunk boundaries are placed in units of
``S * kernel_chunk`` (for S = 1 this is the plain kernel-chunk rule).
"""

from __future__ import annotations

import difflib
import math
import re
from dataclasses import dataclass
from enum import Enum
from typing import Callable, TypeVar

from schedlang import ast
from schedlang.capabilities import capability_diagnostics
from schedlang.diagnostics import Diagnostic, ScheduleError
from schedlang.lowering.partition import model_balanced_boundaries, uniform_boundaries
from schedlang.lowering.program import (
    CheckpointSpec,
    DataSpec,
    MeshSpec,
    MlpKind,
    MlpSpec,
    ModelSpec,
    OptimizerSpec,
    OrderKind,
    PartitionKind,
    PipelineSpec,
    Recompute,
    ScheduleProgram,
    SequenceSpec,
    StageOrder,
    TaskToken,
    TrainSpec,
)
from schedlang.lowering.tasks import TaskId, TaskKind
from schedlang.vocabulary import DataKind, DType, LayerKind, OptimizerKind, SequenceParallelMethod, Span

BLOCK_KEYS: dict[str, tuple[str, ...]] = {
    "model": ("vocab", "d_model", "layers", "heads", "head_dim", "mlp", "stages"),
    "mesh": ("pipeline", "sequence", "data"),
    "sequence": ("length", "chunks", "partition", "kernel_chunk", "parallel"),
    "pipeline": (
        "microbatches", "order", "microbatch_size", "recompute", "cuda_graphs", "extra_warmup", "split_backward",
        "forward_before_weight", "extra_deferred_weights",
    ),
    "train": ("steps", "optimizer", "dtype", "data", "seed", "grad_clip", "log_every", "checkpoint"),
}

REQUIRED_KEYS: dict[str, dict[str, str]] = {
    "model": {
        "vocab": "vocab = 256",
        "d_model": "d_model = 128",
        "layers": "layers = [gla] * 4",
        "heads": "heads = 2",
        "head_dim": "head_dim = 64",
    },
    "mesh": {},
    "sequence": {"length": "length = 4096"},
    "pipeline": {"microbatches": "microbatches = 4"},
    "train": {},
}

BLOCK_EXAMPLES = {
    "model": "model { vocab = 256  d_model = 128  layers = [gla] * 4  heads = 2  head_dim = 64 }",
    "sequence": "sequence { length = 4096  chunks = 4 }",
    "pipeline": "pipeline { microbatches = 4  order = 1f1b }",
}

# Limits that keep a typo such as `layers = [gla] * 100000000` from exhausting memory.
MAX_LAYERS = 4096
MAX_MESH_SIZE = 65536
MAX_LENGTH = 1 << 31
MAX_MICROBATCHES = 1 << 20
MAX_HEAD_DIM = 1024

_TASK_TOKEN = re.compile(r"^([FBW])([0-9]+)\.([0-9]+)$")
# A dict lookup, not TaskKind(letter): explicit orders can hold 10^5 tasks.
_TASK_KINDS = {kind.value: kind for kind in TaskKind}

EnumType = TypeVar("EnumType", bound=Enum)


def _suggest(word: str, options) -> str | None:
    matches = difflib.get_close_matches(word, list(options), n=1, cutoff=0.6)
    return matches[0] if matches else None


def _one_of(options) -> str:
    options = list(options)
    return ", ".join(options[:-1]) + " or " + options[-1] if len(options) > 1 else options[0]


def _choice_hint(word: str, options) -> str:
    suggestion = _suggest(word, options)
    if suggestion is not None:
        return f"did you mean '{suggestion}'? (expected one of {', '.join(options)})"
    return f"expected one of {', '.join(options)}"


@dataclass(frozen=True)
class _CallValue:
    """A call or a bare name used as one: ``ring`` is ``ring()``."""

    name: str
    name_span: Span
    arguments: dict[str, ast.Argument]
    span: Span


class _Lowering:
    def __init__(self, schedule: ast.ScheduleFile, source_text: str):
        self.schedule = schedule
        self.source_lines = source_text.split("\n")
        self.filename = schedule.span.file
        self.diagnostics: list[Diagnostic] = []
        self.spans: dict[str, Span] = {}
        self.blocks: dict[str, ast.Block] = {}
        self.keys: dict[str, dict[str, ast.Assignment]] = {name: {} for name in BLOCK_KEYS}
        self.stage_lines: list[ast.StageLine] = []
        self.layer_kinds: tuple[LayerKind, ...] | None = None

    def error(self, message: str, span: Span, hint: str | None = None) -> None:
        self.diagnostics.append(Diagnostic.error(message, span, hint))

    def text_of(self, span: Span) -> str:
        """The source text under a one-line span, shortened, for messages."""
        if span.line == span.end_line and 1 <= span.line <= len(self.source_lines):
            text = self.source_lines[span.line - 1][span.column - 1 : span.end_column - 1]
        elif 1 <= span.line <= len(self.source_lines):
            text = self.source_lines[span.line - 1][span.column - 1 :] + " ..."
        else:
            text = "?"
        return text if len(text) <= 40 else text[:37] + "..."

    def file_start(self) -> Span:
        if self.schedule.header is not None:
            return self.schedule.header.span
        return Span(self.filename, 1, 1, 1, 2)

    def collect(self) -> None:
        """Sort block items into ``self.keys``; report unknown and repeated blocks and keys."""
        if self.schedule.header is None:
            self.error(
                "the file does not start with 'schedule NAME'",
                Span(self.filename, 1, 1, 1, 2),
                hint="add a first line such as `schedule my_schedule`",
            )
        else:
            self.spans["schedule"] = self.schedule.header.name_span
        for block in self.schedule.blocks:
            if block.name not in BLOCK_KEYS:
                self.error(
                    f"unknown block '{block.name}' (expected one of {', '.join(BLOCK_KEYS)})",
                    block.name_span,
                    hint=(
                        f"did you mean '{_suggest(block.name, BLOCK_KEYS)}'?"
                        if _suggest(block.name, BLOCK_KEYS)
                        else None
                    ),
                )
                continue
            if block.name in self.blocks:
                first = self.blocks[block.name].name_span
                self.error(
                    f"duplicate block '{block.name}' (first written at line {first.line})",
                    block.name_span,
                    hint="merge the two blocks into one",
                )
                continue
            self.blocks[block.name] = block
            self.spans[block.name] = block.name_span
            for item in block.items:
                if isinstance(item, ast.StageLine):
                    if block.name == "pipeline":
                        self.stage_lines.append(item)
                    else:
                        self.error(
                            f"'stage' lines belong in the pipeline block, not in '{block.name}'",
                            item.span,
                        )
                    continue
                self.collect_key(block.name, item)
        for block_name, example in BLOCK_EXAMPLES.items():
            if block_name not in self.blocks:
                self.error(f"missing block '{block_name}'", self.file_start(), hint=f"add `{example}`")
        for block_name, required in REQUIRED_KEYS.items():
            if block_name not in self.blocks:
                continue
            for key, example in required.items():
                if key not in self.keys[block_name]:
                    self.error(
                        f"block '{block_name}' is missing required key '{key}'",
                        self.blocks[block_name].name_span,
                        hint=f"add e.g. `{example}`",
                    )

    def collect_key(self, block_name: str, assignment: ast.Assignment) -> None:
        allowed = BLOCK_KEYS[block_name]
        if assignment.key not in allowed:
            suggestion = _suggest(assignment.key, allowed)
            hint = (
                f"did you mean '{suggestion}'?"
                if suggestion
                else f"keys of '{block_name}': {', '.join(allowed)}"
            )
            self.error(
                f"unknown key '{assignment.key}' in block '{block_name}'", assignment.key_span, hint=hint
            )
            return
        existing = self.keys[block_name].get(assignment.key)
        if existing is not None:
            self.error(
                f"duplicate key '{block_name}.{assignment.key}' (first set at line {existing.key_span.line})",
                assignment.key_span,
                hint="keep one of the two",
            )
            return
        self.keys[block_name][assignment.key] = assignment
        self.spans[f"{block_name}.{assignment.key}"] = assignment.span

    def value(self, block_name: str, key: str) -> ast.Value | None:
        assignment = self.keys[block_name].get(key)
        return assignment.value if assignment is not None else None

    # Typed readers: each returns None after reporting when the value is wrong.

    def integer(
        self, value: ast.Value, path: str, minimum: int | None = None, maximum: int | None = None
    ) -> int | None:
        if not isinstance(value, ast.IntLiteral):
            self.error(
                f"'{path}' must be an integer, found '{self.text_of(value.span)}'",
                value.span,
            )
            return None
        if minimum is not None and value.value < minimum:
            self.error(f"'{path}' must be >= {minimum}, found {value.value}", value.span)
            return None
        if maximum is not None and value.value > maximum:
            self.error(f"'{path}' must be <= {maximum}, found {value.value}", value.span)
            return None
        return value.value

    def number(
        self,
        value: ast.Value,
        path: str,
        minimum: float | None = None,
        above: bool = False,
        below: float | None = None,
    ) -> float | None:
        """A finite int or float; ``minimum`` inclusive, or exclusive when ``above``; ``below`` exclusive."""
        if not isinstance(value, (ast.IntLiteral, ast.FloatLiteral)):
            self.error(f"'{path}' must be a number, found '{self.text_of(value.span)}'", value.span)
            return None
        number = float(value.value)
        if not math.isfinite(number):
            self.error(f"'{path}' must be a finite number, found '{self.text_of(value.span)}'", value.span)
            return None
        if minimum is not None and (number <= minimum if above else number < minimum):
            relation = ">" if above else ">="
            self.error(
                f"'{path}' must be {relation} {minimum:g}, found {self.text_of(value.span)}", value.span
            )
            return None
        if below is not None and number >= below:
            self.error(f"'{path}' must be < {below:g}, found {self.text_of(value.span)}", value.span)
            return None
        return number

    def choice(self, value: ast.Value, path: str, enum_type: type[EnumType], noun: str) -> EnumType | None:
        options = [member.value for member in enum_type]
        if isinstance(value, ast.Call) and not value.arguments:
            value = ast.Identifier(value.name, value.span)
        if not isinstance(value, ast.Identifier):
            self.error(
                f"'{path}' must be one of {_one_of(options)}, found '{self.text_of(value.span)}'",
                value.span,
            )
            return None
        if value.name not in options:
            self.error(f"unknown {noun} '{value.name}'", value.span, hint=_choice_hint(value.name, options))
            return None
        return enum_type(value.name)

    def boolean(self, value: ast.Value, path: str) -> bool | None:
        if isinstance(value, ast.Identifier) and value.name in ("true", "false"):
            return value.name == "true"
        self.error(f"'{path}' must be true or false, found '{self.text_of(value.span)}'", value.span)
        return None

    def call(
        self, value: ast.Value, path: str, signatures: dict[str, tuple[str, ...]], noun: str
    ) -> _CallValue | None:
        """A call to one of ``signatures`` (name -> allowed argument names)."""
        if isinstance(value, ast.Identifier):
            value = ast.Call(value.name, value.span, (), value.span)
        if not isinstance(value, ast.Call):
            examples = ", ".join(signatures)
            self.error(
                f"'{path}' must be a {noun} ({examples}), found '{self.text_of(value.span)}'",
                value.span,
            )
            return None
        if value.name not in signatures:
            self.error(
                f"unknown {noun} '{value.name}'",
                value.name_span,
                hint=_choice_hint(value.name, list(signatures)),
            )
            return None
        allowed = signatures[value.name]
        arguments: dict[str, ast.Argument] = {}
        for argument in value.arguments:
            if argument.name not in allowed:
                if allowed:
                    suggestion = _suggest(argument.name, allowed)
                    hint = (
                        f"did you mean '{suggestion}'?"
                        if suggestion
                        else f"{value.name} takes {', '.join(allowed)}"
                    )
                else:
                    hint = f"write just `{value.name}`"
                self.error(
                    f"unknown argument '{argument.name}' of {value.name}", argument.name_span, hint=hint
                )
                continue
            if argument.name in arguments:
                self.error(f"duplicate argument '{argument.name}' of {value.name}", argument.name_span)
                continue
            arguments[argument.name] = argument
            self.spans[f"{path}.{argument.name}"] = argument.span
        return _CallValue(value.name, value.name_span, arguments, value.span)

    def read(self, block_name: str, key: str, reader: Callable[[ast.Value, str], object], default=None):
        value = self.value(block_name, key)
        if value is None:
            return default
        if isinstance(value, ast.EveryClause) and not (block_name == "train" and key == "checkpoint"):
            self.error("'every' is only allowed in train.checkpoint", value.span)
            return None
        return reader(value, f"{block_name}.{key}")

    def positive(self, block_name: str, key: str, default=None, maximum: int | None = None):
        return self.read(block_name, key, lambda value, path: self.integer(value, path, 1, maximum), default)

    # Blocks.

    def layers(self, value: ast.Value, path: str) -> tuple[LayerKind, ...] | None:
        if not isinstance(value, (ast.ListLiteral, ast.RepeatList)):
            self.error(
                f"'{path}' must be a list of layer kinds such as [gla] * 4, found '{self.text_of(value.span)}'",
                value.span,
            )
            return None
        kinds: list[LayerKind] = []
        ok = self.flatten_layers(value, path, kinds)
        if not ok:
            return None
        if not kinds:
            self.error(
                f"'{path}' is empty; a model needs at least one layer",
                value.span,
                hint="e.g. `layers = [gla] * 4`",
            )
            return None
        return tuple(kinds)

    def flatten_layers(self, value: ast.Value, path: str, out: list[LayerKind]) -> bool:
        options = [kind.value for kind in LayerKind]
        if isinstance(value, ast.Identifier):
            if value.name not in options:
                self.error(
                    f"unknown layer kind '{value.name}'", value.span, hint=_choice_hint(value.name, options)
                )
                return False
            out.append(LayerKind(value.name))
            return True
        if isinstance(value, ast.ListLiteral):
            ok = True
            for item in value.items:
                ok = self.flatten_layers(item, path, out) and ok
                if len(out) > MAX_LAYERS:
                    self.error(f"'{path}' has more than {MAX_LAYERS} layers", value.span)
                    return False
            return ok
        if isinstance(value, ast.RepeatList):
            count = self.integer(value.count, f"the repeat count of {path}", 1)
            inner: list[LayerKind] = []
            ok = self.flatten_layers(value.list, path, inner)
            if count is None or not ok:
                return False
            if len(out) + len(inner) * count > MAX_LAYERS:
                self.error(f"'{path}' has more than {MAX_LAYERS} layers", value.span)
                return False
            out.extend(inner * count)
            return True
        self.error(
            f"expected a layer kind, found '{self.text_of(value.span)}'",
            value.span,
            hint=f"layer kinds: {', '.join(options)}",
        )
        return False

    def mlp(self, value: ast.Value, path: str) -> MlpSpec | None:
        call = self.call(value, path, {"swiglu": ("ratio",), "none": ()}, "mlp")
        if call is None:
            return None
        if call.name == "none":
            return MlpSpec(MlpKind.NONE, 0.0)
        ratio = 4.0
        if "ratio" in call.arguments:
            ratio = self.number(call.arguments["ratio"].value, f"{path}.ratio", 0.0, above=True)
            if ratio is None:
                return None
        return MlpSpec(MlpKind.SWIGLU, ratio)

    def stage_assignment(
        self, value: ast.Value, path: str
    ) -> tuple[tuple[tuple[int, ...], ...], list[Span]] | None:
        """``[[0, 1], [2, 3]]``: the layer indices of each stage, with each stage's span."""
        if not isinstance(value, ast.ListLiteral) or not all(
            isinstance(item, ast.ListLiteral) for item in value.items
        ):
            self.error(
                f"'{path}' must be a list of layer-index lists, one per stage, e.g. [[0, 1], [2, 3]]",
                value.span,
            )
            return None
        stages = []
        ok = True
        for stage_list in value.items:
            indices = []
            for item in stage_list.items:
                index = self.integer(item, f"a layer index in {path}", 0, MAX_LAYERS)
                if index is None:
                    ok = False
                else:
                    indices.append(index)
            stages.append(tuple(indices))
        if not ok:
            return None
        return tuple(stages), [item.span for item in value.items]

    def model(self) -> ModelSpec | None:
        vocab = self.positive("model", "vocab", maximum=1 << 24)
        d_model = self.positive("model", "d_model", maximum=1 << 20)
        heads = self.positive("model", "heads", maximum=4096)
        head_dim = self.positive("model", "head_dim", maximum=MAX_HEAD_DIM)
        layers = self.read("model", "layers", self.layers)
        self.layer_kinds = layers
        mlp = self.read("model", "mlp", self.mlp, MlpSpec())
        if layers is not None and LayerKind.MLP in layers and mlp is not None and mlp.kind is MlpKind.NONE:
            self.error(
                "'model.layers' names mlp layers, but model.mlp = none gives them nothing to run",
                self.spans.get("model.mlp", self.file_start()),
                hint="give the MLP a shape, e.g. `mlp = swiglu(ratio = 4)`, or drop the mlp layers",
            )
            mlp = None
        if None in (vocab, d_model, heads, head_dim, layers, mlp):
            return None
        return ModelSpec(vocab, d_model, layers, heads, head_dim, mlp)

    def mesh(self) -> MeshSpec | None:
        pipeline = self.positive("mesh", "pipeline", 1, MAX_MESH_SIZE)
        sequence = self.positive("mesh", "sequence", 1, MAX_MESH_SIZE)
        data = self.positive("mesh", "data", 1, MAX_MESH_SIZE)
        if None in (pipeline, sequence, data):
            return None
        return MeshSpec(pipeline, sequence, data)

    def stage_layers(self, mesh: MeshSpec | None) -> tuple[tuple[int, ...], ...] | None:
        n_stages = mesh.pipeline if mesh is not None else None
        n_layers = len(self.layer_kinds) if self.layer_kinds is not None else None
        given = self.read("model", "stages", self.stage_assignment)
        if self.value("model", "stages") is not None:
            if given is None or n_layers is None or n_stages is None:
                return None
            stages, stage_spans = given
            return self.check_stage_assignment(stages, stage_spans, n_layers, n_stages)
        if n_layers is None or n_stages is None:
            return None
        if n_layers < n_stages:
            span = self.spans.get("mesh.pipeline") or self.spans.get("model.layers") or self.file_start()
            self.error(
                f"{n_layers} layers cannot fill {n_stages} pipeline stages: each stage needs at least one layer",
                span,
                hint=f"use at most {n_layers} stages or add layers",
            )
            return None
        per_stage, extra = divmod(n_layers, n_stages)
        if extra:
            # An uneven split is a choice (which stage carries the extra layer changes the pipeline's
            # balance), so it must be written down rather than guessed.
            span = self.spans.get("model.layers") or self.spans.get("mesh.pipeline") or self.file_start()
            example = [list(range(0, per_stage + 1))] + [
                list(range(per_stage + 1 + i * per_stage, per_stage + 1 + (i + 1) * per_stage))
                for i in range(n_stages - 1)
            ]
            self.error(
                f"{n_layers} layers do not divide evenly over {n_stages} pipeline stages",
                span,
                hint=f"use a multiple of {n_stages} layers, or give the split in the model block, "
                f"e.g. stages = {example}".replace("'", ""),
            )
            return None
        return tuple(tuple(range(stage * per_stage, (stage + 1) * per_stage)) for stage in range(n_stages))

    def check_stage_assignment(self, stages, stage_spans, n_layers: int, n_stages: int):
        span = self.spans["model.stages"]
        ok = True
        if len(stages) != n_stages:
            self.error(
                f"'model.stages' lists {len(stages)} stages but mesh.pipeline = {n_stages}",
                span,
                hint="give one list of layer indices per pipeline stage",
            )
            ok = False
        expected_next = 0
        for stage, (indices, stage_span) in enumerate(zip(stages, stage_spans)):
            if not indices:
                self.error(
                    f"stage {stage} has no layers in 'model.stages'",
                    stage_span,
                    hint="each stage needs at least one layer",
                )
                ok = False
                continue
            wanted = tuple(range(expected_next, expected_next + len(indices)))
            if indices != wanted:
                self.error(
                    f"stage {stage} of 'model.stages' must hold the next contiguous layers {list(wanted)}, found {list(indices)}",
                    stage_span,
                    hint="stages take consecutive runs of layers in order, e.g. [[0, 1], [2, 3]]",
                )
                ok = False
            expected_next += len(indices)
        if ok and expected_next != n_layers:
            self.error(
                f"'model.stages' assigns {expected_next} layers but the model has {n_layers}",
                span,
                hint=f"cover layers 0 to {n_layers - 1} exactly once",
            )
            ok = False
        return tuple(stages) if ok else None

    def kernel_chunk(self) -> int | None:
        value = self.value("sequence", "kernel_chunk")
        if value is None:
            return 64
        kernel_chunk = self.integer(value, "sequence.kernel_chunk", 1, 1 << 16)
        if kernel_chunk is not None and kernel_chunk & (kernel_chunk - 1):
            self.error(
                f"'sequence.kernel_chunk' must be a power of two, found {kernel_chunk}",
                value.span,
                hint=f"the kernels tile the sequence in power-of-two blocks; try {1 << (kernel_chunk.bit_length() - 1)} or {1 << kernel_chunk.bit_length()}",
            )
            return None
        return kernel_chunk

    def partition(self) -> tuple[PartitionKind, float | None] | None:
        value = self.value("sequence", "partition")
        if value is None:
            return None
        call = self.call(
            value, "sequence.partition", {"uniform": (), "balanced": ("alpha",), "explicit": ()}, "partition"
        )
        if call is None:
            return None
        kind = PartitionKind(call.name)
        if kind is not PartitionKind.BALANCED:
            return kind, None
        alpha = 1.0
        if "alpha" in call.arguments:
            alpha = self.number(call.arguments["alpha"].value, "sequence.partition.alpha", 0.0)
            if alpha is None:
                return None
            if alpha > 4.0:
                self.error(
                    f"'alpha' must be <= 4, found {alpha:g}",
                    call.arguments["alpha"].value.span,
                    hint="alpha = 0 is equal chunking, 1 the FLOP-balanced cut, values a little above 1 overshoot",
                )
                return None
        return kind, alpha

    def parallel(self, head_dim: int | None) -> tuple[SequenceParallelMethod, int] | None:
        value = self.value("sequence", "parallel")
        if value is None:
            return SequenceParallelMethod.ALLSCAN, 1
        call = self.call(
            value,
            "sequence.parallel",
            {"allscan": ("blocks",), "ring": (), "allgather": ()},
            "sequence-parallel method",
        )
        if call is None:
            return None
        method = SequenceParallelMethod(call.name)
        blocks = 1
        if "blocks" in call.arguments:
            blocks_value = call.arguments["blocks"].value
            blocks = self.integer(blocks_value, "sequence.parallel.blocks", 1, MAX_HEAD_DIM)
            if blocks is None:
                return None
            if head_dim is not None and head_dim % blocks:
                divisors = [d for d in range(1, head_dim + 1) if head_dim % d == 0 and d <= 64]
                self.error(
                    f"allscan blocks = {blocks} does not divide head_dim = {head_dim}",
                    blocks_value.span,
                    hint=f"All-Scan splits each head's state into blocks of head_dim / blocks rows; use one of {divisors}",
                )
                return None
        return method, blocks

    def sequence(
        self, model: ModelSpec | None, mesh: MeshSpec | None, head_dim: int | None
    ) -> SequenceSpec | None:
        length = self.positive("sequence", "length", maximum=MAX_LENGTH)
        kernel_chunk = self.kernel_chunk()
        partition = self.partition()
        parallel = self.parallel(head_dim)
        chunks_value = self.value("sequence", "chunks")
        partition_given = self.value("sequence", "partition") is not None

        explicit_list = isinstance(chunks_value, ast.ListLiteral)
        if partition is not None and partition_given:
            kind = partition[0]
            if explicit_list and kind is not PartitionKind.EXPLICIT:
                self.error(
                    f"partition = {kind.value} computes the boundaries, but 'sequence.chunks' lists them",
                    self.value("sequence", "partition").span,
                    hint="write `chunks = N` to let the partition cut the sequence, or `partition = explicit` (or nothing) to keep the list",
                )
                partition = None
            elif not explicit_list and kind is PartitionKind.EXPLICIT:
                self.error(
                    "partition = explicit needs 'sequence.chunks' to list the boundaries",
                    self.value("sequence", "partition").span,
                    hint="e.g. `chunks = [0, 1024, 2560, 4096]`",
                )
                partition = None
        elif not partition_given:
            partition = (PartitionKind.EXPLICIT if explicit_list else PartitionKind.UNIFORM, None)

        sequence_ranks = mesh.sequence if mesh is not None else None
        unit = (
            kernel_chunk * sequence_ranks if kernel_chunk is not None and sequence_ranks is not None else None
        )
        if length is not None and unit is not None and sequence_ranks > 1 and length % unit:
            self.error(
                f"with mesh.sequence = {sequence_ranks} the length must be a multiple of"
                f" {sequence_ranks} * kernel_chunk = {unit}, found {length}",
                self.value("sequence", "length").span,
                hint=f"each chunk is split over {sequence_ranks} ranks in whole kernel chunks; try {max(unit, length // unit * unit)}",
            )
            return None

        boundaries = None
        if explicit_list:
            boundaries = self.explicit_boundaries(chunks_value, length, unit, kernel_chunk, sequence_ranks)
        else:
            n_chunks = 1
            if chunks_value is not None:
                n_chunks = self.integer(chunks_value, "sequence.chunks", 1, MAX_LENGTH)
            if None not in (n_chunks, length, unit, partition):
                boundaries = self.computed_boundaries(n_chunks, length, unit, partition, model, chunks_value)
        if None in (length, kernel_chunk, partition, parallel, boundaries):
            return None
        return SequenceSpec(
            length=length,
            boundaries=boundaries,
            kernel_chunk=kernel_chunk,
            partition=partition[0],
            balance_alpha=partition[1],
            parallel=parallel[0],
            scan_blocks=parallel[1],
        )

    def computed_boundaries(self, n_chunks, length, unit, partition, model, chunks_value):
        kind, alpha = partition
        span = (
            chunks_value.span
            if chunks_value is not None
            else self.spans.get("sequence.length", self.file_start())
        )
        try:
            if kind is PartitionKind.BALANCED:
                if model is None:
                    return None
                return model_balanced_boundaries(model, length, n_chunks, alpha, unit)
            return uniform_boundaries(length, n_chunks, unit)
        except ValueError as error:
            blocks = -(-length // unit)
            self.error(
                f"'sequence.chunks' = {n_chunks} does not fit: {error}",
                span,
                hint=f"use at most {blocks} chunks, or a smaller kernel_chunk",
            )
            return None

    def explicit_boundaries(self, value: ast.ListLiteral, length, unit, kernel_chunk, sequence_ranks):
        path = "sequence.chunks"
        numbers = [self.integer(item, f"a boundary in {path}", 0, MAX_LENGTH) for item in value.items]
        if None in numbers:
            return None
        if len(numbers) < 2:
            self.error(
                f"'{path}' must list at least two boundaries, 0 and the length",
                value.span,
                hint="e.g. `chunks = [0, 1024, 2560, 4096]`",
            )
            return None
        ok = True
        if numbers[0] != 0:
            self.error(f"the first chunk boundary must be 0, found {numbers[0]}", value.items[0].span)
            ok = False
        if length is not None and numbers[-1] != length:
            self.error(
                f"the last chunk boundary must be the sequence length {length}, found {numbers[-1]}",
                value.items[-1].span,
            )
            ok = False
        for position in range(1, len(numbers)):
            if numbers[position] <= numbers[position - 1]:
                self.error(
                    f"chunk boundaries must increase: {numbers[position]} follows {numbers[position - 1]}",
                    value.items[position].span,
                )
                ok = False
        if unit is not None:
            for position in range(1, len(numbers) - 1):
                boundary = numbers[position]
                if boundary % unit:
                    lower = boundary // unit * unit
                    because = (
                        f"kernel_chunk = {kernel_chunk}"
                        if sequence_ranks == 1
                        else f"mesh.sequence * kernel_chunk = {sequence_ranks} * {kernel_chunk}"
                    )
                    self.error(
                        f"chunk boundary {boundary} is not a multiple of {unit} ({because})",
                        value.items[position].span,
                        hint=f"use {lower} or {lower + unit}",
                    )
                    ok = False
        return tuple(numbers) if ok else None

    def explicit_orders(
        self, n_stages: int | None, microbatches: int | None, n_chunks: int | None, split_backward: bool | None
    ):
        orders: dict[int, StageOrder] = {}
        first_line: dict[int, ast.StageLine] = {}
        ok = True
        for line in self.stage_lines:
            stage = line.stage.value
            if stage < 0 or (n_stages is not None and stage >= n_stages):
                upper = f"0 to {n_stages - 1}" if n_stages is not None else ">= 0"
                self.error(
                    f"stage {stage} does not exist (stages are {upper}, mesh.pipeline = {n_stages})",
                    line.stage.span,
                )
                ok = False
                continue
            if stage in first_line:
                self.error(
                    f"stage {stage} has two order lines (first at line {first_line[stage].span.line})",
                    line.stage.span,
                    hint="give each stage exactly one `stage r:` line",
                )
                ok = False
                continue
            first_line[stage] = line
            self.spans[f"pipeline.stage.{stage}"] = line.span
            tokens = []
            for word in line.tasks:
                token = self.task_token(word, stage, microbatches, n_chunks, split_backward)
                if token is None:
                    ok = False
                else:
                    tokens.append(token)
            orders[stage] = StageOrder(stage, tuple(tokens), line.span)
        if n_stages is not None:
            missing = [stage for stage in range(n_stages) if stage not in first_line]
            if missing:
                span = self.spans.get("pipeline.order", self.spans.get("pipeline", self.file_start()))
                self.error(
                    f"order = explicit but no 'stage' line for stage{'s' if len(missing) > 1 else ''} {', '.join(map(str, missing))}",
                    span,
                    hint=f"add `stage {missing[0]}: F0.0 ... B0.0`, one line per stage",
                )
                ok = False
        if not ok or n_stages is None:
            return None
        return tuple(orders[stage] for stage in range(n_stages))

    def task_token(
        self,
        word: ast.StageTask,
        stage: int,
        microbatches: int | None,
        n_chunks: int | None,
        split_backward: bool | None,
    ):
        match = _TASK_TOKEN.match(word.text)
        if match is None:
            self.error(
                f"'{word.text}' is not a task",
                word.span,
                hint="write tasks as F<microbatch>.<chunk>, B<microbatch>.<chunk> or W<microbatch>.<chunk>, e.g. F0.1",
            )
            return None
        kind, microbatch, chunk = match.group(1), int(match.group(2)), int(match.group(3))
        ok = True
        if kind == "W" and split_backward is False:
            self.error(
                f"task {word.text} is a weight-gradient task, but the backward is not split",
                word.span,
                hint="set `split_backward = true` in the pipeline block, or drop the W tasks",
            )
            ok = False
        if microbatches is not None and microbatch >= microbatches:
            self.error(
                f"task {word.text} names microbatch {microbatch}, but pipeline.microbatches = {microbatches}",
                word.span,
                hint=f"microbatches are numbered 0 to {microbatches - 1}",
            )
            ok = False
        if n_chunks is not None and chunk >= n_chunks:
            self.error(
                f"task {word.text} names chunk {chunk}, but the sequence has {n_chunks} chunk{'s' if n_chunks > 1 else ''}",
                word.span,
                hint=f"chunks are numbered 0 to {n_chunks - 1}",
            )
            ok = False
        if not ok:
            return None
        return TaskToken(TaskId(_TASK_KINDS[kind], stage, microbatch, chunk), word.span)

    def extra_warmup(self, value: ast.Value, path: str, mesh: MeshSpec | None) -> int | tuple[int, ...] | None:
        """An integer (every stage but the last), or one count per pipeline stage ending in 0."""
        if not isinstance(value, ast.ListLiteral):
            return self.integer(value, path, 0, MAX_MICROBATCHES)
        counts = [self.integer(item, f"an entry of {path}", 0, MAX_MICROBATCHES) for item in value.items]
        if None in counts:
            return None
        if mesh is not None and len(counts) != mesh.pipeline:
            self.error(
                f"'{path}' lists {len(counts)} counts but mesh.pipeline = {mesh.pipeline}",
                value.span,
                hint="one count per stage, or a single integer for every stage but the last",
            )
            return None
        if counts and counts[-1] != 0:
            self.error(
                f"the last stage's extra warm-up must be 0 (its first backward waits on nothing downstream), "
                f"found {counts[-1]}",
                value.items[-1].span,
            )
            return None
        for stage in range(1, len(counts)):
            if counts[stage] > counts[stage - 1] + 1:
                self.error(
                    f"stage {stage}'s extra warm-up {counts[stage]} exceeds stage {stage - 1}'s ({counts[stage - 1]}) "
                    "by more than 1: it would wait for forwards that stage never sends before its own first backward",
                    value.items[stage].span,
                    hint=f"give stage {stage - 1} at least {counts[stage] - 1}",
                )
                return None
        return tuple(counts)

    def pipeline(self, mesh: MeshSpec | None, sequence: SequenceSpec | None) -> PipelineSpec | None:
        microbatches = self.positive("pipeline", "microbatches", maximum=MAX_MICROBATCHES)
        order = self.read(
            "pipeline",
            "order",
            lambda value, path: self.choice(value, path, OrderKind, "pipeline order"),
            OrderKind.ONE_F_ONE_B,
        )
        microbatch_size = self.positive("pipeline", "microbatch_size", 1, 1 << 20)
        recompute = self.read(
            "pipeline",
            "recompute",
            lambda value, path: self.choice(value, path, Recompute, "recompute mode"),
            Recompute.NONE,
        )
        cuda_graphs = self.read("pipeline", "cuda_graphs", self.boolean, False)
        extra_warmup = self.read(
            "pipeline", "extra_warmup", lambda value, path: self.extra_warmup(value, path, mesh), 0
        )
        split_backward = self.read("pipeline", "split_backward", self.boolean, False)
        forward_before_weight = self.split_1f1b_option(
            "forward_before_weight", self.boolean, False, order, split_backward
        )
        extra_deferred_weights = self.split_1f1b_option(
            "extra_deferred_weights",
            lambda value, path: self.integer(value, path, 0, MAX_MICROBATCHES),
            0,
            order,
            split_backward,
        )
        asks_warmup = any(extra_warmup) if isinstance(extra_warmup, tuple) else bool(extra_warmup)
        if asks_warmup and order is not None and order is not OrderKind.ONE_F_ONE_B:
            self.error(
                f"'pipeline.extra_warmup' only applies to order = 1f1b, but order = {order.value}",
                self.spans.get("pipeline.extra_warmup", self.file_start()),
                hint="remove extra_warmup, or write the order out with order = explicit",
            )
            extra_warmup = None
        explicit_orders: tuple[StageOrder, ...] | None = ()
        if order is OrderKind.EXPLICIT:
            if not self.stage_lines:
                self.error(
                    "order = explicit needs one 'stage r:' line per stage",
                    self.spans.get("pipeline.order", self.file_start()),
                    hint="e.g. `stage 0: F0.0 F0.1 B0.1 B0.0`",
                )
                explicit_orders = None
            else:
                explicit_orders = self.explicit_orders(
                    mesh.pipeline if mesh is not None else None,
                    microbatches,
                    sequence.n_chunks if sequence is not None else None,
                    split_backward,
                )
        elif self.stage_lines and order is not None:
            self.error(
                f"'stage' lines are only allowed with order = explicit, but order = {order.value}",
                self.stage_lines[0].span,
                hint="write `order = explicit` or remove the stage lines",
            )
            explicit_orders = None
        fields = (
            microbatches, order, microbatch_size, recompute, cuda_graphs, extra_warmup, split_backward,
            forward_before_weight, extra_deferred_weights,
        )
        if None in fields or explicit_orders is None:
            return None
        return PipelineSpec(
            microbatches,
            order,
            explicit_orders,
            microbatch_size,
            recompute,
            cuda_graphs,
            extra_warmup,
            split_backward,
            forward_before_weight,
            extra_deferred_weights,
        )

    def split_1f1b_option(self, key: str, reader, default, order: OrderKind | None, split_backward: bool | None):
        """A pipeline key that places the W tasks of generated 1F1B orders (``forward_before_weight``,
        ``extra_deferred_weights``): set to anything but its default it needs ``split_backward = true`` and
        ``order = 1f1b``."""
        value = self.read("pipeline", key, reader, default)
        if not value:
            return value
        span = self.spans.get(f"pipeline.{key}", self.file_start())
        if split_backward is False:
            self.error(
                f"'pipeline.{key}' places W tasks, but split_backward is not true",
                span,
                hint=f"set `split_backward = true`, or remove {key}",
            )
            return None
        if order is not None and order is not OrderKind.ONE_F_ONE_B:
            self.error(
                f"'pipeline.{key}' only applies to order = 1f1b, but order = {order.value}",
                span,
                hint=f"remove {key}, or place the W tasks yourself with order = explicit",
            )
            return None
        return value
        span = self.spans.get("pipeline.forward_before_weight", self.file_start())
        if split_backward is False:
            self.error(
                "'pipeline.forward_before_weight' moves W tasks, but split_backward is not true",
                span,
                hint="set `split_backward = true`, or remove forward_before_weight",
            )
            return None
        if order is not None and order is not OrderKind.ONE_F_ONE_B:
            self.error(
                f"'pipeline.forward_before_weight' only applies to order = 1f1b, but order = {order.value}",
                span,
                hint="remove forward_before_weight, or place the W tasks yourself with order = explicit",
            )
            return None
        return value

    def optimizer(self, value: ast.Value, path: str) -> OptimizerSpec | None:
        call = self.call(
            value,
            path,
            {"adamw": ("lr", "weight_decay", "betas"), "sgd": ("lr", "momentum", "weight_decay")},
            "optimizer",
        )
        if call is None:
            return None
        kind = OptimizerKind(call.name)
        fields: dict[str, object] = {"kind": kind}
        ok = True
        if "lr" in call.arguments:
            fields["lr"] = self.number(call.arguments["lr"].value, f"{path}.lr", 0.0, above=True)
        if "weight_decay" in call.arguments:
            fields["weight_decay"] = self.number(
                call.arguments["weight_decay"].value, f"{path}.weight_decay", 0.0
            )
        if "momentum" in call.arguments:
            fields["momentum"] = self.number(
                call.arguments["momentum"].value, f"{path}.momentum", 0.0, below=1.0
            )
        if "betas" in call.arguments:
            fields["betas"] = self.betas(call.arguments["betas"].value, f"{path}.betas")
        if any(value is None for value in fields.values()):
            ok = False
        return OptimizerSpec(**fields) if ok else None

    def betas(self, value: ast.Value, path: str) -> tuple[float, float] | None:
        if not isinstance(value, ast.ListLiteral) or len(value.items) != 2:
            self.error(f"'{path}' must be a list of two numbers, e.g. [0.9, 0.95]", value.span)
            return None
        betas = [self.number(item, path, 0.0, below=1.0) for item in value.items]
        return None if None in betas else (betas[0], betas[1])

    def data(self, value: ast.Value, path: str) -> DataSpec | None:
        call = self.call(value, path, {"synthetic": ("seed",), "bytes": ("path", "seed")}, "data source")
        if call is None:
            return None
        seed = 0
        if "seed" in call.arguments:
            seed = self.integer(call.arguments["seed"].value, f"{path}.seed", 0, (1 << 63) - 1)
        data_path = None
        if "path" in call.arguments:
            path_value = call.arguments["path"].value
            if isinstance(path_value, ast.StringLiteral) and path_value.value:
                data_path = path_value.value
            else:
                self.error(f"'{path}.path' must be a non-empty string such as \"data.txt\"", path_value.span)
                return None
        if seed is None:
            return None
        return DataSpec(DataKind(call.name), seed, data_path)

    def grad_clip(self, value: ast.Value, path: str):
        if isinstance(value, ast.Identifier) and value.name == "none":
            return ("none",)
        return self.number(value, path, 0.0, above=True)

    def checkpoint(self, value: ast.Value, path: str):
        if isinstance(value, ast.Identifier) and value.name == "none":
            return ("none",)
        if not isinstance(value, ast.EveryClause):
            self.error(
                f"'{path}' must be a directory and an interval, found '{self.text_of(value.span)}'",
                value.span,
                hint='write `checkpoint = "checkpoints" every 50`',
            )
            return None
        directory = value.value
        every = self.integer(value.every, f"{path} every", 1)
        if not isinstance(directory, ast.StringLiteral) or not directory.value:
            self.error(
                'the checkpoint directory must be a non-empty string, e.g. "checkpoints"', directory.span
            )
            return None
        if every is None:
            return None
        return CheckpointSpec(directory.value, every)

    def train(self) -> TrainSpec | None:
        steps = self.positive("train", "steps", 10, 1 << 40)
        optimizer = self.read("train", "optimizer", self.optimizer, OptimizerSpec())
        dtype = self.read(
            "train", "dtype", lambda value, path: self.choice(value, path, DType, "dtype"), DType.FP32
        )
        data = self.read("train", "data", self.data, DataSpec())
        seed = self.read("train", "seed", lambda value, path: self.integer(value, path, 0, (1 << 63) - 1), 0)
        grad_clip = self.read("train", "grad_clip", self.grad_clip, ("none",))
        log_every = self.positive("train", "log_every", 1, 1 << 40)
        checkpoint = self.read("train", "checkpoint", self.checkpoint, ("none",))
        if None in (steps, optimizer, dtype, data, seed, grad_clip, log_every, checkpoint):
            return None
        return TrainSpec(
            steps=steps,
            optimizer=optimizer,
            dtype=dtype,
            data=data,
            seed=seed,
            grad_clip=None if grad_clip == ("none",) else grad_clip,
            checkpoint=None if checkpoint == ("none",) else checkpoint,
            log_every=log_every,
        )

    def lower(self) -> ScheduleProgram:
        self.collect()
        model = self.model()
        head_dim_value = self.value("model", "head_dim")
        head_dim = (
            head_dim_value.value
            if isinstance(head_dim_value, ast.IntLiteral) and head_dim_value.value >= 1
            else None
        )
        mesh = self.mesh()
        stage_layers = self.stage_layers(mesh)
        sequence = self.sequence(model, mesh, head_dim)
        pipeline = self.pipeline(mesh, sequence)
        train = self.train()
        self.diagnostics.extend(capability_diagnostics(model, mesh, sequence, pipeline, self.spans, self.file_start()))
        if self.diagnostics:
            ordered = sorted(
                self.diagnostics, key=lambda diagnostic: (diagnostic.span.line, diagnostic.span.column)
            )
            raise ScheduleError(ordered, {self.filename: "\n".join(self.source_lines)})
        if None in (model, mesh, stage_layers, sequence, pipeline, train):
            raise RuntimeError("semantic pass left a value unset without reporting why")
        return ScheduleProgram(
            name=self.schedule.header.name,
            model=model,
            mesh=mesh,
            sequence=sequence,
            pipeline=pipeline,
            train=train,
            stage_layers=stage_layers,
            source_file=self.filename,
            spans=dict(self.spans),
        )


def lower_to_program(schedule_file: ast.ScheduleFile, source_text: str) -> ScheduleProgram:
    """Check ``schedule_file`` and lower it; see the module docstring for the contract."""
    return _Lowering(schedule_file, source_text).lower()
