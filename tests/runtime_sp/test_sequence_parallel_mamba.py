"""mamba2 and mamba3, each alone and in a hybrid with attention, trained on gloo meshes against one process
(losses and every gradient within 1e-5, float32): sequence 2 and 3 and pipeline 2 x sequence 2 with each
sequence-parallel method, recompute modes on pipeline 2, and packed documents on pipeline 2 and data 2. A
negative control: the same file without document ends trains otherwise.

What crosses ranks: mamba2's SSD state through simple GLA's scans (its scalar decay) and its convolution's history
through the rank all-gather; mamba3's SSM state through the same scans with one leading token per rank for the
trapezoid's previous-token term, its last rotated key and input through the rank all-gather, and its angle sums
through the state scan. At each document start every one of these restarts.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "runtime"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "data_packing"))
from runtime_harness import assert_trains_like, relative_error, run_jobs  # noqa: E402
from test_packed_pipeline import END, write_documents  # noqa: E402  (the packing tests' documents)

STEPS = 2
TOLERANCE = 1e-5


@dataclass(frozen=True)
class MambaCase:
    """One Mamba kind: its model keys (every option away from its default where the meshes can tell) and two
    parameter names that only its layers have (the gradients compared include them)."""

    options: str
    own_parameters: tuple[str, str]

    def layers(self, kind: str, hybrid: bool) -> str:
        return f"[{kind}, attn, {kind}, {kind}]" if hybrid else f"[{kind}] * 4"


CASES = {
    "mamba2": MambaCase("state_size = 8  n_groups = 2  conv_kernel = 4  use_bias = true  dt_limit = [0.001, 2.0]",
                        ("A_log", "conv1d")),
    "mamba3": MambaCase("state_size = 8  n_groups = 2  use_bias = true  rope_fraction = 1.0  is_outproj_norm = true",
                        ("B_bias", "C_norm")),
}


def _schedule(kind: str, name: str, hybrid: bool, pipeline: int = 1, sequence: int = 1, parallel: str = "allscan",
              chunks: int = 1, microbatches: int = 1, microbatch_size: int = 4, recompute: str = "none",
              data: str = "synthetic(seed = 5)", data_ranks: int = 1, length: int = 192) -> str:
    case = CASES[kind]
    return f"""schedule {name}
model {{
  vocab = 64  d_model = 32  heads = 4  head_dim = 16
  layers = {case.layers(kind, hybrid)}
  mlp = swiglu(ratio = 2)
  {case.options}
}}
mesh {{ pipeline = {pipeline}  sequence = {sequence}  data = {data_ranks} }}
sequence {{ length = {length}  chunks = {chunks}  kernel_chunk = 16  parallel = {parallel} }}
pipeline {{ microbatches = {microbatches}  microbatch_size = {microbatch_size}  order = 1f1b  recompute = {recompute} }}
train {{ steps = {STEPS}  seed = 7  optimizer = adamw(lr = 1e-2)  data = {data} }}
"""


def _meshes(kind: str, hybrid: bool) -> dict[int, dict[str, str]]:
    prefix = f"{kind}_{'hybrid' if hybrid else 'pure'}"

    def run(name, **keys):
        return {f"{prefix}_{name}": _schedule(kind, f"{prefix}_{name}", hybrid, microbatches=2, microbatch_size=2,
                                              **keys)}

    return {
        1: {f"{prefix}_reference": _schedule(kind, f"{prefix}_reference", hybrid)},
        2: {
            **run("s2_allscan", sequence=2, parallel="allscan(blocks = 2)", chunks=2),
            **run("s2_ring", sequence=2, parallel="ring", chunks=3),
            **run("s2_allgather", sequence=2, parallel="allgather", chunks=2),
            **run("p2_recompute_mixer", pipeline=2, chunks=3, recompute="mixer"),
            **run("p2_recompute_full", pipeline=2, chunks=2, recompute="full"),
        },
        3: {
            **run("s3_ring", sequence=3, parallel="ring", chunks=2),
            **run("s3_allscan", sequence=3, parallel="allscan", chunks=2),
            **run("s3_allgather", sequence=3, parallel="allgather", chunks=1),
        },
        4: {
            **run("p2_s2_allgather", pipeline=2, sequence=2, parallel="allgather", chunks=3),
            **run("p2_s2_allscan", pipeline=2, sequence=2, parallel="allscan(blocks = 2)", chunks=2),
            **run("p2_s2_ring", pipeline=2, sequence=2, parallel="ring", chunks=2),
        },
    }


def _merged(*job_sets: dict[int, dict[str, str]]) -> dict[int, dict[str, str]]:
    merged: dict[int, dict[str, str]] = {}
    for jobs in job_sets:
        for size, schedules in jobs.items():
            merged.setdefault(size, {}).update(schedules)
    return merged


def _mesh_jobs(kind: str) -> dict[int, dict[str, str]]:
    return _merged(_meshes(kind, hybrid=False), _meshes(kind, hybrid=True))


MESH_NAMES = [(kind, name) for kind in CASES for size, jobs in _mesh_jobs(kind).items() if size > 1 for name in jobs]


@pytest.fixture(scope="module")
def mesh_runs(tmp_path_factory):
    """Every kind's runs, one gloo batch per kind (a kind's failure leaves the other's runs standing)."""
    runs = {}
    for kind in CASES:
        runs.update(run_jobs(_mesh_jobs(kind), tmp_path_factory.mktemp(f"{kind}_meshes"), STEPS, wall_timeout_s=900.0))
    return runs


@pytest.mark.slow
@pytest.mark.parametrize("kind, name", MESH_NAMES, ids=[name for _, name in MESH_NAMES])
def test_trains_on_every_mesh_like_one_process(mesh_runs, kind, name):
    reference = "_".join(name.split("_")[:2]) + "_reference"  # mamba2_hybrid_s2_ring -> mamba2_hybrid_reference
    assert_trains_like(mesh_runs[name], mesh_runs[reference], STEPS, TOLERANCE)
    gradients = mesh_runs[name][1]
    assert all(any(own in key for key in gradients) for own in CASES[kind].own_parameters)


@pytest.mark.slow
@pytest.mark.parametrize("kind", sorted(CASES))
def test_packed_documents_on_pipeline_and_data_ranks_equal_one_process(tmp_path, kind):
    documents = tmp_path / "documents.bin"
    write_documents(documents)
    packed = f'tokens(path = "{documents}", seed = 5, document_end = {END})'
    unpacked = f'tokens(path = "{documents}", seed = 5)'

    def schedule(name, **keys):
        return _schedule(kind, name, True, data=keys.pop("data", packed), length=64, **keys)

    outcomes = run_jobs(
        {
            1: {"reference": schedule("reference"), "unpacked": schedule("unpacked", data=unpacked)},
            2: {
                "pipeline": schedule("pipeline", pipeline=2, chunks=4, microbatches=2, microbatch_size=2),
                "data": schedule("data", data_ranks=2, chunks=3, microbatches=2, microbatch_size=1),
            },
        },
        tmp_path,
        STEPS,
        wall_timeout_s=900.0,
    )
    for name in ("pipeline", "data"):
        assert_trains_like(outcomes[name], outcomes["reference"], STEPS, TOLERANCE)
    unpacked_gradients, reference_gradients = outcomes["unpacked"][1], outcomes["reference"][1]
    assert max(relative_error(unpacked_gradients[key], reference_gradients[key]) for key in reference_gradients) > 1e-3
