"""Security review of the 48th stop: untrusted request bodies that crashed the server (a 500), held it for minutes,
or made it keep hundreds of megabytes."""

from __future__ import annotations

import http.client
import itertools
import json
import logging
import threading
import time

import pytest

from edgesdk.runtime.gbnf import GrammarError, parse_grammar
from edgesdk.runtime.grammar import GrammarConstraint
from edgesdk.runtime.json_schema import SchemaError, compile_schema, lenient_schema
from edgesdk.runtime.session import open_runtime
from edgesdk.serve.completion import Completer, ServeDefaults
from edgesdk.serve.http_server import ApiServer
from edgesdk.serve.tools import ToolError, parse_tools

BYTES = [bytes([b]) for b in range(256)]  # a "tokenizer" whose token i is byte i
MESSAGES = [{"role": "user", "content": "hi"}]


def nested(levels: int, leaf: dict | None = None) -> dict:
    """An object schema whose property holds one such schema, ``levels`` down."""
    schema = leaf or {"type": "string"}
    for _ in range(levels):
        schema = {"type": "object", "properties": {"a": schema}}
    return schema


def nested_rules(levels: int) -> str:
    """Optional repetitions nested through rule names: each level multiplies the stacks by 11."""
    return ('r0 ::= "a"?\n' + "".join(f"r{i} ::= r{i - 1}{{0,10}}\n" for i in range(1, levels + 1))
            + f"root ::= r{levels}\n")


@pytest.fixture(scope="module")
def server(tiny_bundle):
    runtime = open_runtime(tiny_bundle.path, threads=1)
    served = ApiServer(("127.0.0.1", 0), Completer(runtime, ServeDefaults(max_tokens=2)), "tiny-host", log=False)
    threading.Thread(target=served.serve_forever, daemon=True).start()
    yield served
    served.shutdown()
    served.server_close()


def post(server, path: str, body: dict) -> tuple[int, dict]:
    connection = http.client.HTTPConnection("127.0.0.1", server.server_address[1], timeout=120)
    connection.request("POST", path, body=json.dumps(body), headers={"Content-Type": "application/json"})
    response = connection.getresponse()
    payload = json.loads(response.read())
    connection.close()
    return response.status, payload


# ------------------------------------------------------------------ a schema nested past Python's recursion


@pytest.mark.parametrize("route", ["tools", "anthropic tools", "tools with a dropped keyword", "response_format"])
def test_a_schema_nested_hundreds_of_levels_deep_is_a_400_not_a_500(server, route):
    # compile_schema (and lenient_schema, new for tools) recursed per level: RecursionError, a 500 "internal error"
    # with a traceback in the server's log, for a body of a few kB
    deep = nested(300, {"type": "object", "propertyNames": {"pattern": "^a"}} if "dropped" in route else None)
    if route == "anthropic tools":
        path, body = "/v1/messages", {"model": "m", "max_tokens": 1, "messages": MESSAGES,
                                      "tools": [{"name": "f", "input_schema": deep}]}
    elif route == "response_format":
        path, body = "/v1/chat/completions", {"messages": MESSAGES, "max_tokens": 1, "response_format": {
            "type": "json_schema", "json_schema": {"name": "x", "schema": deep}}}
    else:
        path, body = "/v1/chat/completions", {"messages": MESSAGES, "max_tokens": 1,
                                              "tools": [{"type": "function", "function": {"name": "f",
                                                                                          "parameters": deep}}]}
    status, payload = post(server, path, body)
    assert status == 400, payload
    assert "nested too deeply" in json.dumps(payload)


@pytest.mark.parametrize("levels", [300, 480])
def test_deep_schemas_are_schema_errors(levels):
    with pytest.raises(SchemaError, match="nested too deeply"):
        compile_schema(nested(levels))
    with pytest.raises(SchemaError, match="nested too deeply"):  # two calls a level: past the stack by 480
        lenient_schema(nested(levels * 2, {"type": "object", "not": {}}))
    with pytest.raises(ToolError, match="nested too deeply"):
        parse_tools({"tools": [{"type": "function", "function": {"name": "f", "parameters": nested(levels)}}]})


# ------------------------------------------------------------------ what lenient_schema copies and keeps


def test_a_dropped_part_is_copied_once_however_its_refs_spell_it():
    # a $ref into a dropped part is pointed at a copy of it; each spelling of one pointer (percent-encoding any
    # letter) made a copy of its own, so 4,096 refs to a part of 3,000 properties (a 390 kB request) made 4,096
    # copies: 2.7 GB in lenient_schema and 7 GB and two minutes in compile_schema
    letters = "abcdefghijkl"
    spellings = ["#/properties/" + "".join(f"%{ord(c):02X}" if bit else c for c, bit in zip(letters, bits, strict=True))
                 + "/propertyNames" for bits in itertools.islice(itertools.product((0, 1), repeat=len(letters)), 64)]
    schema = {"type": "object", "properties": {
        letters: {"type": "string", "propertyNames": {"type": "object", "properties": {"p": {"type": "string"}}}},
        **{f"r{i}": {"$ref": ref} for i, ref in enumerate(spellings)}}}
    lenient, dropped = lenient_schema(schema)
    assert len(lenient["$defs"]) == 1
    assert {lenient["properties"][f"r{i}"]["$ref"] for i in range(64)} == {"#/$defs/lenient0"}
    assert dropped == ("$.properties.abcdefghijkl.propertyNames",)
    compile_schema(lenient)


def test_what_was_dropped_is_named_in_bounded_words(caplog):
    # one entry per keyword dropped, each with its whole path, logged and kept (tools._WARNED, 1,024 keys): a 0.9 MB
    # request with 40,000 "not" 150 levels down made a warning line of 118 MB, kept until 1,024 others came
    schema = nested(150, {"type": "object", "properties": {f"p{i}": {"not": {}} for i in range(2000)}})
    lenient, dropped = lenient_schema(schema)
    assert len(dropped) == 21
    assert dropped[-1] == "and 1,980 more"
    assert all(len(entry) <= 240 for entry in dropped)
    assert dropped[0].startswith("$.properties.a.")
    assert dropped[0].endswith(".properties.p0.not")
    with caplog.at_level(logging.WARNING, logger="edgesdk.serve.tools"):
        tools = parse_tools({"tools": [{"type": "function", "function": {"name": "bounded48", "parameters": schema}}]})
    assert len(tools.ignored[0]) < 10_000
    assert all(len(record.getMessage()) < 10_000 for record in caplog.records)


# ------------------------------------------------------------------ a grammar whose parses multiply


def test_optional_repetitions_nested_through_rule_names_are_refused_not_followed():
    # the 2,000-rule check (llama.cpp's MAX_REPETITION_THRESHOLD) reads the nesting of groups only: through rule
    # names each level multiplied the matcher's stacks by 11, six levels 1.8 million of them and 20 s before the
    # first token, seven minutes and gigabytes
    grammar = parse_grammar(nested_rules(6))
    began = time.monotonic()
    with pytest.raises(GrammarError, match="parses at once"):
        GrammarConstraint(BYTES, grammar, set())
    assert time.monotonic() - began < 10
    with pytest.raises(GrammarError, match="parses at once"):  # in groups, with counts under the 2,000-rule check
        GrammarConstraint(BYTES, parse_grammar("root ::= " + "(" * 6 + '"a"?' + "){0,10}" * 6), set())


def test_grammars_of_ordinary_size_still_run():
    for source in ['w ::= "x"?\nroot ::= w{0,10000} "y"', nested_rules(4), 'root ::= ("a"{0,9}){0,199}']:
        constraint = GrammarConstraint(BYTES, parse_grammar(source), set())
        assert constraint.allows(ord("a")) or constraint.allows(ord("x"))


def test_the_server_refuses_such_a_grammar_by_name(server):
    began = time.monotonic()
    status, payload = post(server, "/completion", {"prompt": "hi", "n_predict": 2, "grammar": nested_rules(7)})
    assert status == 400, payload
    assert "parses at once" in json.dumps(payload)
    assert time.monotonic() - began < 10
