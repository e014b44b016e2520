"""Documented upper bounds on a schedule's size, checked before any pass does work proportional to it.

A schedule is refused, with an error at the key that makes it too large, when it asks for more than:

- ``MAX_CHUNKS`` chunks per sequence (checked on the syntax tree, before the chunk boundaries exist);
- ``MAX_TASKS`` tasks in the task graph: stages x microbatches x chunks x 2 (3 with split backwards);
- ``MAX_RANKS`` ranks in the mesh (pipeline x sequence x data);
- an MLP ``MAX_MLP_RATIO`` times wider than ``d_model`` (``swiglu(ratio = 1e308)`` has no width).

``schedlang run`` also refuses a mesh with more ranks than this machine can hold: one per GPU on CUDA,
and on the CPU ``CPU_RANKS_PER_CORE`` per core (at least ``MIN_CPU_RANKS``). docs/reliability.md lists
the limits for users.
"""

from __future__ import annotations

import os

from schedlang import ast
from schedlang.diagnostics import Diagnostic, ScheduleError
from schedlang.vocabulary import Span

MAX_CHUNKS = 4096
MAX_TASKS = 1 << 20
MAX_RANKS = 1 << 16
MAX_MLP_RATIO = 64.0
CPU_RANKS_PER_CORE = 4
MIN_CPU_RANKS = 8


def _refuse(message: str, span: Span, hint: str, text: str) -> None:
    raise ScheduleError([Diagnostic.error(message, span, hint)], {span.file: text})


def _assignment(tree: ast.ScheduleFile, block_name: str, key: str) -> ast.Assignment | None:
    for block in tree.blocks:
        if block.name == block_name:
            for item in block.items:
                if isinstance(item, ast.Assignment) and item.key == key:
                    return item
    return None


def check_syntax_limits(tree: ast.ScheduleFile, text: str) -> None:
    """Refuse a chunk count above ``MAX_CHUNKS`` before the checker cuts the sequence."""
    chunks = _assignment(tree, "sequence", "chunks")
    if chunks is None:
        return
    value = chunks.value
    count = value.value if isinstance(value, ast.IntLiteral) else None
    if isinstance(value, ast.ListLiteral):
        count = len(value.items) - 1
    if count is not None and count > MAX_CHUNKS:
        _refuse(
            f"'sequence.chunks' asks for {count} chunks, more than the limit of {MAX_CHUNKS}",
            value.span,
            "see docs/reliability.md for the limits on a schedule's size",
            text,
        )


def task_count(program) -> int:
    """Tasks in the program's graph: one forward and one backward (two when split) per stage, microbatch, chunk."""
    per_chunk = 3 if program.pipeline.split_backward else 2
    return program.n_stages * program.n_microbatches * program.n_chunks * per_chunk


def _largest_key_span(program, keys: tuple[str, ...]) -> Span:
    spans = [(key, program.spans[key]) for key in keys if key in program.spans]
    if not spans:
        return Span(program.source_file, 1, 1, 1, 2)
    values = {
        "pipeline.microbatches": program.n_microbatches,
        "sequence.chunks": program.n_chunks,
        "mesh.pipeline": program.mesh.pipeline,
        "mesh.sequence": program.mesh.sequence,
        "mesh.data": program.mesh.data,
    }
    return max(spans, key=lambda pair: values.get(pair[0], 0))[1]


def check_program_limits(program, text: str) -> None:
    """Refuse a program above ``MAX_RANKS``, ``MAX_MLP_RATIO`` or ``MAX_TASKS``, at the key (the largest factor's)."""
    world_size = program.mesh.world_size
    if world_size > MAX_RANKS:
        _refuse(
            f"the mesh has {world_size} ranks (pipeline {program.mesh.pipeline} x sequence {program.mesh.sequence}"
            f" x data {program.mesh.data}), more than the limit of {MAX_RANKS}",
            _largest_key_span(program, ("mesh.pipeline", "mesh.sequence", "mesh.data")),
            "see docs/reliability.md for the limits on a schedule's size",
            text,
        )
    ratio = program.model.mlp_ratio
    if ratio > MAX_MLP_RATIO:
        _refuse(
            f"'model.mlp.ratio' = {ratio:g} is above the limit of {MAX_MLP_RATIO:g}",
            program.spans.get("model.mlp.ratio") or _largest_key_span(program, ()),
            "the SwiGLU width is ratio x d_model; see docs/reliability.md for the limits on a schedule's size",
            text,
        )
    tasks = task_count(program)
    if tasks > MAX_TASKS:
        _refuse(
            f"the schedule has {tasks} tasks ({program.n_stages} stages x {program.n_microbatches} microbatches x "
            f"{program.n_chunks} chunks x {tasks // (program.n_stages * program.n_microbatches * program.n_chunks)}),"
            f" more than the limit of {MAX_TASKS}",
            _largest_key_span(program, ("pipeline.microbatches", "sequence.chunks", "mesh.pipeline")),
            "use fewer microbatches or chunks; see docs/reliability.md for the limits on a schedule's size",
            text,
        )


def machine_rank_limit(device: str) -> tuple[int, str]:
    """How many ranks ``schedlang run`` may start here, and what that limit is made of."""
    if device == "cuda":
        import torch

        count = torch.cuda.device_count()
        return count, f"{count} GPU(s)"
    cores = os.cpu_count() or 1
    limit = max(MIN_CPU_RANKS, CPU_RANKS_PER_CORE * cores)
    return limit, f"{cores} CPU core(s), at most {limit} CPU processes"


def check_machine_fits(program, device: str, text: str, nodes: int = 1) -> None:
    """Refuse, at the mesh, a run with more ranks per machine (of ``nodes``) than this one has devices (or
    cores) for."""
    limit, what = machine_rank_limit(device)
    world_size = program.mesh.world_size
    if world_size // nodes > limit:
        per_node = f" ({world_size // nodes} on each of {nodes} machines)" if nodes > 1 else ""
        _refuse(
            f"the mesh has {world_size} ranks{per_node}, but this machine has {what}",
            _largest_key_span(program, ("mesh.pipeline", "mesh.sequence", "mesh.data")),
            "run it on a machine with more devices, or shrink the mesh",
            text,
        )


MAX_DRAWN_TASKS = {"dot": 1 << 16, "chrome": 1 << 16, "png": 1 << 13}
"""Tasks ``viz`` draws per format: a drawing of more is megabytes no viewer opens (DOT and Chrome traces grow
about 250 and 600 bytes a task) or, for the PNG, minutes of matplotlib; ``simulate`` and ``check`` still take the
schedule."""


def check_drawable(program, output_format: str) -> None:
    """Refuse to draw a program of more than ``MAX_DRAWN_TASKS[output_format]`` tasks, at the largest factor's key."""
    tasks, most = task_count(program), MAX_DRAWN_TASKS[output_format]
    if tasks > most:
        _refuse(
            f"viz --format {output_format} draws at most {most} tasks, and this schedule has {tasks}",
            _largest_key_span(program, ("pipeline.microbatches", "sequence.chunks", "mesh.pipeline")),
            "draw a smaller variant (fewer microbatches or chunks), or use `schedlang simulate` for the numbers; "
            "see docs/reliability.md",
            program.source_text,
        )
