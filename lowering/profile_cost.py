"""The profile cost model: task times from a hardware profile's measured curves, messages by link class.

Contract. :class:`ProfileCostModel` (what ``make_cost_model(CostModelKind.FLOPS, program, profile)`` returns for a
hardware profile) answers :class:`schedlang.lowering.cost.CostModel` in seconds for a checked
program and a :class:`~schedlang.lowering.hardware_profile.HardwareProfile` (formulas in docs/cost-model.md,
"The profile model"):

* A chunk's ``F`` on a stage is the sum over its layers (and the embedding on the first stage, the head and loss
  on the last) of each part's forward curve at the rank's rows (``microbatch_size x chunk / S``; attention per
  sequence, at the chunk's prefix, times ``microbatch_size``), each scaled by FLOPs from the nearest measured
  width and by the profile's calibration ``step_factor`` (what a whole step adds to its parts timed alone:
  :class:`~schedlang.lowering.hardware_profile.Calibration`); plus the sequence-parallel
  exchange of its layers; plus the launch overhead: eager, the task takes the longer of its device time and its
  host time (each part's measured host time, or the profile's ``[overhead]`` figure where its rows state none,
  times the calibration's ``host_factor``; a backward adds the host time of the parts it reruns); replayed from CUDA graphs, it adds the graph's launch gaps. Every task adds ``task_seconds``.
* ``B`` is the backward curves (plus the weight curves when the backward is not split), the reverse exchange,
  the recomputed forward parts ([Note: recompute costs] in schedlang.lowering.cost) and the addition of the
  stage's gradients into ``.grad`` at the profile's memory bandwidth (as the flops model). ``W`` is the weight
  curves and the linear weights' ``.grad`` additions.
* With ``pipeline.offload`` a unit's saved activations (the memory model's bytes) travel as the executor moves
  them (``offload_copies`` in schedlang.vocabulary.actions), at the offload bandwidth, on one copy stream per
  stage beside the tasks: a unit whose ``F`` is directly followed by its ``B`` keeps them on the device and copies
  nothing; another goes to the host from the start of its ``F`` and comes back when the backward before its own
  prefetches it (the first backward of a stage's list: at its own start). A backward whose copy back has not
  ended waits for it, and the wait is part of its time (:meth:`ProfileCostModel._copy_waits`). Eagerly, a
  copying unit's ``F`` and ``B`` also launch what the offload hooks add on the host (each part's measured
  ``host_offload_*`` over its plain host time, for the parts the backward does not rerun).
* A message between stages, and each hop of a sequence-parallel scan, travels on the link its two ranks share:
  ``p2p`` within a node, ``inter_node`` across (ranks are laid out pipeline x sequence x data, row-major, as
  schedlang.runtime.mesh builds them, and fill nodes of ``gpus_per_node`` in rank order). Collectives use the
  ``all_gather`` / ``reduce_scatter`` classes within a node and ``inter_node`` once they span nodes.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence

from schedlang.lowering.cost import (
    GRADIENT_ACCUMULATION_PASSES,
    ChunkForwardSeconds,
    FlopsCostModel,
    attention_pair_flops,
    head_flops_per_token,
    layer_kind_counts,
    layer_mixer_flops_per_token,
    mixer_flops_per_token,
    mlp_flops_per_token,
    model_attention_pair_flops,
    rerun_parts,
)
from schedlang.lowering.hardware_profile import (
    HardwareProfile,
    LayerMeasurement,
    Link,
    LinkClass,
    ProfiledPart,
    model_parts,
)
from schedlang.lowering.orders import stage_orders
from schedlang.lowering.parameters import stage_parameters
from schedlang.lowering.program import ScheduleProgram
from schedlang.vocabulary.actions import ActionKind, OffloadCopy, TaskId, next_backwards, offload_copies
from schedlang.vocabulary.edges import Payload
from schedlang.vocabulary import (
    AttentionExchange,
    LayerKind,
    ModelConfig,
    Recompute,
    SequenceParallelMethod,
    recompute_on,
)


class MissingMeasurementError(ValueError):
    """The program has a part its profile never measured."""


def measured_flops_per_token(measurement: LayerMeasurement, kernel_chunk: int) -> float:
    """Forward FLOPs per token of the measured layer's geometry, attention pairs aside."""
    part = measurement.part
    if part is ProfiledPart.MLP:
        return 3 * 2 * measurement.d_model * measurement.hidden
    if part in (ProfiledPart.EMBEDDING,):
        return float(measurement.d_model)  # a row gather: proportional to the width
    if part is ProfiledPart.HEAD:
        return 2 * measurement.d_model * measurement.vocab
    return mixer_flops_per_token(
        LayerKind(part.value), measurement.d_model, measurement.heads, measurement.head_dim, kernel_chunk
    )


def model_flops_per_token(model: ModelConfig, part: ProfiledPart, kernel_chunk: int) -> float:
    """The same for the program's model."""
    if part is ProfiledPart.MLP:
        return mlp_flops_per_token(model)
    if part is ProfiledPart.EMBEDDING:
        return float(model.d_model)
    if part is ProfiledPart.HEAD:
        return head_flops_per_token(model)
    return layer_mixer_flops_per_token(model, LayerKind(part.value), kernel_chunk)


def nearest_width(measurements: Sequence[LayerMeasurement], d_model: int) -> tuple[LayerMeasurement, ...]:
    """The measurements at the measured width nearest ``d_model`` (the smaller on a tie)."""
    widths = sorted({measurement.d_model for measurement in measurements})
    width = min(widths, key=lambda measured: (abs(measured - d_model), measured))
    return tuple(measurement for measurement in measurements if measurement.d_model == width)


def hop_links(ranks: Sequence[int], profile: HardwareProfile) -> list[Link]:
    """The link of each hop between consecutive ``ranks``."""
    topology = profile.topology
    return [
        profile.link(LinkClass.P2P if topology.node_of(a) == topology.node_of(b) else LinkClass.INTER_NODE)
        for a, b in zip(ranks, ranks[1:])
    ]


def collective_link(ranks: Sequence[int], profile: HardwareProfile, within: LinkClass) -> Link:
    """``within`` when all ``ranks`` share a node, else the inter-node link (the ring's slowest hop)."""
    nodes = {profile.topology.node_of(rank) for rank in ranks}
    return profile.link(within if len(nodes) == 1 else LinkClass.INTER_NODE)


def scan_seconds(
    method: SequenceParallelMethod, ranks: Sequence[int], blocks: int, state_bytes: float, profile: HardwareProfile
) -> float:
    """:func:`schedlang.lowering.cost.state_scan_seconds` with each hop on its own link: the ring adds its hops;
    All-Scan pipelines ``blocks`` blocks through the middle hops (each block pays every hop once, and the
    slowest hop once per further block) and sends one whole message on the last; the all-gather is bound by its
    link class, or the inter-node link once it spans nodes."""
    count = len(ranks)
    if count <= 1:
        return 0.0
    links = hop_links(ranks, profile)
    if method is SequenceParallelMethod.RING:
        return sum(link.transfer_time(state_bytes) for link in links)
    if method is SequenceParallelMethod.ALLGATHER:
        return allgather_time(ranks, state_bytes, profile, LinkClass.ALL_GATHER)
    if count == 2:
        return links[0].transfer_time(state_bytes)
    middle = [link.transfer_time(state_bytes / blocks) for link in links[:-1]]
    return sum(middle) + (blocks - 1) * max(middle) + links[-1].transfer_time(state_bytes)


def allgather_time(ranks: Sequence[int], bytes_per_rank: float, profile: HardwareProfile, within: LinkClass) -> float:
    """``ceil(log2 P)`` latencies and ``P - 1`` contributions through the collective's link."""
    count = len(ranks)
    if count <= 1:
        return 0.0
    link = collective_link(ranks, profile, within)
    return math.ceil(math.log2(count)) * link.latency_s + (count - 1) * bytes_per_rank / link.bandwidth_bytes_per_s


TaskSeconds = tuple[dict[ActionKind, float], frozenset[ActionKind]]
"""Each task kind's seconds, and the kinds whose seconds are the host's."""


class ProfileCostModel:
    """Seconds from a hardware profile; see the module docstring."""

    time_divisor = 1.0

    def __init__(self, program: ScheduleProgram, profile: HardwareProfile) -> None:
        self.program = program
        self.profile = profile
        self.split_backward = program.pipeline.split_backward
        self.graphs = bool(program.pipeline.cuda_graphs)
        self.sequence_ranks = program.mesh.sequence
        self.batch = program.pipeline.microbatch_size
        # message and state sizes are the flops model's (the same bytes cross any link)
        self.sizes = FlopsCostModel(program)
        self.stage_kinds = [layer_kind_counts(program.model, layers) for layers in program.stage_layers]
        self._part_cache: dict[tuple[ProfiledPart, float, float], tuple[float, float, float]] = {}
        self.missing = self._missing_parts()
        if self.missing:
            names = ", ".join(part.value for part in self.missing)
            raise MissingMeasurementError(
                f"hardware profile {profile.name} has no measurement of {names}, which the schedule's model "
                f"needs; measure them with `schedlang profile`"
            )
        # (stage, chunk) -> each task kind's seconds and the kinds bound by the host: as a unit that keeps its
        # saved tensors runs, and as one that copies them out (the offload hooks' host time added)
        self.tasks: dict[tuple[int, int], dict[ActionKind, float]] = {}
        self.offloaded_tasks: dict[tuple[int, int], dict[ActionKind, float]] = {}
        self._bound: dict[tuple[int, int], frozenset[ActionKind]] = {}
        self._offloaded_bound: dict[tuple[int, int], frozenset[ActionKind]] = {}
        for stage in range(program.n_stages):
            for chunk in range(program.n_chunks):
                (self.tasks[stage, chunk], self._bound[stage, chunk]), offloaded = self._stage_chunk(stage, chunk)
                self.offloaded_tasks[stage, chunk], self._offloaded_bound[stage, chunk] = offloaded
        # with offload: (stage, microbatch, chunk) of each unit that copies its saved tensors out, and how long
        # its backward waits for them to come back
        self.copied_units: frozenset[tuple[int, int, int]] = frozenset()
        self.copy_waits: dict[tuple[int, int, int], float] = {}
        if program.pipeline.offload:
            orders = stage_orders(program)
            copies = [offload_copies(tuple(task.action for task in order)) for order in orders]
            self.copied_units = frozenset(
                (stage, *unit) for stage, labels in enumerate(copies)
                for unit, copy in labels.items() if copy is not OffloadCopy.KEPT
            )
            for stage, order in enumerate(orders):
                for (microbatch, chunk), wait in self._copy_waits(stage, order, copies[stage]).items():
                    self.copy_waits[stage, microbatch, chunk] = wait

    def _stage_parts(self, stage: int) -> list[tuple[ProfiledPart, int]]:
        """(part, count) of every block a chunk on ``stage`` runs."""
        model = self.program.model
        parts: dict[ProfiledPart, int] = {}
        for kind, n_layers in self.stage_kinds[stage].items():
            parts[ProfiledPart.of_layer(kind)] = parts.get(ProfiledPart.of_layer(kind), 0) + n_layers
            if kind.is_mixer and model.has_mlp(kind):
                parts[ProfiledPart.MLP] = parts.get(ProfiledPart.MLP, 0) + n_layers
        if stage == 0:
            parts[ProfiledPart.EMBEDDING] = 1
        if stage == self.program.n_stages - 1:
            parts[ProfiledPart.HEAD] = 1
        return sorted(parts.items())

    def _missing_parts(self) -> list[ProfiledPart]:
        return [part for part in model_parts(self.program.model)
                if not self.profile.measurements(part) and self.profile.stand_in(part) is None]

    def part_seconds(self, part: ProfiledPart, tokens: float, prefix: float) -> tuple[float, float, float]:
        """(forward, backward, weight) seconds of one block of ``part`` over ``tokens`` rows after ``prefix``
        keys (attention), read from the nearest measured width and scaled by FLOPs; remembered, since uniform
        chunks ask the same question on every stage."""
        key = (part, tokens, prefix if part is ProfiledPart.ATTN else 0)
        if key not in self._part_cache:
            self._part_cache[key] = self._part_seconds(part, tokens, prefix)
        return self._part_cache[key]

    def _part_seconds(self, part: ProfiledPart, tokens: float, prefix: float) -> tuple[float, float, float]:
        factor = self.profile.calibration.step_factor
        return tuple(factor * seconds for seconds in self._alone_seconds(part, tokens, prefix))

    def _alone_seconds(self, part: ProfiledPart, tokens: float, prefix: float) -> tuple[float, float, float]:
        """The part as timed alone: the curves, scaled by FLOPs to the model's width (and prefix)."""
        model = self.program.model
        kernel_chunk = min(self.program.sequence.kernel_chunk, max(int(tokens), 1))
        source = self.profile.stand_in(part) or part  # an unmeasured recurrent mixer: another's curves, by FLOPs
        measurements = nearest_width(self.profile.measurements(source), model.d_model)
        target = model_flops_per_token(model, part, kernel_chunk)
        if part is not ProfiledPart.ATTN:
            measured = measurements[0]
            scale = target / measured_flops_per_token(measured, kernel_chunk)
            return tuple(scale * curve.at(tokens) for curve in (measured.forward, measured.backward, measured.weight))
        return self._attention_seconds(measurements, target, tokens, prefix, kernel_chunk)

    def _attention_seconds(
        self, measurements: Sequence[LayerMeasurement], target: float, tokens: float, prefix: float, kernel_chunk: int
    ) -> tuple[float, float, float]:
        """Attention at ``prefix``: each measurement scaled to the model's heads by FLOPs at its own prefix, then
        linear in the prefix through the two measured prefixes around it (or the nearest two, beyond them: the
        pairs are linear in the prefix). One measured prefix: scaled by FLOPs to ``prefix`` as well."""
        model = self.program.model

        def flops(per_token: float, pair_flops: float, at_prefix: float) -> float:
            return per_token + pair_flops * (at_prefix + tokens / 2)

        def scaled(measured: LayerMeasurement, at_prefix: float) -> tuple[float, ...]:
            measured_flops = flops(
                measured_flops_per_token(measured, kernel_chunk),
                attention_pair_flops(measured.heads, measured.head_dim),
                measured.prefix,
            )
            scale = flops(target, model_attention_pair_flops(model), at_prefix) / measured_flops
            return tuple(scale * curve.at(tokens) for curve in (measured.forward, measured.backward, measured.weight))

        by_prefix = sorted(measurements, key=lambda measurement: measurement.prefix)
        if len(by_prefix) == 1:
            return scaled(by_prefix[0], prefix)
        index = max(0, min(bisect.bisect_right([m.prefix for m in by_prefix], prefix) - 1, len(by_prefix) - 2))
        lower, upper = by_prefix[index], by_prefix[index + 1]
        low, high = scaled(lower, lower.prefix), scaled(upper, upper.prefix)
        weight = (prefix - lower.prefix) / (upper.prefix - lower.prefix)
        return tuple(max(a + weight * (b - a), 0.0) for a, b in zip(low, high))

    def _sequence_ranks(self, stage: int) -> list[int]:
        mesh = self.program.mesh
        return [(stage * mesh.sequence + index) * mesh.data for index in range(mesh.sequence)]

    def _data_ranks(self, stage: int) -> list[int]:
        mesh = self.program.mesh
        return [stage * mesh.sequence * mesh.data + index for index in range(mesh.data)]

    def gradient_reduction_duration(self, stage: int) -> float:
        """The stage's gradient all-reduce (``Trainer.reduce_gradients``): over its sequence group, then its data
        group, each a reduce-scatter and an all-gather of ``1 / P`` of the flattened gradients on those link
        classes, or the inter-node link once the group spans nodes."""
        from schedlang.lowering.memory_terms import reduced_gradient_bytes  # memory_terms imports cost

        n_bytes = reduced_gradient_bytes(self.program, stage)
        seconds = 0.0
        for ranks in (self._sequence_ranks(stage), self._data_ranks(stage)):
            if len(ranks) > 1:
                share = n_bytes / len(ranks)
                seconds += (allgather_time(ranks, share, self.profile, LinkClass.REDUCE_SCATTER)
                            + allgather_time(ranks, share, self.profile, LinkClass.ALL_GATHER))
        return seconds

    def _exchange_seconds(self, stage: int, tokens: int) -> tuple[float, float]:
        """(forward, backward) sequence-parallel exchange of one chunk on ``stage``: one scan per recurrent layer
        each way, and each attention layer's K/V exchange (its gradients' reduce-scatter back)."""
        if self.sequence_ranks == 1:
            return 0.0, 0.0
        program, profile = self.program, self.profile
        sequence = program.sequence
        ranks = self._sequence_ranks(stage)
        scans = sum(
            n_layers
            * scan_seconds(sequence.parallel, ranks, sequence.scan_blocks, self.sizes.scan_bytes(kind), profile)
            for kind, n_layers in self.stage_kinds[stage].items()
            if kind.is_recurrent
        )
        attention_layers = self.stage_kinds[stage].get(LayerKind.ATTN, 0)
        if not attention_layers:
            return scans, scans
        width = program.model.attention_geometry.buffered_key_value_width
        kv_bytes = 2 * self.batch * -(-tokens // self.sequence_ranks) * width * self.sizes.element_bytes
        if sequence.attention is AttentionExchange.RING:
            ring = sum(link.transfer_time(kv_bytes) for link in hop_links(ranks, profile))
            return scans + attention_layers * ring, scans + attention_layers * ring
        gather = allgather_time(ranks, kv_bytes, profile, LinkClass.ALL_GATHER)
        scatter = allgather_time(ranks, kv_bytes, profile, LinkClass.REDUCE_SCATTER)
        return scans + attention_layers * gather, scans + attention_layers * scatter

    def _accumulation(self, parameters: int) -> float:
        passes = GRADIENT_ACCUMULATION_PASSES * parameters * self.sizes.element_bytes
        return passes / self.profile.memory_bandwidth_bytes_per_s

    def _copy_waits(
        self, stage: int, order: Sequence[TaskId], copies: dict[tuple[int, int], OffloadCopy]
    ) -> dict[tuple[int, int], float]:
        """Each offloading unit's wait for its copy back at the start of its backward on ``stage``: the stage's
        tasks walked in ``order``, back to back, beside one copy stream that runs each copy in the order the
        executor queues it (out at the start of its ``F``, ending no sooner than that ``F``; back when an earlier
        backward prefetches it, else at the start of its own), each at the offload bandwidth. A stage that idles
        between tasks gives the copies more time, so the waits are at most those of the real step."""
        from schedlang.lowering.memory_terms import chunk_activation_bytes

        following = next_backwards(tuple(task.action for task in order))
        bandwidth = self.profile.offload.bandwidth_bytes_per_s
        copy_seconds = [chunk_activation_bytes(self.program, stage, chunk) / bandwidth
                        for chunk in range(self.program.n_chunks)]
        compute, stream = 0.0, 0.0  # when the stage's next task may start, and when the copy stream is free
        back: dict[tuple[int, int], float] = {}  # unit -> when its copy back ends
        waits: dict[tuple[int, int], float] = {}

        def fetch(unit: tuple[int, int]) -> None:
            nonlocal stream
            stream = max(stream, compute) + copy_seconds[unit[1]]
            back[unit] = stream

        for task in order:
            if not task.kind.is_compute:
                continue
            unit = (task.microbatch, task.chunk)
            seconds = self._seconds(stage, task.microbatch, task.chunk, task.kind)
            if task.kind is ActionKind.FORWARD and copies[unit] is not OffloadCopy.KEPT:
                stream = max(max(stream, compute) + copy_seconds[task.chunk], compute + seconds)
            if task.kind is ActionKind.BACKWARD:
                if copies[unit] is OffloadCopy.EXPOSED:
                    fetch(unit)
                if unit in back:
                    waits[unit] = max(0.0, back[unit] - compute)
                    compute += waits[unit]
                if copies.get(following.get(unit)) is OffloadCopy.PREFETCHED:
                    fetch(following[unit])
            compute += seconds
        return waits

    def _stage_chunk(self, stage: int, chunk: int) -> tuple[TaskSeconds, TaskSeconds]:
        """Seconds of each task kind of ``chunk`` on ``stage`` (before any wait for an offloaded copy:
        :meth:`_copy_waits`) and the kinds whose seconds are the host's eager launches rather than the device's
        work: for a unit that keeps its saved tensors, then for one that copies them out."""
        program, profile = self.program, self.profile
        tokens = program.sequence.chunk_length(chunk)
        prefix = program.sequence.boundaries[chunk]
        ranks = self.sequence_ranks
        rows = self.batch * tokens / ranks
        # the slowest rank's attention prefix: the last, after the chunk's prefix and every earlier rank's slice
        attention_prefix = prefix + (ranks - 1) * tokens / ranks
        mixers = mlps = rest = 0.0
        backward = weight = 0.0
        blocks = 0
        # the host's eager launches, split as the forward is (what a backward reruns), and what offload adds
        host_forward = {"mixers": 0.0, "mlps": 0.0, "rest": 0.0}
        offload_forward, offload_backward = dict(host_forward), dict(host_forward)
        host_backward = 0.0
        recompute = recompute_on(program.pipeline.recompute, stage)
        # what rerunning adds to a backward's host time: a part's measured cost under the checkpoint where the
        # profile has it, else its forward's launches again
        host_rerun = 0.0
        for part, count in self._stage_parts(stage):
            if part is ProfiledPart.ATTN:  # each sequence of the microbatch meets its own prefix
                forward_s, backward_s, weight_s = (
                    self.batch * value for value in self.part_seconds(part, tokens / ranks, attention_prefix)
                )
            else:  # the microbatch's sequences are rows of the same GEMMs
                forward_s, backward_s, weight_s = self.part_seconds(part, rows, attention_prefix)
            launch = self.profile.part_host(part)
            offload_forward_s = max(launch.offload_forward - launch.forward, 0.0)  # 0 where not measured
            offload_backward_s = max(launch.offload_backward - launch.backward, 0.0)
            if part is ProfiledPart.MLP:
                mlps += count * forward_s
                category = "mlps"
            elif part in (ProfiledPart.EMBEDDING, ProfiledPart.HEAD):
                rest += count * forward_s
                category = "rest"
            else:
                mixers += count * forward_s
                category = "mixers"
            rerun = category in rerun_parts(recompute)
            if rerun and recompute is not Recompute.FULL and launch.recompute_measured:  # under the checkpoint
                host_forward[category] += count * launch.recompute_forward
                host_rerun += count * max(launch.recompute_backward - launch.backward, 0.0)
            else:
                host_forward[category] += count * launch.forward
                if rerun:
                    host_rerun += count * launch.forward
            offload_forward[category] += count * offload_forward_s
            offload_backward[category] += count * offload_backward_s
            backward += count * backward_s
            weight += count * weight_s
            host_backward += count * launch.backward
            blocks += count
        exchange_forward, exchange_backward = self._exchange_seconds(stage, tokens)
        parts = ChunkForwardSeconds(mixers=mixers, mlps=mlps, rest=rest, sequence_parallel=exchange_forward)
        recomputed = parts.recomputed(recompute)
        count = stage_parameters(program, stage)
        # eager, W adds the linear weights' gradients and B the rest; CUDA-graph stages add the linear ones
        # inside their GEMMs ([Note: in-place weight gradients] in schedlang.runtime.linear)
        accumulate_other = self._accumulation(count.other)
        accumulate_linear = 0.0 if self.graphs else self._accumulation(count.linear_weights)
        device_forward = parts.total
        device_backward = backward + exchange_backward + recomputed + accumulate_other
        device_weight = weight + accumulate_linear
        if not self.split_backward:
            device_backward += device_weight
        # graph replay: launch gaps per layer launched (a forward 1x, a backward 2x, W 1x, as the graphs replay)
        launches = {ActionKind.FORWARD: blocks, ActionKind.BACKWARD: 2 * blocks, ActionKind.WEIGHT: blocks}
        if recompute is Recompute.FULL:
            launches[ActionKind.BACKWARD] += blocks
        if not self.split_backward:
            launches[ActionKind.BACKWARD] += launches[ActionKind.WEIGHT]
        # eager: each part's measured host time of its forward and of its whole backward, which W takes a third
        # of when the backward is split (its share of the launches); a backward also launches what it reruns
        host_factor = profile.calibration.host_factor
        host_parts = ChunkForwardSeconds(**host_forward, sequence_parallel=0.0)
        host = {
            ActionKind.FORWARD: host_factor * host_parts.total,
            ActionKind.BACKWARD: host_factor * (host_backward * (2 / 3 if self.split_backward else 1.0) + host_rerun),
            ActionKind.WEIGHT: host_factor * host_backward / 3,
        }
        # an offloading unit's hooks and copies, for the parts it does not rerun (those save their inputs alone)
        offloaded_host = dict(host)
        for kind, extra in ((ActionKind.FORWARD, offload_forward), (ActionKind.BACKWARD, offload_backward)):
            saved = ChunkForwardSeconds(**extra, sequence_parallel=0.0)
            offloaded_host[kind] += host_factor * (saved.total - saved.recomputed(recompute))
        device = {ActionKind.FORWARD: device_forward, ActionKind.BACKWARD: device_backward, ActionKind.WEIGHT: device_weight}
        return (self._launched(device, host, launches), self._launched(device, offloaded_host, launches))

    def _launched(
        self, device: dict[ActionKind, float], host: dict[ActionKind, float], launches: dict[ActionKind, int]
    ) -> TaskSeconds:
        """Each task kind's seconds given its ``device`` time and its eager ``host`` time (or, under CUDA graphs,
        its ``launches``), with the kinds whose time is the host's."""
        overhead = self.profile.overhead
        seconds, bound = {}, set()
        for kind, device_seconds in device.items():
            if self.graphs:
                total = device_seconds + launches[kind] * overhead.graph_layer_seconds
            else:
                total = max(device_seconds, host[kind])
                if host[kind] > device_seconds:
                    bound.add(kind)
            seconds[kind] = total + overhead.task_seconds
        return seconds, frozenset(bound)

    def _seconds(self, stage: int, microbatch: int, chunk: int, kind: ActionKind) -> float:
        """A task's seconds before any wait for a copy back: its unit's offloaded figure if the unit copies."""
        copied = (stage, microbatch, chunk) in self.copied_units
        return (self.offloaded_tasks if copied else self.tasks)[stage, chunk][kind]

    def host_bound(self, task: TaskId) -> bool:
        """Whether ``task``'s time is its eager launches' host time (the profile's host factor, which differs
        between machines: docs/benchmarks.md, "The host-bound rows"), not its device time."""
        copied = (task.stage, task.microbatch, task.chunk) in self.copied_units
        return task.kind in (self._offloaded_bound if copied else self._bound)[task.stage, task.chunk]

    def task_duration(self, task: TaskId) -> float:
        seconds = self._seconds(task.stage, task.microbatch, task.chunk, task.kind)
        if task.kind is ActionKind.BACKWARD:
            seconds += self.copy_waits.get((task.stage, task.microbatch, task.chunk), 0.0)
        return seconds

    def message_bytes(self, kind: Payload, source: TaskId, destination: TaskId) -> int:
        return self.sizes.message_bytes(kind, source, destination)

    def message_duration(self, kind: Payload, source: TaskId, destination: TaskId) -> float:
        if source.stage == destination.stage:
            return 0.0
        mesh = self.program.mesh
        first = source.stage * mesh.sequence * mesh.data
        second = destination.stage * mesh.sequence * mesh.data
        link = hop_links([first, second], self.profile)[0]
        return link.transfer_time(self.message_bytes(kind, source, destination))
