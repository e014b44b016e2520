"""SwiGLU's activation on a fused gate-and-up projection: ``silu(gate) * up``, one kernel each way.

    from schedlang.kernels.swiglu import swiglu
    hidden = swiglu(gate_up, backend="auto")   # gate_up [..., 2H] = [gate | up]  ->  [..., H]
"""

from schedlang.kernels.swiglu.swiglu import naive_swiglu, swiglu

__all__ = ["naive_swiglu", "swiglu"]
