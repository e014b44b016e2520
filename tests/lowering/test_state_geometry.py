"""One rule for a recurrent layer's state size: ``recurrent_state_geometry`` against the state the runtime's mixers
really return, and the compiler's terms (memory model, FLOPs model's messages) reading it."""

from __future__ import annotations

import pytest
import torch

from schedlang.frontend import load_program_text
from schedlang.lowering.cost import FlopsCostModel, Hardware
from schedlang.lowering.memory_terms import state_bytes
from schedlang.vocabulary.edges import Payload
from schedlang.vocabulary.actions import TaskId
from schedlang.runtime.mixer_gdn import GatedDeltaMixer
from schedlang.runtime.mixer_gla import GatedLinearMixer
from schedlang.vocabulary import GdnOptions, GlaOptions, LayerKind, ModelConfig, ModelOptions, recurrent_state_geometry

HEADS, HEAD_DIM, D_MODEL = 2, 8, 16

CASES = [
    (LayerKind.GLA, ModelOptions()),
    (LayerKind.GLA, ModelOptions(gla=GlaOptions(head_k_dim=4))),
    (LayerKind.GLA, ModelOptions(gla=GlaOptions(head_k_dim=12, kv_heads=1))),
    (LayerKind.SIMPLE_GLA, ModelOptions(gla=GlaOptions(head_k_dim=4))),  # simple GLA ignores the gla options
    (LayerKind.GDN, ModelOptions()),
    (LayerKind.GDN, ModelOptions(gdn=GdnOptions(head_k_dim=4))),
    (LayerKind.GDN, ModelOptions(gdn=GdnOptions(value_heads=4, short_conv_size=4))),
    (LayerKind.GDN, ModelOptions(gdn=GdnOptions(head_k_dim=12, value_heads=6, short_conv_size=3))),
]


def _mixer(kind: LayerKind, options: ModelOptions):
    config = ModelConfig(
        vocab=32, d_model=D_MODEL, layers=(kind,), heads=HEADS, head_dim=HEAD_DIM, mlp_ratio=0.0, options=options
    )
    mixer = GatedDeltaMixer(config) if kind is LayerKind.GDN else GatedLinearMixer(config, kind)
    mixer.reset_parameters(torch.Generator().manual_seed(0), 0.02)
    return mixer


@pytest.mark.parametrize(("kind", "options"), CASES, ids=lambda case: getattr(case, "value", None))
def test_the_geometry_is_the_state_the_mixer_returns(kind, options):
    geometry = recurrent_state_geometry(kind, HEADS, HEAD_DIM, options)
    mixer = _mixer(kind, options)
    batch = 3
    with torch.no_grad():
        _, state = mixer(torch.randn(batch, 16, D_MODEL), None)
        assert state.shape[0] == batch
        assert state[0].numel() == geometry.elements
        # the state goes back in: the next chunk reads exactly this many elements
        mixer(torch.randn(batch, 16, D_MODEL), state)
    if geometry.history_rows == 0:
        assert tuple(state.shape[1:]) == (geometry.heads, geometry.key_dim, geometry.value_dim)


def test_layers_without_a_state_have_no_geometry():
    assert recurrent_state_geometry(LayerKind.ATTN, HEADS, HEAD_DIM, ModelOptions()) is None
    assert recurrent_state_geometry(LayerKind.MLP, HEADS, HEAD_DIM, ModelOptions()) is None


SCHEDULE = """schedule states
model {{
  vocab = 64  d_model = 32  heads = 2  head_dim = 16
  layers = [gla, gdn, attn, gdn]
  expand_k = 0.5  value_heads = 4  short_conv_size = 4
}}
mesh {{ pipeline = 2  sequence = 1  data = 1 }}
sequence {{ length = 128  chunks = 2  kernel_chunk = 16 }}
pipeline {{ microbatches = 2  microbatch_size = 3  order = 1f1b }}
train {{ dtype = {dtype}  steps = 1 }}
"""


@pytest.mark.parametrize(("dtype", "element"), [("bf16", 4), ("fp32", 4), ("fp64", 8)])
def test_the_memory_and_flops_models_count_the_runtime_states(dtype, element):
    """Keys half as wide (8 per head), gdn with 4 value heads and 3 history rows of q, k and v; the states are
    float32 whatever ``train.dtype`` (float64 for a float64 model)."""
    program = load_program_text(SCHEDULE.format(dtype=dtype))
    batch = 3
    gla = 2 * 8 * 16
    gdn = 4 * 8 * 16 + 3 * (2 * 2 * 8 + 4 * 16)
    stage_layers = program.stage_layers
    expected = [sum({LayerKind.GLA: gla, LayerKind.GDN: gdn}.get(program.model.layers[i], 0) for i in layers)
                for layers in stage_layers]
    assert [state_bytes(program, stage) for stage in range(2)] == [batch * e * element for e in expected]
    model = FlopsCostModel(program, Hardware())
    for stage in range(2):
        source, destination = TaskId.parse(f"{stage}F0.0"), TaskId.parse(f"{stage}F0.1")
        assert model.message_bytes(Payload.STATE, source, destination) == batch * expected[stage] * element
