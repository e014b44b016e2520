"""schedlang's benchmarks: scripts run as ``python benchmarks/NAME.py``, importable as ``benchmarks.NAME``.

Helpers that several scripts share (device timing and memory figures) live in :mod:`benchmarks.common`.
Tests import the scripts' pure parts from the repository root (pytest's ``pythonpath``); a script run as a
file puts the repository root on its path first, so the same imports work there. Results and how they were
measured are in docs/benchmarks.md (the reference: one table per claim, with its command) and docs/log.md
(every run, by date).
"""
