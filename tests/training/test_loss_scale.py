"""fp16's loss scaling ([Note: loss scaling] in schedlang.runtime.loss_scale).

The CPU cannot show an fp16 overflow on demand, so the multi-rank tests run float32 with a dynamic loss
scale and write an inf into one rank's gradient at chosen steps: that step is skipped on every rank (the
pipeline equals one process skipping the same step), the scale halves there and doubles after
``growth_interval`` clean steps as torch.amp.GradScaler's does, gradients are unscaled exactly, and a run
killed after a checkpoint resumes with the same scale and growth count. The ``loss_scale`` key: dynamic by
default with fp16, a number, or none; refused, at the key, with another dtype.
"""

from __future__ import annotations

import json

import pytest
import torch

from training_harness import merged, run_training_job  # noqa: I001 (puts tests/runtime on the path first)
from runtime_harness import assert_trains_like, relative_error
from schedlang.diagnostics import ScheduleError
from schedlang.frontend import load_program_text
from schedlang.vocabulary import LossScaleConfig
from schedlang.runtime.loss_scale import LossScaler
from schedlang.runtime.progress import StepMetrics, StepReporter, progress_line

TOLERANCE = 1e-5
STEPS = 5


def schedule_text(name: str, pipeline: int = 1, dtype: str = "fp32", train_keys: str = "") -> str:
    return f"""schedule {name}
model {{ vocab = 64  d_model = 32  heads = 2  head_dim = 16  layers = [gla, simple_gla]  mlp = swiglu(ratio = 2) }}
mesh {{ pipeline = {pipeline} }}
sequence {{ length = 64  chunks = 2  kernel_chunk = 16 }}
pipeline {{ microbatches = 2  microbatch_size = 1  order = 1f1b }}
train {{
  steps = {STEPS}  seed = 7  dtype = {dtype}  optimizer = adamw(lr = 1e-2)  data = synthetic(seed = 5)
  {train_keys}
}}
"""


def test_the_scale_follows_grad_scalers_rules():
    """The same sequence of overflows gives torch.amp.GradScaler's scales and skips."""
    overflows = [False, True, False, False, False, True, True, False, False]
    ours = LossScaler(LossScaleConfig(initial=1024.0, growth_interval=2), torch.device("cpu"))
    parameter = torch.nn.Parameter(torch.ones(3))
    optimizer = torch.optim.SGD([parameter], lr=0.1)
    theirs = torch.amp.GradScaler("cpu", init_scale=1024.0, growth_interval=2)
    scales = []
    for overflow in overflows:
        value = float("inf") if overflow else 3.0
        gradient = torch.full((3,), value) * float(ours.scale)
        assert ours.unscale([gradient]) is overflow
        if not overflow:
            assert torch.equal(gradient, torch.full((3,), 3.0))
        ours.update()
        theirs.scale(torch.ones(()))  # GradScaler makes its scale at its first scale()
        parameter.grad = torch.full((3,), value) * theirs.get_scale()
        before = parameter.detach().clone()
        theirs.step(optimizer)
        assert torch.equal(parameter.detach(), before) is overflow  # GradScaler skips the same steps
        theirs.update()
        assert float(ours.scale) == theirs.get_scale()
        scales.append(theirs.get_scale())
    assert scales == [1024.0, 512.0, 512.0, 1024.0, 1024.0, 512.0, 256.0, 256.0, 512.0]


def test_a_fixed_scale_skips_overflows_and_stays():
    scaler = LossScaler(LossScaleConfig(dynamic=False, initial=8.0, growth_interval=1), torch.device("cpu"))
    for overflow in (True, False, False):
        assert scaler.unscale([torch.tensor([float("nan") if overflow else 16.0])]) is overflow
        scaler.update()
        assert float(scaler.scale) == 8.0


@pytest.fixture(scope="module")
def poisoned_runs(tmp_path_factory):
    """An inf in one rank's gradient at step 1: pipeline 2 (on the last stage) and one process; one process
    with an inf at its last step, and one without loss scaling that stops before it."""
    directory = tmp_path_factory.mktemp("loss_scale")
    scaled = {"SCHEDLANG_TEST_LOSS_SCALE_INTERVAL": "2", "SCHEDLANG_TEST_INF_STEPS": "1"}
    return {
        "p2": run_training_job(
            {"p2": schedule_text("p2", pipeline=2)}, 2, STEPS, directory, dict(scaled, SCHEDLANG_TEST_INF_RANK="1")
        )["p2"],
        "reference": run_training_job(
            {"reference": schedule_text("reference")}, 1, STEPS, directory, dict(scaled, SCHEDLANG_TEST_INF_RANK="0")
        )["reference"],
        "last_skipped": run_training_job(
            {"last_skipped": schedule_text("last_skipped")},
            1,
            STEPS,
            directory,
            dict(scaled, SCHEDLANG_TEST_INF_RANK="0", SCHEDLANG_TEST_INF_STEPS=str(STEPS - 1)),
            job_name="last_skipped",
        )["last_skipped"],
        "unscaled": run_training_job(
            {"unscaled": schedule_text("unscaled")}, 1, STEPS - 1, directory, job_name="unscaled"
        )["unscaled"],
    }


EXPECTED_SCALES = [(65536.0, False), (65536.0, True), (32768.0, False), (32768.0, False), (65536.0, False)]


@pytest.mark.slow
def test_an_overflow_on_one_rank_skips_the_step_on_every_rank(poisoned_runs):
    for result in poisoned_runs["p2"] + poisoned_runs["reference"]:
        assert result["scales"] == EXPECTED_SCALES, result["rank"]
    outcome = (poisoned_runs["p2"][0]["losses"], merged(poisoned_runs["p2"], "gradients"))
    reference = (poisoned_runs["reference"][0]["losses"], merged(poisoned_runs["reference"], "gradients"))
    assert_trains_like(outcome, reference, STEPS, TOLERANCE)
    final, expected = merged(poisoned_runs["p2"], "updated"), merged(poisoned_runs["reference"], "updated")
    assert all(relative_error(final[name], expected[name]) <= TOLERANCE for name in expected)


@pytest.mark.slow
def test_scaled_gradients_are_unscaled_and_a_skipped_step_changes_nothing(poisoned_runs):
    """Scaled by powers of two, the clean steps equal the unscaled run's; the skipped last step leaves the
    parameters where the unscaled run, one step shorter, leaves them."""
    scaled, unscaled = poisoned_runs["last_skipped"][0], poisoned_runs["unscaled"][0]
    assert scaled["scales"][-1] == (262144.0, True) and not unscaled["scales"]  # grown twice, from 2**16
    for name, gradient in unscaled["gradients"].items():
        assert relative_error(scaled["gradients"][name], gradient) <= TOLERANCE, name
    assert scaled["losses"][: STEPS - 1] == pytest.approx(unscaled["losses"], rel=TOLERANCE)
    for name, value in unscaled["updated"].items():
        assert relative_error(scaled["updated"][name], value) <= TOLERANCE, name


@pytest.mark.slow
def test_resume_keeps_the_scale_and_its_growth_count(tmp_path):
    """An inf at step 0 halves the scale; the checkpoint after step 2 holds one clean step towards growth, so
    only a resume that loads both grows the scale after step 3 as the straight run does."""
    env = {"SCHEDLANG_TEST_LOSS_SCALE_INTERVAL": "2", "SCHEDLANG_TEST_INF_RANK": "1", "SCHEDLANG_TEST_INF_STEPS": "0"}

    def text(name: str) -> str:
        return schedule_text(name, pipeline=2, train_keys=f'checkpoint = "{tmp_path / name}" every 2')

    straight = run_training_job({"straight": text("straight")}, 2, 4, tmp_path, env, "straight")["straight"]
    killed = dict(env, SCHEDLANG_TEST_STOP_AFTER="2")
    run_training_job({"killed": text("killed")}, 2, 4, tmp_path, killed, "first_half")
    resumed = run_training_job({"killed": text("killed")}, 2, 4, tmp_path, env, "second_half")["killed"]
    assert straight[0]["scales"] == [(65536.0, True), (32768.0, False), (32768.0, False), (65536.0, False)]
    for ours, theirs in zip(resumed, straight):
        assert ours["scales"] == theirs["scales"][2:]
        assert all(torch.equal(ours["updated"][name], theirs["updated"][name]) for name in theirs["updated"])
    assert resumed[0]["losses"] == straight[0]["losses"][2:]


def test_the_progress_line_and_metrics_show_the_scale(tmp_path):
    metrics = StepMetrics(3, 2.5, 1000.0, 0.1, 1 << 20, None, 32768.0, True)
    assert progress_line(metrics, 10).endswith("peak mem 1.0 MiB  scale 32768 (skipped: inf/nan gradients)")
    assert "scale" not in progress_line(StepMetrics(3, 2.5, 1000.0, 0.1, 1 << 20), 10)
    path = tmp_path / "metrics.jsonl"
    reporter = StepReporter(10, str(path), stream=open(tmp_path / "out.txt", "w"))
    reporter.report(metrics)
    reporter.close()
    record = json.loads(path.read_text())
    assert record["loss_scale"] == 32768.0 and record["skipped"] is True


def _train(text: str):
    return load_program_text(text, "s.sched").train


def test_fp16_scales_dynamically_by_default_and_writes_it_into_the_script():
    from schedlang import compiler

    assert _train(schedule_text("a", dtype="fp16")).loss_scale == LossScaleConfig()
    assert _train(schedule_text("a", dtype="fp16", train_keys="loss_scale = 1024")).loss_scale == LossScaleConfig(
        dynamic=False, initial=1024.0
    )
    assert _train(schedule_text("a", dtype="fp16", train_keys="loss_scale = none")).loss_scale is None
    assert _train(schedule_text("a", dtype="bf16")).loss_scale is None
    script = compiler.compile_schedule(compiler.ScheduleText(schedule_text("a", dtype="fp16"), "a.sched")).script
    assert "    loss_scale=LossScaleConfig(),\n" in script  # dynamic from 2**16: the record's defaults
    namespace: dict = {}
    exec(compile(script.split("\ndef parse_args")[0], "a.py", "exec"), namespace)
    assert namespace["TRAIN"].loss_scale == LossScaleConfig(dynamic=True, initial=65536.0)
    assert "LossScaleConfig" not in compiler.compile_schedule(
        compiler.ScheduleText(schedule_text("a", dtype="bf16"), "a.sched")
    ).script


@pytest.mark.parametrize(
    ("dtype", "value", "message"),
    [
        ("bf16", "dynamic", "'train.loss_scale' scales fp16 gradients, but train.dtype = bf16"),
        ("fp32", "128", "'train.loss_scale' scales fp16 gradients, but train.dtype = fp32"),
        ("fp16", "sometimes", "'train.loss_scale' must be dynamic, a number or none, found 'sometimes'"),
        ("fp16", "0", "'train.loss_scale' must be"),
    ],
)
def test_a_wrong_loss_scale_is_refused_at_its_key(dtype, value, message):
    text = schedule_text("a", dtype=dtype, train_keys=f"loss_scale = {value}")
    with pytest.raises(ScheduleError) as raised:
        load_program_text(text, "s.sched")
    ((diagnostic),) = raised.value.diagnostics
    line = text.splitlines().index(f"  loss_scale = {value}") + 1
    assert (diagnostic.span.line, diagnostic.span.column) in ((line, 3), (line, 16))
    assert diagnostic.message.startswith(message)


@pytest.mark.slow
def test_fp16_trains_with_the_dynamic_scale_and_skips_real_overflows(tmp_path):
    """fp16 runs on the CPU: pipeline 2 equals one process with the default dynamic scale; a fixed scale of
    1e30 overflows the fp16 gradients of every step, so no step changes the weights."""
    from schedlang.runtime.model import build_stage_model

    pipelined = run_training_job(
        {
            "fp16": schedule_text("fp16", pipeline=2, dtype="fp16"),
            "overflowing": schedule_text("overflowing", pipeline=2, dtype="fp16", train_keys="loss_scale = 1e30"),
        },
        2,
        3,
        tmp_path,
    )
    one = run_training_job({"fp16_one": schedule_text("fp16_one", dtype="fp16")}, 1, 3, tmp_path)["fp16_one"]
    for result in pipelined["fp16"] + one:
        assert result["scales"] == [(65536.0, False)] * 3
    outcome = (pipelined["fp16"][0]["losses"], merged(pipelined["fp16"], "gradients"))
    assert_trains_like(outcome, (one[0]["losses"], merged(one, "gradients")), 3, TOLERANCE)

    program = load_program_text(schedule_text("overflowing", pipeline=2, dtype="fp16"), "s.sched")
    for result in pipelined["overflowing"]:
        assert result["scales"] == [(float(torch.tensor(1e30)), True)] * 3  # the scale is float32
        stage = result["stage"]
        initial = build_stage_model(
            program.model, program.stage_layers[stage], stage == 0, stage == 1, 7,
            torch.device("cpu"), torch.float32,
        )
        assert all(torch.equal(result["updated"][name], value) for name, value in initial.named_parameters())
