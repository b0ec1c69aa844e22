"""Review tests for the JSON schema constraint (edgesdk/runtime/json_schema.py): definitions reached through
other definitions, cycles, values JSON cannot hold, and the constraint's agreement with its schema."""

from __future__ import annotations

import json
import re

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from edgesdk.runtime.json_schema import SchemaConstraint, SchemaError, compile_schema
from tests.unit.test_json_schema import BYTES, _feed


def test_a_definition_referred_to_only_by_another_definition_is_compiled():
    """pydantic's schema of nested models: the root refers to A, and only A refers to B."""
    schema = {"$defs": {"A": {"properties": {"b": {"$ref": "#/$defs/B"}}, "required": ["b"], "title": "A",
                              "type": "object"},
                        "B": {"properties": {"z": {"title": "Z", "type": "integer"}}, "required": ["z"], "title": "B",
                              "type": "object"}},
              "properties": {"a": {"$ref": "#/$defs/A"}, "opt": {"anyOf": [{"$ref": "#/$defs/A"}, {"type": "null"}]}},
              "required": ["a"], "title": "M", "type": "object"}
    assert _feed(schema, '{"a":{"b":{"z":1}},"opt":{"b":{"z":-2}}}').complete
    assert _feed(schema, '{"a":{"b":{"z":"x"}}}') is None


@pytest.mark.parametrize("schema", [
    # through anyOf: following the option would never write a byte
    {"type": "object", "properties": {"x": {"$ref": "#/$defs/a"}},
     "$defs": {"a": {"anyOf": [{"$ref": "#/$defs/a"}, {"type": "null"}]}}},
    # through two definitions and a oneOf
    {"type": "object", "properties": {"x": {"$ref": "#/$defs/a"}},
     "$defs": {"a": {"oneOf": [{"type": "null"}, {"$ref": "#/$defs/b"}]}, "b": {"allOf": [{"$ref": "#/$defs/a"}]}}},
    # a pure cycle below the root, not only at it
    {"type": "object", "properties": {"x": {"$ref": "#/$defs/a"}}, "$defs": {"a": {"$ref": "#/$defs/a"}}},
])
def test_a_ref_cycle_that_writes_no_byte_is_refused_when_compiled(schema):
    with pytest.raises(SchemaError, match="refers to itself without ever reaching a value") as refused:
        compile_schema(schema)
    assert "properties" in refused.value.fix


def test_recursion_through_properties_and_items_still_compiles():
    schema = {"type": "object", "properties": {"n": {"$ref": "#/$defs/n"}}, "$defs": {"n": {"anyOf": [
        {"type": "object", "properties": {"next": {"$ref": "#/$defs/n"}}},
        {"type": "array", "items": {"$ref": "#/$defs/n"}, "maxItems": 1}]}}}
    assert _feed(schema, '{"n":{"next":[{"next":[]}]}}').complete


@pytest.mark.parametrize(("text", "where"), [
    ('{"type": "object", "properties": {"\\ud800x": {}}}', r"\$.properties: " + '"\\\\ud800x"'),
    ('{"type": "object", "properties": {"a": {"enum": ["ok", "\\udc00"]}}}', r"\$.properties.a.enum: "),
    ('{"type": "object", "properties": {"a": {"const": NaN}}}', r"\$.properties.a.const: NaN"),
    ('{"type": "array", "items": {"enum": [1, {"x": -Infinity}]}}', r"\$.items.enum: "),
])
def test_values_that_have_no_json_text_are_refused_by_name(text, where):
    """Python's JSON reader (the server's, the CLI's) takes NaN, Infinity and lone surrogate escapes; an answer
    cannot hold them (a UnicodeEncodeError escaped the compile, and NaN was written into the answer)."""
    with pytest.raises(SchemaError, match=where + ".*has no JSON text") as refused:
        compile_schema(text)
    assert "drop or fix that value" in refused.value.fix


@pytest.mark.parametrize(("schema", "message"), [
    ({"type": "object", "properties": {"a": {}}, "required": [["a"]]}, r'\$.required must be an array of property '
                                                                        r'names, got \[\["a"\]\]'),
    ({"type": "object", "properties": {"a": {}}, "required": "a"}, r'\$.required must be .* got "a"'),
    ({"type": "object", "properties": ["a"]}, r'\$.properties must be an object of property schemas, got \["a"\]'),
    ({"type": "object", "properties": {"a": {"type": [["string"]]}}}, r"\$.properties.a.type is \[\['string'\]\]"),
    ({"type": "object", "properties": {"a": {"type": ["string", "string"]}}}, r"each once"),
])
def test_malformed_required_and_type_are_refused_by_name(schema, message):
    """A list inside required or type ended the compile in a TypeError (unhashable type: 'list')."""
    with pytest.raises(SchemaError, match=message):
        compile_schema(schema)


def test_enum_and_const_values_outside_the_type_beside_them_are_never_written():
    """An instance satisfies every keyword: ``{"type": "string", "enum": ["x", 1]}`` allows "x" only (the
    constraint wrote 1, which the schema refuses)."""
    schema = {"type": "object", "properties": {"a": {"type": "string", "enum": ["x", 1, None]},
                                               "b": {"type": ["integer", "null"], "enum": [1.0, 2.5, "1", None]},
                                               "c": {"const": "k", "enum": ["k", "j"]}}, "required": ["a"]}
    assert _feed(schema, '{"a":1}') is None
    assert _feed(schema, '{"a":null}') is None
    assert _feed(schema, '{"b":2.5}') is None
    assert _feed(schema, '{"a":"x","b":"1"}') is None
    assert _feed(schema, '{"a":"x","c":"j"}') is None
    assert _feed(schema, '{"a":"x","b":1.0,"c":"k"}').complete  # 1.0 is an integer (its fraction is zero)
    assert _feed(schema, '{"a":"x","b":null}').complete


@pytest.mark.parametrize(("schema", "message"), [
    ({"type": "integer", "enum": ["1", 1.5]}, r"\$.properties.a: no value of its enum is also of its type 'integer'"),
    ({"const": "a", "enum": ["b"]}, r"\$.properties.a: no value of its const is also in its enum, so"),
])
def test_enum_values_none_of_which_fits_the_type_are_refused(schema, message):
    with pytest.raises(SchemaError, match=message):
        compile_schema({"type": "object", "properties": {"a": schema}})


def test_keywords_beside_a_ref_are_applied_not_ignored():
    """JSON Schema 2020-12 applies the keywords beside ``$ref`` as well; the constraint dropped them, so
    ``maxLength`` there let a longer string through (then refused them; now applies both, as an allOf)."""
    defs = {"$defs": {"S": {"type": "string"}}}
    bounded = {"type": "object", "properties": {"a": {"$ref": "#/$defs/S", "maxLength": 2}}, **defs}
    assert _feed(bounded, '{"a":"ab"}').complete
    assert _feed(bounded, '{"a":"abc"}') is None
    annotated = {"type": "object", "properties": {"a": {"$ref": "#/$defs/S", "description": "d", "default": "x"}},
                 **defs}
    assert _feed(annotated, '{"a":"long"}').complete


def test_a_root_that_is_one_of_several_objects_or_arrays_is_taken():
    """A root anyOf / oneOf / type list whose every option is an object or an array is an object or an array
    (it was refused as "root is 'choice'", a name the schema never used)."""
    schema = {"$defs": {"Cat": {"type": "object", "properties": {"meow": {"type": "boolean"}}, "required": ["meow"]},
                        "Dog": {"type": "object", "properties": {"bark": {"type": "integer"}}, "required": ["bark"]}},
              "anyOf": [{"$ref": "#/$defs/Cat"}, {"oneOf": [{"$ref": "#/$defs/Dog"}, {"enum": [[1], {"x": 2}]}]}]}
    for text in ('{"meow":true}', '{"bark":3}', "[1]", '{"x":2}'):
        assert _feed(schema, text).complete, text
    assert _feed(schema, '{"bark":true}') is None
    assert _feed({"type": ["object", "array"]}, "[1]").complete


@pytest.mark.parametrize(("schema", "message"), [
    ({"anyOf": [{"type": "object"}, {"type": "number"}]}, "root is 'number' (an option of its anyOf"),
    ({"type": ["array", "integer"]}, "root is 'integer' (an option"),
    ({"anyOf": [{"type": "object"}, {}]}, "root is any value ({} or true) (an option"),
    ({"enum": [{"a": 1}, 2, 23]}, "no enum / const value may be the start of another: 2 and 23"),
])
def test_a_root_that_may_be_something_else_names_that_option(schema, message):
    with pytest.raises(SchemaError, match=re.escape(message)):
        compile_schema(schema)


@pytest.mark.parametrize("gap", ["  ", "\n\n\n", " \n", "\r", "\t"])
def test_spacing_after_a_number_is_the_same_as_after_any_other_token(gap):
    """The whitespace byte that ended a number did not count as spacing, so two spaces, a blank line or a
    carriage return passed there and nowhere else."""
    schema = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "number"}, "c": {}}}
    for text in ('{"a":1' + gap + "}", '{"b":-1.5e3' + gap + "}", '{"c":0' + gap + "}", '{"a":1' + gap + ',"c":2}'):
        assert _feed(schema, text) is None, text
    for spacing in (" ", "\n", "\n\t  ", "\n\n  "):
        assert _feed(schema, '{"a":1' + spacing + ',"b":2' + spacing + ',"c":3' + spacing + "}").complete


def test_every_const_of_a_long_anyof_can_be_written():
    """A documented enum (oneOf of consts, each with its description) past MAX_WAYS values: each const was a
    way of its own, and the ones past the 64th were dropped at the first byte, never to be written."""
    from edgesdk.runtime.json_schema import MAX_WAYS

    codes = [f"c{i:03d}" for i in range(MAX_WAYS + 36)] + [i for i in range(1, 40)]
    schema = {"type": "object", "properties": {"v": {"oneOf": [
        {"$ref": "#/$defs/first"}, *({"const": code, "description": f"code {code}"} for code in codes[1:]),
        {"type": ["boolean", "null"]}]}}, "$defs": {"first": {"const": codes[0]}}}
    for code in [*codes, True, None]:
        text = '{"v":' + json.dumps(code) + "}"
        constraint = _feed(schema, text)
        assert constraint is not None, text
        assert constraint.complete, text
    assert _feed(schema, '{"v":"c999"}') is None
    assert _feed(schema, '{"v":40}') is None


@pytest.mark.parametrize("definition", [
    {"type": "object", "properties": {"next": {"$ref": "#/$defs/n"}}, "required": ["next"]},
    {"type": "array", "items": {"$ref": "#/$defs/n"}, "minItems": 1},
    {"anyOf": [{"type": "array", "items": {"$ref": "#/$defs/n"}, "minItems": 2},
               {"type": "object", "properties": {"x": {"$ref": "#/$defs/m"}}, "required": ["x"]}]},
])
def test_a_definition_without_a_finite_value_is_refused(definition):
    """No instance ends: the answer nested it until max_tokens ran out, and as an optional property it was a
    way in with no way out."""
    schema = {"type": "object", "properties": {"a": {"$ref": "#/$defs/n"}},
              "$defs": {"n": definition, "m": {"$ref": "#/$defs/n"}}}
    with pytest.raises(SchemaError, match="'#/\\$defs/n'.* (has|have) no finite value") as refused:
        compile_schema(schema)
    assert "required" in refused.value.fix


def test_recursion_with_a_way_out_compiles():
    schema = {"type": "object", "properties": {"a": {"$ref": "#/$defs/n"}}, "required": ["a"], "$defs": {"n": {
        "anyOf": [{"type": "object", "properties": {"next": {"$ref": "#/$defs/n"}}, "required": ["next"]},
                  {"type": "null"}]}}}
    assert _feed(schema, '{"a":{"next":{"next":null}}}').complete


# ------------------------------------------------------------------------- generated schemas and instances

_SCALARS = st.none() | st.booleans() | st.integers(-10**6, 10**6) | \
    st.floats(allow_nan=False, allow_infinity=False, width=32) | st.text(max_size=4)
_VALUES = st.recursive(_SCALARS, lambda inner: st.lists(inner, max_size=3) |
                       st.dictionaries(st.text(max_size=3), inner, max_size=3), max_leaves=5)
_KEYS = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=5)  # quotes, escapes, unicode
_LEAVES = st.sampled_from([{"type": kind} for kind in ("string", "number", "integer", "boolean", "null")] +
                          [{}, {"type": ["integer", "null"]}]) | \
    st.lists(_SCALARS, min_size=1, max_size=4).map(lambda values: {"enum": values}) | \
    st.tuples(st.sampled_from(["string", "integer", "number", ["boolean", "null"]]), st.lists(
        _SCALARS, min_size=1, max_size=4)).map(lambda t: {"type": t[0], "enum": t[1]}) | \
    _VALUES.map(lambda value: {"const": value})


def _objects(inner):
    return st.dictionaries(_KEYS, inner, max_size=4).flatmap(lambda properties: st.lists(
        st.sampled_from(sorted(properties)), max_size=len(properties), unique=True).map(
        lambda required: {"type": "object", "properties": properties, "required": required})
        if properties else st.just({"type": "object", "properties": {}}))


def _containers(inner):
    arrays = st.tuples(inner, st.integers(0, 2), st.integers(0, 3)).map(lambda t: {
        "type": "array", "items": t[0], "minItems": t[1], **({"maxItems": t[1] + t[2]} if t[2] < 3 else {})})
    return _objects(inner) | arrays | st.lists(inner, min_size=1, max_size=3).map(lambda options: {"anyOf": options})


_SCHEMAS = st.recursive(_LEAVES, _containers, max_leaves=8)
_ROOTS = _objects(_SCHEMAS) | _SCHEMAS.map(lambda items: {"type": "array", "items": items, "maxItems": 3})


def _equal(a, b) -> bool:
    """JSON Schema's equality: numbers by value, booleans apart from numbers."""
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return a == b
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_equal(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict) and isinstance(b, dict):
        return set(a) == set(b) and all(_equal(a[k], b[k]) for k in a)
    return type(a) is type(b) and a == b


def _of(value, schema: dict) -> bool:
    """The oracle: ``value`` is an instance of ``schema`` (the generated subset), properties in schema order."""
    if schema == {}:
        return True
    if "anyOf" in schema:
        return any(_of(value, option) for option in schema["anyOf"])
    if "const" in schema and not _equal(value, schema["const"]):
        return False
    if "enum" in schema and not any(_equal(value, each) for each in schema["enum"]):
        return False
    kinds = schema.get("type", [])
    return "type" not in schema or any(_of_kind(value, kind, schema)
                                       for kind in ([kinds] if isinstance(kinds, str) else kinds))


def _of_kind(value, kind: str, schema: dict) -> bool:
    if kind == "object":
        properties = schema["properties"]
        return isinstance(value, dict) and list(value) == [k for k in properties if k in value] and \
            set(schema.get("required", [])) <= set(value) and all(_of(v, properties[k]) for k, v in value.items())
    if kind == "array":
        return isinstance(value, list) and schema.get("minItems", 0) <= len(value) <= schema.get("maxItems", len(value)) \
            and all(_of(v, schema["items"]) for v in value)
    if kind == "integer":
        return (isinstance(value, int) and not isinstance(value, bool)) or (isinstance(value, float)
                                                                            and value.is_integer())
    if kind == "number":
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    return {"string": str, "boolean": bool, "null": type(None)}[kind] is type(value)


def _instance(schema: dict, draw):
    """A value of ``schema`` (None drawn where it has none: an enum none of whose values has its type)."""
    if schema == {}:
        return draw(_VALUES)
    if "anyOf" in schema:
        return _instance(draw(st.sampled_from(schema["anyOf"])), draw)
    if "const" in schema or "enum" in schema:
        values = [value for value in ([schema["const"]] if "const" in schema else schema["enum"]) if _of(value, schema)]
        assume(values)
        return draw(st.sampled_from(values))
    kind = draw(st.sampled_from(schema["type"] if isinstance(schema["type"], list) else [schema["type"]]))
    if kind == "object":
        return {name: _instance(value, draw) for name, value in schema["properties"].items()
                if name in schema["required"] or draw(st.booleans())}
    if kind == "array":
        low = schema.get("minItems", 0)
        return [_instance(schema["items"], draw) for _ in range(draw(st.integers(low, schema.get("maxItems", low + 3))))]
    return draw({"string": st.text(max_size=5), "number": st.integers(-10**9, 10**9) | st.floats(
        allow_nan=False, allow_infinity=False).filter(_within_digit_caps),
                 "integer": st.integers(-10**16 + 1, 10**16 - 1), "boolean": st.booleans(), "null": st.none()}[kind])


def _within_digit_caps(number: float) -> bool:
    """The number's JSON text keeps to llama.cpp's schema grammar, which the constraint follows: at most 16
    digits before the point, 16 after it and 16 in an exponent without a leading zero."""
    integral, fraction, exponent = re.fullmatch(r"-?(\d+)(?:\.(\d+))?(?:[eE][-+]?(\d+))?", json.dumps(number)).groups()
    return len(integral) <= 16 and len(fraction or "") <= 16 and (exponent is None or len(exponent) <= 16
                                                                  and (exponent == "0" or exponent[0] != "0"))


def _compiled(schema):
    try:
        return compile_schema(schema)
    except SchemaError as refused:  # the generator may write an enum none of whose values has its type
        problem = refused.problem
    assert "no value of its" in problem, problem
    assume(False)


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(_ROOTS, st.randoms(use_true_random=False))
def test_what_the_constraint_completes_conforms_to_generated_schemas(schema, rng):
    """Soundness: random walks through the bytes allowed; every walk that completes is an instance."""
    compiled = _compiled(schema)
    alphabet = sorted(set(b'{}[],:" 0123456789.-eEtrufalsn\\\n') | set(json.dumps(schema, ensure_ascii=False).encode()))
    for _ in range(5):
        constraint = SchemaConstraint(BYTES, compiled)
        data = bytearray()
        while not constraint.complete and len(data) < 200:
            allowed = [b for b in alphabet if constraint.allows(b)] or [b for b in range(256) if constraint.allows(b)]
            assert allowed, f"no byte continues {bytes(data)!r}"
            data.append(rng.choice(allowed))
            constraint.advance(data[-1])
        if constraint.complete:
            assert _of(json.loads(bytes(data)), schema), bytes(data)


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(_ROOTS, st.data(), st.randoms(use_true_random=False))
def test_instances_of_generated_schemas_pass_and_the_trie_agrees_with_asking_token_by_token(schema, data, rng):
    """Completeness over multi-byte tokens (pieces of the instance, special tokens without bytes among them),
    and in every state on the way the allowed set found through the vocabulary trie is the one
    token-by-token questions give."""
    compiled = _compiled(schema)
    value = _instance(schema, data.draw)
    text = json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode()
    pieces = {text[i:j] for i in range(len(text)) for j in range(i + 2, min(len(text), i + 5) + 1)}
    vocabulary = BYTES + sorted(pieces) + [None, b"", b"}\n", b"\n\n", b"  ", b'"}']
    rng.shuffle(vocabulary)
    ids = {piece: token for token, piece in enumerate(vocabulary) if piece}
    constraint = SchemaConstraint(vocabulary, compiled)
    position = 0
    while position < len(text):
        asked, walked = SchemaConstraint(vocabulary, compiled), SchemaConstraint(vocabulary, compiled)
        asked.ways = walked.ways = constraint.ways
        asked.SCAN_AFTER, walked.SCAN_AFTER = len(vocabulary) + 1, 0
        assert {t for t in range(len(vocabulary)) if asked.allows(t)} == \
            {t for t in range(len(vocabulary)) if walked.allows(t)}, text[:position]
        piece = text[position:position + rng.randint(1, 5)]
        while piece not in ids:
            piece = piece[:-1]
        assert constraint.allows(ids[piece]), (text, position)
        constraint.advance(ids[piece])
        position += len(piece)
    assert constraint.complete, text
