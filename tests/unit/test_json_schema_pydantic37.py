"""JSON schemas as pydantic v2 (``model_json_schema()``) and the openai client's strict mode
(``to_strict_json_schema``) write them, followed by the JSON schema constraint
(edgesdk/runtime/json_schema.py): which compile and which are refused with what message; for those
that compile, every instance pydantic dumps is taken byte by byte, and random walks through the
constraint complete into JSON that pydantic validates."""

from __future__ import annotations

import datetime
import decimal
import enum
import json
import random
import uuid
from typing import Any, Literal

import pytest
from openai.lib._pydantic import to_strict_json_schema
from pydantic import BaseModel, ConfigDict, Field, confloat, conint, constr

from edgesdk.runtime.json_schema import SchemaConstraint, SchemaError, compile_schema

BYTES = [bytes([b]) for b in range(256)]  # a "tokenizer" whose token i is byte i


class Color(str, enum.Enum):
    red = "red"
    green = "green"


class Level(enum.IntEnum):
    low = 1
    high = 2


class Scalars(BaseModel):
    s: str
    i: int
    f: float
    b: bool
    n: None


class Optionals(BaseModel):
    a: int | None = None
    b: str | None


class Cat(BaseModel):
    kind: Literal["cat"]
    lives: int


class Dog(BaseModel):
    kind: Literal["dog"]
    bark: str


class PetUnion(BaseModel):
    pet: Cat | Dog


class PetDiscriminated(BaseModel):
    pet: Cat | Dog = Field(discriminator="kind")


class Literals(BaseModel):
    mode: Literal["a", "b", 3]
    color: Color
    level: Level


class Sequences(BaseModel):
    numbers: list[int]
    pair: tuple[int, str]
    floats: tuple[float, ...]
    empty: tuple[()] = ()


class Sets(BaseModel):
    tags: set[str]


class Dicts(BaseModel):
    counts: dict[str, int]
    anything: dict[str, Any] = {}


class Inner(BaseModel):
    x: int


class Nested(BaseModel):
    inner: Inner
    inners: list[Inner]
    by_name: dict[str, Inner]


class Tree(BaseModel):
    value: int
    children: list[Tree] = []


class Bounded(BaseModel):
    a: int = Field(ge=0, le=10)
    b: float = Field(gt=0.0, lt=1.0)
    d: str = Field(min_length=2, max_length=5)
    e: str = Field(pattern=r"^[a-z]+$")


class MultipleOf(BaseModel):
    c: int = Field(multiple_of=5)


class Constrained(BaseModel):
    a: confloat(ge=-1.5, le=2.5)
    b: conint(gt=0)
    c: constr(min_length=1, max_length=3)
    ge0: float = Field(ge=0.0)
    prob: float = Field(ge=0, le=1)


class Formats(BaseModel):
    d: datetime.date
    dt: datetime.datetime
    t: datetime.time
    u: uuid.UUID
    by: bytes


class Decimals(BaseModel):
    dec: decimal.Decimal


class Annotated_(BaseModel):
    model_config = ConfigDict(json_schema_extra={"examples": [{"a": 1}]}, title="Annotated")
    a: int = Field(default=3, description="a thing", title="A")
    old: str = Field("x", deprecated=True)


class Extra(BaseModel):
    model_config = ConfigDict(extra="allow")
    a: int


class Forbid(BaseModel):
    model_config = ConfigDict(extra="forbid")
    a: int


# None: compiles; a string: refused with a message that holds it
EXPECTED = {
    Scalars: None, Optionals: None, PetUnion: None, PetDiscriminated: None, Literals: None, Sequences: None,
    Sets: None, Dicts: None, Nested: None, Tree: None, Bounded: None,
    MultipleOf: None, Constrained: None, Formats: None, Decimals: None,
    Annotated_: None,
    Extra: None, Forbid: None,
}
COMPILED = [model for model, refused in EXPECTED.items() if refused is None]
# pydantic's schema of a Decimal is a number or any string; pydantic takes only strings that write a number
LOOSER_THAN_PYDANTIC = {Decimals}
FORMS = {"pydantic": lambda model: model.model_json_schema(), "openai-strict": to_strict_json_schema}


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("model", EXPECTED, ids=lambda m: m.__name__)
def test_what_compiles_and_what_is_refused(model, form):
    schema = FORMS[form](model)
    if EXPECTED[model] is None:
        compile_schema(schema)
    else:
        with pytest.raises(SchemaError, match=EXPECTED[model]):
            compile_schema(schema)


def _float(rng: random.Random, low: float = -1e6, high: float = 1e6) -> float:
    return round(rng.uniform(low, high), rng.randint(0, 6))  # within llama.cpp's 16 + 16 digits


def _text(rng: random.Random, low: int = 0, high: int = 8) -> str:
    return "".join(rng.choice('ab Z\u00e9\u6771"\\\n\t/\U0001f600') for _ in range(rng.randint(low, high)))


def _instance(model, rng: random.Random) -> dict:
    """A random instance of ``model`` (as the keyword arguments pydantic validates)."""
    def tree(depth: int) -> dict:
        return {"value": rng.randint(-5, 5), "children": [tree(depth + 1) for _ in range(rng.randint(0, 2 - depth))]}

    pet = rng.choice([{"kind": "cat", "lives": rng.randint(0, 9)}, {"kind": "dog", "bark": _text(rng)}])
    offset = datetime.timezone(datetime.timedelta(minutes=rng.randint(-1439, 1439)))
    return {
        Scalars: lambda: {"s": _text(rng), "i": rng.randint(-10**15, 10**15), "f": _float(rng), "b": rng.random() < .5,
                          "n": None},
        Optionals: lambda: {"a": rng.choice([None, rng.randint(-9, 9)]), "b": rng.choice([None, _text(rng)])},
        PetUnion: lambda: {"pet": pet},
        PetDiscriminated: lambda: {"pet": pet},
        Literals: lambda: {"mode": rng.choice(["a", "b", 3]), "color": rng.choice(list(Color)),
                           "level": rng.choice(list(Level))},
        Sequences: lambda: {"numbers": [rng.randint(-99, 99) for _ in range(rng.randint(0, 4))],
                            "pair": (rng.randint(0, 9), _text(rng)),
                            "floats": tuple(_float(rng) for _ in range(rng.randint(0, 3)))},
        Dicts: lambda: {"counts": {_text(rng): rng.randint(0, 9) for _ in range(rng.randint(0, 3))},
                        "anything": {_text(rng): rng.choice([None, 1.5, [1, "x"], {"k": True}])
                                     for _ in range(rng.randint(0, 2))}},
        Nested: lambda: {"inner": {"x": 1}, "inners": [{"x": rng.randint(0, 9)} for _ in range(rng.randint(0, 3))],
                         "by_name": {_text(rng, 1): {"x": 2} for _ in range(rng.randint(0, 2))}},
        Tree: lambda: tree(0),
        Bounded: lambda: {"a": rng.randint(0, 10), "b": rng.choice([1e-5, 0.5, 0.999999, round(rng.random(), 4) or .1]),
                          "d": _text(rng, 2, 5), "e": "".join(rng.choice("xyz") for _ in range(rng.randint(1, 5)))},
        Constrained: lambda: {"a": rng.choice([-1.5, 2.5, _float(rng, -1.5, 2.5)]), "b": rng.randint(1, 10**15),
                              "c": _text(rng, 1, 3), "ge0": rng.choice([0.0, -0.0, _float(rng, 0)]),
                              "prob": rng.choice([0, 1, 0.5, _float(rng, 0, 1)])},
        Formats: lambda: {"d": datetime.date(rng.randint(1, 9999), 2, rng.randint(1, 28)),
                          "dt": datetime.datetime(2024, 2, 29, 23, 59, 59, rng.randint(0, 999999), offset),
                          "t": datetime.time(rng.randint(0, 23), 0, 1, tzinfo=offset),
                          "u": uuid.UUID(int=rng.getrandbits(128)), "by": _text(rng).encode()},
        Decimals: lambda: {"dec": decimal.Decimal(str(_float(rng)))},
        Annotated_: lambda: {"a": rng.randint(0, 3), "old": _text(rng)},
        Extra: lambda: {"a": 1, **{"x" + _text(rng): rng.choice([1, "s", None]) for _ in range(rng.randint(0, 2))}},
        Forbid: lambda: {"a": rng.randint(0, 9)},
        Sets: lambda: {"tags": {_text(rng) for _ in range(rng.randint(0, 4))}},
        MultipleOf: lambda: {"c": 5 * rng.randint(-10**9, 10**9)},
    }[model]()


def _takes(schema: dict, text: bytes) -> bool:
    constraint = SchemaConstraint(BYTES, compile_schema(schema))
    for byte in text:
        if not constraint.allows(byte):
            return False
        constraint.advance(byte)
    return constraint.complete


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("model", COMPILED, ids=lambda m: m.__name__)
def test_every_instance_pydantic_dumps_is_taken_byte_by_byte(model, form):
    schema = FORMS[form](model)
    rng = random.Random(3)
    for _ in range(25):
        text = model.model_validate(_instance(model, rng)).model_dump_json().encode()
        assert _takes(schema, text), text


def _walk(schema: dict, rng: random.Random, limit: int = 400) -> bytes | None:
    """A random walk over the bytes the constraint allows (None: not complete within ``limit`` bytes); it
    leans towards closing quotes and brackets so that walks end. It writes no exponent (no e or E after a
    digit): past a double's range one reads as infinity, which the schema allows (llama.cpp's grammar too:
    16 exponent digits) and pydantic's Decimal refuses."""
    alphabet = list(range(0x20, 0x7F)) + [0x0A, 0xC3, 0xA9]
    closers = [ord(c) for c in '"]}']
    constraint = SchemaConstraint(BYTES, compile_schema(schema))
    data = bytearray()
    while not constraint.complete:
        allowed = [b for b in alphabet if constraint.allows(b)]
        assert allowed, f"stuck after {bytes(data)!r}: no byte continues"
        if data[-1:].isdigit() and len(allowed) > 2:
            allowed = [b for b in allowed if b not in b"eE"]
        ending = [b for b in allowed if b in closers]
        byte = rng.choice(ending) if ending and rng.random() < 0.35 else rng.choice(allowed)
        constraint.advance(byte)
        data.append(byte)
        if len(data) >= limit:
            return None
    return bytes(data)


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("model", [m for m in COMPILED if m not in LOOSER_THAN_PYDANTIC], ids=lambda m: m.__name__)
def test_random_walks_complete_into_json_pydantic_validates(model, form):
    schema = FORMS[form](model)
    rng = random.Random(11)
    completed = 0
    for _ in range(20):
        text = _walk(schema, rng)
        if text is None:
            continue
        completed += 1
        # RFC 3339 allows a leap second (:60), which Python's datetime, and so pydantic, cannot hold
        model.model_validate_json(text.replace(b":60", b":59"))
    assert completed >= 10


# ------------------------------------------------------------------------------ number bounds


def _wrapped(schema: dict) -> dict:
    return {"type": "object", "properties": {"v": schema}, "required": ["v"]}


NUMBER_BOUNDS = [
    {"minimum": 0.1, "exclusiveMaximum": 1.0},
    {"exclusiveMinimum": 0},
    {"minimum": -1.5, "maximum": 2.5},
    {"maximum": -0.25},
    {"exclusiveMinimum": -3, "exclusiveMaximum": -2.999},
    {"minimum": 7, "maximum": 7},
    {"minimum": 12.5},
]


def _number_texts(rng: random.Random) -> list[str]:
    texts = ["0", "-0", "0.0", "-0.0", "1", "1.0", "0.1", "0.10", "7", "7.0", "7.00000000000001", "12.5", "12.4999",
             "-0.25", "-0.2500000000000001", "-3", "-2.9995", "-2.999", "2.5", "-1.5", "-1.5000000000000001",
             "0.9999999999999999", "0.0000000000000001", "1e0", "1E-1", "01", "1.", ".5", "-"]
    for _ in range(400):
        digits = rng.randint(0, 3)
        text = f"{rng.uniform(-15, 15):.{digits}f}"
        texts.append(text)
    return texts


def _double_and_decimal_within(bounds: dict, text: str) -> bool:
    exact, double = decimal.Decimal(text), float(text)
    for name, value in bounds.items():
        bound = decimal.Decimal(repr(value))
        for number, limit in ((exact, bound), (double, value)):
            if not {"minimum": number >= limit, "maximum": number <= limit, "exclusiveMinimum": number > limit,
                    "exclusiveMaximum": number < limit}[name]:
                return False
    return True


def _json_number_without_exponent(text: str) -> bool:
    digits = text.removeprefix("-")
    integral, _, fraction = digits.partition(".")
    return (integral.isdigit() and (integral == "0" or integral[0] != "0") and len(integral) <= 16
            and ("." not in digits or fraction.isdigit() and len(fraction) <= 16))


@pytest.mark.parametrize("bounds", NUMBER_BOUNDS, ids=lambda b: json.dumps(b))
def test_a_bounded_number_is_taken_exactly_when_it_lies_within_its_bounds(bounds):
    schema = _wrapped({"type": "number", **bounds})
    for text in _number_texts(random.Random(5)):
        expected = _json_number_without_exponent(text) and _double_and_decimal_within(bounds, text)
        assert _takes(schema, f'{{"v":{text}}}'.encode()) == expected, (bounds, text)


def test_a_bound_is_read_as_a_decimal_and_as_the_double_a_parser_compares():
    bound = 1234567.123456789
    # above the bound as a decimal, but the nearest double is the bound itself: a float comparison refuses it
    assert float("1234567.12345678906") == bound
    assert float("1234567.12345678907") > bound
    above = _wrapped({"type": "number", "exclusiveMinimum": bound})
    assert not _takes(above, b'{"v":1234567.12345678906}')
    assert _takes(above, b'{"v":1234567.12345678907}')
    # below it as a decimal, the bound as a double: JSON Schema's reading refuses it
    assert float("1234567.12345678885") == bound
    at_least = _wrapped({"type": "number", "minimum": bound})
    assert not _takes(at_least, b'{"v":1234567.12345678885}')
    assert _takes(at_least, b'{"v":1234567.123456789}')


@pytest.mark.parametrize("bounds", NUMBER_BOUNDS, ids=lambda b: json.dumps(b))
def test_no_way_into_a_bounded_number_is_a_dead_end(bounds):
    schema = _wrapped({"type": "number", **bounds})
    alphabet = list(b"-0123456789}.eE+")
    rng = random.Random(9)
    for _ in range(80):
        constraint = SchemaConstraint(BYTES, compile_schema(schema))
        data = bytearray(b'{"v":')
        for byte in data:
            constraint.advance(byte)
        while not constraint.complete:
            allowed = [b for b in alphabet if constraint.allows(b)]
            assert allowed, f"stuck after {bytes(data)!r}"
            assert not set(allowed) & set(b"eE+"), bytes(data)  # no exponent in a bounded number
            byte = ord("}") if ord("}") in allowed and rng.random() < 0.25 else rng.choice(allowed)
            constraint.advance(byte)
            data.append(byte)
        assert _double_and_decimal_within(bounds, str(json.loads(data)["v"])), bytes(data)


@pytest.mark.parametrize(("schema", "message"), [
    ({"type": "number", "exclusiveMinimum": 0, "exclusiveMaximum": 1e-17}, "no number of at most 16 digits"),
    ({"type": "number", "minimum": 1e17}, "no number of at most 16 digits"),
    ({"type": "number", "minimum": 2, "maximum": 1}, "no number of at most 16 digits"),
    ({"type": "number", "minimum": "0"}, r"minimum must be a finite number, got \"0\""),
])
def test_number_bounds_that_leave_nothing_are_refused_by_name(schema, message):
    with pytest.raises(SchemaError, match=message):
        compile_schema(_wrapped(schema))


def test_a_type_list_bounds_its_integers_and_its_numbers():
    schema = _wrapped({"type": ["integer", "number"], "minimum": 0.5, "maximum": 3})
    assert [_takes(schema, f'{{"v":{t}}}'.encode()) for t in ("0", "1", "0.5", "3", "3.0", "3.01", "-1")] == \
        [False, True, True, True, True, False, False]


# ------------------------------------------------------------------------------ additionalProperties


def test_additional_properties_take_keys_of_their_own_after_the_listed_ones():
    schema = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "string"}},
              "required": ["a"], "additionalProperties": {"type": "boolean"}}
    assert _takes(schema, b'{"a":1}')
    assert _takes(schema, b'{"a":1,"b":"x","c":true,"dd":false}')
    assert _takes(schema, b'{"a":1,"c":true}')
    assert _takes(schema, b'{"a":1,"\\"q\\u00e9":true}')
    assert not _takes(schema, b'{"a":1,"c":1}')  # the value of a key of its own is of additionalProperties
    assert not _takes(schema, b'{"c":true,"a":1}')  # not before a required property
    assert not _takes(schema, b'{"a":1,"c":true,"b":"x"}')  # nor before a listed one
    for key in (b'"b"', b'"\\u0062"', b'"a"'):  # a listed name, however it is written, is not a key of its own
        assert not _takes(schema, b'{"a":1,' + key + b":true}"), key
    assert _takes(schema, b'{"a":1,"bb":true,"\\u0062c":false}')


def test_additional_properties_true_and_a_dict_alone():
    assert _takes({"type": "object", "additionalProperties": True}, b'{"k":[1,{"x":null}],"":"v"}')
    counts = {"type": "object", "additionalProperties": {"type": "integer", "minimum": 0}}
    assert _takes(counts, b"{}")
    assert _takes(counts, b'{"x": 1, "y": 0}')
    assert not _takes(counts, b'{"x":-1}')


def test_a_key_long_enough_to_be_no_listed_name_is_still_checked_when_escaped():
    name = "\U0001f600k"  # an astral character: a surrogate pair of \\u escapes
    schema = {"type": "object", "properties": {name: {"type": "integer"}}, "additionalProperties": {"type": "string"}}
    assert _takes(schema, json.dumps({name: 1}, ensure_ascii=False).encode())
    assert not _takes(schema, json.dumps({name: "x"}, ensure_ascii=False).encode())
    assert not _takes(schema, b'{"\\ud83d\\ude00\\u006b":"x"}')  # the listed name, escaped
    assert _takes(schema, b'{"\\ud83d\\ude00\\u006bk":"x"}')


# ------------------------------------------------------------------------------ prefixItems


def test_prefix_items_type_a_tuple_s_positions():
    pair = {"type": "array", "prefixItems": [{"type": "integer"}, {"type": "string"}], "items": False}
    assert _takes(pair, b'[1,"a"]')
    assert _takes(pair, b"[1]")
    assert _takes(pair, b"[]")
    assert not _takes(pair, b'["a",1]')
    assert not _takes(pair, b'[1,"a",2]')
    rest = {"type": "array", "prefixItems": [{"type": "string"}], "items": {"type": "integer"}, "minItems": 2}
    assert _takes(rest, b'["a",1,2,3]')
    assert not _takes(rest, b'["a"]')
    assert not _takes(rest, b'["a","b"]')
    anything = {"type": "array", "prefixItems": [{"const": 1}]}
    assert _takes(anything, b'[1,"x",null]')
    assert not _takes(anything, b"[2]")


@pytest.mark.parametrize(("schema", "message"), [
    ({"type": "array", "prefixItems": [{"type": "integer"}], "items": False, "minItems": 2},
     "minItems 2 asks for more items than its 1 prefixItems"),
    # draft 2019-09's tuple (items an array) is read as prefixItems (tests/unit/test_grammar45.py); both at once not
    ({"type": "array", "items": [{"type": "integer"}], "prefixItems": []}, "prefixItems beside an array items"),
    # one schema is every item's, as llama.cpp reads it (tests/unit/test_json51.py), but not beside items
    ({"type": "array", "prefixItems": "integer"}, "prefixItems must be an array of schemas"),
    ({"type": "array", "prefixItems": {"type": "integer"}, "items": {}}, "prefixItems is one schema"),
])
def test_arrays_that_cannot_be_followed_are_refused_by_name(schema, message):
    with pytest.raises(SchemaError, match=message):
        compile_schema(schema)


def test_a_recursion_through_a_required_prefix_item_has_no_end():
    schema = {"$defs": {"T": {"type": "array", "prefixItems": [{"$ref": "#/$defs/T"}], "minItems": 1}},
              "$ref": "#/$defs/T"}
    with pytest.raises(SchemaError, match="no finite value"):
        compile_schema(schema)


# ------------------------------------------------------------------------------ annotations and formats


def test_a_discriminator_annotates_a_one_of_and_only_that():
    schema = PetDiscriminated.model_json_schema()
    assert _takes(schema, b'{"pet":{"kind":"dog","bark":"woof"}}')
    assert not _takes(schema, b'{"pet":{"kind":"dog","lives":3}}')
    with pytest.raises(SchemaError, match="keyword 'discriminator' is not supported"):
        compile_schema({"type": "object", "discriminator": {"propertyName": "kind"}})


def test_binary_and_password_formats_take_any_string():
    for name in ("binary", "password"):
        schema = _wrapped({"type": "string", "format": name, "maxLength": 3})
        assert _takes(schema, b'{"v":"a\\"\\u00e9"}')
        assert not _takes(schema, b'{"v":"abcd"}')
    with pytest.raises(SchemaError, match="format \"json-pointer\" is not supported"):
        compile_schema(_wrapped({"type": "string", "format": "json-pointer"}))


def test_a_date_s_day_is_one_its_month_has():
    schema = _wrapped({"type": "string", "format": "date"})
    for text, valid in [("2024-02-29", True), ("2023-02-29", False), ("2000-02-29", True), ("1900-02-29", False),
                        ("2023-02-28", True), ("2023-04-31", False), ("2023-04-30", True), ("2023-12-31", True),
                        ("2023-02-30", False), ("0000-01-01", False), ("0001-01-01", True), ("0400-02-29", True)]:
        assert _takes(schema, f'{{"v":"{text}"}}'.encode()) == valid, text
    date_time = _wrapped({"type": "string", "format": "date-time"})
    assert not _takes(date_time, b'{"v":"2023-02-29T00:00:00Z"}')
    assert _takes(date_time, b'{"v":"2024-02-29T00:00:00Z"}')
