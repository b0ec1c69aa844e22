"""The JSON schema constraint (edgesdk/runtime/json_schema.py, edgesdk/runtime/json_pattern.py) over
generated schemas that mix its keywords: string lengths, patterns and formats (lengths beside them too),
integer and number bounds, multipleOf, llama.cpp's digit caps, uniqueItems, additionalProperties as a
schema, prefixItems, enum / const, anyOf, oneOf with a discriminator and $ref into $defs, nested in
objects and arrays. For each schema:

- no dead end: random byte walks (multi-byte UTF-8 characters and escapes among them) always have a
  byte that continues, until the value is complete;
- soundness: what a walk completes parses as JSON and satisfies the schema (checked here by a small
  validator of these keywords, reading a number both as its decimal and as the double a parser reads);
- completeness: instances built to satisfy the schema, written with the constraint's writing rules
  (properties in the schema's order, additional keys after them, no exponent in a bounded number,
  no escape in a pattern's string, enum values as their compact text, llama.cpp's spacing and digit
  caps), are taken byte by byte."""

from __future__ import annotations

import datetime
import ipaddress
import json
import random
import re
from decimal import MAX_EMAX, MIN_EMIN, Context, Decimal
from fractions import Fraction

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from edgesdk.runtime.json_schema import SchemaConstraint, SchemaError, compile_schema

BYTES = [bytes([b]) for b in range(256)]  # a "tokenizer" whose token i is byte i
WALK_LIMIT = 4000
BOUNDS = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf")
FINISH = b"abc0123-.:@xTZP"  # what a walk leans on to finish (digits, hex, a format's punctuation)

# ------------------------------------------------------------------------------------------ the checker


def _number(value) -> bool:
    return isinstance(value, (int, float, Decimal)) and not isinstance(value, bool)


def _exact(value) -> Decimal:
    """A number's exact value as a Decimal (a float's binary value, digit for digit): compared as Fraction compares,
    without making the Fraction of a walked 1E-99999999, whose denominator has a hundred million digits."""
    return value if isinstance(value, Decimal) else Decimal(value)


def _written(bound) -> Decimal:
    """A schema's bound as the decimal its JSON text writes (0.1, not the double nearest it)."""
    return Decimal(repr(bound)) if isinstance(bound, float) else Decimal(bound)


def _readings(value) -> list[tuple[Decimal, object]]:
    """(a number, how a bound reads beside it) as JSON Schema reads both (the decimals written) and as a
    double-parsing validator does (the doubles nearest them), each exact as a Decimal: a walk of another
    option (anyOf) may write 1e9999999999999999, whose Fraction is a number of 10**16 digits that CPython
    multiplies out for hours, in one C call no alarm interrupts."""
    double = float(value)  # an unbounded number's exponent may take it past the doubles
    return [(_exact(value), _written)] + ([(Decimal(double), lambda bound: Decimal(float(bound)))]
                                          if double not in (float("inf"), float("-inf")) else [])


def _multiple_of(value, factor) -> bool:
    """``value`` (a JSON number) is a whole multiple of ``factor`` (a schema's short decimal): modulo its
    numerator where the value's exponent reaches past what a Fraction holds (see :func:`_readings`)."""
    factor = Fraction(Decimal(repr(factor)))
    number = _exact(value)
    if abs(number.adjusted()) <= 1000:
        return (Fraction(number) / factor).denominator == 1
    sign, digits, exponent = number.as_tuple()
    whole = int("".join(map(str, digits)))  # value = whole * 10**exponent, value / factor = whole*10**e*q / p
    if exponent < 0:  # |value| below 10**-1000 and not zero: no multiple of a short decimal
        return whole == 0
    return whole * pow(10, exponent, factor.numerator) * factor.denominator % factor.numerator == 0


def _format_ok(fmt: str, text: str) -> bool:
    if fmt == "date":
        return re.fullmatch(r"\d{4}-\d\d-\d\d", text, re.ASCII) is not None and _parses(datetime.date.fromisoformat,
                                                                                          text)
    if fmt == "time":
        # a leap second only at 23:59:60 UTC (RFC 3339 section 5.7, the JSON Schema Test Suite's time.json)
        return re.fullmatch(r"([01]\d|2[0-3]):[0-5]\d:[0-5]\d(\.\d+)?([Zz]|[+-]([01]\d|2[0-3]):[0-5]\d)"
                            r"|23:59:60(\.\d+)?([Zz]|[+-]00:00)", text, re.ASCII) is not None
    if fmt == "uuid":
        return re.fullmatch(r"[0-9a-fA-F]{8}(-[0-9a-fA-F]{4}){3}-[0-9a-fA-F]{12}", text) is not None
    if fmt == "ipv4":
        return re.fullmatch(r"[0-9.]+", text) is not None and _parses(ipaddress.IPv4Address, text)
    if fmt == "ipv6":
        return "%" not in text and _parses(ipaddress.IPv6Address, text)
    if fmt == "hostname":
        label = r"[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
        return len(text) <= 253 and re.fullmatch(rf"{label}(\.{label})*", text) is not None
    if fmt == "email":
        local, at, domain = text.rpartition("@")
        return bool(at and local) and len(text) <= 254 and _format_ok("hostname", domain)
    raise AssertionError(fmt)


def _parses(reader, text: str) -> bool:
    try:
        reader(text)
    except ValueError:
        return False
    return True


def _key(value):
    """uniqueItems' equality: numbers by value (1 equals 1.0)."""
    if _number(value):  # by digits, trailing zeros dropped (an exponent's reach has no Fraction to make)
        number = Decimal(value) if isinstance(value, int) else Decimal(repr(value)) if isinstance(value, float) \
            else value
        return ("n", 0 if number.is_zero() else number.normalize(Context(prec=100, Emax=MAX_EMAX, Emin=MIN_EMIN)))
    return ("v", json.dumps(value, sort_keys=True, default=str))


def _valid(schema, value, root: dict) -> bool:  # noqa: C901, PLR0911, PLR0912 (one keyword a line)
    if schema is True or schema == {}:
        return True
    if "$ref" in schema:
        return _valid(root["$defs"][schema["$ref"].split("/")[-1]], value, root)
    if "const" in schema and value != schema["const"]:
        return False
    if "enum" in schema and not any(value == each and type(value) is type(each) or _number(value) and _number(each)
                                    and _exact(value) == _exact(each) for each in schema["enum"]):
        return False
    if "anyOf" in schema:
        return any(_valid(option, value, root) for option in schema["anyOf"])
    if "oneOf" in schema:
        return sum(_valid(option, value, root) for option in schema["oneOf"]) == 1
    kinds = schema.get("type")
    if kinds is not None:
        kinds = [kinds] if isinstance(kinds, str) else kinds
        if not any(_of_type(value, kind) for kind in kinds):
            return False
    if isinstance(value, dict):
        properties = schema.get("properties", {})
        if any(name not in value for name in schema.get("required", [])):
            return False
        extra = schema.get("additionalProperties", True)
        for name, each in value.items():
            if name in properties:
                if not _valid(properties[name], each, root):
                    return False
            elif extra is False or not _valid(extra, each, root):
                return False
    if isinstance(value, list):
        if len(value) < schema.get("minItems", 0) or len(value) > schema.get("maxItems", len(value)):
            return False
        prefix = schema.get("prefixItems", [])
        for index, each in enumerate(value):
            item = prefix[index] if index < len(prefix) else schema.get("items", True)
            if item is False or not _valid(item, each, root):
                return False
        if schema.get("uniqueItems") and len({_key(each) for each in value}) < len(value):
            return False
    if isinstance(value, str):
        length = len(value)
        if length < schema.get("minLength", 0) or length > schema.get("maxLength", length):
            return False
        if "pattern" in schema and re.search(schema["pattern"], value, re.ASCII) is None:
            return False
        if schema.get("format") in FORMAT_TEXTS and not _format_ok(schema["format"], value):
            return False
    if _number(value) and any(key in schema for key in BOUNDS):
        for reading, bound in _readings(value):
            if "minimum" in schema and reading < bound(schema["minimum"]) or \
                    "maximum" in schema and reading > bound(schema["maximum"]) or \
                    "exclusiveMinimum" in schema and reading <= bound(schema["exclusiveMinimum"]) or \
                    "exclusiveMaximum" in schema and reading >= bound(schema["exclusiveMaximum"]):
                return False
        if "multipleOf" in schema and not _multiple_of(value, schema["multipleOf"]):
            return False
    return True


def _of_type(value, kind: str) -> bool:
    if kind == "integer":
        return isinstance(value, int) and not isinstance(value, bool) or isinstance(value, Decimal) and (
            value.as_tuple().exponent >= 0 or value == value.to_integral_value())
    if kind == "number":
        return _number(value)
    types = {"string": str, "boolean": bool, "object": dict, "array": list, "null": type(None)}
    return isinstance(value, types[kind])


# ------------------------------------------------------------------------------------------ the schemas

# (pattern, a string of it): ECMA-262 patterns whose strings need no escape
PATTERNS = {
    r"^[a-z]{2,5}$": lambda rng: "".join(rng.choice("abcxyz") for _ in range(rng.randint(2, 5))),
    r"^\d{3}-\d{2,4}$": lambda rng: f"{rng.randint(0, 999):03d}-" + str(rng.randint(0, 9999)).zfill(rng.randint(2, 4)),
    r"ab+c": lambda rng: rng.choice(["", "é", "x😀 "]) + "a" + "b" * rng.randint(1, 3) + "c" + rng.choice(["", "漢z"]),
    r"^(foo|bar)?[0-9]*$": lambda rng: rng.choice(["", "foo", "bar"]) + str(rng.randint(0, 10 ** rng.randint(0, 5))),
    r"^[^a-c]+$": lambda rng: "".join(rng.choice("xyzé漢😀 !") for _ in range(rng.randint(1, 6))),
    r"^.{1,3}x$": lambda rng: "".join(rng.choice("pé😀.") for _ in range(rng.randint(1, 3))) + "x",
    r"^(?:[A-Z][a-z]*)(?: [A-Z][a-z]*){0,2}$": lambda rng: " ".join(
        rng.choice("ABQ") + "".join(rng.choice("ab") for _ in range(rng.randint(0, 3))) for _ in range(rng.randint(1, 3))),
}


def _date(rng) -> str:
    return (datetime.date(2000, 1, 1) + datetime.timedelta(days=rng.randint(-700000, 20000))).isoformat()


def _time(rng) -> str:
    """An RFC 3339 full-time; now and then a leap second, which comes at the end of a UTC day only (section 5.7)."""
    fraction = rng.choice(["", ".5", ".123456789"])
    if rng.random() < 0.1:
        return "23:59:60" + fraction + rng.choice(["Z", "z", "+00:00", "-00:00"])
    return f"{rng.randint(0, 23):02d}:{rng.randint(0, 59):02d}:{rng.randint(0, 59):02d}" + fraction \
        + rng.choice(["Z", "z", "+05:30", "-23:59"])


def _label(rng) -> str:
    return rng.choice("ab7") + "".join(rng.choice("xy-9") for _ in range(rng.randint(0, 4))) + rng.choice("cZ0") \
        if rng.random() < 0.7 else rng.choice("q4")


FORMAT_TEXTS = {
    "date": _date,
    "time": lambda rng: _time(rng),
    "uuid": lambda rng: str(__import__("uuid").UUID(int=rng.getrandbits(128))),
    "ipv4": lambda rng: ".".join(str(rng.randint(0, 255)) for _ in range(4)),
    "ipv6": lambda rng: str(ipaddress.IPv6Address(rng.getrandbits(128) >> rng.choice([0, 64, 100]))),
    "hostname": lambda rng: ".".join(_label(rng) for _ in range(rng.randint(1, 3))),
    "email": lambda rng: rng.choice(["a", "x.y", "o'k+1"]) + "@" + ".".join(_label(rng) for _ in range(rng.randint(1, 2))),
}
NAMES = ["a", "b", "name", "é", "x y", 'q"t', "n\\1"]


@st.composite
def _string(draw) -> dict:
    schema: dict = {"type": "string"}
    kind = draw(st.sampled_from(["plain", "pattern", "format"]))
    if kind == "pattern":
        schema["pattern"] = draw(st.sampled_from(sorted(PATTERNS)))
    elif kind == "format":
        schema["format"] = draw(st.sampled_from(sorted(FORMAT_TEXTS)))
    if draw(st.booleans()):
        schema["minLength"] = draw(st.integers(0, 6))
    if draw(st.booleans()):
        schema["maxLength"] = schema.get("minLength", 0) + draw(st.integers(0, 40 if kind == "format" else 6))
    return schema


BOUND_VALUES = st.one_of(st.integers(-1200, 1200), st.sampled_from([-12.5, -0.1, 0.1, 0.3, 2.5, 3.75, 99.99, 1e-3]))


@st.composite
def _numeric(draw) -> dict:
    kind = draw(st.sampled_from(["integer", "number"]))
    schema: dict = {"type": kind}
    low = draw(st.one_of(st.none(), BOUND_VALUES))
    if low is not None:
        schema["exclusiveMinimum" if draw(st.booleans()) else "minimum"] = low
    high = draw(st.one_of(st.none(), BOUND_VALUES))
    if high is not None:
        if low is not None and high < low + 3:
            high = low + draw(st.sampled_from([3, 17, 250.5]))
        schema["exclusiveMaximum" if draw(st.booleans()) else "maximum"] = high
    if draw(st.booleans()):
        schema["multipleOf"] = draw(st.sampled_from([1, 2, 3, 7] if kind == "integer" else [0.5, 0.25, 0.01, 2, 0.1]))
    return schema


SCALARS = st.one_of(st.sampled_from(["a", "é", "a\"b", "😀", "", "x\\y"]), st.integers(-5, 300),
                    st.sampled_from([2.5, -0.125, True, False, None]))


@st.composite
def _literal(draw) -> dict:
    values = draw(st.lists(SCALARS, min_size=1, max_size=4, unique_by=lambda v: (type(v), v)))
    return {"const": values[0]} if len(values) == 1 and draw(st.booleans()) else {"enum": values}


def _leaf(draw, defs: dict):
    return draw(st.one_of(_string(), _numeric(), _literal(), st.sampled_from(
        [{"type": "boolean"}, {"type": "null"}, {}, {"type": ["integer", "null"]}])))


def _schema(draw, depth: int, defs: dict):  # noqa: PLR0911 (one shape a line)
    if depth <= 0:
        return _leaf(draw, defs)
    shape = draw(st.sampled_from(["leaf", "object", "array", "tuple", "unique", "anyOf", "oneOf", "ref"]))
    if shape == "leaf":
        return _leaf(draw, defs)
    if shape == "object":
        names = draw(st.lists(st.sampled_from(NAMES), min_size=0, max_size=3, unique=True))
        schema: dict = {"type": "object", "properties": {name: _schema(draw, depth - 1, defs) for name in names}}
        schema["required"] = [name for name in names if draw(st.booleans())]
        extra = draw(st.sampled_from(["absent", "false", "true", "schema"]))
        if extra == "true":
            schema["additionalProperties"] = True
        elif extra == "false":
            schema["additionalProperties"] = False
        elif extra == "schema":
            schema["additionalProperties"] = _schema(draw, depth - 1, defs)
        return schema
    if shape == "array":
        schema = {"type": "array", "items": _schema(draw, depth - 1, defs)}
        low = draw(st.integers(0, 3))
        if low:
            schema["minItems"] = low
        if draw(st.booleans()):
            schema["maxItems"] = low + draw(st.integers(0, 3))
        return schema
    if shape == "tuple":
        prefix = [_schema(draw, depth - 1, defs) for _ in range(draw(st.integers(1, 3)))]
        schema = {"type": "array", "prefixItems": prefix}
        if draw(st.booleans()):
            schema["items"] = False
            schema["minItems"] = draw(st.integers(0, len(prefix)))
        elif draw(st.booleans()):
            schema["items"] = _schema(draw, depth - 1, defs)
        return schema
    if shape == "unique":
        items = draw(st.one_of(_numeric(), _literal(), st.just({"type": "string", "minLength": 1}),
                               st.just({"type": "boolean"})))
        return {"type": "array", "items": items, "uniqueItems": True, "minItems": draw(st.integers(0, 2)),
                "maxItems": draw(st.integers(2, 4))}
    if shape == "anyOf":
        return {"anyOf": [_schema(draw, depth - 1, defs) for _ in range(draw(st.integers(1, 3)))]}
    if shape == "oneOf":  # options told apart by a const tag (OpenAPI's discriminator)
        options = []
        for tag in ["cat", "dog", "cow"][:draw(st.integers(1, 3))]:
            option = {"type": "object", "properties": {"kind": {"const": tag}}, "required": ["kind"]}
            if draw(st.booleans()):
                option["properties"]["x"] = _schema(draw, depth - 1, defs)
                if draw(st.booleans()):
                    option["required"].append("x")
            options.append(option)
        return {"oneOf": options, "discriminator": {"propertyName": "kind"}}
    name = f"D{len(defs)}"
    defs[name] = None  # reserved before the body, so nested definitions get other names
    if draw(st.booleans()):  # a recursive definition: a tree of optional children
        defs[name] = {"type": "object", "properties": {"v": _schema(draw, depth - 1, defs),
                                                       "kids": {"type": "array", "items": {"$ref": f"#/$defs/{name}"},
                                                                "maxItems": 2}},
                      "required": ["v"]}
    else:
        defs[name] = _schema(draw, depth - 1, defs)
    return {"$ref": f"#/$defs/{name}"}


@st.composite
def schemas(draw) -> dict:
    defs: dict = {}
    value = _schema(draw, draw(st.integers(1, 3)), defs)
    root = {"type": "object", "properties": {"v": value}, "required": ["v"]}
    if defs:
        root["$defs"] = defs
    return root


# ------------------------------------------------------------------------------------------ the walks


def _feed(constraint: SchemaConstraint, data: bytes) -> int:
    """How many of ``data``'s bytes the constraint takes."""
    for taken, byte in enumerate(data):
        try:
            constraint.advance(byte)
        except ValueError:
            return taken
    return len(data)


def _walk(schema: dict, rng: random.Random) -> bytes:
    """A random walk over the bytes the constraint allows to a complete value; asserts that some byte
    always continues. Leans on escapes and multi-byte characters where they are allowed, then on
    closing brackets and quotes, so that walks end."""
    constraint = SchemaConstraint(BYTES, compile_schema(schema))
    out, cycle = bytearray(), 0
    while not constraint.complete:
        allowed = [byte for byte in range(256) if constraint.allows(byte)]
        assert allowed, f"stuck after {bytes(out)!r}"
        assert len(out) < WALK_LIMIT, f"no end in sight after {bytes(out)!r}"
        closing = [byte for byte in allowed if byte in b'"]}']
        special = [byte for byte in allowed if byte == ord("\\") or byte >= 0xC2]
        finishing = len(out) > 150
        roll = rng.random()
        # Finishing, half the bytes close and half are FINISH's in turn: inside a string whose pattern must
        # match somewhere ("ab+c"), ']' and '}' are string content, and at 0.8 closing bytes split FINISH's "abc" so
        # rarely that a quarter of such walks ran past WALK_LIMIT
        if closing and roll < (0.5 if finishing else 0.25):
            byte = rng.choice(closing)
        elif finishing:  # FINISH's bytes in turn, so that a pattern's "abc" or a format's digits come
            turn = next((turn for turn in range(cycle, cycle + len(FINISH)) if FINISH[turn % len(FINISH)] in allowed),
                        None)
            byte = rng.choice(allowed) if turn is None else FINISH[turn % len(FINISH)]
            cycle = cycle if turn is None else turn + 1
        elif special and roll < 0.45:
            byte = rng.choice(special)
        else:
            byte = rng.choice(allowed)
        constraint.advance(byte)
        out.append(byte)
    return bytes(out)


# ------------------------------------------------------------------------------------------ the instances


class Plain(str):
    """A pattern's or format's string: written as it is, no escape."""


class Num:
    """A number written as this exact text."""

    def __init__(self, text: str):
        self.text = text


def _space(rng) -> str:
    roll = rng.random()
    return "" if roll < 0.6 else " " if roll < 0.8 else "\n" + "".join(rng.choice(" \t") for _ in range(rng.randint(0, 20)))


def _escaped(text: str, rng) -> str:
    out = []
    for char in text:
        code = ord(char)
        roll = rng.random()
        if char in '"\\' or code < 0x20:
            out.append(json.dumps(char)[1:-1] if roll < 0.5 else f"\\u{code:04x}")
        elif roll < 0.2:
            out.append(json.dumps(char, ensure_ascii=True)[1:-1] if code > 0xFFFF else f"\\u{code:04X}")
        elif roll < 0.25 and char == "/":
            out.append("\\/")
        else:
            out.append(char)
    return '"' + "".join(out) + '"'


def _write(value, rng) -> str:
    if isinstance(value, Num):
        return value.text
    if isinstance(value, Plain):
        return '"' + str(value) + '"'
    if isinstance(value, tuple):  # an enum / const value: its compact text
        return json.dumps(value[0], ensure_ascii=False, separators=(",", ":"))
    if isinstance(value, str):
        return _escaped(value, rng)
    if isinstance(value, list):
        parts = [_space(rng) + _write(each, rng) + _space(rng) for each in value]
        return "[" + (",".join(parts) if parts else _space(rng)) + "]"
    if isinstance(value, dict):
        parts = [_space(rng) + json.dumps(name, ensure_ascii=False) + _space(rng) + ":" + _space(rng) + _write(each, rng) + _space(rng)
                 for name, each in value.items()]
        return "{" + (",".join(parts) if parts else _space(rng)) + "}"
    return json.dumps(value)


def _plain(value):
    """The JSON value an instance stands for."""
    if isinstance(value, Num):
        return json.loads(value.text, parse_float=Decimal)
    if isinstance(value, tuple):
        return value[0]
    if isinstance(value, list):
        return [_plain(each) for each in value]
    if isinstance(value, dict):
        return {name: _plain(each) for name, each in value.items()}
    return str(value) if isinstance(value, str) else value


class NoInstance(Exception):
    """The builder found no instance this time (a narrow range, a pattern's lengths)."""


def _instance(schema, rng, root: dict, depth: int = 0):  # noqa: C901, PLR0911, PLR0912 (one keyword a line)
    if depth > 12:
        raise NoInstance
    if schema is True or schema == {}:
        return rng.choice([1, "é\n", None, [True], {"k": 2.5}])
    if "$ref" in schema:
        return _instance(root["$defs"][schema["$ref"].split("/")[-1]], rng, root, depth + 1)
    if "const" in schema:
        return (schema["const"],)
    if "enum" in schema:
        return (rng.choice(schema["enum"]),)
    if "anyOf" in schema or "oneOf" in schema:
        options = list(schema.get("anyOf") or schema["oneOf"])
        rng.shuffle(options)
        for option in options:
            try:
                return _instance(option, rng, root, depth + 1)
            except NoInstance:
                continue
        raise NoInstance
    kind = schema["type"] if isinstance(schema["type"], str) else rng.choice(schema["type"])
    if kind == "null":
        return None
    if kind == "boolean":
        return rng.random() < 0.5
    if kind == "string":
        return _string_instance(schema, rng)
    if kind in ("integer", "number"):
        return _number_instance(schema, kind, rng)
    if kind == "object":
        value = {}
        for name, each in schema.get("properties", {}).items():
            if name in schema.get("required", []) or rng.random() < 0.5:
                value[name] = _instance(each, rng, root, depth + 1)
        extra = schema.get("additionalProperties", False)
        if extra is not False:
            for name in ["zz", "a b", "ключ", "aa"][:rng.randint(0, 2)]:
                if name not in schema.get("properties", {}):
                    value[name] = _instance(extra, rng, root, depth + 1)
        return value
    prefix = schema.get("prefixItems", [])
    items = schema.get("items", True)
    low = schema.get("minItems", 0)
    high = schema.get("maxItems", low + 3)
    if items is False:
        high = min(high, len(prefix))
    count = rng.randint(low, high)
    value = []
    for index in range(count):
        item = prefix[index] if index < len(prefix) else items
        for _ in range(30):
            each = _instance(item, rng, root, depth + 1)
            if not schema.get("uniqueItems") or _key(_plain(each)) not in {_key(_plain(v)) for v in value}:
                break
        else:
            raise NoInstance
        value.append(each)
    return value


def _string_instance(schema: dict, rng):
    for _ in range(50):
        if "pattern" in schema:
            text = Plain(PATTERNS[schema["pattern"]](rng))
        elif "format" in schema:
            text = Plain(FORMAT_TEXTS[schema["format"]](rng))
        else:
            text = "".join(rng.choice(["a", "é", "漢", "😀", '"', "\\", "\n", "/", " ", "\x01"])
                           for _ in range(rng.randint(schema.get("minLength", 0), schema.get("maxLength", 8))))
        if schema.get("minLength", 0) <= len(text) <= schema.get("maxLength", len(text)):
            return text
    raise NoInstance


def _number_instance(schema: dict, kind: str, rng):
    bounded = any(key in schema for key in BOUNDS)
    if not bounded:
        if kind == "integer":
            return Num(str(rng.choice([0, 7, -3, 10 ** 15, -(10 ** 16 - 1), rng.randint(-999, 999)])))
        return Num(rng.choice(["0", "-0.5", "1e5", "2.5E-3", "-1" + "0" * 15 + "." + "9" * 16 + "e+" + "9" * 16,
                               "0.0", "123.456"]))
    low = Fraction(schema.get("minimum", schema.get("exclusiveMinimum", -2000)))
    high = Fraction(schema.get("maximum", schema.get("exclusiveMaximum", 2000)))
    factor = Fraction(Decimal(repr(schema.get("multipleOf", 1 if kind == "integer" else 0.001))))
    first, last = -(-low // factor), high // factor
    for _ in range(50):
        value = Fraction(rng.randint(first, last)) * factor if first <= last else None
        if value is None:
            raise NoInstance
        text = str(value.numerator) if value.denominator == 1 else format(Decimal(value.numerator) / value.denominator, "f")
        if kind == "number" and value.denominator == 1 and rng.random() < 0.3:
            text += ".0"
        if _valid(schema, json.loads(text, parse_float=Decimal), {}):
            return Num(text)
    raise NoInstance


# ------------------------------------------------------------------------------------------ the properties


def _compiled(schema: dict) -> bool:
    try:
        compile_schema(schema)
    except SchemaError:
        return False
    return True


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much,
                                                                  HealthCheck.data_too_large])
@given(schema=schemas(), seed=st.integers(0, 2 ** 32 - 1))
def test_generated_schemas_walk_to_valid_values_and_take_their_instances(schema, seed):
    check_schema(schema, seed)


def check_schema(schema: dict, seed: int, walks: int = 3, instances: int = 4) -> None:
    if not _compiled(schema):
        return  # refused by name (uniqueItems over strings with a maxLength, bounds a pattern cannot meet, ...)
    rng = random.Random(seed)
    for _ in range(walks):
        text = _walk(schema, rng)
        value = json.loads(text, parse_float=Decimal)
        assert _valid(schema, value, schema), (json.dumps(schema), text)
    for _ in range(instances):
        try:
            instance = _instance(schema, rng, schema)
        except NoInstance:
            continue
        assert _valid(schema, _plain(instance), schema), (json.dumps(schema), instance)
        text = _write(instance, rng) + rng.choice(["", " ", "\n"])
        constraint = SchemaConstraint(BYTES, compile_schema(schema))
        taken = _feed(constraint, text.encode())
        assert taken == len(text.encode()), (json.dumps(schema), text.encode()[:taken], text)
        assert constraint.complete, (json.dumps(schema), text)


def test_a_unique_number_item_with_a_far_exponent_is_compared_without_expanding_it():
    """llama.cpp's caps let a number's exponent have 16 digits; a uniqueItems array of numbers compared
    1e9999999999999999 as an exact fraction, a number of 10**16 digits, and never answered."""
    schema = {"type": "object", "properties": {"v": {"type": "array", "items": {"type": "number"}, "uniqueItems": True}},
              "required": ["v"]}
    duplicate = b'{"v":[1e9999999999999999,10E+9999999999999998'  # the same number, written another way
    constraint = SchemaConstraint(BYTES, compile_schema(schema))
    # its last exponent digit (the 16th, the cap) is refused: no byte could follow it
    assert _feed(constraint, duplicate) == len(duplicate) - 1
    assert constraint.allows(ord("7"))
    distinct = b'{"v":[1e9999999999999999,0.1e9999999999999999,-1e9999999999999999,2e-9999999999999999,1E+1]}'
    constraint = SchemaConstraint(BYTES, compile_schema(schema))
    assert _feed(constraint, distinct) == len(distinct)
    assert constraint.complete
