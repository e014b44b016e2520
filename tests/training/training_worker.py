"""One rank of a tests/training job: ``tests/runtime/rank_worker.py``'s runs, saving more of each.

Besides the losses and the first step's gradients, each result holds every parameter of the stage after the
last step (the computing model's and the optimizer's), and, with loss scaling, each step's scale and whether
it was skipped. Started by ``runtime_harness.run_job`` (its ``WORKER`` pointed here).

Usage: training_worker.py OUT_DIR STEPS SCRIPT [SCRIPT ...]
Environment knobs: SCHEDLANG_TEST_STOP_AFTER (as rank_worker's), SCHEDLANG_TEST_LOSS_SCALE_INTERVAL (run the
script with a dynamic loss scale growing after that many clean steps, whatever its dtype),
SCHEDLANG_TEST_INF_RANK and SCHEDLANG_TEST_INF_STEPS (comma-separated): that rank writes an inf into its first
gradient before the reduction of those steps; SCHEDLANG_TEST_DEVICE (cpu by default).
"""

import dataclasses
import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "runtime"))

from rank_worker import load_script  # noqa: E402
from rank_worker import main as rank_worker_main  # noqa: E402


def poison_gradients(trainer, rank: int) -> None:
    """Make SCHEDLANG_TEST_INF_RANK's first gradient inf at SCHEDLANG_TEST_INF_STEPS, before the reduction."""
    if os.environ.get("SCHEDLANG_TEST_INF_RANK") != str(rank):
        return
    steps = {int(step) for step in os.environ.get("SCHEDLANG_TEST_INF_STEPS", "").split(",") if step}
    current = {}
    queue_step, reduce_gradients = trainer.queue_step, trainer.reduce_gradients

    def queue_step_noting_its_number(step):
        current["step"] = step
        return queue_step(step)

    def reduce_poisoned_gradients():
        if current.get("step") in steps:
            with torch.no_grad():
                next(trainer.updated_module.parameters()).grad.view(-1)[0] = float("inf")
        reduce_gradients()

    trainer.queue_step, trainer.reduce_gradients = queue_step_noting_its_number, reduce_poisoned_gradients


def record_scales(trainer, scales: list) -> None:
    optimizer_step = trainer.optimizer_step

    def step_and_record():
        scaler = trainer.loss_scaler
        if scaler is not None:
            scales.append((scaler.scale_used, scaler.skipped))
        optimizer_step()

    trainer.optimizer_step = step_and_record


def run_script(index: int, path: Path, steps: int, out_dir: Path, rank: int) -> None:
    from schedlang.vocabulary import LossScaleConfig
    from schedlang.runtime.trainer import launch

    script = load_script(path)
    train = script.TRAIN
    interval = os.environ.get("SCHEDLANG_TEST_LOSS_SCALE_INTERVAL")
    if interval is not None:
        train = dataclasses.replace(train, loss_scale=LossScaleConfig(growth_interval=int(interval)))
    device = os.environ.get("SCHEDLANG_TEST_DEVICE", "cpu")
    trainer = launch(script.MODEL, script.PIPELINE, train, script.MESH_SHAPE, device, timeout_s=120.0)
    poison_gradients(trainer, rank)
    scales: list = []
    record_scales(trainer, scales)
    result = {"rank": rank, "stage": trainer.mesh.stage, "data_index": trainer.mesh.data_index}
    if train.checkpoint_directory:
        stop_after = os.environ.get("SCHEDLANG_TEST_STOP_AFTER")
        result["losses"] = trainer.train(steps, stop_after=None if stop_after is None else int(stop_after))
    else:
        losses, gradients = [], None
        for step in range(steps):
            losses.append(trainer.forward_backward(step))
            if step == 0:
                gradients = trainer.named_gradients()
            trainer.optimizer_step()
        result["losses"], result["gradients"] = losses, gradients
    result["parameters"] = {name: value.detach().cpu() for name, value in trainer.model.named_parameters()}
    result["updated"] = {name: value.detach().cpu() for name, value in trainer.updated_module.named_parameters()}
    if result.get("gradients") is not None:
        result["gradients"] = {name: value.cpu() for name, value in result["gradients"].items()}
    result["scales"] = scales
    torch.save(result, out_dir / f"result-{index}-rank{rank}.pt")


if __name__ == "__main__":
    sys.exit(rank_worker_main(run_script))
