"""What user-given text the generated script may show outside a Python literal.

The training script's docstring names the script (``compile -o NAME``) in its
torchrun hint. A docstring is code: a name holding ``\"\"\"``, a backslash or a
newline would end it early or fail to parse, and whatever followed would run
when the script runs. So a name appears there only when it is plain, and as a
neutral placeholder otherwise; every other value from the user reaches the
script through ``repr`` (schedlang.lowering.codegen).
"""

from __future__ import annotations

import re

PLAIN_TEXT = re.compile(r"[A-Za-z0-9_.+\-/]{1,200}")
SCRIPT_PLACEHOLDER = "SCRIPT.py"


def docstring_script_name(name: str) -> str:
    """``name`` if it is letters, digits and ``_ . + - /`` only (at most 200), else ``SCRIPT.py``."""
    return name if PLAIN_TEXT.fullmatch(name) else SCRIPT_PLACEHOLDER
