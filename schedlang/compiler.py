"""The compiler's passes, in order, on one screen: :func:`compile_schedule`; and :func:`revise`.

::

    parse      text -> ast.ScheduleFile                     schedlang.parser
    check      ast -> ScheduleProgram                       schedlang.semantics (every key and value; the chunk
               boundaries, cut by lowering.partition; what the runtime can run, schedlang.capabilities)
    order      program -> per-stage task orders             lowering.orders
    legality   program -> LegalityReport (Eq. 8, deadlock)  lowering.legality
    placement  orders -> per-rank action lists              lowering.placement
    memory     program + orders -> per-stage memory peaks   lowering.memory_peak
    cost       program + orders -> Timeline                 lowering.simulate (only when a cost model is asked for)
    codegen    program + actions -> training script         lowering.codegen

Every command of the CLI runs this function, or its prefix (``through=Pass.LEGALITY``), so they all
accept and refuse the same schedules, and reads what it needs from the :class:`Compilation`
(``simulate`` its ``timeline`` and ``memory``). A user error surfaces as
:class:`~schedlang.diagnostics.ScheduleError` (parse, check) or
:class:`~schedlang.lowering.legality.IllegalScheduleError` carrying the legality report.

:func:`revise` is how a variant of a schedule is made (``schedlang simulate`` sweeps chunk counts and
warm-ups with it): it writes the changed keys into the schedule's text and checks the result from the
start, so a variant is held to every rule the file is.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from enum import Enum
from pathlib import Path

from schedlang import ast
from schedlang.frontend import read_source
from schedlang.limits import check_program_limits, check_syntax_limits
from schedlang.lowering.codegen import render_train_script
from schedlang.lowering.cost import CostModel, CostModelKind, Hardware, make_cost_model
from schedlang.lowering.hardware_profile import HardwareProfile
from schedlang.lowering.legality import IllegalScheduleError, LegalityReport, check_orders
from schedlang.lowering.memory_peak import StageMemory, predict_memory
from schedlang.lowering.orders import StageOrders, stage_orders
from schedlang.lowering.placement import place_stage_actions
from schedlang.lowering.program import ScheduleProgram
from schedlang.lowering.simulate import simulate
from schedlang.lowering.timeline import Timeline
from schedlang.parser import parse_text
from schedlang.checks.schema import KEYS
from schedlang.semantics import BLOCK_KEYS, lower_to_program
from schedlang.vocabulary import Action
from schedlang.vocabulary.source import apply_edits


class Pass(int, Enum):
    """The passes in the order they run; ``through`` names the last one wanted."""

    PARSE = 1
    CHECK = 2
    ORDER = 3
    LEGALITY = 4
    PLACEMENT = 5
    MEMORY = 6
    COST = 7
    CODEGEN = 8


@dataclass(frozen=True)
class ScheduleText:
    """Schedule text held in memory, and the file name its diagnostics give."""

    text: str
    filename: str = "<memory>"


@dataclass(frozen=True)
class CostSettings:
    """The cost model the cost pass simulates under."""

    kind: CostModelKind = CostModelKind.UNIT
    hardware: Hardware | HardwareProfile = Hardware()  # with FLOPS, a profile gives the profile model (profile_cost.py)


@dataclass(frozen=True)
class Compilation:
    """What each pass produced; a pass not run (past ``through``, or handed a program) left ``None``."""

    program: ScheduleProgram | None
    syntax: ast.ScheduleFile | None = None
    orders: StageOrders | None = None
    legality: LegalityReport | None = None
    stage_actions: tuple[tuple[Action, ...], ...] | None = None
    memory: tuple[StageMemory, ...] | None = None
    timeline: Timeline | None = None
    script: str | None = None


def compile_schedule(
    schedule: str | os.PathLike | ScheduleText | ScheduleProgram,
    through: Pass = Pass.CODEGEN,
    cost: CostSettings | None = None,
    script_name: str = "train.py",
    cost_model: CostModel | None = None,
) -> Compilation:
    """Run the passes in order up to ``through``; see the module docstring.

    ``schedule`` is a file path, schedule text, or a program already checked (which starts at the order
    pass). The cost pass runs only when ``cost`` is given; it simulates with ``cost_model`` where the caller
    already built ``cost``'s model of this program (``tune`` keeps one per set of durations), else builds it. Raises ``ScheduleError``, ``OSError`` (an
    unreadable file) or ``IllegalScheduleError`` (orders that break Eq. 8 or deadlock).
    """
    syntax = None
    if isinstance(schedule, ScheduleProgram):
        program = schedule
    else:
        text, filename = _text_of(schedule)
        syntax = parse_text(text, filename)
        check_syntax_limits(syntax, text)
        if through is Pass.PARSE:
            return Compilation(program=None, syntax=syntax)
        program = replace(lower_to_program(syntax, text), source_text=text)
        check_program_limits(program, text)
    result = Compilation(program=program, syntax=syntax)
    if through <= Pass.CHECK:
        return result
    result = replace(result, orders=stage_orders(program))
    if through is Pass.ORDER:
        return result
    legality = check_orders(program)  # the program's own orders keep the span of every explicit task
    if not legality.is_legal:
        raise IllegalScheduleError(legality)
    result = replace(result, legality=legality)
    if through is Pass.LEGALITY:
        return result
    result = replace(result, stage_actions=place_stage_actions(result.orders, program.n_chunks))
    if through is Pass.PLACEMENT:
        return result
    result = replace(result, memory=predict_memory(program, result.orders))
    if cost is not None and through >= Pass.COST:
        if cost_model is None:
            cost_model = make_cost_model(cost.kind, program, cost.hardware)
        result = replace(result, timeline=simulate(program, result.orders, cost_model))
    if through < Pass.CODEGEN:
        return result
    return replace(result, script=render_train_script(program, result.stage_actions, script_name))


def _text_of(schedule: str | os.PathLike | ScheduleText) -> tuple[str, str]:
    if isinstance(schedule, ScheduleText):
        return schedule.text, schedule.filename
    return read_source(schedule), str(schedule) if isinstance(schedule, str) else str(Path(schedule))


def revise(program: ScheduleProgram, **changes) -> ScheduleProgram:
    """``program`` with schedule keys set to new values, checked again from the text up.

    Each change is named by its key (``extra_warmup=2``, ``chunks=8``) or, where a key belongs to two
    blocks, by ``block.key`` (``**{"mesh.data": 2}``). A value is what the key's schema row reads (a bool,
    number, enum, list, or a record such as ``OptimizerConfig(lr=0.01)``), written back as text by the row
    (``Key.text``), or a str of schedule text written as is (``parallel="ring"``). The changed keys replace the written
    values in the schedule's text (or are added on the line of their block's closing brace, so that no
    line moves), and the whole text is checked again, so an illegal variant raises ``ScheduleError``
    pointing into the revised line. Raises ``ValueError`` for
    a key the language does not have, or a program built without schedule text.
    """
    text = revised_text(program, changes)
    return compile_schedule(ScheduleText(text, program.source_file), through=Pass.CHECK).program


def revised_text(program: ScheduleProgram, changes: dict, syntax: ast.ScheduleFile | None = None) -> str:
    """The schedule text :func:`revise` checks: ``program``'s text with the ``changes`` written in. ``syntax``
    is that text parsed, when the caller holds it (``schedlang tune`` revises one file thousands of times)."""
    if program.source_text is None:
        raise ValueError("revise needs a program checked from schedule text; this one was built by hand")
    text = program.source_text
    if syntax is None:
        syntax = parse_text(text, program.source_file)
    edits = []
    for name, value in changes.items():
        edits.append(_edit(text, syntax, *_block_and_key(name), key_literal(name, value)))
    return apply_edits(text, edits)


def key_literal(name: str, value) -> str:
    """``value`` of key ``name`` (``key`` or ``block.key``) as schedule text, written by the key's schema row."""
    block, key = _block_and_key(name)
    return KEYS[f"{block}.{key}"].text(value)


def _block_and_key(name: str) -> tuple[str, str]:
    if "." in name:
        block, key = name.split(".", 1)
        if key in BLOCK_KEYS.get(block, ()):
            return block, key
        raise ValueError(f"revise: the schedule language has no key '{name}'")
    blocks = [block for block, keys in BLOCK_KEYS.items() if name in keys]
    if len(blocks) == 1:
        return blocks[0], name
    if blocks:
        raise ValueError(f"revise: '{name}' is a key of {' and '.join(blocks)}; name it as block.key")
    raise ValueError(f"revise: the schedule language has no key '{name}'")


def _edit(text: str, syntax: ast.ScheduleFile, block_name: str, key: str, literal: str) -> tuple[int, int, str]:
    """(start, end, replacement) that writes ``key = literal`` into ``block_name`` of ``text``."""
    block = next((block for block in syntax.blocks if block.name == block_name), None)
    if block is None:
        return len(text), len(text), f"\n{block_name} {{ {key} = {literal} }}\n"
    for item in block.items:
        if isinstance(item, ast.Assignment) and item.key == key:
            return (*item.value.span.offsets(text), literal)
    closing = text.rfind("}", 0, block.span.offsets(text)[1])
    return closing, closing, f" {key} = {literal} "



__all__ = [
    "Compilation", "CostSettings", "Pass", "ScheduleText", "compile_schedule", "key_literal", "revise", "revised_text",
]
