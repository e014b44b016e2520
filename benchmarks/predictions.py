"""The simulator's predictions for issue 23's 4- and 8-GPU runs, written down before the runs.

One parameter is fitted, once, from a two-GPU measurement: the FLOPS model's device throughput
(``Hardware.throughput_flops``) is scaled until the simulated step of torch's peer in the PP2 job of
docs/benchmarks.md, "Predictions for the 4- and 8-GPU runs" (the 1B-class GLA model, ``[gla, mlp] * 16`` split
17 / 15, 4 microbatches of 32K tokens, one chunk per microbatch: Schedule1F1B's order) takes as long as it
measured. Every other row is then a
prediction of the same model with that throughput: pipeline-only meshes (PP4, PP8) with one chunk (torch's
Schedule1F1B) and with StateFlow chunks, and pipeline x sequence meshes, whose scans add the alpha-beta times
of ``lowering/cost.py``'s ``state_scan_seconds`` with the link parameters of ``Hardware`` (assumed, not fitted:
no sequence-parallel run on two GPUs exists yet).

    python3 benchmarks/predictions.py [--measured-tokens-per-second 135263]

Each row is the schedule file benchmarks/schedules/gla_1b_split_mlp_pp2.sched revised on the row's keys
(``schedlang.compiler.revise``: the checker refuses what the runtime cannot run) and simulated with
``schedlang.lowering.simulate``; tokens/s is the step's tokens over the simulated makespan.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a file: the benchmarks package lives in the repository root
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.pipeline_schedule import SCHEDULES_DIRECTORY  # noqa: E402
from schedlang.compiler import revise  # noqa: E402
from schedlang.frontend import load_program  # noqa: E402
from schedlang.lowering.cost import FlopsCostModel, Hardware  # noqa: E402
from schedlang.lowering.simulate import simulate  # noqa: E402

MEASURED_PEER_TOKENS_PER_SECOND = 135_263.0
"""Schedule1F1B on 2 H200s, mean of four graph-only jobs (134,001-135,913 tokens/s): docs/benchmarks.md,
"Predictions for the 4- and 8-GPU runs"."""

PREDICTION_SCHEDULE = SCHEDULES_DIRECTORY / "gla_1b_split_mlp_pp2.sched"


@dataclasses.dataclass(frozen=True)
class Run:
    name: str
    pipeline: int
    sequence: int = 1
    chunks: int = 1
    microbatches: int = 4
    length: int = 32768
    parallel: str = "allscan"
    stages: str | None = None  # model.stages as written; None: the language's even split

    def program(self):
        """The checked program of the run: the file revised on the run's keys."""
        changes = {key: value for key, value in dataclasses.asdict(self).items() if key != "name"}
        changes["mesh.sequence"] = changes.pop("sequence")
        if changes["stages"] is None:
            del changes["stages"]
        return revise(load_program(PREDICTION_SCHEDULE), **changes)


def predicted_step_seconds(run: Run, hardware: Hardware) -> tuple[float, float]:
    """(makespan in seconds, bubble fraction) of ``run`` under the FLOPS model."""
    program = run.program()
    timeline = simulate(program, cost_model=FlopsCostModel(program, hardware))
    return timeline.makespan, timeline.bubble_fraction


PEER = Run("PP2 Schedule1F1B (fit)", 2, stages=f"[{list(range(17))}, {list(range(17, 32))}]")


def fitted_hardware(measured_tokens_per_second: float) -> Hardware:
    """``Hardware`` whose throughput makes the peer's simulated step last as long as measured."""
    hardware = Hardware()
    target = PEER.microbatches * PEER.length / measured_tokens_per_second
    for _ in range(6):  # the step is nearly all compute, so a few rescalings converge
        makespan, _ = predicted_step_seconds(PEER, hardware)
        hardware = dataclasses.replace(hardware, throughput_flops=hardware.throughput_flops * makespan / target)
    return hardware


RUNS = (
    Run("PP4 Schedule1F1B", 4, microbatches=8),
    Run("PP4 StateFlow 8 chunks", 4, chunks=8, microbatches=8),
    Run("PP8 Schedule1F1B", 8, microbatches=8),
    Run("PP8 StateFlow 8 chunks", 8, chunks=8, microbatches=8),
    Run("PP2 x SP2 StateFlow 4 chunks, allscan", 2, sequence=2, chunks=4, length=65536),
    Run("PP2 x SP2 StateFlow 4 chunks, ring", 2, sequence=2, chunks=4, length=65536, parallel="ring"),
    Run("PP2 x SP4 StateFlow 4 chunks, allscan", 2, sequence=4, chunks=4, length=131072),
    Run("PP2 x SP4 StateFlow 4 chunks, allgather", 2, sequence=4, chunks=4, length=131072, parallel="allgather"),
)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--measured-tokens-per-second", type=float, default=MEASURED_PEER_TOKENS_PER_SECOND)
    args = parser.parse_args(argv)
    hardware = fitted_hardware(args.measured_tokens_per_second)
    print(f"fitted throughput: {hardware.throughput_flops / 1e12:.1f} TFLOP/s per GPU; links (assumed): "
          f"{hardware.latency_s * 1e6:.0f} us, {hardware.bandwidth_bytes_per_s / 1e9:.0f} GB/s")
    print("| run | GPUs | tokens per step | predicted step (s) | tokens/s | tokens/s per GPU | bubble |")
    print("|---|---|---|---|---|---|---|")
    for run in (PEER, *RUNS):
        makespan, bubble = predicted_step_seconds(run, hardware)
        gpus = run.pipeline * run.sequence
        tokens = run.microbatches * run.length
        print(f"| {run.name} | {gpus} | {tokens:,} | {makespan:.3f} | {tokens / makespan:,.0f} | "
              f"{tokens / makespan / gpus:,.0f} | {bubble:.3f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
