"""First parser checks: the issue's example parses, and a missing '=' is named."""

import pytest

from schedlang.diagnostics import ScheduleError
from schedlang.parser import parse_text


def test_missing_equals_is_named_with_position():
    with pytest.raises(ScheduleError) as raised:
        parse_text("model {\n  vocab 256\n}\n", "t.sched")
    (diagnostic,) = raised.value.diagnostics
    assert diagnostic.message == "missing '=' after key 'vocab'"
    assert (diagnostic.span.line, diagnostic.span.column) == (2, 9)
