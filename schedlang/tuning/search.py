"""The search of ``schedlang tune``: the fastest candidates of the space (:mod:`schedlang.tuning.space`) that fit
the device, found by branch and bound.

Contract. Input: a checked program (gpipe, 1f1b or explicit order) and :class:`TuneSettings`. Output: a
:class:`TuneResult` with the ``top`` fastest fitting candidates, fastest first, each revised from the file as
:func:`schedlang.compiler.revise` revises and compiled through the cost pass (so ``check`` accepts every one), its
step time the simulated makespan under the settings' cost model, and its predicted memory
(:mod:`schedlang.lowering.memory_peak`) within the settings' :class:`~schedlang.lowering.memory_budget.MemoryBudget`:
every stage's reserved peak plus ``OUTSIDE_THE_ALLOCATOR`` at most the device memory and, with offload, every
node's pinned host memory within its share of the host's; a candidate as fast as a listed one and no smaller on
any stage is left out unless ``dominated``. Or none, with the probe that came nearest to fitting (its binding
stage or node and memory term) or the checker's first refusal. Deterministic:
layouts and knobs are visited in a fixed order; ties go to the smaller largest stage, the fewer changed keys,
then their text.

[Note: tune pruning]
What the search skips, and why nothing it skips is faster than its pick (docs/pipeline-tuning.md, "tune"):

1. Layout bound. A stage runs its tasks one at a time; its first task waits for a chunk's forward and its message
   through every earlier stage, and after its last backward the gradient still goes back through every earlier
   stage. So a layout's makespan is at least the largest over stages ``r`` of ``head_r + busy_r`` and ``head_r +
   F_r + B_r + tail_r`` (``busy_r`` all of the stage's task time, ``F_r + B_r`` its forwards and backwards,
   ``head_r`` / ``tail_r`` the shortest chunk forward / backward plus its message on each earlier stage). Taken
   with recompute ``none`` and no offload (they never shorten a task) and the least over CUDA-graph modes and
   split backward, it bounds every candidate of the layout. Layouts are visited by increasing bound, and the
   search stops at the first whose bound exceeds the ``top``-th best makespan found.
2. Candidate bound, then probe. The same bound with a candidate's own durations, then its simulated timeline
   (of the program with the knobs set, before the revised text is checked), must not exceed the ``top``-th best.
3. Same orders. Two task placements that give every stage the same order give the same timeline and memory.
4. Fastest first. The simulator starts each task as soon as its stage and inputs are ready, so no task ends later
   when another gets shorter. No recompute and no offload make every task as short as it can be: where that fits,
   nothing slower of the placement is tried, and where its timeline already exceeds the ``top``-th best, nothing
   slower of it can enter.
5. Recompute per stage. A stage's peak depends only on its own mode, and so do its tasks' durations and its
   pinned host bytes: a fitting mode whose tasks on a stage are nowhere shorter than those of another fitting
   mode that pins no more host memory is never needed there (a node's host sums its ranks' stages, so less on
   one stage never makes it fit worse). Offload saves device memory and never shortens a task: it is tried only
   where some stage cannot fit without it.

The durations come from the cost model itself (``task_duration``; the bounds take each chunk's task at its
shortest over the microbatches, times the microbatches, and rule 5 compares every microbatch's, since offload
moves one microbatch's chunk otherwise than another's: ``offload_copies``), so these hold for any model whose
durations do not shrink with recomputation or offload; tests/frontend/test_tune.py holds the pruned search's
pick to an exhaustive search's.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field, replace

from schedlang.compiler import CostSettings, Pass, ScheduleText, compile_schedule, revised_text
from schedlang.diagnostics import ScheduleError
from schedlang.lowering.cost import host_bound_share, make_cost_model
from schedlang.lowering.legality import IllegalScheduleError
from schedlang.lowering.memory_budget import MemoryBudget, MemoryPlace, Misfit
from schedlang.lowering.memory_peak import StageMemory, predict_memory
from schedlang.lowering.orders import stage_orders
from schedlang.lowering.program import ScheduleProgram
from schedlang.lowering.simulate import simulate
from schedlang.vocabulary.actions import ActionKind, TaskId
from schedlang.vocabulary.edges import Payload
from schedlang.parser import parse_text
from schedlang.preflight import with_document_pieces
from schedlang.tuning.space import (
    RECOMPUTE_MODES,
    Knobs,
    Layout,
    graph_choices,
    layouts,
    order_knobs,
    schedule_changes,
)
from schedlang.vocabulary import CudaGraphs, Recompute
from schedlang.vocabulary.capabilities import graph_recompute_modes


@dataclass(frozen=True)
class TuneSettings:
    cost: CostSettings
    device_memory: int  # bytes
    world: int | None = None  # --world: factorise this many GPUs; None: the file's mesh
    length: int | None = None  # None: the file's sequence length
    max_chunks: int = 64
    device: str = "cuda"  # what the candidates run on: "cpu" leaves CUDA graphs out
    top: int = 5
    prune: bool = True  # False: evaluate every candidate of the space (the reference the tests compare with)
    dominated: bool = False  # also list candidates as slow as a listed one and no smaller on any stage
    host_memory: int | None = None  # one node's host RAM, bytes; None: the profile's [host], else the default

    @property
    def budget(self) -> MemoryBudget:
        """What every candidate must fit: the device memory, and the host memory of the cost model's nodes."""
        return MemoryBudget.of(self.device_memory, self.host_memory, self.cost.hardware)


@dataclass(frozen=True)
class Candidate:
    layout: Layout
    knobs: Knobs
    changes: tuple[tuple[str, str], ...]  # (block.key, value as written), key order
    makespan: float  # seconds
    tokens_per_step: int
    memory: tuple[StageMemory, ...] = field(compare=False)
    program: ScheduleProgram = field(compare=False, repr=False)
    change_values: tuple[tuple[str, object], ...] = field(default=(), compare=False, repr=False)  # as revise takes
    host_bound_share: float = field(default=0.0, compare=False)  # lowering.cost.host_bound_share of its busiest stage

    @property
    def tokens_per_second(self) -> float:
        return self.tokens_per_step / self.makespan if self.makespan > 0 else 0.0

    @property
    def reserved(self) -> tuple[float, ...]:
        """Each stage's predicted reserved peak, bytes (the device also holds ``OUTSIDE_THE_ALLOCATOR``)."""
        return tuple(stage.reserved for stage in self.memory)

    @property
    def rank_key(self) -> tuple:
        """Fastest first; then the least pinned host memory (where offload's copies are predicted hidden, a
        schedule that copies nothing is the safer one), the smallest largest stage, the fewest changed keys, their
        text."""
        pinned = sum(stage.pinned_host for stage in self.memory)
        return (self.makespan, pinned, max(self.reserved), len(self.changes), self.changes)


@dataclass(frozen=True)
class NearestMiss:
    """The probe that came nearest to fitting (its worst misfit the least over its budget): where the memory binds
    when nothing fits."""

    misfit: Misfit  # that probe's worst: a stage's device or a node's host
    description: str  # the layout and knobs, as changed keys

    @property
    def stage(self) -> StageMemory:
        return self.misfit.stage

    @property
    def needed(self) -> float:
        return self.misfit.needed


@dataclass
class SearchStats:
    layouts: int = 0
    refused: int = 0  # layouts the checker refuses
    bounded_out: int = 0  # layouts never explored: bound above the top-th best
    explored: int = 0
    memory_probes: int = 0
    simulated: int = 0  # probes simulated to see whether they could enter the top
    compiled: int = 0  # candidates revised and compiled as check compiles them
    not_fitting: int = 0  # of those, the ones some stage of which does not fit
    candidate_bound_skips: int = 0


@dataclass(frozen=True)
class TuneResult:
    candidates: tuple[Candidate, ...]
    stats: SearchStats
    nearest_miss: NearestMiss | None
    length: int
    settings: TuneSettings
    first_refusal: ScheduleError | None = None  # the first candidate the checker refused, for when all were
    nearest_host_miss: NearestMiss | None = None  # of the probes that fit their devices, the nearest to fitting


def describe(changes: dict) -> tuple[tuple[str, str], ...]:
    from schedlang.compiler import key_literal

    return tuple((name, key_literal(name, value)) for name, value in changes.items())


class _Search:
    def __init__(self, program: ScheduleProgram, settings: TuneSettings, progress) -> None:
        self.program, self.settings, self.progress = program, settings, progress
        self.stats = SearchStats()
        self.found: list[Candidate] = []
        self.nearest: NearestMiss | None = None
        self.nearest_host: NearestMiss | None = None  # among the misses that fit every device
        self.cost_models: dict = {}
        self.durations: dict = {}
        self.syntax = parse_text(program.source_text, program.source_file)
        self.first_refusal: ScheduleError | None = None
        self.budget = settings.budget

    def threshold(self) -> float:
        """The top-th best makespan found (infinite until ``top`` candidates fit)."""
        if not self.settings.prune or len(self.found) < self.settings.top:
            return float("inf")
        return sorted(candidate.makespan for candidate in self.found)[self.settings.top - 1]

    def fits(self, stage: StageMemory) -> bool:
        """Whether one stage fits by itself: its device, and its own pinned host bytes on a node (the whole
        candidate is held to the budget in :meth:`finish`)."""
        return self.budget.stage_fits(stage.reserved) and self.budget.stage_fits_host(stage.pinned_host)

    def note_miss(self, program: ScheduleProgram, memory: tuple[StageMemory, ...], layout: Layout,
                  knobs: Knobs) -> None:
        misfits = self.budget.misfits(program, memory)
        if not misfits:
            return
        worst = misfits[0]
        host_only = all(misfit.place is MemoryPlace.HOST for misfit in misfits)
        nearer = self.nearest is None or worst.overshoot < self.nearest.misfit.overshoot
        nearer_host = host_only and (self.nearest_host is None or worst.overshoot < self.nearest_host.misfit.overshoot)
        if nearer or nearer_host:
            text = ", ".join(f"{name} = {value}" for name, value in describe(
                schedule_changes(self.program, layout, knobs)
            )) or "the file as written"
            if nearer:
                self.nearest = NearestMiss(worst, text)
            if nearer_host:
                self.nearest_host = NearestMiss(worst, text)

    def cost_model(self, probe: ScheduleProgram):
        """The settings' cost model of ``probe``, cached by what its durations depend on."""
        pipeline = probe.pipeline
        key = (probe.sequence, probe.mesh, probe.stage_layers, probe.n_microbatches, pipeline.microbatch_size,
               pipeline.recompute, pipeline.offload, pipeline.cuda_graphs, pipeline.split_backward)
        if key not in self.cost_models:
            cost = self.settings.cost
            self.cost_models[key] = make_cost_model(cost.kind, probe, cost.hardware)
        return self.cost_models[key]

    def stage_durations(self, probe: ScheduleProgram) -> list[tuple[float, ...]]:
        """Per stage, the durations of its F, B (and W) tasks of each chunk, each the shortest over the
        microbatches (they differ only where offload moves one microbatch's chunk otherwise than another's:
        ``offload_copies``), so that the bound stays a lower bound."""
        return self._durations(probe)[0]

    def unit_durations(self, probe: ScheduleProgram) -> list[tuple[float, ...]]:
        """Per stage, the durations of the F, B (and W) tasks of each chunk of every microbatch whose durations
        may differ (all of them with offload, else microbatch 0): what rule 5 compares."""
        return self._durations(probe)[1]

    def _durations(self, probe: ScheduleProgram) -> tuple[list[tuple[float, ...]], list[tuple[float, ...]]]:
        model = self.cost_model(probe)
        if id(model) not in self.durations:
            kinds = (ActionKind.FORWARD, ActionKind.BACKWARD)
            if probe.pipeline.split_backward:
                kinds += (ActionKind.WEIGHT,)
            divisor = model.time_divisor
            microbatches = range(probe.n_microbatches if probe.pipeline.offload else 1)
            shortest, every = [], []
            for stage in range(probe.n_stages):
                units = [
                    [model.task_duration(TaskId(kind, stage, microbatch, chunk)) / divisor
                     for chunk in range(probe.n_chunks) for kind in kinds]
                    for microbatch in microbatches
                ]
                shortest.append(tuple(min(column) for column in zip(*units)))
                every.append(tuple(duration for durations in units for duration in durations))
            self.durations[id(model)] = (shortest, every)
        return self.durations[id(model)]

    def message_seconds(self, probe: ScheduleProgram, kind: Payload, stage: int, chunk: int) -> float:
        """An activation (or its gradient) of ``chunk`` from ``stage`` to the next (the previous) stage."""
        model = self.cost_model(probe)
        task = ActionKind.FORWARD if kind is Payload.ACTIVATION else ActionKind.BACKWARD
        target = stage + 1 if kind is Payload.ACTIVATION else stage - 1
        return model.message_duration(kind, TaskId(task, stage, 0, chunk), TaskId(task, target, 0, chunk)) / (
            model.time_divisor
        )

    def bound(self, probe: ScheduleProgram, per_stage: list[tuple[float, ...]]) -> float:
        """The largest over stages of ``head_r + busy_r`` and ``head_r + F_r + B_r + tail_r`` ([Note: tune
        pruning], 1)."""
        n_chunks = probe.n_chunks
        step = len(per_stage[0]) // n_chunks  # tasks per chunk: F, B (, W)
        microbatches = probe.n_microbatches
        best = head = tail = 0.0
        for stage, durations in enumerate(per_stage):
            forwards = [durations[chunk * step] for chunk in range(n_chunks)]
            backwards = [durations[chunk * step + 1] for chunk in range(n_chunks)]
            busy = microbatches * sum(durations)
            best = max(best, head + busy, head + microbatches * (sum(forwards) + sum(backwards)) + tail)
            if stage + 1 < len(per_stage):
                head += min(
                    forwards[chunk] + self.message_seconds(probe, Payload.ACTIVATION, stage, chunk)
                    for chunk in range(n_chunks)
                )
                tail += min(
                    backwards[chunk] + self.message_seconds(probe, Payload.ACTIVATION_GRADIENT, stage + 1, chunk)
                    for chunk in range(n_chunks)
                )
        return best

    def base_knobs(self, layout: Layout) -> Knobs:
        first = order_knobs(self.program, layout)[0]
        return replace(first, recompute=(Recompute.NONE,) * layout.pipeline)

    def revised(self, layout: Layout, knobs: Knobs) -> ScheduleProgram | None:
        """The candidate as :func:`schedlang.compiler.revise` checks it, or None where the checker refuses."""
        text = revised_text(self.program, schedule_changes(self.program, layout, knobs), self.syntax)
        try:
            checked = compile_schedule(ScheduleText(text, self.program.source_file), through=Pass.CHECK).program
            return with_document_pieces(checked)  # packed documents: the padding of its chunk lengths, as simulate
        except ScheduleError as error:
            self.first_refusal = self.first_refusal or error
            return None

    def layout_bound(self, layout: Layout) -> tuple[float, ScheduleProgram] | None:
        base = self.revised(layout, self.base_knobs(layout))
        if base is None:
            return None
        splits = {base.pipeline.split_backward}
        if any(knobs.split_backward != base.pipeline.split_backward for knobs in order_knobs(self.program, layout)):
            splits.add(not base.pipeline.split_backward)
        bounds = [
            self.bound(base, self.stage_durations(
                replace(base, pipeline=replace(base.pipeline, cuda_graphs=graphs, split_backward=split))
            ))
            for graphs in graph_choices(self.program, layout, self.settings.device)
            for split in sorted(splits)
        ]
        return min(bounds), base

    def run(self) -> TuneResult:
        length = self.settings.length or self.program.sequence.length
        space = layouts(self.program, length, self.settings.world, self.settings.max_chunks)
        self.stats.layouts = len(space)
        bounded = []
        for index, layout in enumerate(space):
            self.report("bounding layouts", index, len(space))
            result = self.layout_bound(layout)
            if result is None:
                self.stats.refused += 1
                continue
            bounded.append((result[0], layout, result[1]))
        bounded.sort(key=lambda item: (item[0], item[1]))
        for index, (layout_bound, layout, base) in enumerate(bounded):
            self.report("searching layouts", index, len(bounded))
            if self.settings.prune and layout_bound > self.threshold():
                self.stats.bounded_out = len(bounded) - index
                break
            self.stats.explored += 1
            self.explore(layout, base)
        self.report("done", len(bounded), len(bounded))
        ranked = tuple(sorted(self.found, key=lambda candidate: candidate.rank_key)[: self.settings.top])
        return TuneResult(
            ranked, self.stats, self.nearest if not ranked else None, length, self.settings, self.first_refusal,
            self.nearest_host if not ranked else None,
        )

    def report(self, phase: str, done: int, total: int) -> None:
        if self.progress is not None:
            best = min((candidate.makespan for candidate in self.found), default=None)
            self.progress(phase, done, total, self.stats.simulated, best)

    def explore(self, layout: Layout, base: ScheduleProgram) -> None:
        seen_orders = set()
        for order in order_knobs(self.program, layout):
            probe = replace(base, pipeline=replace(
                base.pipeline,
                extra_warmup=order.extra_warmup,
                split_backward=order.split_backward,
                forward_before_weight=order.forward_before_weight,
                extra_deferred_weights=order.extra_deferred_weights,
            ))
            try:
                orders = stage_orders(probe)
            except (ValueError, IndexError):
                continue
            key = (order.split_backward, tuple(tuple(stage) for stage in orders))
            if self.settings.prune and key in seen_orders:
                continue  # [Note: tune pruning], 3
            seen_orders.add(key)
            for graphs in graph_choices(self.program, layout, self.settings.device):
                if self.settings.prune:
                    self.explore_pruned(layout, order, probe, orders, graphs)
                else:
                    self.explore_everything(layout, order, probe, orders, graphs)

    def variant(self, probe: ScheduleProgram, graphs: CudaGraphs, offload: bool, recompute) -> ScheduleProgram:
        return replace(probe, pipeline=replace(probe.pipeline, recompute=recompute, offload=offload,
                                               cuda_graphs=graphs))

    def explore_everything(self, layout, order, probe, orders, graphs) -> None:
        """Every recompute vector and offload of one placement: the reference the pruning is tested against."""
        for offload in (False, True) if not graphs else (False,):
            modes = tuple(
                mode for mode in graph_recompute_modes(graphs) if not (offload and mode is Recompute.FULL)
            )
            for vector in itertools.product(modes, repeat=layout.pipeline):
                knobs = replace(order, cuda_graphs=graphs, offload=offload, recompute=vector)
                self.finish(layout, knobs)

    def explore_pruned(self, layout, order, probe, orders, graphs) -> None:
        """One placement under one graph mode: the fastest knobs first (no recompute, no offload); the rest
        only where they do not fit ([Note: tune pruning])."""
        fastest = (Recompute.NONE,) * layout.pipeline
        if not self.could_enter(self.variant(probe, graphs, False, Recompute.NONE), orders):
            return  # nothing slower can either (4, 5)
        fastest_variant = self.variant(probe, graphs, False, Recompute.NONE)
        memory = predict_memory(fastest_variant, orders)
        self.stats.memory_probes += 1
        if self.budget.fits(fastest_variant, memory):
            self.finish(layout, replace(order, cuda_graphs=graphs, offload=False, recompute=fastest))
            return
        if graphs and graph_recompute_modes(graphs) == (Recompute.NONE,):
            self.note_miss(fastest_variant, memory, layout, replace(order, cuda_graphs=graphs, recompute=fastest))
            return
        for offload in (False, True) if not graphs else (False,):
            modes = tuple(
                mode for mode in graph_recompute_modes(graphs) if not (offload and mode is Recompute.FULL)
            )
            for vector in self.recompute_vectors(layout, order, probe, orders, offload, modes, graphs):
                if vector == fastest and not offload:
                    continue
                variant = self.variant(probe, graphs, offload, vector)
                if self.could_enter(variant, orders):
                    self.finish(layout, replace(order, cuda_graphs=graphs, offload=offload, recompute=vector))

    def could_enter(self, variant: ScheduleProgram, orders) -> bool:
        """Whether ``variant`` could be among the top: its bound, then its simulated makespan, at most the
        top-th best (1, 2)."""
        threshold = self.threshold()
        if self.bound(variant, self.stage_durations(variant)) > threshold:
            self.stats.candidate_bound_skips += 1
            return False
        self.stats.simulated += 1
        return simulate(variant, orders, self.cost_model(variant)).makespan <= threshold

    def recompute_vectors(self, layout, order, probe, orders, offload, modes, graphs) -> list[tuple[Recompute, ...]]:
        """The recompute modes per stage worth simulating ([Note: tune pruning], 5): on each stage the fitting
        modes that no other fitting mode dominates."""
        memory, durations, variants = {}, {}, {}
        for mode in modes:
            variants[mode] = self.variant(probe, graphs, offload, mode)
            memory[mode] = predict_memory(variants[mode], orders)
            durations[mode] = self.unit_durations(variants[mode])
            self.stats.memory_probes += 1
        choices = []
        for stage in range(layout.pipeline):
            fitting = [mode for mode in modes if self.fits(memory[mode][stage])]
            if not fitting:
                smallest = min(modes, key=lambda mode: (memory[mode][stage].reserved, memory[mode][stage].pinned_host))
                self.note_miss(variants[smallest], memory[smallest], layout, replace(
                    order, offload=offload, recompute=(smallest,) * layout.pipeline
                ))
                return []
            choices.append([
                mode for mode in fitting
                if not any(_dominates(durations[other][stage], durations[mode][stage], other, mode)
                           and memory[other][stage].pinned_host <= memory[mode][stage].pinned_host
                           for other in fitting if other is not mode)
            ])
        return [tuple(vector) for vector in itertools.product(*choices)]

    def finish(self, layout: Layout, knobs: Knobs) -> None:
        """The candidate revised from the file and compiled as ``check`` compiles it, timed and sized; kept
        when it fits."""
        changes = schedule_changes(self.program, layout, knobs)
        program = self.revised(layout, knobs)
        if program is None:
            return
        try:
            cost_model = self.cost_model(program)
            compilation = compile_schedule(program, through=Pass.COST, cost=self.settings.cost, cost_model=cost_model)
        except IllegalScheduleError:
            return
        self.stats.compiled += 1
        memory = predict_memory(program, compilation.orders)
        if not self.budget.fits(program, memory):
            self.stats.not_fitting += 1
            self.note_miss(program, memory, layout, knobs)
            return
        tokens = layout.microbatches * layout.microbatch_size * layout.data * layout.length
        self.keep(Candidate(
            layout, knobs, describe(changes), compilation.timeline.makespan, tokens, memory, program,
            tuple(changes.items()), host_bound_share(program, cost_model),
        ))

    def keep(self, candidate: Candidate) -> None:
        """Add ``candidate`` unless one found is as fast and no larger on every stage; drop those it beats so."""
        if self.settings.dominated:
            self.found.append(candidate)
            return
        if any(_outranks(other, candidate) for other in self.found):
            return
        self.found = [other for other in self.found if not _outranks(candidate, other)]
        self.found.append(candidate)


def _outranks(first: Candidate, second: Candidate) -> bool:
    """``first`` is as fast as ``second``, no larger on any stage, and ranks before it."""
    return (
        first.makespan <= second.makespan
        and all(a <= b for a, b in zip(first.reserved, second.reserved))
        and first.rank_key < second.rank_key
    )


def _dominates(first: tuple[float, ...], second: tuple[float, ...], first_mode, second_mode) -> bool:
    """Whether ``first``'s durations are nowhere longer than ``second``'s (ties: the earlier mode wins)."""
    if any(a > b for a, b in zip(first, second)):
        return False
    if first == second:
        return RECOMPUTE_MODES.index(first_mode) < RECOMPUTE_MODES.index(second_mode)
    return True


def fits_at(program: ScheduleProgram, settings: TuneSettings, length: int) -> bool:
    """Whether some layout of the space at ``length`` tokens fits with each stage at its smallest footprint over
    recompute modes and offload (no extra warm-up, no split: what holds the fewest chunks): of the modes whose
    device peak fits, the one pinning the least host memory (none without offload), and then every node's host
    memory. A stage's peak and pinned bytes depend only on its own mode, so this is exact for those knobs."""
    search = _Search(program, replace(settings, length=length), None)
    budget = search.budget
    for layout in layouts(program, length, settings.world, settings.max_chunks):
        base = search.revised(layout, search.base_knobs(layout))
        if base is None:
            continue
        orders = stage_orders(base)
        smallest = [None] * layout.pipeline  # per stage, of the modes that fit its device, the least pinned
        for mode in RECOMPUTE_MODES:
            for offload in (False, True) if mode is not Recompute.FULL else (False,):
                variant = replace(base, pipeline=replace(base.pipeline, recompute=mode, offload=offload))
                for stage, memory in enumerate(predict_memory(variant, orders)):
                    least = smallest[stage]
                    if budget.stage_fits(memory.reserved) and (least is None or memory.pinned_host < least.pinned_host):
                        smallest[stage] = memory
        if all(stage is not None for stage in smallest) and budget.fits(base, smallest):
            return True
    return False


def search(program: ScheduleProgram, settings: TuneSettings, progress=None) -> TuneResult:
    """The search of the module docstring. ``progress(phase, done, total, simulated, best_makespan)`` is called
    as it goes."""
    return _Search(program, settings, progress).run()


__all__ = ["Candidate", "NearestMiss", "SearchStats", "TuneResult", "TuneSettings", "fits_at", "search"]
