"""The thinking-before-tools constraint (completion.ThinkingFirst) and the reader of its answer (tools.AnswerStream)
agree on where the block is, and the constraint holds the block's edges as llama.cpp does."""

from __future__ import annotations

from edgesdk.runtime.json_schema import SchemaConstraint
from edgesdk.serve.completion import ThinkingFirst
from edgesdk.serve.tools import answer_message, parse_tools
from tests.unit.test_serve_think54 import CALL, TOOLS

# every byte, then the tags, and an end-of-generation token (no bytes)
VOCAB: list[bytes | None] = [bytes([b]) for b in range(256)] + [b"<think>", b"</think>", None]
EOS = len(VOCAB) - 1


def _constraint(opened: bool, vocab=VOCAB) -> ThinkingFirst:
    schema = parse_tools({"tools": TOOLS, "tool_choice": "required"}).schema
    return ThinkingFirst(vocab, SchemaConstraint(vocab, schema), opened=opened)


def _feed(constraint: ThinkingFirst, data: bytes) -> None:
    for byte in data:
        assert constraint.allows(byte), data
        constraint.advance(byte)


def test_a_begun_think_tag_allows_only_its_rest():
    constraint = _constraint(opened=False)
    _feed(constraint, b"<")
    assert not constraint.allows(ord("{"))
    assert constraint.allows(ord("t"))


def test_no_end_of_generation_inside_the_block():
    constraint = _constraint(opened=True)
    _feed(constraint, b"hmm")
    assert not constraint.allows(EOS)


def test_whitespace_after_the_block_is_llama_cpp_space():
    constraint = _constraint(opened=True)
    _feed(constraint, b"hmm</think>")
    assert constraint.allows(ord(" "))
    constraint.advance(ord(" "))
    assert not constraint.allows(ord(" "))
    assert constraint.allows(ord("{"))
    newlines = _constraint(opened=True)
    _feed(newlines, b"hmm</think>\n\n" + b" " * 20)
    assert not newlines.allows(ord(" "))
    assert not newlines.allows(ord("\n"))
    _feed(newlines, CALL.encode())
    assert newlines.complete


def test_special_tag_tokens_are_refused_as_the_reader_never_sees_them():
    """The stream decoder writes no special token, so a special </think> would leave the answer's reader inside the
    block, reading the call as reasoning: the constraint refuses it, and the model writes the tag in text."""
    vocab = [bytes([b]) for b in range(256)] + [None, None]  # <think>, </think> as special tokens: no bytes
    constraint = _constraint(opened=True, vocab=vocab)
    _feed(constraint, b"hmm")
    assert not constraint.allows(257)
    _feed(constraint, b"</think>\n" + CALL.encode())
    assert constraint.complete
    fields, finish = answer_message("hmm</think>\n" + CALL, "stop", opened=True)
    assert finish == "tool_calls"
    assert fields["reasoning_content"] == "hmm"


def test_json_in_a_block_the_prompt_opened_is_reasoning_not_the_answer():
    text = '{"tool_call": {"name": "rm_rf", "arguments": {}}}\n</think>\n' + CALL
    fields, finish = answer_message(text, "stop", opened=True)
    assert finish == "tool_calls"
    assert [call["function"]["name"] for call in fields["tool_calls"]] == ["get_weather"]
    assert "rm_rf" in fields["reasoning_content"]


def test_json_that_is_not_the_envelope_is_a_text_not_an_error():
    for text in ('{"city": "Paris"}', '[1]', '{"tool_call": {"name": 1, "arguments": {}}}'):
        fields, finish = answer_message(text, "stop", opened=False)
        assert (fields, finish) == ({"content": text}, "stop")
