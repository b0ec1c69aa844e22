"""Reasoning and content are trimmed of what llama.cpp's string_strip trims (C isspace: space, \\t \\n \\v \\f \\r),
not of everything Python's str.strip() takes: a model's \\x1c or no-break space is text it wrote."""

from __future__ import annotations

import pytest

from edgesdk.serve.reasoning import ReasoningSplitter, split_answer


@pytest.mark.parametrize(("answer", "expected"), [
    ("<think>\x1cidea\xa0</think>\u3000answer", ("\x1cidea\xa0", "\u3000answer")),
    ("<think> \t\v\f\r\nidea \n</think>\n\r answer", ("idea", "answer")),
])
def test_only_c_whitespace_is_trimmed(answer, expected):
    assert split_answer(ReasoningSplitter(False), answer) == expected
    splitter, reasoning, content = ReasoningSplitter(False), "", ""
    for char in answer:  # streamed one character at a time: the same
        more_reasoning, more_content = splitter.push(char)
        reasoning, content = reasoning + more_reasoning, content + more_content
    more_reasoning, more_content = splitter.flush()
    assert (reasoning + more_reasoning, content + more_content) == expected
