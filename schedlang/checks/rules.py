"""Cross-key rules: every check that relates two or more keys, as one ordered list.

Contract: each :class:`Rule` names the keys it relates and a check that reads
them through ``checker.get`` (so each key is read through its schema row),
reports what is wrong at the key that is wrong, and either refuses a value
(``checker.reject``) or records what it derives in ``checker.derived``:
``"model.stages"`` (the layers of each stage), ``"sequence.partition"``,
``"sequence.unit"``, ``"sequence.boundaries"`` and
``"pipeline.explicit_orders"``. A rule skips silently when a key it needs is
invalid (that key's problem is reported already). :data:`RULES` runs in order:
a rule may use what an earlier one derived or refused.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

from schedlang import ast
from schedlang.checks.data_rules import DATA_RULE_CHECKS
from schedlang.checks.mesh import build_mesh
from schedlang.checks.records import build_model
from schedlang.checks.model_rules import MODEL_RULE_CHECKS
from schedlang.checks.sequence import build_sequence
from schedlang.checks.stages import read_explicit_orders
from schedlang.checks.train import loss_scale_needs_fp16
from schedlang.lowering.partition import model_balanced_boundaries, uniform_boundaries
from schedlang.vocabulary import DataKind, LayerKind, OrderKind, PartitionKind, Recompute, recompute_modes

if TYPE_CHECKING:
    from schedlang.checks.context import Checker


@dataclass(frozen=True)
class Rule:
    """A check relating ``keys``; see the module docstring for what ``check`` may do."""

    keys: tuple[str, ...]
    check: Callable[[Checker], None]


def mlp_layers_need_an_mlp(checker: Checker) -> None:
    layers = checker.get("model.layers")
    mlp = checker.get("model.mlp")
    if layers is not None and LayerKind.MLP in layers and mlp is not None and mlp[0] == 0:
        checker.error(
            "'model.layers' names mlp layers, but model.mlp = none gives them nothing to run",
            checker.span_of("model.mlp"),
            hint="give the MLP a shape, e.g. `mlp = swiglu(ratio = 4)`, or drop the mlp layers",
        )
        checker.reject("model.mlp")


def stage_assignment(checker: Checker) -> None:
    """``model.stages`` as written, or the even split; each stage a non-empty run of consecutive layers."""
    mesh = build_mesh(checker)
    n_stages = mesh.pipeline if mesh is not None else None
    layers = checker.get("model.layers")
    n_layers = len(layers) if layers is not None else None
    given = checker.get("model.stages")
    if checker.given("model.stages"):
        if given is None or n_layers is None or n_stages is None:
            checker.derived["model.stages"] = None
            return
        stages, stage_spans = given
        checker.derived["model.stages"] = _check_stage_assignment(checker, stages, stage_spans, n_layers, n_stages)
        return
    checker.derived["model.stages"] = None
    if n_layers is None or n_stages is None:
        return
    if n_layers < n_stages:
        span = checker.spans.get("mesh.pipeline") or checker.spans.get("model.layers") or checker.file_start()
        checker.error(
            f"{n_layers} layers cannot fill {n_stages} pipeline stages: each stage needs at least one layer",
            span,
            hint=f"use at most {n_layers} stages or add layers",
        )
        return
    per_stage, extra = divmod(n_layers, n_stages)
    if extra:
        # An uneven split is a choice (which stage carries the extra layer changes the pipeline's
        # balance), so it must be written down rather than guessed.
        span = checker.spans.get("model.layers") or checker.spans.get("mesh.pipeline") or checker.file_start()
        example = [list(range(0, per_stage + 1))] + [
            list(range(per_stage + 1 + i * per_stage, per_stage + 1 + (i + 1) * per_stage))
            for i in range(n_stages - 1)
        ]
        checker.error(
            f"{n_layers} layers do not divide evenly over {n_stages} pipeline stages",
            span,
            hint=f"use a multiple of {n_stages} layers, or give the split in the model block, "
            f"e.g. stages = {example}".replace("'", ""),
        )
        return
    checker.derived["model.stages"] = tuple(
        tuple(range(stage * per_stage, (stage + 1) * per_stage)) for stage in range(n_stages)
    )


def _check_stage_assignment(checker: Checker, stages, stage_spans, n_layers: int, n_stages: int):
    span = checker.spans["model.stages"]
    ok = True
    if len(stages) != n_stages:
        checker.error(
            f"'model.stages' lists {len(stages)} stages but mesh.pipeline = {n_stages}",
            span,
            hint="give one list of layer indices per pipeline stage",
        )
        ok = False
    expected_next = 0
    for stage, (indices, stage_span) in enumerate(zip(stages, stage_spans)):
        if not indices:
            checker.error(
                f"stage {stage} has no layers in 'model.stages'", stage_span, hint="each stage needs at least one layer"
            )
            ok = False
            continue
        wanted = tuple(range(expected_next, expected_next + len(indices)))
        if indices != wanted:
            checker.error(
                f"stage {stage} of 'model.stages' must hold the next contiguous layers {list(wanted)}, found {list(indices)}",
                stage_span,
                hint="stages take consecutive runs of layers in order, e.g. [[0, 1], [2, 3]]",
            )
            ok = False
        expected_next += len(indices)
    if ok and expected_next != n_layers:
        checker.error(
            f"'model.stages' assigns {expected_next} layers but the model has {n_layers}",
            span,
            hint=f"cover layers 0 to {n_layers - 1} exactly once",
        )
        ok = False
    return tuple(stages) if ok else None


def scan_blocks_divide_head_dim(checker: Checker) -> None:
    """All-Scan splits each head's state into ``blocks`` blocks of ``head_dim / blocks`` rows."""
    parallel = checker.get("sequence.parallel")
    # The written head_dim, even above its maximum: a second problem with the blocks is still worth a message.
    head_dim_node = checker.node("model.head_dim")
    if parallel is None or not isinstance(head_dim_node, ast.IntLiteral) or head_dim_node.value < 1:
        return
    head_dim = head_dim_node.value
    blocks = parallel[1]
    if head_dim % blocks:
        divisors = [d for d in range(1, head_dim + 1) if head_dim % d == 0 and d <= 64]
        checker.error(
            f"allscan blocks = {blocks} does not divide head_dim = {head_dim}",
            _argument_value(checker.node("sequence.parallel"), "blocks").span,
            hint=f"All-Scan splits each head's state into blocks of head_dim / blocks rows; use one of {divisors}",
        )
        checker.reject("sequence.parallel")


def _argument_value(call: ast.Value, name: str) -> ast.Value:
    return next(argument.value for argument in call.arguments if argument.name == name)


def partition_matches_chunks(checker: Checker) -> None:
    """A boundary list goes with ``partition = explicit`` (or none), a count with a computing partition."""
    partition = checker.get("sequence.partition")
    explicit_list = isinstance(checker.node("sequence.chunks"), ast.ListLiteral)
    if not checker.given("sequence.partition"):
        checker.derived["sequence.partition"] = (
            PartitionKind.EXPLICIT if explicit_list else PartitionKind.UNIFORM,
            None,
        )
        return
    checker.derived["sequence.partition"] = None
    if partition is None:
        return
    kind = partition[0]
    partition_span = checker.node("sequence.partition").span
    if explicit_list and kind is not PartitionKind.EXPLICIT:
        checker.error(
            f"partition = {kind.value} computes the boundaries, but 'sequence.chunks' lists them",
            partition_span,
            hint="write `chunks = N` to let the partition cut the sequence, or `partition = explicit` (or nothing) to keep the list",
        )
    elif not explicit_list and kind is PartitionKind.EXPLICIT:
        checker.error(
            "partition = explicit needs 'sequence.chunks' to list the boundaries",
            partition_span,
            hint="e.g. `chunks = [0, 1024, 2560, 4096]`",
        )
    else:
        checker.derived["sequence.partition"] = partition


def nearest_positive_multiple(value: int, unit: int) -> int:
    """The positive multiple of ``unit`` nearest ``value`` (the larger one on a tie): 1024 for 1000 in units of 128."""
    lower = value // unit * unit
    upper = lower + unit
    return upper if lower < unit or value - lower >= upper - value else lower


def length_fits_sequence_ranks(checker: Checker) -> None:
    """[Note: sequence-parallel alignment]: the alignment unit, and the length a multiple of it."""
    length = checker.get("sequence.length")
    kernel_chunk = checker.get("sequence.kernel_chunk")
    mesh = build_mesh(checker)
    sequence_ranks = mesh.sequence if mesh is not None else None
    unit = kernel_chunk * sequence_ranks if kernel_chunk is not None and sequence_ranks is not None else None
    checker.derived["sequence.unit"] = unit
    if length is not None and unit is not None and sequence_ranks > 1 and length % unit:
        checker.error(
            f"with mesh.sequence = {sequence_ranks} the length must be a multiple of"
            f" {sequence_ranks} * kernel_chunk = {unit}, found {length}",
            checker.node("sequence.length").span,
            hint=f"each chunk is split over {sequence_ranks} ranks in whole kernel chunks; "
            f"try {nearest_positive_multiple(length, unit)}",
        )
        checker.reject("sequence.length")
        # No boundary can be placed on a length the ranks cannot share.
        checker.derived["sequence.boundaries"] = None


def chunk_boundaries(checker: Checker) -> None:
    """The boundaries: a written list checked against the length and unit, or a count cut by the partition."""
    if "sequence.boundaries" in checker.derived:
        return
    chunks_node = checker.node("sequence.chunks")
    chunks = checker.get("sequence.chunks")
    length = checker.get("sequence.length")
    unit = checker.derived["sequence.unit"]
    boundaries = None
    if isinstance(chunks_node, ast.ListLiteral):
        if chunks is not None:
            boundaries = _explicit_boundaries(checker, chunks_node, chunks, length, unit)
    else:
        partition = checker.derived["sequence.partition"]
        if None not in (chunks, length, unit, partition):
            boundaries = _computed_boundaries(checker, chunks, length, unit, partition, chunks_node)
    checker.derived["sequence.boundaries"] = boundaries


def _computed_boundaries(checker: Checker, n_chunks, length, unit, partition, chunks_node):
    kind, alpha = partition
    span = chunks_node.span if chunks_node is not None else checker.span_of("sequence.length")
    try:
        if kind is PartitionKind.BALANCED:
            model = build_model(checker)
            if model is None:
                return None
            return model_balanced_boundaries(model, length, n_chunks, alpha, unit, build_mesh(checker).sequence)
        return uniform_boundaries(length, n_chunks, unit)
    except ValueError as error:
        blocks = -(-length // unit)
        checker.error(
            f"'sequence.chunks' = {n_chunks} does not fit: {error}",
            span,
            hint=f"use at most {blocks} chunks, or a smaller kernel_chunk",
        )
        return None


def _explicit_boundaries(checker: Checker, value: ast.ListLiteral, numbers, length, unit):
    ok = True
    if numbers[0] != 0:
        checker.error(f"the first chunk boundary must be 0, found {numbers[0]}", value.items[0].span)
        ok = False
    if length is not None and numbers[-1] != length:
        checker.error(
            f"the last chunk boundary must be the sequence length {length}, found {numbers[-1]}",
            value.items[-1].span,
        )
        ok = False
    for position in range(1, len(numbers)):
        if numbers[position] <= numbers[position - 1]:
            checker.error(
                f"chunk boundaries must increase: {numbers[position]} follows {numbers[position - 1]}",
                value.items[position].span,
            )
            ok = False
    if unit is not None:
        kernel_chunk = checker.get("sequence.kernel_chunk")
        sequence_ranks = build_mesh(checker).sequence
        for position in range(1, len(numbers) - 1):
            boundary = numbers[position]
            if boundary % unit:
                lower = boundary // unit * unit
                because = (
                    f"kernel_chunk = {kernel_chunk}"
                    if sequence_ranks == 1
                    else f"mesh.sequence * kernel_chunk = {sequence_ranks} * {kernel_chunk}"
                )
                checker.error(
                    f"chunk boundary {boundary} is not a multiple of {unit} ({because})",
                    value.items[position].span,
                    hint=f"use {lower} or {lower + unit}",
                )
                ok = False
    return tuple(numbers) if ok else None


def extra_warmup_per_stage(checker: Checker) -> None:
    """A list of warm-up counts: one per stage, the last 0, rising by at most 1 from a stage to the next."""
    counts = checker.get("pipeline.extra_warmup")
    if not isinstance(counts, tuple):
        return
    value = checker.node("pipeline.extra_warmup")
    path = "pipeline.extra_warmup"
    mesh = build_mesh(checker)
    if mesh is not None and len(counts) != mesh.pipeline:
        checker.error(
            f"'{path}' lists {len(counts)} counts but mesh.pipeline = {mesh.pipeline}",
            value.span,
            hint="one count per stage, or a single integer for every stage but the last",
        )
        checker.reject(path)
        return
    if counts and counts[-1] != 0:
        checker.error(
            f"the last stage's extra warm-up must be 0 (its first backward waits on nothing downstream), "
            f"found {counts[-1]}",
            value.items[-1].span,
        )
        checker.reject(path)
        return
    for stage in range(1, len(counts)):
        if counts[stage] > counts[stage - 1] + 1:
            checker.error(
                f"stage {stage}'s extra warm-up {counts[stage]} exceeds stage {stage - 1}'s ({counts[stage - 1]}) "
                "by more than 1: it would wait for forwards that stage never sends before its own first backward",
                value.items[stage].span,
                hint=f"give stage {stage - 1} at least {counts[stage] - 1}",
            )
            checker.reject(path)
            return


def places_weight_tasks(key: str) -> Callable[[Checker], None]:
    """A key that places the W tasks of generated 1F1B orders: set, it needs split_backward and 1f1b."""

    def check(checker: Checker) -> None:
        path = f"pipeline.{key}"
        if not checker.get(path):
            return
        split_backward = checker.get("pipeline.split_backward")
        order = checker.get("pipeline.order")
        span = checker.span_of(path)
        if split_backward is False:
            checker.error(
                f"'{path}' places W tasks, but split_backward is not true",
                span,
                hint=f"set `split_backward = true`, or remove {key}",
            )
            checker.reject(path)
        elif order is not None and order is not OrderKind.ONE_F_ONE_B:
            checker.error(
                f"'{path}' only applies to order = 1f1b, but order = {order.value}",
                span,
                hint=f"remove {key}, or place the W tasks yourself with order = explicit",
            )
            checker.reject(path)

    return check


def extra_warmup_needs_1f1b(checker: Checker) -> None:
    extra_warmup = checker.get("pipeline.extra_warmup")
    order = checker.get("pipeline.order")
    asks_warmup = any(extra_warmup) if isinstance(extra_warmup, tuple) else bool(extra_warmup)
    if asks_warmup and order is not None and order is not OrderKind.ONE_F_ONE_B:
        checker.error(
            f"'pipeline.extra_warmup' only applies to order = 1f1b, but order = {order.value}",
            checker.span_of("pipeline.extra_warmup"),
            hint="remove extra_warmup, or write the order out with order = explicit",
        )
        checker.reject("pipeline.extra_warmup")


def recompute_per_stage(checker: Checker) -> None:
    """A list of recompute modes names one per pipeline stage."""
    modes = checker.get("pipeline.recompute")
    mesh = build_mesh(checker)
    if not isinstance(modes, tuple) or mesh is None or len(modes) == mesh.pipeline:
        return
    checker.error(
        f"'pipeline.recompute' lists {len(modes)} modes but mesh.pipeline = {mesh.pipeline}",
        checker.span_of("pipeline.recompute"),
        hint="one mode per stage, first stage first, or a single mode for every stage",
    )
    checker.reject("pipeline.recompute")


def offload_needs_saved_activations(checker: Checker) -> None:
    """``offload = true`` moves what a chunk's forward saves for its backward; ``recompute = full`` saves nothing."""
    recompute = checker.get("pipeline.recompute")
    if checker.get("pipeline.offload") and Recompute.FULL in recompute_modes(recompute):
        where = "" if recompute is Recompute.FULL else " on a stage"
        checker.error(
            f"'pipeline.offload' keeps the activations a chunk's forward saves in host memory, but recompute = full"
            f"{where} saves none (its backward reruns the forward)",
            checker.span_of("pipeline.offload"),
            hint="remove offload, or recompute only a part of each layer (recompute = mlp or mixer)",
        )
        checker.reject("pipeline.offload")


def stage_lines_match_order(checker: Checker) -> None:
    """``stage r:`` lines exactly when ``order = explicit``; their tasks name existing microbatches and chunks."""
    order = checker.get("pipeline.order")
    explicit_orders = ()
    if order is OrderKind.EXPLICIT:
        if not checker.stage_lines:
            checker.error(
                "order = explicit needs one 'stage r:' line per stage",
                checker.span_of("pipeline.order"),
                hint="e.g. `stage 0: F0.0 F0.1 B0.1 B0.0`",
            )
            explicit_orders = None
        else:
            mesh = build_mesh(checker)
            sequence = build_sequence(checker)
            explicit_orders = read_explicit_orders(
                checker,
                mesh.pipeline if mesh is not None else None,
                checker.get("pipeline.microbatches"),
                sequence.n_chunks if sequence is not None else None,
                checker.get("pipeline.split_backward"),
            )
    elif checker.stage_lines and order is not None:
        checker.error(
            f"'stage' lines are only allowed with order = explicit, but order = {order.value}",
            checker.stage_lines[0].span,
            hint="write `order = explicit` or remove the stage lines",
        )
        explicit_orders = None
    checker.derived["pipeline.explicit_orders"] = explicit_orders


def schedule_fits_the_run(checker: Checker) -> None:
    """The warm-up ends before the last step, and the schedule never rises above the optimizer's lr."""
    schedule, steps, optimizer = (checker.get(path) for path in ("train.lr_schedule", "train.steps", "train.optimizer"))
    if schedule is None or not checker.given("train.lr_schedule"):
        return
    span = checker.node("train.lr_schedule").span
    if steps is not None and schedule.warmup >= steps:
        checker.error(
            f"the learning-rate warm-up of {schedule.warmup} steps does not end within train.steps = {steps}",
            span,
            hint=f"use a warm-up below {steps} steps",
        )
        checker.reject("train.lr_schedule")
    elif optimizer is not None and schedule.min_lr > optimizer.lr:
        checker.error(
            f"min_lr = {schedule.min_lr:g} is above the optimizer's lr = {optimizer.lr:g}: the schedule decays "
            "from lr down to min_lr",
            span,
        )
        checker.reject("train.lr_schedule")


def evaluation_has_held_out_data(checker: Checker) -> None:
    """File data evaluates on its held-out part only, so ``eval_every`` needs ``validation > 0`` there."""
    every, data = checker.get("train.eval_every"), checker.get("train.data")
    if not every or data is None or data.kind is DataKind.SYNTHETIC or data.validation > 0:
        return
    checker.error(
        f"'train.eval_every' = {every} evaluates on held-out data, but train.data holds none",
        checker.node("train.eval_every").span,
        hint=f"hold the end of the file out: `{data.kind.value}(..., validation = 0.01)`",
    )
    checker.reject("train.eval_every")


RULES: tuple[Rule, ...] = (
    Rule(("model.layers", "model.mlp"), mlp_layers_need_an_mlp),
    *(Rule(keys, check) for keys, check in MODEL_RULE_CHECKS),
    Rule(("model.stages", "model.layers", "mesh.pipeline"), stage_assignment),
    Rule(("sequence.partition", "sequence.chunks"), partition_matches_chunks),
    Rule(("sequence.parallel", "model.head_dim"), scan_blocks_divide_head_dim),
    Rule(("sequence.length", "sequence.kernel_chunk", "mesh.sequence"), length_fits_sequence_ranks),
    Rule(
        ("sequence.chunks", "sequence.length", "sequence.kernel_chunk", "mesh.sequence", "sequence.partition"),
        chunk_boundaries,
    ),
    Rule(("pipeline.extra_warmup", "mesh.pipeline"), extra_warmup_per_stage),
    Rule(
        ("pipeline.forward_before_weight", "pipeline.split_backward", "pipeline.order"),
        places_weight_tasks("forward_before_weight"),
    ),
    Rule(
        ("pipeline.extra_deferred_weights", "pipeline.split_backward", "pipeline.order"),
        places_weight_tasks("extra_deferred_weights"),
    ),
    Rule(("pipeline.extra_warmup", "pipeline.order"), extra_warmup_needs_1f1b),
    Rule(("pipeline.recompute", "mesh.pipeline"), recompute_per_stage),
    Rule(("pipeline.offload", "pipeline.recompute"), offload_needs_saved_activations),
    Rule(
        ("pipeline.order", "pipeline.microbatches", "pipeline.split_backward", "mesh.pipeline", "sequence.chunks"),
        stage_lines_match_order,
    ),
    Rule(("train.lr_schedule", "train.steps", "train.optimizer"), schedule_fits_the_run),
    Rule(("train.loss_scale", "train.dtype"), loss_scale_needs_fp16),
    Rule(("train.eval_every", "train.data"), evaluation_has_held_out_data),
    *(Rule(keys, check) for keys, check in DATA_RULE_CHECKS),
)
