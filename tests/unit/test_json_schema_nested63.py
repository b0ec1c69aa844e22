"""Nested unions whose options share their first keys (edgesdk/runtime/json_schema.py): each level kept one live
parse per option for every parse of the level above, so past MAX_WAYS of them (7 levels of a union of two objects)
the last were dropped and valid answers refused. Ways that differ only below their top frames are one way now."""

from __future__ import annotations

import json
import random

import pytest

from edgesdk.runtime.json_schema import MAX_WAYS, SchemaConstraint, compile_schema

BYTES = [bytes([b]) for b in range(256)]  # a "tokenizer" whose token i is byte i
TAGS = {"type": "array", "items": {"enum": ["a", "b", "c"]}, "uniqueItems": True}
# pydantic's shape of a recursive union of two models that share their first properties
NESTED = {"$defs": {
    "Left": {"type": "object", "properties": {"kid": {"$ref": "#/$defs/Node"}, "tags": TAGS, "left": {"type": "string"}},
             "required": ["kid", "left"], "additionalProperties": False},
    "Right": {"type": "object", "properties": {"kid": {"$ref": "#/$defs/Node"}, "tags": TAGS,
                                               "right": {"type": "integer", "minimum": 0}},
              "required": ["kid", "right"], "additionalProperties": False},
    "Node": {"anyOf": [{"$ref": "#/$defs/Left"}, {"$ref": "#/$defs/Right"}, {"type": "null"}]}},
    "type": "object", "properties": {"root": {"$ref": "#/$defs/Node"}}, "required": ["root"],
    "additionalProperties": False}
# the same through arrays: a list of nodes at each level
LISTED = {"$defs": {
    "A": {"type": "object", "properties": {"kids": {"type": "array", "items": {"$ref": "#/$defs/Node"}},
                                           "a": {"type": "string"}}, "required": ["kids", "a"]},
    "B": {"type": "object", "properties": {"kids": {"type": "array", "items": {"$ref": "#/$defs/Node"}},
                                           "b": {"type": "number"}}, "required": ["kids", "b"]},
    "Node": {"oneOf": [{"$ref": "#/$defs/A"}, {"$ref": "#/$defs/B"}]}},
    "type": "array", "items": {"$ref": "#/$defs/Node"}}


def _constraint(schema: dict, text: str) -> SchemaConstraint | None:
    constraint = SchemaConstraint(BYTES, compile_schema(schema))
    for byte in text.encode():
        if not constraint.allows(byte):
            return None
        constraint.advance(byte)
    return constraint


def _accepts(schema: dict, text: str) -> bool:
    constraint = _constraint(schema, text)
    return constraint is not None and constraint.complete


def _allowed(constraint: SchemaConstraint) -> set[str]:
    return {chr(byte) for byte in range(256) if constraint._feed(constraint.ways, BYTES[byte])}


def _node(depth: int, rng: random.Random):
    if depth == 0:
        return None
    node = {"kid": _node(depth - 1, rng)}
    if rng.random() < 0.5:
        node["tags"] = rng.sample(["a", "b", "c"], rng.randint(0, 3))
    if rng.random() < 0.5:
        node["left"] = rng.choice(["", "x", "left"])
    else:
        node["right"] = rng.choice([0, 7, 120])
    return node


def _valid(node) -> bool:
    """The test's own reading of NESTED's Node."""
    if node is None:
        return True
    if not isinstance(node, dict) or list(node)[:1] != ["kid"] or not _valid(node["kid"]):
        return False
    rest = list(node)[1:]
    if rest[:1] == ["tags"]:
        tags = node["tags"]
        if not isinstance(tags, list) or len(set(tags)) != len(tags) or not set(tags) <= {"a", "b", "c"}:
            return False
        rest = rest[1:]
    if rest == ["left"]:
        return isinstance(node["left"], str)
    return rest == ["right"] and type(node["right"]) is int and node["right"] >= 0


def _innermost(node) -> dict:
    while node["kid"] is not None:
        node = node["kid"]
    return node


@pytest.mark.parametrize("depth", [1, 6, 8, 12, 40])
def test_a_union_of_objects_that_share_their_first_key_is_followed_at_any_depth(depth):
    text = json.dumps({"root": _node(depth, random.Random(depth))})
    assert _accepts(NESTED, text)


def test_the_live_ways_stay_few_however_deep_the_union_nests():
    prefix = '{"root": ' + '{"kid": ' * 60
    constraint = _constraint(NESTED, prefix)
    assert constraint is not None
    assert len(constraint.ways) < MAX_WAYS  # 2 ** 60 stacks, shared
    # every option is still open at the bottom: null, or either object
    assert _allowed(constraint) == {"n", "{"}  # after the one space written, no more spacing


def test_every_key_the_schema_allows_is_still_allowed_deep_inside_the_union():
    inner = '{"root": ' + '{"kid": ' * 12 + 'null, "'
    assert _allowed(_constraint(NESTED, inner)) == {"t", "l", "r"}
    # the outermost level, its 11 levels inside closed: either option's keys may still come
    outer = _constraint(NESTED, inner + 'left": "x"}' + ', "right": 3}' * 10 + ', "')
    assert _allowed(outer) == {"t", "l", "r"}


@pytest.mark.parametrize("seed", range(6))
def test_deep_answers_are_accepted_exactly_when_valid(seed):
    rng = random.Random(seed)
    node = _node(rng.randint(8, 14), rng)
    assert _accepts(NESTED, json.dumps({"root": node}))
    broken = json.loads(json.dumps(node))
    inner = _innermost(broken)
    mutation = seed % 3
    if mutation == 0:  # a string where the Right option wants an integer, or the reverse
        if "left" in inner:
            inner["left"] = 5
        else:
            inner["right"] = "5"
    elif mutation == 1:  # a repeated tag
        inner.pop("left", None), inner.pop("right", None)
        inner["tags"], inner["left"] = ["b", "b"], "x"
    else:  # both options' last keys
        inner["left"], inner["right"] = "x", 1
    assert not _valid(broken)
    assert not _accepts(NESTED, json.dumps({"root": broken}))


def test_a_nested_union_closes_at_every_level_only_where_its_required_key_came():
    deep = '{"root": ' + '{"kid": ' * 10 + "null"
    closed = deep + ', "left": "x"}' * 5 + ', "right": 1}' * 5 + "}"
    assert _accepts(NESTED, closed)
    assert not _accepts(NESTED, deep + ', "left": "x"}' * 5 + "}" * 5 + "}")
    done = _constraint(NESTED, closed)
    assert done.complete
    assert _allowed(done) == {" ", "\n"}  # trailing spacing only


def test_a_union_nested_through_arrays_is_followed_at_any_depth():
    text = "[" + '{"kids": [' * 10 + "]" + ', "a": "x"}]' * 5 + ', "b": 1.5}]' * 5
    assert _accepts(LISTED, text)
    assert not _accepts(LISTED, "[" + '{"kids": [' * 10 + "]" + ', "a": 1}]' * 5 + ', "b": 1.5}]' * 5)
    constraint = _constraint(LISTED, "[" + '{"kids": [' * 10 + '], "')
    assert _allowed(constraint) == {"a", "b"}


def test_a_union_spelled_out_at_each_level_is_followed_past_max_ways():
    # no $ref: each level's objects hold the level below inline, a node for every parse
    value = {"type": "string"}
    depth = 8
    for _ in range(depth):
        value = {"anyOf": [
            {"type": "object", "properties": {"a": value, "b": {"type": "string"}}, "required": ["a", "b"]},
            {"type": "object", "properties": {"a": value, "c": {"type": "string"}}, "required": ["a", "c"]}]}
    schema = {"type": "object", "properties": {"x": value}, "required": ["x"]}
    assert 2 ** depth > MAX_WAYS
    text = '{"x": ' + '{"a": ' * depth + '"leaf"' + "".join(f', "{"cb"[level % 2]}": "z"}}' for level in range(depth)) \
        + "}"
    assert _accepts(schema, text)
