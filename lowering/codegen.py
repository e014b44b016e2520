"""Code generation: checked program + placed actions -> one readable torch.distributed training script.

Input: a :class:`ScheduleProgram` from the front end, whose checker has already refused what the runtime
cannot run (the capabilities list, ``schedlang.vocabulary.capabilities``), and the per-stage action lists
the placement pass made from its legal orders (``schedlang.compiler.compile_schedule`` runs the passes
before this one). This pass builds a view model in which every value from the schedule file is already
a Python literal (``repr``), and renders ``templates/train.py.jinja``. The model and train settings are
the vocabulary's records and the pipeline the runtime's ``PipelineConfig`` (:func:`pipeline_record`), each
written generically as a constructor of the fields that differ from their defaults (``lowering.literals``). The template only arranges those literals; user text never becomes code.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import jinja2

from schedlang.lowering import paths
from schedlang.lowering.literals import LINE_WIDTH, record_literal
from schedlang.lowering.program import ScheduleProgram
from schedlang.lowering.script_text import docstring_script_name
from schedlang.runtime.config import PipelineConfig
from schedlang.vocabulary import Action

ACTIONS_PER_LINE = 8
_SAFE_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_\-]*$")


def make_environment() -> jinja2.Environment:
    """The one Jinja environment for every template: strict, whitespace-faithful."""
    return jinja2.Environment(
        loader=jinja2.PackageLoader("schedlang.lowering", "templates"),
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
        undefined=jinja2.StrictUndefined,
        autoescape=False,
    )


@dataclass(frozen=True)
class StageView:
    index: int
    layers_text: str
    ends_text: str
    action_lines: tuple[str, ...]


@dataclass(frozen=True)
class TrainScriptView:
    title: str
    source_literal: str
    script_name: str
    order_name: str
    mesh_shape: tuple[int, int, int]
    mesh_shape_literal: str
    world_size: int
    microbatches: int
    microbatch_size: int
    sequence_length: int
    n_chunks: int
    model_literal: str  # MODEL's record (lowering.literals): the fields that differ from their defaults
    train_literal: str  # TRAIN's record, likewise
    settings_import: str  # the import of the vocabulary's record classes those literals name
    stages: tuple[StageView, ...]
    pipeline_literal: str  # PIPELINE's record, its stage actions named by the STAGE_<r>_ACTIONS above it


def _action_lines(actions) -> tuple[str, ...]:
    texts = [repr(str(action)) + "," for action in actions]
    return tuple(" ".join(texts[start : start + ACTIONS_PER_LINE]) for start in range(0, len(texts), ACTIONS_PER_LINE))


def _tuple_of_names(names: list[str]) -> str:
    return f"({names[0]},)" if len(names) == 1 else "(" + ", ".join(names) + ")"


def _order_name(pipeline) -> str:
    """``1f1b order``, ``1f1b order with 2 extra warm-up forwards`` ([Note: extra warm-up] in lowering/orders.py),
    ``... and split backwards`` ([Note: split backward])."""
    extra = pipeline.extra_warmup
    if isinstance(extra, tuple):
        more = f" with {list(extra)} extra warm-up forwards per stage" if any(extra) else ""
    else:
        more = f" with {extra} extra warm-up forward{'s' if extra > 1 else ''}" if extra else ""
    if pipeline.split_backward:
        more += (" and" if more else " with") + " split backwards (weight gradients as W tasks)"
    return f"{pipeline.order.value} order{more}"


def pipeline_record(program: ScheduleProgram, stage_actions: Sequence[Sequence[Action]]) -> PipelineConfig:
    """The runtime's record of how a step runs: the program's stages, chunks, microbatches and parallelism,
    and each stage's placed action list in text form."""
    return PipelineConfig(
        stage_layers=tuple(tuple(layers) for layers in program.stage_layers),
        chunk_boundaries=tuple(program.sequence.boundaries),
        microbatches=program.n_microbatches,
        microbatch_size=program.pipeline.microbatch_size,
        stage_actions=tuple(tuple(str(action) for action in actions) for actions in stage_actions),
        data_parallel=program.mesh.data,
        recompute=program.pipeline.recompute,
        sequence_parallel=program.mesh.sequence,
        sequence_method=program.sequence.parallel,
        scan_blocks=program.sequence.scan_blocks,
        attention_exchange=program.sequence.attention,
        cuda_graphs=program.pipeline.cuda_graphs,
        offload=program.pipeline.offload,
    )


def _import_line(module: str, names: list[str]) -> str:
    """``from module import a, b``, or one name per line when that is wider than a script line."""
    line = f"from {module} import {', '.join(names)}"
    if len(line) <= LINE_WIDTH:
        return line
    return f"from {module} import (\n" + "".join(f"    {name},\n" for name in names) + ")"


def _layers_text(layers: tuple[int, ...]) -> str:
    return f"layers {layers[0]}-{layers[-1]}" if len(layers) > 1 else f"layer {layers[0]}"


def build_view(
    program: ScheduleProgram, stage_actions: Sequence[Sequence[Action]], script_name: str = "train.py"
) -> TrainScriptView:
    """Every value the template prints, precomputed."""
    n_stages = program.n_stages
    stages = []
    for index, layers in enumerate(program.stage_layers):
        ends = []
        if index == 0:
            ends.append("embedding")
        if index == n_stages - 1:
            ends.append("final norm, LM head and loss")
        stages.append(
            StageView(
                index=index,
                layers_text=_layers_text(layers),
                ends_text=f", plus {' and '.join(ends)}" if ends else "",
                action_lines=_action_lines(stage_actions[index]),
            )
        )
    mesh_shape = (program.mesh.pipeline, program.mesh.sequence, program.mesh.data)
    names: set[str] = set()
    model_literal = record_literal(program.model, names, start=len("MODEL = "), one_per_line=True)
    train = paths.with_resolved_inputs(program).train
    train_literal = record_literal(train, names, start=len("TRAIN = "), one_per_line=True)
    pipeline = pipeline_record(program, stage_actions)
    stage_action_names = _tuple_of_names([f"STAGE_{index}_ACTIONS" for index in range(n_stages)])
    pipeline_literal = record_literal(
        pipeline, set(), start=len("PIPELINE = "), one_per_line=True, written={"stage_actions": stage_action_names}
    )
    return TrainScriptView(
        title=f"schedule {program.name}" if _SAFE_NAME.match(program.name) else "a schedule",
        source_literal=repr(Path(program.source_file).name),
        script_name=docstring_script_name(script_name),
        order_name=_order_name(program.pipeline),
        mesh_shape=mesh_shape,
        mesh_shape_literal=repr(mesh_shape),
        world_size=program.mesh.world_size,
        microbatches=program.n_microbatches,
        microbatch_size=program.pipeline.microbatch_size,
        sequence_length=program.sequence.length,
        n_chunks=program.n_chunks,
        model_literal=model_literal,
        train_literal=train_literal,
        settings_import=_import_line("schedlang.vocabulary", sorted(names)),
        stages=tuple(stages),
        pipeline_literal=pipeline_literal,
    )


def render_train_script(
    program: ScheduleProgram, stage_actions: Sequence[Sequence[Action]], script_name: str = "train.py"
) -> str:
    """The training script's text; see the module docstring for what its inputs must satisfy."""
    template = make_environment().get_template("train.py.jinja")
    return template.render(view=build_view(program, stage_actions, script_name))
