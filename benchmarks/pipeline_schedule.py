"""The benchmarks' systems as schedule files, compiled by schedlang's own front end and code generator.

Every benchmarked system is a ``.sched`` file that ``schedlang run`` and ``schedlang simulate`` accept: a
benchmark starts from a checked-in file of ``benchmarks/schedules/`` (:class:`BenchmarkSchedule`) and makes
each variant with the compiler's :func:`~schedlang.compiler.revise` on named keys, so a system the checker
refuses is not measured and a measured system is exactly what a user's schedule with those keys trains.
The peers (``torch``, ``torch+ckpt``, ``fla``) take their model and stage split from the same file.

A schedlang system is named ``schedlang``, the file as it is, or ``schedlang:`` then the changed keys as
``key=value`` separated by ``/``, each value written as in a schedule (``schedlang:chunks=16/recompute=full``,
``schedlang:chunks=2/cuda_graphs=true/split_backward=true/forward_before_weight=true``); a key of two blocks is
named ``block.key``. :func:`system_changes` splits a name into those keys and nothing else: what a key
accepts is the checker's to say, at the revised line.

The runtime configs a benchmark trains are the generated script's own MODEL, PIPELINE and TRAIN
(:func:`script_configs`), read from the script's text as literals, without running it.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

SCHEDULES_DIRECTORY = Path(__file__).resolve().parent / "schedules"
"""The checked-in schedule files every benchmark starts from."""
PIPELINE_SCHEDULE = SCHEDULES_DIRECTORY / "gla_1b_pp2.sched"
"""The 1B GLA model on two pipeline stages: every PP2 row of docs/benchmarks.md."""
ONE_DEVICE_SCHEDULE = SCHEDULES_DIRECTORY / "gla_1b_one_device.sched"
"""The same model whole on one device: benchmarks/one_device.py."""
MAMBA2_ONE_DEVICE_SCHEDULE = SCHEDULES_DIRECTORY / "mamba2_1b_one_device.sched"
"""That model with every mixing layer ``mamba2``: benchmarks/one_device.py's mamba2 systems."""
SCALE_SCHEDULE = SCHEDULES_DIRECTORY / "gla_tiny_64_stages.sched"
"""The front end's and the legality check's scale benchmarks at their largest size."""

SCHEDLANG_SYSTEM = "schedlang"
"""The name of the schedule file as it is; ``schedlang:<key>=<value>/...`` names a revision of it."""

TORCH_SYSTEM = "torch"
"""The peer system's name: torch.distributed.pipelining's Schedule1F1B over full-sequence microbatches."""

TORCH_CHECKPOINTED_SYSTEM = "torch+ckpt"
"""The second peer: the same Schedule1F1B with torch's activation checkpointing on every block
(``torch.distributed.algorithms._checkpoint.checkpoint_wrapper``, non-reentrant), as torchtitan applies it."""

TORCH_SYSTEMS = (TORCH_SYSTEM, TORCH_CHECKPOINTED_SYSTEM)

TINY_MODEL_KEYS = {"vocab": 256, "d_model": 64, "layers": "[gla] * 4", "heads": 2, "head_dim": 32,
                   "mlp": "swiglu(ratio = 2.0)"}
"""``--tiny``: the ``model`` keys of a model small enough to run a benchmark's whole path on the CPU."""


@dataclass(frozen=True)
class BenchmarkSchedule:
    """A benchmark's base schedule: a checked-in file, and the command-line options that revise its model.

    ``tiny`` writes :data:`TINY_MODEL_KEYS`; ``split_mlp`` writes the layer list as ``[gla, mlp] * L`` ([Note:
    separate MLP layers]): the same network, with stage boundaries possible between a mixer and its MLP;
    ``first_stage_layers`` writes ``stages`` with that many entries of the layer list on stage 0 and the
    rest on stage 1 (None: the language's even split).
    """

    path: Path
    tiny: bool = False
    split_mlp: bool = False
    first_stage_layers: int | None = None


def is_schedlang_system(name: str) -> bool:
    return name == SCHEDLANG_SYSTEM or name.startswith(SCHEDLANG_SYSTEM + ":")


def system_file_name(name: str) -> str:
    """The file a benchmark writes system ``name``'s schedule to: ``schedlang:chunks=16/recompute=full`` is
    ``schedlang-chunks=16-recompute=full.sched``."""
    return "".join(c if c.isalnum() or c in "=+.,_" else "-" for c in name) + ".sched"


def system_changes(name: str) -> dict[str, str]:
    """The schedule keys a system name changes, as written: ``schedlang:chunks=16/recompute=full`` ->
    ``{"chunks": "16", "recompute": "full"}``; none for ``schedlang`` and for the peers, which run the file's
    model as it is. Raises ValueError for a name of neither form; an unknown key or a bad value is refused
    later, by :func:`~schedlang.compiler.revise` and the checker."""
    if name in TORCH_SYSTEMS or name == "fla" or name == SCHEDLANG_SYSTEM:
        return {}
    if not is_schedlang_system(name):
        raise ValueError(f"{name!r}: a system is torch, torch+ckpt, fla, schedlang or schedlang:<key>=<value>/...")
    changes = {}
    for assignment in name.removeprefix(SCHEDLANG_SYSTEM + ":").split("/"):
        key, equals, value = assignment.partition("=")
        if not equals or not key.strip() or not value.strip():
            raise ValueError(f"{name!r}: {assignment!r} is not <key>=<value>")
        changes[key.strip()] = value.strip()
    return changes


@lru_cache(maxsize=None)
def base_program(schedule: BenchmarkSchedule):
    """The checked program of ``schedule``'s file with its model options written in (see the class)."""
    from schedlang.compiler import Pass, compile_schedule, revise

    program = compile_schedule(schedule.path, through=Pass.CHECK).program
    if schedule.tiny:
        program = revise(program, **TINY_MODEL_KEYS)
    changes = {}
    if schedule.split_mlp:
        kinds = sorted({kind.value for kind in program.model.layers})
        if len(kinds) != 1:
            raise ValueError(f"{schedule.path}: --split-mlp needs a layer list of one kind, got {kinds}")
        changes["layers"] = f"[{kinds[0]}, mlp] * {len(program.model.layers)}"
    entries = len(program.model.layers) * (2 if schedule.split_mlp else 1)
    if schedule.first_stage_layers is not None:
        first = max(schedule.first_stage_layers, 0)
        stages = (range(first), range(first, entries))
        changes["stages"] = "[" + ", ".join(f"[{', '.join(map(str, stage))}]" for stage in stages) + "]"
    return revise(program, **changes) if changes else program


@lru_cache(maxsize=None)
def variant_program(schedule: BenchmarkSchedule, name: str):
    """The checked program of system ``name``: the base program revised on the keys the name changes (a peer:
    the base program); ``ScheduleError`` for a revision the checker refuses."""
    from schedlang.compiler import revise

    changes = system_changes(name)
    return revise(base_program(schedule), **changes) if changes else base_program(schedule)


def system_program(
    schedule: BenchmarkSchedule, name: str, length: int | None = None, microbatches: int | None = None,
    dtype: str | None = None,
):
    """:func:`variant_program` at ``length`` tokens per sequence, ``microbatches`` and ``train.dtype = dtype``
    (bf16 on a GPU, fp32 on the CPU), each left as the file has it when None."""
    from schedlang.compiler import revise

    written = {"length": length, "microbatches": microbatches, "dtype": dtype}
    changes = {key: value for key, value in written.items() if value is not None}
    return revise(variant_program(schedule, name), **changes) if changes else variant_program(schedule, name)


def scale_text(n_stages: int, n_microbatches: int, n_chunks: int, stage_orders: list[str] | None = None) -> str:
    """The scale benchmarks' schedule at ``n_stages`` x ``n_microbatches`` x ``n_chunks``: the file revised on its
    sizes (one layer per stage, 64 tokens per chunk). With ``stage_orders`` (each stage's tasks, as written after
    ``stage r:``), the same with every task written out in place of ``order = 1f1b``: task lines are no key, so
    they are written into the revised text."""
    from schedlang.compiler import Pass, compile_schedule, revise

    program = revise(
        compile_schedule(SCALE_SCHEDULE, through=Pass.CHECK).program, layers=f"[gla] * {n_stages}",
        pipeline=n_stages, microbatches=n_microbatches, chunks=n_chunks, length=64 * n_chunks,
    )
    if stage_orders is None:
        return program.source_text
    lines = "".join(f"\n  stage {stage}: {order}" for stage, order in enumerate(stage_orders))
    return program.source_text.replace("order        = 1f1b", "order        = explicit" + lines, 1)


@dataclass(frozen=True)
class RuntimeConfigs:
    """What a compiled training script hands the runtime: its MODEL, PIPELINE and TRAIN."""

    model: object
    pipeline: object
    train: object


def runtime_configs(program) -> RuntimeConfigs:
    """Compile ``program`` as ``schedlang compile`` does and return the runtime configs of its script.

    ``schedlang.compiler.compile_schedule`` runs every pass (order, legality, placement, codegen); the
    module-level MODEL, PIPELINE and TRAIN of the training script it renders are the configs returned
    (:func:`script_configs`): the benchmark runs the generated script's own values. Raises
    ``IllegalScheduleError`` for orders that break Eq. 8 or deadlock.
    """
    from schedlang.compiler import compile_schedule

    return script_configs(compile_schedule(program, script_name="benchmark_train.py").script)


def system_configs(
    schedule: BenchmarkSchedule, name: str, length: int, microbatches: int, dtype: str
) -> RuntimeConfigs:
    """The runtime configs of system ``name`` (a peer, or a schedlang system) on ``schedule``."""
    return runtime_configs(system_program(schedule, name, length, microbatches, dtype))


def predicted_reserved_bytes(program) -> tuple[float, ...]:
    """The memory model's reserved peak of each stage of ``program`` (what ``schedlang simulate`` prints), in
    bytes."""
    from schedlang.lowering.memory_peak import predict_memory

    return tuple(stage.reserved for stage in predict_memory(program))


def script_configs(script: str) -> RuntimeConfigs:
    """MODEL, PIPELINE and TRAIN of a generated training script, read without running it.

    The script's module-level assignments are evaluated as literals: constants, tuples, lists, dicts, names
    assigned earlier in the script (``STAGE_0_ACTIONS``), and calls, with keyword or positional literals, of
    the dataclasses the script imports from ``schedlang.runtime`` and ``schedlang.vocabulary``. Anything else
    raises ValueError naming its line: a generated script holds nothing else at module level
    (lowering/codegen.py: user values appear only as literals).
    """
    records: dict[str, type] = {}
    values: dict[str, object] = {}
    for node in ast.parse(script).body:
        module_name = (node.module or "") if isinstance(node, ast.ImportFrom) else ""
        if module_name.startswith(("schedlang.runtime.", "schedlang.vocabulary")):
            module = importlib.import_module(node.module)
            for alias in node.names:
                imported = getattr(module, alias.name)
                if isinstance(imported, type) and dataclasses.is_dataclass(imported):
                    records[alias.asname or alias.name] = imported
        elif isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            values[node.targets[0].id] = _literal(node.value, records, values)
    missing = [name for name in ("MODEL", "PIPELINE", "TRAIN") if name not in values]
    if missing:
        raise ValueError(f"the training script assigns no {', '.join(missing)}")
    return RuntimeConfigs(values["MODEL"], values["PIPELINE"], values["TRAIN"])


def _literal(node: ast.expr, records: dict[str, type], values: dict[str, object]):
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, (ast.Tuple, ast.List)):
        items = [_literal(item, records, values) for item in node.elts]
        return tuple(items) if isinstance(node, ast.Tuple) else items
    if isinstance(node, ast.Dict) and None not in node.keys:
        pairs = zip(node.keys, node.values)
        return {_literal(key, records, values): _literal(value, records, values) for key, value in pairs}
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub) and isinstance(node.operand, ast.Constant):
        return -node.operand.value
    if isinstance(node, ast.Name) and node.id in values:
        return values[node.id]
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in records:
        unpacked = any(keyword.arg is None for keyword in node.keywords)
        if unpacked or any(isinstance(argument, ast.Starred) for argument in node.args):
            raise ValueError(f"line {node.lineno}: unpacked arguments in {node.func.id}(...)")
        arguments = [_literal(argument, records, values) for argument in node.args]
        keywords = {keyword.arg: _literal(keyword.value, records, values) for keyword in node.keywords}
        return records[node.func.id](*arguments, **keywords)
    raise ValueError(f"line {node.lineno}: {ast.unparse(node)!r} is not a literal of the training script")
