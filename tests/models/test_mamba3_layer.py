"""The ``mamba3`` mixer against an independent float64 re-statement of fla's Mamba3 layer around mamba_ssm's
step reference (outputs, every part of the final state, every gradient), chunk by chunk and over packed
documents. fla's layer itself only calls mamba_ssm's CUDA kernels, so it cannot run here (docs/models.md)."""

from __future__ import annotations

import pytest
import torch

from fla_mamba3_reference import mamba3_layer
from mixer_documents import (
    assert_an_ignored_start_changes_what_follows, assert_documents_run_as_their_pieces, relative,
)
from schedlang.runtime.mixer_mamba3 import Mamba3Mixer
from schedlang.vocabulary import Mamba3Options, ModelConfig, ModelOptions

D_MODEL, HEADS, HEAD_DIM = 24, 4, 8


def fla_shaped_config(options: Mamba3Options) -> dict:
    return {
        "num_heads": HEADS, "head_dim": HEAD_DIM, "state_size": options.state_size, "n_groups": options.n_groups,
        "rope_fraction": options.rope_fraction, "A_floor": options.A_floor,
        "is_outproj_norm": options.is_outproj_norm, "norm_eps": 1e-5,
    }


def make_mixer(options: Mamba3Options, dtype=torch.float64) -> Mamba3Mixer:
    """A mixer with every parameter random (D, the biases and the norms' weights too), so each one matters."""
    config = ModelConfig(vocab=32, d_model=D_MODEL, layers=("mamba3",), heads=HEADS, head_dim=HEAD_DIM,
                         norm_eps=1e-5, options=ModelOptions(mamba3=options))
    mixer = Mamba3Mixer(config)
    mixer.reset_parameters(torch.Generator().manual_seed(0), 0.2)
    with torch.no_grad():
        for name, parameter in mixer.named_parameters():
            if name in ("in_proj.weight", "out_proj.weight"):
                parameter.mul_(10.0)
            elif name != "dt_bias":
                parameter.copy_(torch.randn(parameter.shape) * 0.5 + (1.0 if "weight" in name else 0.0))
    return mixer.to(dtype)


def state_of(mixer: Mamba3Mixer, packed: torch.Tensor):
    """Our packed state as mamba_ssm's (angle [B, H, A], ssm [B, H, P, N], key [B, H, N], value [B, H, P])."""
    ssm, (angle, key, value) = mixer.packed_state.unpack(packed)
    batch = packed.shape[0]
    return (angle.reshape(batch, HEADS, -1), ssm.transpose(-1, -2), key.reshape(batch, HEADS, -1),
            value.reshape(batch, HEADS, -1))


OPTIONS = [
    Mamba3Options(state_size=8, n_groups=1),
    Mamba3Options(state_size=6, n_groups=2, use_bias=True, rope_fraction=1.0, is_outproj_norm=True),
    Mamba3Options(state_size=10, n_groups=4, A_floor=0.05),
]


@pytest.mark.parametrize("options", OPTIONS, ids=["G1", "G2-bias-full-rope-outnorm", "G4-floor"])
def test_chunks_in_float64_match_the_restatement_with_every_gradient(options):
    """Three chunks (the first of one token) handing the packed state on, against the token loop over the
    whole sequence: outputs, every part of the final state, and the gradients of the input and of every
    parameter."""
    mixer = make_mixer(options)
    hidden = torch.randn(2, 77, D_MODEL, dtype=torch.float64, requires_grad=True)
    output_grad = torch.randn(2, 77, D_MODEL, dtype=torch.float64)
    outputs, state = [], None
    for start, end in ((0, 1), (1, 40), (40, 77)):
        output, state = mixer(hidden[:, start:end], state)
        outputs.append(output)
    ours = torch.cat(outputs, dim=1)
    parts = state_of(mixer, state)
    state_grads = [torch.randn_like(part) for part in parts]
    loss = (ours * output_grad).sum() + sum((s * g).sum() for s, g in zip(parts, state_grads))
    names = [name for name, _ in mixer.named_parameters()]
    our_grads = torch.autograd.grad(loss, [hidden, *mixer.parameters()])

    reference = {name: tensor.detach().clone().requires_grad_(True) for name, tensor in mixer.named_parameters()}
    reference_hidden = hidden.detach().clone().requires_grad_(True)
    expected, expected_parts = mamba3_layer(reference, reference_hidden, fla_shaped_config(options))
    reference_loss = (expected * output_grad).sum() + sum((s * g).sum() for s, g in zip(expected_parts, state_grads))
    expected_grads = torch.autograd.grad(reference_loss, [reference_hidden, *(reference[n] for n in names)])

    assert relative(ours, expected) < 1e-10
    for part, actual, wanted in zip(("angle", "ssm", "key", "value"), parts, expected_parts):
        assert relative(actual, wanted) < 1e-10, part
    for name, actual, wanted in zip(["input", *names], our_grads, expected_grads):
        assert relative(actual, wanted) < 1e-9, name


def test_packed_documents_restart_the_state_the_carried_term_and_the_angles():
    """One chunk holding a continued document and new ones equals the pieces run alone: the first from the
    incoming state (angles, last key and input included), the others from zeros; the final state is the last
    piece's."""
    assert_documents_run_as_their_pieces(make_mixer(OPTIONS[1]), D_MODEL)


def test_without_the_documents_the_carried_term_would_leak_across_a_start():
    """The negative control: a document start ignored changes the outputs after it."""
    assert_an_ignored_start_changes_what_follows(make_mixer(OPTIONS[0]), D_MODEL)


def test_float32_stays_within_float32_error_of_the_float64_restatement():
    mixer = make_mixer(OPTIONS[0], torch.float32)
    hidden = torch.randn(2, 100, D_MODEL)
    ours, state = mixer(hidden, None)
    reference = {name: tensor.detach().double() for name, tensor in mixer.named_parameters()}
    expected, parts = mamba3_layer(reference, hidden.double(), fla_shaped_config(OPTIONS[0]))
    assert relative(ours, expected) < 1e-5
    assert relative(state_of(mixer, state)[1], parts[1]) < 1e-5


def test_mimo_is_refused_with_the_field_named():
    config = ModelConfig(vocab=32, d_model=D_MODEL, layers=("mamba3",), heads=HEADS, head_dim=HEAD_DIM,
                         options=ModelOptions(mamba3=Mamba3Options(is_mimo=True)))
    with pytest.raises(ValueError, match="is_mimo"):
        Mamba3Mixer(config)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the Triton path at real launch sizes needs a GPU")
def test_on_the_gpu_the_triton_path_matches_the_float64_restatement():
    """float32 on CUDA (simple GLA's Triton kernels), two chunks handing the state on, against the token loop:
    outputs, the SSM state and the input's gradient."""
    options = OPTIONS[1]
    mixer = make_mixer(options, torch.float32).cuda()
    hidden = torch.randn(2, 300, D_MODEL, device="cuda", requires_grad=True)
    first, state = mixer(hidden[:, :130], None)
    second, state = mixer(hidden[:, 130:], state)
    ours = torch.cat([first, second], dim=1)
    output_grad = torch.randn_like(ours)
    (our_grad,) = torch.autograd.grad(ours, hidden, output_grad)
    reference = {name: tensor.detach().double().cpu() for name, tensor in mixer.named_parameters()}
    reference_hidden = hidden.detach().double().cpu().requires_grad_(True)
    expected, parts = mamba3_layer(reference, reference_hidden, fla_shaped_config(options))
    (expected_grad,) = torch.autograd.grad(expected, reference_hidden, output_grad.double().cpu())
    # tf32 matrix products: the bound of simple GLA's own GPU tests (measured 7.6e-4 on the H200, 2026-12-03)
    assert relative(ours.cpu(), expected) < 5e-3
    assert relative(state_of(mixer, state)[1].cpu(), parts[1]) < 5e-3
    assert relative(our_grad.cpu(), expected_grad) < 5e-3
