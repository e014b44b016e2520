"""How an operator's log-gate lines up with the key dimension of the state.

GLA has one gate per key dimension (g: [B, T, H, K]); simple GLA has one scalar gate per head and token
(g: [B, T, H]). Everything else about the two recurrences is the same, so the code shared by both takes a
GateLayout and uses it wherever a gate-shaped tensor meets a key-shaped one.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class GateLayout:
    gate_per_key: bool

    def over_keys(self, gate: torch.Tensor) -> torch.Tensor:
        """A gate-shaped tensor viewed so it broadcasts against a key-shaped one (trailing axis K)."""
        return gate if self.gate_per_key else gate[..., None]


PER_KEY_GATE = GateLayout(gate_per_key=True)
SCALAR_GATE = GateLayout(gate_per_key=False)
