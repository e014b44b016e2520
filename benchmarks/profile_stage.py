"""Where one pipeline stage's forward+backward spends its GPU time (torch.profiler, one GPU).

Builds stage 0 of benchmarks/pipeline.py's model (embedding + the first half of the layers), runs one
forward+backward of a full sequence after a warm-up, and prints the CUDA kernels by total time, grouped
by kernel name, with the achieved matmul rate of the whole step.

    python benchmarks/profile_stage.py [--length 32768] [--chunks 1] [--top 25] [--python-profile]

--python-profile adds where the host's time goes (cProfile of one more forward+backward, by own time): with
many chunks the stage is host-bound when wall time far exceeds the GPU kernels' total.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from pipeline import model_config, stage_layers  # noqa: E402


def run_once(model, tokens, n_chunks: int) -> None:
    states = [None] * model.n_states
    outputs = []
    for piece in tokens.chunk(n_chunks, dim=1):
        hidden, states = model(piece, states)
        outputs.append(hidden)
    torch.cat(outputs, dim=1).float().square().mean().backward()


def main() -> int:
    from schedlang.runtime.model import build_stage_model

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--length", type=int, default=32768)
    parser.add_argument("--chunks", type=int, default=1)
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--python-profile", action="store_true", help="also print cProfile's top host functions")
    args = parser.parse_args()
    config = model_config(tiny=False)
    device = torch.device("cuda")
    model = build_stage_model(config, stage_layers(len(config.layers))[0], True, False, 0, device, torch.bfloat16)
    tokens = torch.randint(0, config.vocab, (1, args.length), device=device)
    run_once(model, tokens, args.chunks)
    torch.cuda.synchronize()
    started = time.perf_counter()
    run_once(model, tokens, args.chunks)
    torch.cuda.synchronize()
    wall = time.perf_counter() - started
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as profiler:
        run_once(model, tokens, args.chunks)
        torch.cuda.synchronize()
    totals: dict[str, float] = {}
    for event in profiler.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            totals[event.name] = totals.get(event.name, 0.0) + event.device_time_total / 1e3
    parameters = sum(p.numel() for name, p in model.named_parameters() if "embedding" not in name)
    flops = 6 * parameters * args.length
    gpu_ms = sum(totals.values())
    print(f"stage 0, {args.length} tokens in {args.chunks} chunk(s): wall {wall * 1e3:.1f} ms, "
          f"GPU kernels {gpu_ms:.1f} ms, {flops / wall / 1e12:.0f} TFLOP/s of 6*params*tokens")
    print("| kernel | ms | share |")
    print("|---|---|---|")
    for name, ms in sorted(totals.items(), key=lambda item: -item[1])[: args.top]:
        print(f"| {name[:90]} | {ms:.2f} | {ms / gpu_ms:.1%} |")
    if args.python_profile:
        profiler = cProfile.Profile()
        profiler.enable()
        run_once(model, tokens, args.chunks)
        profiler.disable()
        torch.cuda.synchronize()
        text = io.StringIO()
        pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(args.top)
        print(text.getvalue())
    return 0


if __name__ == "__main__":
    sys.exit(main())
