"""The key schema: one row per ``block.key`` of the language.

Each row names the key's reader (which holds its type and bounds), its default
and an example. Everything about a single key is derived from these rows: the
block names and their keys (unknown keys and "did you mean"), the required keys
and blocks and the examples their messages suggest, the type and range
messages, and the key tables of docs/language.md (a test holds the two
together). Defaults are taken from the spec dataclasses of
``schedlang.lowering.program`` with :func:`spec_default`, so each is written
once; a row whose default has no field says so in words (:class:`Derived`).
What relates two keys is a rule, in ``schedlang.checks.rules``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING

from schedlang import ast
from schedlang.checks import hf_import, model, pipeline, sequence, train
from schedlang.checks.mesh import MAX_MESH_SIZE
from schedlang.checks.readers import INVALID, Boolean, Choice, Integer, Number, Reader
from schedlang.lowering.program import (
    MeshSpec,
    ModelSpec,
    OrderKind,
    PipelineSpec,
    SequenceSpec,
    TrainSpec,
)
from schedlang.runtime.model_options import (
    GATE_LOGIT_NORMALIZER,
    AttentionOptions,
    DeltaGates,
    Mamba2Options,
    OutputGate,
)
from schedlang.vocabulary import AttentionExchange, CudaGraphs, DType

if TYPE_CHECKING:
    from schedlang.checks.context import Checker


class _Required:
    def __repr__(self) -> str:
        return "REQUIRED"


REQUIRED = _Required()


@dataclass(frozen=True)
class Derived:
    """A default computed from other keys by a rule; ``how`` says how, for docs and readers."""

    how: str


def spec_default(spec_type: type, field_name: str) -> object:
    """The default of ``spec_type.field_name``, as the dataclass declares it."""
    for field in dataclasses.fields(spec_type):
        if field.name == field_name:
            if field.default is not dataclasses.MISSING:
                return field.default
            if field.default_factory is not dataclasses.MISSING:
                return field.default_factory()
            raise ValueError(f"{spec_type.__name__}.{field_name} has no default")
    raise ValueError(f"{spec_type.__name__} has no field {field_name}")


@dataclass(frozen=True)
class Key:
    """One key of one block.

    ``default_from``: a spec dataclass (the key's default is that class's
    default for its field of the same name), :data:`REQUIRED`, a
    :class:`Derived`, or the default itself where no field holds it.
    ``accepts_none``: the name ``none`` is read as ``None`` (the spec's "off").
    ``accepts_every``: the value may be an ``"x" every N`` clause.
    ``in_block_example``: the key is shown (with the required ones) in the
    example given when its whole block is missing.
    """

    block: str
    name: str
    reader: Reader
    default_from: object
    example: str
    accepts_none: bool = False
    accepts_every: bool = False
    in_block_example: bool = False

    @property
    def path(self) -> str:
        return f"{self.block}.{self.name}"

    @property
    def required(self) -> bool:
        return self.default_from is REQUIRED

    @property
    def default(self) -> object:
        """The value an absent key reads as (``REQUIRED`` or a ``Derived`` stand as themselves)."""
        if isinstance(self.default_from, type) and dataclasses.is_dataclass(self.default_from):
            return spec_default(self.default_from, self.name)
        return self.default_from


_EVEN_SPLIT = Derived("the layers split evenly over the mesh.pipeline stages")
_HEAD_WIDTH = Derived("heads * head_dim / d_model")
_PARTITION_OF_CHUNKS = Derived("uniform, or explicit when chunks lists the boundaries")
_LOSS_SCALE_DEFAULT = Derived("dynamic with dtype = fp16, else none")
_SCAN_DEFAULT = (spec_default(SequenceSpec, "parallel"), spec_default(SequenceSpec, "scan_blocks"))

SCHEMA: tuple[Key, ...] = (
    Key("model", "vocab", Integer(1, 1 << 24), REQUIRED, "vocab = 256"),
    Key("model", "d_model", Integer(1, 1 << 20), REQUIRED, "d_model = 128"),
    Key("model", "layers", model.read_layers, REQUIRED, "layers = [gla] * 4"),
    Key("model", "heads", Integer(1, 4096), REQUIRED, "heads = 2"),
    Key("model", "head_dim", Integer(1, model.MAX_HEAD_DIM), REQUIRED, "head_dim = 64"),
    Key("model", "mlp", model.read_mlp, ModelSpec, "mlp = swiglu(ratio = 4)"),
    Key("model", "stages", model.read_stage_assignment, _EVEN_SPLIT, "stages = [[0, 1], [2, 3]]"),
    Key("model", "from", hf_import.read_from, None, 'from = hf("examples/hf/gla_tiny")'),
    Key("model", "norm_eps", Number(0.0, above=True), ModelSpec, "norm_eps = 1e-5"),
    Key("model", "expand_k", Number(0.0, above=True), _HEAD_WIDTH, "expand_k = 0.5"),
    Key("model", "expand_v", Number(0.0, above=True), _HEAD_WIDTH, "expand_v = 1"),
    Key("model", "kv_heads", Integer(1, 4096), Derived("heads"), "kv_heads = 1"),
    Key("model", "gate_low_rank_dim", Integer(1, 1 << 20), None, "gate_low_rank_dim = 16", accepts_none=True),
    Key("model", "gate_logit_normalizer", Number(0.0, above=True), GATE_LOGIT_NORMALIZER, "gate_logit_normalizer = 16"),
    Key("model", "clamp_min", Number(), None, "clamp_min = -5", accepts_none=True),
    Key("model", "output_gate", Choice(OutputGate, "output gate"), OutputGate.NONE, "output_gate = swish"),
    Key("model", "delta_gates", Choice(DeltaGates, "delta gates"), DeltaGates.LOG_SIGMOID, "delta_gates = mamba"),
    Key(
        "model", "short_conv_size", Integer(1, model.MAX_SHORT_CONV_SIZE), None, "short_conv_size = 4",
        accepts_none=True,
    ),
    Key("model", "value_heads", Integer(1, 4096), Derived("heads"), "value_heads = 4"),
    Key("model", "state_size", Integer(1, model.MAX_HEAD_DIM), Mamba2Options, "state_size = 64"),
    Key("model", "n_groups", Integer(1, 4096), Mamba2Options, "n_groups = 2"),
    Key("model", "conv_kernel", Integer(1, model.MAX_SHORT_CONV_SIZE), Mamba2Options, "conv_kernel = 4"),
    Key("model", "use_conv_bias", Boolean(), Mamba2Options, "use_conv_bias = false"),
    Key("model", "use_bias", Boolean(), Mamba2Options, "use_bias = true"),
    Key("model", "dt_min", Number(0.0, above=True), Mamba2Options, "dt_min = 0.001"),
    Key("model", "dt_max", Number(0.0, above=True), Mamba2Options, "dt_max = 0.1"),
    Key("model", "dt_init_floor", Number(0.0, above=True), Mamba2Options, "dt_init_floor = 1e-4"),
    Key("model", "dt_limit", model.read_dt_limit, Mamba2Options, "dt_limit = [0.0, 100.0]", accepts_none=True),
    Key("model", "attn_heads", Integer(1, 4096), Derived("heads"), "attn_heads = 4"),
    Key("model", "attn_head_dim", Integer(1, model.MAX_HEAD_DIM), Derived("head_dim"), "attn_head_dim = 64"),
    Key("model", "attn_kv_heads", Integer(1, 4096), Derived("attn_heads"), "attn_kv_heads = 1"),
    Key("model", "qkv_bias", Boolean(), AttentionOptions, "qkv_bias = true"),
    Key("model", "rope_theta", Number(0.0, above=True), AttentionOptions, "rope_theta = 10000", accepts_none=True),
    Key("model", "tie_embeddings", Boolean(), ModelSpec, "tie_embeddings = true"),
    Key("mesh", "pipeline", Integer(1, MAX_MESH_SIZE), MeshSpec, "pipeline = 2"),
    Key("mesh", "sequence", Integer(1, MAX_MESH_SIZE), MeshSpec, "sequence = 2"),
    Key("mesh", "data", Integer(1, MAX_MESH_SIZE), MeshSpec, "data = 2"),
    Key("sequence", "length", Integer(1, sequence.MAX_LENGTH), REQUIRED, "length = 4096"),
    Key("sequence", "chunks", sequence.read_chunks, 1, "chunks = 4", in_block_example=True),
    Key("sequence", "partition", sequence.read_partition, _PARTITION_OF_CHUNKS, "partition = balanced(alpha = 1)"),
    Key("sequence", "kernel_chunk", sequence.read_kernel_chunk, SequenceSpec, "kernel_chunk = 64"),
    Key("sequence", "parallel", sequence.read_parallel, _SCAN_DEFAULT, "parallel = allscan(blocks = 2)"),
    Key("sequence", "attention", Choice(AttentionExchange, "attention exchange"), SequenceSpec, "attention = ring"),
    Key("pipeline", "microbatches", Integer(1, pipeline.MAX_MICROBATCHES), REQUIRED, "microbatches = 4"),
    Key("pipeline", "order", Choice(OrderKind, "pipeline order"), PipelineSpec, "order = 1f1b", in_block_example=True),
    Key("pipeline", "microbatch_size", Integer(1, 1 << 20), PipelineSpec, "microbatch_size = 2"),
    Key("pipeline", "recompute", pipeline.read_recompute, PipelineSpec, "recompute = mlp"),
    Key("pipeline", "offload", Boolean(), PipelineSpec, "offload = true"),
    Key("pipeline", "cuda_graphs", Choice(CudaGraphs, "CUDA-graph mode"), PipelineSpec, "cuda_graphs = step"),
    Key("pipeline", "extra_warmup", pipeline.read_extra_warmup, PipelineSpec, "extra_warmup = [1, 0]"),
    Key("pipeline", "split_backward", Boolean(), PipelineSpec, "split_backward = true"),
    Key("pipeline", "forward_before_weight", Boolean(), PipelineSpec, "forward_before_weight = true"),
    Key("pipeline", "extra_deferred_weights", Integer(0, pipeline.MAX_MICROBATCHES), PipelineSpec, "extra_deferred_weights = 2"),
    Key("train", "steps", Integer(1, 1 << 40), TrainSpec, "steps = 20"),
    Key("train", "optimizer", train.read_optimizer, TrainSpec, "optimizer = adamw(lr = 3e-3)"),
    Key("train", "dtype", Choice(DType, "dtype"), TrainSpec, "dtype = bf16"),
    Key("train", "master_weights", Boolean(), TrainSpec, "master_weights = false"),
    Key("train", "loss_scale", train.read_loss_scale, _LOSS_SCALE_DEFAULT, "loss_scale = dynamic", accepts_none=True),
    Key("train", "data", train.read_data, TrainSpec, "data = synthetic(seed = 0)"),
    Key("train", "seed", Integer(0, train.MAX_SEED), TrainSpec, "seed = 1"),
    Key("train", "grad_clip", Number(0.0, above=True), TrainSpec, "grad_clip = 1.0", accepts_none=True),
    Key("train", "log_every", Integer(1, 1 << 40), TrainSpec, "log_every = 5"),
    Key("train", "lr_schedule", train.read_lr_schedule, TrainSpec, "lr_schedule = cosine(warmup = 100, min_lr = 3e-5)"),
    Key("train", "log", train.read_log, TrainSpec, 'log = tensorboard(directory = "runs/x")', accepts_none=True),
    Key("train", "eval_every", Integer(0, 1 << 40), TrainSpec, "eval_every = 100"),
    Key("train", "eval_batches", Integer(1, 1 << 20), TrainSpec, "eval_batches = 4"),
    Key(
        "train", "checkpoint", train.read_checkpoint, TrainSpec, 'checkpoint = "runs/ckpt" every 50',
        accepts_none=True, accepts_every=True,
    ),
)

KEYS: dict[str, Key] = {key.path: key for key in SCHEMA}
BLOCKS: dict[str, tuple[Key, ...]] = {
    block: tuple(key for key in SCHEMA if key.block == block) for block in dict.fromkeys(key.block for key in SCHEMA)
}

# The key names of each block, for code that only asks whether a name is a key (``revise``).
BLOCK_KEYS: dict[str, tuple[str, ...]] = {block: tuple(key.name for key in keys) for block, keys in BLOCKS.items()}


def block_example(block: str) -> str:
    """``model { vocab = 256  ... }``: the block with its required keys and those marked for the example."""
    shown = [key.example for key in BLOCKS[block] if key.required or key.in_block_example]
    return f"{block} {{ {'  '.join(shown)} }}"


def required_blocks() -> tuple[str, ...]:
    """The blocks that have a required key, and so must be written."""
    return tuple(block for block, keys in BLOCKS.items() if any(key.required for key in keys))


FROM_KEY = "model.from"
"""A model directory whose config gives the model keys the schedule does not write (``hf_import``)."""


def read_key(checker: Checker, path: str) -> object:
    """The value of ``path`` through its row, its default when absent, or ``INVALID`` (reported).

    An absent model key reads as what ``model.from`` gives it when that is written (``INVALID`` when the
    directory was refused); what it does not give falls back to the default.
    """
    key = KEYS[path]
    value = checker.node(path)
    if value is None and key.block == "model" and path != FROM_KEY and checker.given(FROM_KEY):
        imported = checker.get(FROM_KEY)
        if imported is None:
            return INVALID
        if key.name in imported.values:
            return imported.values[key.name]
    if value is None:
        return INVALID if key.required else key.default
    if isinstance(value, ast.EveryClause) and not key.accepts_every:
        allowed = ", ".join(other.path for other in SCHEMA if other.accepts_every)
        checker.error(f"'every' is only allowed in {allowed}", value.span)
        return INVALID
    if key.accepts_none and isinstance(value, ast.Identifier) and value.name == "none":
        return None
    read = key.reader(checker, value, path)
    return INVALID if read is None else read
