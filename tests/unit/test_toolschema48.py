"""A tool whose parameters use a JSON Schema keyword the answer's constraint cannot follow is taken, not a 400.

Such schemas come from MCP servers built with zod or pydantic (zod-to-json-schema writes ``propertyNames``,
``not: {}``, ``patternProperties``); one such tool made every request of a Claude Code, Open WebUI or Continue
session fail. llama.cpp's json-schema-to-grammar (common/json-schema-to-grammar.cpp, ``visit``) reads none of these
keywords, so llama-server ignores them (a lookahead in a pattern is skipped with a warning, ``_visit_pattern``), and
Ollama builds no grammar from tool schemas. Here the keywords that only narrow the arguments are dropped for the
constraint (json_schema.lenient_schema), with a warning naming them; the call is still one of the tool, its
arguments of the schema's shape. A response format's schema keeps refusing them by name.
"""

from __future__ import annotations

import json
import logging

import pytest

from edgesdk.runtime.json_schema import SchemaConstraint, compile_schema
from edgesdk.serve.api import ApiError, parse_chat_request
from edgesdk.serve.tools import ToolError, parse_tools

BYTES = [bytes([b]) for b in range(256)]


def _tool(parameters: dict, name: str = "f") -> dict:
    return {"type": "function", "function": {"name": name, "parameters": parameters}}


def _accepts(tools, text: str) -> bool:
    constraint = SchemaConstraint(BYTES, tools.schema)
    for byte in text.encode():
        if not constraint.allows(byte):
            return False
        constraint.advance(byte)
    return constraint.complete


def _call(arguments: dict, name: str = "f") -> str:
    return json.dumps({"tool_call": {"name": name, "arguments": arguments}})


STRING = {"type": "string"}
# (the keyword, the parameters using it beside a required string "q") for each keyword the constraint cannot follow
NARROWING = [
    ("not", {"properties": {"q": {"type": "string", "not": {"const": "x"}}}}),
    ("not", {"properties": {"q": STRING, "never": {"not": {}}}}),  # zod's z.never()
    ("propertyNames", {"properties": {"q": STRING, "tags": {"type": "object", "additionalProperties": STRING,
                                                           "propertyNames": {"pattern": "^[a-z]+$"}}}}),
    ("patternProperties", {"properties": {"q": STRING}, "patternProperties": {"^x-": STRING}}),
    ("if", {"properties": {"q": STRING}, "if": {"properties": {"q": {"const": "a"}}}, "then": {"required": ["q"]},
            "else": {"required": ["q"]}}),
    ("dependentRequired", {"properties": {"q": STRING, "r": STRING}, "dependentRequired": {"r": ["q"]}}),
    ("dependentSchemas", {"properties": {"q": STRING, "r": STRING}, "dependentSchemas": {"r": {"required": ["q"]}}}),
    ("minProperties", {"properties": {"q": STRING}, "minProperties": 1, "maxProperties": 3}),
    ("contentEncoding", {"properties": {"q": {"type": "string", "contentEncoding": "base64",
                                              "contentMediaType": "image/png"}}}),
    ("unevaluatedProperties", {"properties": {"q": STRING}, "unevaluatedProperties": False}),
    ("pattern", {"properties": {"q": {"type": "string", "pattern": "^(?=.*[0-9])[a-z0-9]+$"}}}),  # a lookahead
]


@pytest.mark.parametrize(("keyword", "extra"), NARROWING, ids=[f"{k}{i}" for i, (k, _) in enumerate(NARROWING)])
def test_a_narrowing_keyword_in_a_tool_s_parameters_is_dropped_for_the_constraint(keyword, extra):
    parameters = {"type": "object", "required": ["q"], **extra}
    tools = parse_tools({"tools": [_tool(parameters)]})  # was: ToolError "keyword ... is not supported"
    (line,) = tools.ignored
    assert f".{keyword}" in line
    assert "tool 'f'" in line
    assert "tools[0].function.parameters" in line
    assert _accepts(tools, _call({"q": "a1"}))
    # the keywords that shape the arguments are still followed: the required string, the tool's name
    assert not _accepts(tools, _call({}))
    assert not _accepts(tools, _call({"q": 1}))
    assert not _accepts(tools, _call({"q": "a1"}, name="g"))
    assert json.dumps(parameters) in tools.instructions  # the model still reads the whole schema


def test_a_key_of_a_pattern_property_may_be_written_even_where_no_other_key_may():
    tools = parse_tools({"tools": [_tool({"type": "object", "properties": {"q": STRING}, "additionalProperties": False,
                                          "patternProperties": {"^x-": {"type": "integer"}}})]})
    assert _accepts(tools, _call({"q": "a", "x-id": 3}))  # valid by the schema: the constraint must not block it
    assert not _accepts(tools, _call({"q": "a", "x-id": "3"}))  # no schema of the object takes a string there
    beside = parse_tools({"tools": [_tool({"type": "object", "properties": {"q": STRING},
                                           "additionalProperties": {"type": "boolean"},
                                           "patternProperties": {"^x-": {"type": "integer"}}})]})
    assert _accepts(beside, _call({"q": "a", "x-id": 3, "y": True}))


def test_an_unknown_format_is_dropped_and_a_known_one_followed():
    tools = parse_tools({"tools": [_tool({"type": "object", "properties": {
        "ip": {"type": "string", "format": "ipvanyaddress"}, "day": {"type": "string", "format": "date"}},
        "required": ["ip", "day"]})]})
    assert '.format "ipvanyaddress"' in tools.ignored[0]
    assert _accepts(tools, _call({"ip": "10.0.0.1", "day": "2024-01-31"}))
    assert not _accepts(tools, _call({"ip": "10.0.0.1", "day": "yesterday"}))


def test_a_ref_into_a_dropped_part_still_points_at_that_schema():
    # zod-to-json-schema refers to a schema it meets a second time by the path of the first (#/properties/...)
    parameters = {"type": "object", "properties": {
        "scores": {"type": "object", "additionalProperties": {"type": "number"},
                   "propertyNames": {"enum": ["red", "blue"]}},
        "favourite": {"$ref": "#/properties/scores/propertyNames"}}, "required": ["favourite"]}
    before = json.dumps(parameters)
    tools = parse_tools({"tools": [_tool(parameters)]})
    assert json.dumps(parameters) == before  # the request's schema is not changed
    assert _accepts(tools, _call({"scores": {"anything": 1}, "favourite": "red"}))  # in the schema's order
    assert not _accepts(tools, _call({"favourite": "green"}))


def test_a_schema_without_such_keywords_is_used_as_it_is():
    from edgesdk.runtime.json_schema import lenient_schema

    parameters = {"type": "object", "properties": {"q": STRING}, "required": ["q"]}
    assert lenient_schema(parameters) == (parameters, ())
    assert lenient_schema(parameters)[0] is parameters
    assert parse_tools({"tools": [_tool(parameters)]}).ignored == ()


def test_malformed_and_widening_schemas_are_still_refused_naming_the_tool():
    for parameters, message in [
        ({"type": "object", "properties": {"n": {"type": "integer", "minimum": "two"}}}, "finite number"),
        ({"type": "object", "properties": {"n": {"type": "integer", "nullable": "yes"}}}, "keyword 'nullable'"),
        ({"type": "object", "properties": {"n": {"type": "integer", "exclusiveMinimum": True}}}, "finite number"),
        ({"type": "object", "properties": {"n": {"$ref": "#/$defs/missing"}}}, "no definition"),
        ({"type": "array", "items": STRING, "minProperties": 1}, "must describe an object"),
    ]:
        with pytest.raises(ToolError, match=message) as refused:
            parse_tools({"tools": [_tool(parameters)]})
        assert refused.value.param == "tools[0].function.parameters"


def test_one_warning_per_tool_names_the_keywords(caplog):
    parameters = {"type": "object", "properties": {"q": {"type": "string", "not": {"const": ""}}},
                  "propertyNames": {"maxLength": 8}}
    body = {"tools": [_tool(parameters, "warned_once48"), _tool({"type": "object"}, "plain48")]}
    with caplog.at_level(logging.WARNING, logger="edgesdk.serve.tools"):
        parse_tools(body)
        parse_tools(body)  # a client sends its tools with every request: the log says it once
    (record,) = [record for record in caplog.records if "warned_once48" in record.getMessage()]
    assert "$.properties.q.not" in record.getMessage()
    assert "$.propertyNames" in record.getMessage()
    assert not [record for record in caplog.records if "plain48" in record.getMessage()]


def test_a_response_format_schema_still_refuses_what_it_cannot_follow():
    messages = [{"role": "user", "content": "hi"}]
    schema = {"type": "object", "properties": {"a": STRING}, "minProperties": 1}
    for body in ({"messages": messages, "response_format": {"type": "json_schema", "json_schema": {
                    "name": "x", "schema": schema}}},
                 {"messages": messages, "tools": [_tool({"type": "object"})], "response_format": {
                     "type": "json_schema", "json_schema": {"name": "x", "schema": schema}}}):
        with pytest.raises(ApiError, match="keyword 'minProperties'") as refused:
            parse_chat_request(body)
        assert refused.value.param.startswith("response_format")
    with pytest.raises(Exception, match="keyword 'minProperties'"):
        compile_schema(schema)


# ------------------------------------------------------------------------------------- through the server

# what zod-to-json-schema writes for z.object({on: z.boolean()}).strict() with a z.never() field and a record's
# key schema, and pydantic a password-like pattern with a lookahead: the arguments' shape is {"on": <boolean>}
LIGHT = {"type": "object", "properties": {"on": {"type": "boolean"}, "never": {"not": {}}},
         "required": ["on"], "additionalProperties": False, "propertyNames": {"enum": ["on"]},
         "minProperties": 1, "if": {"properties": {"on": {"const": True}}}, "then": {"required": ["on"]}}
CODE = {"type": "object", "properties": {"code": {"type": "string", "pattern": "^(?=[a-z])[a-z]{1,3}$"}},
        "required": ["code"], "additionalProperties": False, "dependentRequired": {"code": []}}


def _valid_light(arguments: dict) -> None:
    assert set(arguments) <= {"on", "never"}, arguments
    assert "on" in arguments, arguments
    assert isinstance(arguments["on"], bool)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """A tiny model with room for the tools' description in its prompt (2,048 tokens of context)."""
    from edgesdk.build.pipeline import BuildConfig, build
    from edgesdk.export.onnx_export import ExportConfig
    from edgesdk.runtime.session import open_runtime
    from edgesdk.serve.completion import ServeDefaults
    from tests._utils.tiny import save_tiny_model_dir
    from tests.unit.test_serve import Served

    root = tmp_path_factory.mktemp("toolschema")
    model = save_tiny_model_dir(root / "model", hidden=64, heads=4, kv_heads=2, max_positions=2048)
    bundle = build(BuildConfig(target="host", model=str(model), out=root / "b", export=ExportConfig(max_context=2048),
                               progress=False))
    served = Served(open_runtime(bundle.path, threads=1), ServeDefaults(max_tokens=420))
    yield served
    served.close()


def test_openai_chat_answers_a_call_of_such_a_tool(server):
    body = {"messages": [{"role": "user", "content": "Lamp on"}],
            "tools": [_tool(LIGHT, "set_light"), _tool(CODE, "enter_code")], "tool_choice": "required"}
    status, answer = server.post("/v1/chat/completions", body)
    assert status == 200, answer  # was 400: "tools[0].function.parameters: ... keyword 'not' is not supported"
    choice = answer["choices"][0]
    assert choice["finish_reason"] == "tool_calls", choice
    (call,) = choice["message"]["tool_calls"]
    arguments = json.loads(call["function"]["arguments"])
    if call["function"]["name"] == "set_light":
        _valid_light(arguments)
    else:
        assert call["function"]["name"] == "enter_code"
        assert list(arguments) == ["code"]
        assert isinstance(arguments["code"], str)


def test_anthropic_messages_answer_a_tool_use_of_such_a_tool(server):
    body = {"model": "tiny-host", "max_tokens": 420, "messages": [{"role": "user", "content": "Lamp on"}],
            "tools": [{"name": "set_light", "description": "Switch the lamp", "input_schema": LIGHT}],
            "tool_choice": {"type": "tool", "name": "set_light"}}
    status, answer = server.post("/v1/messages", body)
    assert status == 200, answer
    assert answer["stop_reason"] == "tool_use", answer
    (block,) = [block for block in answer["content"] if block["type"] == "tool_use"]
    assert block["name"] == "set_light"
    _valid_light(block["input"])


def test_ollama_chat_takes_such_a_tool_and_its_calls_are_of_the_tool(server):
    # Ollama's /api/chat has no tool_choice and the tiny model prefers a text answer; at temperature 2 some seeds
    # call (tests/unit/test_compat_tools45.py)
    tools = [_tool(LIGHT, "set_light")]
    for seed in range(24):
        body = {"model": "tiny-host", "messages": [{"role": "user", "content": "Lamp on"}], "tools": tools,
                "stream": False, "options": {"temperature": 2.0, "seed": seed, "num_predict": 420}}
        status, whole = server.post("/api/chat", body)
        assert status == 200, whole  # was 400 for every seed
        calls = whole["message"].get("tool_calls")
        if calls and whole["done_reason"] == "stop":
            (call,) = calls
            assert call["function"]["name"] == "set_light"
            _valid_light(call["function"]["arguments"])
            return
    pytest.fail("no seed of 0-23 gave an answer with a call on /api/chat")


def test_annotations_of_other_vocabularies_in_a_tool_schema_are_left_out_without_a_word():
    """OpenAPI-generated tools carry ``x-`` extensions and VS Code's ``markdownDescription``: unknown keywords,
    annotations under JSON Schema 2020-12, which constrain nothing; they were refused as unsupported keywords, which
    made every request with such a tool a 400."""
    from edgesdk.runtime.json_schema import lenient_schema

    schema = {"type": "object", "x-order": 1, "properties": {"city": {"type": "string", "x-nullable": False,
                                                                     "markdownDescription": "the **city**"}},
              "required": ["city"]}
    lenient, dropped = lenient_schema(schema)
    assert dropped == ()
    assert lenient == {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
    assert schema["x-order"] == 1  # the request's schema is not changed


# ------------------------------------------------------------- older dialects' keywords (OpenAPI 3.0, draft-04, 2020-12)


def test_openapi_nullable_in_a_tool_s_parameters_is_read_as_its_type_and_null():
    """FastAPI / OpenAPI 3.0 and Gemini-style tool schemas write ``"nullable": true`` (OpenAPI 3.0.3, Schema Object:
    it "adds "null" to the allowed types specified by the type keyword"); it refused the whole request as an
    unsupported keyword."""
    from edgesdk.runtime.json_schema import lenient_schema

    parameters = {"type": "object", "properties": {
        "q": {"type": "string", "nullable": True},
        "kind": {"type": "string", "enum": ["a", "b"], "nullable": True},
        "n": {"type": "integer", "nullable": False},
        "free": {"description": "no type: nullable adds nothing", "nullable": True}},
        "required": ["q", "kind", "n"], "additionalProperties": False}
    before = json.dumps(parameters)
    tools = parse_tools({"tools": [_tool(parameters)]})  # was: ToolError "keyword 'nullable' is not supported"
    assert tools.ignored == ()  # read as what it means: nothing to warn about
    assert json.dumps(parameters) == before  # the request's schema is not changed
    lenient = lenient_schema(parameters)[0]["properties"]
    assert lenient["q"] == {"type": ["string", "null"]}
    assert lenient["kind"] == {"type": ["string", "null"], "enum": ["a", "b", None]}
    assert lenient["n"] == {"type": "integer"}
    assert lenient["free"] == {"description": "no type: nullable adds nothing"}
    assert _accepts(tools, _call({"q": None, "kind": None, "n": 1}))
    assert _accepts(tools, _call({"q": "x", "kind": "a", "n": 1, "free": [1]}))
    assert not _accepts(tools, _call({"q": 1, "kind": "a", "n": 1}))
    assert not _accepts(tools, _call({"q": "x", "kind": "c", "n": 1}))
    assert not _accepts(tools, _call({"q": "x", "kind": "a", "n": None}))  # nullable false: not null


def test_a_nullable_ref_into_a_dropped_part_still_points_at_that_schema():
    parameters = {"type": "object", "required": ["fav"], "properties": {
        "scores": {"type": "object", "additionalProperties": {"type": "number"},
                   "propertyNames": {"enum": ["red", "blue"]}},
        "fav": {"$ref": "#/properties/scores/propertyNames", "type": "string", "nullable": True}}}
    tools = parse_tools({"tools": [_tool(parameters)]})
    assert _accepts(tools, _call({"fav": "red"}))
    assert not _accepts(tools, _call({"fav": "green"}))


def test_draft04_boolean_exclusive_bounds_in_a_tool_s_parameters_are_read_exactly():
    """Draft-04 (validation, 5.1.2-5.1.3) writes ``"exclusiveMinimum": true`` beside ``minimum``; it was refused as
    "must be a finite number, got true". It is 2020-12's ``"exclusiveMinimum": <minimum>``, so the bound holds."""
    parameters = {"type": "object", "properties": {
        "n": {"type": "integer", "minimum": 0, "exclusiveMinimum": True, "maximum": 5, "exclusiveMaximum": True},
        "m": {"type": "integer", "maximum": 5, "exclusiveMaximum": False},
        "x": {"type": "number", "minimum": 0, "exclusiveMinimum": True}},
        "required": ["n", "m", "x"], "additionalProperties": False}
    tools = parse_tools({"tools": [_tool(parameters)]})
    assert tools.ignored == ()
    assert _accepts(tools, _call({"n": 1, "m": 5, "x": 0.5}))
    assert _accepts(tools, _call({"n": 4, "m": -3, "x": 2}))
    assert not _accepts(tools, _call({"n": 0, "m": 5, "x": 0.5}))  # exclusive: 0 is out
    assert not _accepts(tools, _call({"n": 5, "m": 5, "x": 0.5}))
    assert not _accepts(tools, _call({"n": 1, "m": 6, "x": 0.5}))  # false: 5 in, 6 out
    assert not _accepts(tools, _call({"n": 1, "m": 5, "x": 0}))


def test_anchors_and_vocabularies_are_left_out_and_a_dynamic_ref_dropped_with_a_word(caplog):
    """JSON Schema 2020-12 core: ``$anchor`` / ``$dynamicAnchor`` name a schema and ``$vocabulary`` lists a
    meta-schema's vocabularies (8.1.2, 8.2.2): they constrain nothing and were refused as unsupported keywords.
    ``$dynamicRef`` (8.2.3.2) does constrain, through the dynamic scope: it is dropped, and the log says so."""
    parameters = {"$vocabulary": {"https://json-schema.org/draft/2020-12/vocab/core": True},
                  "$dynamicAnchor": "meta", "type": "object",
                  "properties": {"q": {"$anchor": "query", "type": "string"}, "node": {"$dynamicRef": "#meta"}},
                  "required": ["q"], "additionalProperties": False}
    with caplog.at_level(logging.WARNING, logger="edgesdk.serve.tools"):
        tools = parse_tools({"tools": [_tool(parameters, "dynamic48")]})
    (line,) = tools.ignored
    assert "$.properties.node.$dynamicRef" in line
    for named in ("$anchor", "$vocabulary", "$dynamicAnchor"):
        assert named not in line
    assert [record for record in caplog.records if "dynamic48" in record.getMessage()]
    assert _accepts(tools, _call({"q": "a", "node": {"any": [1]}}, "dynamic48"))  # the dynamic ref's value: any
    assert not _accepts(tools, _call({"q": 1}, "dynamic48"))
    assert not _accepts(tools, _call({"node": 1}, "dynamic48"))
    plain = {"$anchor": "root", "type": "object", "properties": {"q": STRING}}
    assert parse_tools({"tools": [_tool(plain)]}).ignored == ()
    # the same keywords in draft 2019-09 ($recursiveAnchor / $recursiveRef) and draft-04's id (its $id)
    older = {"id": "http://example.com/s.json", "$recursiveAnchor": True, "type": "object",
             "properties": {"q": STRING, "node": {"$recursiveRef": "#"}}, "required": ["q"]}
    (line,) = parse_tools({"tools": [_tool(older)]}).ignored
    assert "$.properties.node.$recursiveRef" in line
    assert "$recursiveAnchor" not in line
    with pytest.raises(ToolError, match="keyword 'id'"):  # a schema under "id" is a property misplaced, not a URI
        parse_tools({"tools": [_tool({"type": "object", "id": {"type": "string"}})]})


@pytest.mark.parametrize(("keyword", "schema"), [
    ("nullable", {"type": "object", "properties": {"a": {"type": "string", "nullable": True}}}),
    ("$anchor", {"type": "object", "properties": {"a": {"type": "string", "$anchor": "a"}}}),
    ("$dynamicRef", {"type": "object", "properties": {"a": {"$dynamicRef": "#a"}}}),
    ("finite number", {"type": "object", "properties": {"a": {"type": "integer", "minimum": 0,
                                                              "exclusiveMinimum": True}}}),
])
def test_a_response_format_still_refuses_the_older_dialects_keywords(keyword, schema):
    body = {"messages": [{"role": "user", "content": "hi"}],
            "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}}
    with pytest.raises(ApiError, match=keyword.replace("$", r"\$")) as refused:
        parse_chat_request(body)
    assert refused.value.param.startswith("response_format")


# what FastAPI (OpenAPI 3.0) and a draft-04 generator write: the arguments' shape is {"level": 1..10, "room": ...}
DIMMER = {"$anchor": "dimmer", "type": "object", "additionalProperties": False, "required": ["level", "room"],
          "properties": {"level": {"type": "integer", "minimum": 0, "exclusiveMinimum": True, "maximum": 10},
                         "room": {"type": "string", "enum": ["hall", "den"], "nullable": True}}}


def test_openai_chat_answers_a_call_of_an_openapi_or_draft04_tool(server):
    body = {"messages": [{"role": "user", "content": "Dim the hall"}], "tools": [_tool(DIMMER, "dim")],
            "tool_choice": "required"}
    status, answer = server.post("/v1/chat/completions", body)
    assert status == 200, answer  # was 400: "keyword '$anchor' is not supported", then 'nullable', then "got true"
    choice = answer["choices"][0]
    assert choice["finish_reason"] == "tool_calls", choice
    (call,) = choice["message"]["tool_calls"]
    assert call["function"]["name"] == "dim"
    arguments = json.loads(call["function"]["arguments"])
    assert set(arguments) == {"level", "room"}, arguments
    assert isinstance(arguments["level"], int), arguments
    assert 0 < arguments["level"] <= 10, arguments
    assert arguments["room"] in ("hall", "den", None), arguments
