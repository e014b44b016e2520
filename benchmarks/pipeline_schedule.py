"""The pipeline benchmark's systems as schedule text, compiled by schedlang's own front end and code generator.

Every schedlang system that benchmarks/pipeline.py measures is a ``.sched`` file: :func:`schedule_text` fills
one template with the model (:class:`BenchmarkModel`) and the ``sequence`` / ``pipeline`` keys of the system
(:class:`ScheduleKeys`, named as docs/language.md names them), and :func:`compile_schedule_text` runs it
through the passes ``schedlang compile`` runs, so a system the checker refuses is not measured and a measured
system is exactly what a user's schedule with those keys trains. The torch peer takes its model and stage
split from the same text.

The command line keeps its short system names (``schedlang:8g+2wfd2``); :func:`variant_keys` is the one place
that maps such a name to schedule keys.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from schedlang.vocabulary import CudaGraphs, Recompute, StageRecompute, recompute_text, stage_recompute

SCHEDULE_FILENAME = "<pipeline benchmark>"
"""The file name diagnostics give for the generated schedule text."""

TORCH_SYSTEM = "torch"
"""The peer system's name: torch.distributed.pipelining's Schedule1F1B over full-sequence microbatches."""

TORCH_CHECKPOINTED_SYSTEM = "torch+ckpt"
"""The second peer: the same Schedule1F1B with torch's activation checkpointing on every block
(``torch.distributed.algorithms._checkpoint.checkpoint_wrapper``, non-reentrant), as torchtitan applies it."""

TORCH_SYSTEMS = (TORCH_SYSTEM, TORCH_CHECKPOINTED_SYSTEM)


@dataclass(frozen=True)
class BenchmarkModel:
    """The benchmark's model as ``model`` block values: ``layers`` blocks of GLA and a SwiGLU MLP.

    ``split_mlp`` writes the layer list as ``[gla, mlp] * layers`` ([Note: separate MLP layers]): the same
    network, with stage boundaries possible between a mixer and its MLP. ``first_stage_layers`` counts the
    entries of the layer list on stage 0 (None: half); stage 1 also holds the LM head and the loss.
    ``pipeline_stages`` is ``mesh.pipeline``: 2, or 1 for the whole model on one device (benchmarks/one_device.py).
    ``mixer``: the layer kind of every mixing layer (``gla``; ``mamba2`` for one_device.py's mamba2 systems).
    """

    vocab: int
    d_model: int
    layers: int
    heads: int
    head_dim: int
    mlp_ratio: float
    split_mlp: bool = False
    first_stage_layers: int | None = None
    pipeline_stages: int = 2
    mixer: str = "gla"

    @property
    def layer_list_text(self) -> str:
        return f"[{self.mixer}, mlp] * {self.layers}" if self.split_mlp else f"[{self.mixer}] * {self.layers}"

    @property
    def n_layer_entries(self) -> int:
        return self.layers * (2 if self.split_mlp else 1)

    @property
    def stages_text(self) -> str:
        entries = self.n_layer_entries
        if self.pipeline_stages == 1:
            return "[[" + ", ".join(str(layer) for layer in range(entries)) + "]]"
        first = entries // 2 if self.first_stage_layers is None else self.first_stage_layers
        stages = (range(max(first, 0)), range(max(first, 0), entries))
        return "[" + ", ".join("[" + ", ".join(str(layer) for layer in stage) + "]" for stage in stages) + "]"


FULL_MODEL = BenchmarkModel(vocab=32000, d_model=2048, layers=16, heads=16, head_dim=128, mlp_ratio=8 / 3)
"""About 1B parameters: the model of every PP2 row in docs/benchmarks.md."""
TINY_MODEL = BenchmarkModel(vocab=256, d_model=64, layers=4, heads=2, head_dim=32, mlp_ratio=2.0)
"""A model small enough to run the whole benchmark path on the CPU."""


@dataclass(frozen=True)
class ScheduleKeys:
    """The keys of ``sequence`` and ``pipeline`` that tell one schedlang system from another."""

    chunks: int
    cuda_graphs: CudaGraphs = CudaGraphs.NONE
    extra_warmup: int = 0
    split_backward: bool = False
    forward_before_weight: bool = False
    extra_deferred_weights: int = 0
    recompute: StageRecompute = Recompute.NONE
    offload: bool = False


GRAPH_LETTERS = {"": CudaGraphs.NONE, "g": CudaGraphs.CHUNK_SLOTS, "s": CudaGraphs.STEP}
"""The letter after a system's chunk count: no graphs, per-chunk graph slots, or step graphs."""

VARIANT_PATTERN = re.compile(
    r"schedlang:(?P<chunks>\d+)(?P<graphs>[gs]?)(?:\+(?P<extra>\d+))?"
    r"(?:(?P<split>w)(?P<forward_first>f?)(?:d(?P<deferred>\d+))?)?"
    r"(?:/(?P<recompute>(?:none|mlp|mixer|full)(?:,(?:none|mlp|mixer|full))*))?(?P<offload>/offload)?"
)


def _recompute_of(written: str | None) -> StageRecompute:
    """``mlp`` (every stage), ``full,none`` (one mode per stage) or nothing (``none``)."""
    if written is None:
        return Recompute.NONE
    modes = written.split(",")
    return stage_recompute(modes if len(modes) > 1 else modes[0])


def variant_keys(name: str) -> ScheduleKeys:
    """The schedule keys of a system name:
    ``schedlang:<chunks>[g|s][+<extra>][w[f][d<deferred>]][/<recompute>][/offload]``.

    ``g``: ``cuda_graphs = true`` (per-chunk slots); ``s``: ``cuda_graphs = step``; ``+E``: ``extra_warmup = E``; ``w``: ``split_backward = true``, then ``f``:
    ``forward_before_weight = true`` and ``dD``: ``extra_deferred_weights = D``; ``/mlp``, ``/mixer``, ``/full``:
    ``recompute``, or one mode per stage separated by commas (``/full,none``); ``/offload``: ``offload = true``. The peers (``torch``, ``torch+ckpt``) get the keys of one
    chunk, which fix their model and stage split. Raises ValueError for any other name.
    """
    if name in TORCH_SYSTEMS:
        return ScheduleKeys(chunks=1)
    match = VARIANT_PATTERN.fullmatch(name)
    if match is None:
        raise ValueError(
            f"{name!r}: a schedlang system is schedlang:<chunks>[g|s][+<extra>][w[f][d<deferred>]][/<recompute>][/offload]"
        )
    return ScheduleKeys(
        chunks=int(match["chunks"]),
        cuda_graphs=GRAPH_LETTERS[match["graphs"]],
        extra_warmup=int(match["extra"] or 0),
        split_backward=bool(match["split"]),
        forward_before_weight=bool(match["forward_first"]),
        extra_deferred_weights=int(match["deferred"] or 0),
        recompute=_recompute_of(match["recompute"]),
        offload=bool(match["offload"]),
    )


SCHEDULE_TEMPLATE = """\
schedule pipeline_benchmark

model {{
  vocab    = {model.vocab}
  d_model  = {model.d_model}
  layers   = {model.layer_list_text}
  heads    = {model.heads}
  head_dim = {model.head_dim}
  mlp      = swiglu(ratio = {model.mlp_ratio!r})
  stages   = {model.stages_text}
}}

mesh {{
  pipeline = {model.pipeline_stages}
}}

sequence {{
  length = {length}
  chunks = {keys.chunks}
}}

pipeline {{
  microbatches           = {microbatches}
  order                  = 1f1b
  cuda_graphs            = {cuda_graphs}
  extra_warmup           = {keys.extra_warmup}
  split_backward         = {split_backward}
  recompute              = {recompute}
  offload                = {offload}
{weight_placement}}}

train {{
  steps     = 1
  seed      = 0
  optimizer = adamw(lr = 1e-4)
  dtype     = {dtype}
{master_weights}  data      = synthetic(seed = 0)
}}
"""


def _flag(value: bool) -> str:
    return "true" if value else "false"


def schedule_text(model: BenchmarkModel, keys: ScheduleKeys, length: int, microbatches: int, dtype: str) -> str:
    """The ``.sched`` text of one system: ``model`` on two pipeline stages, 1F1B over ``keys.chunks`` chunks.

    ``dtype`` is a ``train.dtype`` name (bf16 on a GPU, fp32 on the CPU); a 16-bit dtype is written with
    ``master_weights = false``, so that schedlang keeps what the torch peer keeps (16-bit parameters,
    gradients and AdamW state) and only the schedules differ. ``forward_before_weight`` and
    ``extra_deferred_weights`` are written only with ``split_backward``, the only place the language takes them.
    """
    weight_placement = ""
    if keys.split_backward:
        weight_placement = (
            f"  forward_before_weight  = {_flag(keys.forward_before_weight)}\n"
            f"  extra_deferred_weights = {keys.extra_deferred_weights}\n"
        )
    return SCHEDULE_TEMPLATE.format(
        model=model,
        keys=keys,
        length=length,
        microbatches=microbatches,
        cuda_graphs=keys.cuda_graphs.value,
        split_backward=_flag(keys.split_backward),
        recompute=recompute_text(keys.recompute),
        offload=_flag(keys.offload),
        weight_placement=weight_placement,
        dtype=dtype,
        master_weights="" if dtype in ("fp32", "fp64") else "  master_weights = false\n",
    )


@dataclass(frozen=True)
class RuntimeConfigs:
    """What a compiled training script hands the runtime: its MODEL, PIPELINE and TRAIN."""

    model: object
    pipeline: object
    train: object


def compile_schedule_text(text: str) -> RuntimeConfigs:
    """Compile schedule text as ``schedlang compile`` does and return the runtime configs of its script.

    ``schedlang.compiler.compile_schedule`` runs every pass (parse, check, order, legality, placement, codegen);
    the module-level MODEL, PIPELINE and TRAIN of the training script it renders are the configs returned: the
    benchmark runs the generated script's own values. Raises ``ScheduleError`` (parse, check: including what the
    runtime cannot run) or ``IllegalScheduleError``.
    """
    from schedlang.compiler import ScheduleText, compile_schedule

    script = compile_schedule(ScheduleText(text, SCHEDULE_FILENAME), script_name="pipeline_benchmark_train.py").script
    namespace = {"__name__": "pipeline_benchmark_train"}
    exec(compile(script, "<pipeline_benchmark_train.py>", "exec"), namespace)
    return RuntimeConfigs(namespace["MODEL"], namespace["PIPELINE"], namespace["TRAIN"])


def system_configs(name: str, model: BenchmarkModel, length: int, microbatches: int, dtype: str) -> RuntimeConfigs:
    """The runtime configs of the system ``name`` (``torch`` or a schedlang variant) on ``model``."""
    return compile_schedule_text(schedule_text(model, variant_keys(name), length, microbatches, dtype))


def predicted_reserved_bytes(name: str, model: BenchmarkModel, length: int, microbatches: int, dtype: str) -> tuple[float, ...]:
    """The memory model's reserved peak of each stage of schedlang system ``name`` (what ``schedlang simulate``
    prints), in bytes."""
    from schedlang.compiler import Pass, ScheduleText, compile_schedule
    from schedlang.lowering.memory_peak import predict_memory

    text = schedule_text(model, variant_keys(name), length, microbatches, dtype)
    program = compile_schedule(ScheduleText(text, SCHEDULE_FILENAME), through=Pass.CHECK).program
    return tuple(stage.reserved for stage in predict_memory(program))
