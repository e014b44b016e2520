"""Root test configuration.

Without a GPU, Triton kernels can only run under its interpreter, and TRITON_INTERPRET is read when
triton is first imported, so it is set here, before any test module imports triton. It changes nothing
for code that picks the PyTorch path explicitly (backend="torch").

Under pytest-xdist every worker would otherwise start one PyTorch thread per core: 16 workers on a 16-core
machine would run 256 threads (the likely reason GPU-machine runs of tests/kernels stalled on their CPU-heavy
tests). Each worker gets its share of the cores instead.
"""

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

if os.environ.get("PYTEST_XDIST_WORKER"):
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // max(1, workers)))
