"""Cost models for the simulator: how long each task and each message takes.

Two models, selected by :class:`CostModelKind` (formulas in docs/cost-model.md):

* ``UNIT``: the forward of a chunk of ``s`` tokens costs ``s / T`` (``T`` the
  sequence length), its backward ``2 s / T``; messages are free. Durations are
  kept as integer token counts and divided by ``T`` only when the timeline is
  built, so the simulated times are exact and match Eq. 12-15 to the last bit.
* ``FLOPS``: per-layer FLOPs of the stage's layers for the chunk (linear
  recurrence per token, softmax attention by prefix length, dense projections
  and MLP), divided by a device throughput, each backward also paying for adding the
  stage's parameter gradients into ``.grad`` at memory bandwidth, plus an alpha-beta time
  (``alpha + bytes / beta``) for activation messages between stages and for
  state exchange between sequence-parallel ranks, and, with a kernel gap, a
  fixed time per kernel launch (``kernel_launches``). Seconds.

[Note: split backward costs]
With ``pipeline { split_backward = true }`` ([Note: split backward] in
schedlang.lowering.orders) the backward's work is shared between ``B`` and
``W`` and their sum stays what the whole backward cost: ``UNIT`` gives ``B``
and ``W`` ``s / T`` each (the zero-bubble paper's ``T_B = T_W = T_F``);
``FLOPS`` gives ``W`` the weight-gradient GEMMs ``dW = dY^T X`` of the stage's
linear layers (projections, MLP, LM head), whose FLOPs equal their forward
FLOPs, one launch per linear layer and the addition of the linear weights'
gradients into ``.grad``, and leaves ``B`` the rest (the input-gradient GEMMs,
the recurrence or attention core, norms, sequence-parallel exchange, the other
parameters' ``.grad`` additions and the remaining launches).

[Note: recompute costs]
With ``pipeline { recompute = ... }`` a chunk's backward first reruns what its forward did not keep
([Note: recompute modes] in schedlang.runtime.executor): ``FLOPS`` adds to the backward (to ``B`` when split)
the forward seconds of the rerun part: ``mlp`` the MLPs' FLOPs, ``mixer`` the token mixers' FLOPs
(attention pairs included) and their sequence-parallel exchange, ``full`` the chunk's whole forward.
Launch gaps are charged to ``full`` only. ``UNIT`` keeps Eq. 12-15's durations whatever the mode.

A cost model answers in its own time unit; :attr:`CostModel.time_divisor`
turns that unit into the timeline's.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING, Protocol

from schedlang.lowering.program import ScheduleProgram
from schedlang.lowering.operator_tokens import operator_tokens
from schedlang.lowering.parameters import mixer_linear_weights, stage_parameters
from schedlang.vocabulary import (
    AttentionExchange,
    DType,
    LayerKind,
    Mamba2Options,
    Mamba3Options,
    MlpKind,
    ModelConfig,
    Recompute,
    SequenceParallelMethod,
    recompute_on,
)
from schedlang.vocabulary.actions import ActionKind, TaskId
from schedlang.vocabulary.edges import Payload

if TYPE_CHECKING:
    from schedlang.lowering.hardware_profile import HardwareProfile


class CostModelKind(str, Enum):
    UNIT = "unit"
    FLOPS = "flops"  # with a HardwareProfile as the hardware: the profile model (schedlang.lowering.profile_cost)


BACKWARD_TO_FORWARD = 2
"""Backward costs twice the forward: two matrix products per forward one."""
GRADIENT_ACCUMULATION_PASSES = 3
"""Adding a gradient into ``.grad`` reads both and writes the sum: three passes over the parameters."""

DTYPE_BYTES = {DType.FP32: 4, DType.BF16: 2, DType.FP16: 2, DType.FP64: 8}


def compute_bytes(dtype: DType) -> int:
    """Bytes per element of what the runtime keeps in float32 whatever ``train.dtype`` is (recurrent states,
    the kernels' accumulators, norm statistics): float64 for a float64 model."""
    return DTYPE_BYTES[DType.FP64] if dtype is DType.FP64 else DTYPE_BYTES[DType.FP32]


class CostModel(Protocol):
    time_divisor: float

    def task_duration(self, task: TaskId) -> float: ...

    def message_duration(self, kind: Payload, source: TaskId, destination: TaskId) -> float: ...

    def message_bytes(self, kind: Payload, source: TaskId, destination: TaskId) -> int: ...

    def gradient_reduction_duration(self, stage: int) -> float:
        """The step's gradient all-reduce on ``stage`` after its last task (``Trainer.reduce_gradients``)."""
        ...

    def host_bound(self, task: TaskId) -> bool:
        """Whether ``task``'s duration is the host's launch time rather than the device's work (False where the
        model prices no host)."""
        ...


def host_bound_share(program: ScheduleProgram, cost: CostModel) -> float:
    """The share of a step's task seconds, on its busiest stage, that the host's launches bound: a prediction
    whose share is large holds only for the host the profile was calibrated on."""
    kinds = (ActionKind.FORWARD, ActionKind.BACKWARD) + ((ActionKind.WEIGHT,) if program.pipeline.split_backward else ())
    busiest = (0.0, 0.0)
    for stage in range(program.n_stages):
        total = bound = 0.0
        for chunk in range(program.n_chunks):
            for kind in kinds:
                task = TaskId(kind, stage, 0, chunk)
                seconds = cost.task_duration(task)
                total += seconds
                bound += seconds if cost.host_bound(task) else 0.0
        busiest = max(busiest, (total, bound))
    return busiest[1] / busiest[0] if busiest[0] > 0 else 0.0


def reduction_groups(program: ScheduleProgram) -> tuple[int, ...]:
    """The sizes of the groups ``Trainer.reduce_gradients`` all-reduces a stage's flattened gradients over, one
    after the other: its sequence group, then its data group, each when larger than one."""
    return tuple(size for size in (program.mesh.sequence, program.mesh.data) if size > 1)


def ring_allreduce_seconds(ranks: int, n_bytes: float, hardware: Hardware) -> float:
    """Alpha-beta time of a ring all-reduce of ``n_bytes`` among ``ranks``: a reduce-scatter then an all-gather,
    ``2 (P - 1)`` steps each moving ``n_bytes / P``."""
    if ranks <= 1:
        return 0.0
    return 2 * (ranks - 1) * hardware.transfer_time(n_bytes / ranks)


class UnitCostModel:
    """Forward ``s_i`` and backward ``2 s_i`` in tokens; the timeline divides by ``T``.

    With ``split_backward``, ``B`` and ``W`` cost ``s_i`` each ([Note: split backward costs]).
    """

    def __init__(self, chunk_tokens: tuple[int, ...], split_backward: bool = False) -> None:
        self.chunk_tokens = chunk_tokens
        self.split_backward = split_backward
        self.time_divisor = sum(chunk_tokens)

    def task_duration(self, task: TaskId) -> int:
        tokens = self.chunk_tokens[task.chunk]
        if task.kind is ActionKind.BACKWARD:
            return (BACKWARD_TO_FORWARD - 1) * tokens if self.split_backward else BACKWARD_TO_FORWARD * tokens
        return tokens  # a forward, or the weight gradients: one GEMM per forward GEMM

    def message_duration(self, kind: Payload, source: TaskId, destination: TaskId) -> int:
        return 0

    def host_bound(self, task: TaskId) -> bool:
        return False

    def message_bytes(self, kind: Payload, source: TaskId, destination: TaskId) -> int:
        return 0

    def gradient_reduction_duration(self, stage: int) -> int:
        """Zero: the unit model counts tokens of compute, not bytes."""
        return 0


@dataclass(frozen=True)
class Hardware:
    """One device and its links, for the FLOPS model."""

    throughput_flops: float = 400e12  # effective FLOP/s of one device
    latency_s: float = 10e-6  # alpha: per-message latency
    bandwidth_bytes_per_s: float = 50e9  # beta: link bandwidth
    memory_bandwidth_bytes_per_s: float = 3.5e12  # what an elementwise kernel streams from device memory
    kernel_gap_s: float = 0.0  # idle time between two kernels of a task (graph replay on an H200: about 1.2e-6)

    def transfer_time(self, n_bytes: float) -> float:
        return self.latency_s + n_bytes / self.bandwidth_bytes_per_s


def state_scan_seconds(
    method: SequenceParallelMethod, ranks: int, blocks: int, state_bytes: float, hardware: Hardware
) -> float:
    """Alpha-beta time until the last of ``ranks`` sequence-parallel ranks holds its incoming state (one
    direction of one layer's scan, docs/sequence-parallel.md's table): the ring passes the whole state rank
    to rank; All-Scan pipelines ``blocks`` row blocks through the middle ranks and sends one whole message
    into the last rank ([Note: All-Scan messages]); the all-gather is a ring all-gather of every rank's
    state, ``ceil(log2 P)`` latencies deep."""
    if ranks <= 1:
        return 0.0
    if method is SequenceParallelMethod.RING:
        return ring_seconds(ranks, state_bytes, hardware)
    if method is SequenceParallelMethod.ALLGATHER:
        return allgather_seconds(ranks, state_bytes, hardware)
    if ranks == 2:
        return hardware.transfer_time(state_bytes)
    return (ranks - 3 + blocks) * hardware.transfer_time(state_bytes / blocks) + hardware.transfer_time(state_bytes)


def allgather_seconds(ranks: int, bytes_per_rank: float, hardware: Hardware) -> float:
    """Alpha-beta time of an all-gather of ``bytes_per_rank`` from each of ``ranks`` ranks (every rank receives
    the other ``ranks - 1`` contributions, ``ceil(log2 P)`` latencies deep); the reduce-scatter that is its
    adjoint moves the same bytes."""
    if ranks <= 1:
        return 0.0
    return math.ceil(math.log2(ranks)) * hardware.latency_s + (ranks - 1) * bytes_per_rank / hardware.bandwidth_bytes_per_s


def ring_seconds(ranks: int, bytes_per_rank: float, hardware: Hardware) -> float:
    """Alpha-beta time of ``ranks - 1`` steps of a ring, each passing ``bytes_per_rank`` to the next rank (the ring
    state scan; the ring exchange of attention keys and values and, in the backward, of their gradients)."""
    return (ranks - 1) * hardware.transfer_time(bytes_per_rank)


def key_value_exchange_seconds(
    exchange: AttentionExchange, ranks: int, bytes_per_rank: float, hardware: Hardware
) -> float:
    """One attention layer's exchange of a chunk's key/value slices of ``bytes_per_rank`` over ``ranks`` ranks
    ([Note: sequence-parallel attention] in schedlang.runtime.attention_parallel): an all-gather, or a ring of
    ``ranks - 1`` steps. Its backward moves as many bytes (reduce-scatter, or the ring the other way)."""
    if exchange is AttentionExchange.RING:
        return ring_seconds(ranks, bytes_per_rank, hardware)
    return allgather_seconds(ranks, bytes_per_rank, hardware)


def mixer_projection_flops_per_token(kind: LayerKind, d_model: int, heads: int, head_dim: int) -> float:
    """Forward FLOPs per token of the linear layers of a token mixer with the default options (``heads`` heads of
    ``head_dim`` for q, k, v and every gate; no grouped heads, narrow keys or low-rank gates; 0 for ``mlp``):
    also the FLOPs of their weight gradients. docs/cost-model.md's table; :func:`layer_projection_flops_per_token`
    counts a model's own mixer and equals this for such a model."""
    if not kind.is_mixer:
        return 0.0
    width = heads * head_dim
    if kind is LayerKind.MAMBA2:  # in_proj to z, x, B, C (one group of the default state size) and dt; out_proj
        mamba2 = Mamba2Options()
        return 2 * d_model * (2 * width + 2 * mamba2.n_groups * mamba2.state_size + heads) + 2 * width * d_model
    if kind is LayerKind.MAMBA3:  # in_proj to z, x, B, C, dt, A and trap per head, the angles; out_proj
        return 2 * d_model * Mamba3Options().projected_width(heads, head_dim) + 2 * width * d_model
    projections = 4 * 2 * d_model * width  # q, k, v and o
    if kind is LayerKind.GLA:
        projections += 2 * d_model * width  # per-channel forget gate
    elif kind is LayerKind.SIMPLE_GLA:
        projections += 2 * d_model * heads  # one scalar gate per head
    elif kind is LayerKind.GDN:
        projections += 2 * d_model * width + 2 * 2 * d_model * heads  # output gate; alpha and beta per head
    return projections


LINEAR_LAYERS_PER_MIXER = {
    LayerKind.ATTN: 4, LayerKind.GLA: 5, LayerKind.SIMPLE_GLA: 5, LayerKind.GDN: 7, LayerKind.MAMBA2: 2,
    LayerKind.MAMBA3: 2,
}
"""The linear layers of a token mixer (q, k, v, o and its gates; mamba2's and mamba3's in_proj and out_proj, as
schedlang.runtime.model builds them)."""
LINEAR_LAYERS_PER_MLP = 2
"""SwiGLU's fused gate-and-up projection and its down projection."""


def recurrence_flops_per_token(
    kind: LayerKind, heads: int, head_dim: int, kernel_chunk: int, key_dim: int | None = None
) -> float:
    """Forward FLOPs per token of a recurrent layer's chunked recurrence (0 for ``attn`` and ``mlp``), its keys
    ``key_dim`` wide (None: ``head_dim``; mamba2's and mamba3's are their state size)."""
    if not kind.is_recurrent:
        return 0.0
    key_dim = head_dim if key_dim is None else key_dim
    # chunked recurrence: intra-chunk q k^T and (q k^T) v over the kernel chunk, then q S and S += k^T v
    recurrence = heads * (2 * kernel_chunk * (key_dim + head_dim) + 4 * key_dim * head_dim)
    if kind is LayerKind.GDN:
        recurrence += heads * (2 * kernel_chunk * head_dim + 2 * head_dim * head_dim)  # delta-rule WY terms
    return recurrence


def mixer_flops_per_token(kind: LayerKind, d_model: int, heads: int, head_dim: int, kernel_chunk: int) -> float:
    """Forward FLOPs per token of one token-mixing layer of ``heads`` heads of ``head_dim``, without the
    attention pair term (0 for ``mlp``)."""
    projections = mixer_projection_flops_per_token(kind, d_model, heads, head_dim)
    return projections + recurrence_flops_per_token(kind, heads, head_dim, kernel_chunk)


def layer_projection_flops_per_token(model: ModelConfig, kind: LayerKind) -> float:
    """Forward FLOPs per token of the linear layers of a ``kind`` layer's token mixer in ``model``: 2 per weight
    of the mixer the runtime builds (:func:`schedlang.lowering.parameters.mixer_linear_weights`), so every
    option counts (narrow keys, grouped heads, low-rank gates, output gates, an attn layer's own heads). For
    the default options this is :func:`mixer_projection_flops_per_token`."""
    return 2.0 * mixer_linear_weights(model, kind)


def layer_mixer_flops_per_token(model: ModelConfig, kind: LayerKind, kernel_chunk: int) -> float:
    """:func:`mixer_flops_per_token` of a layer of ``kind`` in ``model``, its projections sized by
    :func:`layer_projection_flops_per_token`."""
    return layer_projection_flops_per_token(model, kind) + layer_recurrence_flops_per_token(model, kind, kernel_chunk)


def layer_recurrence_flops_per_token(model: ModelConfig, kind: LayerKind, kernel_chunk: int) -> float:
    """:func:`recurrence_flops_per_token` of a layer of ``kind`` in ``model``, per token its operator runs over
    (with packed documents, per padded token: schedlang.lowering.operator_tokens)."""
    state = model.state_geometry(kind)
    heads = state.heads if state is not None else model.heads  # a recurrent layer's are its state's
    key_dim = state.key_dim if kind in (LayerKind.MAMBA2, LayerKind.MAMBA3) else None
    return recurrence_flops_per_token(kind, heads, model.head_dim, kernel_chunk, key_dim)


def attention_pair_flops(heads: int, head_dim: int) -> float:
    """Forward FLOPs per causal query-key pair of one softmax attention layer of ``heads`` query heads: q k and
    p v (grouped key/value heads change nothing: each query head still meets a key and a value of ``head_dim``)."""
    return 4 * heads * head_dim


def model_attention_pair_flops(model: ModelConfig) -> float:
    """:func:`attention_pair_flops` of the ``attn`` layers of ``model``, by their own query heads."""
    attention = model.attention_geometry
    return attention_pair_flops(attention.heads, attention.head_dim)


def attention_pairs(prefix: int, tokens: int, ranks: int) -> float:
    """Causal query-key pairs of one attention layer for a chunk of ``tokens`` after ``prefix`` earlier keys, on
    the slowest of ``ranks`` sequence-parallel ranks (each holding ``tokens / ranks`` contiguous queries): the
    last, whose queries see the prefix, every earlier rank's slice and their own triangle. With one rank,
    Eq. 9's ``c s + s^2 / 2``; summed over the ranks the pairs are the same, the last rank holds
    ``c s / S + k s^2 / S`` of them (:func:`last_rank_square_share`)."""
    queries = tokens / ranks
    return (prefix + (ranks - 1) * queries) * queries + queries * queries / 2


def last_rank_square_share(ranks: int) -> float:
    """``k`` in the last rank's ``(c s + k s^2) / S`` pairs (:func:`attention_pairs`): ``(2 S - 1) / (2 S)``."""
    return (2 * ranks - 1) / (2 * ranks)


def mlp_flops_per_token(model: ModelConfig) -> float:
    if model.mlp_kind is MlpKind.NONE:
        return 0.0
    width = model.options.mlp_width
    hidden = model.mlp_ratio * model.d_model if width is None else width
    return 3 * 2 * model.d_model * hidden  # SwiGLU: gate, up and down projections


KERNELS_PER_MIXER_FORWARD = 18
KERNELS_PER_MLP_FORWARD = 5
KERNELS_PER_STAGE_END_FORWARD = 5
"""Kernel launches of one chunk's forward (a backward launches about twice as many), counted from a GPU trace of
the runtime's GLA blocks (docs/benchmarks.md, "Measurements behind the runtime"): a mixer's norm, projections,
gate activation, recurrence kernels and residual add; an MLP's norm, two GEMMs, activation and residual add; the
embedding, or the final norm, head and loss."""


def layer_kind_counts(model: ModelConfig, layers: tuple[int, ...]) -> Counter:
    """How many of ``layers`` are of each kind: per-layer sums go over kinds, since ``model.has_mlp`` reads the
    whole model and calling it once per layer made the cost model quadratic in the layer count."""
    return Counter(model.layers[layer] for layer in layers)


def kernel_launches(model: ModelConfig, layers: tuple[int, ...], is_first: bool, is_last: bool) -> int:
    """Kernels one chunk's forward launches on a stage holding ``layers``."""
    count = sum(
        n_layers
        * (
            (KERNELS_PER_MIXER_FORWARD if kind.is_mixer else 0)
            + (KERNELS_PER_MLP_FORWARD if model.has_mlp(kind) else 0)
        )
        for kind, n_layers in layer_kind_counts(model, layers).items()
    )
    return count + KERNELS_PER_STAGE_END_FORWARD * (is_first + is_last)


def head_flops_per_token(model: ModelConfig) -> float:
    """The language-model head's projection to the vocabulary."""
    return 2 * model.d_model * model.vocab


def model_training_flops_per_token(model: ModelConfig, length: int, kernel_chunk: int) -> float:
    """Model FLOPs of one training step per token of a ``length``-token sequence, recomputation not counted (the
    figure a step's model-FLOP rate divides by): three times the forward's, the backward's input- and
    weight-gradient products each costing what the forward's do; the forward is every layer's token mixer
    (projections and recurrence), its MLP, the causal attention pairs of the whole sequence (``(length + 1) / 2``
    a token for each ``attn`` layer) and the head."""
    forward = head_flops_per_token(model)
    for kind, n_layers in layer_kind_counts(model, tuple(range(len(model.layers)))).items():
        mlp = mlp_flops_per_token(model) if model.has_mlp(kind) else 0.0
        forward += n_layers * (layer_mixer_flops_per_token(model, kind, kernel_chunk) + mlp)
        if kind is LayerKind.ATTN:
            forward += n_layers * model_attention_pair_flops(model) * (length + 1) / 2
    return 3 * forward


def linear_layers(model: ModelConfig, layers: tuple[int, ...], is_last: bool) -> int:
    """Linear layers on a stage holding ``layers``: one weight-gradient GEMM each, what a ``W`` task launches."""
    count = sum(
        n_layers * (LINEAR_LAYERS_PER_MIXER.get(kind, 0) + (LINEAR_LAYERS_PER_MLP if model.has_mlp(kind) else 0))
        for kind, n_layers in layer_kind_counts(model, layers).items()
    )
    return count + is_last  # the LM head


@dataclass(frozen=True)
class ChunkForwardSeconds:
    """One chunk's forward on one stage, split into the parts a backward may rerun ([Note: recompute costs])."""

    mixers: float  # the token mixers' FLOPs, attention pairs included
    mlps: float  # the MLPs' FLOPs
    rest: float  # the LM head's FLOPs and the kernel launch gaps
    sequence_parallel: float  # state scans and K/V all-gathers between the sequence ranks

    @property
    def total(self) -> float:
        return self.mixers + self.mlps + self.rest + self.sequence_parallel

    def recomputed(self, mode: Recompute) -> float:
        """The seconds a backward under ``mode`` spends rerunning this forward's parts."""
        return sum(getattr(self, part) for part in rerun_parts(mode))


def rerun_parts(mode: Recompute) -> tuple[str, ...]:
    """The :class:`ChunkForwardSeconds` fields a backward under ``mode`` reruns: ``full`` the chunk's whole
    forward, ``mixer`` the token mixers with their sequence-parallel exchanges, ``mlp`` the MLPs."""
    return _RERUN_PARTS.get(mode, ())


_RERUN_PARTS = {
    Recompute.FULL: ("mixers", "mlps", "rest", "sequence_parallel"),
    Recompute.MIXER: ("mixers", "sequence_parallel"),
    Recompute.MLP: ("mlps",),
}


class FlopsCostModel:
    """Layer FLOPs over device throughput plus alpha-beta messages; see docs/cost-model.md.

    ``forward_seconds[r][i]`` is a forward; a whole backward is twice that plus ``accumulation_seconds[r]``.
    With a split backward, ``W`` is ``weight_seconds[r][i] + weight_accumulation_seconds[r]`` and ``B`` the
    rest ([Note: split backward costs]).
    """

    time_divisor = 1.0

    def __init__(self, program: ScheduleProgram, hardware: Hardware = Hardware()) -> None:
        self.program = program
        self.hardware = hardware
        self.split_backward = program.pipeline.split_backward
        model = program.model
        self.element_bytes = DTYPE_BYTES[program.train.dtype]
        self.batch = program.pipeline.microbatch_size
        self.sequence_ranks = program.mesh.sequence
        # every recurrent kind's state by the runtime's rule (ModelConfig.state_geometry), float32 elements
        self.state_geometries = {kind: model.state_geometry(kind) for kind in set(model.layers) if kind.is_recurrent}
        self.state_element_bytes = compute_bytes(program.train.dtype)
        self.stage_kinds = [layer_kind_counts(model, layers) for layers in program.stage_layers]
        self.recurrent_layers = [
            sum(n_layers for kind, n_layers in kinds.items() if kind.is_recurrent) for kinds in self.stage_kinds
        ]
        self.stage_launches = [
            kernel_launches(model, layers, stage == 0, stage == program.n_stages - 1)
            for stage, layers in enumerate(program.stage_layers)
        ]
        self.stage_linear_layers = [
            linear_layers(model, layers, stage == program.n_stages - 1)
            for stage, layers in enumerate(program.stage_layers)
        ]
        self.forward_parts = [
            [self._stage_chunk_parts(stage, chunk) for chunk in range(program.n_chunks)]
            for stage in range(program.n_stages)
        ]
        self.forward_seconds = [[parts.total for parts in stage_parts] for stage_parts in self.forward_parts]
        self.weight_seconds = [
            [self._stage_chunk_weight_seconds(stage, chunk) for chunk in range(program.n_chunks)]
            for stage in range(program.n_stages)
        ]
        self.accumulation_seconds = [self._gradient_accumulation_seconds(stage) for stage in range(program.n_stages)]
        self.weight_accumulation_seconds = [
            self._linear_accumulation_seconds(stage) for stage in range(program.n_stages)
        ]

    def _accumulation_seconds(self, parameters: int) -> float:
        """One elementwise pass adding ``parameters`` gradients into ``.grad``: read both, write the sum."""
        return GRADIENT_ACCUMULATION_PASSES * parameters * self.element_bytes / self.hardware.memory_bandwidth_bytes_per_s

    def _gradient_accumulation_seconds(self, stage: int) -> float:
        """What every backward of ``stage`` pays to add its parameter gradients into ``.grad``: one elementwise
        pass reading both and writing the sum. CUDA-graph stages add the linear layers' weight gradients inside
        their GEMMs ([Note: in-place weight gradients] in schedlang.runtime.linear), so only the rest remain."""
        count = stage_parameters(self.program, stage)
        return self._accumulation_seconds(count.other if self.program.pipeline.cuda_graphs else count.total)

    def _linear_accumulation_seconds(self, stage: int) -> float:
        """The part of :meth:`_gradient_accumulation_seconds` that adds the linear layers' weight gradients."""
        if self.program.pipeline.cuda_graphs:
            return 0.0
        return self._accumulation_seconds(stage_parameters(self.program, stage).linear_weights)

    def _stage_chunk_weight_seconds(self, stage: int, chunk: int) -> float:
        """The weight-gradient GEMMs of the stage's linear layers for the chunk: their forward FLOPs (one
        ``dY^T X`` per ``X W``) and one launch each; without ``.grad`` additions, which are separate."""
        program, model, hardware = self.program, self.program.model, self.hardware
        tokens = program.sequence.chunk_length(chunk)
        is_last = stage == program.n_stages - 1
        per_token = 0.0
        for kind, n_layers in self.stage_kinds[stage].items():
            per_token += n_layers * layer_projection_flops_per_token(model, kind)
            per_token += n_layers * mlp_flops_per_token(model) if model.has_mlp(kind) else 0.0
        if is_last:
            per_token += head_flops_per_token(model)
        seconds = self.batch * per_token * tokens / self.sequence_ranks / hardware.throughput_flops
        return seconds + self.stage_linear_layers[stage] * hardware.kernel_gap_s

    def _stage_chunk_parts(self, stage: int, chunk: int) -> ChunkForwardSeconds:
        program, model, hardware = self.program, self.program.model, self.hardware
        tokens = program.sequence.chunk_length(chunk)
        prefix = program.sequence.boundaries[chunk]
        kernel_chunk = min(program.sequence.kernel_chunk, tokens)
        mixer_per_token = mlp_per_token = head_per_token = recurrence_per_token = 0.0
        pairs_flops = 0.0
        attention_layers = 0
        for kind, n_layers in self.stage_kinds[stage].items():
            mixer_per_token += n_layers * layer_mixer_flops_per_token(model, kind, kernel_chunk)
            recurrence_per_token += n_layers * layer_recurrence_flops_per_token(model, kind, kernel_chunk)
            mlp_per_token += n_layers * mlp_flops_per_token(model) if model.has_mlp(kind) else 0.0
            if kind is LayerKind.ATTN:
                attention_layers += n_layers
                pairs = attention_pairs(prefix, tokens, self.sequence_ranks)
                pairs_flops += n_layers * model_attention_pair_flops(model) * pairs
        if stage == program.n_stages - 1:
            head_per_token = head_flops_per_token(model)
        # the chunk takes as long as its slowest sequence-parallel rank, whose attention pairs these are
        local_tokens = self.batch * tokens / self.sequence_ranks
        # packed documents: the recurrent operators also run over their padded rows' pads and reset tokens
        padding = self.batch * (operator_tokens(program, chunk) - tokens) / self.sequence_ranks
        mixer_flops = local_tokens * mixer_per_token + padding * recurrence_per_token + self.batch * pairs_flops
        return ChunkForwardSeconds(
            mixers=mixer_flops / hardware.throughput_flops,
            mlps=local_tokens * mlp_per_token / hardware.throughput_flops,
            rest=local_tokens * head_per_token / hardware.throughput_flops
            + self.stage_launches[stage] * hardware.kernel_gap_s,
            sequence_parallel=self._sequence_parallel_seconds(stage, tokens, attention_layers),
        )

    def _sequence_parallel_seconds(self, stage: int, tokens: int, attention_layers: int) -> float:
        """State exchange between the sequence-parallel ranks of one chunk, and each attention layer's exchange
        of the chunk's keys and values (:func:`key_value_exchange_seconds`), as wide as the K/V buffers
        (``buffered_key_value_width`` of ``model.attention_geometry``)."""
        ranks = self.sequence_ranks
        if ranks == 1:
            return 0.0
        model, hardware = self.program.model, self.hardware
        sequence = self.program.sequence
        scans = sum(
            n_layers
            * state_scan_seconds(sequence.parallel, ranks, sequence.scan_blocks, self.scan_bytes(kind), hardware)
            for kind, n_layers in self.stage_kinds[stage].items()
            if kind.is_recurrent
        )
        key_value_width = model.attention_geometry.buffered_key_value_width
        key_value_bytes = 2 * self.batch * -(-tokens // ranks) * key_value_width * self.element_bytes
        attention = attention_layers * key_value_exchange_seconds(sequence.attention, ranks, key_value_bytes, hardware)
        return scans + attention

    def scan_bytes(self, kind: LayerKind) -> float:
        """What one layer's cross-rank scan moves per rank: the state matrix; the all-gather also gathers each
        rank's transition (a decay, or for gdn a ``[K, K]`` matrix per head: [Note: transitions] in
        schedlang.runtime.scan_common). The point-to-point methods pass carries only."""
        geometry = self.state_geometries[kind]
        elements = geometry.matrix_elements
        if self.program.sequence.parallel is SequenceParallelMethod.ALLGATHER:
            elements += geometry.transition_elements
        return self.batch * elements * self.state_element_bytes

    def host_bound(self, task: TaskId) -> bool:
        return False  # FLOPs over a rate, launch gaps added: no host time to bound a task

    def task_duration(self, task: TaskId) -> float:
        stage, chunk = task.stage, task.chunk
        seconds = self.forward_seconds[stage][chunk]
        if task.kind is ActionKind.FORWARD:
            return seconds
        if task.kind is ActionKind.WEIGHT:
            return self.weight_seconds[stage][chunk] + self.weight_accumulation_seconds[stage]
        backward = BACKWARD_TO_FORWARD * seconds + self.accumulation_seconds[stage]
        backward += self.forward_parts[stage][chunk].recomputed(recompute_on(self.program.pipeline.recompute, stage))
        if self.split_backward:
            backward -= self.weight_seconds[stage][chunk] + self.weight_accumulation_seconds[stage]
        return backward

    def message_bytes(self, kind: Payload, source: TaskId, destination: TaskId) -> int:
        if kind in (Payload.ACTIVATION, Payload.ACTIVATION_GRADIENT):
            tokens = self.program.sequence.chunk_length(source.chunk)
            return self.batch * tokens // self.sequence_ranks * self.program.model.d_model * self.element_bytes
        return sum(
            n_layers * self.batch * self.state_geometries[kind].elements * self.state_element_bytes
            for kind, n_layers in self.stage_kinds[source.stage].items()
            if kind.is_recurrent
        )

    def message_duration(self, kind: Payload, source: TaskId, destination: TaskId) -> float:
        if source.stage == destination.stage:
            return 0.0  # the state stays on the device
        return self.hardware.transfer_time(self.message_bytes(kind, source, destination))

    def gradient_reduction_duration(self, stage: int) -> float:
        """A ring all-reduce of the stage's flattened gradients over each of :func:`reduction_groups` in turn,
        every one on the one link."""
        from schedlang.lowering.memory_terms import reduced_gradient_bytes  # memory_terms imports this module

        n_bytes = reduced_gradient_bytes(self.program, stage)
        return sum(ring_allreduce_seconds(ranks, n_bytes, self.hardware) for ranks in reduction_groups(self.program))


def make_cost_model(
    kind: CostModelKind,
    program: ScheduleProgram,
    hardware: Hardware | HardwareProfile = Hardware(),
) -> CostModel:
    """The cost model ``kind`` names. ``FLOPS`` with a
    :class:`~schedlang.lowering.hardware_profile.HardwareProfile` as ``hardware`` is the profile model
    (:mod:`schedlang.lowering.profile_cost`): measured curves in place of FLOPs over one throughput. ``UNIT``
    ignores the hardware."""
    from schedlang.lowering.hardware_profile import HardwareProfile

    if kind is CostModelKind.FLOPS and isinstance(hardware, HardwareProfile):
        from schedlang.lowering.profile_cost import ProfileCostModel

        return ProfileCostModel(program, hardware)
    if kind is CostModelKind.UNIT:
        return UnitCostModel(
            tuple(program.sequence.chunk_length(chunk) for chunk in range(program.n_chunks)),
            program.pipeline.split_backward,
        )
    if kind is CostModelKind.FLOPS:
        return FlopsCostModel(program, hardware)
    raise ValueError(f"unknown cost model {kind!r}")
