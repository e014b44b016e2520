"""The names a schedule, the lowering and the runtime share: one enum per choice a schedule makes.

Each enum's values are the words of the schedule language (``layers = [gla, attn]``, ``adamw(...)``,
``parallel = ring``), so a generated script may pass either the enum or its string value to the runtime's
configuration records, and the front end reads the words straight into these types.
"""

from __future__ import annotations

from enum import Enum


class LayerKind(str, Enum):
    """Layer kinds: token mixers (the recurrent ones carry state across chunks) and ``mlp``.

    ``gdn`` is Gated DeltaNet (the gated delta rule); ``mamba2`` is Mamba-2 (its SSD through simple GLA's
    kernels, ``schedlang.runtime.mixer_mamba2``); ``mamba3`` is Mamba-3 SISO (its trapezoidal update with
    data-dependent rotary angles through the same kernels, ``schedlang.runtime.mixer_mamba3``); ``attn`` is
    causal softmax attention, which the runtime runs over sequence-wide K/V buffers (``schedlang.runtime.kv_buffers``).

    [Note: separate MLP layers] A mixing layer is a pre-norm residual block of its mixer and the model's
    MLP, unless the layer list names ``mlp`` layers: then the MLPs stand where those are (each its own
    pre-norm residual block) and the mixing layers hold only their mixer, as Megatron-LM's hybrid layer
    patterns do. ``[gla, mlp] * L`` is the same network as ``[gla] * L``, with twice as many places to
    cut it into pipeline stages: a stage may end between a mixer and its MLP.
    """

    GLA = "gla"
    SIMPLE_GLA = "simple_gla"
    GDN = "gdn"
    MAMBA2 = "mamba2"
    MAMBA3 = "mamba3"
    ATTN = "attn"
    MLP = "mlp"

    @property
    def is_recurrent(self) -> bool:
        """Whether the layer hands a recurrent state from chunk to chunk."""
        return self in (LayerKind.GLA, LayerKind.SIMPLE_GLA, LayerKind.GDN, LayerKind.MAMBA2, LayerKind.MAMBA3)

    @property
    def is_mixer(self) -> bool:
        return self is not LayerKind.MLP


class OptimizerKind(str, Enum):
    ADAMW = "adamw"
    SGD = "sgd"


class LearningRateScheduleKind(str, Enum):
    """How the learning rate moves over the run after its linear warm-up (``train.lr_schedule``)."""

    CONSTANT = "constant"
    COSINE = "cosine"  # half a cosine from the optimizer's lr down to min_lr at the last step
    LINEAR = "linear"  # a straight line from the optimizer's lr down to min_lr at the last step


class DataKind(str, Enum):
    SYNTHETIC = "synthetic"
    BYTES = "bytes"  # a byte-level corpus: a file, or the default one when no path is given
    TOKENS = "tokens"  # a flat file of token ids (the nanoGPT / Megatron layout), memory-mapped
    TEXT = "text"  # a text file tokenised once by a Hugging Face tokenizer.json into a cached tokens file


class TokenFileDType(str, Enum):
    """The integer type of each token id in a ``tokens`` data file (little-endian, no header)."""

    UINT16 = "uint16"
    UINT32 = "uint32"


class SequenceParallelMethod(str, Enum):
    """How the ranks of the sequence-parallel group pass recurrent state."""

    ALLSCAN = "allscan"  # ZeCO All-Scan: blocks of state rows pipelined rank to rank
    RING = "ring"  # LASP: the whole state passed rank to rank around a ring
    ALLGATHER = "allgather"  # LASP-2: all-gather of local states, prefix combined locally


class AttentionExchange(str, Enum):
    """How the ranks of the sequence-parallel group exchange an attention layer's key/value slices of a chunk
    (``sequence.attention``; [Note: sequence-parallel attention] in ``schedlang.runtime.attention_parallel``)."""

    ALLGATHER = "allgather"  # LASP-2H: one all-gather of every rank's slice, the gradients reduce-scattered
    RING = "ring"  # slices passed rank to rank around the group, the gradients accumulated around it back


class Recompute(str, Enum):
    """Which parts of a chunk's forward its backward recomputes instead of keeping their activations.

    ``mlp`` and ``mixer`` recompute that part of every layer (its input is kept); ``full`` keeps only the
    chunk's input and initial states and reruns its whole forward in the backward.
    """

    NONE = "none"  # keep every activation
    MLP = "mlp"  # recompute each layer's MLP block (its input is kept)
    MIXER = "mixer"  # recompute each layer's token mixer (gla, simple_gla, gdn, attn; its input is kept)
    FULL = "full"  # recompute a chunk's whole forward inside its backward


StageRecompute = Recompute | tuple[Recompute, ...]
"""``pipeline.recompute``: one mode for every stage, or one per stage in stage order."""


def stage_recompute(value) -> StageRecompute:
    """``value`` as a :data:`StageRecompute`: a mode or its name, a ``True``/``False`` (the flag that scripts
    generated before the modes wrote: full or none), or a sequence of those, one per stage."""
    if isinstance(value, bool):
        return Recompute.FULL if value else Recompute.NONE
    if isinstance(value, (tuple, list)):
        return tuple(Recompute(mode) for mode in value)
    return Recompute(value)


def recompute_on(recompute: StageRecompute, stage: int) -> Recompute:
    """The mode of pipeline stage ``stage``."""
    return recompute[stage] if isinstance(recompute, tuple) else recompute


def recompute_modes(recompute: StageRecompute) -> tuple[Recompute, ...]:
    """The distinct modes of the stages, in the order they first appear."""
    return tuple(dict.fromkeys(recompute)) if isinstance(recompute, tuple) else (recompute,)


def recompute_text(recompute: StageRecompute) -> str:
    """The value as a schedule writes it: ``full`` or ``[full, none]``."""
    if isinstance(recompute, tuple):
        return "[" + ", ".join(mode.value for mode in recompute) + "]"
    return recompute.value


class CudaGraphs(str, Enum):
    """How a stage replays CUDA graphs (``pipeline.cuda_graphs``); true in a condition when it replays any."""

    NONE = "false"  # every kernel launched eagerly
    CHUNK_SLOTS = "true"  # one captured forward and backward per chunk in flight ([Note: graph slots])
    STEP = "step"  # every compute action of the step, captured in order into one pool ([Note: step graphs])

    def __bool__(self) -> bool:
        return self is not CudaGraphs.NONE


class DType(str, Enum):
    """The compute precision (``train.dtype``): the model's parameters as the layers read them, activations,
    the messages and recurrent states between chunks, stages and sequence ranks. With a 16-bit dtype the
    optimizer updates fp32 master weights unless ``train.master_weights = false`` ([Note: master weights] in
    schedlang.runtime.master_weights)."""

    FP32 = "fp32"
    BF16 = "bf16"
    FP16 = "fp16"
    FP64 = "fp64"

    @property
    def is_16_bit(self) -> bool:
        return self in (DType.BF16, DType.FP16)


class OrderKind(str, Enum):
    """``pipeline.order``: how each stage orders its forwards and backwards (lowering/orders.py)."""

    GPIPE = "gpipe"
    ONE_F_ONE_B = "1f1b"
    EXPLICIT = "explicit"


class PartitionKind(str, Enum):
    """``sequence.partition``: where the chunk boundaries fall (lowering/partition.py)."""

    UNIFORM = "uniform"
    BALANCED = "balanced"  # StateFlow Eq. 9-11
    EXPLICIT = "explicit"


class MlpKind(str, Enum):
    """``model.mlp``: the MLP of each mixing layer; ``none`` is a model record's ``mlp_ratio`` of 0."""

    SWIGLU = "swiglu"
    NONE = "none"


class OutputGate(str, Enum):
    """What multiplies a GLA layer's mixed values before the output projection (``model.output_gate``)."""

    NONE = "none"  # the values go to the output projection as they are
    SWISH = "swish"  # RMSNorm per head (weight, eps = norm_eps), times silu(g_proj(x))


class DeltaGates(str, Enum):
    """How a ``gdn`` layer computes its log forget gate ``g`` and write strength ``beta`` from the input ``x``
    (``model.delta_gates``)."""

    LOG_SIGMOID = "log_sigmoid"  # g = logsigmoid(gate_proj(x)) / 16, beta = sigmoid(beta_proj(x)); both with bias
    MAMBA = "mamba"  # g = -exp(A_log) * softplus(gate_proj(x) + dt_bias), beta = sigmoid(beta_proj(x)); no biases
