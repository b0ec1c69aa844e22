"""Review round 57 of the server pieces: reasoning splitting, Responses store and events, embeddings, metrics."""

from __future__ import annotations

import pytest

from edgesdk.serve.reasoning import ReasoningSplitter, split_answer


@pytest.mark.parametrize(("begun", "answer", "expected"), [
    # the client's text ended on </think>'s start (a continued answer the token limit cut inside the tag)
    ("<think>The fox</thi", "nk>Done", ("", "Done")),
    ("<think>The fox</", "think>\n\nDone", ("", "Done")),
    # on <think>'s start, first or after a closed block: the answer's text opens the block
    ("<thi", "nk>b</think>Done", ("b", "Done")),
    ("<think>a</think>\n<th", "ink>b</think>Done", ("b", "Done")),
    # a tag's start the answer does not complete is text, the client's: none of it comes back
    ("<thi", "s is", ("", "s is")),
    ("<think>a</", "b</think>c", ("b", "c")),
    ("<think>a</", "", ("", "")),
])
def test_begun_text_ending_on_a_tags_start_lets_the_answer_complete_it(begun, answer, expected):
    assert split_answer(ReasoningSplitter().begun(begun), answer) == expected


def test_begun_tag_start_streamed_splits_as_whole():
    splitter = ReasoningSplitter().begun("<think>The fox</")
    pieces = [splitter.push(piece) for piece in ("th", "ink", ">", "\n", "Done")] + [splitter.flush()]
    assert ("".join(r for r, _ in pieces), "".join(c for _, c in pieces)) == ("", "Done")


def test_begun_tag_start_inline_closes_the_block_once():
    # deepseek-legacy's stream: the client's <think> is theirs, the answer's </think> closes the block
    assert split_answer(ReasoningSplitter(inline=True).begun("<think>a</"), "think>Done") == ("", "</think>Done")
