"""cuBLAS without a workspace, for stages that replay their chunks from CUDA graphs.

[Note: GEMMs without a workspace in CUDA graphs]
With a workspace, nearly every GEMM kernel of a captured chunk comes after a
small memset of cuBLAS's workspace, a graph node of its own with a longer
launch gap ahead of the kernel that follows. With no workspace
(``CUBLAS_WORKSPACE_CONFIG=:0:0`` for cuBLAS and ``CUBLASLT_WORKSPACE_SIZE=0``
for cuBLASLt) cuBLAS picks kernels that need none, and the memsets are gone.
Eager chunks must not have it: without a workspace every GEMM call costs more
host time, and a many-chunk eager step is already host-bound. So only
graph-replaying stages ask for it. The measurements are in docs/benchmarks.md,
"Measurements behind the runtime".

torch reads both variables once, when the process creates its first cuBLAS
handle, so they must be set before the first GEMM. Nothing is set when the
user set either variable, or prefers cuBLASLt (``TORCH_BLAS_PREFER_CUBLASLT=1``
or ``torch.backends.cuda.preferred_blas_library``), whose GEMMs torch refuses
to run without a workspace.
"""

from __future__ import annotations

import os
from collections.abc import MutableMapping

import torch

WORKSPACE_FREE_SETTINGS = {"CUBLAS_WORKSPACE_CONFIG": ":0:0", "CUBLASLT_WORKSPACE_SIZE": "0"}
"""The environment that gives cuBLAS and cuBLASLt no workspace: [Note: GEMMs without a workspace in CUDA graphs]."""


def prefers_cublaslt(environ: MutableMapping[str, str]) -> bool:
    """Whether torch would route its GEMMs through cuBLASLt, which needs a workspace."""
    if environ.get("TORCH_BLAS_PREFER_CUBLASLT", "") not in ("", "0"):
        return True
    return getattr(torch.backends.cuda.preferred_blas_library(), "name", "") == "Cublaslt"


def use_workspace_free_gemms(environ: MutableMapping[str, str] | None = None) -> dict[str, str]:
    """Give cuBLAS no workspace unless the user chose otherwise; returns the variables this call set.

    Call it before the process's first GEMM ([Note: GEMMs without a workspace in CUDA graphs]); later it
    changes nothing. Sets nothing on ROCm, when torch prefers cuBLASLt, or when either variable is already
    in ``environ`` (``os.environ`` by default): the user's choice of workspace stands.
    """
    environ = os.environ if environ is None else environ
    user_chose = any(name in environ for name in WORKSPACE_FREE_SETTINGS)
    if user_chose or torch.version.hip is not None or prefers_cublaslt(environ):
        return {}
    environ.update(WORKSPACE_FREE_SETTINGS)
    return dict(WORKSPACE_FREE_SETTINGS)


__all__ = ["WORKSPACE_FREE_SETTINGS", "prefers_cublaslt", "use_workspace_free_gemms"]
