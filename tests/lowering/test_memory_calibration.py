"""The memory model's per-chunk activation bytes against what the runtime's layers keep, on the CPU.

Each case builds one stage of ``schedlang.runtime.model`` from a schedule (three stages of one layer each,
so the first, a middle and the last stage are all measured), runs one chunk's forward and counts what the
chunk keeps for its backward: every tensor autograd saves in a graph that is still alive after the forward
(``torch.autograd.graph.saved_tensors_hooks``),
every tensor the forward left alive in Python (a checkpoint's inputs, an autograd.Function's context),
deduplicated by storage, leaving out the parameters, the step's token ids, the chunk's output and final
states (terms of their own) and the sequence-wide K/V buffers (a term of their own). The model, asked for
the CPU's norm ([Note: activation bytes]), must be within 10 %.
"""

from __future__ import annotations

import gc
import inspect
import weakref

import pytest
import torch

from schedlang.frontend import load_program_text
from schedlang.lowering.memory_terms import RUNTIME_KERNEL_CHUNK, Device, chunk_activation_bytes
from schedlang.lowering.program import Recompute
from schedlang.runtime.kv_buffers import ChunkPosition, SequenceKV
from schedlang.runtime.model import build_stage_model

TOLERANCE = 0.10
LENGTH = 256  # four kernel chunks of 64 tokens
CHUNK = 128


def schedule_text(kind: str, dtype: str, recompute: str, model_keys: str = "") -> str:
    return f"""\
schedule calibration
model {{
  vocab    = 256
  d_model  = 64
  layers   = [{kind}] * 3
  heads    = 2
  head_dim = 32
  mlp      = swiglu(ratio = 4)
  {model_keys}
}}
mesh {{ pipeline = 3 }}
sequence {{
  length       = {LENGTH}
  chunks       = {LENGTH // CHUNK}
  kernel_chunk = 64
}}
pipeline {{
  microbatches = 1
  order        = 1f1b
  recompute    = {recompute}
}}
train {{
  steps = 1
  dtype = {dtype}
}}
"""


TORCH_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


class SavedTensor:
    """What autograd keeps for one saved tensor: alive as long as the graph that saved it."""

    __slots__ = ("tensor", "__weakref__")

    def __init__(self, tensor: torch.Tensor) -> None:
        self.tensor = tensor


def _storage(tensor: torch.Tensor) -> tuple[int, int]:
    storage = tensor.untyped_storage()
    return storage.data_ptr(), storage.nbytes()


def _live_tensor_storages() -> dict[int, int]:
    gc.collect()
    return dict(_storage(obj) for obj in gc.get_objects() if isinstance(obj, torch.Tensor) and obj.device.type == "cpu")


def build_stage(program, stage: int, recompute: Recompute):
    config = program.model
    options = {}
    if recompute in (Recompute.MLP, Recompute.MIXER):
        options["recompute"] = recompute  # the runtime's keyword once it runs these modes
    return build_stage_model(
        config, program.stage_layers[stage], stage == 0, stage == program.n_stages - 1, 0,
        torch.device("cpu"), TORCH_DTYPES[program.train.dtype.value], **options,
    )


def kept_bytes(program, stage: int, recompute: Recompute) -> int:
    """Bytes chunk 1 of microbatch 0 keeps on ``stage`` after its forward (see the module docstring)."""
    torch.manual_seed(0)
    model = build_stage(program, stage, recompute)
    dtype = TORCH_DTYPES[program.train.dtype.value]
    start, end = CHUNK, 2 * CHUNK
    tokens = torch.randint(0, program.model.vocab, (1, LENGTH + 1))
    targets = tokens[:, start + 1 : end + 1].clone()
    if stage == 0:
        inputs = tokens[:, start:end]
    else:
        inputs = torch.randn(1, end - start, program.model.d_model, dtype=dtype).requires_grad_(True)
    kv = SequenceKV(LENGTH)
    position = ChunkPosition(kv, 0, start, end)
    before = _live_tensor_storages()
    holders: list[tuple[weakref.ref, int, int]] = []

    def pack(tensor: torch.Tensor) -> SavedTensor:
        holder = SavedTensor(tensor)
        holders.append((weakref.ref(holder), *_storage(tensor)))
        return holder

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda holder: holder.tensor):
        # chunk 1 without its initial states: they are the state term's, and the kernels take None as zeros
        hidden, final_states = model(inputs, [None] * model.n_states, position)
        output = model.loss(hidden, targets) if model.is_last else hidden
        del hidden  # the last stage's hidden states count only where autograd saved them
    gc.collect()
    kept = {key: size for holder, key, size in holders if holder() is not None}  # saved by a graph still alive
    kept.update({key: size for key, size in _live_tensor_storages().items() if key not in before})
    excluded = {_storage(parameter)[0] for parameter in model.parameters()}
    excluded |= {_storage(tokens)[0], _storage(output)[0]}
    excluded |= {_storage(state)[0] for state in final_states if state is not None}
    for layer_buffers in kv.open.values():
        excluded |= {_storage(tensor)[0] for tensor in (layer_buffers.keys, layer_buffers.values)}
    return sum(size for key, size in kept.items() if key not in excluded)


def predicted_bytes(program, stage: int, recompute: Recompute) -> float:
    return chunk_activation_bytes(program, stage, 1, recompute, Device.CPU)


KINDS = ("gla", "simple_gla", "gdn", "mamba2", "mamba3", "attn")


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
@pytest.mark.parametrize("kind", KINDS)
def test_saved_bytes_without_recompute(kind, dtype):
    program = load_program_text(schedule_text(kind, dtype, "none"))
    for stage in range(program.n_stages):
        measured = kept_bytes(program, stage, Recompute.NONE)
        predicted = predicted_bytes(program, stage, Recompute.NONE)
        assert predicted == pytest.approx(measured, rel=TOLERANCE), (kind, dtype, stage, measured, predicted)


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_saved_bytes_of_gla_with_its_output_gate(dtype):
    """``output_gate = swish``: the fused per-head norm and gate keeps its values and the gate, nothing more."""
    program = load_program_text(schedule_text("gla", dtype, "none", "output_gate = swish"))
    for stage in range(program.n_stages):
        measured = kept_bytes(program, stage, Recompute.NONE)
        predicted = predicted_bytes(program, stage, Recompute.NONE)
        assert predicted == pytest.approx(measured, rel=TOLERANCE / 5), (dtype, stage, measured, predicted)


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_saved_bytes_of_attention_with_heads_of_its_own(dtype):
    """attn layers wider than the model's heads, with grouped key/value heads and q/k/v biases."""
    keys = "attn_heads = 8  attn_head_dim = 32  attn_kv_heads = 2  qkv_bias = true"
    program = load_program_text(schedule_text("attn", dtype, "none", keys))
    assert program.model.attention_geometry.query_width == 4 * 64  # four times the model's heads * head_dim
    for stage in range(program.n_stages):
        measured = kept_bytes(program, stage, Recompute.NONE)
        predicted = predicted_bytes(program, stage, Recompute.NONE)
        assert predicted == pytest.approx(measured, rel=TOLERANCE), (dtype, stage, measured, predicted)


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
@pytest.mark.parametrize(
    "keys",
    [
        "value_heads = 4",
        "expand_k = 0.5",
        "expand_k = 2",
        "delta_gates = mamba  short_conv_size = 4",
        "value_heads = 4  expand_k = 0.5  delta_gates = mamba  short_conv_size = 4",
    ],
)
def test_saved_bytes_of_gdn_with_fla_options(keys, dtype):
    """gdn layers with grouped value heads, narrower or wider keys, Mamba gates and short convolutions: what
    the model counts by value, key and query widths (and the convolutions' history rows) is what they keep."""
    program = load_program_text(schedule_text("gdn", dtype, "none", keys))
    for stage in range(program.n_stages):
        measured = kept_bytes(program, stage, Recompute.NONE)
        predicted = predicted_bytes(program, stage, Recompute.NONE)
        assert predicted == pytest.approx(measured, rel=TOLERANCE / 5), (keys, dtype, stage, measured, predicted)


@pytest.mark.parametrize("kind", KINDS)
def test_full_recompute_keeps_the_chunk_input_only(kind):
    """``recompute = full``: the executor runs the forward under no_grad and keeps its inputs."""
    program = load_program_text(schedule_text(kind, "bf16", "full"))
    for stage in range(program.n_stages):
        with torch.no_grad():
            measured = kept_bytes(program, stage, Recompute.FULL)
        input_bytes = 0 if stage == 0 else CHUNK * program.model.d_model * 2  # the record keeps the received input
        assert predicted_bytes(program, stage, Recompute.FULL) == measured + input_bytes


def _runtime_recomputes(program, recompute: Recompute) -> str | None:
    """Why ``recompute`` cannot be calibrated yet, or None when the runtime runs it."""
    if "recompute" not in inspect.signature(build_stage_model).parameters:
        return f"the runtime does not run recompute = {recompute.value} yet: build_stage_model takes no recompute mode"
    if kept_bytes(program, 1, recompute) == kept_bytes(program, 1, Recompute.NONE):
        return f"the runtime runs recompute = {recompute.value} as none: the chunk keeps the same bytes"
    return None


@pytest.mark.parametrize("recompute", [Recompute.MLP, Recompute.MIXER])
@pytest.mark.parametrize("kind", KINDS)
def test_saved_bytes_with_part_recompute(kind, recompute):
    program = load_program_text(schedule_text(kind, "bf16", recompute.value))
    reason = _runtime_recomputes(program, recompute)
    if reason is not None:
        pytest.skip(reason)
    for stage in range(program.n_stages):
        measured = kept_bytes(program, stage, recompute)
        predicted = predicted_bytes(program, stage, recompute)
        assert predicted == pytest.approx(measured, rel=TOLERANCE), (kind, recompute, stage, measured, predicted)


def test_the_model_tiles_by_the_kernels_chunk():
    from schedlang.kernels.common import CHUNK_SIZE

    assert RUNTIME_KERNEL_CHUNK == CHUNK_SIZE


@pytest.mark.skipif(torch.cuda.is_available(), reason="the interpreter's case: CPU tensors, TRITON_INTERPRET=1")
def test_mamba2_on_the_triton_kernels_keeps_b_and_c_by_group(monkeypatch):
    """The Triton kernels (here Triton's interpreter, tests/conftest.py) read C and B by group: the operator
    keeps no per-head copies of them, which the model counts on CUDA and not on the PyTorch path."""
    from schedlang.lowering.memory_terms import mamba2_operator_bytes_per_token, program_sizes
    from schedlang.runtime.mixer_base import KERNEL_BACKEND_VARIABLE

    monkeypatch.setenv(KERNEL_BACKEND_VARIABLE, "triton")
    program = load_program_text(schedule_text("mamba2", "fp32", "none"))
    sizes = program_sizes(program)
    copies = CHUNK * (mamba2_operator_bytes_per_token(sizes, Device.CPU)
                      - mamba2_operator_bytes_per_token(sizes, Device.CUDA))
    assert copies == CHUNK * 2 * sizes.heads * sizes.mamba2.state_size * 4  # one mamba2 layer a stage, float32
    for stage in range(program.n_stages):
        measured = kept_bytes(program, stage, Recompute.NONE)
        predicted = predicted_bytes(program, stage, Recompute.NONE) - copies
        assert predicted == pytest.approx(measured, rel=TOLERANCE), (stage, measured, predicted)
        assert predicted + copies != pytest.approx(measured, rel=TOLERANCE)  # the per-head count misses it
