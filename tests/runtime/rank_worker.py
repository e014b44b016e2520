"""One rank of a multi-rank test job: runs generated training scripts in sequence and saves the results.

Started by ``runtime_harness.run_job`` as a plain subprocess with torchrun's
environment variables (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT), so the
scripts' own ``launch`` joins the job exactly as under torchrun; the process
group is created once and reused for every script, which keeps a matrix of
configurations to one start-up per world size.

Usage: rank_worker.py OUT_DIR STEPS SCRIPT [SCRIPT ...]
Environment knobs for failure tests: SCHEDLANG_TEST_DIE_RANK (that rank exits
before its first step), SCHEDLANG_TEST_HANG_RANK (that rank sleeps instead),
SCHEDLANG_TEST_TIMEOUT (seconds a rank waits for a peer), SCHEDLANG_TEST_STOP_AFTER
(train() stops after that many steps, as a kill would; with a checkpoint directory),
SCHEDLANG_TEST_DEVICE (cpu by default), SCHEDLANG_TEST_GRADIENT_STEP (the step whose gradients
are saved, 0 by default). On the CPU a script with cuda_graphs runs through
graph_emulator's stand-in for torch.cuda.make_graphed_callables.
"""

import importlib.util
import os
import sys
import time
import traceback
from pathlib import Path

import torch


def load_script(path: Path):
    spec = importlib.util.spec_from_file_location(f"generated_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_script(index: int, path: Path, steps: int, out_dir: Path, rank: int) -> None:
    from schedlang.runtime.trainer import launch

    script = load_script(path)
    timeout = float(os.environ.get("SCHEDLANG_TEST_TIMEOUT", "120"))
    device = os.environ.get("SCHEDLANG_TEST_DEVICE", "cpu")
    graph_maker = None
    if script.PIPELINE.cuda_graphs and device == "cpu":
        from graph_emulator import emulated_make_graphed_callables as graph_maker
    trainer = launch(
        script.MODEL, script.PIPELINE, script.TRAIN, script.MESH_SHAPE, device,
        timeout_s=timeout, graph_maker=graph_maker,
    )
    if os.environ.get("SCHEDLANG_TEST_DIE_RANK") == str(rank):
        os._exit(3)
    if os.environ.get("SCHEDLANG_TEST_HANG_RANK") == str(rank):
        time.sleep(float(os.environ.get("SCHEDLANG_TEST_HANG_SECONDS", "3600")))
        os._exit(4)
    result = {"rank": rank, "stage": trainer.mesh.stage, "data_index": trainer.mesh.data_index}
    stop_after = os.environ.get("SCHEDLANG_TEST_STOP_AFTER")
    if stop_after is not None or script.TRAIN.checkpoint_directory:
        result["losses"] = trainer.train(steps, stop_after=None if stop_after is None else int(stop_after))
    else:
        losses, gradients = [], None
        gradient_step = int(os.environ.get("SCHEDLANG_TEST_GRADIENT_STEP", "0"))
        for step in range(steps):
            losses.append(trainer.forward_backward(step))
            if step == gradient_step:
                gradients = trainer.named_gradients()
            trainer.optimizer_step()
        result["losses"] = losses
        result["gradients"] = gradients
    torch.save(result, out_dir / f"result-{index}-rank{rank}.pt")


def main(run_script=run_script) -> int:
    """Run each script of the command line with ``run_script``; a failure's traceback goes to
    ``error-rank<R>.txt`` (exit 1)."""
    out_dir, steps, scripts = Path(sys.argv[1]), int(sys.argv[2]), [Path(path) for path in sys.argv[3:]]
    rank = int(os.environ["RANK"])
    torch.set_num_threads(1)
    try:
        for index, path in enumerate(scripts):
            run_script(index, path, steps, out_dir, rank)
    except Exception:
        (out_dir / f"error-rank{rank}.txt").write_text(traceback.format_exc(), encoding="utf-8")
        return 1
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
