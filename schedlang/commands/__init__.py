"""Subcommands of the ``schedlang`` CLI; see :mod:`schedlang.cli` for the module protocol."""
