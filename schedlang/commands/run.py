"""``schedlang run FILE``: compile a schedule and train it with torchrun, here and now.

Compiles to a temporary script, launches it through ``torch.distributed.run``
with one process per rank of the schedule's mesh (CPU and gloo when there is
no GPU), prints a progress line per step (loss, tokens/s, peak memory) and,
with ``--metrics``, writes one JSON object per step. Exits non-zero when any
rank fails.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

HELP = "compile a schedule and train it now with torchrun (CPU/gloo when there is no GPU)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("file", help="schedule file (.sched)")
    parser.add_argument("--nproc", type=int, default=None, help="processes to launch (default: the mesh's rank count)")
    parser.add_argument("--device", choices=("cpu", "cuda"), default=None, help="default: cuda if available, else cpu")
    parser.add_argument("--steps", type=int, default=None, help="train this many steps (default: train.steps)")
    parser.add_argument("--metrics", default=None, help="write one JSON object per step to this file")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds a rank waits for a peer before failing")
    parser.add_argument("--keep-script", default=None, help="also write the generated script here")
    parser.add_argument(
        "--fresh", action="store_true",
        help="start from step 0 with checkpoints in a new directory beside train.checkpoint's (which is kept)",
    )
    nodes = parser.add_argument_group("several machines (one `schedlang run` per node, torchrun's static rendezvous)")
    nodes.add_argument("--nnodes", type=int, default=1, help="machines in the job; each runs mesh ranks / nnodes")
    nodes.add_argument("--node-rank", type=int, default=None, help="this machine's index, 0 .. nnodes - 1")
    nodes.add_argument("--rdzv-endpoint", default=None, help="HOST:PORT of node 0, where the nodes meet")


def _default_device() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def _refuse_graphs_on_cpu(path: str, program) -> None:
    from schedlang.diagnostics import Diagnostic, ScheduleError
    from schedlang.frontend import read_source

    span = program.spans["pipeline.cuda_graphs"]
    message = f"pipeline.cuda_graphs = {program.pipeline.cuda_graphs.value} replays CUDA graphs, but this run is on the CPU"
    hint = "set cuda_graphs = false to train here, or run on a machine with a GPU (--device cuda)"
    raise ScheduleError([Diagnostic.error(message, span, hint)], {span.file: read_source(path)})


def _fresh_program(program):
    """``program`` (paths resolved) with its checkpoints going to a directory that holds none (``--fresh``),
    and the line that says where."""
    import dataclasses

    from schedlang.lowering import paths
    from schedlang.resume_preflight import fresh_checkpoint_directory

    directory = paths.checkpoint_directory(program)
    if directory is None:
        return program, "schedlang: --fresh: this schedule writes no checkpoint (train.checkpoint); starting at step 0"
    fresh = fresh_checkpoint_directory(directory)
    if fresh == directory:
        return program, f"schedlang: --fresh: {directory} holds no checkpoint; starting at step 0 and saving there"
    train = dataclasses.replace(program.train, checkpoint_directory=fresh)
    return (
        dataclasses.replace(program, train=train),
        f"schedlang: --fresh: starting at step 0; checkpoints go to {fresh} ({directory} is kept as it is)",
    )


def _training_banner(program, steps: int, start_step: int, nproc: int, device: str, where: str) -> str:
    """The line before launch: from which step to which (a resumed run does not train ``steps`` steps)."""
    from schedlang.vocabulary.wording import counted

    span = f"for {counted(steps, 'step')}" if start_step == 0 else f"from step {start_step} to step {steps}"
    processes = counted(nproc, f"{device} process", f"{device} processes")
    return f"schedlang: training {program.name} {span} on {processes}{where}"


def _say_what_was_saved(program) -> None:
    """After a signal stopped the run: one line naming the newest checkpoint, or saying there is none."""
    from schedlang.lowering import paths
    from schedlang.runtime.checkpoint import CheckpointError, checkpoint_path, latest_step

    directory = paths.checkpoint_directory(program)
    if directory is None:
        print("schedlang: nothing was saved (the schedule has no train.checkpoint)", file=sys.stderr, flush=True)
        return
    try:
        step = latest_step(directory)
    except CheckpointError:
        step = None
    if step is None:
        print(f"schedlang: no checkpoint was saved in {directory}", file=sys.stderr, flush=True)
    else:
        print(f"schedlang: the newest checkpoint is {checkpoint_path(directory, step)}; `schedlang run` again "
              "resumes from it", file=sys.stderr, flush=True)


def _start_metrics(requested: str | None, resumes: bool, directory: Path) -> Path:
    """The metrics file the ranks append to: ``--metrics`` (kept when the run resumes, else replaced by an empty
    file, never truncated through a link: schedlang.outputs has refused foreign files), or one in ``directory``."""
    from schedlang.outputs import write_output_file

    if not requested:
        path = directory / "metrics.jsonl"
        write_output_file(path, "")
        return path
    path = Path(requested)  # its folder exists: schedlang.outputs has refused a missing one
    if not (resumes and path.is_file()):  # a resumed run appends to its metrics
        write_output_file(path, "")
    return path


def run(args: argparse.Namespace) -> int:
    from schedlang.commands.common import write_output
    from schedlang.commands.compile import IllegalScheduleReport, script_of_program
    from schedlang.frontend import load_program, read_source
    from schedlang.limits import check_machine_fits
    from schedlang.preflight import check_data_file, check_tensorboard, timeout_problem, will_resume
    from schedlang.launch import LaunchInterrupted, LaunchRequest, Nodes, launch, nodes_problem
    from schedlang.outputs import first_and_last_metrics
    from schedlang.resume_preflight import checkpoint_refusal, learning_rate_note

    program = load_program(args.file)
    world_size = program.mesh.world_size
    nproc = world_size if args.nproc is None else args.nproc
    if nproc != world_size:
        print(
            f"schedlang: error: {args.file} describes a mesh of {world_size} ranks "
            f"(pipeline {program.mesh.pipeline} x sequence {program.mesh.sequence} x data {program.mesh.data}); "
            f"--nproc {nproc} does not match",
            file=sys.stderr,
        )
        return 1
    if args.steps is not None and args.steps < 1:
        print("schedlang: error: --steps must be at least 1", file=sys.stderr)
        return 1
    if timeout_problem(args.timeout):
        print(f"schedlang: error: {timeout_problem(args.timeout)}", file=sys.stderr)
        return 1
    problem = nodes_problem(args.nnodes, args.node_rank, args.rdzv_endpoint, world_size)
    if problem:
        print(f"schedlang: error: {problem}", file=sys.stderr)
        return 1
    nodes = Nodes(args.nnodes, args.node_rank, args.rdzv_endpoint) if args.nnodes > 1 else None
    device = args.device or _default_device()
    if device == "cuda" and _default_device() != "cuda":
        print("schedlang: error: --device cuda, but torch sees no CUDA device", file=sys.stderr)
        return 1
    check_machine_fits(program, device, read_source(args.file), args.nnodes)
    check_data_file(program, read_source(args.file))
    check_tensorboard(program, read_source(args.file))
    if program.pipeline.cuda_graphs and device != "cuda":
        _refuse_graphs_on_cpu(args.file, program)
    from schedlang.lowering import paths

    program = paths.with_resolved_paths(program)
    fresh_line = None
    if args.fresh:
        program, fresh_line = _fresh_program(program)
    try:
        script = script_of_program(program, "train.py")
    except IllegalScheduleReport as report:
        print(str(report), file=sys.stderr)
        return 1
    if args.keep_script:
        write_output(args.keep_script, script)
    with tempfile.TemporaryDirectory(prefix="schedlang-run-") as directory:
        script_path = Path(directory) / "train.py"
        script_path.write_text(script, encoding="utf-8")
        metrics = _start_metrics(args.metrics, will_resume(program), Path(directory))
        steps = args.steps or program.train.steps
        point, refusal = checkpoint_refusal(
            paths.checkpoint_directory(program), script_path, steps, "--steps" if args.steps else "train.steps"
        )
        if refusal is not None:
            print(f"schedlang: error: {refusal}", file=sys.stderr)
            return 1
        here = nproc // args.nnodes
        where = f" (node {args.node_rank} of {args.nnodes}: {here} of them here)" if nodes else ""
        for line in (fresh_line, learning_rate_note(program, steps)):
            if line:
                print(line, flush=True)
        start_step = 0 if point is None else point.step
        print(_training_banner(program, steps, start_step, nproc, device, where), flush=True)
        try:
            status = launch(LaunchRequest(script_path, here, device, args.steps, metrics, args.timeout, nodes))
        except LaunchInterrupted:
            _say_what_was_saved(program)
            raise
        records = first_and_last_metrics(metrics)
    if status != 0:
        print(f"schedlang: error: training failed (torchrun exit status {status}); see the rank error above", file=sys.stderr)
        return status
    if nodes and not records:
        print(f"schedlang: done on node {args.node_rank} of {args.nnodes} (node 0 prints the losses)")
    if records:
        first, last = records

        def loss(record) -> str:  # null: a step fp16's loss scaling skipped had no finite loss
            value = record.get("loss")
            return "null" if value is None else f"{value:.4f}"

        print(f"schedlang: done: loss {loss(first)} at step {first.get('step')} -> "
              f"{loss(last)} at step {last.get('step')}")
    return 0
