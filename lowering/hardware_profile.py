"""Hardware profiles: a device and its links described by measurements, read from a TOML file.

Contract. :func:`load_hardware_profile` reads a file of format 1 (docs/cost-model.md, "Hardware profiles")
with the standard library's ``tomllib`` and returns a frozen :class:`HardwareProfile`, or raises
:class:`HardwareProfileError`, whose ``render()`` is ``file:line:col: error: message``, the line and a caret
(from tomllib's own position for a syntax error, else the line of the offending key) and a hint. Nothing
else escapes: a foreign file, a missing key, a wrong type, an unsorted or non-positive curve all end there.
:func:`resolve_hardware` takes a path or the name of a profile shipped in ``schedlang/lowering/profiles``.

The records here hold what was measured; how a task's time is read from them is
:mod:`schedlang.lowering.profile_cost`'s business.
"""

from __future__ import annotations

import bisect
import dataclasses
import json
import re
import statistics
import tomllib
from collections.abc import Iterable
from dataclasses import dataclass
from enum import Enum
from pathlib import Path

from schedlang.vocabulary import LayerKind
from schedlang.vocabulary.source import Span, render_message

FORMAT_VERSION = 1
PROFILES_DIRECTORY = Path(__file__).parent / "profiles"


class ProfiledPart(str, Enum):
    """What a profile times: every layer kind of the runtime, the embedding, and the LM head with its loss."""

    GLA = "gla"
    SIMPLE_GLA = "simple_gla"
    GDN = "gdn"
    ATTN = "attn"
    MAMBA2 = "mamba2"
    MAMBA3 = "mamba3"
    MLP = "mlp"
    EMBEDDING = "embedding"
    HEAD = "head"

    @classmethod
    def of_layer(cls, kind: LayerKind) -> ProfiledPart:
        return cls(kind.value)

    @property
    def is_mixer(self) -> bool:
        """A layer kind's mixing layer (timed with the model's heads), not the MLP, embedding or head."""
        return self not in (ProfiledPart.MLP, ProfiledPart.EMBEDDING, ProfiledPart.HEAD)

    @property
    def is_recurrent(self) -> bool:
        """A linear-recurrence mixer: its time is linear in the tokens, so another's curve scales to it by FLOPs."""
        return self.is_mixer and self is not ProfiledPart.ATTN


def model_parts(model) -> list[ProfiledPart]:
    """The parts a model (:class:`~schedlang.vocabulary.ModelConfig`) has, in the profile's order: its layer
    kinds, the MLP where a block has one, the embedding and the head."""
    kinds = set(model.layers)
    parts = {ProfiledPart.of_layer(kind) for kind in kinds} | {ProfiledPart.EMBEDDING, ProfiledPart.HEAD}
    if any(model.has_mlp(kind) for kind in kinds):
        parts.add(ProfiledPart.MLP)
    return [part for part in ProfiledPart if part in parts]


STAND_INS = (ProfiledPart.SIMPLE_GLA, ProfiledPart.GLA, ProfiledPart.GDN)
"""The measured recurrent mixers a profile prices an unmeasured recurrent mixer from, first found first: simple
GLA's chunk kernels are what mamba2 and mamba3 run."""


class Origin(str, Enum):
    """Where a profile's figures come from: ``schedlang profile`` on the device, or figures stated elsewhere (a
    paper's tables, docs/benchmarks.md), which the profile's ``note`` names."""

    MEASURED = "measured"
    DERIVED = "derived"


class LinkClass(str, Enum):
    """How a message travels: point to point, an all-gather or a reduce-scatter within a node, or across nodes."""

    P2P = "p2p"
    ALL_GATHER = "all_gather"
    REDUCE_SCATTER = "reduce_scatter"
    INTER_NODE = "inter_node"


@dataclass(frozen=True)
class Curve:
    """Seconds of one task part against chunk tokens, piecewise linear between the measured lengths; beyond them,
    proportional to tokens from the nearest end (a chunk's work is linear in its tokens but for attention's
    pairs, which the prefix axis carries)."""

    tokens: tuple[int, ...]
    seconds: tuple[float, ...]

    def at(self, tokens: float) -> float:
        xs, ys = self.tokens, self.seconds
        if tokens <= xs[0]:
            return ys[0] * tokens / xs[0]
        if tokens >= xs[-1]:
            return ys[-1] * tokens / xs[-1]
        index = bisect.bisect_right(xs, tokens)
        x0, x1, y0, y1 = xs[index - 1], xs[index], ys[index - 1], ys[index]
        return y0 + (y1 - y0) * (tokens - x0) / (x1 - x0)


@dataclass(frozen=True)
class PartHost:
    """The host's seconds to launch one part's work eagerly, from a return to the next without waiting for the
    device (``schedlang profile`` times them at its shortest chunk, where the device keeps up): ``forward`` and
    the whole ``backward`` (weight gradients included), and the same two with the part's saved tensors offloaded
    (``pipeline.offload``: a pack hook and a copy per saved tensor in the forward, a device buffer and a copy back
    per tensor before the backward). An offload figure of 0 was not measured: offload then adds nothing.
    ``recompute_forward`` and ``recompute_backward`` are the two again with the part run as ``pipeline.recompute``
    reruns it (the runtime's checkpoint: its hooks, and the backward rerunning the forward); 0: not measured, and
    a rerun then costs the backward the part's ``forward`` alone."""

    forward: float
    backward: float
    offload_forward: float = 0.0
    offload_backward: float = 0.0
    recompute_forward: float = 0.0
    recompute_backward: float = 0.0

    @property
    def offload_measured(self) -> bool:
        return self.offload_forward > 0 or self.offload_backward > 0

    @property
    def recompute_measured(self) -> bool:
        return self.recompute_forward > 0 and self.recompute_backward > 0


HOST_KEYS = ("host_forward", "host_backward", "host_offload_forward", "host_offload_backward", "host_recompute_forward",
             "host_recompute_backward")
"""A ``[[layer]]``'s optional host times (:class:`PartHost`, in that order); the first two come together, and
so do the last two."""


@dataclass(frozen=True)
class LayerMeasurement:
    """One part measured at one model width (and for ``attn``, one prefix length): forward, backward without the
    weight gradients, and the weight gradients (``W``) of its linear layers, each against chunk tokens, for one
    sequence (microbatch size 1)."""

    part: ProfiledPart
    d_model: int
    heads: int
    head_dim: int
    hidden: int  # the MLP's width (mlp only; 0 otherwise)
    vocab: int  # embedding and head only; 0 otherwise
    prefix: int  # attn: keys before the chunk; 0 otherwise
    forward: Curve
    backward: Curve
    weight: Curve
    host: PartHost | None = None  # None: not measured per part; the [overhead] figures stand for it


@dataclass(frozen=True)
class Overhead:
    """Per-task costs outside the kernels: ``eager_layer_seconds`` is host time to launch one layer's forward
    eagerly and ``eager_backward_layer_seconds`` its whole backward, weight gradients included (a profile
    without it reads three times the forward's), for a part whose ``[[layer]]`` rows state no host times of their
    own (:class:`PartHost`); an eager task takes the longer of its host and device time;
    ``graph_layer_seconds`` is the launch gaps of one layer's forward replayed from a CUDA graph (added);
    ``task_seconds`` is fixed per task (the executor's bookkeeping)."""

    eager_layer_seconds: float
    graph_layer_seconds: float
    task_seconds: float
    eager_backward_layer_seconds: float


@dataclass(frozen=True)
class Offload:
    """Copies of saved activations to pinned host memory and back, on a side stream."""

    bandwidth_bytes_per_s: float


DEFAULT_HOST_MEMORY_BYTES = 128 * 2**30
"""A node's host RAM where a profile does not state it (and without ``--hardware``): the H200 machine the
shipped ``h200`` profile was measured on, one GPU and 128 GiB."""

DEFAULT_PINNED_FRACTION = 0.75
"""The share of a node's host RAM that pinned copies of offloaded activations may take where a profile does not
say: the rest is left to the operating system, each training process's own memory (Python, torch, the CUDA
context's host side, the data) and the page cache. An assumed allowance, like ``OUTSIDE_THE_ALLOCATOR`` on the
device (schedlang.lowering.memory_budget)."""


@dataclass(frozen=True)
class HostMemory:
    """One node's host RAM, shared by its ``topology.gpus_per_node`` GPUs, and the share of it that pinned copies
    may take: with ``pipeline.offload`` every chunk in flight waits there ([Note: activation offload] in
    schedlang.runtime.offload), and the ranks of a node add up (schedlang.lowering.memory_budget)."""

    memory_bytes: int = DEFAULT_HOST_MEMORY_BYTES
    pinned_fraction: float = DEFAULT_PINNED_FRACTION

    @property
    def pinned_limit(self) -> float:
        """Bytes the pinned copies of one node may take."""
        return self.memory_bytes * self.pinned_fraction


@dataclass(frozen=True)
class Link:
    latency_s: float
    bandwidth_bytes_per_s: float

    def transfer_time(self, n_bytes: float) -> float:
        return self.latency_s + n_bytes / self.bandwidth_bytes_per_s


@dataclass(frozen=True)
class Topology:
    gpus_per_node: int
    nodes: int

    def node_of(self, rank: int) -> int:
        return rank // self.gpus_per_node


@dataclass(frozen=True)
class Calibration:
    """What the parts timed alone miss in a whole training step, from steps measured on the device.

    ``step_factor`` multiplies every part's device time (forward, backward, W): the parts are timed alone in
    short bursts (:mod:`schedlang.runtime.profiling`), and a whole step adds what no part holds (the optimizer
    step, the gradient bookkeeping between parts, kernels at the clocks a long step sustains). It is
    ``measured_step_seconds`` (the median step of ``schedule`` run by ``schedlang run``) over
    ``parts_step_seconds`` (that schedule simulated with this profile's parts and factor 1).

    ``host_factor`` multiplies the eager host times (``overhead.eager_*``): a part timed alone launches its
    kernels with nothing else on the host, and a chunked step adds the executor's work per task (the state
    hand-off, the autograd calls, the model's glue between parts). It is fitted to ``host_schedule``, a
    schedule of small chunks run eagerly, so that its step is host-bound: the factor at which the simulated
    step equals ``host_measured_step_seconds`` (``host_parts_step_seconds`` is that step at factor 1).

    A profile without the table has both factors 1 and says nothing of where they came from."""

    step_factor: float = 1.0
    schedule: str = ""
    measured_step_seconds: float = 0.0
    parts_step_seconds: float = 0.0
    host_factor: float = 1.0
    host_schedule: str = ""
    host_measured_step_seconds: float = 0.0
    host_parts_step_seconds: float = 0.0

    @property
    def measured(self) -> bool:
        return bool(self.schedule)

    @property
    def host_measured(self) -> bool:
        return bool(self.host_schedule)


CALIBRATION_BOUNDS = (0.5, 2.0)
"""A step factor outside these is a failed measurement, not a calibration (a whole step within half and twice
its parts' sum)."""

HOST_CALIBRATION_BOUNDS = (0.25, 4.0)
"""A host factor outside these is a failed measurement: the host-bound step within a quarter and four times what
the parts' host times say. Fitted factors seen: 1.28-1.82 on lent H200 machines, about 0.45 on a lent H100 machine
(docs/benchmarks.md, "The host-bound rows")."""


@dataclass(frozen=True)
class HardwareProfile:
    name: str
    device: str
    origin: Origin
    note: str
    dtype: str
    memory_bandwidth_bytes_per_s: float
    overhead: Overhead
    offload: Offload
    links: dict[LinkClass, Link]
    topology: Topology
    layers: tuple[LayerMeasurement, ...]
    calibration: Calibration = Calibration()
    host: HostMemory | None = None  # the [host] table; None: the profile does not state it
    source_file: str = "<memory>"

    def __hash__(self) -> int:
        return hash((self.name, self.source_file, self.layers))

    def measurements(self, part: ProfiledPart) -> tuple[LayerMeasurement, ...]:
        return tuple(layer for layer in self.layers if layer.part is part)

    def link(self, link_class: LinkClass) -> Link:
        return self.links[link_class]

    def part_host(self, part: ProfiledPart) -> PartHost:
        """The host times of one block of ``part`` (of its stand-in where it was never measured): the median over
        its rows that state them (widths and attention prefixes change the kernels' sizes, not their launches),
        else the ``[overhead]`` figures with no offload cost."""
        rows = [layer.host for layer in self.measurements(self.stand_in(part) or part) if layer.host is not None]
        if not rows:
            return PartHost(self.overhead.eager_layer_seconds, self.overhead.eager_backward_layer_seconds)
        return PartHost(*(statistics.median_high([getattr(row, field.name) for row in rows])
                          for field in dataclasses.fields(PartHost)))

    def host_memory(self) -> HostMemory:
        """The node's host memory: the profile's ``[host]``, else the defaults (:class:`HostMemory`)."""
        return self.host if self.host is not None else HostMemory()

    def stand_in(self, part: ProfiledPart) -> ProfiledPart | None:
        """The part whose curves price ``part`` when the profile never measured it: a measured recurrent mixer of
        :data:`STAND_INS` for a recurrent mixer (scaled by FLOPs, as any other width is), else None."""
        if self.measurements(part) or not part.is_recurrent:
            return None
        return next((candidate for candidate in STAND_INS if self.measurements(candidate)), None)

    def describe(self, parts: Iterable[ProfiledPart] = ()) -> str:
        """One line for ``simulate``: the name, the file and where its figures come from; for the model's
        ``parts``, which of them are priced from another part's curves."""
        line = f"hardware profile {self.name} ({self.source_file}; {self.origin.value}: {self.note})"
        stood_in = {part: self.stand_in(part) for part in parts}
        notes = [f"{part.value} from {source.value}'s curves by FLOPs" for part, source in stood_in.items() if source]
        return line + (f"; not measured, priced: {', '.join(notes)}" if notes else "")


class HardwareProfileError(Exception):
    """A profile that cannot be read, with its position (when known) and a hint."""

    def __init__(self, message: str, span: Span | None, source_text: str | None, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.span = span
        self.source_text = source_text
        self.hint = hint

    def render(self) -> str:
        return render_message(self.span, self.message, self.source_text, hint=self.hint)


TOML_POSITION = re.compile(r"\(at line (\d+), column (\d+)\)")
FORMAT_HINT = "a hardware profile is the TOML file of docs/cost-model.md, 'Hardware profiles' (format = 1)"


class ProfileReader:
    """Typed reads of the parsed TOML that fail with the key's position."""

    def __init__(self, path: str, text: str) -> None:
        self.path = path
        self.text = text
        self.lines = text.splitlines()

    def span_of(self, table: str, key: str | None, index: int = 0) -> Span | None:
        """The line of ``key`` inside the ``index``-th table named ``table`` ('' for the top level), or of the
        table's header when ``key`` is None."""
        current, seen = "", -1
        header_line = None
        for number, line in enumerate(self.lines, start=1):
            stripped = line.strip()
            header = re.match(r"^\[\[?\s*([A-Za-z0-9_.\-]+)\s*\]\]?", stripped)
            if header:
                current = header.group(1)
                if current == table:
                    seen += 1
                    if seen == index:
                        header_line = number
                continue
            in_table = current == table and (table == "" or seen == index)
            if key is not None and in_table and re.match(rf"^{re.escape(key)}\s*=", stripped):
                column = line.index(key) + 1
                return Span(self.path, number, column, number, column + len(key))
        if header_line is not None:
            return Span(self.path, header_line, 1, header_line, len(self.lines[header_line - 1]) + 1)
        return None

    def fail(self, message: str, table: str, key: str | None, index: int = 0, hint: str | None = None):
        raise HardwareProfileError(message, self.span_of(table, key, index), self.text, hint or FORMAT_HINT)

    def table(self, data: dict, name: str) -> dict:
        value = data.get(name)
        if not isinstance(value, dict):
            self.fail(f"missing table [{name}]", "", None)
        return value

    def number(self, data: dict, key: str, table: str, index: int = 0, positive: bool = True) -> float:
        path = f"{table}.{key}" if table else key
        if key not in data:
            self.fail(f"missing key '{path}'", table, None, index)
        value = data[key]
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            self.fail(f"'{path}' must be a number, got {value!r}", table, key, index)
        if positive and not value > 0:
            self.fail(f"'{path}' must be positive, got {value!r}", table, key, index)
        if not positive and value < 0:
            self.fail(f"'{path}' must not be negative, got {value!r}", table, key, index)
        return float(value)

    def integer(self, data: dict, key: str, table: str, index: int = 0, default: int | None = None) -> int:
        path = f"{table}.{key}" if table else key
        if key not in data:
            if default is not None:
                return default
            self.fail(f"missing key '{path}'", table, None, index)
        value = data[key]
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            self.fail(f"'{path}' must be a non-negative integer, got {value!r}", table, key, index)
        return value

    def string(self, data: dict, key: str, table: str, choices: tuple[str, ...] | None = None) -> str:
        path = f"{table}.{key}" if table else key
        if key not in data:
            self.fail(f"missing key '{path}'", table, None)
        value = data[key]
        if not isinstance(value, str):
            self.fail(f"'{path}' must be a string, got {value!r}", table, key)
        if choices is not None and value not in choices:
            self.fail(f"'{path}' must be one of {', '.join(choices)}, got {value!r}", table, key)
        return value

    def curve(self, data: dict, tokens: tuple[int, ...], key: str, table: str, index: int) -> Curve:
        values = data.get(key)
        path = f"{table}[{index}].{key}"
        if not isinstance(values, list) or len(values) != len(tokens):
            message = f"'{path}' must be a list of {len(tokens)} numbers (one per entry of 'tokens')"
            self.fail(message, table, key, index)
        for value in values:
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
                self.fail(f"'{path}' must hold non-negative seconds, got {value!r}", table, key, index)
        return Curve(tokens, tuple(float(value) for value in values))


def parse_layer(reader: ProfileReader, data: dict, index: int) -> LayerMeasurement:
    table = "layer"
    kind = data.get("kind")
    choices = tuple(part.value for part in ProfiledPart)
    if kind not in choices:
        reader.fail(f"'layer[{index}].kind' must be one of {', '.join(choices)}, got {kind!r}", table, "kind", index)
    part = ProfiledPart(kind)
    tokens = data.get("tokens")
    if (
        not isinstance(tokens, list)
        or not tokens
        or any(isinstance(value, bool) or not isinstance(value, int) or value <= 0 for value in tokens)
        or list(tokens) != sorted(set(tokens))
    ):
        reader.fail(
            f"'layer[{index}].tokens' must be a non-empty increasing list of positive integers, got {tokens!r}",
            table, "tokens", index,
        )
    tokens = tuple(tokens)
    needs_heads = part.is_mixer
    return LayerMeasurement(
        part=part,
        d_model=reader.integer(data, "d_model", table, index),
        heads=reader.integer(data, "heads", table, index, default=None if needs_heads else 0),
        head_dim=reader.integer(data, "head_dim", table, index, default=None if needs_heads else 0),
        hidden=reader.integer(data, "hidden", table, index, default=None if part is ProfiledPart.MLP else 0),
        vocab=reader.integer(
            data, "vocab", table, index,
            default=None if part in (ProfiledPart.EMBEDDING, ProfiledPart.HEAD) else 0,
        ),
        prefix=reader.integer(data, "prefix", table, index, default=0),
        forward=reader.curve(data, tokens, "forward", table, index),
        backward=reader.curve(data, tokens, "backward", table, index),
        weight=reader.curve(data, tokens, "weight", table, index)
        if "weight" in data
        else Curve(tokens, (0.0,) * len(tokens)),
        host=parse_part_host(reader, data, index),
    )


def parse_part_host(reader: ProfileReader, data: dict, index: int) -> PartHost | None:
    """A ``[[layer]]``'s host times (:data:`HOST_KEYS`), or None where it states none."""
    stated = [key for key in HOST_KEYS if key in data]
    if not stated:
        return None
    for key in HOST_KEYS[:2]:
        if key not in data:
            reader.fail(f"'layer[{index}]' states {stated[0]} without {key}: give both or neither", "layer",
                        stated[0], index)
    recompute_keys = HOST_KEYS[4:]
    if (recompute_keys[0] in data) != (recompute_keys[1] in data):
        given, missing = recompute_keys if recompute_keys[0] in data else recompute_keys[::-1]
        reader.fail(f"'layer[{index}]' states {given} without {missing}: give both or neither", "layer", given, index)
    values = [reader.number(data, key, "layer", index, positive=False) if key in data else 0.0 for key in HOST_KEYS]
    return PartHost(*values)


def parse_hardware_profile(text: str, path: str = "<memory>") -> HardwareProfile:
    """The profile in ``text``; see the module docstring."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as error:
        message = str(error)
        position = TOML_POSITION.search(message)
        span = None
        if position:
            line, column = int(position.group(1)), int(position.group(2))
            span = Span(path, line, column, line, column + 1)
            message = TOML_POSITION.sub("", message).strip()
        raise HardwareProfileError(f"not valid TOML: {message}", span, text, FORMAT_HINT) from None
    reader = ProfileReader(path, text)
    if "format" not in data:
        reader.fail("not a hardware profile: no 'format' key", "", None)
    if data["format"] != FORMAT_VERSION:
        reader.fail(
            f"hardware profile format {data['format']!r} is not supported; this schedlang reads format "
            f"{FORMAT_VERSION}", "", "format",
        )
    device = reader.table(data, "device")
    overhead = reader.table(data, "overhead")
    offload = reader.table(data, "offload")
    links = reader.table(data, "links")
    topology = reader.table(data, "topology")
    link_records = {}
    for link_class in LinkClass:
        name = f"links.{link_class.value}"
        link = links.get(link_class.value)
        if not isinstance(link, dict):
            reader.fail(f"missing table [{name}]", "links", None)
        link_records[link_class] = Link(
            reader.number(link, "latency", name, positive=False), reader.number(link, "bandwidth", name)
        )
    layer_tables = data.get("layer")
    if not isinstance(layer_tables, list) or not layer_tables:
        reader.fail("a hardware profile needs at least one [[layer]] measurement", "", None)
    layers = tuple(parse_layer(reader, layer, index) for index, layer in enumerate(layer_tables))
    gpus_per_node = reader.integer(topology, "gpus_per_node", "topology")
    nodes = reader.integer(topology, "nodes", "topology")
    if gpus_per_node < 1 or nodes < 1:
        reader.fail("'topology.gpus_per_node' and 'topology.nodes' must be at least 1", "topology", None)
    forward_host = reader.number(overhead, "eager_layer_seconds", "overhead", positive=False)
    calibration = parse_calibration(reader, data)
    return HardwareProfile(
        name=reader.string(device, "name", "device"),
        device=reader.string(device, "model", "device"),
        origin=Origin(reader.string(device, "origin", "device", tuple(origin.value for origin in Origin))),
        note=reader.string(device, "note", "device"),
        dtype=reader.string(device, "dtype", "device", ("fp32", "bf16", "fp16", "fp64")),
        memory_bandwidth_bytes_per_s=reader.number(device, "memory_bandwidth", "device"),
        overhead=Overhead(
            forward_host,
            reader.number(overhead, "graph_layer_seconds", "overhead", positive=False),
            reader.number(overhead, "task_seconds", "overhead", positive=False),
            reader.number(overhead, "eager_backward_layer_seconds", "overhead", positive=False)
            if "eager_backward_layer_seconds" in overhead else 3 * forward_host,
        ),
        offload=Offload(reader.number(offload, "bandwidth", "offload")),
        links=link_records,
        topology=Topology(gpus_per_node, nodes),
        layers=layers,
        calibration=calibration,
        host=parse_host(reader, data),
        source_file=path,
    )


def parse_host(reader: ProfileReader, data: dict) -> HostMemory | None:
    """The optional ``[host]`` table: ``memory`` (bytes of a node's RAM) and ``pinned_fraction`` (default
    :data:`DEFAULT_PINNED_FRACTION`); None without the table."""
    if "host" not in data:
        return None
    if not isinstance(data["host"], dict):
        reader.fail(f"'host' must be the table [host], got {data['host']!r}", "", "host")
    table = data["host"]
    memory = reader.number(table, "memory", "host")
    if memory < 1 or not float(memory).is_integer():
        reader.fail(f"'host.memory' must be a whole number of bytes, got {table['memory']!r}", "host", "memory")
    fraction = DEFAULT_PINNED_FRACTION
    if "pinned_fraction" in table:
        fraction = reader.number(table, "pinned_fraction", "host")
        if fraction > 1:
            reader.fail(
                f"'host.pinned_fraction' is the share of host memory pinned copies may take, at most 1, got "
                f"{table['pinned_fraction']!r}", "host", "pinned_fraction",
            )
    return HostMemory(int(memory), fraction)


def parse_calibration(reader: ProfileReader, data: dict) -> Calibration:
    """The optional ``[calibration]`` table; factor 1 without it."""
    if "calibration" not in data:
        return Calibration()
    table = reader.table(data, "calibration")
    factor = reader.number(table, "step_factor", "calibration")
    low, high = CALIBRATION_BOUNDS
    if not low <= factor <= high:
        reader.fail(
            f"'calibration.step_factor' is {factor:g}; a whole step measured outside {low:g}x-{high:g}x of its "
            "parts' sum is a failed measurement", "calibration", "step_factor",
        )
    host = {}
    if "host_factor" in table:
        host_factor = reader.number(table, "host_factor", "calibration")
        low, high = HOST_CALIBRATION_BOUNDS
        if not low <= host_factor <= high:
            reader.fail(
                f"'calibration.host_factor' is {host_factor:g}; a host-bound step measured outside "
                f"{low:g}x-{high:g}x of its parts' host times is a failed measurement", "calibration", "host_factor",
            )
        host = dict(
            host_factor=host_factor,
            host_schedule=reader.string(table, "host_schedule", "calibration"),
            host_measured_step_seconds=reader.number(table, "host_measured_step_seconds", "calibration"),
            host_parts_step_seconds=reader.number(table, "host_parts_step_seconds", "calibration"),
        )
    return Calibration(
        step_factor=factor,
        schedule=reader.string(table, "schedule", "calibration"),
        measured_step_seconds=reader.number(table, "measured_step_seconds", "calibration"),
        parts_step_seconds=reader.number(table, "parts_step_seconds", "calibration"),
        **host,
    )


def load_hardware_profile(path: str | Path) -> HardwareProfile:
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise HardwareProfileError(f"cannot read hardware profile {path}: {error}", None, None) from None
    return parse_hardware_profile(text, str(path))


def shipped_profiles() -> dict[str, Path]:
    """The profiles in the package, by name (the file's stem)."""
    return {path.stem: path for path in sorted(PROFILES_DIRECTORY.glob("*.toml"))}


SHIPPED_ALIASES = {"h200": "h200-benchmarks"}
"""``--hardware h200`` names the H200 profile in the package: a measured ``profiles/h200.toml`` once a
``schedlang profile`` run on the H200 has written one, until then the placeholder built from
docs/benchmarks.md's figures (its header says so)."""


def resolve_hardware(name_or_path: str) -> HardwareProfile:
    """A shipped profile by name (``h200``, ``zeco-h100``, ...) or a profile file by path."""
    shipped = shipped_profiles()
    name = name_or_path if name_or_path in shipped else SHIPPED_ALIASES.get(name_or_path, name_or_path)
    if name in shipped and not Path(name_or_path).exists():
        return load_hardware_profile(shipped[name])
    if not Path(name_or_path).exists():
        raise HardwareProfileError(
            f"no hardware profile {name_or_path!r}: not a file, and not one of the shipped profiles "
            f"({', '.join(sorted(set(shipped) | set(SHIPPED_ALIASES)))})",
            None, None, "measure one with `schedlang profile FILE --device cuda -o PROFILE.toml`",
        )
    return load_hardware_profile(name_or_path)


def format_number(value: float) -> str:
    return repr(int(value)) if float(value).is_integer() and abs(value) < 1e15 else f"{value:.6e}"


def format_list(values) -> str:
    return "[" + ", ".join(format_number(value) for value in values) + "]"


def format_hardware_profile(profile: HardwareProfile, header: str = "") -> str:
    """``profile`` as the TOML text :func:`parse_hardware_profile` reads back to an equal profile; ``header`` is
    written first as comment lines (where a profile says how it was made)."""
    lines = [f"# {line}".rstrip() for line in header.splitlines()]
    lines += [f"format = {FORMAT_VERSION}", "", "[device]"]
    lines += [
        f"name = {json.dumps(profile.name)}",
        f"model = {json.dumps(profile.device)}",
        f'origin = "{profile.origin.value}"',
        f"note = {json.dumps(profile.note)}",
        f'dtype = "{profile.dtype}"',
        f"memory_bandwidth = {format_number(profile.memory_bandwidth_bytes_per_s)}",
        "",
        "[overhead]",
        f"eager_layer_seconds = {format_number(profile.overhead.eager_layer_seconds)}",
        f"eager_backward_layer_seconds = {format_number(profile.overhead.eager_backward_layer_seconds)}",
        f"graph_layer_seconds = {format_number(profile.overhead.graph_layer_seconds)}",
        f"task_seconds = {format_number(profile.overhead.task_seconds)}",
        "",
        "[offload]",
        f"bandwidth = {format_number(profile.offload.bandwidth_bytes_per_s)}",
        "",
        "[topology]",
        f"gpus_per_node = {profile.topology.gpus_per_node}",
        f"nodes = {profile.topology.nodes}",
    ]
    if profile.host is not None:
        lines += [
            "",
            "[host]",
            f"memory = {profile.host.memory_bytes}",
            f"pinned_fraction = {format_number(profile.host.pinned_fraction)}",
        ]
    if profile.calibration.measured:
        calibration = profile.calibration
        lines += [
            "",
            "[calibration]",
            f"step_factor = {format_number(calibration.step_factor)}",
            f"schedule = {json.dumps(calibration.schedule)}",
            f"measured_step_seconds = {format_number(calibration.measured_step_seconds)}",
            f"parts_step_seconds = {format_number(calibration.parts_step_seconds)}",
        ]
        if calibration.host_measured:
            lines += [
                f"host_factor = {format_number(calibration.host_factor)}",
                f"host_schedule = {json.dumps(calibration.host_schedule)}",
                f"host_measured_step_seconds = {format_number(calibration.host_measured_step_seconds)}",
                f"host_parts_step_seconds = {format_number(calibration.host_parts_step_seconds)}",
            ]
    for link_class in LinkClass:
        link = profile.links[link_class]
        lines += [
            "",
            f"[links.{link_class.value}]",
            f"latency = {format_number(link.latency_s)}",
            f"bandwidth = {format_number(link.bandwidth_bytes_per_s)}",
        ]
    for layer in profile.layers:
        lines += ["", "[[layer]]", f'kind = "{layer.part.value}"', f"d_model = {layer.d_model}"]
        for key in ("heads", "head_dim", "hidden", "vocab", "prefix"):
            if getattr(layer, key):
                lines.append(f"{key} = {getattr(layer, key)}")
        lines += [
            f"tokens = {format_list(layer.forward.tokens)}",
            f"forward = {format_list(layer.forward.seconds)}",
            f"backward = {format_list(layer.backward.seconds)}",
            f"weight = {format_list(layer.weight.seconds)}",
        ]
        if layer.host is not None:
            values = dataclasses.astuple(layer.host)
            lines += [f"{key} = {format_number(value)}" for key, value in zip(HOST_KEYS, values)
                      if value or key in HOST_KEYS[:2]]
    return "\n".join(lines) + "\n"
