"""Lowering: checked schedule program -> task graph -> placed schedule -> code.

Imports flow one way: ``schedlang`` (front end, CLI) -> ``schedlang.lowering``
-> ``schedlang.runtime`` -> ``schedlang.kernels``. Nothing here imports the
front end.
"""
