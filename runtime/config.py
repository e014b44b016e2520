"""The pipeline record a generated training script fills in with literals: stages, chunks, action lists.

The settings a schedule states key by key (the model, the optimizer, the data, ...) are the vocabulary's
records (schedlang.vocabulary.model_settings and train_settings), shared with the checker and the program;
this record holds what the compiler derives for the runtime: the stage layers, the chunk boundaries and each
stage's action list from placement.
"""

from __future__ import annotations

from dataclasses import dataclass

from schedlang.vocabulary import (
    AttentionExchange,
    CudaGraphs,
    Recompute,
    SequenceParallelMethod,
    StageRecompute,
    stage_recompute,
)


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
