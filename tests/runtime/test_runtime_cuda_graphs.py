"""pipeline { cuda_graphs = true | step }: slot sizing on the CPU; capture and replay against eager runs on a GPU.

The CPU exactness matrix (test_runtime_exactness.py, p2_n5_cuda_graphs_emulated) runs the slot path with a
stand-in for torch.cuda.make_graphed_callables that keeps its memory hazards; the GPU tests here run the real
capture on every GPU the machine has (one pipeline stage each) and compare with the same schedule run eagerly,
for per-chunk slots ([Note: graph slots]) and for step graphs ([Note: step graphs]).
"""

from __future__ import annotations

import pytest
import torch

from runtime_harness import compile_schedule, relative_error, run_job
from schedlang.lowering.orders import gpipe_orders, one_f_one_b_orders, one_f_one_b_warmup
from schedlang.lowering.placement import place_stage_actions
from schedlang.runtime.cublas import WORKSPACE_FREE_SETTINGS
from schedlang.runtime.graphs import slots_needed
from schedlang.vocabulary import Action, deferred_weight_units


@pytest.mark.parametrize("n_stages, n_microbatches, n_chunks", [(1, 3, 4), (2, 4, 5), (4, 8, 3)])
def test_slots_cover_the_chunks_in_flight(n_stages, n_microbatches, n_chunks):
    """1F1B over chunks keeps N + P - r - 1 chunks of stage r in flight (StateFlow Eq. 13), GPipe all M N;
    with 2 extra warm-up forwards every stage but the last keeps 2 more."""
    total = n_microbatches * n_chunks
    for orders, expected in (
        (one_f_one_b_orders(n_stages, n_microbatches, n_chunks), lambda r: min(n_chunks + n_stages - r - 1, total)),
        (
            one_f_one_b_orders(n_stages, n_microbatches, n_chunks, 2),
            lambda r: min(n_chunks + n_stages - r - 1 + (2 if r < n_stages - 1 else 0), total),
        ),
        (gpipe_orders(n_stages, n_microbatches, n_chunks), lambda r: total),
    ):
        for stage, actions in enumerate(place_stage_actions(orders)):
            parsed = tuple(Action.parse(str(action)) for action in actions)
            assert slots_needed(parsed) == expected(stage)


@pytest.mark.parametrize("n_stages, n_microbatches, n_chunks, extra", [(2, 4, 5, 0), (3, 3, 2, 1), (4, 2, 3, 2)])
def test_split_backward_slots_hold_deferred_chunks_until_their_w(n_stages, n_microbatches, n_chunks, extra):
    """[Note: splitting slots]: a chunk whose W is deferred holds its slot until its W. Stage r > 0 defers the
    W of the backwards whose gradients stage r - 1 consumes in its cool-down ([Note: split backward]), and so
    holds stage r - 1's warm-up count of chunks in flight."""
    orders = one_f_one_b_orders(n_stages, n_microbatches, n_chunks, extra, split_backward=True)
    for stage, actions in enumerate(place_stage_actions(orders)):
        parsed = tuple(Action.parse(str(action)) for action in actions)
        deferred = deferred_weight_units(parsed)
        upstream_warmup = one_f_one_b_warmup(n_stages, n_microbatches, n_chunks, max(stage - 1, 0), extra)
        assert len(deferred) == (0 if stage == 0 else upstream_warmup)
        assert slots_needed(parsed) == upstream_warmup


GPU_SCHEDULE = """schedule {name}
model {{ vocab = 128  d_model = {d_model}  heads = 2  head_dim = {head_dim}  layers = {layers}  mlp = swiglu(ratio = 2) {stage_split} }}
mesh {{ pipeline = {stages} }}
sequence {{ length = {length}  chunks = {chunks}  kernel_chunk = 64 }}
pipeline {{ microbatches = {microbatches}  order = 1f1b  extra_warmup = {extra}  split_backward = {split}  {late} {graphs} }}
train {{ steps = 3  seed = 3  optimizer = adamw(lr = 1e-2)  data = synthetic(seed = 1) }}
"""


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU")
@pytest.mark.parametrize(
    "stages, chunks, microbatches, extra, split_mlp, split, large, late",
    [
        (1, 1, 1, 0, False, False, False, False),
        (1, 4, 1, 0, False, False, False, False),
        (1, 4, 3, 0, False, False, False, False),
        (2, 4, 3, 0, False, False, False, False),
        (2, 4, 3, 2, True, False, False, False),
        (2, 4, 3, 1, False, True, False, False),
        (2, 4, 3, 1, True, True, True, False),
        (2, 4, 3, 1, True, True, True, True),
    ],
    ids=lambda value: str(value),
)
@pytest.mark.parametrize("mode", ["true", "step"])
def test_replayed_graphs_train_like_eager_on_the_gpu(
    tmp_path, stages, chunks, microbatches, extra, split_mlp, split, large, late, mode
):
    """Gradients after the first step first (they say which parameters a replay gets wrong), then the losses.

    With ``split_mlp`` the layers are [gla, mlp, simple_gla, mlp] * 2 and stage 0 ends between a mixer and its
    MLP, so the graphs hold layers without a state. With ``split`` the backwards are split and stage 1 defers
    its cool-down weight gradients ([Note: splitting slots]): eager then records them, graphs replay a W graph.
    ``large`` (d_model 1024, 8K tokens): GEMMs long enough that work racing them changes the numbers. It
    caught W graphs replayed on a second stream beside the chunk graphs (a design measured and dropped:
    docs/log.md, 2026-11-30, "Fused SwiGLU and gate activation, and W on a second stream"): captured on
    torch.cuda.graph's shared capture stream, they shared its cuBLAS workspace with the chunk graphs, and gradients came out wrong. ``late``: ``forward_before_weight``, so
    stage 1 replays a W graph after the next chunk's forward ([Note: forward before weight gradients]).
    ``mode = step``: the first step runs eagerly and the second captures, so the gradients compared are the
    fourth step's, three replays in ([Note: step graphs])."""
    if stages > torch.cuda.device_count():
        pytest.skip(f"needs {stages} GPUs")
    scripts = [
        compile_schedule(
            GPU_SCHEDULE.format(
                name=name,
                stages=stages,
                chunks=chunks,
                microbatches=microbatches,
                extra=extra,
                split="true" if split else "false",
                late="forward_before_weight = true" if late else "",
                graphs=graphs,
                layers="[gla, mlp, simple_gla, mlp] * 2" if split_mlp else "[gla, simple_gla] * 2",
                stage_split="stages = [[0, 1, 2], [3, 4, 5, 6, 7]]" if split_mlp else "",
                d_model=1024 if large else 64,
                head_dim=128 if large else 32,
                length=8192 if large else 512,
            ),
            tmp_path,
            name,
        )
        for name, graphs in (("eager", ""), ("graphs", f"cuda_graphs = {mode}"))
    ]
    # Both runs share one worker process, and launch() gives the graph run no cuBLAS workspace ([Note: GEMMs
    # without a workspace in CUDA graphs]) after the eager run made its GEMMs with one: cuBLAS then picks other
    # kernels, whose float32 sums differ by about 2e-4 at the large sizes. This test compares replay with eager,
    # not one cuBLAS kernel with another, so both runs get the same settings.
    settings = {"SCHEDLANG_TEST_DEVICE": "cuda", **WORKSPACE_FREE_SETTINGS}
    steps = 3
    if mode == "step":
        steps = 5
        settings["SCHEDLANG_TEST_GRADIENT_STEP"] = "3"
    job = run_job(scripts, stages, steps, tmp_path / "job", extra_env=settings)
    assert_replay_matches_eager(job, stages)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU")
@pytest.mark.parametrize("kind, parameter", [("mamba2", "A_log"), ("mamba3", "B_bias")])
@pytest.mark.parametrize("mode", ["true", "step"])
def test_replayed_graphs_of_mamba2_layers_train_like_eager_on_the_gpu(tmp_path, mode, kind, parameter):
    """mamba2 layers (their packed state: the SSD state and the convolution's history) or mamba3 layers (the SSM
    state, the angles and the last key and input) beside simple_gla on two stages, replayed from graphs,
    against eager: gradients after the first step (the fourth with ``step``), then the losses."""
    if torch.cuda.device_count() < 2:
        pytest.skip("needs 2 GPUs")
    scripts = [
        compile_schedule(
            GPU_SCHEDULE.format(
                name=name, stages=2, chunks=4, microbatches=3, extra=0, split="false", late="", graphs=graphs,
                layers=f"[{kind}, simple_gla] * 2", stage_split="", d_model=64, head_dim=32, length=512,
            ),
            tmp_path,
            name,
        )
        for name, graphs in (("eager", ""), ("graphs", f"cuda_graphs = {mode}"))
    ]
    settings = {"SCHEDLANG_TEST_DEVICE": "cuda", **WORKSPACE_FREE_SETTINGS}
    steps = 3
    if mode == "step":
        steps = 5
        settings["SCHEDLANG_TEST_GRADIENT_STEP"] = "3"
    job = run_job(scripts, 2, steps, tmp_path / "job", extra_env=settings)
    assert_replay_matches_eager(job, 2, parameter)


def assert_replay_matches_eager(job, stages: int, parameter: str | None = None) -> None:
    """Run 0 eager, run 1 replayed: every rank exited 0, the same gradients (``parameter`` among their names)
    within 1e-4 relative, then the same losses."""
    assert job.return_codes == [0] * stages, job.errors
    eager_gradients, graph_gradients = job.gradients(0), job.gradients(1)
    assert sorted(eager_gradients) == sorted(graph_gradients)
    assert parameter is None or any(parameter in name for name in eager_gradients)
    errors = {name: relative_error(graph_gradients[name], gradient) for name, gradient in eager_gradients.items()}
    wrong = {name: f"{error:.2e}" for name, error in errors.items() if not error <= 1e-4}
    assert not wrong, f"{len(wrong)} of {len(errors)} gradients differ: {wrong}"
    eager_losses, graph_losses = job.losses(0), job.losses(1)
    for eager, replayed in zip(eager_losses, graph_losses):
        assert abs(replayed - eager) <= 1e-4 * abs(eager), (eager_losses, graph_losses)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU")
@pytest.mark.parametrize(
    "layers, chunks, microbatches, split",
    [
        ("[gla, simple_gla] * 2", 4, 1, False),
        ("[gla, mlp, simple_gla, mlp] * 2", 4, 3, True),
        ("[mamba2, gdn] * 2", 3, 2, False),
    ],
    ids=lambda value: str(value),
)
def test_step_graphs_recomputing_full_train_like_eager_on_the_gpu(tmp_path, layers, chunks, microbatches, split):
    """``cuda_graphs = step`` with ``recompute = full`` on one stage against the same schedule run eagerly:
    ``F`` is captured under no_grad and ``B`` reruns the forward inside its own graph ([Note: recompute under
    step graphs] in schedlang.runtime.executor), so what the rerun reads (the chunk's input, its initial states
    from the previous chunk's ``F`` graph) must survive in the step's pool from ``F`` to ``B``; with ``split``
    the rerun also records the weight gradients a deferred ``W`` graph applies."""
    scripts = [
        compile_schedule(
            GPU_SCHEDULE.format(
                name=name, stages=1, chunks=chunks, microbatches=microbatches, extra=0,
                split="true" if split else "false", late="", graphs=f"recompute = full {graphs}",
                layers=layers, stage_split="", d_model=64, head_dim=32, length=512,
            ),
            tmp_path,
            name,
        )
        for name, graphs in (("eager", ""), ("graphs", "cuda_graphs = step"))
    ]
    settings = {"SCHEDLANG_TEST_DEVICE": "cuda", "SCHEDLANG_TEST_GRADIENT_STEP": "3", **WORKSPACE_FREE_SETTINGS}
    job = run_job(scripts, 1, 5, tmp_path / "job", extra_env=settings)
    assert_replay_matches_eager(job, 1)
