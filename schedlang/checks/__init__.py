"""The checks of the front end's semantic pass, one module per concern.

``schema`` (one row per ``block.key``: reader, bounds, default, example),
``readers`` (generic value readers), ``collect`` (blocks and keys against the
schema), one module per block (``model``, ``mesh``, ``sequence``, ``pipeline``,
``train``) and for explicit ``stage r:`` lines (``stages``), and ``rules`` (every
check that relates keys). ``schedlang.semantics`` runs them in order.
"""
