"""What the runtime can run: one list, consulted by the checker and by the runtime.

Each :class:`Capability` row is a condition on a :class:`RunRequest` under which the runtime refuses to
run, the reason it gives, and the schedule key the refusal concerns. The front end's checker turns every
refusal of a schedule into a diagnostic at that key (all of them in one run), so ``check``, ``simulate``,
``viz`` and ``compile`` agree on what is runnable; the runtime raises :class:`UnsupportedRunError` with
the same reasons when it is handed a configuration the rows refuse. A new runtime limit (or a lifted
one) is a row added (or removed) here, and nowhere else.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from schedlang.vocabulary.kinds import (
    CudaGraphs,
    LayerKind,
    Recompute,
    StageRecompute,
    recompute_modes,
    recompute_text,
    stage_recompute,
)
from schedlang.vocabulary.model_settings import ModelConfig


@dataclass(frozen=True)
class RunRequest:
    """The features of a schedule that the rows read, in the terms both the program and the runtime's
    configuration records can state."""

    layers: tuple[LayerKind, ...]
    sequence_parallel: int  # ranks of the sequence-parallel group (mesh.sequence)
    chunk_lengths: tuple[int, ...]
    recompute: StageRecompute
    cuda_graphs: CudaGraphs
    offload: bool = False  # saved activations kept in pinned host memory (pipeline.offload)

    def __post_init__(self) -> None:
        object.__setattr__(self, "recompute", stage_recompute(self.recompute))


class RunShape(Protocol):
    """What :func:`run_request` reads of a run beside its layers: the runtime's ``PipelineConfig`` and the
    compiler's ``ScheduleProgram`` both state it under these names."""

    @property
    def sequence_parallel(self) -> int: ...

    @property
    def chunk_lengths(self) -> tuple[int, ...]: ...

    @property
    def recompute(self) -> StageRecompute: ...

    @property
    def offload(self) -> bool: ...

    @property
    def cuda_graphs(self) -> CudaGraphs: ...


def run_request(model: ModelConfig, run: RunShape) -> RunRequest:
    """What a run of ``model`` asks the runtime to run, for the rows below: the one adapter
    that the checker (from the program) and the runtime (from its pipeline record) both call."""
    return RunRequest(
        layers=model.layers,
        sequence_parallel=run.sequence_parallel,
        chunk_lengths=tuple(run.chunk_lengths),
        recompute=run.recompute,
        offload=run.offload,
        cuda_graphs=run.cuda_graphs,
    )


@dataclass(frozen=True)
class Capability:
    """A refusal: when ``refuses(request)`` holds, the runtime cannot run it, for ``reason(request)``.

    ``keys`` are the schedule keys the refusal concerns, most specific first; a diagnostic points at the
    first one the schedule file writes.
    """

    keys: tuple[str, ...]
    refuses: Callable[[RunRequest], bool]
    reason: Callable[[RunRequest], str]


@dataclass(frozen=True)
class Refusal:
    keys: tuple[str, ...]
    message: str


def graph_recompute_modes(graphs: CudaGraphs) -> tuple[Recompute, ...]:
    """The recompute modes a stage may run under ``graphs``: every mode eagerly; under step graphs ``none`` and
    ``full`` ([Note: recompute under step graphs] in schedlang.runtime.executor); in per-chunk slots ``none``."""
    if graphs is CudaGraphs.NONE:
        return tuple(Recompute)
    if graphs is CudaGraphs.STEP:
        return (Recompute.NONE, Recompute.FULL)
    return (Recompute.NONE,)


def _graphs(request: RunRequest) -> str:
    return f"pipeline.cuda_graphs = {request.cuda_graphs.value} replays captured graphs; this schedule has "


def _distinct_lengths(request: RunRequest) -> list[int]:
    return sorted(set(request.chunk_lengths))


CAPABILITIES: tuple[Capability, ...] = (
    Capability(
        ("sequence.chunks", "pipeline.cuda_graphs"),
        lambda request: request.cuda_graphs is CudaGraphs.CHUNK_SLOTS and len(_distinct_lengths(request)) > 1,
        lambda request: "pipeline.cuda_graphs = true replays one captured graph per chunk shape; this schedule has "
        f"chunks of different lengths {_distinct_lengths(request)}; cut the sequence evenly, or use "
        "cuda_graphs = step, which captures every chunk on its own",
    ),
    Capability(
        ("pipeline.recompute", "pipeline.cuda_graphs"),
        lambda request: not set(recompute_modes(request.recompute)) <= set(graph_recompute_modes(request.cuda_graphs)),
        lambda request: _graphs(request) + f"recompute = {recompute_text(request.recompute)}; "
        + ("step graphs recompute only `full`, which each chunk's backward graph reruns itself (mlp and mixer "
           "recompute through torch.utils.checkpoint, which is not captured)"
           if request.cuda_graphs is CudaGraphs.STEP else
           "per-chunk graph slots do not recompute; use cuda_graphs = step, which captures recompute = full"),
    ),
    Capability(
        ("pipeline.offload", "pipeline.cuda_graphs"),
        lambda request: request.cuda_graphs and request.offload,
        lambda request: _graphs(request) + "offload = true; a captured graph's saved activations live in its "
        "own memory pool, which copies to the host cannot free",
    ),
    Capability(
        ("mesh.sequence", "pipeline.cuda_graphs"),
        lambda request: request.cuda_graphs and request.sequence_parallel > 1,
        lambda request: _graphs(request) + f"mesh.sequence = {request.sequence_parallel}; use sequence = 1",
    ),
    Capability(
        ("model.layers", "pipeline.cuda_graphs"),
        lambda request: request.cuda_graphs and LayerKind.ATTN in request.layers,
        lambda request: _graphs(request) + "attn layers, which read a key prefix that grows chunk by chunk; use "
        "recurrent layers (gla, simple_gla, gdn, mamba2, mamba3), whose states keep one shape",
    ),
)


def refusals(request: RunRequest) -> tuple[Refusal, ...]:
    """Every row of :data:`CAPABILITIES` that refuses ``request``, in the list's order."""
    return tuple(
        Refusal(capability.keys, capability.reason(request))
        for capability in CAPABILITIES
        if capability.refuses(request)
    )


class UnsupportedRunError(ValueError):
    """A configuration the runtime cannot run; ``refusals`` holds every reason."""

    def __init__(self, refused: tuple[Refusal, ...]) -> None:
        self.refusals = refused
        super().__init__("the runtime cannot run this configuration: " + "; ".join(r.message for r in refused))


def require_supported(request: RunRequest) -> None:
    """Return if the runtime can run ``request``; raise :class:`UnsupportedRunError` naming every refusal."""
    refused = refusals(request)
    if refused:
        raise UnsupportedRunError(refused)
