"""The ``mamba2`` mixer against an independent float64 re-statement of fla's Mamba2 layer (outputs, the final
SSD state and convolution history, every gradient), chunk by chunk, over packed documents, and against fla's
own ``Mamba2.torch_forward`` when fla is installed."""

from __future__ import annotations

import pytest
import torch

from fla_mamba2_reference import mamba2_layer
from fla_reference import import_fla
from mixer_documents import (
    assert_an_ignored_start_changes_what_follows, assert_documents_run_as_their_pieces, relative,
)
from schedlang.vocabulary import ModelConfig
from schedlang.runtime.mixer_mamba2 import Mamba2Mixer
from schedlang.vocabulary import Mamba2Options, ModelOptions

D_MODEL, HEADS, HEAD_DIM = 24, 4, 8


def fla_shaped_config(options: Mamba2Options) -> dict:
    return {
        "num_heads": HEADS, "head_dim": HEAD_DIM, "state_size": options.state_size, "n_groups": options.n_groups,
        "conv_kernel": options.conv_kernel, "norm_eps": 1e-5,
        "dt_limit": (0.0, float("inf")) if options.dt_limit is None else options.dt_limit,
    }


def make_mixer(options: Mamba2Options, dtype=torch.float64) -> Mamba2Mixer:
    """A mixer with every parameter random (D, the norm's weight and the biases too), so each one matters."""
    config = ModelConfig(vocab=32, d_model=D_MODEL, layers=("mamba2",), heads=HEADS, head_dim=HEAD_DIM,
                         norm_eps=1e-5, options=ModelOptions(mamba2=options))
    mixer = Mamba2Mixer(config)
    mixer.reset_parameters(torch.Generator().manual_seed(0), 0.2)
    with torch.no_grad():
        for name, parameter in mixer.named_parameters():
            if name in ("D", "norm.weight") or name.endswith("bias") and name != "dt_bias":
                parameter.copy_(torch.randn(parameter.shape) * 0.5 + (1.0 if name == "norm.weight" else 0.0))
            elif name.endswith("weight"):
                parameter.mul_(10.0)
    return mixer.to(dtype)


def tensors_of(mixer: Mamba2Mixer) -> dict[str, torch.Tensor]:
    """The mixer's parameters under fla's names (the same names)."""
    return dict(mixer.named_parameters())


def state_of(mixer: Mamba2Mixer, packed: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Our packed state as fla's (conv_state [B, conv_dim, W - 1], ssm_state [B, H, P, N])."""
    recurrent, (history,) = mixer.packed_state.unpack(packed)
    return history.transpose(1, 2), recurrent.transpose(-1, -2)


OPTIONS = [
    Mamba2Options(state_size=6, n_groups=1, conv_kernel=4),
    Mamba2Options(state_size=5, n_groups=2, conv_kernel=3, use_bias=True, dt_limit=(0.05, 0.5)),
    Mamba2Options(state_size=4, n_groups=4, conv_kernel=1, use_conv_bias=False),
]


@pytest.mark.parametrize("options", OPTIONS, ids=["G1-W4", "G2-W3-bias-limit", "G4-W1"])
def test_chunks_in_float64_match_the_restatement_with_every_gradient(options):
    """Three chunks (the first shorter than the convolution's history) handing the packed state on, against
    the token loop over the whole sequence: outputs, final states, and the gradients of the input and of
    every parameter."""
    mixer = make_mixer(options)
    hidden = torch.randn(2, 77, D_MODEL, dtype=torch.float64, requires_grad=True)
    output_grad = torch.randn(2, 77, D_MODEL, dtype=torch.float64)
    outputs, state = [], None
    for start, end in ((0, 2), (2, 40), (40, 77)):
        output, state = mixer(hidden[:, start:end], state)
        outputs.append(output)
    ours = torch.cat(outputs, dim=1)
    conv_state, ssm_state = state_of(mixer, state)
    state_grads = (torch.randn_like(conv_state), torch.randn_like(ssm_state))
    loss = (ours * output_grad).sum() + sum((s * g).sum() for s, g in zip((conv_state, ssm_state), state_grads))
    parameters = list(mixer.parameters())
    our_grads = torch.autograd.grad(loss, [hidden, *parameters])

    reference_tensors = {
        name: tensor.detach().clone().requires_grad_(True) for name, tensor in tensors_of(mixer).items()
    }
    reference_hidden = hidden.detach().clone().requires_grad_(True)
    expected, expected_conv, expected_ssm = mamba2_layer(
        reference_tensors, "", reference_hidden, fla_shaped_config(options)
    )
    reference_loss = (expected * output_grad).sum()
    reference_loss += sum((s * g).sum() for s, g in zip((expected_conv, expected_ssm), state_grads))
    names = [name for name, _ in mixer.named_parameters()]
    expected_grads = torch.autograd.grad(reference_loss, [reference_hidden, *(reference_tensors[n] for n in names)])

    assert relative(ours, expected) < 1e-10
    assert relative(conv_state, expected_conv) < 1e-12 and relative(ssm_state, expected_ssm) < 1e-10
    for name, actual, wanted in zip(["input", *names], our_grads, expected_grads):
        assert relative(actual, wanted) < 1e-9, name


def test_packed_documents_restart_the_state_and_the_convolution_history():
    """One chunk holding a continued document and two new ones equals the three run alone: the first from the
    incoming state (history included), the others from zeros; the final state is the last document's."""
    assert_documents_run_as_their_pieces(make_mixer(OPTIONS[0]), D_MODEL)


def test_without_the_documents_the_history_would_leak_across_a_start():
    """The negative control of the test above: a document start ignored changes the outputs after it."""
    assert_an_ignored_start_changes_what_follows(make_mixer(OPTIONS[0]), D_MODEL)


def test_fla_torch_forward_gives_the_same_outputs_and_states_in_float32():
    """fla 0.6.0's own layer (its PyTorch prefill path) on our weights, one B/C group: fla's path repeats the
    groups as ``h % n_groups`` where its kernels use ``h // (heads / n_groups)``, so more groups would differ
    by fla's own inconsistency (docs/models.md)."""
    layers = import_fla("fla.layers.mamba2")
    options = OPTIONS[0]
    mixer = make_mixer(options, torch.float32)
    fla = layers.Mamba2(num_heads=HEADS, head_dim=HEAD_DIM, hidden_size=D_MODEL, state_size=options.state_size,
                        expand=HEADS * HEAD_DIM / D_MODEL, n_groups=1, conv_kernel=options.conv_kernel,
                        norm_eps=1e-5, chunk_size=16, backend="triton")
    fla.load_state_dict(tensors_of(mixer), strict=True)
    fla.act = torch.nn.SiLU()  # fla's Triton SiLU autotunes, which needs a GPU driver; the same function
    # fla's gated norm is Triton: interpreted without a GPU, compiled (and given CUDA tensors) with one
    device = "cuda" if torch.cuda.is_available() else "cpu"
    hidden = torch.randn(2, 45, D_MODEL)
    ours, state = mixer(hidden, None)
    with torch.no_grad():
        expected, _, ssm_state = fla.to(device).torch_forward(hidden.to(device))
    assert relative(ours, expected.cpu()) < 1e-5
    assert relative(state_of(mixer, state)[1], ssm_state.cpu()) < 1e-5
