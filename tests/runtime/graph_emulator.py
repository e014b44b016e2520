"""A CPU stand-in for torch.cuda.make_graphed_callables that keeps its memory hazards, for runtime tests.

The real function replays captured graphs whose outputs live in static buffers: each forward replay
overwrites the outputs of the last one, and the backward's gradient buffers may share memory with the
forward's activations, so the next forward replay clobbers them. This stand-in runs the module eagerly but
hands out the same kind of static buffers and, at every forward, fills the gradient buffers of the last
backward with NaN and overwrites its output buffers. A runtime that keeps a slot's gradients past the slot's
next forward, lets autograd adopt a static buffer as a parameter's ``.grad``, or runs two forwards of one slot
before its backward gets NaN or wrong numbers instead of the eager results. Like the real function it keeps
the sample arguments themselves as the static inputs that every replay copies its arguments into, so two
slots captured on the same sample tensors share their inputs (a bug the first GPU run found) and fail here;
it runs ``num_warmup_iters`` forward+backward warm-ups on the sample arguments, whose output gradients are
uninitialised memory in torch and NaN here (a backward that adds into ``.grad`` during them leaves NaN there
unless the runtime clears it); and a gradient autograd does not give (None) is handed out as None, as torch
hands it, so autograd adds nothing for it.
"""

from __future__ import annotations

import torch
from torch import nn


def emulated_make_graphed_callables(
    module: nn.Module, sample_args: tuple, num_warmup_iters: int = 3, allow_unused_input: bool = False, pool=None
) -> nn.Module:
    original_forward = module.forward
    parameters = tuple(module.parameters())
    static_inputs = tuple(sample_args)  # as torch does: the sample arguments are the static inputs
    surface = static_inputs + parameters
    live = {"outputs": None, "in_backward_order": False}
    static_outputs: list[torch.Tensor] = []
    static_grads: list[torch.Tensor | None] = [
        torch.empty_like(tensor) if tensor.requires_grad else None for tensor in surface
    ]

    for _ in range(num_warmup_iters):
        outputs = [output for output in original_forward(*static_inputs) if output.requires_grad]
        torch.autograd.grad(
            outputs,
            [tensor for tensor in surface if tensor.requires_grad],
            [torch.full_like(output, float("nan")) for output in outputs],
            allow_unused=allow_unused_input,
        )

    class Emulated(torch.autograd.Function):
        @staticmethod
        def forward(ctx, *inputs):
            if live["outputs"] is not None and not live["in_backward_order"]:
                raise AssertionError("a slot replayed its forward twice without its backward in between")
            for buffer in static_grads:
                if buffer is not None:
                    buffer.fill_(float("nan"))
            with torch.no_grad():
                for static, value in zip(static_inputs, inputs[: len(static_inputs)]):
                    static.copy_(value)
            with torch.enable_grad():
                outputs = tuple(original_forward(*static_inputs))
            if not static_outputs:
                static_outputs.extend(torch.empty_like(output) for output in outputs)
            with torch.no_grad():
                for buffer, output in zip(static_outputs, outputs):
                    buffer.copy_(output)
            live["outputs"], live["in_backward_order"] = outputs, False
            return tuple(buffer.detach() for buffer in static_outputs)

        @staticmethod
        @torch.autograd.function.once_differentiable
        def backward(ctx, *grads):
            outputs = live["outputs"]
            wanted = [tensor for tensor in surface if tensor.requires_grad]
            pairs = [(output, grad) for output, grad in zip(outputs, grads) if output.requires_grad]
            results = iter(
                torch.autograd.grad(
                    [output for output, _ in pairs],
                    wanted,
                    [grad for _, grad in pairs],
                    allow_unused=allow_unused_input,
                )
            )
            handed = []
            for tensor, buffer in zip(surface, static_grads):
                if buffer is None:
                    handed.append(None)
                    continue
                result = next(results)
                if result is None:
                    handed.append(None)
                    continue
                buffer.copy_(result)
                handed.append(buffer.detach())
            live["in_backward_order"] = True
            return tuple(handed)

    def graphed_forward(*args):
        return Emulated.apply(*args, *parameters)

    module.forward = graphed_forward
    return module
