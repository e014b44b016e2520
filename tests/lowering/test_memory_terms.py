"""Each term of the memory model (lowering/memory_terms.py) and the peak walk (lowering/memory_peak.py)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from schedlang.compiler import revise
from schedlang.frontend import load_program_text
from schedlang.lowering.memory import stateflow_peak_activations
from schedlang.lowering.memory_peak import (
    OFFLOAD_RESIDENT_CHUNKS,
    RESERVED_PER_ALLOCATED,
    Component,
    graph_slots,
    predict_memory,
)
from schedlang.lowering.memory_terms import (
    Device,
    StaticPart,
    activation_message_bytes,
    chunk_activation_bytes,
    head_chunk_bytes,
    key_value_bytes,
    mixer_bytes_per_token,
    mlp_bytes_per_token,
    norm_bytes_per_row,
    program_sizes,
    stage_bytes_per_token,
    stage_chunk_constant_bytes,
    state_bytes,
    reduced_gradient_bytes,
    static_bytes,
    transient_bytes,
)
from schedlang.lowering.orders import stage_orders
from schedlang.lowering.parameters import stage_parameters
from schedlang.lowering.program import Recompute
from schedlang.vocabulary import LayerKind


def schedule(layers: str = "[gla] * 4", dtype: str = "bf16", pipeline: str = "", train: str = "",
             stages: int = 2, chunks: int = 4, microbatches: int = 4, mesh: str = "") -> str:
    return f"""\
schedule terms
model {{
  vocab    = 256
  d_model  = 64
  layers   = {layers}
  heads    = 2
  head_dim = 32
  mlp      = swiglu(ratio = 4)
}}
mesh {{ pipeline = {stages} {mesh} }}
sequence {{
  length       = 1024
  chunks       = {chunks}
  kernel_chunk = 64
}}
pipeline {{
  microbatches = {microbatches}
  order        = 1f1b
  {pipeline}
}}
train {{
  steps = 1
  dtype = {dtype}
  {train}
}}
"""


def program_of(**options):
    return load_program_text(schedule(**options))


# d = 64, H = 2, D = 32, W = 64, h = 256, V = 256; bf16: e = 2, f = 4


def test_norm_keeps_its_input_and_rstd_on_cuda_and_two_fp32_rows_on_the_cpu():
    sizes = program_sizes(program_of())
    assert norm_bytes_per_row(64, sizes, Device.CUDA) == 64 * 2 + 4
    assert norm_bytes_per_row(64, sizes, Device.CPU) == 2 * 64 * 4 + 4


@pytest.mark.parametrize(
    "kind, expected",
    [
        # shared: norm 132 + normed input 128 + output projection's input 128 = 388
        (LayerKind.GLA, 388 + 4 * 128 + 64 * 4),  # q, k, v, gate logits; the fp32 log-gate
        (LayerKind.SIMPLE_GLA, 388 + 3 * 128 + 2 * 2 + 2 * 4),  # q, k, v; one gate per head
        (LayerKind.ATTN, 388 + 128 + 2 * 4),  # q; the log-sum-exp
        # raw q, k, the fused output norm's values and gate; five per-head tensors; the Triton operator's q, k,
        # v and its fp32 C x C inverse, gate cumsum, gate, beta, chunk decay per head
        (LayerKind.GDN, 388 + 4 * 128 + 5 * 2 * 2 + 3 * 128 + 4 * 2 * (64 + 3 + 1 / 64)),
        (LayerKind.MLP, 0),
    ],
)
def test_mixer_bytes_per_token(kind, expected):
    assert mixer_bytes_per_token(kind, program_sizes(program_of()), Device.CUDA) == pytest.approx(expected)


def test_gdn_keeps_the_batched_pytorch_operands_on_the_cpu():
    # the CPU's composite input norm (2 w f + 4), and the chunked fp32 operands: 12 W + 6 C H + 5 H + H D^2 / C + H / C
    expected = (2 * 64 * 4 + 4) + 128 + 128 + 4 * 128 + 5 * 2 * 2 + 4 * (
        12 * 64 + 6 * 64 * 2 + 10 + 2 * 32 * 32 / 64 + 2 / 64
    )
    assert mixer_bytes_per_token(LayerKind.GDN, program_sizes(program_of()), Device.CPU) == pytest.approx(expected)


def test_mlp_bytes_per_token():
    # norm, normed input, fused gate-and-up output 2h, activation output h
    assert mlp_bytes_per_token(program_sizes(program_of()), Device.CUDA) == 132 + 128 + 3 * 256 * 2


def test_recompute_modes_keep_each_parts_input():
    program = program_of(stages=2, layers="[gla] * 4")
    mixer = mixer_bytes_per_token(LayerKind.GLA, program_sizes(program), Device.CUDA)
    mlp = mlp_bytes_per_token(program_sizes(program), Device.CUDA)
    per_layer = {
        Recompute.NONE: mixer + mlp,
        Recompute.MLP: mixer + 128,
        Recompute.MIXER: 128 + mlp,
    }
    for recompute, expected in per_layer.items():
        assert stage_bytes_per_token(program, 0, recompute) == pytest.approx(2 * expected)
    # full: the first stage keeps nothing per token (its token ids belong to the step), the others their input
    assert stage_bytes_per_token(program, 0, Recompute.FULL) == 0
    assert stage_bytes_per_token(program, 1, Recompute.FULL) == 128


def test_last_stage_adds_the_head_and_loss():
    program = program_of(stages=2, layers="[gla] * 4")
    difference = stage_bytes_per_token(program, 1, Recompute.NONE) - stage_bytes_per_token(program, 0, Recompute.NONE)
    assert difference == 132 + 128  # final norm, the gradient of its output that the fused loss formed
    sizes = program_sizes(program)
    assert head_chunk_bytes(sizes) == 256 * 64 * 2  # the head's weight gradient, V d e
    constants = [stage_chunk_constant_bytes(program, 1, recompute, Device.CUDA) for recompute in Recompute]
    assert constants == [0 if recompute is Recompute.FULL else 256 * 64 * 2 for recompute in Recompute]


def test_chunk_bytes_scale_with_local_tokens():
    one = program_of(mesh="")
    two = program_of(pipeline="microbatch_size = 2")
    per_token = stage_bytes_per_token(one, 0, Recompute.NONE)
    assert chunk_activation_bytes(one, 0, 0) == pytest.approx(256 * per_token)
    assert chunk_activation_bytes(two, 0, 0) == pytest.approx(512 * per_token)


def test_static_bytes_follow_dtype_and_optimizer():
    adamw = program_of(dtype="bf16", train="master_weights = false")
    parameters = stage_parameters(adamw, 0).total
    assert static_bytes(adamw, 0) == {
        StaticPart.PARAMETERS: 2 * parameters,
        StaticPart.GRADIENTS: 2 * parameters,
        StaticPart.OPTIMIZER: 2 * 2 * parameters,
    }
    momentum = program_of(dtype="fp32", train="optimizer = sgd(lr = 0.1, momentum = 0.9)")
    assert static_bytes(momentum, 0)[StaticPart.OPTIMIZER] == 4 * parameters
    plain = program_of(dtype="fp32", train="optimizer = sgd(lr = 0.1)")
    assert static_bytes(plain, 0)[StaticPart.OPTIMIZER] == 0


def test_static_bytes_with_master_weights():
    """bf16 parameters and gradients plus their fp32 copies, and fp32 AdamW moments: 2 + 4 bytes per parameter
    twice, 2 x 4 for the optimizer (the default for a 16-bit dtype; no master copy for fp32)."""
    master = program_of(dtype="bf16")
    parameters = stage_parameters(master, 0).total
    assert master.train.keeps_master_weights
    assert static_bytes(master, 0) == {
        StaticPart.PARAMETERS: (2 + 4) * parameters,
        StaticPart.GRADIENTS: (2 + 4) * parameters,
        StaticPart.OPTIMIZER: 2 * 4 * parameters,
    }
    assert static_bytes(program_of(dtype="fp16", train="optimizer = sgd(lr = 0.1, momentum = 0.9)"), 0) == {
        StaticPart.PARAMETERS: (2 + 4) * parameters,
        StaticPart.GRADIENTS: (2 + 4) * parameters,
        StaticPart.OPTIMIZER: 4 * parameters,
    }
    fp32 = program_of(dtype="fp32")
    assert not fp32.train.keeps_master_weights
    assert static_bytes(fp32, 0)[StaticPart.PARAMETERS] == 4 * parameters
    # the all-reduce flattens the optimizer's gradients: the fp32 ones
    assert reduced_gradient_bytes(master, 0) == 4 * parameters
    assert reduced_gradient_bytes(program_of(dtype="bf16", train="master_weights = false"), 0) == 2 * parameters


def test_states_and_key_value_buffers():
    hybrid = program_of(layers="[gla, attn] * 2")
    # stage 0 holds [gla, attn]: one recurrent layer, its fp32 state b H D^2 * 4
    assert state_bytes(hybrid, 0) == 1 * 2 * 32 * 32 * 4
    # one attn layer per stage: K and V over the whole sequence, b H T D e
    assert key_value_bytes(hybrid, 0) == 2 * 2 * 1024 * 32 * 2
    assert key_value_bytes(program_of(), 0) == 0


def test_full_recompute_rebuilds_the_chunk_in_its_backwards_transient():
    none = program_of()
    full = program_of(pipeline="recompute = full")
    rebuilt = chunk_activation_bytes(none, 0, 0)
    assert transient_bytes(full, 0, 0) == pytest.approx(transient_bytes(none, 0, 0) + rebuilt)


@pytest.mark.parametrize("stages, chunks, microbatches", [(2, 4, 4), (3, 2, 4), (4, 4, 2), (2, 1, 3)])
def test_activations_at_the_peak_are_the_chunks_in_flight_of_eq13(stages, chunks, microbatches):
    program = program_of(stages=stages, chunks=chunks, microbatches=microbatches, layers=f"[gla] * {stages}")
    closed_form = stateflow_peak_activations(stages, microbatches, chunks)
    for stage, memory in enumerate(predict_memory(program)):
        assert memory.chunks_in_flight == round(closed_form[stage] * chunks)
        if memory.peak_task is not None:
            expected = memory.chunks_in_flight * chunk_activation_bytes(program, stage, 0)
            assert memory.components[Component.ACTIVATIONS] == pytest.approx(expected)
        assert memory.reserved == pytest.approx(RESERVED_PER_ALLOCATED * memory.allocated)


def test_gpipe_first_stage_holds_every_sent_activation_at_its_peak():
    program = revise(program_of(chunks=2, microbatches=3), order="gpipe")
    first = predict_memory(program)[0]
    message = activation_message_bytes(program, 0)
    assert first.peak_task.kind.value == "B"
    # every forward sent its output; the running backward holds its received output gradient
    assert first.components[Component.COMMUNICATION] == pytest.approx((3 * 2 + 1) * message)
    assert first.chunks_in_flight == 6


def test_offload_keeps_at_most_two_chunks_on_the_device():
    # the language's offload key arrives with the runtime's offload (branch recompute); until then the IR field
    program = program_of()
    program = replace(program, pipeline=replace(program.pipeline, offload=True))
    eager = predict_memory(program_of())
    for stage, memory in enumerate(predict_memory(program)):
        chunk = chunk_activation_bytes(program, stage, 0)
        assert memory.components[Component.ACTIVATIONS] <= OFFLOAD_RESIDENT_CHUNKS * chunk + 1e-6
        assert memory.allocated < eager[stage].allocated


def test_cuda_graph_pools_replace_the_activations():
    program = program_of(pipeline="cuda_graphs = true")
    for stage, (memory, order) in enumerate(zip(predict_memory(program), stage_orders(program))):
        slots = graph_slots(program, order)
        assert slots == round(stateflow_peak_activations(2, 4, 4)[stage] * 4)
        pool = chunk_activation_bytes(program, stage, 0) + transient_bytes(program, stage, 0)
        assert memory.components[Component.GRAPH_POOLS] == pytest.approx(slots * pool)
        assert memory.components[Component.ACTIVATIONS] == 0


def test_data_parallel_gradient_reduction_is_a_step_end_moment():
    program = program_of(mesh="data = 2")
    for memory in predict_memory(program):
        assert memory.allocated >= 3 * memory.components[Component.GRADIENTS]


@pytest.mark.parametrize("recompute", ["mlp", "mixer"])
def test_part_recompute_rebuilds_one_part_in_the_backward(recompute):
    none = program_of()
    part = program_of(pipeline=f"recompute = {recompute}")
    sizes = program_sizes(none)
    rebuilt = mlp_bytes_per_token(sizes, Device.CUDA) if recompute == "mlp" else mixer_bytes_per_token(
        LayerKind.GLA, sizes, Device.CUDA
    )
    assert transient_bytes(part, 0, 0) == pytest.approx(transient_bytes(none, 0, 0) + 256 * rebuilt)
    assert chunk_activation_bytes(part, 0, 0) < chunk_activation_bytes(none, 0, 0)


def test_step_graphs_keep_the_eager_walk_and_every_sent_tensor():
    eager = predict_memory(program_of())
    step = predict_memory(program_of(pipeline="cuda_graphs = step"))
    # stage 0 sends every forward's output, stage 1 every backward's input gradient: 4 microbatches x 4 chunks
    total_sent = 4 * 4 * activation_message_bytes(program_of(), 0)
    for stage in range(2):
        assert step[stage].components[Component.GRAPH_POOLS] == 0
        assert step[stage].components[Component.ACTIVATIONS] == pytest.approx(
            eager[stage].components[Component.ACTIVATIONS]
        )
        received = step[stage].components[Component.COMMUNICATION] - total_sent
        assert received in (0, activation_message_bytes(program_of(), 0))
        assert step[stage].allocated >= eager[stage].allocated


def test_memory_is_the_pass_after_placement_and_simulate_reads_its_product():
    from schedlang.compiler import Pass, compile_schedule

    program = revise(program_of(chunks=2, microbatches=3), order="gpipe")
    assert compile_schedule(program, through=Pass.PLACEMENT).memory is None
    compiled = compile_schedule(program, through=Pass.MEMORY)
    assert compiled.memory == predict_memory(program, compiled.orders)
    assert compiled.timeline is None  # the cost pass comes after it
    # the gpipe walk differs from the 1f1b one the unrevised program has: the pass follows the program's orders
    assert compiled.memory != predict_memory(program_of(chunks=2, microbatches=3))
