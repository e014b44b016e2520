"""Plain configuration records that generated training scripts fill in with literals.

The runtime never sees the lowering IR: code generation copies every value it
needs out of the checked ``ScheduleProgram`` into these frozen dataclasses, so
a generated script reads as a hand-written one and the runtime stays
independent of the front end.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from schedlang.runtime.model_options import AttentionOptions, ModelOptions
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
    StageRecompute,
    TokenFileDType,
    stage_recompute,
)


@dataclass(frozen=True)
class AttentionGeometry:
    """The head layout of a model's ``attn`` layers: ``heads`` query heads and ``kv_heads`` key/value heads,
    all ``head_dim`` wide (:func:`attention_geometry` derives it)."""

    heads: int
    kv_heads: int
    head_dim: int

    @property
    def query_width(self) -> int:
        """Features of a token's queries, and of the attention output the output projection reads."""
        return self.heads * self.head_dim

    @property
    def key_value_width(self) -> int:
        """Features of a token's keys (and of its values) as the k and v projections produce them."""
        return self.kv_heads * self.head_dim

    @property
    def is_grouped(self) -> bool:
        """Whether key/value heads are shared by several query heads (grouped-query attention)."""
        return self.kv_heads < self.heads

    @property
    def buffered_key_value_width(self) -> int:
        """Features of a token's keys (and of its values) in the sequence-wide K/V buffers, their gradient
        buffers and the sequence-parallel all-gather: the ``kv_heads`` heads the projections make ([Note:
        sequence-wide K/V] in schedlang.runtime.kv_buffers)."""
        return self.key_value_width

    @property
    def read_key_value_width(self) -> int:
        """Features of a token's keys (and of its values) as the attention kernels read them: each key/value
        head repeated for its query heads, so ``heads`` wide; with groups a copy of one part per kernel call,
        per layer at a time ([Note: grouped key/value heads] in schedlang.runtime.attention_parts)."""
        return self.query_width


def attention_geometry(heads: int, head_dim: int, options: AttentionOptions) -> AttentionGeometry:
    """The ``attn`` layers' heads: ``options.heads`` and ``options.head_dim``, each None falling back to the
    model's ``heads`` and ``head_dim``, and ``options.kv_heads``, None falling back to the query heads."""
    query_heads = options.heads or heads
    return AttentionGeometry(
        heads=query_heads, kv_heads=options.kv_heads or query_heads, head_dim=options.head_dim or head_dim
    )


@dataclass(frozen=True)
class RecurrentStateGeometry:
    """What one recurrent layer carries across a chunk, stage or sequence-rank boundary, per batch row, by the
    rule its mixer builds it with (:func:`recurrent_state_geometry`): a ``[heads, key_dim, value_dim]`` state
    matrix, then ``history_rows`` of its short convolutions' last inputs, ``history_channels`` features each
    ([Note: short-convolution state] in schedlang.runtime.short_convolution); ``transition_elements``: one
    rank's transition over its span, which the sequence-parallel all-gather sends beside the state ([Note:
    transitions] in schedlang.runtime.scan_common)."""

    heads: int
    key_dim: int
    value_dim: int
    transition_elements: int
    history_rows: int = 0
    history_channels: int = 0

    @property
    def matrix_elements(self) -> int:
        """Elements of the state matrix: what the cross-rank scan passes."""
        return self.heads * self.key_dim * self.value_dim

    @property
    def elements(self) -> int:
        """Elements of the whole state: what the state store keeps and a stage boundary passes."""
        return self.matrix_elements + self.history_rows * self.history_channels


def recurrent_state_geometry(
    kind: LayerKind, heads: int, head_dim: int, options: ModelOptions
) -> RecurrentStateGeometry | None:
    """The state of a ``kind`` layer of a model with ``heads`` heads of ``head_dim`` (None for a layer without
    one). GLA: ``heads`` heads of ``gla.head_k_dim`` keys, a decay per key row; simple GLA: ``head_dim`` keys,
    a decay per head; Gated DeltaNet: ``gdn.value_heads_of(heads)`` heads of ``gdn.head_k_dim`` keys, a
    ``[key_dim, key_dim]`` transition per head, and with short convolutions ``short_conv_size - 1`` history
    rows of its q, k and v inputs (``2 heads key_dim + value_heads head_dim`` features); Mamba-2: ``heads``
    heads of ``mamba2.state_size`` keys and ``head_dim`` values (simple GLA's state), a decay per head, and
    ``conv_kernel - 1`` history rows of its x, B and C inputs (``mamba2.convolved_width`` features)."""
    if kind is LayerKind.GLA:
        key_dim = options.gla.head_k_dim or head_dim
        return RecurrentStateGeometry(heads, key_dim, head_dim, transition_elements=heads * key_dim)
    if kind is LayerKind.SIMPLE_GLA:
        return RecurrentStateGeometry(heads, head_dim, head_dim, transition_elements=heads)
    if kind is LayerKind.GDN:
        gdn = options.gdn
        value_heads, key_dim = gdn.value_heads_of(heads), gdn.head_k_dim or head_dim
        taps = gdn.short_conv_size
        return RecurrentStateGeometry(
            value_heads,
            key_dim,
            head_dim,
            transition_elements=value_heads * key_dim * key_dim,
            history_rows=taps - 1 if taps else 0,
            history_channels=2 * heads * key_dim + value_heads * head_dim if taps else 0,
        )
    if kind is LayerKind.MAMBA2:
        mamba2 = options.mamba2
        return RecurrentStateGeometry(
            heads,
            mamba2.state_size,
            head_dim,
            transition_elements=heads,
            history_rows=mamba2.conv_kernel - 1,
            history_channels=mamba2.convolved_width(heads, head_dim),
        )
    return None


@dataclass(frozen=True)
class ModelConfig:
    """The language model: embedding, ``layers`` blocks, final RMSNorm, LM head.

    ``mlp_ratio`` is the SwiGLU hidden width over ``d_model`` (the width is
    rounded up to a multiple of 8, see ``model.swiglu_width``); 0 means blocks
    without an MLP. When ``layers`` holds ``mlp`` layers, the MLPs are those
    layers and the mixing layers hold none (``[gla, mlp] * L`` is the network of
    ``[gla] * L``, cut finer).
    """

    vocab: int
    d_model: int
    layers: tuple[LayerKind, ...]
    heads: int
    head_dim: int
    mlp_ratio: float = 4.0
    norm_eps: float = 1e-6
    options: ModelOptions = field(default_factory=ModelOptions)  # flash-linear-attention's GLA and more

    def __post_init__(self) -> None:
        object.__setattr__(self, "layers", tuple(LayerKind(kind) for kind in self.layers))
        if LayerKind.MLP in self.layers and self.mlp_ratio <= 0:
            raise ValueError("mlp layers need an MLP: mlp_ratio must be > 0")

    def has_mlp(self, kind: LayerKind) -> bool:
        """Whether a layer of ``kind`` holds the MLP."""
        if kind is LayerKind.MLP:
            return True
        return self.mlp_ratio > 0 and LayerKind.MLP not in self.layers

    @property
    def attention_geometry(self) -> AttentionGeometry:
        """The head layout of the ``attn`` layers (:func:`attention_geometry`)."""
        return attention_geometry(self.heads, self.head_dim, self.options.attention)

    @property
    def init_depth(self) -> int:
        """``2 x`` the mixing layers: output projections start at std ``0.02 / sqrt(init_depth)`` (GPT-2's scaling
        for a stack of mixer-and-MLP blocks), the same for ``[gla] * L`` and ``[gla, mlp] * L``."""
        return max(1, 2 * sum(kind is not LayerKind.MLP for kind in self.layers))


@dataclass(frozen=True)
class PipelineConfig:
    """How one step runs: stages, chunks, microbatches and each stage's action list.

    ``stage_actions[r]`` is the static list of actions of every rank of stage
    ``r`` in text form (see :mod:`schedlang.vocabulary.actions`). ``recompute``
    names what a chunk's backward recomputes, on every stage or stage by stage
    ([Note: recompute modes] in :mod:`schedlang.runtime.executor`); ``offload`` keeps what a chunk's forward
    saves in pinned host memory until its backward (:mod:`schedlang.runtime.offload`).
    """

    stage_layers: tuple[tuple[int, ...], ...]
    chunk_boundaries: tuple[int, ...]
    microbatches: int
    microbatch_size: int
    stage_actions: tuple[tuple[str, ...], ...]
    data_parallel: int = 1
    recompute: StageRecompute = Recompute.NONE  # one mode, or one per stage
    sequence_parallel: int = 1
    sequence_method: SequenceParallelMethod = SequenceParallelMethod.ALLSCAN
    scan_blocks: int = 1
    # how an attention layer's key/value slices cross the sequence-parallel group
    # ([Note: sequence-parallel attention] in schedlang.runtime.attention_parallel)
    attention_exchange: AttentionExchange = AttentionExchange.ALLGATHER
    # replay a chunk's forward/backward from per-slot graphs (schedlang.runtime.graphs), or the whole step's
    # compute from graphs captured in order into one pool (schedlang.runtime.step_graphs)
    cuda_graphs: CudaGraphs = CudaGraphs.NONE
    offload: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "sequence_method", SequenceParallelMethod(self.sequence_method))
        object.__setattr__(self, "attention_exchange", AttentionExchange(self.attention_exchange))
        object.__setattr__(self, "recompute", stage_recompute(self.recompute))
        if isinstance(self.cuda_graphs, bool):  # scripts generated before the step mode wrote a flag
            object.__setattr__(self, "cuda_graphs", CudaGraphs.CHUNK_SLOTS if self.cuda_graphs else CudaGraphs.NONE)
        object.__setattr__(self, "cuda_graphs", CudaGraphs(self.cuda_graphs))

    @property
    def n_stages(self) -> int:
        return len(self.stage_layers)

    @property
    def n_chunks(self) -> int:
        return len(self.chunk_boundaries) - 1

    @property
    def sequence_length(self) -> int:
        return self.chunk_boundaries[-1]

    def local_bounds(self, chunk: int, sequence_index: int) -> tuple[int, int]:
        """The token range of ``chunk`` that sequence-parallel rank ``sequence_index`` holds (contiguous split)."""
        start, end = self.chunk_boundaries[chunk], self.chunk_boundaries[chunk + 1]
        length = end - start
        return (
            start + length * sequence_index // self.sequence_parallel,
            start + length * (sequence_index + 1) // self.sequence_parallel,
        )

    @property
    def chunk_lengths(self) -> tuple[int, ...]:
        return tuple(end - start for start, end in zip(self.chunk_boundaries, self.chunk_boundaries[1:]))

    @property
    def sequences_per_replica(self) -> int:
        return self.microbatches * self.microbatch_size

    @property
    def global_batch(self) -> int:
        """Sequences per optimizer step, over all data-parallel replicas."""
        return self.sequences_per_replica * self.data_parallel


@dataclass(frozen=True)
class OptimizerConfig:
    kind: OptimizerKind = OptimizerKind.ADAMW
    lr: float = 1e-3
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.999)
    momentum: float = 0.0

    def __post_init__(self) -> None:
        object.__setattr__(self, "kind", OptimizerKind(self.kind))


@dataclass(frozen=True)
class DataConfig:
    kind: DataKind = DataKind.SYNTHETIC
    seed: int = 0
    path: str | None = None  # DataKind.BYTES (None reads the default corpus) and DataKind.TOKENS
    dtype: TokenFileDType = TokenFileDType.UINT16  # DataKind.TOKENS only
    tokenizer: str | None = None  # DataKind.TEXT only: a Hugging Face tokenizer.json
    validation: float = 0.0  # the last fraction of a file's tokens, held out for validation batches
    # the token id that ends each packed document (text data: or the tokenizer's name of it); None: no packing
    document_end: int | str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "kind", DataKind(self.kind))
        object.__setattr__(self, "dtype", TokenFileDType(self.dtype))


@dataclass(frozen=True)
class LearningRateScheduleConfig:
    """``warmup`` steps rising linearly to the optimizer's lr, then ``kind`` down to ``min_lr`` at the run's
    last step (schedlang.runtime.lr_schedule)."""

    kind: LearningRateScheduleKind = LearningRateScheduleKind.CONSTANT
    warmup: int = 0
    min_lr: float = 0.0

    def __post_init__(self) -> None:
        object.__setattr__(self, "kind", LearningRateScheduleKind(self.kind))


@dataclass(frozen=True)
class LossScaleConfig:
    """``train.loss_scale``: the loss is multiplied by a scale before the backward and the gradients divided
    by it after; ``dynamic`` changes the scale by torch.amp.GradScaler's rules, else it stays ``initial``
    ([Note: loss scaling] in schedlang.runtime.loss_scale)."""

    dynamic: bool = True
    initial: float = 65536.0
    growth_factor: float = 2.0
    backoff_factor: float = 0.5
    growth_interval: int = 2000


@dataclass(frozen=True)
class TrainConfig:
    steps: int = 10
    seed: int = 0
    dtype: DType = DType.FP32
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    data: DataConfig = field(default_factory=DataConfig)
    grad_clip: float | None = None
    checkpoint_directory: str | None = None
    checkpoint_every: int = 0
    log_every: int = 1
    lr_schedule: LearningRateScheduleConfig = field(default_factory=LearningRateScheduleConfig)
    tensorboard_directory: str | None = None  # TensorBoard scalars of every step (schedlang.runtime.progress)
    eval_every: int = 0  # a validation loss after every this many steps; 0: none
    eval_batches: int = 1  # validation batches (each a global batch) per evaluation
    master_weights: bool = True  # fp32 master weights for a 16-bit dtype: see keeps_master_weights
    loss_scale: LossScaleConfig | None = None  # None: no loss scaling (the checker asks for it with fp16)

    def __post_init__(self) -> None:
        object.__setattr__(self, "dtype", DType(self.dtype))

    @property
    def keeps_master_weights(self) -> bool:
        """Whether the optimizer updates fp32 master weights of a 16-bit model ([Note: master weights] in
        schedlang.runtime.master_weights)."""
        return self.master_weights and self.dtype.is_16_bit


def run_request(model: ModelConfig, pipeline: PipelineConfig) -> RunRequest:
    """What these records ask the runtime to run, for the capabilities list (schedlang.vocabulary.capabilities)."""
    return RunRequest(
        layers=model.layers,
        sequence_parallel=pipeline.sequence_parallel,
        chunk_lengths=pipeline.chunk_lengths,
        recompute=pipeline.recompute,
        offload=pipeline.offload,
        cuda_graphs=pipeline.cuda_graphs,
    )
