"""TokenEmbedding: nn.Embedding's lookup and gradient, without a host sync in the backward on a GPU."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from schedlang.runtime.embedding import TokenEmbedding


def reference_weight_gradient(token_ids: torch.Tensor, grad_output: torch.Tensor, vocab: int) -> torch.Tensor:
    """float64 sum of each id's output-gradient rows, one id at a time."""
    expected = torch.zeros(vocab, grad_output.shape[-1], dtype=torch.float64)
    for token, row in zip(token_ids.reshape(-1).tolist(), grad_output.reshape(-1, grad_output.shape[-1]).double()):
        expected[token] += row
    return expected


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("shape", [(1, 63), (3, 17)], ids=lambda shape: "B{}-T{}".format(*shape))
def test_lookup_and_weight_gradient_match_a_float64_sum(dtype, shape):
    generator = torch.Generator().manual_seed(sum(shape))
    vocab, width = 11, 24  # fewer ids than tokens: every id repeats
    embedding = TokenEmbedding(vocab, width).to(dtype)
    token_ids = torch.randint(0, vocab, shape, generator=generator)
    output = embedding(token_ids)
    assert torch.equal(output, F.embedding(token_ids, embedding.weight))
    grad_output = torch.randn(output.shape, generator=generator).to(dtype)
    output.backward(grad_output)
    expected = reference_weight_gradient(token_ids, grad_output, vocab)
    assert embedding.weight.grad.dtype == dtype
    error = (embedding.weight.grad.double() - expected).norm() / expected.norm()
    assert error <= {torch.float64: 1e-12, torch.float32: 1e-6, torch.bfloat16: 8e-3}[dtype]


def test_is_an_nn_embedding_with_the_same_state_dict():
    embedding = TokenEmbedding(7, 5)
    assert isinstance(embedding, torch.nn.Embedding)
    assert list(embedding.state_dict()) == ["weight"]
    with torch.no_grad():
        token_ids = torch.tensor([[1, 6, 1]])
        assert torch.equal(embedding(token_ids), embedding.weight[token_ids])


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="the host sync exists only on a GPU")
def test_backward_makes_no_host_sync_on_the_gpu():
    embedding = TokenEmbedding(32000, 256).cuda().to(torch.bfloat16)
    token_ids = torch.randint(0, 32000, (1, 4096), device="cuda")
    output = embedding(token_ids)
    grad_output = torch.randn_like(output)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        output.backward(grad_output)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    expected = reference_weight_gradient(token_ids.cpu(), grad_output.cpu(), 32000)
    error = (embedding.weight.grad.double().cpu() - expected).norm() / expected.norm()
    assert error <= 8e-3
