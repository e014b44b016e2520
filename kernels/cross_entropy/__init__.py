"""Cross-entropy over rows of logits, with the gradient of its sum formed in the same pass.

    from schedlang.kernels.cross_entropy import cross_entropy_rows
    loss, logits_grad = cross_entropy_rows(logits, targets, ignore_index=-100, with_grad=True, backend="auto")

The fused LM head and loss (schedlang.runtime.linear_cross_entropy) calls it once per block of tokens.
"""

from schedlang.kernels.cross_entropy.cross_entropy import cross_entropy_rows, naive_cross_entropy_rows

__all__ = ["cross_entropy_rows", "naive_cross_entropy_rows"]
