"""The lowered schedule: what the front end hands to every later pass.

[Note: program contract]
A :class:`ScheduleProgram` is built only by the front end's semantic pass
(``schedlang.semantics``), after every value has been checked: types, ranges,
divisibility and chunk boundaries. Later passes may therefore assume:

* ``model`` and ``train`` are the vocabulary's records (``ModelConfig``, ``TrainConfig``), the same ones
  the runtime reads; their paths are as written (relative to the schedule file until
  ``lowering.paths.with_resolved_paths``);
* ``model.layers`` is non-empty; ``model.heads * model.head_dim`` is the width
  of every recurrent layer's values (and of its queries and keys unless ``model.options.gla``
  narrows those of ``gla`` layers), but ``gdn`` layers have
  ``model.options.gdn.value_heads_of(model.heads)`` value heads, a multiple of ``model.heads``;
  ``attn`` layers have the heads of ``model.attention_geometry``;
* ``stage_layers`` partitions ``range(len(model.layers))`` into
  ``mesh.pipeline`` contiguous, non-empty, increasing runs;
* ``sequence.boundaries`` starts at 0, ends at ``sequence.length`` and is
  strictly increasing; every inner boundary is a multiple of
  ``sequence.kernel_chunk`` (the last chunk may be ragged only when the length
  itself is not a multiple);
* for ``OrderKind.EXPLICIT`` the orders are *as written*: they have been parsed
  but not checked for completeness or legality; that is the legality pass's job,
  so it can report every violation with the span of the offending token.

``document_pieces`` is the exception: a statistic of the data file, not of the text, which the front end
leaves None and ``schedlang simulate`` fills in (schedlang.preflight.with_document_pieces) for the memory
and cost models.

Everything here is a frozen dataclass or an enum so programs hash, compare and
print, and so passes cannot mutate what they are given.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from schedlang.vocabulary import (
    AttentionExchange,
    CudaGraphs,
    ModelConfig,
    OrderKind,
    PartitionKind,
    Recompute,
    SequenceParallelMethod,
    Span,
    StageRecompute,
    TrainConfig,
)
from schedlang.vocabulary.actions import TaskId


@dataclass(frozen=True)
class MeshSpec:
    """Sizes of the device mesh; world size is their product."""

    pipeline: int = 1
    sequence: int = 1
    data: int = 1

    @property
    def world_size(self) -> int:
        return self.pipeline * self.sequence * self.data


@dataclass(frozen=True)
class SequenceSpec:
    length: int
    boundaries: tuple[int, ...]  # c_0 = 0 < c_1 < ... < c_N = length
    kernel_chunk: int = 64
    partition: PartitionKind = PartitionKind.UNIFORM
    balance_alpha: float | None = None  # set for PartitionKind.BALANCED
    parallel: SequenceParallelMethod = SequenceParallelMethod.ALLSCAN
    scan_blocks: int = 1  # All-Scan pipeline depth (blocks of state rows)
    attention: AttentionExchange = AttentionExchange.ALLGATHER  # attn layers' K/V exchange across the group

    @property
    def n_chunks(self) -> int:
        return len(self.boundaries) - 1

    def chunk_length(self, chunk: int) -> int:
        return self.boundaries[chunk + 1] - self.boundaries[chunk]


@dataclass(frozen=True)
class TaskToken:
    """One task of an explicit order, with where it was written."""

    task: TaskId
    span: Span | None = None


@dataclass(frozen=True)
class StageOrder:
    """An explicit ``stage r: ...`` line."""

    stage: int
    tasks: tuple[TaskToken, ...]
    span: Span | None = None


@dataclass(frozen=True)
class PipelineSpec:
    microbatches: int
    order: OrderKind = OrderKind.ONE_F_ONE_B
    explicit_orders: tuple[StageOrder, ...] = ()  # only for OrderKind.EXPLICIT
    microbatch_size: int = 1  # sequences per microbatch
    # one mode for every stage, or one per stage ([Note: recompute modes] in schedlang.runtime.executor)
    recompute: StageRecompute = Recompute.NONE
    # keep a chunk's saved activations in pinned host memory between its forward and its backward
    offload: bool = False
    cuda_graphs: CudaGraphs = CudaGraphs.NONE
    # 1f1b only: forwards added to every stage's warm-up but the last's, or a tuple with one count per stage
    extra_warmup: int | tuple[int, ...] = 0
    # weight gradients of linear layers as W tasks of their own ([Note: split backward] in lowering/orders.py)
    split_backward: bool = False
    # 1f1b with split_backward only: stages that receive activations run the next forward before the W of the
    # backward before it ([Note: forward before weight gradients] in lowering/orders.py)
    forward_before_weight: bool = False
    # 1f1b with split_backward only: W tasks deferred to the end of the step beyond those [Note: split backward]
    # defers, on every stage but the first
    extra_deferred_weights: int = 0


@dataclass(frozen=True)
class DocumentPieces:
    """The most document pieces a chunk of each length can hold in the schedule's packed data ([Note: packed
    documents] in schedlang.runtime.packing): ``by_length``, ``(chunk length, pieces)`` pairs by length."""

    by_length: tuple[tuple[int, int], ...]

    def most(self, chunk_length: int) -> int:
        """The most pieces of a chunk of ``chunk_length`` tokens; KeyError for a length not measured."""
        return dict(self.by_length)[chunk_length]


@dataclass(frozen=True)
class ScheduleProgram:
    """A checked schedule; see [Note: program contract]."""

    name: str
    model: ModelConfig
    mesh: MeshSpec
    sequence: SequenceSpec
    pipeline: PipelineSpec
    train: TrainConfig
    stage_layers: tuple[tuple[int, ...], ...]  # layer indices owned by each stage
    source_file: str = "<memory>"
    spans: dict[str, Span] = field(default_factory=dict, compare=False, hash=False)
    """Where each key was written, by dotted path (``"pipeline.order"``), for
    diagnostics raised after the front end."""
    source_text: str | None = field(default=None, compare=False, hash=False, repr=False)
    """The schedule text the program was checked from, kept by the front end so that a variant can be
    checked again (``schedlang.compiler.revise``); None for a program built by hand."""
    document_pieces: DocumentPieces | None = None
    """The data's document pieces per chunk, by which the models size the recurrent operators' padded rows;
    None: no padding (no packed documents, or not measured)."""

    @property
    def n_stages(self) -> int:
        return self.mesh.pipeline

    @property
    def n_microbatches(self) -> int:
        return self.pipeline.microbatches

    @property
    def n_chunks(self) -> int:
        return self.sequence.n_chunks

    @property
    def sequence_parallel(self) -> int:
        """Ranks sharing each chunk (``mesh.sequence``), as the runtime's pipeline record names them."""
        return self.mesh.sequence

    @property
    def chunk_lengths(self) -> tuple[int, ...]:
        return tuple(self.sequence.chunk_length(chunk) for chunk in range(self.sequence.n_chunks))

    @property
    def recompute(self) -> StageRecompute:
        return self.pipeline.recompute

    @property
    def offload(self) -> bool:
        return self.pipeline.offload

    @property
    def cuda_graphs(self) -> CudaGraphs:
        return self.pipeline.cuda_graphs
