"""Launch tables: each Triton kernel's tile edges and launch options, read at call time, overridable in a scope.

A kernel module registers its table once, with the values tuned for it::

    LAUNCH = register_launch_table("gla", __name__, {"updates": dict(block_k=64, num_warps=4, num_stages=3)})

and reads an entry where it launches, ``LAUNCH["updates"]``: a mapping of knob names to values. The registered
values never change. Inside ``with launch_overrides({"gla": {"updates": {"block_k": 32}}}):`` every read gets
the registered values with those knobs replaced, and on leaving the block the reads get the registered values
again. Overrides nest (an inner block adds to the outer one) and are process-wide, so the autograd engine's
threads, which launch the backward kernels, see them too; they are meant for one tuning or benchmarking thread
(benchmarks/tune_kernels.py, ``benchmarks/kernels.py --launch-table``), never for the training path. An
override naming a table, entry or knob that does not exist is a ValueError, so a stale overrides file cannot
silently change nothing. The tuner prints a winning table in the registered form, for a person to paste into
the kernel module.

[Note: launch tables]
Each table holds the values benchmarks/tune_kernels.py found fastest on one GPU at one shape, among candidates
that reproduce the starting table's output and gradients within 2%; a value that miscompiled stays out of the
tuner's candidates. A table changes only with a new sweep. The GPU, the shapes, the times before and after and
the values that failed are in docs/benchmarks.md, "Launch tables".
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from types import MappingProxyType

LaunchValue = int | float | str
"""A knob's value: a tile edge, a split count or fraction, num_warps, num_stages, a flag as 0 or 1, a precision name."""
LaunchOverrides = Mapping[str, Mapping[str, Mapping[str, LaunchValue]]]
"""table name -> entry name -> knob -> value."""


class LaunchTable(Mapping[str, Mapping[str, LaunchValue]]):
    """One kernel module's launch table: entry name -> knob -> value, as the active overrides make it."""

    def __init__(self, name: str, module: str, entries: Mapping[str, Mapping[str, LaunchValue]]) -> None:
        self.name = name
        self.module = module
        self.registered: Mapping[str, Mapping[str, LaunchValue]] = MappingProxyType(
            {entry: MappingProxyType(dict(knobs)) for entry, knobs in entries.items()}
        )

    def __getitem__(self, entry: str) -> Mapping[str, LaunchValue]:
        values = self.registered[entry]
        override = _active_overrides.get(self.name, {}).get(entry)
        return values if not override else MappingProxyType({**values, **override})

    def __iter__(self) -> Iterator[str]:
        return iter(self.registered)

    def __len__(self) -> int:
        return len(self.registered)

    def __repr__(self) -> str:
        return f"LaunchTable({self.name!r}, {self.module!r}, {as_plain_dicts(self)!r})"


LAUNCH_TABLES: dict[str, LaunchTable] = {}
"""Every registered table by name; a kernel module registers its own when it is imported."""

_active_overrides: LaunchOverrides = MappingProxyType({})


def register_launch_table(name: str, module: str, entries: Mapping[str, Mapping[str, LaunchValue]]) -> LaunchTable:
    """Register (or, when its module is reloaded, replace) the table ``name`` of ``module`` and return it."""
    table = LaunchTable(name, module, entries)
    LAUNCH_TABLES[name] = table
    return table


def as_plain_dicts(table: Mapping[str, Mapping[str, LaunchValue]]) -> dict[str, dict[str, LaunchValue]]:
    """The table as the active overrides make it, as plain dicts (for JSON)."""
    return {entry: dict(table[entry]) for entry in table}


def current_launch_tables() -> dict[str, dict[str, dict[str, LaunchValue]]]:
    """Every registered table as the active overrides make it: the layout ``launch_overrides`` takes."""
    return {name: as_plain_dicts(table) for name, table in LAUNCH_TABLES.items()}


def _checked(overrides: LaunchOverrides) -> dict[str, dict[str, dict[str, LaunchValue]]]:
    checked: dict[str, dict[str, dict[str, LaunchValue]]] = {}
    for name, entries in overrides.items():
        if name not in LAUNCH_TABLES:
            raise ValueError(f"no launch table {name!r} (registered: {', '.join(sorted(LAUNCH_TABLES))})")
        table = LAUNCH_TABLES[name]
        for entry, knobs in entries.items():
            if entry not in table.registered:
                raise ValueError(f"launch table {name!r} has no entry {entry!r} (entries: {', '.join(table)})")
            unknown = sorted(set(knobs) - set(table.registered[entry]))
            if unknown:
                raise ValueError(f"launch table {name!r} entry {entry!r} has no knob {', '.join(map(repr, unknown))}")
            checked.setdefault(name, {})[entry] = dict(knobs)
    return checked


@contextmanager
def launch_overrides(overrides: LaunchOverrides) -> Iterator[None]:
    """Within the block, reads of the named entries get these knob values; on exit, the previous values."""
    global _active_overrides
    previous = _active_overrides
    merged = {name: {entry: dict(knobs) for entry, knobs in entries.items()} for name, entries in previous.items()}
    for name, entries in _checked(overrides).items():
        for entry, knobs in entries.items():
            merged.setdefault(name, {}).setdefault(entry, {}).update(knobs)
    _active_overrides = MappingProxyType(merged)
    try:
        yield
    finally:
        _active_overrides = previous


def table_source(table: LaunchTable) -> str:
    """The table's entries as they would be written in its module, one ``"entry": dict(...),`` line each."""
    lines = [f"# {table.module}: register_launch_table({table.name!r}, __name__, {{"]
    for entry in table:
        knobs = ", ".join(f"{knob}={value!r}" for knob, value in table[entry].items())
        lines.append(f"    {entry!r}: dict({knobs}),".replace("'", '"'))
    lines.append("# })")
    return "\n".join(lines)
