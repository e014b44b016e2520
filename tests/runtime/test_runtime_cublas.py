"""cuBLAS without a workspace for graph-replaying stages: who sets it, and when it stays away."""

from __future__ import annotations

import pytest
import torch

from schedlang.runtime import cublas, trainer
from schedlang.runtime.config import PipelineConfig
from schedlang.vocabulary import ModelConfig, TrainConfig


def test_sets_both_variables_when_the_user_chose_neither():
    environ = {"PATH": "/bin"}
    chosen = cublas.use_workspace_free_gemms(environ)
    assert chosen == {"CUBLAS_WORKSPACE_CONFIG": ":0:0", "CUBLASLT_WORKSPACE_SIZE": "0"}
    assert environ == {"PATH": "/bin", **chosen}


@pytest.mark.parametrize(
    "user_setting",
    [
        {"CUBLAS_WORKSPACE_CONFIG": ":4096:8"},  # e.g. for torch.use_deterministic_algorithms
        {"CUBLASLT_WORKSPACE_SIZE": "1024"},
        {"TORCH_BLAS_PREFER_CUBLASLT": "1"},  # cuBLASLt GEMMs fail without a workspace
    ],
)
def test_a_users_choice_stands(user_setting):
    environ = dict(user_setting)
    assert cublas.use_workspace_free_gemms(environ) == {}
    assert environ == user_setting


def test_a_cublaslt_preference_set_in_torch_stands(monkeypatch):
    monkeypatch.setattr(torch.backends.cuda, "preferred_blas_library", lambda: torch._C._BlasBackend.Cublaslt)
    environ = {}
    assert cublas.use_workspace_free_gemms(environ) == {}
    assert environ == {}


class _MeshReached(Exception):
    """launch() got past its cuBLAS setup to the mesh."""


@pytest.mark.parametrize(
    "device_type, cuda_graphs, sets_it",
    [("cuda", True, True), ("cuda", False, False), ("cpu", True, False), ("cpu", False, False)],
)
def test_launch_asks_for_it_only_for_graph_stages_on_cuda(monkeypatch, device_type, cuda_graphs, sets_it):
    calls = []
    monkeypatch.setattr(trainer, "use_workspace_free_gemms", lambda: calls.append("before the mesh"))

    def init_mesh(*args, **kwargs):
        calls.append("mesh")
        raise _MeshReached

    monkeypatch.setattr(trainer, "init_mesh", init_mesh)
    pipeline = PipelineConfig(
        stage_layers=((0,),),
        chunk_boundaries=(0, 4, 8),
        microbatches=1,
        microbatch_size=1,
        stage_actions=((),),
        cuda_graphs=cuda_graphs,
    )
    model = ModelConfig(vocab=16, d_model=8, layers=("gla",), heads=1, head_dim=8, mlp_ratio=2.0)
    with pytest.raises(_MeshReached):
        trainer.launch(model, pipeline, TrainConfig(), (1, 1, 1), device_type)
    assert calls == (["before the mesh", "mesh"] if sets_it else ["mesh"])
