"""The key schema: one row per ``block.key`` of the language (rows: ``schedlang.vocabulary.keys.Key``).

Each row names the key's reader (its type and bounds as data, or the structured reader of
:data:`STRUCTURED_READERS`), its default, an example, the record fields it fills, how a value is written back
as text and its cells in docs/language.md. The rows of ``model`` and ``train`` sit beside the records they
fill (``vocabulary.model_settings.MODEL_KEYS``, ``vocabulary.train_settings.TRAIN_KEYS``); the rows of the
compiler's own blocks (``mesh``, ``sequence``, ``pipeline``, whose records live in
``schedlang.lowering.program``) are here. Everything about a single key is derived from :data:`SCHEMA`: the
block names and their keys (unknown keys and "did you mean"), the required keys and blocks and the examples
their messages suggest, the type and range messages, the block records (``checks.records``), the text
``compiler.revise`` writes, and the key tables of docs/language.md (``python -m schedlang.checks.key_tables``
writes them; a test holds the two together). What relates two keys is a rule, in ``schedlang.checks.rules``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from schedlang import ast
from schedlang.checks import hf_import, model, pipeline, sequence, train
from schedlang.checks.mesh import MAX_MESH_SIZE
from schedlang.checks.readers import INVALID, Reader, read_bounded
from schedlang.lowering.program import MeshSpec, PipelineSpec, SequenceSpec
from schedlang.vocabulary import AttentionExchange, CudaGraphs, OrderKind, PartitionKind, SequenceParallelMethod
from schedlang.vocabulary.keys import REQUIRED, Boolean, Choice, Derived, Integer, Key, Structured
from schedlang.vocabulary.model_settings import MODEL_KEYS
from schedlang.vocabulary.train_settings import TRAIN_KEYS

if TYPE_CHECKING:
    from schedlang.checks.context import Checker

__all__ = ["BLOCKS", "BLOCK_KEYS", "KEYS", "REQUIRED", "SCHEMA", "Derived", "Key", "read_key", "reader_of"]

_PARTITION_OF_CHUNKS = Derived("uniform, or explicit when chunks lists the boundaries")
_SCAN_DEFAULT = (SequenceSpec.parallel, SequenceSpec.scan_blocks)


def _partition_text(value: tuple[PartitionKind, float | None]) -> str:
    kind, alpha = value
    return f"balanced(alpha = {alpha!r})" if kind is PartitionKind.BALANCED else kind.value


def _parallel_text(value: tuple[SequenceParallelMethod, int]) -> str:
    method, blocks = value
    return f"allscan(blocks = {blocks})" if method is SequenceParallelMethod.ALLSCAN else method.value


COMPILER_KEYS: tuple[Key, ...] = (
    Key(
        "mesh", "pipeline", Integer(1, MAX_MESH_SIZE), MeshSpec, "pipeline = 2",
        doc="number of pipeline stages, 1 .. 65536",
    ),
    Key(
        "mesh", "sequence", Integer(1, MAX_MESH_SIZE), MeshSpec, "sequence = 2",
        doc="ranks sharing each chunk (sequence parallelism), 1 .. 65536",
    ),
    Key(
        "mesh", "data", Integer(1, MAX_MESH_SIZE), MeshSpec, "data = 2",
        doc="data-parallel replicas, 1 .. 65536",
    ),
    Key(
        "sequence", "length", Integer(1, sequence.MAX_LENGTH), REQUIRED, "length = 4096",
        doc="tokens per sequence, 1 .. 2^31",
    ),
    Key(
        "sequence", "chunks", Structured(), 1, "chunks = 4",
        doc="see below",
        value_doc="integer `N` or boundary list",
        fills=("boundaries",),
        in_block_example=True,
    ),
    Key(
        "sequence", "partition", Structured(), _PARTITION_OF_CHUNKS, "partition = balanced(alpha = 1)",
        doc="`0 <= alpha <= 4`, default alpha 1",
        value_doc="`uniform`, `balanced(alpha = a)`, `explicit`",
        default_doc="`uniform` (`explicit` for a list)",
        fills=("partition", "balance_alpha"),
        write=_partition_text,
    ),
    Key(
        "sequence", "kernel_chunk", Structured(), SequenceSpec, "kernel_chunk = 64",
        doc="a power of two (the kernels tile in power-of-two blocks)",
        value_doc="integer",
    ),
    Key(
        "sequence", "parallel", Structured(), _SCAN_DEFAULT, "parallel = allscan(blocks = 2)",
        doc="`blocks` divides `head_dim`",
        value_doc="`allscan(blocks = k)`, `ring`, `allgather`",
        default_doc="`allscan(blocks = 1)`",
        fills=("parallel", "scan_blocks"),
        write=_parallel_text,
    ),
    Key(
        "sequence", "attention", Choice(AttentionExchange, "attention exchange"), SequenceSpec, "attention = ring",
        doc="how `attn` layers exchange K/V across the sequence group",
        value_doc="`allgather`, `ring`",
    ),
    Key(
        "pipeline", "microbatches", Integer(1, pipeline.MAX_MICROBATCHES), REQUIRED, "microbatches = 4",
        doc="1 .. 2^20",
    ),
    Key(
        "pipeline", "order", Choice(OrderKind, "pipeline order"), PipelineSpec, "order = 1f1b",
        doc="`explicit` needs `stage` lines",
        in_block_example=True,
    ),
    Key(
        "pipeline", "microbatch_size", Integer(1, 1 << 20), PipelineSpec, "microbatch_size = 2",
        doc="sequences per microbatch",
    ),
    Key(
        "pipeline", "recompute", Structured(), PipelineSpec, "recompute = mlp",
        doc=(
            "a list gives each pipeline stage its own mode, first stage first: in 1F1B the first stages hold the most "
            "chunks in flight, so they can recompute more while the last ones keep everything. What a chunk's backward "
            "recomputes instead of keeping: `mlp` each layer's MLP (its norm included; the MLP's input is kept), "
            "`mixer` each layer's token mixer (`gla`, `simple_gla`, `gdn`, `mamba2`, `mamba3` or `attn`, its norm included; "
            "the mixer's "
            "input and initial state are kept), `full` the chunk's whole forward (only the chunk's input and initial "
            "states are kept); results are identical in every mode"
        ),
        value_doc="`none`, `mlp`, `mixer`, `full`, or a list of those, one per stage (`[full, mlp]`)",
    ),
    Key(
        "pipeline", "offload", Boolean(), PipelineSpec, "offload = true",
        doc=(
            "`true`: the activations a chunk's forward saves for its backward wait in pinned host memory, copied out "
            "on a side stream while the forward computes and back ahead of the backward (on the CPU the mechanism runs "
            "but moves nothing); not with `recompute = full`, which saves none, nor with `cuda_graphs`. Every chunk "
            "in flight keeps its copies until its backward, so a stage pins about a whole sequence's saved "
            "activations, and a node's ranks add up: that must fit the host's memory (`schedlang simulate FILE` "
            "prints it per stage and node, and refuses a node over `--host-memory`'s pinned share; `tune` never "
            "picks such a schedule; docs/cost-model.md, \"Host memory\"). A run that would pin more than the host "
            "has available stops with an error"
        ),
        value_doc="`true`, `false`",
    ),
    Key(
        "pipeline", "cuda_graphs", Choice(CudaGraphs, "CUDA-graph mode"), PipelineSpec, "cuda_graphs = step",
        doc=(
            "`true`: each chunk's forward and backward replay CUDA graphs captured at the first step (GPU only), one "
            "captured pair per chunk in flight, each with its own memory pool, so a chunk costs no host time, and the "
            "linear layers add their weight gradients into `.grad` inside the backward GEMMs instead of one addition "
            "per chunk; needs equal chunk lengths. `step`: every `F`, `B` and deferred `W` of the stage is a graph of "
            "its own, captured in the step's order at the second step (the first runs eagerly) into one memory pool "
            "that is reused as an eager step reuses memory, so the reserved peak stays near the eager one; chunks may "
            "differ in length, and a stage may recompute `full` (its backward graph reruns the forward). `true` needs "
            "`recompute = none`, `step` `none` or `full`; both need `offload = false`, `mesh.sequence = 1` and no "
            "`attn` layers"
        ),
        value_doc="`true`, `false`, `step`",
    ),
    Key(
        "pipeline", "extra_warmup", Structured(), PipelineSpec, "extra_warmup = [1, 0]",
        doc=(
            "only with `order = 1f1b`: warm-up forwards added on every stage but the last; a list ends in 0 and rises "
            "by at most 1 from one stage to the next"
        ),
        value_doc="integer, or a list with one per stage",
    ),
    Key(
        "pipeline", "split_backward", Boolean(), PipelineSpec, "split_backward = true",
        doc=(
            "`true`: each backward is split into `B` (input and state gradients) and `W` (the weight gradients of the "
            "linear layers), zero-bubble style"
        ),
        value_doc="`true`, `false`",
    ),
    Key(
        "pipeline", "forward_before_weight", Boolean(), PipelineSpec, "forward_before_weight = true",
        doc=(
            "only with `split_backward = true` and `order = 1f1b`: every stage that receives activations runs the next "
            "forward before the `W` of the backward before it"
        ),
        value_doc="`true`, `false`",
    ),
    Key(
        "pipeline", "extra_deferred_weights", Integer(0, pipeline.MAX_MICROBATCHES), PipelineSpec,
        "extra_deferred_weights = 2",
        doc=(
            "only with `split_backward = true` and `order = 1f1b`: `W` tasks moved to the end of the step beyond those "
            "`split_backward` moves, on every stage but the first"
        ),
    ),
)

SCHEMA: tuple[Key, ...] = MODEL_KEYS + COMPILER_KEYS + TRAIN_KEYS

STRUCTURED_READERS: dict[str, Reader] = {
    "model.layers": model.read_layers,
    "model.mlp": model.read_mlp,
    "model.stages": model.read_stage_assignment,
    "model.from": hf_import.read_from,
    "model.dt_limit": model.read_dt_limit,
    "sequence.chunks": sequence.read_chunks,
    "sequence.partition": sequence.read_partition,
    "sequence.kernel_chunk": sequence.read_kernel_chunk,
    "sequence.parallel": sequence.read_parallel,
    "pipeline.recompute": pipeline.read_recompute,
    "pipeline.extra_warmup": pipeline.read_extra_warmup,
    "train.optimizer": train.read_optimizer,
    "train.loss_scale": train.read_loss_scale,
    "train.data": train.read_data,
    "train.lr_schedule": train.read_lr_schedule,
    "train.log": train.read_log,
    "train.checkpoint": train.read_checkpoint,
}
"""The reader of each row whose value has a form of its own (``Structured``), by path."""

KEYS: dict[str, Key] = {key.path: key for key in SCHEMA}
BLOCKS: dict[str, tuple[Key, ...]] = {
    block: tuple(key for key in SCHEMA if key.block == block) for block in dict.fromkeys(key.block for key in SCHEMA)
}

# The key names of each block, for code that only asks whether a name is a key (``revise``).
BLOCK_KEYS: dict[str, tuple[str, ...]] = {block: tuple(key.name for key in keys) for block, keys in BLOCKS.items()}


def reader_of(key: Key) -> Reader:
    """The callable that reads ``key``'s value: its structured reader, or its data reader's interpretation."""
    if isinstance(key.reader, Structured):
        return STRUCTURED_READERS[key.path]
    return lambda checker, value, path: read_bounded(checker, key.reader, value, path)


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
    read = reader_of(key)(checker, value, path)
    return INVALID if read is None else read
