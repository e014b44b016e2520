"""What fla's Mamba-2 and Mamba-3 causal LMs cannot hold (runtime/hf_mamba_backbone.py's backbone_problems, behind
both ``mamba2_config_problems`` and ``mamba3_config_problems``): another layer kind, an MLP, a width fla's integer
``expand`` cannot give."""

from __future__ import annotations

import pytest

from schedlang.runtime.hf_mamba2 import mamba2_config_problems
from schedlang.runtime.hf_mamba3 import mamba3_config_problems
from schedlang.vocabulary import LayerKind, ModelConfig


@pytest.mark.parametrize(
    ("kind", "problems", "architecture"),
    [(LayerKind.MAMBA2, mamba2_config_problems, "Mamba2ForCausalLM"),
     (LayerKind.MAMBA3, mamba3_config_problems, "Mamba3ForCausalLM")],
)
def test_each_refusal_names_what_fla_cannot_hold(kind, problems, architecture):
    good = ModelConfig(vocab=64, d_model=32, layers=(kind,) * 2, heads=4, head_dim=16, mlp_ratio=0.0)
    assert problems(good) == []
    mixed = ModelConfig(vocab=64, d_model=32, layers=(kind, LayerKind.ATTN), heads=4, head_dim=16, mlp_ratio=0.0)
    assert problems(mixed) == [f"every layer must be {kind.value} (fla's {architecture} has no other kind)"]
    with_mlp = ModelConfig(vocab=64, d_model=32, layers=(kind,), heads=4, head_dim=16, mlp_ratio=2.0)
    assert problems(with_mlp) == ["the blocks must have no MLP (mlp = none)"]
    narrow = ModelConfig(vocab=64, d_model=32, layers=(kind,), heads=3, head_dim=16, mlp_ratio=0.0)
    assert problems(narrow) == ["heads * head_dim must be a whole multiple of d_model (fla's integer expand)"]
