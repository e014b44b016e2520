"""Root test configuration.

Without a GPU, Triton kernels can only run under its interpreter, and TRITON_INTERPRET is read when
triton is first imported, so it is set here, before any test module imports triton. It changes nothing
for code that picks the PyTorch path explicitly (backend="torch").
"""

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
