"""Reasoning in more than one <think> block, as common/chat-parser.cpp's try_parse_reasoning reads an answer: a
block that follows a closed one with only whitespace between is reasoning too (each block stripped, their texts
joined), a <think> after other text is content; whole and streamed in any pieces alike, and so with
deepseek-legacy's inline stream, which writes each block between its own tags."""

from __future__ import annotations

import pytest

from edgesdk.serve.reasoning import ReasoningSplitter, split_answer

ANSWERS = [  # (answer, opened in the prompt) -> (reasoning, content), inline content
    ("<think>a</think>\n\n<think>b</think>\n\nanswer", False, ("ab", "answer"),
     "<think>a</think><think>b</think>answer"),
    ("<think> one \n</think><think>\n two</think>x", False, ("onetwo", "x"), "<think>one</think><think>two</think>x"),
    ("first</think>\n<think>second</think>\nanswer", True, ("firstsecond", "answer"),
     "<think>first</think><think>second</think>answer"),
    ("<think>a</think><think></think>\nanswer", False, ("a", "answer"), "<think>a</think>answer"),
    ("<think></think>\n<think>b</think>c", False, ("b", "c"), "<think>b</think>c"),
    ("<think>a</think>\n<think>cut by the limit", False, ("acut by the limit", ""),
     "<think>a</think><think>cut by the limit</think>"),
    ("<think>a</think>text <think>b</think>", False, ("a", "text <think>b</think>"),
     "<think>a</think>text <think>b</think>"),
    ("<think>a</think>\n<thinking>b", False, ("a", "<thinking>b"), "<think>a</think><thinking>b"),
]


def _streamed(splitter: ReasoningSplitter, answer: str, cuts: list[int]) -> tuple[str, str]:
    reasoning = content = ""
    bounds = [0, *cuts, len(answer)]
    for start, end in zip(bounds, bounds[1:], strict=False):
        r, c = splitter.push(answer[start:end])
        reasoning, content = reasoning + r, content + c
    r, c = splitter.flush()
    return reasoning + r, content + c


@pytest.mark.parametrize(("answer", "opened", "expected", "inline"), ANSWERS)
def test_blocks_that_follow_each_other_are_all_reasoning_whole_and_streamed(answer, opened, expected, inline):
    assert split_answer(ReasoningSplitter(opened), answer) == expected
    assert split_answer(ReasoningSplitter(opened, inline=True), answer) == ("", inline)
    splits = [[cut] for cut in range(1, len(answer))] + [list(range(1, len(answer))), list(range(3, len(answer), 3))]
    for cuts in splits:
        assert _streamed(ReasoningSplitter(opened), answer, cuts) == expected, cuts
        assert _streamed(ReasoningSplitter(opened, inline=True), answer, cuts) == ("", inline), cuts


def test_a_block_after_a_begun_message_s_closed_one_is_reasoning():
    """The client's message ended after its block: a block the model opens right there is reasoning too."""
    splitter = ReasoningSplitter().begun("<think>\nThe fox.\n</think>\n\n")
    assert split_answer(splitter, "<think>More.</think>\n\nIt jumps.") == ("More.", "It jumps.")
    inline = ReasoningSplitter(inline=True).begun("<think>\nThe fox.\n</think>\n\n")
    assert split_answer(inline, "<think>More.</think>It") == ("", "<think>More.</think>It")
