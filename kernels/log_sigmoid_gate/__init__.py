"""The log-forget-gate activation of GLA and Gated DeltaNet: ``logsigmoid(x) / normalizer`` in float32.

    from schedlang.kernels.log_sigmoid_gate import log_sigmoid_gate
    g = log_sigmoid_gate(gate_logits, normalizer=16.0, backend="auto")   # [..., W] -> [..., W] float32
"""

from schedlang.kernels.log_sigmoid_gate.gate import log_sigmoid_gate, naive_log_sigmoid_gate

__all__ = ["log_sigmoid_gate", "naive_log_sigmoid_gate"]
