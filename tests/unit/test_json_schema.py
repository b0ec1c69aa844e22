"""Answers constrained to a JSON schema (edgesdk/runtime/json_schema.py): instances accepted, everything the
constraint completes valid, unsupported keywords refused by name, and constrained generation on a tiny bundle
through generate, run and serve."""

from __future__ import annotations

import json
import random

import pytest

from edgesdk.runtime.json_schema import SchemaConstraint, SchemaError, compile_schema

BYTES = [bytes([b]) for b in range(256)]  # a "tokenizer" whose token i is byte i

PERSON = {"type": "object", "properties": {
    "name": {"type": "string"}, "age": {"type": "integer"},
    "tags": {"type": "array", "items": {"enum": ["a", "b", "ab"]}, "maxItems": 2},
    "nick": {"anyOf": [{"type": "string"}, {"type": "null"}]}, "score": {"type": "number"},
    "ok": {"type": "boolean"}}, "required": ["name", "age"], "additionalProperties": False}
TREE = {"$defs": {"node": {"type": "object", "properties": {
    "v": {"type": ["integer", "null"]}, "kids": {"type": "array", "items": {"$ref": "#/$defs/node"}, "minItems": 1}},
    "required": ["v"]}}, "$ref": "#/$defs/node"}
ANY = {"type": "object", "properties": {"data": {}, "mode": {"const": "x"}}, "required": ["data", "mode"]}
LIST = {"type": "array", "items": {"type": "object", "properties": {"k": {"enum": [1, 12, "1", True, None]}},
                                   "required": ["k"]}, "minItems": 1, "maxItems": 3}
SCHEMAS = {"person": PERSON, "tree": TREE, "any": ANY, "list": LIST}


def _feed(schema: dict, text: str) -> SchemaConstraint | None:
    constraint = SchemaConstraint(BYTES, compile_schema(schema))
    for byte in text.encode():
        if not constraint.allows(byte):
            return None
        constraint.advance(byte)
    return constraint


def _conforms(value, schema: dict, root: dict) -> bool:
    """A small JSON Schema check for the keywords the constraint supports (the test's own oracle)."""
    if "$ref" in schema:
        return _conforms(value, root["$defs"][schema["$ref"].split("/")[-1]], root)
    if "const" in schema:
        return json.dumps(value) == json.dumps(schema["const"])
    if "enum" in schema:
        return any(json.dumps(value) == json.dumps(v) for v in schema["enum"])
    if "anyOf" in schema:
        return any(_conforms(value, s, root) for s in schema["anyOf"])
    if schema in ({}, True):
        return True
    kinds = schema["type"] if isinstance(schema["type"], list) else [schema["type"]]
    return any(_conforms_type(value, kind, schema, root) for kind in kinds)


def _conforms_type(value, kind: str, schema: dict, root: dict) -> bool:
    if kind == "object":
        props = schema.get("properties", {})
        return isinstance(value, dict) and set(value) <= set(props) and set(schema.get("required", [])) <= set(value) \
            and list(value) == [k for k in props if k in value] and all(_conforms(v, props[k], root)
                                                                     for k, v in value.items())
    if kind == "array":
        return isinstance(value, list) and schema.get("minItems", 0) <= len(value) <= schema.get("maxItems", 10**9) \
            and all(_conforms(v, schema.get("items", {}), root) for v in value)
    checks = {"string": lambda v: isinstance(v, str), "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
              "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
              "boolean": lambda v: isinstance(v, bool), "null": lambda v: v is None}
    return checks[kind](value)


@pytest.mark.parametrize(("name", "text"), [
    ("person", '{"name": "Ann", "age": 31}'),
    ("person", '{\n  "name": "A \\"q\\" \\u00e9 東京",\n  "age": -0,\n  "tags": ["a", "ab"],\n  "nick": null\n}'),
    ("person", '{"name":"A","age":12,"nick":"zz","score":-1.5e+3,"ok":false}'),
    ("person", '{"name":"A","age":7,"ok":true}'),
    ("tree", '{"v":1,"kids":[{"v":null},{"v":3,"kids":[{"v":4}]}]}'),
    ("any", '{"data":{"x":[1,2,{"y":null}],"z":"}"},"mode":"x"}'),
    ("any", '{"data": {\n\n  "free": "form"  }, "mode": "x"}'),  # a free-form value spaces as JSON mode allows
    ("any", '{"data":12 ,"mode":"x"}'),
    ("list", '[{"k":1},{"k":12},{"k":"1"}]'),
    ("list", '[{"k":true}]'),
])
def test_instances_of_the_schema_are_accepted_and_complete_at_their_end(name, text):
    constraint = SchemaConstraint(BYTES, compile_schema(SCHEMAS[name]))
    data = text.encode()
    for index, byte in enumerate(data):
        assert not constraint.complete, f"complete before byte {index} of {text!r}"
        assert constraint.allows(byte), f"refused byte {index} of {text!r}: {text[:index]!r}"
        constraint.advance(byte)
    assert constraint.complete
    assert _conforms(json.loads(text), SCHEMAS[name], SCHEMAS[name])


@pytest.mark.parametrize(("name", "text"), [
    ("person", '{"age":3,"name":"x"}'),  # properties in the schema's order
    ("person", '{"name":"A"}'),  # a required property missing
    ("person", '{"name":"A","age":3.5}'),  # an integer with a fraction
    ("person", '{"name":"A","age":1e5}'),
    ("person", '{"name":"A","age":1,"x":2}'),  # a property the schema does not list
    ("person", '{"name":"A","age":1,"tags":["a","b","a"]}'),  # maxItems 2
    ("person", '{"name":"A","age":1,"tags":["c"]}'),  # not in the enum
    ("person", '{"name":1,"age":1}'),
    ("person", '{"name":"A","age":01}'),
    ("person", '{"name":"A","age":1,}'),
    ("tree", '{"v":1,"kids":[]}'),  # minItems 1
    ("tree", '{"v":1,"kids":[{"kids":[{"v":1}]}]}'),  # a nested node without its required v
    ("list", "[]"),
    ("list", '[{"k":2}]'),
    ("list", '[{"k":1},{"k":1},{"k":1},{"k":1}]'),
    ("list", '{"k":1}'),
])
def test_texts_outside_the_schema_are_refused(name, text):
    assert _feed(SCHEMAS[name], text) is None or not _feed(SCHEMAS[name], text).complete


@pytest.mark.parametrize("name", sorted(SCHEMAS))
def test_whatever_the_constraint_completes_is_valid_json_of_the_schema(name):
    """Soundness: random walks through the bytes the constraint allows; every walk it completes parses
    and conforms to the schema."""
    schema = SCHEMAS[name]
    alphabet = list(b'{}[],:" 0123456789.-eEtrufalsnxyvkidgpcmob\\\n')
    rng = random.Random(0)
    completed = 0
    for _ in range(300):
        constraint = SchemaConstraint(BYTES, compile_schema(schema))
        data = bytearray()
        while not constraint.complete and len(data) < 200:
            allowed = [b for b in alphabet if constraint.allows(b)]
            assert allowed, f"stuck after {bytes(data)!r}: no byte continues"
            byte = rng.choice(allowed)
            constraint.advance(byte)
            data.append(byte)
        if constraint.complete:
            completed += 1
            assert _conforms(json.loads(bytes(data)), schema, schema), bytes(data)
    assert completed >= 30


def test_spacing_between_tokens_is_one_space_or_a_newline_and_indentation():
    from edgesdk.runtime.json_schema import MAX_INDENT

    assert _feed(PERSON, '{ "name" : "a" ,\n\t"age":\n' + " " * MAX_INDENT + "1 }").complete
    assert _feed(PERSON, "{  ") is None  # two spaces
    assert _feed(PERSON, '{\n\n  "name":"a",\n\n"age":1}').complete  # a blank line: llama.cpp's "\n"{1,2}
    assert _feed(PERSON, "{\n\n\n") is None  # two blank lines
    assert _feed(PERSON, "{\n \n") is None  # a line of indentation only
    assert _feed(PERSON, "{\n" + " " * (MAX_INDENT + 1)) is None
    assert _feed(PERSON, '{"name":"' + " " * 100 + '","age":1}').complete  # spaces inside a string are text


def test_multi_byte_tokens_and_completion_inside_a_token():
    table = [b'{"', b'name', b'":"', b'Bo', b'","', b'age', b'":', b'4', b'2', b'}', b'}\n', b'}}', b' ']
    constraint = SchemaConstraint(table, compile_schema(PERSON))
    for token in (0, 1, 2, 3, 4, 5, 6, 7, 8):
        assert constraint.allows(token)
        constraint.advance(token)
    assert not constraint.allows(11)  # a second closing brace
    assert constraint.allows(10)  # the object closes, then only whitespace
    constraint.advance(10)
    assert constraint.complete
    with pytest.raises(ValueError, match="does not continue"):
        constraint.advance(3)


@pytest.mark.parametrize(("schema", "message"), [
    ({"type": "number"}, "root is 'number'"),
    ({"type": "object", "properties": {"a": {"type": "string", "pattern": "^(?=x)"}}}, r"\$.properties.a.pattern: .*lookarounds"),
    ({"type": "object", "properties": {"n": {"type": "integer", "not": {"const": 2}}}}, "keyword 'not'"),
    ({"type": "object", "properties": {"a": {"$ref": "https://example.com/s.json"}}}, "only local definitions"),
    ({"type": "object", "properties": {"a": {"$ref": "#/$defs/missing"}}}, "points at no definition"),
    ({"type": "object", "required": ["b"], "properties": {"a": {}}, "additionalProperties": False},
     r"required names \['b'\]"),
    ({"type": "array", "minItems": 3, "maxItems": 2}, "maxItems 2 is below minItems 3"),
    ({"type": "object", "properties": {"a": {"allOf": [{"type": "string"}, {"type": "null"}]}}}, "allOf of 2"),
    ({"type": "object", "properties": {"a": {"type": "date"}}}, r"\$.properties.a.type is 'date'"),
    ({"$defs": {"a": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"}, "refers to itself"),
    ("{not json", "not valid JSON"),
])
def test_unsupported_or_broken_schemas_are_refused_by_name(schema, message):
    with pytest.raises(SchemaError, match=message) as refused:
        compile_schema(schema)
    assert refused.value.fix


def test_pydantic_style_schemas_compile():
    """What pydantic's model_json_schema writes: titles, an Optional as anyOf with null and a default,
    an enum class through $defs."""
    schema = {"$defs": {"Color": {"enum": ["red", "green"], "title": "Color", "type": "string"}},
              "properties": {"name": {"title": "Name", "type": "string"},
                             "color": {"$ref": "#/$defs/Color"},
                             "nick": {"anyOf": [{"type": "string"}, {"type": "null"}], "default": None, "title": "Nick"}},
              "required": ["name", "color"], "title": "Pet", "type": "object"}
    assert _feed(schema, '{"name":"Rex","color":"green"}').complete
    assert _feed(schema, '{"name":"Rex","color":"blue"}') is None


# ------------------------------------------------------------------------------------- on a tiny bundle

# A finite language: at most 9 gaps of 21 whitespace bytes and 29 other bytes, so a random model's answer must
# close within 218 tokens (every token is at least one byte); the tiny bundle's context is 256.
FINITE = {"type": "object", "properties": {"ok": {"type": "boolean"}, "color": {"enum": ["red", "green", "blue"]}},
          "required": ["ok", "color"]}
ROOM = 220


@pytest.fixture(scope="module")
def runtime(tiny_bundle):
    from edgesdk.runtime.session import open_runtime

    return open_runtime(tiny_bundle.path, threads=1)


@pytest.mark.parametrize(("temperature", "seed"), [(0.0, None), (1.0, 1), (1.5, 2)])
def test_generate_under_a_schema_gives_an_instance(runtime, temperature, seed):
    from edgesdk.runtime.generate import SamplingConfig, generate

    tokenizer = runtime.tokenizer
    constraint = SchemaConstraint(tokenizer.token_bytes(), compile_schema(FINITE))
    tokens, stats = generate(runtime.backend, tokenizer.prompt_ids("Give me JSON", raw=False),
                             SamplingConfig(max_new_tokens=ROOM, temperature=temperature, seed=seed),
                             tokenizer.eos_token_ids, constraint=constraint)
    text = b"".join(tokenizer.token_bytes()[t] for t in tokens)
    assert stats.stop_reason == "complete", text
    assert _conforms(json.loads(text), FINITE, FINITE)


def test_run_json_schema_from_a_file_or_text(tiny_bundle, tmp_path):
    from tests.unit.test_cli import assert_ok, invoke

    path = tmp_path / "schema.json"
    path.write_text(json.dumps(FINITE))
    for given in (str(path), json.dumps(FINITE)):
        result = invoke("run", tiny_bundle.path, "--prompt", "JSON please", "-n", ROOM, "--json-schema", given,
                        "--threads", 1)
        assert_ok(result)
        assert _conforms(json.loads(result.stdout), FINITE, FINITE)
    result = invoke("run", tiny_bundle.path, "--prompt", "x", "--json-schema", '{"type": "number"}')
    assert result.exit_code == 2
    assert "root is 'number'" in result.output
    result = invoke("run", tiny_bundle.path, "--prompt", "x", "--json", "--json-schema", str(path))
    assert result.exit_code == 2
    assert "pass one" in result.output


def test_serve_follows_a_json_schema_in_each_of_its_three_spellings(runtime):
    from edgesdk.serve.completion import ServeDefaults
    from tests.unit.test_serve import Served

    server = Served(runtime, ServeDefaults(max_tokens=ROOM))
    messages = [{"role": "user", "content": "JSON please"}]
    try:
        for extra in ({"response_format": {"type": "json_schema", "json_schema": {"name": "f", "schema": FINITE,
                                                                                  "strict": True}}},
                      {"response_format": {"type": "json_object", "schema": FINITE}},  # llama-server's spellings
                      {"json_schema": FINITE}):
            status, answer = server.post("/v1/chat/completions", {"messages": messages, **extra})
            assert status == 200, answer
            assert answer["choices"][0]["finish_reason"] == "stop"
            assert _conforms(json.loads(answer["choices"][0]["message"]["content"]), FINITE, FINITE)
        status, answer = server.post("/v1/completions", {"prompt": "JSON:", "json_schema": FINITE})
        assert status == 200, answer
        assert _conforms(json.loads(answer["choices"][0]["text"]), FINITE, FINITE)
        refused = {"type": "object", "properties": {"a": {"type": "string", "format": "json-pointer"}}}
        status, answer = server.post("/v1/chat/completions", {"messages": messages, "response_format": {
            "type": "json_schema", "json_schema": {"name": "f", "schema": refused}}})
        assert (status, answer["error"]["param"]) == (400, "response_format")
        assert "format \"json-pointer\" is not supported" in answer["error"]["message"]
        status, answer = server.post("/v1/chat/completions", {"messages": messages, "json_schema": FINITE,
                                                              "response_format": {"type": "json_object",
                                                                                  "schema": FINITE}})
        assert (status, answer["error"]["param"]) == (400, "json_schema")
        status, answer = server.post("/v1/chat/completions", {"messages": messages, "response_format": {
            "type": "json_schema", "json_schema": {"name": "f"}}})
        assert (status, answer["error"]["param"]) == (400, "response_format")
    finally:
        server.close()
