"""JSON mode's answer starts at its object, as llama.cpp's JSON grammar does (grammars/json.gbnf ``root ::= object``,
``object ::= "{" ws ...``: whitespace only after a token) and Ollama's ``format: json``, which uses that grammar.
JSON mode (``--json``, ``response_format: {"type": "json_object"}``, Ollama's ``"format": "json"``) took whitespace
before the ``{``, and the tiny model's greedy answer was `` {}``; a JSON schema's answer already started at its value.
Whitespace between tokens inside the object, and a GBNF grammar the user gives (its own root rule decides), stay as
they were."""

from __future__ import annotations

import json

import pytest

from edgesdk.runtime.gbnf import parse_grammar
from edgesdk.runtime.grammar import GrammarConstraint
from edgesdk.runtime.json_mode import DONE, MAX_WHITESPACE_RUN, JsonConstraint, JsonState, feed, step
from edgesdk.runtime.json_schema import SchemaConstraint, compile_schema
from tests.unit.test_cli import assert_ok, invoke
from tests.unit.test_serve import Served

SCHEMA = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}
ROOM = 40  # tokens: room for the tiny model's object


@pytest.mark.parametrize("space", [b" ", b"\t", b"\n", b"\r"])
def test_json_mode_refuses_whitespace_before_the_object(space):
    assert step(JsonState(), space[0]) is None
    assert feed(JsonState(), space + b"{}") is None
    assert feed(JsonState(), b"{" + space + b"}").mode == DONE  # after a token it is spacing, as llama.cpp's ws


def test_whitespace_inside_the_object_is_unchanged():
    text = b'{\n  "a": [1, 2],\t"b" : {"c": null}\r\n}'
    assert feed(JsonState(), text).mode == DONE
    assert feed(JsonState(), b"{" + b" " * MAX_WHITESPACE_RUN + b"}").mode == DONE
    assert feed(JsonState(), b"{" + b" " * (MAX_WHITESPACE_RUN + 1)) is None


def test_a_token_with_a_space_before_the_brace_is_refused_first_and_taken_after_it(runtime):
    table = runtime.tokenizer.token_bytes()
    spaced = [i for i, piece in enumerate(table) if piece and piece[:1] in (b" ", b"\n", b"\t")]
    assert spaced, "the tiny vocabulary has tokens that start with whitespace"
    constraint = JsonConstraint(table)
    assert not any(constraint.allows(i) for i in spaced)
    brace = table.index(b"{")
    assert constraint.allows(brace)
    constraint.advance(brace)
    space = table.index(b" ")
    assert constraint.allows(space)  # spacing after the brace, as llama.cpp's ``"{" ws``


def test_json_schema_and_json_mode_agree_on_the_first_byte(runtime):
    table = runtime.tokenizer.token_bytes()
    json_mode, schema = JsonConstraint(table), SchemaConstraint(table, compile_schema(SCHEMA))
    for token_id, piece in enumerate(table):
        if piece and piece[:1] in (b" ", b"\t", b"\n", b"\r"):
            assert not json_mode.allows(token_id), piece
            assert not schema.allows(token_id), piece


def test_a_users_grammar_decides_its_own_leading_whitespace(runtime):
    """A GBNF grammar is not JSON mode: a root that writes whitespace before its object still gets it."""
    table = runtime.tokenizer.token_bytes()
    space, brace = table.index(b" "), table.index(b"{")
    eos = runtime.tokenizer.eos_token_ids
    leading = GrammarConstraint(table, parse_grammar('root ::= [ \\t\\n]* "{" "}"'), eos)
    assert leading.allows(space)
    assert leading.allows(brace)
    leading.advance(space)
    assert leading.allows(brace)
    plain = GrammarConstraint(table, parse_grammar('root ::= "{" "}"'), eos)
    assert not plain.allows(space)
    assert plain.allows(brace)


def _starts_at_the_object(text: str) -> None:
    assert text[:1] == "{", repr(text)


def test_run_json_answer_starts_with_the_brace(tiny_bundle):
    result = invoke("run", tiny_bundle.path, "--prompt", "Hi", "--json", "-n", ROOM, "--temp", 0, "--threads", 1)
    assert_ok(result)
    _starts_at_the_object(result.stdout)
    json.loads(result.stdout)


@pytest.fixture(scope="module")
def server(runtime):
    from edgesdk.serve.completion import ServeDefaults

    served = Served(runtime, ServeDefaults(max_tokens=ROOM))
    yield served
    served.close()


def test_chat_completions_json_object_starts_with_the_brace(server):
    status, answer = server.post("/v1/chat/completions", {
        "messages": [{"role": "user", "content": "Hi"}], "temperature": 0,
        "response_format": {"type": "json_object"}})
    assert status == 200, answer
    content = answer["choices"][0]["message"]["content"]
    _starts_at_the_object(content)
    if answer["choices"][0]["finish_reason"] == "stop":
        json.loads(content)


def test_chat_completions_json_schema_starts_with_the_brace(server):
    status, answer = server.post("/v1/chat/completions", {
        "messages": [{"role": "user", "content": "Hi"}], "temperature": 0,
        "response_format": {"type": "json_schema", "json_schema": {"name": "f", "schema": SCHEMA}}})
    assert status == 200, answer
    _starts_at_the_object(answer["choices"][0]["message"]["content"])


@pytest.mark.parametrize("form", ["json", SCHEMA])
def test_ollama_chat_format_starts_with_the_brace(server, form):
    status, answer = server.post("/api/chat", {
        "model": "tiny-host", "messages": [{"role": "user", "content": "Hi"}], "format": form, "stream": False,
        "options": {"temperature": 0, "num_predict": ROOM}})
    assert status == 200, answer
    _starts_at_the_object(answer["message"]["content"])
