"""``schedlang profile FILE --device cuda -o PROFILE.toml``: measure the hardware profile a schedule's model needs.

It times every part the schedule's model has (each layer kind as a mixer alone, the MLP, the embedding, the
head with its loss; attention also at prefix lengths) with the runtime's own modules
(:mod:`schedlang.runtime.profiling`) at several chunk lengths (the schedule's own among them), the device's
memory bandwidth and, on CUDA, the copy to pinned host memory, and records the machine's RAM as the node's host
memory (``[host] memory``, what offloaded activations share); with several GPUs visible it also times
``torch.distributed`` point-to-point, all-gather and reduce-scatter among them. What it cannot measure (links
on one GPU, launch gaps under CUDA graphs, links across nodes) comes from the H200 profile's defaults, and
both the command's output and the file's header say which figures are defaults. ``--budget`` seconds bound the
whole run (300 by default: every length not reached is left out, and said); a progress bar shows each part.
An existing output is kept unless ``--force``. ``--device cpu`` runs the same path with the lengths the
schedule's own size allows (the test of this command).

``--calibrate`` then trains FILE (a one-process schedule) for a few steps with ``schedlang run`` and writes the
ratio of its measured step to the step its parts predict as the profile's ``[calibration]``
(:mod:`schedlang.profile_calibration`); with ``--parts-from PROFILE`` the parts come from an existing profile
instead of being timed again, so a calibration alone takes the run's minute.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import statistics
import sys
import time
from pathlib import Path

HELP = "measure a hardware profile (layer times by chunk length, memory and links) for a schedule's model"

CUDA_LENGTHS = (512, 1024, 2048, 4096, 8192, 16384, 32768)
DEFAULTS_PROFILE = "h200"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("file", help="schedule file (.sched) whose model to measure")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("-o", "--output", required=True, help="the profile to write (.toml)")
    parser.add_argument("--force", action="store_true", help="replace an existing output")
    parser.add_argument("--name", default=None, help="the profile's name (default: the output's stem)")
    parser.add_argument("--budget", type=float, default=300.0, help="seconds for the whole run (default 300)")
    parser.add_argument(
        "--lengths", type=int, nargs="+", metavar="TOKENS",
        help="chunk lengths to time (default on cuda: 512 to 32K tokens and the schedule's chunk lengths; on cpu: the "
        "schedule's chunk lengths and half of the shortest)",
    )
    parser.add_argument("--repeats", type=int, default=3, help="timed runs per measurement (median)")
    parser.add_argument(
        "--calibrate", action="store_true",
        help="also train FILE (one process) for a few steps and write the whole step's ratio to its parts",
    )
    parser.add_argument(
        "--parts-from", metavar="PROFILE", default=None,
        help="take the parts from this profile (a file or a shipped name) instead of timing them: with "
        "--calibrate, or with --measure to time only some of them again",
    )
    parser.add_argument(
        "--measure", nargs="+", metavar="PART", default=None,
        help="with --parts-from: time these parts again (e.g. attn after a kernel change) and keep the rest",
    )
    parser.add_argument("--calibration-steps", type=int, default=3, help="timed steps of --calibrate (after 2)")


def needed_parts(program) -> list[str]:
    """The parts the program's model has, in the profile's order."""
    from schedlang.lowering.hardware_profile import model_parts

    return [part.value for part in model_parts(program.model)]


def chunk_lengths(program, device: str, lengths: list[int] | None) -> list[int]:
    own = {program.sequence.chunk_length(chunk) // program.mesh.sequence for chunk in range(program.n_chunks)}
    if lengths:
        return sorted(set(lengths))
    if device == "cuda":
        return sorted(set(CUDA_LENGTHS) | own)
    return sorted(own | {max(min(own) // 2, 1)})


def attention_prefixes(program) -> list[int]:
    """0, and the longest prefix a chunk of the schedule has, so the cost model interpolates between them."""
    return sorted({0, program.sequence.boundaries[-2]})


class ProgressBar:
    """Measurements done out of ``total``, redrawn in place on standard error (looked up when drawn, so a
    replaced ``sys.stderr`` is the one written to)."""

    def __init__(self, total: int, width: int = 30) -> None:
        self.total, self.done, self.width = total, 0, width

    @property
    def stream(self):
        return sys.stderr

    def step(self, label: str) -> None:
        self.done += 1
        filled = self.width * self.done // max(self.total, 1)
        self.stream.write(f"\r[{'#' * filled}{'.' * (self.width - filled)}] {self.done}/{self.total} {label:<40}")
        self.stream.flush()

    def close(self) -> None:
        self.stream.write("\n")
        self.stream.flush()


def refuse_existing_output(args: argparse.Namespace) -> None:
    from schedlang.outputs import whole_file_problem

    problem = whole_file_problem(args.output, args.force)
    if problem:
        raise SystemExit(f"schedlang profile: error: {problem}")


CALIBRATION_WARMUP = 2


def chunk_lengths_problem(lengths: list[int] | None) -> str | None:
    """What is wrong with ``--lengths``: a length outside ``1 .. MAX_LENGTH``, the checker's bound on
    ``sequence.length``; None when every one holds."""
    from schedlang.checks.sequence import MAX_LENGTH

    for tokens in lengths or ():
        if not 1 <= tokens <= MAX_LENGTH:
            return f"--lengths {tokens}: a chunk length must be in 1 .. {MAX_LENGTH} tokens"
    return None


def is_out_of_memory(error: BaseException) -> bool:
    """Whether ``error`` is an allocation that failed: CUDA's ``OutOfMemoryError`` or the CPU allocator's."""
    import torch

    return isinstance(error, (torch.OutOfMemoryError, MemoryError)) or "can't allocate memory" in str(error)


def run(args: argparse.Namespace) -> int:
    refuse_existing_output(args)
    if args.budget <= 0 or args.repeats < 1 or args.calibration_steps < 1:
        raise SystemExit(
            "schedlang profile: error: --budget must be positive, --repeats and --calibration-steps at least 1"
        )
    lengths_problem = chunk_lengths_problem(args.lengths)
    if lengths_problem:
        raise SystemExit(f"schedlang profile: error: {lengths_problem}")
    if args.parts_from and not (args.calibrate or args.measure):
        raise SystemExit(
            "schedlang profile: error: --parts-from serves --calibrate or --measure; give one of them with it"
        )
    if args.measure and not args.parts_from:
        raise SystemExit("schedlang profile: error: --measure re-times parts of --parts-from PROFILE; give both")
    from schedlang.frontend import load_program

    program = load_program(args.file)
    if args.measure:
        unknown = sorted(set(args.measure) - set(needed_parts(program)))
        if unknown:
            raise SystemExit(
                f"schedlang profile: error: --measure {', '.join(unknown)}: {args.file}'s model has no such part; "
                f"it has {', '.join(needed_parts(program))}"
            )
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("schedlang profile: error: --device cuda, but no CUDA device is visible")
    from schedlang.profile_calibration import CalibrationError, require_one_process

    started = time.perf_counter()
    try:
        if args.calibrate:
            require_one_process(program, args.file)
        profile, header = parts_from(args) if args.parts_from else measure_parts(args, program, started)
        if args.measure:
            profile, header = measure_again(args, program, profile, header, started)
        if args.calibrate:
            profile, header = calibrate(args, program, profile, header)
    except CalibrationError as error:
        raise SystemExit(f"schedlang profile: error: {error}") from None
    from schedlang.lowering.hardware_profile import format_hardware_profile
    from schedlang.outputs import write_output_file

    write_output_file(args.output, format_hardware_profile(profile, header))
    for line in header.splitlines()[1:]:
        print(line)
    print(f"wrote {args.output} ({time.perf_counter() - started:.0f} s)")
    return 0


def parts_from(args: argparse.Namespace):
    """The parts of an existing profile, renamed for the output, and a header that says where they came from."""
    import dataclasses

    from schedlang.lowering.hardware_profile import HardwareProfileError, resolve_hardware

    try:
        profile = resolve_hardware(args.parts_from)
    except HardwareProfileError as error:
        raise SystemExit(error.render()) from None
    profile = dataclasses.replace(profile, name=args.name or Path(args.output).stem)
    comments = []  # the earlier profile's own header: how its parts were measured
    for line in Path(profile.source_file).read_text(encoding="utf-8").splitlines():
        if not line.startswith("#"):
            break
        text = line[1:].strip()
        # a new calibration replaces the old; where the earlier parts came from is this header's first line
        if not text.startswith(("calibration:", "host calibration:", "Parts from ")):
            comments.append(text)
    header = "\n".join([f"Parts from {args.parts_from}:", *comments])
    return profile, header


def calibrate(args: argparse.Namespace, program, profile, header: str):
    """``profile`` calibrated against FILE's whole step on the device and, where the profile has host times, its
    host-bound variant's step; the header gains a line for each."""
    from schedlang.profile_calibration import calibrated, measure_step_seconds, parts_step_seconds

    print(f"calibrating: schedlang run {args.file} --device {args.device} "
          f"--steps {CALIBRATION_WARMUP + args.calibration_steps}", file=sys.stderr, flush=True)
    measured = measure_step_seconds(
        args.file, args.device, CALIBRATION_WARMUP, args.calibration_steps, timeout=max(args.budget, 60.0)
    )
    predicted = parts_step_seconds(program, profile)
    profile = calibrated(profile, Path(args.file).name, measured, predicted)
    header += (
        f"\ncalibration: `schedlang run {Path(args.file).name}` measured {measured:.4g} s a step (median of "
        f"{args.calibration_steps} after {CALIBRATION_WARMUP}), its parts {predicted:.4g} s: step factor "
        f"{profile.calibration.step_factor:.4f}"
    )
    if profile.overhead.eager_layer_seconds > 0 or profile.overhead.eager_backward_layer_seconds > 0:
        profile, header = calibrate_host(args, program, profile, header)
    return profile, header


def calibrate_host(args: argparse.Namespace, program, profile, header: str):
    """The host factor from FILE's host-bound variant (schedlang.profile_calibration), run from a temporary
    schedule beside FILE (so that paths in it resolve as in FILE), removed afterwards."""
    import tempfile

    from schedlang.compiler import Pass, ScheduleText, compile_schedule
    from schedlang.profile_calibration import (
        host_bound_changes, host_bound_text, host_calibrated, measure_step_seconds,
    )

    text = host_bound_text(program)
    changes = ", ".join(f"{key} = {str(value).lower()}" for key, value in host_bound_changes(program).items())
    described = f"{Path(args.file).name} with {changes}"
    folder = Path(args.file).resolve().parent
    try:
        handle = tempfile.NamedTemporaryFile(
            "w", suffix=".sched", prefix=".schedlang-host-bound-", dir=folder, delete=False, encoding="utf-8"
        )
    except OSError:  # a folder we may not write: paths relative to FILE then do not resolve, the rest runs
        handle = tempfile.NamedTemporaryFile("w", suffix=".sched", delete=False, encoding="utf-8")
    with handle:
        handle.write(text)
    variant = Path(handle.name)
    try:
        host_program = compile_schedule(ScheduleText(text, str(variant)), through=Pass.CHECK).program
        print(f"calibrating the host: {described}", file=sys.stderr, flush=True)
        measured = measure_step_seconds(
            str(variant), args.device, CALIBRATION_WARMUP, args.calibration_steps, timeout=max(args.budget, 60.0)
        )
    finally:
        variant.unlink(missing_ok=True)
    profile = host_calibrated(profile, described, measured, host_program)
    calibration = profile.calibration
    header += (
        f"\nhost calibration: {described} measured {measured:.4g} s a step, simulated "
        f"{calibration.host_parts_step_seconds:.4g} s with the parts' host times: host factor "
        f"{calibration.host_factor:.4f}"
    )
    return profile, header


def measure_again(args: argparse.Namespace, program, profile, header: str, started: float):
    """``profile`` with the ``--measure`` parts timed again on this device, and a header line saying which and
    when. A new row of the same part, width and prefix as an earlier one merges into it by chunk length (the
    lengths timed now replace the earlier ones, the others stay: ``--lengths 512 1024`` adds short chunks to
    the curves); any other new row is added."""
    import dataclasses
    import datetime

    device = torch_device(args)
    timings, skipped = time_parts(args, program, device, list(args.measure), started)
    layers = list(profile.layers)
    for row in layer_measurements(program, timings, device):
        same = [index for index, layer in enumerate(layers) if geometry(layer) == geometry(row)]
        if same:
            layers[same[0]] = merged_rows(layers[same[0]], row)
        else:
            layers.append(row)
    profile = dataclasses.replace(profile, layers=tuple(layers))
    header += (
        f"\nmeasured again by `schedlang profile {Path(args.file).name} --measure {' '.join(args.measure)}` on "
        f"{torch_device_name(device)}, {datetime.date.today().isoformat()}: {', '.join(args.measure)} at "
        f"{sorted({timing.tokens for timing in timings})} tokens" + left_out(skipped)
    )
    return profile, header


def geometry(layer) -> tuple:
    """What makes two rows measurements of the same thing: the part, its widths and the attention prefix."""
    return (layer.part, layer.d_model, layer.heads, layer.head_dim, layer.hidden, layer.vocab, layer.prefix)


def merged_rows(earlier, fresh):
    """``earlier``'s curves with ``fresh``'s lengths in them (``fresh``'s seconds where both timed a length)."""
    import dataclasses

    from schedlang.lowering.hardware_profile import Curve

    def merge(old: Curve, new: Curve) -> Curve:
        points = dict(zip(old.tokens, old.seconds)) | dict(zip(new.tokens, new.seconds))
        tokens = tuple(sorted(points))
        return Curve(tokens, tuple(points[length] for length in tokens))

    return dataclasses.replace(
        earlier, forward=merge(earlier.forward, fresh.forward), backward=merge(earlier.backward, fresh.backward),
        weight=merge(earlier.weight, fresh.weight), host=fresh.host or earlier.host,
    )


def left_out(skipped) -> str:
    return f"; left out (budget): {', '.join(f'{p} {t}' for p, t, _ in skipped)}" if skipped else ""


def torch_device(args: argparse.Namespace):
    import torch

    return torch.device("cuda", 0) if args.device == "cuda" else torch.device("cpu")


def time_parts(args: argparse.Namespace, program, device, parts: list[str], started: float):
    """One timing per (part, chunk length, attention prefix) of ``parts`` in the budget left, and what the budget
    left out; an error when some part got no timing at all."""
    from schedlang.runtime.trainer import DTYPES

    dtype = DTYPES[program.train.dtype]
    config = program.model
    lengths = chunk_lengths(program, args.device, args.lengths)
    plan = [
        (part, tokens, prefix)
        for part in parts
        for tokens in lengths
        for prefix in (attention_prefixes(program) if part == "attn" else [0])
    ]
    from schedlang.runtime.profiling import measure_part

    bar = ProgressBar(len(plan))
    timings, skipped = [], []
    for part, tokens, prefix in plan:
        if time.perf_counter() - started > args.budget:
            skipped.append((part, tokens, prefix))
            bar.step(f"{part} {tokens} skipped (budget)")
            continue
        # the host times with offload and under recompute on CUDA (the profile keeps host times there alone), at
        # the shortest length, where the device keeps up with the host
        host_point = device.type == "cuda" and tokens == min(lengths)
        try:
            timings.append(measure_part(config, part, tokens, device, dtype, prefix, args.repeats,
                                        offload_host=host_point, recompute_host=host_point))
        except (RuntimeError, MemoryError) as error:
            if not is_out_of_memory(error):
                raise
            bar.close()
            raise SystemExit(
                f"schedlang profile: error: {part} at {tokens} tokens"
                + (f" after a prefix of {prefix}" if prefix else "")
                + f" does not fit the {device.type} device's memory; give shorter --lengths"
            ) from None
        bar.step(f"{part} {tokens}" + (f" after {prefix}" if prefix else ""))
    bar.close()
    missing = [part for part in parts if not any(timing.part == part for timing in timings)]
    if missing:
        raise SystemExit(
            f"schedlang profile: error: the budget ran out before {', '.join(missing)} was measured; "
            "give a larger --budget or fewer --lengths"
        )
    return timings, skipped


def measure_parts(args: argparse.Namespace, program, started: float):
    """Time every part the schedule's model needs (and the device's bandwidths and links): the profile and the
    header naming what was measured and what came from the defaults."""
    import torch

    from schedlang.runtime.profiling import measure_memory_bandwidth, measure_offload_bandwidth

    device = torch_device(args)
    timings, skipped = time_parts(args, program, device, needed_parts(program), started)
    copy_bytes = (256 << 20) if device.type == "cuda" else (16 << 20)
    memory_bandwidth = measure_memory_bandwidth(device, copy_bytes)
    offload_bandwidth = measure_offload_bandwidth(device, copy_bytes) if device.type == "cuda" else None
    gpus = torch.cuda.device_count() if device.type == "cuda" else 0
    links = None
    if gpus >= 2:
        from schedlang.runtime.profiling import measure_links

        links = measure_links(gpus, "nccl", "cuda")
    from schedlang.runtime.host_memory import physical_memory_bytes

    host_bytes = physical_memory_bytes()
    profile, header = build_profile(
        args, program, device, timings, memory_bandwidth, offload_bandwidth, links, gpus, host_bytes
    )
    return profile, header + f"\n{len(timings)} measurements" + left_out(skipped)


def build_profile(args, program, device, timings, memory_bandwidth, offload_bandwidth, links, gpus, host_bytes=None):
    """The :class:`HardwareProfile` of the measurements, the defaults for the rest, and a header naming both.
    ``host_bytes`` is the machine's RAM (None: unknown, and the profile states no ``[host]``)."""
    from schedlang.lowering.hardware_profile import (
        HardwareProfile, HostMemory, Link, LinkClass, Offload, Origin, Overhead, Topology, resolve_hardware,
    )

    defaults = resolve_hardware(DEFAULTS_PROFILE)
    layers = layer_measurements(program, timings, device)
    shortest = min(timing.tokens for timing in timings)
    hosted = [timing for timing in timings if timing.tokens == shortest and timing.part != "embedding"]
    host = [timing.host_forward_s for timing in hosted]
    host_backward = [timing.host_backward_s for timing in hosted]
    device_name = torch_device_name(device)
    link_records = dict(defaults.links)
    if links is not None:
        for name, fit in links.items():
            link_records[LinkClass(name)] = Link(fit.latency_s, fit.bandwidth_bytes_per_s)
    measured_links = "measured among the GPUs of this host" if links else f"defaults of the {defaults.name} profile"
    name = args.name or Path(args.output).stem
    note = (f"schedlang profile of {Path(args.file).name} on {device_name}, "
            f"{datetime.date.today().isoformat()}; links: {measured_links}")
    profile = HardwareProfile(
        name=name, device=device_name, origin=Origin.MEASURED, note=note, dtype=program.train.dtype.value,
        memory_bandwidth_bytes_per_s=memory_bandwidth,
        overhead=Overhead(median_or_zero(host, device), defaults.overhead.graph_layer_seconds, 0.0,
                          median_or_zero(host_backward, device)),
        offload=Offload(offload_bandwidth or defaults.offload.bandwidth_bytes_per_s),
        links=link_records,
        topology=Topology(max(gpus, 1) if links else defaults.topology.gpus_per_node, 1),
        layers=tuple(layers),
        host=None if host_bytes is None else HostMemory(host_bytes),
    )
    default_figures = ["graph launch gaps per layer (overhead.graph_layer_seconds)", "inter-node link"]
    if links is None:
        default_figures.insert(0, "every link (one device visible: nothing to measure between devices)")
    if offload_bandwidth is None:
        default_figures.append("offload bandwidth")
    if host_bytes is None:
        default_figures.append("host memory")
    header = "\n".join([
        f"Measured by `schedlang profile {Path(args.file).name} --device {device.type}` on {device_name}.",
        f"measured: {', '.join(sorted({timing.part for timing in timings}))} at {sorted({t.tokens for t in timings})} "
        "tokens; memory bandwidth" + (", offload bandwidth" if offload_bandwidth else "")
        + (f", links among {gpus} GPUs" if links else ""),
        f"from the {defaults.name} profile's defaults, not measured: {'; '.join(default_figures)}",
        *host_memory_line(host_bytes, gpus, links is not None),
    ])
    return profile, header


def layer_measurements(program, timings, device) -> tuple:
    """One :class:`LayerMeasurement` per (part, attention prefix) timed, in the profile's part order, with the host
    times of its shortest length on CUDA (on the CPU the host runs the kernels: no launch time of its own)."""
    from schedlang.lowering.hardware_profile import Curve, LayerMeasurement, ProfiledPart
    from schedlang.runtime.model import swiglu_width

    model = program.model
    attention = model.attention_geometry
    layers = []
    keys = sorted({(timing.part, timing.prefix) for timing in timings},
                  key=lambda key: ([p.value for p in ProfiledPart].index(key[0]), key[1]))
    for part, prefix in keys:
        rows = sorted((timing for timing in timings if (timing.part, timing.prefix) == (part, prefix)),
                      key=lambda timing: timing.tokens)
        tokens = tuple(timing.tokens for timing in rows)
        kind = ProfiledPart(part)
        is_attention = kind is ProfiledPart.ATTN
        heads, head_dim = (attention.heads, attention.head_dim) if is_attention else (model.heads, model.head_dim)
        mixer = kind.is_mixer
        hidden = 0
        if kind is ProfiledPart.MLP:
            hidden = model.options.mlp_width or swiglu_width(model.d_model, model.mlp_ratio or 4.0)
        layers.append(LayerMeasurement(
            part=kind, d_model=model.d_model, heads=heads if mixer else 0, head_dim=head_dim if mixer else 0,
            hidden=hidden, vocab=model.vocab if kind in (ProfiledPart.EMBEDDING, ProfiledPart.HEAD) else 0,
            prefix=prefix,
            forward=Curve(tokens, tuple(timing.forward_s for timing in rows)),
            backward=Curve(tokens, tuple(timing.backward_s for timing in rows)),
            weight=Curve(tokens, tuple(timing.weight_s for timing in rows)),
            host=part_host(rows[0]) if device.type == "cuda" else None,
        ))
    return tuple(layers)


def part_host(timing):
    """A timing's host seconds as the profile states them: each :class:`PartHost` field ``NAME`` is the
    timing's ``host_NAME_s``."""
    from schedlang.lowering.hardware_profile import PartHost

    return PartHost(*(getattr(timing, f"host_{field.name}_s") for field in dataclasses.fields(PartHost)))


def host_memory_line(host_bytes: int | None, gpus: int, links_measured: bool) -> list[str]:
    """The header's line on the host memory recorded: whose it is, and which GPUs share it."""
    if host_bytes is None:
        return []
    shared = (f"shared by the {gpus} GPUs of this node" if links_measured else
              f"this machine's, with {gpus} GPU{'' if gpus == 1 else 's'} visible, while topology.gpus_per_node "
              "comes from the defaults: give --host-memory for a node of another size")
    return [f"host memory: {host_bytes / 2**30:.1f} GiB of RAM ({shared})"]


def median_or_zero(seconds: list[float], device) -> float:
    """The median host time; 0 on the CPU, whose host runs the kernels itself (no launch time of its own)."""
    if not seconds or device.type != "cuda":
        return 0.0
    return statistics.median_high(seconds)


def torch_device_name(device) -> str:
    import platform

    import torch

    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"CPU ({platform.processor() or platform.machine()})"
