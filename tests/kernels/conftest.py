"""Kernel tests allocate every kernel output NaN-filled, so an element a kernel never writes shows up."""

import os

os.environ["SCHEDLANG_KERNELS_POISON_OUTPUTS"] = "1"
