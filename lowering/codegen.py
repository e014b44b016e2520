"""Code generation: checked program + placed actions -> one readable torch.distributed training script.

Input: a :class:`ScheduleProgram` from the front end, whose checker has already refused what the runtime
cannot run (the capabilities list, ``schedlang.vocabulary.capabilities``), and the per-stage action lists
the placement pass made from its legal orders (``schedlang.compiler.compile_schedule`` runs the passes
before this one). This pass builds a view model in which every value from the schedule file is already
a Python literal (``repr``), and renders ``templates/train.py.jinja``. The model and train settings are
the vocabulary's records, written generically as constructors of the fields that differ from their
defaults (``lowering.literals``). The template only arranges those literals; user text never becomes code.
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
from schedlang.vocabulary import Action, AttentionExchange, StageRecompute

ACTIONS_PER_LINE = 8
_SAFE_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_\-]*$")


def _recompute_literal(recompute: StageRecompute) -> str:
    """``'full'``, or ``('full', 'none')`` with a mode per stage."""
    if isinstance(recompute, tuple):
        return repr(tuple(mode.value for mode in recompute))
    return repr(recompute.value)


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
    stage_actions_literal: str
    stage_layers_literal: str
    chunk_boundaries_literal: str
    recompute: str
    sequence_parallel: str
    sequence_method: str
    scan_blocks: str
    attention_exchange: str = ""  # the exchange's value as a literal, empty for the default all-gather
    cuda_graphs: str = ""  # the mode's value as a literal, empty without graphs
    offload: bool = False


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
        stage_actions_literal=_tuple_of_names([f"STAGE_{index}_ACTIONS" for index in range(n_stages)]),
        stage_layers_literal=repr(tuple(tuple(layers) for layers in program.stage_layers)),
        chunk_boundaries_literal=repr(tuple(program.sequence.boundaries)),
        recompute=_recompute_literal(program.pipeline.recompute),
        sequence_parallel=repr(program.mesh.sequence),
        sequence_method=repr(program.sequence.parallel.value),
        scan_blocks=repr(program.sequence.scan_blocks),
        attention_exchange=(
            repr(program.sequence.attention.value)
            if program.sequence.attention is not AttentionExchange.ALLGATHER
            else ""
        ),
        cuda_graphs=repr(program.pipeline.cuda_graphs.value) if program.pipeline.cuda_graphs else "",
        offload=program.pipeline.offload,
    )


def render_train_script(
    program: ScheduleProgram, stage_actions: Sequence[Sequence[Action]], script_name: str = "train.py"
) -> str:
    """The training script's text; see the module docstring for what its inputs must satisfy."""
    template = make_environment().get_template("train.py.jinja")
    return template.render(view=build_view(program, stage_actions, script_name))
