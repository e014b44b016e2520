"""The ``mamba3`` layer's keys: read into :class:`Mamba3Options` (the keys Mamba-2 shares included), refused with
a position when they ask for what is not built (``is_mimo = true``, a ``rope_fraction`` other than 0.5 or 1.0,
no angle at all, groups not dividing the heads), and Mamba-2's convolution rule left to Mamba-2 layers."""

from __future__ import annotations

import pytest

from schedlang.frontend import load_program_text
from schedlang.vocabulary import LayerKind, Mamba2Options, Mamba3Options

from .helpers import diagnostics_of

SCHEDULE = """schedule m3
model {{
  vocab = 64  d_model = 32  heads = 4  head_dim = 16
  layers = [{layers}]
  {keys}
}}
mesh {{ sequence = {sequence} }}
sequence {{ length = 64  chunks = 2  kernel_chunk = {kernel_chunk} }}
pipeline {{ microbatches = 2 }}
train {{ steps = 1 }}
"""


def text(keys: str = "", layers: str = "mamba3, attn", sequence: int = 1, kernel_chunk: int = 16) -> str:
    return SCHEDULE.format(keys=keys, layers=layers, sequence=sequence, kernel_chunk=kernel_chunk)


def test_the_keys_fill_the_mamba3_options_and_the_shared_ones_too():
    keys = "state_size = 16  n_groups = 2  use_bias = true  dt_min = 0.01  rope_fraction = 1.0  A_floor = 0.01  " \
           "is_outproj_norm = true  mimo_rank = 2"
    model = load_program_text(text(keys), "t.sched").model
    assert model.layers == (LayerKind.MAMBA3, LayerKind.ATTN)
    assert model.options.mamba3 == Mamba3Options(
        state_size=16, n_groups=2, use_bias=True, dt_min=0.01, rope_fraction=1.0, A_floor=0.01,
        is_outproj_norm=True, mimo_rank=2,
    )
    assert model.options.mamba2 == Mamba2Options()  # no mamba2 layer: no mamba2 options recorded


def test_a_model_without_mamba3_layers_records_no_mamba3_options():
    model = load_program_text(text("rope_fraction = 1.0", layers="mamba2, attn"), "t.sched").model
    assert model.options.mamba3 == Mamba3Options()


@pytest.mark.parametrize(
    "keys, token, words",
    [
        ("is_mimo = true", "is_mimo", "MIMO"),
        ("rope_fraction = 0.25", "rope_fraction", "half or all"),
        ("state_size = 2  rope_fraction = 0.5", "rope_fraction", "no rotary angle"),
        ("n_groups = 3", "n_groups", "must divide heads"),
    ],
)
def test_what_is_not_built_is_refused_at_its_key(keys, token, words):
    written = text(keys)
    ((line, column, message),) = diagnostics_of(written)
    assert (line, column) == (5, written.split("\n")[4].index(token) + 1)
    assert words in message


def test_mamba2s_convolution_rule_does_not_bind_mamba3_layers():
    """Under sequence parallelism mamba2 needs kernel_chunk >= conv_kernel - 1; mamba3 has no convolution."""
    load_program_text(text(layers="mamba3, mamba3", sequence=2, kernel_chunk=2), "t.sched")
    assert diagnostics_of(text(layers="mamba2, mamba3", sequence=2, kernel_chunk=2))
