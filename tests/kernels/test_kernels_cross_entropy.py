"""kernels.cross_entropy: the summed cross-entropy of logits rows and its gradient, both backends, against
torch's own ``F.cross_entropy`` in float64 with autograd.

On a CPU the Triton path runs in the interpreter at small sizes in float32; on a GPU the same tests run at the
LM head's sizes (a block of 4,096 tokens over a 32K vocabulary) in float32 and bfloat16. Every vocabulary
here but the smallest is not a multiple of the kernel's tile, and one is wider than a tile, so the online
maximum and sum cross tiles and the last tile is ragged.
"""

import pytest
import torch

from kernel_reference_cases import relative_error
from schedlang.kernels.cross_entropy import cross_entropy_rows, naive_cross_entropy_rows

ON_GPU = torch.cuda.is_available()
DEVICE = "cuda" if ON_GPU else "cpu"
SHAPES = [(4096, 32000), (333, 50257)] if ON_GPU else [(6, 48), (5, 1000), (4, 5000)]
# relative error of the loss and of the gradient: bf16 rounds the gradient once (2^-9 relative per element)
DTYPES = {"float32": (torch.float32, 1e-6, 1e-6), "bfloat16": (torch.bfloat16, 1e-3, 1e-2)} if ON_GPU else {
    "float32": (torch.float32, 1e-6, 1e-6)
}
IGNORE = -100


def _inputs(rows: int, vocab: int, dtype: torch.dtype, seed: int):
    """Fresh N(0, 4^2) logits, one row shifted by +80 (exp overflows float32 without the maximum taken out) with
    its maximum in the last tile (the running sum must be rescaled when the maximum grows), and one row with a
    single dominant logit; targets anywhere in [0, V), the first and last column among them, and
    two rows ignored."""
    generator = torch.Generator().manual_seed(seed)
    logits = torch.randn(rows, vocab, generator=generator, dtype=torch.float64) * 4
    logits[0] += 80.0
    logits[0, vocab - 2] += 30.0
    logits[1, vocab // 2] = 40.0
    targets = torch.randint(0, vocab, (rows,), generator=generator)
    targets[1], targets[-1] = 0, vocab - 1
    targets[2] = targets[rows // 2 + 1] = IGNORE
    return logits.to(DEVICE, dtype), targets.to(DEVICE)


@pytest.mark.parametrize("dtype_name", sorted(DTYPES))
@pytest.mark.parametrize("shape", SHAPES, ids=lambda shape: "x".join(map(str, shape)))
@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_loss_and_gradient_match_torch_cross_entropy_in_float64(backend, shape, dtype_name):
    dtype, loss_tolerance, grad_tolerance = DTYPES[dtype_name]
    logits, targets = _inputs(*shape, dtype, seed=sum(shape))
    expected_loss, expected_grad = naive_cross_entropy_rows(logits, targets, IGNORE)
    loss, grad = cross_entropy_rows(logits.clone(), targets, IGNORE, True, backend)
    assert loss.dtype == torch.float32 and loss.dim() == 0
    assert grad.dtype == dtype and grad.shape == logits.shape
    errors = {"loss": relative_error(loss, expected_loss), "gradient": relative_error(grad, expected_grad)}
    assert errors["loss"] <= loss_tolerance and errors["gradient"] <= grad_tolerance, errors
    ignored = targets == IGNORE
    assert torch.count_nonzero(grad[ignored]) == 0
    assert torch.allclose(grad[~ignored].double().sum(dim=1), torch.zeros((), dtype=torch.float64), atol=1e-2)


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_without_the_gradient_the_loss_is_the_same_and_the_logits_are_kept(backend):
    logits, targets = _inputs(*SHAPES[-1], torch.float32, seed=3)
    kept = logits.clone()
    loss, grad = cross_entropy_rows(logits, targets, IGNORE, False, backend)
    assert grad is None and torch.equal(logits, kept)
    with_grad, _ = cross_entropy_rows(logits.clone(), targets, IGNORE, True, backend)
    assert relative_error(loss, with_grad) <= 1e-7


def test_the_triton_gradient_is_written_over_the_logits():
    logits, targets = _inputs(*SHAPES[0], torch.float32, seed=4)
    loss, grad = cross_entropy_rows(logits, targets, IGNORE, True, "triton")
    assert grad.data_ptr() == logits.data_ptr()


def test_every_row_ignored_is_a_zero_loss_and_gradient():
    logits = torch.randn(3, 40, device=DEVICE)
    loss, grad = cross_entropy_rows(logits, torch.full((3,), IGNORE, device=DEVICE), IGNORE, True, "triton")
    assert float(loss) == 0.0 and torch.count_nonzero(grad) == 0


def test_float64_takes_the_torch_path_and_matches_exactly():
    logits, targets = _inputs(*SHAPES[0], torch.float64, seed=5)
    expected_loss, expected_grad = naive_cross_entropy_rows(logits, targets, IGNORE)
    loss, grad = cross_entropy_rows(logits.clone(), targets, IGNORE, True, "triton")
    assert loss.dtype == torch.float64 and relative_error(loss, expected_loss) <= 1e-12
    assert relative_error(grad, expected_grad) <= 1e-12


def test_misshapen_inputs_are_refused():
    with pytest.raises(ValueError, match=r"logits must be \[N, V\] and targets \[N\]"):
        cross_entropy_rows(torch.randn(2, 3, 4), torch.zeros(2, dtype=torch.long), IGNORE)
    with pytest.raises(ValueError, match="floating point"):
        cross_entropy_rows(torch.zeros(2, 3, dtype=torch.long), torch.zeros(2, dtype=torch.long), IGNORE)
