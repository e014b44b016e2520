"""runtime.linear_cross_entropy: the fused LM head + summed cross-entropy against a float64 reference, and the
last stage's loss that uses it (tied and untied head, in-place weight gradients, what the backward keeps)."""

import pytest
import torch
import torch.nn.functional as F

from schedlang.runtime.linear import accumulate_weight_gradients_into_grad
from schedlang.runtime.linear_cross_entropy import LOSS_BLOCK_ELEMENTS, linear_cross_entropy, loss_block_tokens
from schedlang.runtime.model import build_stage_model
from schedlang.runtime.packing import IGNORED_TARGET
from schedlang.vocabulary import LayerKind, ModelConfig
from schedlang.vocabulary.model_options import ModelOptions

# relative error (norm of the difference over the norm of the reference) of loss, dh, dW
TOLERANCES = {torch.float32: (1e-6, 1e-5, 1e-5), torch.bfloat16: (2e-3, 1.5e-2, 1.5e-2)}


def _relative_error(value: torch.Tensor, reference: torch.Tensor) -> float:
    return float((value.double() - reference).norm() / reference.norm())


def _inputs(tokens: int, d_model: int, vocab: int, dtype: torch.dtype, seed: int):
    generator = torch.Generator().manual_seed(seed)
    hidden = torch.randn(2, tokens, d_model, generator=generator).to(dtype)
    weight = (torch.randn(vocab, d_model, generator=generator) * d_model**-0.5 * 2).to(dtype)
    targets = torch.randint(0, vocab, (2, tokens), generator=generator)
    targets[0, 3] = targets[1, -1] = IGNORED_TARGET  # packed documents' boundaries carry no loss
    scale = float(torch.rand((), generator=generator)) + 0.5  # the incoming gradient, as 1 / loss tokens is
    return hidden, weight, targets, scale


def _float64_reference(hidden, weight, targets, scale):
    hidden = hidden.detach().double().requires_grad_(True)
    weight = weight.detach().double().requires_grad_(True)
    loss = F.cross_entropy(F.linear(hidden, weight).flatten(0, 1), targets.flatten(), reduction="sum")
    (loss * scale).backward()
    return loss.detach(), hidden.grad, weight.grad


def _fused(hidden, weight, targets, scale, block_tokens, backend="torch"):
    hidden = hidden.clone().requires_grad_(True)
    weight = weight.clone().requires_grad_(True)
    loss = linear_cross_entropy(hidden, weight, targets, block_tokens=block_tokens, backend=backend)
    (loss * scale).backward()
    return loss.detach(), hidden.grad, weight.grad


@pytest.mark.parametrize("backend", ["torch", "triton"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("block_tokens", [1, 7, 16, 74, 200], ids=lambda b: f"block{b}")
@pytest.mark.parametrize("seed", [0, 1])
def test_loss_and_gradients_match_a_float64_reference(dtype, block_tokens, seed, backend):
    if backend == "triton" and dtype == torch.bfloat16 and not torch.cuda.is_available():
        pytest.skip("Triton's interpreter is kept off bfloat16 (kernels.common.resolve_backend)")
    hidden, weight, targets, scale = _inputs(37, 24, 61, dtype, seed)  # 74 rows: no block size but 1 divides it
    device = "cuda" if torch.cuda.is_available() else "cpu"
    hidden, weight, targets = hidden.to(device), weight.to(device), targets.to(device)
    reference = _float64_reference(hidden, weight, targets, scale)
    fused = _fused(hidden, weight, targets, scale, block_tokens, backend)
    assert fused[0].dtype == torch.float32 and fused[1].dtype == dtype and fused[2].dtype == dtype
    for value, expected, tolerance, name in zip(fused, reference, TOLERANCES[dtype], ("loss", "dh", "dW")):
        assert _relative_error(value, expected) < tolerance, name


@pytest.mark.parametrize("block_tokens", [5, 74])
def test_bf16_errors_are_those_of_the_plain_path(block_tokens):
    """In bf16 the fused loss is no further from float64 than F.linear + .float() + F.cross_entropy."""
    hidden, weight, targets, scale = _inputs(37, 32, 97, torch.bfloat16, 5)
    reference = _float64_reference(hidden, weight, targets, scale)
    fused = _fused(hidden, weight, targets, scale, block_tokens)
    plain_hidden = hidden.clone().requires_grad_(True)
    plain_weight = weight.clone().requires_grad_(True)
    logits = F.linear(plain_hidden, plain_weight).float()
    plain_loss = F.cross_entropy(logits.flatten(0, 1), targets.flatten(), reduction="sum")
    (plain_loss * scale).backward()
    plain = (plain_loss.detach(), plain_hidden.grad, plain_weight.grad)
    for value, plain_value, expected in zip(fused, plain, reference):
        assert _relative_error(value, expected) <= 2 * _relative_error(plain_value, expected) + 1e-6


def test_without_grad_the_loss_is_the_same_and_no_gradient_is_formed():
    hidden, weight, targets, _ = _inputs(37, 24, 61, torch.float32, 2)
    with_grad = linear_cross_entropy(hidden.requires_grad_(True), weight.requires_grad_(True), targets, block_tokens=8)
    with torch.no_grad():
        without = linear_cross_entropy(hidden, weight, targets, block_tokens=8)
    assert not without.requires_grad
    torch.testing.assert_close(without, with_grad.detach(), rtol=0, atol=0)


def test_the_backward_keeps_gradients_of_hidden_and_weight_only():
    """What autograd saves is ``[T, D]`` and ``[V, D]``, never ``[T, V]``: the logits live one block at a time."""
    hidden, weight, targets, _ = _inputs(37, 24, 61, torch.bfloat16, 3)
    shapes = []

    def pack(tensor):
        shapes.append(tuple(tensor.shape))
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        linear_cross_entropy(hidden.requires_grad_(True), weight.requires_grad_(True), targets, block_tokens=8)
    assert sorted(shapes) == sorted([(74, 24), (61, 24)])


def test_ignored_targets_carry_no_loss_and_no_gradient():
    hidden, weight, targets, _ = _inputs(37, 24, 61, torch.float32, 4)
    targets[1] = IGNORED_TARGET
    hidden.requires_grad_(True)
    loss = linear_cross_entropy(hidden, weight, targets, block_tokens=16)
    loss.backward()
    assert torch.count_nonzero(hidden.grad[1]) == 0
    expected = F.cross_entropy(F.linear(hidden[0].double(), weight.double()), targets[0], reduction="sum")
    torch.testing.assert_close(loss.double(), expected, rtol=1e-6, atol=0)


def test_the_default_block_bounds_the_logits_of_a_block():
    assert loss_block_tokens(32000) == 4096
    assert loss_block_tokens(128256) == 1024
    assert loss_block_tokens(10**9) == 128
    for vocab in (50, 32000, 151936):
        tokens = loss_block_tokens(vocab)
        assert tokens == 128 or tokens * vocab <= LOSS_BLOCK_ELEMENTS < 2 * tokens * vocab


def _stage(tied: bool, dtype: torch.dtype):
    config = ModelConfig(
        vocab=53, d_model=32, layers=(LayerKind.MLP,), heads=2, head_dim=16, mlp_ratio=2.0,
        options=ModelOptions(tie_embeddings=tied),
    )
    return build_stage_model(config, (0,), tied, True, 0, torch.device("cpu"), dtype)


def _stage_gradients(model, loss_name: str, hidden, targets) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    model.zero_grad(set_to_none=True)
    leaf = hidden.clone().requires_grad_(True) if hidden.is_floating_point() else hidden
    output, _ = model(leaf, [None])
    loss = getattr(model, loss_name)(output, targets)
    (loss / targets.numel()).backward()
    return loss.detach(), {"hidden": leaf.grad, **{name: p.grad for name, p in model.named_parameters()}}


@pytest.mark.parametrize("tied", [False, True], ids=["untied", "tied"])
def test_the_stage_loss_is_the_reference_loss_with_every_gradient(tied):
    """The last stage's loss (final norm, head, loss) through the fused path equals the plain path, with every
    parameter's gradient, the tied embedding's included (a float64 stage: the plain path's float32 logits are
    the only rounding that matters)."""
    model = _stage(tied, torch.float64)
    model.loss_block_tokens = 6
    generator = torch.Generator().manual_seed(7)
    hidden = torch.randn(2, 17, 32, generator=generator, dtype=torch.float64)
    targets = torch.randint(0, 53, (2, 17), generator=generator)
    targets[0, 5] = IGNORED_TARGET
    if tied:
        hidden = torch.randint(0, 53, (2, 17), generator=generator)  # the stage is also the first: token ids in
    loss, gradients = _stage_gradients(model, "loss", hidden, targets)
    reference_loss, reference = _stage_gradients(model, "reference_loss", hidden, targets)
    torch.testing.assert_close(loss.double(), reference_loss.double(), rtol=1e-6, atol=0)
    assert gradients.keys() == reference.keys()
    assert ("embedding.weight" in gradients) == tied and ("lm_head.weight" in gradients) != tied
    for name, gradient in reference.items():
        if gradient is None:
            assert gradients[name] is None, name
            continue
        assert _relative_error(gradients[name], gradient) < 1e-6, name


def test_an_in_place_head_adds_its_weight_gradient_into_grad_over_chunks():
    """With [Note: in-place weight gradients] on, two chunks' backwards leave in ``lm_head.weight.grad`` what
    autograd's accumulation leaves (on top of what was there), and autograd gets no weight gradient."""
    plain = _stage(False, torch.float64)
    in_place = _stage(False, torch.float64)
    for model in (plain, in_place):
        model.loss_block_tokens = 5
        for parameter in model.parameters():
            parameter.grad = torch.full_like(parameter, 0.25)
    accumulate_weight_gradients_into_grad(in_place)
    storage = in_place.lm_head.weight.grad.data_ptr()
    for seed in (1, 2):
        generator = torch.Generator().manual_seed(seed)
        hidden = torch.randn(1, 13, 32, generator=generator, dtype=torch.float64)
        targets = torch.randint(0, 53, (1, 13), generator=generator)
        for model in (plain, in_place):
            output, _ = model(hidden, [None])
            (model.loss(output, targets) / 26).backward()
    assert in_place.lm_head.weight.grad.data_ptr() == storage
    for (name, expected), actual in zip(plain.named_parameters(), in_place.parameters()):
        torch.testing.assert_close(actual.grad, expected.grad, rtol=1e-12, atol=1e-14, msg=name)


def test_an_in_place_head_without_grad_is_an_error_naming_the_contract():
    model = _stage(False, torch.float32)
    accumulate_weight_gradients_into_grad(model)
    output, _ = model(torch.randn(1, 4, 32), [None])
    with pytest.raises(RuntimeError, match="no .grad to add into"):
        model.loss(output, torch.zeros(1, 4, dtype=torch.long)).backward()


def test_mismatched_targets_are_refused():
    with pytest.raises(ValueError, match="targets of shape"):
        linear_cross_entropy(torch.randn(3, 4), torch.randn(5, 4), torch.zeros(4, dtype=torch.long))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU")
@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_the_fused_loss_is_captured_and_replayed_in_a_cuda_graph(backend):
    device = torch.device("cuda")
    hidden, weight, targets, _ = _inputs(300, 64, 1000, torch.bfloat16, 6)
    hidden, weight, targets = hidden.to(device), weight.to(device).requires_grad_(True), targets.to(device)
    weight.grad = torch.zeros_like(weight)
    static_hidden = hidden.clone().requires_grad_(True)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        linear_cross_entropy(static_hidden, weight, targets, block_tokens=128, backend=backend).backward()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    weight.grad = None
    static_hidden.grad = None
    with torch.cuda.graph(graph):
        static_loss = linear_cross_entropy(static_hidden, weight, targets, block_tokens=128, backend=backend)
        static_loss.backward()
    graph.replay()
    torch.cuda.synchronize()
    expected = linear_cross_entropy(hidden, weight.detach(), targets, block_tokens=128, backend=backend)
    torch.testing.assert_close(static_loss, expected)
    assert static_hidden.grad is not None and torch.isfinite(static_hidden.grad).all()


@pytest.mark.parametrize("tied", [False, True], ids=["untied", "tied"])
def test_eager_chunks_allocate_the_head_gradient_once_then_add_into_it(tied):
    """Without the in-place flag: the first chunk's backward hands autograd the head's weight gradient, which
    becomes the ``.grad``; every later one adds into that same tensor; after each chunk every gradient is
    what the plain path's autograd accumulation leaves."""
    fused, plain = _stage(tied, torch.float64), _stage(tied, torch.float64)
    fused.loss_block_tokens = 5
    storage = None
    for seed in (1, 2, 3):
        generator = torch.Generator().manual_seed(seed)
        if tied:
            inputs = torch.randint(0, 53, (1, 13), generator=generator)
        else:
            inputs = torch.randn(1, 13, 32, generator=generator, dtype=torch.float64)
        targets = torch.randint(0, 53, (1, 13), generator=generator)
        for model, loss_name in ((fused, "loss"), (plain, "reference_loss")):
            output, _ = model(inputs, [None])
            (getattr(model, loss_name)(output, targets) / 39).backward()
        storage = storage or fused.head_weight.grad.data_ptr()
        assert fused.head_weight.grad.data_ptr() == storage
        for (name, expected), actual in zip(plain.named_parameters(), fused.parameters()):
            assert _relative_error(actual.grad, expected.grad) < 1e-6, name


def test_the_loss_kernels_are_tritons_on_a_gpu_unless_pytorchs_are_asked_for(monkeypatch):
    from schedlang.runtime.mixer_base import KERNEL_BACKEND_VARIABLE, LOSS_BACKEND_VARIABLE, loss_kernel_backend

    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    monkeypatch.delenv(LOSS_BACKEND_VARIABLE, raising=False)
    monkeypatch.delenv(KERNEL_BACKEND_VARIABLE, raising=False)
    assert loss_kernel_backend(cuda) == "triton" and loss_kernel_backend(cpu) == "torch"
    monkeypatch.setenv(LOSS_BACKEND_VARIABLE, "torch")
    assert loss_kernel_backend(cuda) == "torch"
    monkeypatch.setenv(LOSS_BACKEND_VARIABLE, "triton")
    assert loss_kernel_backend(cuda) == "triton" and loss_kernel_backend(cpu) == "torch"
    monkeypatch.setenv(KERNEL_BACKEND_VARIABLE, "torch")  # every kernel PyTorch's
    assert loss_kernel_backend(cuda) == "torch"
    monkeypatch.delenv(KERNEL_BACKEND_VARIABLE)
    monkeypatch.setenv(LOSS_BACKEND_VARIABLE, "tirton")
    with pytest.raises(ValueError, match="SCHEDLANG_LOSS_BACKEND='tirton'"):
        loss_kernel_backend(cuda)
