"""What a schedule file with errors still determines, so ``check`` reports every problem in one run.

Contract: :func:`partial_program` runs after the rules, on a checker that found errors. It returns a
:class:`PartialProgram` whose ``program`` holds every spec that was built without a problem and a stand-in
for each that was not, with two flags saying which later checks its real parts can feed:

* ``orders_known``: ``mesh.pipeline``, the ``pipeline`` block (explicit ``stage r:`` lines included) and the
  chunk count were read without a problem, so the legality pass (Eq. 8, deadlock) reads only real values
  (it reads the stage, microbatch and chunk counts, the pipeline spec and the spans, nothing else);
* ``data_known``: ``train.data``, ``model.vocab`` and ``sequence.length`` were read without a problem, so
  the data preflight (schedlang.preflight.check_data_file) reads only real values.

Nothing else may read a partial program: its stand-ins (a one-token-per-chunk sequence, a model of one
layer per stage, the default ``train`` block) are placeholders, not the file's values.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from schedlang import ast
from schedlang.lowering.program import MeshSpec, PipelineSpec, ScheduleProgram, SequenceSpec
from schedlang.vocabulary import LayerKind, ModelConfig, TrainConfig

if TYPE_CHECKING:
    from schedlang.checks.context import Checker


@dataclasses.dataclass(frozen=True)
class PartialProgram:
    """A program with stand-ins for what the file's errors left unknown; see the module docstring."""

    program: ScheduleProgram
    orders_known: bool
    data_known: bool


def chunk_count(checker: Checker) -> int | None:
    """The number of chunks the file asks for, even when its boundaries were refused: ``chunks = N`` or a
    list of N + 1 boundaries; None when that number itself is unknown, or when no check read the key (a
    refused length settles the chunks: their own problems are not reported on top)."""
    node = checker.node("sequence.chunks")
    if isinstance(node, ast.ListLiteral):
        return len(node.items) - 1 if len(node.items) >= 2 else None
    if not checker.was_read("sequence.chunks"):
        return None
    count = checker.get("sequence.chunks")
    return count if isinstance(count, int) and count >= 1 else None


def partial_program(
    checker: Checker,
    name: str,
    model: ModelConfig | None,
    mesh: MeshSpec | None,
    sequence: SequenceSpec | None,
    pipeline: PipelineSpec | None,
    train: TrainConfig | None,
) -> PartialProgram | None:
    """The file's known parts as a program with stand-ins; None when neither later check could run."""
    n_chunks = sequence.n_chunks if sequence is not None else chunk_count(checker)
    orders_known = mesh is not None and pipeline is not None and n_chunks is not None
    data_keys = ("train.data", "model.vocab", "sequence.length")
    data_known = all(checker.was_read(path) for path in data_keys) and checker.valid(*data_keys)
    if not (orders_known or data_known):
        return None
    n_stages = mesh.pipeline if mesh is not None else 1
    if sequence is None:
        length = checker.get("sequence.length") if data_known else None
        boundaries = tuple(range((n_chunks or 1) + 1))
        sequence = SequenceSpec(length=length or boundaries[-1], boundaries=boundaries, kernel_chunk=1)
    if model is None:
        vocab = checker.get("model.vocab") if data_known else 1
        model = ModelConfig(vocab=vocab, d_model=1, layers=(LayerKind.GLA,) * n_stages, heads=1, head_dim=1)
    if train is None:
        train = TrainConfig(data=checker.get("train.data")) if data_known else TrainConfig()
    stage_layers = checker.derived.get("model.stages") or tuple((stage,) for stage in range(n_stages))
    program = ScheduleProgram(
        name=name,
        model=model,
        mesh=mesh if mesh is not None else MeshSpec(pipeline=n_stages),
        sequence=sequence,
        pipeline=pipeline if pipeline is not None else PipelineSpec(microbatches=1),
        train=train,
        stage_layers=stage_layers,
        source_file=checker.filename,
        spans=dict(checker.spans),
    )
    return PartialProgram(program, orders_known, data_known)

