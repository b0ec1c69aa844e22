"""Review tests for the JSON schema constraint (edgesdk/runtime/json_schema.py): definitions reached through
other definitions, cycles, values JSON cannot hold, and the constraint's agreement with its schema."""

from __future__ import annotations

from edgesdk.runtime.json_schema import SchemaConstraint, compile_schema

BYTES = [bytes([b]) for b in range(256)]  # a "tokenizer" whose token i is byte i


def _feed(schema, text: str) -> SchemaConstraint | None:
    """The constraint after ``text`` (None: it refused a byte)."""
    constraint = SchemaConstraint(BYTES, compile_schema(schema))
    for byte in text.encode():
        if not constraint.allows(byte):
            return None
        constraint.advance(byte)
    return constraint


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
