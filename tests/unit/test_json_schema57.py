"""A const beside an enum is compared with the enum's values as JSON Schema compares instances; lenient_schema
drops a format of a type the schema's type leaves out."""

from edgesdk.runtime.json_schema import SchemaConstraint, compile_schema, lenient_schema


def _accepts(schema: dict, text: str) -> bool:
    constraint = SchemaConstraint([bytes([b]) for b in range(256)], compile_schema(schema))
    for byte in text.encode():
        if not constraint.allows(byte):
            return False
        constraint.advance(byte)
    return constraint.complete


def test_a_const_equal_to_an_enum_value_written_otherwise_is_kept():
    # 1 and 1.0 are one number, and an object's keys come in any order (2020-12 core, section 4.2.2)
    number = {"type": "object", "properties": {"a": {"const": 1, "enum": [1.0, 2]}}, "required": ["a"]}
    assert _accepts(number, '{"a":1}')
    assert not _accepts(number, '{"a":2}')
    pair = {"type": "object", "properties": {"a": {"const": {"x": 1, "y": 2}, "enum": [{"y": 2, "x": 1}]}},
            "required": ["a"]}
    assert _accepts(pair, '{"a":{"x":1,"y":2}}')


def test_lenient_schema_drops_a_number_format_on_a_string():
    # protobuf's JSON form of an int64 (Google's APIs): a string of digits, which compile_schema refuses by name
    schema = {"type": "object", "properties": {"id": {"type": "string", "format": "int64"},
                                               "n": {"type": ["string", "null"], "format": "int32"}}}
    lenient, dropped = lenient_schema(schema)
    assert dropped == ('$.properties.id.format "int64"', '$.properties.n.format "int32"')
    assert _accepts(lenient, '{"id":"12345678901234567890","n":null}')


def test_lenient_schema_drops_a_string_format_on_an_integer():
    lenient, dropped = lenient_schema({"type": "object", "properties": {"day": {"type": "integer",
                                                                               "format": "date"}}})
    assert dropped == ('$.properties.day.format "date"',)
    assert _accepts(lenient, '{"day":20240101}')


def test_lenient_schema_keeps_a_format_of_a_type_the_schema_has():
    for schema in ({"type": ["integer", "null"], "format": "int64"}, {"type": ["string", "null"], "format": "date"},
                   {"format": "int32"}, {"format": "date"}):
        assert lenient_schema(schema) == (schema, ())
