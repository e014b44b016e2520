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
    chunk_activation_bytes,
    key_value_bytes,
    mixer_bytes_per_token,
    norm_bytes_per_row,
    program_sizes,
    sequence_parallel_bytes,
)
from schedlang.lowering.parameters import stage_parameters
from schedlang.lowering.partition import layer_flop_coefficients
from schedlang.runtime.config import AttentionGeometry, ModelConfig
from schedlang.runtime.kv_buffers import ChunkPosition, SequenceKV
from schedlang.runtime.linear import Linear
from schedlang.runtime.model import CausalAttentionMixer, build_stage_model
from schedlang.runtime.model_options import AttentionOptions, ModelOptions
from schedlang.vocabulary import LayerKind

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
    assert program.model.runtime_config().attention_geometry == program.model.attention_geometry
    assert program_of(attention="").model.attention_geometry == AttentionGeometry(HEADS, HEADS, HEAD_DIM)


@pytest.mark.parametrize("bias", ["qkv_bias = true", "qkv_bias = false"])
@pytest.mark.parametrize("layers, mlp", [("[gla, attn] * 2", "swiglu(ratio = 4)"), ("[attn, gdn]", "none")])
def test_parameter_counts_equal_the_runtime_model_built_on_the_cpu(bias, layers, mlp):
    program = program_of(layers=layers, mlp=mlp, attention=f"{OWN_HEADS}  {bias}")
    config = program.model.runtime_config()
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


def test_sequence_parallel_all_gather_is_as_wide_as_the_query_heads():
    program = program_of(sequence=2)
    hardware = Hardware()
    model = FlopsCostModel(program, hardware)
    tokens = program.sequence.chunk_length(0)
    batch, element = program.pipeline.microbatch_size, 2
    state = batch * HEADS * HEAD_DIM * HEAD_DIM * element
    expected = state_scan_seconds(program.sequence.parallel, 2, program.sequence.scan_blocks, state, hardware)
    expected += allgather_seconds(2, 2 * batch * (tokens // 2) * ATTN_HEADS * ATTN_HEAD_DIM * element, hardware)
    assert model._sequence_parallel_seconds(0, tokens, attention_layers=1) == pytest.approx(expected)
    assert sequence_parallel_bytes(program, 0, 0) == 2 * batch * tokens * ATTN_HEADS * ATTN_HEAD_DIM * element


def test_memory_terms_by_hand():
    """bf16 (e = 2, f = 4), on CUDA: the attn mixer keeps its norm, the normed input, the output projection's
    input and q (``W_a e`` each) and the log-sum-exp (``H_a f``); the K/V buffers are ``2 b T W_a e``."""
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
    assert key_value_bytes(own, 0) == 2 * batch * LENGTH * 96 * 2
    assert key_value_bytes(shared, 0) == 2 * batch * LENGTH * 64 * 2
    # wider attention keeps more in every chunk and at the peak
    for stage in range(own.n_stages):
        assert chunk_activation_bytes(own, stage, 0) > chunk_activation_bytes(shared, stage, 0)
        assert predict_memory(own)[stage].allocated > predict_memory(shared)[stage].allocated


def test_key_value_buffers_are_what_the_runtime_opens():
    """One chunk's forward on the CPU opens the attn layer's sequence-wide buffers: as many bytes as
    :func:`key_value_bytes` (K/V heads repeated for their query heads, so ``attn_kv_heads`` saves nothing)."""
    program = program_of(layers="[attn, gla]", dtype="fp32")
    config = program.model.runtime_config()
    model = build_stage_model(config, program.stage_layers[0], True, False, 0, torch.device("cpu"), torch.float32)
    kv = SequenceKV(LENGTH)
    tokens = torch.randint(0, 256, (program.pipeline.microbatch_size, LENGTH))
    chunk_end = program.sequence.boundaries[1]
    with torch.no_grad():
        model(tokens[:, :chunk_end], [None] * model.n_states, ChunkPosition(kv, 0, 0, chunk_end))
    opened = sum(buffers.keys.nbytes + buffers.values.nbytes for buffers in kv.open.values())
    assert opened == key_value_bytes(program, 0) == 2 * program.pipeline.microbatch_size * LENGTH * 96 * 4


KEYS_AT_THEIR_DEFAULTS = f"attn_heads = {HEADS}  attn_head_dim = {HEAD_DIM}  attn_kv_heads = {HEADS}"


@pytest.mark.parametrize("sequence", [1, 2])
def test_keys_at_their_defaults_change_no_number(sequence):
    """Writing ``attn_heads = heads`` and the rest gives the numbers of a model without them."""
    written = program_of(attention=KEYS_AT_THEIR_DEFAULTS, sequence=sequence, partition="balanced(alpha = 1)")
    absent = program_of(attention="", sequence=sequence, partition="balanced(alpha = 1)")
    assert written.model.attention != absent.model.attention
    assert written.sequence.boundaries == absent.sequence.boundaries
    cost_written, cost_absent = FlopsCostModel(written), FlopsCostModel(absent)
    assert cost_written.forward_parts == cost_absent.forward_parts
    assert cost_written.weight_seconds == cost_absent.weight_seconds
    assert cost_written.accumulation_seconds == cost_absent.accumulation_seconds
    assert predict_memory(written) == predict_memory(absent)
