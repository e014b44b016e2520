"""Code generation: checked program + placed actions -> one readable torch.distributed training script.

Input: a :class:`ScheduleProgram` from the front end, whose checker has already refused what the runtime
cannot run (the capabilities list, ``schedlang.vocabulary.capabilities``), and the per-stage action lists
the placement pass made from its legal orders (``schedlang.compiler.compile_schedule`` runs the passes
before this one). This pass builds a view model in which every value from the schedule file is already
a Python literal (``repr``), and renders ``templates/train.py.jinja``. The template only arranges those
literals; user text never becomes code.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
import dataclasses
from dataclasses import dataclass
from enum import Enum
from pathlib import Path

import jinja2

from schedlang.lowering import paths
from schedlang.lowering.program import RUNTIME_NORM_EPS, ScheduleProgram
from schedlang.runtime.model_options import ModelOptions
from schedlang.lowering.script_text import docstring_script_name
from schedlang.vocabulary import Action, AttentionExchange, DataKind, StageRecompute

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
class ModelView:
    vocab: str
    d_model: str
    layers: str
    heads: str
    head_dim: str
    mlp_ratio: str
    norm_eps: str = ""  # a literal when not the runtime's default, else empty
    options: str = ""  # a ModelOptions(...) expression when any option is not its default, else empty
    options_imports: str = "GlaOptions, ModelOptions"  # the names of model_options that expression uses


@dataclass(frozen=True)
class StageView:
    index: int
    layers_text: str
    ends_text: str
    action_lines: tuple[str, ...]


@dataclass(frozen=True)
class TrainView:
    steps: str
    seed: str
    dtype: str
    optimizer_kind: str
    lr: str
    weight_decay: str
    betas: str
    momentum: str
    data_kind: str
    data_seed: str
    data_path: str
    data_dtype: str  # ", dtype=..." for tokens data, ", tokenizer=..." for text data, else empty
    grad_clip: str
    checkpoint_directory: str
    checkpoint_every: str
    log_every: str
    lr_schedule: str
    tensorboard_directory: str
    eval_every: str
    eval_batches: str
    master_weights: bool  # written only when false (the runtime's default is true)
    loss_scale: str  # a LossScaleConfig, or "" when there is no loss scaling (the runtime's default)


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
    model: ModelView
    stages: tuple[StageView, ...]
    stage_actions_literal: str
    stage_layers_literal: str
    chunk_boundaries_literal: str
    recompute: str
    sequence_parallel: str
    sequence_method: str
    scan_blocks: str
    train: TrainView
    attention_exchange: str = ""  # the exchange's value as a literal, empty for the default all-gather
    cuda_graphs: str = ""  # the mode's value as a literal, empty without graphs
    offload: bool = False


def _data_extras(program: ScheduleProgram) -> str:
    data = program.train.data
    extras = ""
    if data.kind is DataKind.TOKENS:
        extras = f", dtype={data.dtype.value!r}"
    if data.kind is DataKind.TEXT:
        extras = f", tokenizer={paths.tokenizer_path(program)!r}"
    if data.validation:
        extras += f", validation={float(data.validation)!r}"
    if data.document_end is not None:
        extras += f", document_end={data.document_end!r}"
    return extras


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


def _changed_field_list(value) -> list[str]:
    """``name=literal`` of each field of dataclass ``value`` that differs from its default."""
    written = []
    for field in dataclasses.fields(value):
        default = field.default_factory() if field.default_factory is not dataclasses.MISSING else field.default
        current = getattr(value, field.name)
        if current != default:
            written.append(f"{field.name}={(current.value if isinstance(current, Enum) else current)!r}")
    return written


def _changed_fields(value) -> str:
    """``name=literal, ...`` of the fields of dataclass ``value`` that differ from their defaults."""
    return ", ".join(_changed_field_list(value))


OPTIONS_LINE_LIMIT = 120 - len("    options=,")
"""The widest ModelOptions(...) literal the script writes on one line; a wider one gets a line per argument."""


def _options_literal(options: ModelOptions) -> str:
    """``ModelOptions(gla=GlaOptions(...), gdn=GdnOptions(...), attention=AttentionOptions(...), ...)`` with
    only what differs from the defaults, one argument per line when one line would be too wide; empty when
    nothing differs."""
    gla = _changed_fields(options.gla)
    gdn = _changed_fields(options.gdn)
    attention = _changed_fields(options.attention)
    mamba2 = _changed_fields(options.mamba2)
    defaults = ModelOptions()
    others = _changed_field_list(
        dataclasses.replace(
            options, gla=defaults.gla, gdn=defaults.gdn, attention=defaults.attention, mamba2=defaults.mamba2
        )
    )
    parts = ([f"gla=GlaOptions({gla})"] if gla else []) + ([f"gdn=GdnOptions({gdn})"] if gdn else [])
    parts += [f"attention=AttentionOptions({attention})"] if attention else []
    parts += [f"mamba2=Mamba2Options({mamba2})"] if mamba2 else []
    parts += others
    if not parts:
        return ""
    literal = f"ModelOptions({', '.join(parts)})"
    if len(literal) <= OPTIONS_LINE_LIMIT:
        return literal
    return "ModelOptions(\n" + "".join(f"        {part},\n" for part in parts) + "    )"


def _options_imports(options: ModelOptions) -> str:
    """The names :func:`_options_literal` needs from ``schedlang.runtime.model_options``."""
    attention = ("AttentionOptions",) if options.attention != ModelOptions().attention else ()
    gdn = ("GdnOptions",) if options.gdn != ModelOptions().gdn else ()
    mamba2 = ("Mamba2Options",) if options.mamba2 != ModelOptions().mamba2 else ()
    return ", ".join(attention + gdn + ("GlaOptions",) + mamba2 + ("ModelOptions",))


def _layers_text(layers: tuple[int, ...]) -> str:
    return f"layers {layers[0]}-{layers[-1]}" if len(layers) > 1 else f"layer {layers[0]}"


def build_view(
    program: ScheduleProgram, stage_actions: Sequence[Sequence[Action]], script_name: str = "train.py"
) -> TrainScriptView:
    """Every value the template prints, precomputed."""
    model, train = program.model, program.train
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
    checkpoint = train.checkpoint
    config = model.runtime_config()
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
        model=ModelView(
            vocab=repr(model.vocab),
            d_model=repr(model.d_model),
            layers=repr(tuple(kind.value for kind in model.layers)),
            heads=repr(model.heads),
            head_dim=repr(model.head_dim),
            mlp_ratio=repr(config.mlp_ratio),
            norm_eps=repr(float(config.norm_eps)) if config.norm_eps != RUNTIME_NORM_EPS else "",
            options=_options_literal(config.options),
            options_imports=_options_imports(config.options),
        ),
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
        train=TrainView(
            steps=repr(train.steps),
            seed=repr(train.seed),
            dtype=repr(train.dtype.value),
            optimizer_kind=repr(train.optimizer.kind.value),
            lr=repr(float(train.optimizer.lr)),
            weight_decay=repr(float(train.optimizer.weight_decay)),
            betas=repr(tuple(float(beta) for beta in train.optimizer.betas)),
            momentum=repr(float(train.optimizer.momentum)),
            data_kind=repr(train.data.kind.value),
            data_seed=repr(train.data.seed),
            data_path=repr(paths.data_path(program)),
            data_dtype=_data_extras(program),
            grad_clip=repr(None if train.grad_clip is None else float(train.grad_clip)),
            checkpoint_directory=repr(None if checkpoint is None else checkpoint.directory),
            checkpoint_every=repr(0 if checkpoint is None else checkpoint.every),
            log_every=repr(train.log_every),
            tensorboard_directory=repr(paths.tensorboard_directory(program)),
            eval_every=repr(train.eval_every),
            eval_batches=repr(train.eval_batches),
            master_weights=train.master_weights,
            loss_scale=(
                ""
                if train.loss_scale is None
                else f"LossScaleConfig(dynamic={train.loss_scale.dynamic!r}, initial={float(train.loss_scale.scale)!r})"
            ),
            lr_schedule=(
                f"LearningRateScheduleConfig(kind={train.lr_schedule.kind.value!r}, "
                f"warmup={train.lr_schedule.warmup!r}, min_lr={float(train.lr_schedule.min_lr)!r})"
            ),
        ),
    )


def render_train_script(
    program: ScheduleProgram, stage_actions: Sequence[Sequence[Action]], script_name: str = "train.py"
) -> str:
    """The training script's text; see the module docstring for what its inputs must satisfy."""
    template = make_environment().get_template("train.py.jinja")
    return template.render(view=build_view(program, stage_actions, script_name))
