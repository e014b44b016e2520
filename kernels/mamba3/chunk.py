"""The chunked Mamba-3 SISO operator: simple GLA's chunk kernels on the trapezoidal update's operands.

kernels/mamba3/README.md derives the map. In short: with ``q_t = R(theta_t) C_t``, ``k_t = R(theta_t) B_t``,
``e_t = (1 - trap_t) dt_t`` (the weight with which token ``t`` reads the previous token's term) and

    s_t = trap_t dt_t + e_{t+1}            (e_{t+1} = 0 after the last token of the call)

the recurrence ``h_t = alpha_t h_{t-1} + alpha_t e_t k_{t-1}^T x_{t-1} + trap_t dt_t k_t^T x_t`` is simple GLA's
``S_t = exp(g_t) S_{t-1} + k'_t^T v_t`` with ``k' = s k``, ``v = x``, ``g = adt``, started from
``S_0 = h_0 + e_0 k_prev^T x_prev`` (the carried last token's term), except that token ``t``'s own output must
not yet see its ``e_{t+1}`` share: ``y_t = o_t - e_{t+1} (q_t . k_t) x_t + D x_t``. The simple-GLA state after
the last token is ``h`` itself (its ``e`` share is 0), so the state carried out is ``(theta, h, k_last,
x_last)``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from schedlang.kernels.common import check_floating_tensor
from schedlang.kernels.simple_gla import chunk_simple_gla

TWO_PI = 2.0 * math.pi


@dataclass(frozen=True)
class Mamba3State:
    """What a Mamba-3 head carries between calls, per batch row: ``angle`` ``[B, H, A]`` (the cumulative rotary
    angles, in ``[0, 2 pi)``), ``ssm`` ``[B, H, N, P]`` (``h``, simple GLA's layout), ``key`` ``[B, H, N]`` (the
    last token's rotated B) and ``value`` ``[B, H, P]`` (the last token's x)."""

    angle: torch.Tensor
    ssm: torch.Tensor
    key: torch.Tensor
    value: torch.Tensor

    def parts(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        return self.angle, self.ssm, self.key, self.value


@dataclass(frozen=True)
class TrapezoidOperands:
    """Simple GLA's operands for the trapezoidal update (module docstring): ``q`` and ``k`` (scaled by ``s``)
    ``[B, T, H, N]``, ``v`` ``[B, T, H, P]``, ``g`` ``[B, T, H]``; ``entry`` ``[B, H]``, the first token's ``e``
    (the weight of the carried term); ``diagonal`` ``[B, T, H, P]``, what each token's output loses:
    ``e_{t+1} (q_t . k_t) x_t``."""

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    g: torch.Tensor
    entry: torch.Tensor
    diagonal: torch.Tensor


def wrap_angle(angle: torch.Tensor) -> torch.Tensor:
    """``angle`` modulo ``2 pi`` into ``[0, 2 pi)`` (mamba_ssm's convention; the gradient passes as is)."""
    return angle - TWO_PI * torch.floor(angle / TWO_PI).detach()


def cumulative_angles(
    angles: torch.Tensor, dt: torch.Tensor, initial: torch.Tensor | None, restarts: torch.Tensor | None = None
) -> torch.Tensor:
    """``theta_t = theta_{t-1} + dt_t angles_t`` from ``initial`` (``[B, H, A]``, None: zeros), wrapped into
    ``[0, 2 pi)``: ``[B, T, H, A]`` in float32 (float64 for float64). ``restarts`` ``[B, T]`` (bool), where given:
    the sum restarts from zero at those tokens (document starts), without ``initial``."""
    compute = torch.promote_types(angles.dtype, torch.float32)
    steps = angles.to(compute) * dt.to(compute)[..., None]
    total = steps.cumsum(dim=1)
    if restarts is not None:
        # subtract the sum before each token's segment start: a running max of restart positions.
        length = steps.shape[1]
        positions = torch.arange(length, device=steps.device).expand(restarts.shape)
        segment_start = torch.where(restarts, positions, torch.zeros_like(positions)).cummax(dim=1).values
        before = torch.cat([torch.zeros_like(total[:, :1]), total[:, :-1]], dim=1)
        offset = before.gather(1, segment_start[:, :, None, None].expand_as(before))
        total = total - offset
    if initial is not None:
        carried = initial.to(compute)[:, None]
        if restarts is not None:
            carried = carried * (~restarts).cumprod(dim=1).to(compute)[:, :, None, None]
        total = total + carried
    return wrap_angle(total)


def rotate_pairs(tensor: torch.Tensor, angle: torch.Tensor) -> torch.Tensor:
    """``tensor`` ``[..., N]`` with each pair ``(2i, 2i + 1)``, ``i < A``, turned by ``angle[..., i]`` (``angle``
    ``[..., A]``, ``2 A <= N``); the rows past ``2 A`` unturned. In the wider of the two dtypes."""
    compute = torch.promote_types(tensor.dtype, angle.dtype)
    turned = 2 * angle.shape[-1]
    pairs = tensor[..., :turned].to(compute).unflatten(-1, (-1, 2))
    first, second = pairs[..., 0], pairs[..., 1]
    cos, sin = torch.cos(angle.to(compute)), torch.sin(angle.to(compute))
    rotated = torch.stack((first * cos - second * sin, first * sin + second * cos), dim=-1).flatten(-2)
    return torch.cat((rotated, tensor[..., turned:].to(compute)), dim=-1)


def trapezoid_operands(
    q: torch.Tensor,
    k: torch.Tensor,
    x: torch.Tensor,
    dt: torch.Tensor,
    adt: torch.Tensor,
    trap: torch.Tensor,
    starts: torch.Tensor | None = None,
) -> TrapezoidOperands:
    """The operands of the module docstring from the rotated ``q`` and ``k`` ``[B, T, H, N]`` and ``x``, ``dt``,
    ``adt``, ``trap``. ``starts`` ``[B, T]`` (bool), where given: tokens that read no previous term (document
    starts), so ``e`` is zero there. Differentiable; float32 (float64 for float64) but ``v = x`` as it is."""
    compute = torch.promote_types(x.dtype, torch.float32)
    dt, adt, trap = dt.to(compute), adt.to(compute), trap.to(compute)
    entry_weight = (1.0 - trap) * dt
    if starts is not None:
        entry_weight = entry_weight * (~starts).to(compute)[..., None]
    following = torch.cat([entry_weight[:, 1:], torch.zeros_like(entry_weight[:, :1])], dim=1)
    scale = trap * dt + following
    q, k = q.to(compute), k.to(compute)
    diagonal = (following * (q * k).sum(-1))[..., None] * x.to(compute)
    return TrapezoidOperands(
        q=q, k=k * scale[..., None], v=x, g=adt, entry=entry_weight[:, 0], diagonal=diagonal
    )


def entry_state(ssm: torch.Tensor | None, key: torch.Tensor, value: torch.Tensor, entry: torch.Tensor) -> torch.Tensor:
    """``h_0 + e_0 k_prev^T x_prev``: the simple-GLA state a call starts from (``ssm`` None: zeros)."""
    term = entry[..., None, None] * key.to(entry.dtype)[..., :, None] * value.to(entry.dtype)[..., None, :]
    return term if ssm is None else ssm.to(entry.dtype) + term


def _check_arguments(x, dt, adt, trap, B, C, angles, D) -> None:
    for name, tensor in (("x", x), ("dt", dt), ("adt", adt), ("trap", trap), ("B", B), ("C", C), ("angles", angles)):
        check_floating_tensor(name, tensor)
    if x.dim() != 4:
        raise ValueError(f"x must have shape [B, T, H, P], got {tuple(x.shape)}")
    batch, length, heads, _ = x.shape
    for name, tensor in (("dt", dt), ("adt", adt), ("trap", trap)):
        if tuple(tensor.shape) != (batch, length, heads):
            raise ValueError(f"{name} must have shape [B, T, H] = {[batch, length, heads]}, got {tuple(tensor.shape)}")
    if B.dim() != 4 or tuple(B.shape[:3]) != (batch, length, heads):
        raise ValueError(f"B must have shape [B, T, H, N] = [{batch}, {length}, {heads}, N], got {tuple(B.shape)}")
    if C.shape != B.shape:
        raise ValueError(f"C must have B's shape {tuple(B.shape)}, got {tuple(C.shape)}")
    if angles.dim() != 4 or tuple(angles.shape[:3]) != (batch, length, heads) or 2 * angles.shape[-1] > B.shape[-1]:
        raise ValueError(
            f"angles must have shape [B, T, H, A] with 2 A <= N = {B.shape[-1]}, got {tuple(angles.shape)}"
        )
    if D is not None and tuple(D.shape) != (heads,):
        raise ValueError(f"D must have shape [H] = [{heads}], got {tuple(D.shape)}")


def chunk_mamba3(
    x: torch.Tensor,
    dt: torch.Tensor,
    adt: torch.Tensor,
    trap: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    angles: torch.Tensor,
    D: torch.Tensor | None = None,
    initial_state: Mamba3State | None = None,
    output_final_state: bool = False,
    backend: str = "auto",
) -> tuple[torch.Tensor, Mamba3State | None]:
    """Chunked Mamba-3 SISO (module docstring; kernels/mamba3/README.md).

    Args:
        x: [B, T, H, P]. dt: [B, T, H], the time step (> 0). adt: [B, T, H], ``A dt`` (<= 0).
        trap: [B, T, H], the trapezoid's weight of the current token, in [0, 1] (fla's ``sigmoid(trap)``).
        B, C: [B, T, H, N], per head, normalised and with their biases added (the layer expands groups).
        angles: [B, T, H, A], the rotary angle rates (fla's ``pi tanh(angles)``), ``2 A <= N``.
        D: [H] or None (no skip). initial_state: :class:`Mamba3State` or None (zeros).
        output_final_state: also return the state after the last token.
        backend: "auto", "triton" or "torch", as for :func:`schedlang.kernels.chunk_simple_gla`.
    Returns:
        y: [B, T, H, P] in x's dtype; the final :class:`Mamba3State` (float32, or float64 for float64 inputs;
        ``key`` and ``value`` as the inputs' last token) or None.
    Gradients flow to every input and every part of the initial state, and from every part of the final state.
    """
    _check_arguments(x, dt, adt, trap, B, C, angles, D)
    theta = cumulative_angles(angles, dt, None if initial_state is None else initial_state.angle)
    q, k = rotate_pairs(C, theta), rotate_pairs(B, theta)
    operands = trapezoid_operands(q, k, x, dt, adt, trap)
    start = None
    if initial_state is not None:
        start = entry_state(initial_state.ssm, initial_state.key, initial_state.value, operands.entry)
    # [Note: mamba3 operator precision] The operator runs in float32 (float64 for float64) whatever x's dtype:
    # its dq and dk carry the diagonal term that the subtraction below takes out again, and the angles' gradient
    # is a reverse cumulative sum of their rotations that nearly cancels, so 16-bit dq and dk left the angles'
    # gradients 6-20% off the float64 recurrence (docs/models.md, "Mamba-3", precision).
    kernel = operands.diagonal.dtype
    output, final_ssm = chunk_simple_gla(
        operands.q.to(kernel), operands.k.to(kernel), operands.v.to(kernel), operands.g, scale=1.0,
        initial_state=start, output_final_state=output_final_state, backend=backend,
    )
    output = output.to(operands.diagonal.dtype) - operands.diagonal
    if D is not None:
        output = output + D.to(output.dtype)[:, None] * x.to(output.dtype)
    final = None
    if output_final_state:
        final = Mamba3State(theta[:, -1], final_ssm, k[:, -1], x[:, -1].to(k.dtype))
    return output.to(x.dtype), final
