"""Tests of flash-linear-attention models: fla's ``Attention`` layer needs ``flash_attn`` at construction, so
the reference stand-in of :mod:`flash_attn_standin` is registered before any test here imports fla."""

import flash_attn_standin

flash_attn_standin.install()
