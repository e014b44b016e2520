"""``attn`` layers with heads of their own (``attn_heads``, ``attn_head_dim``, ``attn_kv_heads``, ``qkv_bias``) in
the parameter count, the FLOPS cost model, the balanced cut and the memory model, against hand counts and the
runtime's model on the CPU; without those keys every number is the one the model's ``heads`` and ``head_dim``
give."""

from __future__ import annotations

import pytest
import torch

from schedlang.frontend import load_program_text
from schedlang.lowering.cost import FlopsCostModel, Hardware, allgather_seconds, attention_pairs, state_scan_seconds
from schedlang.lowering.memory_peak import predict_memory
from schedlang.lowering.memory_terms import (
    Device,
    attention_read_bytes,
    chunk_activation_bytes,
    head_workspace_bytes,
    key_value_bytes,
    layer_workspace_bytes_per_token,
    mixer_bytes_per_token,
    norm_bytes_per_row,
    program_sizes,
    sequence_parallel_bytes,
    transient_bytes,
)
from schedlang.lowering.parameters import stage_parameters
from schedlang.lowering.partition import layer_flop_coefficients
from schedlang.runtime.kv_buffers import ChunkPosition, SequenceKV
from schedlang.runtime.linear import Linear
from schedlang.runtime.model import CausalAttentionMixer, build_stage_model
from schedlang.vocabulary import AttentionGeometry, AttentionOptions, LayerKind, ModelConfig, ModelOptions

D_MODEL, HEADS, HEAD_DIM = 64, 2, 32  # the recurrent layers: W = 64
ATTN_HEADS, ATTN_HEAD_DIM, ATTN_KV_HEADS = 4, 24, 2  # the attn layers: W_a = 96, K/V projections 48 wide
OWN_HEADS = f"attn_heads = {ATTN_HEADS}  attn_head_dim = {ATTN_HEAD_DIM}  attn_kv_heads = {ATTN_KV_HEADS}"
LENGTH = 1024


def schedule(layers: str = "[gla, attn] * 2", attention: str = OWN_HEADS, mlp: str = "swiglu(ratio = 4)",
             stages: int = 2, sequence: int = 1, partition: str = "uniform", dtype: str = "bf16") -> str:
    return f"""\
schedule attention_geometry
model {{
  vocab    = 256
  d_model  = {D_MODEL}
  layers   = {layers}
  heads    = {HEADS}
  head_dim = {HEAD_DIM}
  mlp      = {mlp}
  {attention}
}}
mesh {{ pipeline = {stages}  sequence = {sequence} }}
sequence {{
  length       = {LENGTH}
  chunks       = 4
  kernel_chunk = 64
  partition    = {partition}
}}
pipeline {{ microbatches = 2 }}
train {{ steps = 1  dtype = {dtype} }}
"""


def program_of(**options):
    return load_program_text(schedule(**options))


@pytest.mark.parametrize(
    "options",
    [
        AttentionOptions(),
        AttentionOptions(heads=4),
        AttentionOptions(head_dim=24),
        AttentionOptions(kv_heads=1),
        AttentionOptions(heads=6, head_dim=16, kv_heads=3, qkv_bias=True),
    ],
)
def test_the_geometry_is_the_runtime_attention_layers(options):
    config = ModelConfig(
        vocab=256, d_model=D_MODEL, layers=(LayerKind.ATTN,), heads=HEADS, head_dim=HEAD_DIM,
        options=ModelOptions(attention=options),
    )
    with torch.device("meta"):
        layer = CausalAttentionMixer(config)
    geometry = config.attention_geometry
    assert (geometry.heads, geometry.kv_heads, geometry.head_dim) == (layer.heads, layer.kv_heads, layer.head_dim)
    assert layer.q_proj.weight.shape == (geometry.query_width, D_MODEL)
    assert layer.k_proj.weight.shape == layer.v_proj.weight.shape == (geometry.key_value_width, D_MODEL)


def test_the_front_end_hands_the_keys_to_the_geometry():
    program = program_of()
    assert program.model.attention_geometry == AttentionGeometry(ATTN_HEADS, ATTN_KV_HEADS, ATTN_HEAD_DIM)
    assert program_of(attention="").model.attention_geometry == AttentionGeometry(HEADS, HEADS, HEAD_DIM)


@pytest.mark.parametrize("bias", ["qkv_bias = true", "qkv_bias = false"])
@pytest.mark.parametrize("layers, mlp", [("[gla, attn] * 2", "swiglu(ratio = 4)"), ("[attn, gdn]", "none")])
def test_parameter_counts_equal_the_runtime_model_built_on_the_cpu(bias, layers, mlp):
    program = program_of(layers=layers, mlp=mlp, attention=f"{OWN_HEADS}  {bias}")
    config = program.model
    for stage, indices in enumerate(program.stage_layers):
        built = build_stage_model(
            config, indices, stage == 0, stage == program.n_stages - 1, 0, torch.device("cpu"), torch.float32
        )
        linear_weights = sum(module.weight.numel() for module in built.modules() if isinstance(module, Linear))
        total = sum(parameter.numel() for parameter in built.parameters())
        count = stage_parameters(program, stage)
        assert (count.linear_weights, count.total) == (linear_weights, total), (stage, layers, bias)


def test_attention_parameters_by_hand():
    """Stage 1 of [gla, attn] * 2 without an MLP holds one gla and one attn layer, the final norm and the head."""
    with_bias = program_of(mlp="none", attention=f"{OWN_HEADS}  qkv_bias = true")
    d, query, key_value = D_MODEL, ATTN_HEADS * ATTN_HEAD_DIM, ATTN_KV_HEADS * ATTN_HEAD_DIM
    attention = d * (query + 2 * key_value) + query * d + (query + 2 * key_value) + d  # q, k, v, o; biases; norm
    width = HEADS * HEAD_DIM
    gla = 5 * d * width + width + d  # q, k, v, o, gate; gate bias; norm
    head = d * 256 + d  # LM head and final norm
    assert stage_parameters(with_bias, 1).total == attention + gla + head


@pytest.mark.parametrize("sequence", [1, 2])
def test_mixer_flops_by_hand(sequence):
    """[attn] * 2 on one stage without MLP: a chunk's mixer FLOPs are the projections of the rank's tokens and
    the slowest rank's pairs."""
    program = program_of(layers="[attn] * 2", mlp="none", stages=1, sequence=sequence)
    hardware = Hardware(throughput_flops=1.0)
    model = FlopsCostModel(program, hardware)
    d, query, key_value = D_MODEL, ATTN_HEADS * ATTN_HEAD_DIM, ATTN_KV_HEADS * ATTN_HEAD_DIM
    projections = 2 * d * query + 2 * 2 * d * key_value + 2 * query * d  # q; k and v; o
    pair = 4 * ATTN_HEADS * ATTN_HEAD_DIM  # q k and p v of every query head
    assert (projections, pair) == (36864, 384)
    batch = program.pipeline.microbatch_size
    for chunk in range(program.n_chunks):
        tokens, prefix = program.sequence.chunk_length(chunk), program.sequence.boundaries[chunk]
        pairs = attention_pairs(prefix, tokens, sequence)
        if sequence == 1:
            assert pairs == prefix * tokens + tokens * tokens / 2
        expected = 2 * batch * (tokens / sequence * projections + pairs * pair)
        assert model.forward_parts[0][chunk].mixers == pytest.approx(expected, rel=1e-12)
        # the weight gradients: the projections' FLOPs again, and the LM head's
        weight_flops = batch * tokens / sequence * (2 * projections + 2 * d * 256)
        assert model.weight_seconds[0][chunk] == pytest.approx(weight_flops, rel=1e-12)


def test_balanced_cut_coefficients_by_hand():
    program = program_of(layers="[gla, gla, gla, attn]", mlp="none", stages=1)
    coefficients = layer_flop_coefficients(program.model, 64)
    d, query, key_value = D_MODEL, ATTN_HEADS * ATTN_HEAD_DIM, ATTN_KV_HEADS * ATTN_HEAD_DIM
    assert coefficients.softmax_cost_per_pair == 4 * ATTN_HEADS * ATTN_HEAD_DIM
    assert coefficients.dense_cost_per_token == 2 * d * (2 * query + 2 * key_value) + 2 * d * 256
    width = HEADS * HEAD_DIM  # the gla layers keep the model's heads
    assert coefficients.linear_cost_per_token == 2 * d * 5 * width + HEADS * (4 * 64 * HEAD_DIM + 4 * HEAD_DIM**2)
    balanced = "balanced(alpha = 1)"
    own = program_of(layers="[gla, gla, gla, attn]", stages=1, partition=balanced).sequence.boundaries
    shared = program_of(layers="[gla, gla, gla, attn]", stages=1, partition=balanced, attention="")
    assert own != shared.sequence.boundaries


def test_sequence_parallel_all_gather_is_as_wide_as_the_key_value_heads():
    program = program_of(sequence=2)
    hardware = Hardware()
    model = FlopsCostModel(program, hardware)
    tokens = program.sequence.chunk_length(0)
    batch, element = program.pipeline.microbatch_size, 2
    state = batch * HEADS * HEAD_DIM * HEAD_DIM * 4  # the runtime keeps states in float32
    expected = state_scan_seconds(program.sequence.parallel, 2, program.sequence.scan_blocks, state, hardware)
    expected += allgather_seconds(2, 2 * batch * (tokens // 2) * ATTN_KV_HEADS * ATTN_HEAD_DIM * element, hardware)
    assert model._sequence_parallel_seconds(0, tokens, attention_layers=1) == pytest.approx(expected)
    assert sequence_parallel_bytes(program, 0, 0) == 2 * batch * tokens * ATTN_KV_HEADS * ATTN_HEAD_DIM * element


def test_memory_terms_by_hand():
    """bf16 (e = 2, f = 4), on CUDA: the attn mixer keeps its norm, the normed input, the output projection's
    input and q (``W_a e`` each) and the log-sum-exp (``H_a f``); the K/V buffers are ``2 b T W_kv e``."""
    own, shared = program_of(), program_of(attention="")
    sizes = program_sizes(own)
    norm = norm_bytes_per_row(D_MODEL, sizes, Device.CUDA)
    assert norm == D_MODEL * 2 + 4
    assert mixer_bytes_per_token(LayerKind.ATTN, sizes, Device.CUDA) == norm + D_MODEL * 2 + 2 * 96 * 2 + 4 * 4
    assert mixer_bytes_per_token(LayerKind.ATTN, program_sizes(shared), Device.CUDA) == (
        norm + D_MODEL * 2 + 2 * 64 * 2 + 2 * 4
    )
    # the recurrent layers keep the model's heads
    assert mixer_bytes_per_token(LayerKind.GLA, sizes, Device.CUDA) == mixer_bytes_per_token(
        LayerKind.GLA, program_sizes(shared), Device.CUDA
    )
    batch = own.pipeline.microbatch_size
    assert key_value_bytes(own, 0) == 2 * batch * LENGTH * 48 * 2
    assert key_value_bytes(shared, 0) == 2 * batch * LENGTH * 64 * 2
    # wider attention keeps more in every chunk
    for stage in range(own.n_stages):
        assert chunk_activation_bytes(own, stage, 0) > chunk_activation_bytes(shared, stage, 0)


UNGROUPED = f"attn_heads = {ATTN_HEADS}  attn_head_dim = {ATTN_HEAD_DIM}"


@pytest.mark.parametrize("sequence", [1, 2])
def test_grouped_heads_shrink_the_key_value_buffers_and_gather_by_the_group(sequence):
    """The K/V buffers (and so their gradient buffers) and the all-gathered K/V are ``H_kv`` heads wide:
    ``H_a / H_kv`` times fewer bytes than the same attention without groups."""
    grouped, ungrouped = program_of(sequence=sequence), program_of(attention=UNGROUPED, sequence=sequence)
    groups = ATTN_HEADS // ATTN_KV_HEADS
    for stage in range(grouped.n_stages):
        assert key_value_bytes(ungrouped, stage) == groups * key_value_bytes(grouped, stage) > 0
        for chunk in range(grouped.n_chunks):
            if sequence > 1:
                assert sequence_parallel_bytes(ungrouped, stage, chunk) == groups * sequence_parallel_bytes(
                    grouped, stage, chunk
                )


@pytest.mark.parametrize("sequence", [1, 2])
def test_the_grouped_read_is_one_part_at_query_head_width_in_the_attn_backward(sequence):
    """``4 b P W_a x``: the longest part's keys and values read at query-head width and their gradients, ``P``
    the longer of the slowest rank's prefix and its slice; in ``train.dtype`` on the CPU and, for a 16-bit
    model whose head width flash attention takes (24 here), on CUDA; in the memory-efficient kernels' float32
    for one it does not (20); nothing without groups, and it enters the transient of the stages with an attn
    layer."""
    grouped, ungrouped = program_of(sequence=sequence), program_of(attention=UNGROUPED, sequence=sequence)
    odd_width = program_of(attention=OWN_HEADS.replace(f"attn_head_dim = {ATTN_HEAD_DIM}", "attn_head_dim = 20"),
                           sequence=sequence)
    batch = grouped.pipeline.microbatch_size
    for chunk in range(grouped.n_chunks):
        start, length = grouped.sequence.boundaries[chunk], grouped.sequence.chunk_length(chunk)
        last_slice = -(-length // sequence)
        longest = max(start + length - last_slice, last_slice)
        assert attention_read_bytes(grouped, chunk, Device.CUDA) == 4 * batch * longest * 96 * 2
        assert attention_read_bytes(grouped, chunk, Device.CPU) == 4 * batch * longest * 96 * 2
        assert attention_read_bytes(odd_width, chunk, Device.CUDA) == 4 * batch * longest * 80 * 4
        assert attention_read_bytes(ungrouped, chunk, Device.CUDA) == 0
    last = grouped.n_chunks - 1
    attention_only = program_of(layers="[attn] * 2", mlp="none", stages=1, sequence=sequence)
    read = attention_read_bytes(attention_only, last, Device.CUDA)
    assert read > 0
    sizes = program_sizes(attention_only)
    tokens = attention_only.pipeline.microbatch_size * attention_only.sequence.chunk_length(last) / sequence
    attention = tokens * layer_workspace_bytes_per_token(attention_only.model, LayerKind.ATTN, sizes, Device.CUDA)
    head = head_workspace_bytes(sizes, tokens)
    assert attention < head < attention + read  # the read makes the attn layer's backward the largest
    rest = tokens * 2 * D_MODEL * 2 + sequence_parallel_bytes(attention_only, 0, last)
    assert transient_bytes(attention_only, 0, last) == pytest.approx(attention + read + rest)


def _opened_buffer_bytes(attention: str) -> tuple[int, int, float]:
    """(K/V buffer bytes, gradient buffer bytes) the runtime opens on the CPU for one microbatch of stage 0
    of ``[attn, gla]`` (two chunks forward, their backwards in reverse), and :func:`key_value_bytes`."""
    program = program_of(layers="[attn, gla]", dtype="fp32", attention=attention)
    config = program.model
    model = build_stage_model(config, program.stage_layers[0], True, False, 0, torch.device("cpu"), torch.float32)
    kv = SequenceKV(LENGTH)
    generator = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, 256, (program.pipeline.microbatch_size, LENGTH), generator=generator)
    bounds = program.sequence.boundaries[:3]
    outputs, states = [], [None] * model.n_states
    for start, end in zip(bounds, bounds[1:]):
        hidden, states = model(tokens[:, start:end], states, ChunkPosition(kv, 0, start, end))
        outputs.append(hidden)
    for hidden in reversed(outputs):
        hidden.square().sum().backward(retain_graph=True)
    (buffers,) = kv.open.values()
    opened = buffers.keys.nbytes + buffers.values.nbytes
    return opened, buffers.key_grads.nbytes + buffers.value_grads.nbytes, key_value_bytes(program, 0)


def test_key_value_buffers_are_what_the_runtime_opens():
    """Chunks on the CPU open the attn layer's sequence-wide buffers and, in their backward, the gradient
    buffers: each as many bytes as :func:`key_value_bytes`, ``attn_kv_heads`` heads wide, so the
    ``attn_heads / attn_kv_heads`` grouping divides them against the same attention without groups."""
    opened, gradients, predicted = _opened_buffer_bytes(OWN_HEADS)
    assert opened == gradients == predicted == 2 * LENGTH * ATTN_KV_HEADS * ATTN_HEAD_DIM * 4  # b = 1, fp32
    wide_opened, wide_gradients, wide_predicted = _opened_buffer_bytes(UNGROUPED)
    assert wide_opened == wide_gradients == wide_predicted == ATTN_HEADS // ATTN_KV_HEADS * opened


KEYS_AT_THEIR_DEFAULTS = f"attn_heads = {HEADS}  attn_head_dim = {HEAD_DIM}  attn_kv_heads = {HEADS}"


@pytest.mark.parametrize("sequence", [1, 2])
def test_keys_at_their_defaults_change_no_number(sequence):
    """Writing ``attn_heads = heads`` and the rest gives the numbers of a model without them."""
    written = program_of(attention=KEYS_AT_THEIR_DEFAULTS, sequence=sequence, partition="balanced(alpha = 1)")
    absent = program_of(attention="", sequence=sequence, partition="balanced(alpha = 1)")
    assert written.model.options.attention != absent.model.options.attention
    assert written.sequence.boundaries == absent.sequence.boundaries
    cost_written, cost_absent = FlopsCostModel(written), FlopsCostModel(absent)
    assert cost_written.forward_parts == cost_absent.forward_parts
    assert cost_written.weight_seconds == cost_absent.weight_seconds
    assert cost_written.accumulation_seconds == cost_absent.accumulation_seconds
    assert predict_memory(written) == predict_memory(absent)
