"""The space ``schedlang tune`` searches: what a schedule's keys can say, as :class:`Layout` and :class:`Knobs`.

A candidate is a layout (what fixes the task graph and each task's work: the mesh, the stage split, the
microbatches at the schedule's global batch, the chunk count and partition, the sequence-parallel method) and
knobs (what places the tasks and trades memory for time on that graph: the 1F1B warm-up, split backward and
the placement of ``W``, CUDA graphs, offload and each stage's recompute mode). :func:`schedule_changes` turns
one into the keys :func:`schedlang.compiler.revise` writes into the file, only those whose value differs from
the file's, so every candidate is checked as the file would be had it been written that way.

The space (docs/pipeline-tuning.md, "tune"):

* mesh: the file's; with ``--world W`` every ``pipeline x sequence x data = W`` with at most one stage per
  layer and ``data`` dividing the global batch (sequences per step, ``microbatches x microbatch_size x data``
  of the file, held fixed so that every candidate trains on the same tokens per step);
* stage split, for each pipeline size: the file's (for its own size), the equal split (when the layers divide),
  and the split whose stages are closest to equal forward FLOPs (the LM head counted on the last stage);
* microbatches ``M`` and ``microbatch_size`` ``b`` with ``M b`` the global batch over ``data``;
* chunks: ``1, 2, 4, ...`` up to ``--max-chunks`` and the sequence's alignment units, and the file's count;
  the partition: the file's, and with attention layers ``uniform`` and ``balanced(alpha)`` for
  :data:`ALPHAS`; explicit boundaries are kept as written;
* sequence parallelism (``sequence > 1``): ``allscan(blocks = k)`` for :data:`SCAN_BLOCKS` dividing
  ``head_dim``, ``ring`` and ``allgather``; with attention layers, ``attention = allgather`` or ``ring``;
* knobs: with ``order = 1f1b`` ``extra_warmup`` in :data:`EXTRA_WARMUPS` (and the file's), ``split_backward``,
  and with it ``forward_before_weight`` and ``extra_deferred_weights`` in :data:`EXTRA_DEFERRED`; with
  ``gpipe`` ``split_backward``; ``cuda_graphs`` ``false``, ``true``, ``step`` (``--device cuda``, where the
  runtime can replay them); ``offload``; ``recompute`` per stage, each of ``none``, ``mlp``, ``mixer``,
  ``full``. An explicit order fixes its tasks: only the knobs that keep them (recompute, offload, graphs).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from schedlang.lowering.cost import (
    head_flops_per_token,
    layer_mixer_flops_per_token,
    mlp_flops_per_token,
    model_attention_pair_flops,
)
from schedlang.lowering.program import ScheduleProgram
from schedlang.vocabulary import (
    AttentionExchange,
    CudaGraphs,
    LayerKind,
    OrderKind,
    PartitionKind,
    Recompute,
    SequenceParallelMethod,
    recompute_on,
)

ALPHAS = (0.5, 1.0)
"""StateFlow's blend of equal and FLOP-balanced chunks tried besides ``uniform`` for models with attention
(Eq. 11; its Fig. 5 finds the best alpha between them)."""
SCAN_BLOCKS = (1, 2, 4, 8)
EXTRA_WARMUPS = (0, 1, 2)
EXTRA_DEFERRED = (0, 1, 2)
RECOMPUTE_MODES = (Recompute.NONE, Recompute.MLP, Recompute.MIXER, Recompute.FULL)


@dataclass(frozen=True, order=True)
class Layout:
    """What fixes a candidate's task graph and the work of each task."""

    pipeline: int
    sequence: int
    data: int
    stages: tuple[tuple[int, ...], ...]
    microbatches: int
    microbatch_size: int
    length: int
    chunks: int | None  # None: the file's explicit boundaries
    partition: str  # schedule text: "uniform", "balanced(alpha = 0.5)", or "" for the file's
    parallel: str  # "allscan(blocks = 4)", "ring", "allgather", or "" for the file's
    attention: str  # "allgather", "ring", or "" for the file's


@dataclass(frozen=True, order=True)
class Knobs:
    """What places the tasks of a layout and trades memory for time."""

    extra_warmup: int | tuple[int, ...] = 0
    split_backward: bool = False
    forward_before_weight: bool = False
    extra_deferred_weights: int = 0
    cuda_graphs: CudaGraphs = CudaGraphs.NONE
    offload: bool = False
    recompute: tuple[Recompute, ...] = ()  # one per stage; () while the modes are still to be chosen


def equal_split(n_layers: int, n_stages: int) -> tuple[tuple[int, ...], ...]:
    """Contiguous runs of equal length, the checker's default stage assignment."""
    per_stage = n_layers // n_stages
    return tuple(tuple(range(stage * per_stage, (stage + 1) * per_stage)) for stage in range(n_stages))


def layer_weights(program: ScheduleProgram, length: int) -> list[float]:
    """Forward FLOPs per token of each layer (attention at the sequence's mean prefix) for balancing stages."""
    model = program.model
    kernel_chunk = program.sequence.kernel_chunk
    weights = []
    for kind in model.layers:
        weight = layer_mixer_flops_per_token(model, kind, kernel_chunk) if kind.is_mixer else 0.0
        if kind is LayerKind.ATTN:
            weight += model_attention_pair_flops(model) * length / 2
        weights.append(weight + (mlp_flops_per_token(model) if model.has_mlp(kind) else 0.0))
    return weights


def balanced_split(weights: list[float], head: float, n_stages: int) -> tuple[tuple[int, ...], ...]:
    """Contiguous stages whose boundaries fall where the running FLOPs (the head on the last stage) come nearest
    to equal shares, every stage keeping at least one layer."""
    n_layers = len(weights)
    total = sum(weights) + head
    ends = []
    for stage in range(1, n_stages):
        target = total * stage / n_stages
        lowest = (ends[-1] if ends else 0) + 1
        highest = n_layers - (n_stages - stage)
        end = lowest
        running = sum(weights[:end])
        while end < highest and abs(running + weights[end] - target) <= abs(running - target):
            running += weights[end]
            end += 1
        ends.append(end)
    bounds = [0, *ends, n_layers]
    return tuple(tuple(range(bounds[stage], bounds[stage + 1])) for stage in range(n_stages))


def stage_splits(program: ScheduleProgram, n_stages: int, length: int) -> list[tuple[tuple[int, ...], ...]]:
    """The stage splits tried for ``n_stages`` stages (the module docstring), without repeats."""
    n_layers = len(program.model.layers)
    splits = []
    if n_stages == program.n_stages:
        splits.append(program.stage_layers)
    if n_layers % n_stages == 0:
        splits.append(equal_split(n_layers, n_stages))
    splits.append(balanced_split(layer_weights(program, length), head_flops_per_token(program.model), n_stages))
    return list(dict.fromkeys(splits))


def divisors(number: int) -> list[int]:
    return [divisor for divisor in range(1, number + 1) if number % divisor == 0]


def meshes(program: ScheduleProgram, world: int | None) -> list[tuple[int, int, int]]:
    """(pipeline, sequence, data) triples tried: the file's, or every factorisation of ``world``."""
    mesh = program.mesh
    if world is None or program.pipeline.order is OrderKind.EXPLICIT:
        return [(mesh.pipeline, mesh.sequence, mesh.data)]
    batch = global_batch(program)
    return [
        (pipeline, sequence, world // (pipeline * sequence))
        for pipeline in divisors(world)
        if pipeline <= len(program.model.layers)
        for sequence in divisors(world // pipeline)
        if batch % (world // (pipeline * sequence)) == 0
    ]


def global_batch(program: ScheduleProgram) -> int:
    """Sequences per step: microbatches x microbatch_size x data."""
    return program.n_microbatches * program.pipeline.microbatch_size * program.mesh.data


def chunk_counts(program: ScheduleProgram, length: int, sequence_ranks: int, max_chunks: int) -> list[int | None]:
    """Chunk counts tried: powers of two up to ``max_chunks`` and the sequence's alignment units, and the
    file's count; ``[None]`` (the file's boundaries) for an explicit partition or order."""
    if program.sequence.partition is PartitionKind.EXPLICIT or program.pipeline.order is OrderKind.EXPLICIT:
        return [None]
    units = -(-length // (program.sequence.kernel_chunk * sequence_ranks))
    counts = [2**power for power in range(int(math.log2(max(1, min(units, max_chunks)))) + 1)]
    if program.n_chunks <= units and program.n_chunks not in counts:
        counts.append(program.n_chunks)
    return sorted(counts)


def partitions(program: ScheduleProgram) -> list[str]:
    if program.sequence.partition is PartitionKind.EXPLICIT or LayerKind.ATTN not in program.model.layers:
        return [""]
    return ["uniform", *(f"balanced(alpha = {alpha})" for alpha in ALPHAS)]


def parallel_methods(program: ScheduleProgram, sequence_ranks: int) -> list[str]:
    if sequence_ranks == 1:
        return [""]
    blocks = [f"allscan(blocks = {count})" for count in SCAN_BLOCKS if program.model.head_dim % count == 0]
    return [*blocks, SequenceParallelMethod.RING.value, SequenceParallelMethod.ALLGATHER.value]


def attention_exchanges(program: ScheduleProgram, sequence_ranks: int) -> list[str]:
    if sequence_ranks == 1 or LayerKind.ATTN not in program.model.layers:
        return [""]
    return [exchange.value for exchange in AttentionExchange]


def layouts(program: ScheduleProgram, length: int, world: int | None, max_chunks: int) -> list[Layout]:
    """Every layout of the space at sequence length ``length``, in a fixed order."""
    batch = global_batch(program)
    fixed_order = program.pipeline.order is OrderKind.EXPLICIT
    found = []
    for pipeline, sequence, data in meshes(program, world):
        per_replica = batch // data
        batchings = [(program.n_microbatches, program.pipeline.microbatch_size)] if fixed_order else [
            (per_replica // size, size) for size in divisors(per_replica)
        ]
        for stages in stage_splits(program, pipeline, length):
            for microbatches, microbatch_size in batchings:
                for chunks in chunk_counts(program, length, sequence, max_chunks):
                    for partition in partitions(program) if chunks is not None else [""]:
                        for parallel in parallel_methods(program, sequence):
                            for attention in attention_exchanges(program, sequence):
                                found.append(
                                    Layout(
                                        pipeline, sequence, data, stages, microbatches, microbatch_size, length,
                                        chunks, partition, parallel, attention,
                                    )
                                )
    return sorted(set(found))


def order_knobs(program: ScheduleProgram, layout: Layout) -> list[Knobs]:
    """The task placements tried for a layout (recompute, offload and graphs left at their fastest)."""
    pipeline = program.pipeline
    if pipeline.order is OrderKind.EXPLICIT:
        return [Knobs(pipeline.extra_warmup, pipeline.split_backward, pipeline.forward_before_weight,
                      pipeline.extra_deferred_weights)]
    if pipeline.order is OrderKind.GPIPE:
        return [Knobs(split_backward=split) for split in (False, True)]
    warmups = list(EXTRA_WARMUPS)
    if pipeline.extra_warmup not in warmups and layout.pipeline == program.n_stages:
        warmups.append(pipeline.extra_warmup)  # a per-stage list written for this pipeline size
    knobs = []
    for extra in warmups:
        knobs.append(Knobs(extra))
        for forward_first in (False, True):
            for deferred in EXTRA_DEFERRED:
                knobs.append(Knobs(extra, True, forward_first, deferred))
    return knobs


def graph_choices(program: ScheduleProgram, layout: Layout, device: str) -> list[CudaGraphs]:
    """CUDA-graph modes the runtime could replay for this layout (the capabilities list decides the rest)."""
    if device != "cuda" or layout.sequence > 1 or LayerKind.ATTN in program.model.layers:
        return [CudaGraphs.NONE]
    if program.train.data.document_end is not None:
        return [CudaGraphs.NONE]
    return list(CudaGraphs)


def file_knobs(program: ScheduleProgram) -> Knobs:
    pipeline = program.pipeline
    return Knobs(
        pipeline.extra_warmup, pipeline.split_backward, pipeline.forward_before_weight,
        pipeline.extra_deferred_weights, pipeline.cuda_graphs, pipeline.offload,
        tuple(recompute_on(pipeline.recompute, stage) for stage in range(program.n_stages)),
    )


def recompute_value(modes: tuple[Recompute, ...]):
    """``pipeline.recompute`` as written: one mode when every stage has it, else the list."""
    return modes[0] if len(set(modes)) == 1 else list(modes)


def _parallel_text(program: ScheduleProgram) -> str:
    sequence = program.sequence
    if sequence.parallel is SequenceParallelMethod.ALLSCAN:
        return f"allscan(blocks = {sequence.scan_blocks})"
    return sequence.parallel.value


def _partition_text(program: ScheduleProgram) -> str:
    sequence = program.sequence
    if sequence.partition is PartitionKind.BALANCED:
        return f"balanced(alpha = {sequence.balance_alpha})"
    return sequence.partition.value


def schedule_changes(program: ScheduleProgram, layout: Layout, knobs: Knobs) -> dict:
    """The ``block.key`` values of a candidate that differ from ``program``'s, for :func:`revise`."""
    mesh, sequence, pipeline = program.mesh, program.sequence, program.pipeline
    changes: dict = {}

    def differs(name: str, old, new) -> None:
        if old != new:
            changes[name] = new

    differs("mesh.pipeline", mesh.pipeline, layout.pipeline)
    differs("mesh.sequence", mesh.sequence, layout.sequence)
    differs("mesh.data", mesh.data, layout.data)
    default_split = len(program.model.layers) % layout.pipeline == 0 and layout.stages == equal_split(
        len(program.model.layers), layout.pipeline
    )
    if layout.stages != program.stage_layers and not (default_split and "model.stages" not in program.spans):
        changes["model.stages"] = [list(stage) for stage in layout.stages]
    differs("pipeline.microbatches", program.n_microbatches, layout.microbatches)
    differs("pipeline.microbatch_size", pipeline.microbatch_size, layout.microbatch_size)
    differs("sequence.length", sequence.length, layout.length)
    if layout.chunks is not None:
        differs("sequence.chunks", program.n_chunks, layout.chunks)
    if layout.partition:
        differs("sequence.partition", _partition_text(program), layout.partition)
    if layout.parallel:
        differs("sequence.parallel", _parallel_text(program), layout.parallel)
    if layout.attention:
        differs("sequence.attention", sequence.attention.value, layout.attention)
    if pipeline.order is not OrderKind.EXPLICIT:
        differs("pipeline.extra_warmup", pipeline.extra_warmup, knobs.extra_warmup)
        differs("pipeline.split_backward", pipeline.split_backward, knobs.split_backward)
        differs("pipeline.forward_before_weight", pipeline.forward_before_weight, knobs.forward_before_weight)
        differs("pipeline.extra_deferred_weights", pipeline.extra_deferred_weights, knobs.extra_deferred_weights)
    differs("pipeline.cuda_graphs", pipeline.cuda_graphs, knobs.cuda_graphs)
    differs("pipeline.offload", pipeline.offload, knobs.offload)
    if knobs.recompute:
        old = tuple(recompute_on(pipeline.recompute, stage) for stage in range(program.n_stages))
        one_mode_kept = not isinstance(pipeline.recompute, tuple) and set(knobs.recompute) == {pipeline.recompute}
        if old != knobs.recompute and not one_mode_kept:
            changes["pipeline.recompute"] = recompute_value(knobs.recompute)
    return changes
