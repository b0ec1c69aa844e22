"""JSON schema keywords that pydantic and the openai client write (edgesdk/runtime/json_schema.py,
edgesdk/runtime/json_pattern.py): the formats uri, email, ipv4, ipv6, hostname, duration and path;
minLength / maxLength beside a pattern or format; multipleOf; uniqueItems. Each is checked byte by byte,
and random walks over the bytes the constraint allows never get stuck and end in values that Python's
own parsers and pydantic accept."""

from __future__ import annotations

import datetime
import ipaddress
import json
import random
import re
import urllib.parse
from decimal import Decimal
from email.errors import HeaderParseError
from email.headerregistry import Address
from fractions import Fraction
from typing import Annotated

import pytest
from pydantic import AnyUrl, Field, HttpUrl, TypeAdapter

from edgesdk.runtime.json_pattern import FORMATS
from edgesdk.runtime.json_schema import SchemaConstraint, SchemaError, compile_schema
from tests.unit.test_json_schema_bounds37 import BYTES, _wrapped
from tests.unit.test_json_schema_bounds37 import _complete as _takes


def _walk(schema: dict, rng: random.Random, limit: int = 500, end: float = 0.3):
    """A random walk over the bytes the constraint allows; asserts it never gets stuck. The value, or None
    where ``limit`` bytes did not complete it."""
    constraint = SchemaConstraint(BYTES, compile_schema(schema))
    out = b""
    while not constraint.complete and len(out) < limit:
        allowed = [byte for byte in range(256) if constraint.allows(byte)]
        assert allowed, f"stuck after {out!r}"
        ending = [byte for byte in allowed if byte in b'"]}']
        byte = rng.choice(ending) if ending and rng.random() < end else rng.choice(allowed)
        constraint.advance(byte)
        out += bytes((byte,))
    return json.loads(out) if constraint.complete else None


def _walked_strings(schema: dict, seed: int, walks: int = 40) -> list[str]:
    rng = random.Random(seed)
    found = []
    for _ in range(walks):
        value = _walk({"type": "array", "items": schema, "minItems": 1, "maxItems": 2}, rng)
        found += value or []
    return found


def _ipv6(text: str) -> bool:
    try:
        ipaddress.IPv6Address(text)
    except ValueError:
        return False
    return "%" not in text  # a scope id is no part of RFC 4291's text form


def _ipv4(text: str) -> bool:
    try:
        ipaddress.IPv4Address(text)
    except ValueError:
        return False
    return True


IPV6 = ["::", "::1", "1::", "1:2:3:4:5:6:7:8", "1:2:3:4:5:6:7::", "::2:3:4:5:6:7:8", "1:2:3:4:5:6:1.2.3.4",
        "::ffff:192.168.0.1", "fe80::1:2", "FFFF:ffff::", "1:2:3:4:5:6:7:8:9", "1:::2", "1::2::3", ":1", "1:",
        "::1.2.3.4", "1:2:3:4:5:6:7:1.2.3.4", "12345::", "::256.1.1.1", "1:2:3:4:5:6:7", "g::", "::01.2.3.4", ""]
IPV4 = ["0.0.0.0", "255.255.255.255", "192.168.1.1", "256.1.1.1", "1.2.3", "01.2.3.4", "1.2.3.4.5", "1..2.3",
        "249.250.199.100", "1.2.3.04", "300.0.0.0", "9.99.199.255"]


@pytest.mark.parametrize(("fmt", "check", "texts"), [("ipv6", _ipv6, IPV6), ("ipv4", _ipv4, IPV4)])
def test_ip_formats_take_what_python_ipaddress_reads(fmt, check, texts):
    rng = random.Random(4)
    more = [f"{rng.randint(0, 300)}.{rng.randint(0, 260)}.{rng.randint(0, 255)}.{rng.randint(0, 255)}"
            for _ in range(150)] + [str(ipaddress.IPv6Address(rng.getrandbits(128) >> rng.choice([0, 32, 64, 96])))
                                    for _ in range(150)]
    for text in texts + more:
        assert _takes({"type": "string", "format": fmt}, json.dumps(text)) == check(text), text
    for text in _walked_strings({"type": "string", "format": fmt}, seed=5):
        assert check(text), text


def _hostname(text: str) -> bool:
    """RFC 1123 section 2.1: labels of 1-63 letters, digits and inner hyphens; at most 253 characters."""
    label = re.compile(r"[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?")
    return len(text) <= 253 and all(label.fullmatch(part) for part in text.split("."))


def test_hostname_follows_rfc_1123_with_its_length_limit():
    cases = ["a", "example.com", "a-b.c", "-a.com", "a-.com", "a..b", "a." + "b" * 63, "a." + "b" * 64, "",
             ".".join(["abcdefghi"] * 25) + ".abc", ".".join(["abcdefghi"] * 25) + ".abcd", "xn--d1acufc.xn--p1ai"]
    for text in cases:
        assert _takes({"type": "string", "format": "hostname"}, json.dumps(text)) == _hostname(text), text
    for text in _walked_strings({"type": "string", "format": "hostname"}, seed=6):
        assert _hostname(text), text


def _email(text: str) -> bool:
    """The address reads back whole as an RFC 5322 addr-spec (Python's email package) with a domain of
    RFC 1123 labels."""
    try:
        address = Address(addr_spec=text)
    except (ValueError, IndexError, HeaderParseError):
        return False
    return address.addr_spec == text and _hostname(address.domain) and len(text) <= 254


def test_email_is_a_dot_string_at_a_domain():
    for text in ["a@b.c", "first.last@example.com", "a+b@x", "o'neil@host-1.io", "#!$%&'*+/=?^_`{|}~-@a.b",
                 ".a@b.c", "a.@b.c", "a..b@c.d", "a@", "@b.c", "a@b@c", "a b@c.d", "a@-b.c", "a@b..c"]:
        assert _takes({"type": "string", "format": "email"}, json.dumps(text)) == _email(text), text
    for text in _walked_strings({"type": "string", "format": "email"}, seed=7):
        assert _email(text), text


# RFC 3986 appendix B: the regular expression that splits any URI reference into its parts
RFC3986_PARTS = re.compile(r"^(([^:/?#]+):)?(//([^/?#]*))?([^?#]*)(\?([^#]*))?(#(.*))?")
SPECIAL = {"http", "https", "ws", "wss", "ftp", "file"}  # WHATWG's special schemes, whose hosts it checks further


def test_uri_takes_rfc_3986_uris_and_pydantic_reads_them():
    good = ["http://example.com", "https://example.com/a/b?c=d&e#f", "mailto:a@b.c", "urn:isbn:0451450523",
            "x:", "foo://[::1]:8080/p", "ftp://user:pw@host:21/x;type=a", "a+b.c-d:%41/~", "http://a:65535",
            "file:///etc/hosts", "news:comp.infosystems.www.servers.unix", "tel:+1-816-555-1212"]
    bad = ["", "1a:b", "http//x", "http://a b", "http://a:65536", "http://%zz", "http://[::1", "a:b#c#d", "://x",
           "http://[v1.x]/", "x:\u00e9"]
    for text in good:
        assert _takes({"type": "string", "format": "uri"}, json.dumps(text)), text
    for text in bad:
        assert not _takes({"type": "string", "format": "uri"}, json.dumps(text)), text
    walked = _walked_strings({"type": "string", "format": "uri", "minLength": 1, "maxLength": 40}, seed=8)
    assert walked
    for text in walked:
        parts = urllib.parse.urlsplit(text)
        assert RFC3986_PARTS.fullmatch(text).group(2).lower() == parts.scheme != "", text
        assert 1 <= len(text) <= 40, text
        if parts.scheme.lower() not in SPECIAL:  # pydantic (WHATWG) refuses some special-scheme hosts
            TypeAdapter(AnyUrl).validate_python(text)


def test_what_pydantic_dumps_for_an_http_url_is_taken_within_its_schema():
    adapter = TypeAdapter(HttpUrl)
    schema = adapter.json_schema()
    assert schema == {"format": "uri", "maxLength": 2083, "minLength": 1, "type": "string"}
    for text in ["https://example.com", "http://127.0.0.1:8000/api/v1?q=x#top", "https://[::1]/", "http://a.b/%7E"]:
        assert _takes(schema, adapter.dump_json(adapter.validate_python(text)).decode()), text
    assert not _takes(schema, json.dumps("http://example.com/" + "a" * 2065))  # 2084 characters
    assert _takes(schema, json.dumps("http://example.com/" + "a" * 2064))


def test_duration_takes_what_pydantic_writes_and_walks_into_timedeltas():
    adapter = TypeAdapter(datetime.timedelta)
    schema = adapter.json_schema()
    rng = random.Random(10)
    for _ in range(300):
        delta = datetime.timedelta(days=rng.choice([0, 1, 400, 10 ** 6]) * rng.random(), seconds=rng.random() * 9e4)
        delta = -delta if rng.random() < 0.3 else delta
        assert _takes(schema, adapter.dump_json(delta).decode()), delta
    for text in ["P", "PT", "P1DT", "p1d", "PT.5S", "P1.5D", "1D", "P1D2Y", "PT1,5S", "P10000000D"]:
        assert not _takes(schema, json.dumps(text)), text
    for text in _walked_strings(schema, seed=11):
        adapter.validate_python(text)


def test_path_is_any_string():
    schema = TypeAdapter(__import__("pathlib").Path).json_schema()
    assert _takes(schema, json.dumps("/etc/hosts"))
    assert _takes(schema, json.dumps("a b\u00e9"))


@pytest.mark.parametrize(("schema", "lengths"), [
    ({"pattern": "^(ab)+$", "minLength": 3, "maxLength": 6}, {4, 6}),
    ({"pattern": "^[0-9]{4}(-[0-9]{2})?$", "minLength": 5}, {7}),
    ({"pattern": "^a*b?$", "maxLength": 2}, {0, 1, 2}),
    ({"format": "uuid", "minLength": 36, "maxLength": 36}, {36}),
])
def test_a_pattern_beside_lengths_never_takes_a_prefix_that_cannot_end_within_them(schema, lengths):
    schema = {"type": "string", **schema}
    seen = set()
    rng = random.Random(12)
    for _ in range(60):
        value = _walk({"type": "array", "items": schema, "minItems": 1, "maxItems": 1}, rng, end=0.6)
        seen.add(len(value[0]))
        assert re.search(schema.get("pattern", FORMATS.get(schema.get("format"), "")), value[0])
    assert seen
    assert seen <= lengths


def test_lengths_no_string_of_the_pattern_has_are_refused_at_compile_time():
    with pytest.raises(SchemaError, match=r"no string of its pattern '\^\(ab\)\+\$' has a length within minLength 3 "
                                          "and maxLength 3"):
        compile_schema(_wrapped({"type": "string", "pattern": "^(ab)+$", "minLength": 3, "maxLength": 3}))
    with pytest.raises(SchemaError, match="format 'ipv4'"):
        compile_schema(_wrapped({"type": "string", "format": "ipv4", "maxLength": 6}))


@pytest.mark.parametrize(("schema", "factor"), [
    ({"type": "integer", "multipleOf": 7, "minimum": -30, "maximum": 30}, 7),
    ({"type": "integer", "multipleOf": 3}, 3),
    ({"type": "integer", "multipleOf": 2.5}, 5),
    ({"type": "number", "multipleOf": 0.01, "minimum": 0, "maximum": 1000}, Decimal("0.01")),
    ({"type": "number", "multipleOf": 0.25}, Decimal("0.25")),
    ({"type": "number", "multipleOf": 10, "exclusiveMinimum": -100, "maximum": 100}, 10),
])
def test_multiple_of_is_followed_digit_by_digit(schema, factor):
    rng = random.Random(13)
    for _ in range(40):
        for value in _walk({"type": "array", "items": schema, "minItems": 1, "maxItems": 3}, rng, end=0.1) or []:
            assert Fraction(Decimal(str(value))) % Fraction(factor) == 0, value
    for text in ["0", "7", "-21", "28", "5", "1.5", "0.01", "10.25", "-0.5", "1e2", "100"]:
        value = Fraction(Decimal(text))
        within = all(check(value) for check in (
            lambda v: v >= schema.get("minimum", v), lambda v: v <= schema.get("maximum", v),
            lambda v: v > schema.get("exclusiveMinimum", v - 1)))
        whole = schema["type"] == "number" or value.denominator == 1
        expected = within and whole and value % Fraction(factor) == 0 and "e" not in text
        assert _takes(schema, text) == expected, (schema, text)


def test_pydantic_reads_what_multiple_of_writes():
    adapter = TypeAdapter(Annotated[float, Field(multiple_of=0.01, ge=0, le=10 ** 6)])
    schema = adapter.json_schema()
    rng = random.Random(14)
    for _ in range(40):
        for value in _walk({"type": "array", "items": schema, "minItems": 1, "maxItems": 3}, rng, end=0.1) or []:
            adapter.validate_python(value)


@pytest.mark.parametrize(("schema", "problem"), [
    ({"type": "number", "multipleOf": 1 / 3}, "multipleOf 0.3333333333333333 is not supported on a number"),
    ({"type": "number", "multipleOf": 1e-17}, "multipleOf 1e-17 is not supported"),
    ({"type": "integer", "multipleOf": 0}, "multipleOf must be a number greater than 0, got 0"),
    ({"type": "integer", "multipleOf": 5, "minimum": 1, "maximum": 4}, "no integer lies within its bounds"),
])
def test_multiple_of_that_cannot_be_exact_is_refused_by_name(schema, problem):
    with pytest.raises(SchemaError, match=re.escape(problem)):
        compile_schema(_wrapped(schema))


@pytest.mark.parametrize("items", [
    {"type": "integer", "minimum": 1, "maximum": 12},
    {"enum": ["a", "b", 1, 1.0, True, None]},
    {"type": "number", "multipleOf": 0.5, "minimum": 0, "maximum": 2},
    {"type": "boolean"},
])
def test_unique_items_fill_every_distinct_value_without_a_dead_end(items):
    """minItems as large as the distinct values: every walk must write each one once, never stuck."""
    distinct = {"integer": 12, "number": 5, "boolean": 2}.get(items.get("type"), 5)
    schema = {"type": "array", "uniqueItems": True, "items": items, "minItems": distinct}
    rng = random.Random(15)
    for _ in range(25):
        value = _walk(schema, rng, limit=200)
        keys = {(type(v) is bool, v) for v in value}
        assert len(value) == len(keys) == distinct, value


def test_unique_strings_compare_after_unescaping_and_pydantic_sets_read_the_walks():
    schema = TypeAdapter(frozenset[str]).json_schema()
    assert _takes(schema, '["a","b"]')
    assert not _takes(schema, '["a","\\u0061"]')
    assert not _takes(schema, '["a","a"]')
    assert not _takes({"type": "array", "uniqueItems": True, "items": {"type": "number"}}, "[1,1.0]")
    rng = random.Random(16)
    for _ in range(40):
        value = _walk(schema, rng, end=0.15)
        if value is not None:
            assert len(TypeAdapter(frozenset[str]).validate_python(value)) == len(value)


@pytest.mark.parametrize(("schema", "problem"), [
    ({"type": "array", "uniqueItems": True, "items": {"enum": [1, 2, 3]}, "minItems": 4},
     "minItems 4 asks for more distinct items than its items allow (3)"),
    ({"type": "array", "uniqueItems": True, "items": {"type": "object"}}, "uniqueItems over objects is not supported"),
    ({"type": "array", "uniqueItems": True, "items": {"type": "string", "maxLength": 3}},
     "uniqueItems over strings with a pattern, format or maxLength is not supported"),
])
def test_unique_items_that_cannot_be_followed_are_refused_by_name(schema, problem):
    with pytest.raises(SchemaError, match=re.escape(problem)):
        compile_schema(_wrapped(schema))
