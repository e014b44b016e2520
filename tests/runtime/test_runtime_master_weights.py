"""``train.master_weights`` ([Note: master weights] in schedlang.runtime.master_weights) on CPU gloo ranks.

A bf16 run keeps fp32 parameters, gradients and optimizer state (the checkpoint's dtypes say so) while the
model computes in bf16; pipelined and data-parallel runs equal one process with the same chunks and
microbatches (so the same bf16 arithmetic) within the exactness tolerance; with many chunks the fp32
accumulation is closer to a float64 run than the all-bf16 path; a killed run resumes exactly; the opt-out
keeps everything in bf16; and the memory model's static bytes are what the runtime allocates.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed.checkpoint as dcp

from runtime_harness import compile_schedule, relative_error, run_job
from schedlang.diagnostics import ScheduleError
from schedlang.frontend import load_program_text
from schedlang.lowering.memory_terms import StaticPart, static_bytes
from schedlang.vocabulary import TrainConfig
from schedlang.runtime.master_weights import MasterWeights
from schedlang.runtime.model import build_stage_model
from schedlang.runtime.trainer import build_optimizer

TOLERANCE = 1e-5  # test_runtime_exactness.py's


def schedule_text(
    name: str,
    pipeline: int = 1,
    data: int = 1,
    chunks: int = 2,
    microbatches: int = 2,
    microbatch_size: int = 1,
    length: int = 64,
    dtype: str = "bf16",
    pipeline_keys: str = "",
    train_keys: str = "",
    steps: int = 3,
) -> str:
    return f"""schedule {name}
model {{ vocab = 64  d_model = 32  heads = 2  head_dim = 16  layers = [gla, simple_gla]  mlp = swiglu(ratio = 2) }}
mesh {{ pipeline = {pipeline}  data = {data} }}
sequence {{ length = {length}  chunks = {chunks}  kernel_chunk = 16 }}
pipeline {{ microbatches = {microbatches}  microbatch_size = {microbatch_size}  order = 1f1b  {pipeline_keys} }}
train {{
  steps = {steps}  seed = 7  dtype = {dtype}  optimizer = adamw(lr = 1e-2)  data = synthetic(seed = 5)
  {train_keys}
}}
"""


# name -> (schedule, the one-process schedule with the same chunks and microbatches)
DISTRIBUTED = {
    "p2_n2_1f1b": (
        schedule_text("p2_n2_1f1b", pipeline=2, microbatch_size=2),
        schedule_text("reference_p2_n2_1f1b", microbatch_size=2),
    ),
    # the in-place weight-gradient GEMMs of graph slots, through the CPU stand-in for CUDA graphs
    "p2_n2_cuda_graphs_emulated": (
        schedule_text("p2_n2_cuda_graphs_emulated", pipeline=2, microbatches=4, pipeline_keys="cuda_graphs = true"),
        schedule_text("reference_p2_n2_cuda_graphs_emulated", microbatches=4),
    ),
    # deferred W tasks add their weight gradients after B has accumulated the rest
    "p2_n3_split_backward": (
        schedule_text("p2_n3_split_backward", pipeline=2, chunks=3, microbatches=4, length=96,
                      pipeline_keys="split_backward = true"),
        schedule_text("reference_p2_n3_split_backward", chunks=3, microbatches=4, length=96),
    ),
    # two data replicas of one stage each: the fp32 gradients are all-reduced
    "d2_n2": (
        schedule_text("d2_n2", data=2, microbatches=2),
        schedule_text("reference_d2_n2", microbatches=4),
    ),
}


@pytest.fixture(scope="module")
def distributed_runs(tmp_path_factory):
    """name -> ((losses, gradients), (reference losses, reference gradients))."""
    directory = tmp_path_factory.mktemp("master_weights")
    names = list(DISTRIBUTED)
    references = [compile_schedule(DISTRIBUTED[name][1], directory, f"reference_{name}") for name in names]
    runs = [compile_schedule(DISTRIBUTED[name][0], directory, name) for name in names]
    reference_job = run_job(references, 1, 3, directory / "world1")
    assert reference_job.return_codes == [0], reference_job.errors
    job = run_job(runs, 2, 3, directory / "world2")
    assert job.return_codes == [0, 0], job.errors
    return {
        name: (
            (job.losses(index), job.gradients(index)),
            (reference_job.losses(index), reference_job.gradients(index)),
        )
        for index, name in enumerate(names)
    }


@pytest.mark.slow
@pytest.mark.parametrize("name", list(DISTRIBUTED))
def test_distributed_master_weights_match_one_process(distributed_runs, name):
    (losses, gradients), (reference_losses, reference_gradients) = distributed_runs[name]
    assert sorted(gradients) == sorted(reference_gradients)
    for key, gradient in gradients.items():
        assert gradient.dtype == torch.float32, key
        error = relative_error(gradient, reference_gradients[key])
        assert error <= TOLERANCE, f"{key}: relative error {error:.2e}"
    assert len(losses) == 3 and losses[0] != losses[-1]
    for step, (loss, reference) in enumerate(zip(losses, reference_losses)):
        assert abs(loss - reference) <= TOLERANCE * abs(reference), f"step {step}: {loss} vs {reference}"


@pytest.mark.slow
def test_fp32_accumulation_over_many_chunks_is_closer_to_float64(tmp_path):
    """16 chunks x 4 microbatches: 64 backwards add into each weight gradient. Summed in bf16 the gradients
    drift from a float64 run's by several times what the bf16 compute of each chunk costs; summed in fp32
    (master weights) they do not."""
    many = {"chunks": 16, "microbatches": 4, "length": 512, "steps": 1}
    scripts = [
        compile_schedule(schedule_text(name, dtype=dtype, train_keys=keys, **many), tmp_path, name)
        for name, dtype, keys in (
            ("float64", "fp64", ""),
            ("master", "bf16", ""),
            ("all_bf16", "bf16", "master_weights = false"),
        )
    ]
    job = run_job(scripts, 1, 1, tmp_path / "job")
    assert job.return_codes == [0], job.errors
    reference, master, all_bf16 = job.gradients(0), job.gradients(1), job.gradients(2)
    for key, gradient in reference.items():
        assert master[key].dtype == torch.float32 and all_bf16[key].dtype == torch.bfloat16, key
        master_error = relative_error(master[key], gradient)
        bf16_error = relative_error(all_bf16[key], gradient)
        assert master_error < 0.6 * bf16_error, f"{key}: fp32 sum {master_error:.2e}, bf16 sum {bf16_error:.2e}"
        assert master_error < 2e-2, f"{key}: {master_error:.2e}"


def checkpoint_dtypes(step_directory) -> dict[str, torch.dtype]:
    """Every tensor entry of a torch.distributed.checkpoint directory and its dtype."""
    metadata = dcp.FileSystemReader(str(step_directory)).read_metadata().state_dict_metadata
    return {
        key: entry.properties.dtype
        for key, entry in metadata.items()
        if hasattr(entry, "properties") and entry.size != torch.Size([])
    }


@pytest.mark.slow
def test_resume_is_exact_and_checkpoints_hold_fp32_master_state(tmp_path):
    """A cosine schedule, killed after step 3 with its last checkpoint at step 2: the resumed steps redo the
    uninterrupted run's losses exactly, which needs the fp32 master weights and Adam moments restored and
    the bf16 model recomputed from them. The opt-out's checkpoints hold bf16 state (today's behaviour)."""
    cosine = "lr_schedule = cosine(warmup = 1, min_lr = 1e-3)"

    def script(name: str, extra: str = "") -> object:
        keys = f'checkpoint = "{tmp_path / name}" every 2  {cosine}  {extra}'
        return compile_schedule(schedule_text(name, pipeline=2, steps=4, train_keys=keys), tmp_path, name)

    full, resumed, opt_out = script("full"), script("resumed"), script("opt_out", "master_weights = false")
    assert "master_weights=False" in opt_out.read_text() and "master_weights" not in full.read_text()
    full_job = run_job([full, opt_out], 2, 4, tmp_path / "job-full")
    assert full_job.return_codes == [0, 0], full_job.errors
    first_part = run_job([resumed], 2, 4, tmp_path / "job-first", {"SCHEDLANG_TEST_STOP_AFTER": "3"})
    assert first_part.return_codes == [0, 0], first_part.errors
    second_part = run_job([resumed], 2, 4, tmp_path / "job-second")
    assert second_part.return_codes == [0, 0], second_part.errors
    full_losses = full_job.losses(0)
    assert first_part.losses(0) == full_losses[:3]
    assert second_part.losses(0) == full_losses[2:]

    for name, expected in (("full", torch.float32), ("opt_out", torch.bfloat16)):
        dtypes = checkpoint_dtypes(tmp_path / name / "step-00000004")
        model = {key: dtype for key, dtype in dtypes.items() if key.startswith("model.")}
        moments = {key: dtype for key, dtype in dtypes.items() if key.endswith(("exp_avg", "exp_avg_sq"))}
        assert "model.layers.0.mixer.q_proj.weight" in model and "model.embedding.weight" in model  # stage 0
        assert "model.lm_head.weight" in model  # and stage 1
        assert len(moments) == 2 * len(model)
        assert set(model.values()) == {expected} and set(moments.values()) == {expected}, (name, dtypes)


def test_static_bytes_are_what_a_master_weight_stage_allocates():
    """The memory model's parameters, gradients and optimizer terms against the tensors a bf16 stage with
    master weights holds after a step: bf16 parameters and .grad, their fp32 copies, AdamW's fp32 moments."""
    program = load_program_text(schedule_text("static", chunks=1, microbatches=1))
    config = program.model
    model = build_stage_model(config, program.stage_layers[0], True, True, 7, torch.device("cpu"), torch.float32)
    master = MasterWeights(model, torch.bfloat16)
    optimizer = build_optimizer(master.parameters(), TrainConfig(dtype="bf16"))
    tokens = torch.randint(0, config.vocab, (1, 17))
    hidden, _ = model(tokens[:, :-1], [None] * model.n_states)
    model.loss(hidden, tokens[:, 1:]).backward()
    master.accumulate_gradients()
    optimizer.step()
    master.copy_to_model()

    def size(tensors) -> int:
        return sum(tensor.numel() * tensor.element_size() for tensor in tensors)

    assert {parameter.dtype for parameter in model.parameters()} == {torch.bfloat16}
    assert {parameter.grad.dtype for parameter in model.parameters()} == {torch.bfloat16}
    held = {
        StaticPart.PARAMETERS: size(model.parameters()) + size(master.parameters()),
        StaticPart.GRADIENTS: size(p.grad for p in model.parameters()) + size(p.grad for p in master.parameters()),
        StaticPart.OPTIMIZER: size(
            value for state in optimizer.state.values() for value in state.values() if value.dim() > 0
        ),
    }
    assert held == static_bytes(program, 0)
    assert all(parameter.grad.count_nonzero() == 0 for parameter in model.parameters())
    for parameter, copy in zip(model.parameters(), master.parameters()):
        assert torch.equal(parameter, copy.to(torch.bfloat16))


def test_master_weights_is_a_checked_key():
    program = load_program_text(schedule_text("flag", train_keys="master_weights = false"))
    assert not program.train.keeps_master_weights
    assert load_program_text(schedule_text("default")).train.keeps_master_weights
    assert not load_program_text(schedule_text("fp32", dtype="fp32")).train.keeps_master_weights
    with pytest.raises(ScheduleError) as raised:
        load_program_text(schedule_text("bad", train_keys="master_weights = 1"), "bad.sched")
    assert str(raised.value).splitlines() == [
        "bad.sched:8:20: error: 'train.master_weights' must be true or false, found '1'",
        "  master_weights = 1",
        "                   ^",
    ]


GPU_SCHEDULE = """schedule {name}
model {{ vocab = 128  d_model = 64  heads = 2  head_dim = 32  layers = [gla, simple_gla] * 2  mlp = swiglu(ratio = 2) }}
mesh {{ pipeline = 1 }}
sequence {{ length = 512  chunks = 4  kernel_chunk = 64 }}
pipeline {{ microbatches = 3  order = 1f1b  {graphs} }}
train {{ steps = 5  seed = 3  dtype = bf16  optimizer = adamw(lr = 1e-2)  data = synthetic(seed = 1) }}
"""
GPU_TOLERANCE = 5e-3  # bf16: the captured in-place weight-gradient GEMMs need not round like eager's GEMM and add


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU")
@pytest.mark.parametrize("mode", ["true", "step"])
def test_cuda_graphs_with_master_weights_train_like_eager(tmp_path, mode):
    """The graphs read the bf16 parameters by address and add into the bf16 ``.grad``s; the fp32 gradients are
    accumulated after each replayed B (inside the step graph with ``step``) and the optimizer's fp32 result is
    copied into the bf16 parameters in place, so every replay after a step computes with the new weights.
    Gradients of step 3 (three replays in with ``step``), then the losses of five steps."""
    from schedlang.runtime.cublas import WORKSPACE_FREE_SETTINGS

    scripts = [
        compile_schedule(GPU_SCHEDULE.format(name=name, graphs=graphs), tmp_path, name)
        for name, graphs in (("eager", ""), ("graphs", f"cuda_graphs = {mode}"))
    ]
    settings = {"SCHEDLANG_TEST_DEVICE": "cuda", "SCHEDLANG_TEST_GRADIENT_STEP": "3", **WORKSPACE_FREE_SETTINGS}
    job = run_job(scripts, 1, 5, tmp_path / "job", extra_env=settings)
    assert job.return_codes == [0], job.errors
    eager_gradients, graph_gradients = job.gradients(0), job.gradients(1)
    assert sorted(eager_gradients) == sorted(graph_gradients)
    for name, gradient in eager_gradients.items():
        assert gradient.dtype == graph_gradients[name].dtype == torch.float32, name
        error = relative_error(graph_gradients[name], gradient)
        assert error <= GPU_TOLERANCE, f"{name}: relative error {error:.2e}"
    for eager, replayed in zip(job.losses(0), job.losses(1)):
        assert abs(replayed - eager) <= GPU_TOLERANCE * abs(eager), (job.losses(0), job.losses(1))
