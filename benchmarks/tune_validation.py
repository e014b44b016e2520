"""``schedlang tune`` against the device: its pick and the candidates it ranked lower, each trained for a few steps.

For one schedule (by default the one-GPU benchmark's 1B GLA model, benchmarks/schedules/gla_1b_one_device.sched,
bf16, one sequence per step, at ``--length`` tokens), runs
``schedlang tune FILE --json --dominated`` over its whole ranking (its flags after ``--`` go to tune as they
are: ``--hardware``, ``--throughput``, ``--kernel-gap``, ...), chooses K candidates (:func:`spread`: the pick,
the file as written, and the rest spaced evenly down the ranking among candidates that differ in what changes
a one-stage step's speed), writes each as ``rank_<k>.sched`` in ``--out``,
trains each with ``schedlang run rank_<k>.sched --device D --steps W+S --metrics rank_<k>.jsonl`` in a process
of its own, and prints a markdown table: each candidate's changes, predicted and measured step time (the
median of the last ``S`` steps' ``step_seconds``; the first ``W`` warm up, and a ``cuda_graphs = step``
candidate captures in its second), their ratio, and predicted and measured tokens/s, then whether the pick's
measured tokens/s is within 5% of the best measured and the largest step-time error. ``results.json`` in
``--out`` holds the same rows. A run that fails or times out is a row with its outcome instead of numbers.

One H200, the 1B GLA at 64K tokens (about 6 minutes: the tune, then 7 runs of 5 steps):
    python benchmarks/tune_validation.py --out results/tune-64k --length 65536
The same with the shipped profile's step and host factors measured again on this machine first (about 80 s more):
    python benchmarks/tune_validation.py --out results/tune-64k --length 65536 --calibrate h200
Each candidate that offloads where tune predicts it matters beside its twin without offload (the pick and 3 of
them, 7 runs at most), on a profile calibrated before:
    python benchmarks/tune_validation.py --out results/offload-64k --twins pipeline.offload --candidates 4 \\
        -- --hardware results/tune-64k/calibrated.toml
A tiny CPU run of the whole path:
    python benchmarks/tune_validation.py --tiny --device cpu --length 256 --candidates 2 --warmup 0 --steps 1 \\
        --out /tmp/tune-validation
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a file: the benchmarks package lives in the repository root
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.pipeline_schedule import ONE_DEVICE_SCHEDULE, BenchmarkSchedule, system_program  # noqa: E402
from schedlang.frontend import load_program_text  # noqa: E402
from schedlang.runtime.step_graphs import steps_before_steady  # noqa: E402

PICK_TOLERANCE = 0.05
"""Issue 34's acceptance: the pick's measured tokens/s within 5% of the best measured."""


def base_schedule(args: argparse.Namespace) -> str:
    """The text tune starts from: ``--schedule``, or the one-device benchmark's schedule (``--tiny``: its tiny
    model) revised to ``--length`` tokens, in bf16 (fp32 on the CPU)."""
    if args.schedule:
        return Path(args.schedule).read_text(encoding="utf-8")
    dtype = "fp32" if args.device == "cpu" else "bf16"
    program = system_program(BenchmarkSchedule(ONE_DEVICE_SCHEDULE, tiny=args.tiny), "schedlang", args.length,
                             dtype=dtype)
    return program.source_text


def schedlang_command() -> list[str]:
    return [sys.executable, "-m", "schedlang"]


NO_OP_ON_ONE_STAGE = ("pipeline.split_backward", "pipeline.forward_before_weight", "pipeline.extra_deferred_weights")
"""Keys a one-stage schedule runs the same with: candidates differing only in these are one for :func:`spread`."""

RANKING_DEPTH = 1000
"""Candidates asked of tune: its whole ranking, which :func:`spread` chooses from."""


def spread(candidates: list[dict], count: int) -> list[dict]:
    """``count`` candidates of tune's ranking: the pick, the file as written (the user's own schedule) when tune
    ranked it, and the rest evenly spaced down the ranking, each the best-ranked of its kind (candidates whose
    changes differ only in keys a one-stage step ignores are one kind), in rank order."""
    distinct, seen = [], set()
    for candidate in candidates:
        kind = tuple(sorted((key, value) for key, value in candidate["changes"].items()
                            if key not in NO_OP_ON_ONE_STAGE))
        if kind not in seen:
            seen.add(kind)
            distinct.append(candidate)
    if len(distinct) <= count:
        return distinct
    chosen = {0}
    as_written = next((index for index, candidate in enumerate(distinct) if not candidate["changes"]), None)
    if as_written is not None:
        chosen.add(as_written)
    slots = count - len(chosen)
    rest = [index for index in range(1, len(distinct)) if index not in chosen]
    for step in range(slots):
        chosen.add(rest[round(step * (len(rest) - 1) / max(slots - 1, 1))])
    return [distinct[index] for index in sorted(chosen)]


TWIN_MATTERS = 0.005
"""How far apart (relative) tune must predict a candidate and its twin, in step time or in a stage's device or
pinned host memory, for ``--twins`` to measure the pair."""


def predicted_apart(candidate: dict, other: dict) -> bool:
    """Whether tune predicts ``candidate`` and ``other`` at least :data:`TWIN_MATTERS` apart in step time, a
    stage's reserved device memory or its pinned host memory (offload that copies nothing is none of these)."""
    def apart(first: float, second: float) -> bool:
        return abs(first - second) >= TWIN_MATTERS * max(abs(first), abs(second), 1e-12)

    return apart(candidate["step_seconds"], other["step_seconds"]) or any(
        apart(first, second)
        for key in ("reserved_gib", "pinned_host_gib")
        for first, second in zip(candidate.get(key) or [], other.get(key) or [])
    )


def twin(candidate: dict, key: str, ranking: list[dict]) -> dict | None:
    """The best-ranked candidate whose changes are ``candidate``'s without ``key``: the same schedule but for it."""
    wanted = {name: value for name, value in candidate["changes"].items() if name != key}
    return next((other for other in ranking if other["changes"] == wanted), None)


def twin_pairs(ranking: list[dict], key: str, count: int) -> list[dict]:
    """The pick, then ``count - 1`` candidates that change ``key`` (chosen by :func:`spread` among those tune
    predicts apart from their twin: :func:`predicted_apart`, so the key changes what runs), each followed by its
    twin; a candidate already chosen is not trained twice."""
    matters = [candidate for candidate in ranking if key in candidate["changes"]
               and (other := twin(candidate, key, ranking)) is not None and predicted_apart(candidate, other)]
    chosen, ranks = [ranking[0]], {ranking[0]["rank"]}
    for candidate in spread(matters, count - 1) if count > 1 else []:
        for member in (candidate, twin(candidate, key, ranking)):
            if member["rank"] not in ranks:
                ranks.add(member["rank"])
                chosen.append(member)
    return chosen


def named_changes(text: str) -> dict[str, str]:
    """``--changes``'s ``key=value/key=value`` as tune's JSON writes a candidate's changes (values as text)."""
    changes = {}
    for item in filter(None, text.split("/")):
        key, equals, value = item.partition("=")
        if not equals or not key.strip() or not value.strip():
            raise SystemExit(f"--changes {text!r}: each change is block.key=value, got {item!r}")
        changes[key.strip()] = value.strip()
    return changes


def candidates_named(ranking: list[dict], names: list[str]) -> list[dict]:
    """For each of ``--changes``'s names, the best-ranked candidate whose changes are exactly those."""
    chosen = []
    for name in names:
        wanted = named_changes(name)
        found = next((candidate for candidate in ranking if candidate["changes"] == wanted), None)
        if found is None:
            raise SystemExit(f"--changes {name}: no candidate of tune's {len(ranking)} has exactly these changes")
        if found not in chosen:
            chosen.append(found)
    return chosen


def chosen_candidates(ranking: list[dict], args: argparse.Namespace) -> list[dict]:
    """The candidates to train: ``--ranks`` where given (each must be in the ranking), else those ``--changes``
    names, else ``--twins``'s pairs (:func:`twin_pairs`) where given, else :func:`spread`."""
    if getattr(args, "changes", None) and args.ranks is None:
        return candidates_named(ranking, args.changes)
    if args.ranks is None:
        if getattr(args, "twins", None):
            return twin_pairs(ranking, args.twins, args.candidates)
        return spread(ranking, args.candidates)
    by_rank = {candidate["rank"]: candidate for candidate in ranking}
    missing = sorted(set(args.ranks) - set(by_rank))
    if missing:
        raise SystemExit(f"--ranks: tune ranked {len(ranking)} candidates; no rank {', '.join(map(str, missing))}")
    return [by_rank[rank] for rank in sorted(set(args.ranks))]


def run_tune(schedule: Path, args: argparse.Namespace, tune_flags: list[str]) -> dict:
    command = [
        *schedlang_command(), "tune", str(schedule), "--json", "--top", str(RANKING_DEPTH), "--dominated",
        "--device", args.device, *(["--length", str(args.length)] if args.schedule else []), *tune_flags,
    ]
    print("$ " + " ".join(command), file=sys.stderr, flush=True)
    completed = subprocess.run(command, capture_output=True, text=True, check=False)
    if completed.returncode != 0:
        raise SystemExit(f"tune failed ({completed.returncode}):\n{completed.stderr}")
    return json.loads(completed.stdout)


def calibrate(args: argparse.Namespace, out: Path) -> Path:
    """``--calibrate``: the profile's parts with step and host factors measured on this machine, written to
    ``out/calibrated.toml``; a host-bound step's time is the host CPU's, which differs between machines
    (docs/benchmarks.md, "The host-bound rows"), so a validation's predictions use this machine's."""
    path = out / "calibrated.toml"
    command = [
        *schedlang_command(), "profile", args.calibration_schedule, "--device", args.device, "--calibrate",
        "--parts-from", args.calibrate, "--name", Path(args.calibrate).stem, "-o", str(path),
    ]
    print("$ " + " ".join(command), file=sys.stderr, flush=True)
    completed = subprocess.run(command, capture_output=True, text=True, check=False)
    if completed.returncode != 0:
        raise SystemExit(f"calibration failed ({completed.returncode}):\n{completed.stderr}")
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith(("# calibration:", "# host calibration:")):
            print(line, flush=True)
    return path


RUN_TIME_MARGIN = 2.0
"""A candidate's run may take ``--timeout`` (start-up, and the first run's kernel compilation) plus this many
times its predicted steps: a prediction 2x short still finishes, a stall does not run forever."""


def warmup_steps(schedule_text: str, args: argparse.Namespace) -> int:
    """``--warmup``, or more where the candidate's graphs need more steps before a steady one
    (:func:`steps_before_steady`: under step graphs the second step captures)."""
    return max(args.warmup, steps_before_steady(load_program_text(schedule_text).pipeline.cuda_graphs))


def run_time_limit(predicted_step_seconds: float, warmup: int, args: argparse.Namespace,
                   first: bool = False) -> float:
    """Seconds one candidate's run of ``warmup`` + ``--steps`` steps may take: see :data:`RUN_TIME_MARGIN`; the
    first run (the pick) is allowed ``--first-timeout`` instead of ``--timeout``, since on a fresh machine it also
    compiles and autotunes every Triton kernel."""
    allowance = args.first_timeout if first else args.timeout
    return allowance + RUN_TIME_MARGIN * (warmup + args.steps) * predicted_step_seconds


def measure(path: Path, warmup: int, args: argparse.Namespace, limit: float | None = None) -> dict:
    """Train one candidate for ``warmup`` + ``--steps`` steps (for at most ``limit`` seconds, default
    ``--timeout``); its median step time over the steps after the warm-up, or how it ended. A run stopped at its
    limit after at least one step past the warm-up is measured on the steps it finished (``steps`` says how many
    of how many); one stopped sooner says how many steps it finished and how long each took."""
    from schedlang.profile_calibration import CalibrationError, RunTimedOut, train_and_read_steps

    asked = warmup + args.steps
    try:
        steps = train_and_read_steps(str(path), args.device, asked, args.timeout if limit is None else limit)
    except RunTimedOut as stopped:
        steps = stopped.steps
        if len(steps) <= warmup:
            seconds = ", ".join(f"{step['step_seconds']:.3g}" for step in steps)
            return {"outcome": f"timed out after {len(steps)} of {asked} steps" + (f" ({seconds} s)" if steps else "")}
    except CalibrationError as error:
        return {"outcome": f"failed: {error}"}
    path.with_suffix(".jsonl").write_text("".join(json.dumps(step) + "\n" for step in steps), encoding="utf-8")
    timed = steps[warmup:] or steps
    measured = {
        "outcome": "measured",
        "steps": f"{len(steps)} of {asked}",
        "step_seconds": statistics.median(step["step_seconds"] for step in timed),
        "tokens_per_second": statistics.median(step["tokens_per_second"] for step in timed),
        "peak_memory_gib": max(step["peak_memory_bytes"] for step in timed) / 2**30,
    }
    pinned = [step["pinned_host_bytes"] for step in timed if "pinned_host_bytes" in step]
    if pinned:  # offloading on CUDA: the host allocator's rounded blocks, beside the memory model's pinned_host
        measured["pinned_host_gib"] = max(pinned) / 2**30
    return measured


TABLE_HEADER = (
    "| rank | changes from the file | host-bound | predicted step s | measured step s | measured / predicted "
    "| predicted tokens/s | measured tokens/s |\n"
    "| --- | --- | --- | --- | --- | --- | --- | --- |"
)


def table_row(row: dict) -> str:
    """One candidate's line of the markdown table (:data:`TABLE_HEADER`)."""
    changes = ", ".join(f"`{key} = {value}`" for key, value in row["changes"].items()) or "(as written)"
    measured = row["measured"]
    if measured["outcome"] == "measured":
        ratio = measured["step_seconds"] / row["predicted_step_seconds"]
        numbers = f"{measured['step_seconds']:.4g} | {ratio:.3f} | {row['predicted_tokens_per_second']:,.0f} | "
        numbers += f"{measured['tokens_per_second']:,.0f}"
    else:
        numbers = f"{measured['outcome']} | | {row['predicted_tokens_per_second']:,.0f} |"
    bound = row.get("host_bound_share", 0.0)
    bound_text = f"{bound:.0%}" if bound else "-"
    return f"| {row['rank']} | {changes} | {bound_text} | {row['predicted_step_seconds']:.4g} | {numbers} |"


def table(rows: list[dict]) -> str:
    return "\n".join([TABLE_HEADER, *(table_row(row) for row in rows)])


def summary(rows: list[dict]) -> str:
    measured = [row for row in rows if row["measured"]["outcome"] == "measured"]
    if not measured:
        return "no candidate trained"
    best = max(row["measured"]["tokens_per_second"] for row in measured)
    pick = rows[0]["measured"]
    errors = [abs(row["measured"]["step_seconds"] / row["predicted_step_seconds"] - 1) for row in measured]
    if pick["outcome"] != "measured":
        verdict = "the pick did not train"
    else:
        share = pick["tokens_per_second"] / best
        within = "within" if share >= 1 - PICK_TOLERANCE else "outside"
        verdict = f"the pick ran {share:.3f} of the best measured tokens/s ({within} {PICK_TOLERANCE:.0%})"
    pinned = [f"rank {row['rank']} {row.get('predicted_pinned_host_gib', 0.0):.1f} / "
              f"{row['measured']['pinned_host_gib']:.1f} GiB" for row in measured if "pinned_host_gib" in row["measured"]]
    pinned_text = f"; pinned host, predicted / the allocator's peak: {', '.join(pinned)}" if pinned else ""
    return f"{verdict}; largest step-time error {max(errors):.1%} over {len(measured)} measured candidates{pinned_text}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="folder for the candidates, their metrics and results.json")
    parser.add_argument("--schedule", default=None, help="tune this file instead of the benchmark model")
    parser.add_argument("--length", type=int, default=65536, help="tokens per sequence (default 65536)")
    parser.add_argument("--tiny", action="store_true", help="the benchmark's tiny model (a CPU run of the path)")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--candidates", type=int, default=7, help="the pick and this many minus one more")
    parser.add_argument(
        "--ranks", type=int, nargs="+", default=None, metavar="RANK",
        help="measure these ranks of tune's ranking instead of --candidates spread down it (a job split in parts)",
    )
    parser.add_argument(
        "--changes", nargs="+", default=None, metavar="KEY=VALUE/...",
        help="measure the candidates with exactly these changes from the file (block.key=value joined by /, as "
        "results.json names them: sequence.chunks=32/pipeline.recompute=mlp), whatever their rank",
    )
    parser.add_argument(
        "--twins", metavar="KEY", default=None,
        help="measure the pick and --candidates minus one candidates that change KEY (e.g. pipeline.offload) "
        "where tune predicts it matters, each beside its twin without the change",
    )
    parser.add_argument("--warmup", type=int, default=2, help="steps before the timed ones (default 2)")
    parser.add_argument("--steps", type=int, default=3, help="timed steps per candidate (default 3)")
    parser.add_argument(
        "--timeout", type=float, default=60.0,
        help="seconds a candidate's run may take beyond twice its predicted steps (start-up, compilation)",
    )
    parser.add_argument(
        "--first-timeout", type=float, default=240.0,
        help="the same allowance for the first run, which compiles the kernels on a fresh machine (default 240)",
    )
    parser.add_argument(
        "--calibrate", metavar="PROFILE", default=None,
        help="first calibrate PROFILE's step and host factors on this machine (schedlang profile --calibrate "
        "--parts-from PROFILE on --calibration-schedule) and tune with the result",
    )
    parser.add_argument("--calibration-schedule", default=str(ONE_DEVICE_SCHEDULE),
                        help="the schedule --calibrate trains (default: the one-GPU 1B GLA at 64K)")
    args, tune_flags = parser.parse_known_args(argv)
    tune_flags = [flag for flag in tune_flags if flag != "--"]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    schedule = out / "base.sched"
    schedule.write_text(base_schedule(args), encoding="utf-8")
    if args.calibrate:
        tune_flags = [*tune_flags, "--hardware", str(calibrate(args, out))]
    tuned = run_tune(schedule, args, tune_flags)
    print(f"schedlang tune {schedule} at {tuned['length']} tokens, {args.device}, commit "
          f"{os.environ.get('GIT_COMMIT', '(set GIT_COMMIT)')}; {tuned['cost_model']}", flush=True)
    print(TABLE_HEADER, flush=True)
    rows = []
    for index, candidate in enumerate(chosen_candidates(tuned["candidates"], args)):
        path = out / f"rank_{candidate['rank']}.sched"
        path.write_text(candidate["schedule"], encoding="utf-8")
        warmup = warmup_steps(candidate["schedule"], args)
        rows.append({
            "rank": candidate["rank"],
            "file": str(path),
            "changes": candidate["changes"],
            "predicted_step_seconds": candidate["step_seconds"],
            "predicted_tokens_per_second": candidate["tokens_per_second"],
            "predicted_reserved_gib": candidate["reserved_gib"],
            "predicted_pinned_host_gib": max(candidate.get("pinned_host_gib") or [0.0]),
            "host_bound_share": candidate["host_bound_share"],
            "warmup_steps": warmup,
            "measured": measure(path, warmup, args,
                                run_time_limit(candidate["step_seconds"], warmup, args, first=index == 0)),
        })
        # after every candidate: a job cut short still leaves what it measured, in results.json and printed
        (out / "results.json").write_text(json.dumps({"length": tuned["length"], "rows": rows}, indent=2) + "\n")
        print(table_row(rows[-1]), flush=True)
    print(summary(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
