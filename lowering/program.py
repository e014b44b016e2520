"""The lowered schedule: what the front end hands to every later pass.

[Note: program contract]
A :class:`ScheduleProgram` is built only by the front end's semantic pass
(``schedlang.semantics``), after every value has been checked: types, ranges,
divisibility and chunk boundaries. Later passes may therefore assume:

* ``model.layers`` is non-empty; ``model.heads * model.head_dim`` is the width
  of every recurrent layer's values (and of its queries and keys unless ``model.gla``
  narrows those of ``gla`` layers), but ``gdn`` layers have
  ``model.gdn.value_heads_of(model.heads)`` value heads, a multiple of ``model.heads``;
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

import dataclasses
from dataclasses import dataclass, field
from enum import Enum

from schedlang.lowering.tasks import TaskId
from schedlang.runtime.config import (
    AttentionGeometry,
    ModelConfig,
    RecurrentStateGeometry,
    attention_geometry,
    recurrent_state_geometry,
)
from schedlang.runtime.model_options import AttentionOptions, GdnOptions, GlaOptions, Mamba2Options, ModelOptions
from schedlang.vocabulary import (
    AttentionExchange,
    CudaGraphs,
    DataKind,
    DType,
    LayerKind,
    LearningRateScheduleKind,
    OptimizerKind,
    Recompute,
    RunRequest,
    SequenceParallelMethod,
    Span,
    StageRecompute,
    TokenFileDType,
)


class MlpKind(str, Enum):
    SWIGLU = "swiglu"
    NONE = "none"


@dataclass(frozen=True)
class MlpSpec:
    """``width`` (``swiglu(intermediate_size = n)``) is the hidden width as is; None: from ``ratio``."""

    kind: MlpKind = MlpKind.SWIGLU
    ratio: float = 4.0
    width: int | None = None


RUNTIME_NORM_EPS = next(field.default for field in dataclasses.fields(ModelConfig) if field.name == "norm_eps")


@dataclass(frozen=True)
class ModelSpec:
    vocab: int
    d_model: int
    layers: tuple[LayerKind, ...]
    heads: int
    head_dim: int
    mlp: MlpSpec = MlpSpec()
    norm_eps: float = RUNTIME_NORM_EPS
    gla: GlaOptions = GlaOptions()
    gdn: GdnOptions = GdnOptions()
    attention: AttentionOptions = AttentionOptions()
    mamba2: Mamba2Options = Mamba2Options()
    tie_embeddings: bool = False
    initial_weights: str | None = None  # a Hugging Face directory with safetensors weights (model.from)

    @property
    def separate_mlp(self) -> bool:
        """Whether the MLPs are layers of their own ([Note: separate MLP layers])."""
        return LayerKind.MLP in self.layers

    def has_mlp(self, kind: LayerKind) -> bool:
        """Whether a layer of ``kind`` holds an MLP."""
        if kind is LayerKind.MLP:
            return True
        return self.mlp.kind is not MlpKind.NONE and not self.separate_mlp

    @property
    def attention_geometry(self) -> AttentionGeometry:
        """The heads of the ``attn`` layers, by the runtime's rule (``schedlang.runtime.config.attention_geometry``)."""
        return attention_geometry(self.heads, self.head_dim, self.attention)

    def state_geometry(self, kind: LayerKind) -> RecurrentStateGeometry | None:
        """The state a ``kind`` layer carries, by the runtime's rule (``schedlang.runtime.config.
        recurrent_state_geometry``); None for a layer without one."""
        return recurrent_state_geometry(kind, self.heads, self.head_dim, self.runtime_config().options)

    def runtime_config(self) -> ModelConfig:
        """The runtime's record of this model, which a generated script writes out (``mlp_ratio`` 0: no MLP)."""
        swiglu = self.mlp.kind is MlpKind.SWIGLU
        options = ModelOptions(
            gla=self.gla,
            gdn=self.gdn,
            attention=self.attention,
            mamba2=self.mamba2,
            mlp_width=self.mlp.width if swiglu else None,
            tie_embeddings=self.tie_embeddings,
            initial_weights=self.initial_weights,
        )
        return ModelConfig(
            vocab=self.vocab,
            d_model=self.d_model,
            layers=self.layers,
            heads=self.heads,
            head_dim=self.head_dim,
            mlp_ratio=float(self.mlp.ratio) if swiglu else 0.0,
            norm_eps=self.norm_eps,
            options=options,
        )


@dataclass(frozen=True)
class MeshSpec:
    """Sizes of the device mesh; world size is their product."""

    pipeline: int = 1
    sequence: int = 1
    data: int = 1

    @property
    def world_size(self) -> int:
        return self.pipeline * self.sequence * self.data


class PartitionKind(str, Enum):
    UNIFORM = "uniform"
    BALANCED = "balanced"  # StateFlow Eq. 9-11
    EXPLICIT = "explicit"


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


class OrderKind(str, Enum):
    GPIPE = "gpipe"
    ONE_F_ONE_B = "1f1b"
    EXPLICIT = "explicit"


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
class OptimizerSpec:
    kind: OptimizerKind = OptimizerKind.ADAMW
    lr: float = 1e-3
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.999)
    momentum: float = 0.0  # SGD only


@dataclass(frozen=True)
class LearningRateScheduleSpec:
    """``train.lr_schedule``: ``warmup`` steps rising linearly to the optimizer's lr, then ``kind`` down to
    ``min_lr`` at the last of ``train.steps``."""

    kind: LearningRateScheduleKind = LearningRateScheduleKind.CONSTANT
    warmup: int = 0
    min_lr: float = 0.0


@dataclass(frozen=True)
class DataSpec:
    kind: DataKind = DataKind.SYNTHETIC
    seed: int = 0
    path: str | None = None  # for DataKind.BYTES (None: the default corpus) and DataKind.TOKENS (required)
    dtype: TokenFileDType = TokenFileDType.UINT16  # DataKind.TOKENS only
    tokenizer: str | None = None  # DataKind.TEXT only: a Hugging Face tokenizer.json
    validation: float = 0.0  # file data: the last fraction of its tokens, held out for validation
    document_end: int | str | None = None  # file data: the token id ending each packed document (text: or its name)


@dataclass(frozen=True)
class CheckpointSpec:
    directory: str
    every: int


@dataclass(frozen=True)
class LossScaleSpec:
    """``train.loss_scale``: ``dynamic`` (from 2**16, by torch.amp.GradScaler's rules) or a fixed ``scale``."""

    dynamic: bool = True
    scale: float = 65536.0


@dataclass(frozen=True)
class TrainSpec:
    steps: int = 10
    optimizer: OptimizerSpec = OptimizerSpec()
    dtype: DType = DType.FP32
    data: DataSpec = DataSpec()
    seed: int = 0  # parameter initialisation seed
    grad_clip: float | None = None
    checkpoint: CheckpointSpec | None = None
    log_every: int = 1
    lr_schedule: LearningRateScheduleSpec = LearningRateScheduleSpec()
    log: str | None = None  # a TensorBoard directory: train.log = tensorboard(directory = "...")
    eval_every: int = 0  # a validation loss after every this many steps; 0: none
    eval_batches: int = 1  # validation batches per evaluation
    master_weights: bool = True  # fp32 master weights for a 16-bit dtype: see keeps_master_weights
    loss_scale: LossScaleSpec | None = None  # None: no loss scaling; the checker makes fp16's dynamic

    @property
    def keeps_master_weights(self) -> bool:
        """Whether the optimizer updates fp32 master weights of a 16-bit model ([Note: master weights] in
        schedlang.runtime.master_weights): ``master_weights`` and a 16-bit ``dtype``."""
        return self.master_weights and self.dtype.is_16_bit


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
    model: ModelSpec
    mesh: MeshSpec
    sequence: SequenceSpec
    pipeline: PipelineSpec
    train: TrainSpec
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


def run_request(model: ModelSpec, mesh: MeshSpec, sequence: SequenceSpec, pipeline: PipelineSpec) -> RunRequest:
    """What a schedule asks the runtime to run, for the capabilities list (schedlang.vocabulary.capabilities)."""
    return RunRequest(
        layers=model.layers,
        sequence_parallel=mesh.sequence,
        chunk_lengths=tuple(sequence.chunk_length(chunk) for chunk in range(sequence.n_chunks)),
        recompute=pipeline.recompute,
        offload=pipeline.offload,
        cuda_graphs=pipeline.cuda_graphs,
    )
