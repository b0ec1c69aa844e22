"""Structured answers: a JSON Schema constrains the answer, as OpenAI's structured outputs
(``response_format: {"type": "json_schema", "json_schema": {"schema": ...}}``) and llama-server's
``json_schema`` field do.

The schema is compiled into a tree of :class:`SchemaNode` and followed byte by byte, like JSON mode
(``edgesdk/runtime/json_mode.py``, whose automaton scans the strings, numbers and free-form values
here). Where a schema allows several ways on (``anyOf``, an optional property, enum values that
share a prefix), the constraint keeps every live way at once, so no choice is made before the bytes
decide it.

The supported subset (JSON Schema 2020-12 keywords) is what structured-output APIs and pydantic's
``model_json_schema()`` write: ``type`` (one or a list), ``properties`` with ``required``,
``additionalProperties`` (``false``, or absent beside ``properties``, read the same way: only the listed
properties are written; ``true`` or a schema, or absent with no ``properties`` (``{"type": "object"}``, any
object, as llama.cpp's converter reads it): further keys, each a string that names no listed property, with
values of that schema, after the listed ones, as llama.cpp's converter writes them and as pydantic writes a
``dict[str, X]`` or a model's extra fields; a required key not among ``properties`` is written first of
them, and where ``additionalProperties`` is absent, with any value, as its default true admits it), ``items`` (a schema, or ``false``), ``prefixItems`` (a tuple's
positions, before ``items``; draft 2019-09's array ``items`` with ``additionalItems``, as pydantic v1 and
zod-to-json-schema write a tuple, read the same way; one schema rather than an array of them, without ``items``,
every item's, as llama.cpp's converter reads it), ``minItems``, ``maxItems``, ``enum``, ``const`` (its values filtered by a string's or a number's keywords beside
it: lengths, pattern, format, bounds, multipleOf), ``anyOf`` / ``oneOf`` (``oneOf`` followed as ``anyOf``, as
llama.cpp's converter follows it, one union rule for either: an answer that is an instance of two of its options
is written too, which oneOf's "exactly one" (2020-12 core, section 10.2.1.3) refuses; options that a ``const``
or a type tells apart, as tagged unions write them, are never both matched; with an
OpenAPI ``discriminator`` beside it: an annotation of options that its ``const`` properties tell apart
already, and other keywords beside it, which apply to every option), ``allOf`` (its schemas merged into one:
properties and required lists joined, a ``$ref`` inlined, an ``anyOf`` distributed (an option the merge leaves
no value dropped, a keyword of a type the option is not left out of it), the tighter bound and the
common types and enum values kept, see ``_Compiler._intersection``), a local ``$ref`` (beside other
keywords: an allOf of the two, JSON Schema 2020-12 core, section 8.2.3.1), any JSON
pointer into the schema (``#/$defs/NAME``, ``#/definitions/NAME``, ``#/properties/NAME``, ``#`` for the whole
schema, nested ``$defs``; RFC 6901's ``~0`` / ``~1`` and percent-encoding, see :func:`ref_tokens`; recursion
included; a remote ref is refused), ``true`` / ``{}`` for any value, ``false`` for none (JSON Schema 2020-12 core,
section 4.3.2; llama.cpp's converter refuses it but as ``additionalProperties``) as ``items``, ``additionalItems``,
``additionalProperties``, a property's schema (never written; required, refused), an anyOf / oneOf option (left
out) or a prefixItems position (the array ends before it); but as a property's schema, a ``$ref`` to ``false`` is
read as ``false`` there too (``_Compiler.is_false``); the root ``true`` is ``{}``; a string's ``minLength`` /
``maxLength`` (in characters: code points, an escape one, a
``\\u`` surrogate pair one; beside a pattern or format, a minLength of at most 10,000, json_pattern.MAX_MIN_LENGTH),
``minimum`` / ``maximum`` / ``exclusiveMinimum`` / ``exclusiveMaximum`` on an
integer (no ``-0``, no leading zero) and on a number (and OpenAPI's number ``format``: ``int32`` and ``int64``
bound the value, ``float`` and ``double`` nothing), a string's ``pattern`` and ``format`` (``date``,
``time``, ``date-time``, ``uuid``, each followed as a grammar over its characters,
edgesdk/runtime/json_pattern.py; pydantic's ``uuid1`` ... ``uuid8``, a uuid with that version digit;
``binary`` and ``password``, which OpenAPI and pydantic write for bytes and secrets and which any string
satisfies), and the annotations (``title``, ``description``,
``default``, ...). Properties are written in the schema's order, as OpenAI's strict mode writes them
(llama.cpp's converter writes the required ones first, then the optional ones). Between tokens the spacing is llama.cpp's schema grammar's
(``SPACE_RULE``, ``space ::= | " " | "\\n"{1,2} [ \\t]{0,20}``): nothing, one space, or one or two newlines
(a blank line) and at most 20 spaces or tabs of indentation, so pretty-printed answers pass and a model cannot
stall in blank lines; none comes before the value, whose first character is the answer's first, as in
llama.cpp's grammar (common/json-schema-to-grammar.cpp: ``root ::= object``, ``object ::= "{" space ...``,
whitespace only after a token) and Ollama's ``format`` (converted by llama.cpp's code). JSON mode without a
schema (edgesdk/runtime/json_mode.py, ``json_object``) is another constraint, which starts at its object the
same way. A schema's numbers (``number``, ``integer``) follow llama.cpp's schema grammar too
(common/json-schema-to-grammar.cpp, ``integral-part`` and ``decimal-part``): at most 16 digits before the point (an
integer range with a larger bound: that bound's digits), 16 after it and 16 in the exponent, which has no leading
zero, so a model cannot stall in digits either. A free-form value's numbers (``{}``, ``true``, an additional
property with no schema) are JSON mode's, with the same caps, as llama.cpp's ``value`` rule writes them.

A bounded number is written without an exponent (a bound with an exponent's reach would make every
digit an open question), so its values are the multiples of 10**-16 below 10**16 in magnitude; one of
them is taken when it lies within the bounds both as the decimal it is (JSON Schema's reading) and
as the double a JSON parser reads it as (Python's ``float``, pydantic, JavaScript: the nearest double,
ties to even), so that neither kind of validator refuses what the constraint writes. Each digit is
taken only where digits to come can still bring the number within its bounds, as for integers.
``multipleOf`` is followed the same way (an integer's factor exactly, a number's where it is a short
decimal), and ``uniqueItems`` over scalar items (see ``_Compiler._unique``); the other formats
(``ipv4``, ``ipv6``, ``hostname``, ``email``, ``uri``, ``duration``; ``path`` takes any string) are
json_pattern.FORMATS.

Every other keyword (``not``, ``propertyNames``, ``if`` / ``then``, another ``format``, ...) is
refused by name rather than ignored, so an answer never silently breaks a constraint the client asked
for in a response format. A tool's parameters are read leniently instead (:func:`lenient_schema`, used by
edgesdk/serve/tools.py): the keywords that only narrow the values are dropped for the constraint, as
llama.cpp's converter ignores them, so that one tool from an MCP server does not refuse the whole request. The root
must be a value whose last byte ends the answer, as the answer stops once its value is complete: an object or an
array (its closing bracket), a string (its closing quote), an ``enum`` / ``const`` value, ``true``, ``false`` or
``null`` (Ollama's ``format`` takes such roots, as llama.cpp's converter writes a grammar for any root); a number goes
on digit by digit, so a root number is refused, but for an integer with a minimum and a maximum (at most 256
values, listed as enum values); no enum value (nor such an integer) may be the start of another (1 and 12); a root
that constrains nothing (``{}``, which llama-server documents as "any JSON" and llama.cpp's converter writes as an object) is
any object.

A schema without ``type`` takes it from its keywords, as llama.cpp's converter does: ``properties`` /
``additionalProperties`` an object, ``items`` / ``prefixItems`` (or ``minItems`` ...) an array, ``pattern``, a
string ``format``, ``minLength`` or ``maxLength`` a string (llama.cpp: a pattern or format without a type is a
string), bounds, ``multipleOf`` or a number ``format`` a number; keywords of several types need a ``type``.
"""

from __future__ import annotations

import copy
import json
import math
import re
import struct
import urllib.parse
from dataclasses import dataclass
from decimal import MAX_EMAX, MIN_EMIN, Context, Decimal
from fractions import Fraction
from functools import lru_cache

from edgesdk.errors import EdgeSDKError
from edgesdk.runtime.grammar import GrammarMatcher
from edgesdk.runtime.json_mode import (
    _NUMBER_NEXT,
    AFTER_VALUE,
    MAX_NUMBER_DIGITS,
    NUMBER,
    STRING,
    VALUE,
    JsonState,
    step,
)
from edgesdk.runtime.json_pattern import (
    FORMAT_MAX_LENGTH,
    FORMATS,
    MAX_MIN_LENGTH,
    PatternError,
    PatternLengths,
    pattern_lengths,
    string_matcher,
)
from edgesdk.runtime.vocab_trie import tokens_accepted

MAX_INDENT = 20  # spaces or tabs after a newline between tokens (llama.cpp's json-schema-to-grammar spacing)
ONE_SPACE = -1  # spacing state after a single space: nothing more may follow
SECOND_NEWLINE = 2 * (MAX_INDENT + 1)  # spacing state after two newlines (a blank line), + n spaces or tabs after them
NO_SPACE = -2  # spacing state before the answer's first byte: its value starts it, as llama.cpp's root rule does
MAX_WAYS = 64  # live parses kept at once
SHARE_AFTER = 32  # live parses past which those with the same top frames are merged into one (_shared_ways)
# ... and at least this many per node of the schema, each option of an anyOf / oneOf / type list one (see _schema_size)
WAYS_PER_OPTION = 4
MAX_OPTIONS = 16  # options an allOf over anyOf spreads into (each an object is a live parse after its "{")
# OpenAPI's formats for bytes and secrets, and pydantic's for a Path: any string has them
ANY_STRING_FORMATS = ("binary", "password", "path")
# pydantic's UUID1 ... UUID8 (llama.cpp's json-schema.cpp reads uuid1 ... uuid5 as uuid): a UUID of RFC 9562's
# variant with that version digit, as Python's uuid.UUID(...).version and so pydantic check it
VERSIONED_UUID = re.compile(r"uuid([1-8])")
ANNOTATIONS = frozenset({"title", "description", "default", "examples", "$schema", "$id", "$comment", "deprecated",
                         "readOnly", "writeOnly"})
BOUND_KEYWORDS = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum")
TYPE_KEYWORDS = {"object": {"properties", "required", "additionalProperties"},
                 "array": {"items", "prefixItems", "additionalItems", "minItems", "maxItems", "uniqueItems"},
                 "string": {"minLength", "maxLength", "pattern", "format"},
                 "number": {*BOUND_KEYWORDS, "multipleOf", "format"}, "integer": {*BOUND_KEYWORDS, "multipleOf", "format"},
                 "boolean": set(), "null": set()}
OBJECT_KEYWORDS = ("properties", "required", "additionalProperties")
# keywords beside an enum / const that its values are checked against (_Compiler._literal_filter)
LITERAL_FILTERS = frozenset({"minLength", "maxLength", "pattern", "format", *BOUND_KEYWORDS, "multipleOf"})
# OpenAPI 3's formats of numbers (its "Data Types"), which OpenAPI-derived tool schemas carry and llama.cpp's converter
# takes: int32 and int64 bound the value to that signed range; float and double bound nothing a JSON text can write
NUMBER_FORMATS = {"int32": (-2 ** 31, 2 ** 31 - 1), "int64": (-2 ** 63, 2 ** 63 - 1), "float": None, "double": None}
COUNT_KEYWORDS = ("minLength", "maxLength", "minItems", "maxItems")
LOWER_BOUNDS = ("minimum", "exclusiveMinimum", "minLength", "minItems")  # two in an allOf: the greater holds
UPPER_BOUNDS = ("maximum", "exclusiveMaximum", "maxLength", "maxItems")  # the lesser
# llama.cpp's schema grammar (common/json-schema-to-grammar.cpp): integral-part ::= [0] | [1-9] [0-9]{0,15},
# decimal-part ::= [0-9]{1,16}, and the exponent is an integral-part.
NUMBER_DIGITS = 16
STEP = 10 ** NUMBER_DIGITS  # a bounded number's values in units of its finest step, 10**-16
MULTIPLE_DIGITS = 15  # significant digits of a number's multipleOf (a double's repr beyond them is no short decimal)
LARGEST = 10 ** NUMBER_DIGITS * STEP - 1
EXACT_EXPONENT = 4 * NUMBER_DIGITS  # a unique item's number is compared as a Fraction within 10**±this  # 16 nines before the point and 16 after it, in those units
_NUMBER_PARTS = re.compile(rb"(-?)([0-9]*)(?:\.([0-9]*))?(?:[eE][-+]?([0-9]*))?")
_WHITESPACE = frozenset(b" \t\n\r")
_NUMBER_START = frozenset(b"-0123456789")
_INSIDE_ARRAY = ("[",)  # a scanned value sits in a one-level container so that its end is visible


class SchemaError(EdgeSDKError):
    """A JSON Schema uses something this constraint cannot enforce."""


WRAPPED = '{"type": "object", "properties": {"value": ...}, "required": ["value"]}'  # the fix a root refusal gives
ROOT_INTEGERS = 256  # the most values an integer root's bounds may leave: each is listed as an enum value's text


class RootError(SchemaError):
    """The schema's root allows a value with no last byte to end the answer at (``other`` names the first such
    thing, as :func:`_not_a_container` does): a number, whose digits may always go on. edgesdk/serve/tools.py catches
    it to say what a tool's parameters must be instead. ``problem`` and ``fix``: a refusal worded on its own (an enum
    value or a bounded integer that another goes on from, :func:`_prefix_refused`), whose root is of a kind the
    answer may have, so that the general list of such kinds would not say what is wrong."""

    def __init__(self, other: str, problem: str | None = None, fix: str | None = None):
        super().__init__(problem or f"the schema's root is {other}; the answer must be an object or an array, a "
                         "string, or an enum / const value, or an integer with a minimum and a maximum (at most "
                         f"{ROOT_INTEGERS} values; a number without them has no last digit the answer could stop "
                         "at)", fix or f"wrap the value in an object: {WRAPPED}")
        self.other = other


class _Empty(SchemaError):
    """An intersection of schemas (allOf) that no value satisfies, or a schema whose own keywords leave no value
    (bounds, lengths, counts, enum values that contradict each other): an option of an anyOf that an intersection
    spread holding it is dropped where the merge made the contradiction (not one of its schemas alone, see
    ``_Compiler._options_node``), a property that the merged schemas give no common type or value is left out
    where it is optional (``_Compiler._merge_object``); elsewhere, and below an optional property, an item or
    additionalProperties (whose container still has values), the schema is refused with its reason."""


@dataclass(frozen=True, eq=False)  # compared by identity: recursive schemas make cyclic trees
class SchemaNode:
    kind: str  # object | array | string | number | integer | any | literal | choice | ref
    properties: tuple = ()  # object: (key bytes as written between the quotes, SchemaNode, required)
    additional: SchemaNode | None = None  # object: the value of a key not listed (None: no such keys)
    names: frozenset = frozenset()  # object with additional keys: the listed keys (str), which they may not be
    prefix: tuple = ()  # array: the SchemaNodes of its first items (prefixItems)
    items: SchemaNode | None = None  # array: the items after them (None: none)
    min_items: int = 0
    max_items: int | None = None
    literals: tuple[bytes, ...] = ()  # literal: the JSON texts allowed (enum, const, booleans, null)
    options: tuple = ()  # choice: SchemaNodes
    ref: str = ""  # ref: a key of the compiled definitions
    min_length: int = 0  # string: characters
    max_length: int | None = None
    content: GrammarMatcher | None = None  # string: its pattern or format, over its characters
    lengths: PatternLengths | None = None  # string with a pattern and a length bound: the states that fit it
    minimum: int | None = None  # integer: the bounds, inclusive (number: in units of 10**-16, see _number)
    maximum: int | None = None
    multiple: int | None = None  # integer, number: multipleOf, in the bounds' units (None: any value)
    unique: bool = False  # array: uniqueItems true (its items scalars, see _Compiler._unique)


@dataclass(frozen=True)
class CompiledSchema:
    root: SchemaNode
    definitions: dict  # "$ref" string -> SchemaNode


def compile_schema(schema) -> CompiledSchema:
    """Compile ``schema`` (a dict, ``true``, which is ``{}``, or a JSON text of one); :class:`SchemaError` names what
    is refused."""
    if isinstance(schema, str):
        try:
            schema = json.loads(schema)
        except json.JSONDecodeError as exc:
            raise SchemaError(f"the JSON schema is not valid JSON ({exc})", "pass a JSON object") from exc
        except ValueError as exc:  # an integer past Python's limit on the digits it reads (4,300 by default)
            raise SchemaError(f"the JSON schema holds an integer longer than Python reads ({exc})",
                              "shorten that integer or drop the value that holds it") from exc
    if schema is True:  # JSON Schema 2020-12 core, section 4.3.2: true is {}, any value (here: any object)
        schema = {}
    if schema is False:
        raise SchemaError("the JSON schema is false, which no value satisfies (JSON Schema 2020-12 core, section "
                          "4.3.2), so no answer could follow it",
                          'pass a schema that admits the answer, such as {"type": "object"}')
    if not isinstance(schema, dict):
        raise SchemaError(f"the JSON schema must be an object, got {type(schema).__name__}",
                          'pass an object such as {"type": "object", "properties": {...}}')
    try:
        return _compile(schema)
    except RecursionError:  # nested past Python's stack: a 500 from the server, for a body it could read
        raise _too_deep() from None


def _too_deep() -> SchemaError:
    """A schema nested deeper than the compiler's recursion reaches (a few hundred levels, where JSON Schema sets
    no limit and llama.cpp's converter recurses in C++): refused by name rather than as Python's RecursionError,
    which the server answered with a 500."""
    return SchemaError("the JSON schema is nested too deeply to compile (its subschemas hold one another a few "
                       "hundred levels down)", "flatten it: move repeated parts under $defs and refer to them "
                       "with $ref")


def _compile(schema: dict) -> CompiledSchema:
    compiler = _Compiler(schema)
    root = compiler.node(schema, "$")
    if root.kind == "any":  # {} (or only annotations and $defs): any object, as llama.cpp's converter reads a root
        # {} (common/json-schema-to-grammar.cpp, visit: "schema.empty() ... object") and llama-server documents it
        # ("or `{}` for any JSON"); the answer must be an object or an array here, so not any value
        root = compiler.node({"type": "object"}, "$")
    compiler.define_pending()
    _refuse_cycles(root, compiler.definitions)
    for node, path in compiler.unique:
        _check_unique(node, compiler.definitions, path)
    _refuse_endless(compiler.definitions)
    root, ranges = _listed_integers(root, compiler.definitions)
    other = _not_a_container(root, compiler.definitions)
    if other:
        raise RootError(other)
    pair = _root_prefix(root, compiler.definitions)
    if pair is not None:
        raise _prefix_refused(*pair, ranges)
    return CompiledSchema(root, compiler.definitions)


# keywords whose values are JSON data, not schemas: a "$ref" inside one is data, never followed or renamed
SCHEMA_DATA = ("const", "enum", "default", "examples")
_ARRAY_INDEX = re.compile(r"0|[1-9][0-9]*")  # RFC 6901 section 4: an array index, no leading zero


def ref_tokens(ref: str) -> tuple[str, ...]:
    """The reference tokens of a local ``$ref``: JSON Schema 2020-12 core 8.2.3.1 reads ``$ref`` as a URI
    reference, whose fragment is a JSON Pointer (RFC 6901 section 6: percent-decoded first, then each token's
    ``~1`` read as ``/`` and ``~0`` as ``~``, section 4). ``#`` is the whole schema (``()``), ``#/$defs/A``
    ``("$defs", "A")``, ``#/properties/home`` (zod-to-json-schema's ref to a reused schema) ``("properties",
    "home")``, as llama.cpp's converter (examples/json_schema_to_grammar.py, ``resolve_refs``) follows any
    ``#/...`` pointer. A remote or relative ref and a plain-name fragment (``#anchor``) are refused by name."""
    if not ref.startswith("#"):
        raise SchemaError(f"$ref {ref!r} is not supported: only local definitions and other local references "
                          "into this schema (#, #/$defs/NAME, #/definitions/NAME, #/properties/NAME, any JSON "
                          "pointer starting with #/) are", "inline the referenced schema")
    try:
        fragment = urllib.parse.unquote(ref[1:], errors="strict")
    except UnicodeDecodeError as exc:
        raise SchemaError(f"$ref {ref!r} percent-encodes bytes that are not UTF-8 ({exc.reason})",
                          "percent-encode the pointer's UTF-8 bytes") from exc
    if fragment and not fragment.startswith("/"):
        raise SchemaError(f"$ref {ref!r} names a plain-name fragment ($anchor), which is not supported: only JSON "
                          "pointers (#, #/$defs/NAME, #/properties/NAME, ...) are",
                          "refer to the schema by its JSON pointer, e.g. #/$defs/NAME")
    # ~1 before ~0 (RFC 6901 section 4: "~01" is "~1"); a "~" followed by neither is read as itself, as
    # llama.cpp's converter and python-jsonschema's resolver read it, rather than refused
    return tuple(token.replace("~1", "/").replace("~0", "~") for token in fragment.split("/")[1:])


def ref_text(tokens: tuple[str, ...]) -> str:
    """The ``$ref`` that :func:`ref_tokens` reads as ``tokens``: ``~`` written ``~0``, ``/`` ``~1`` (RFC 6901)
    and ``%`` ``%25`` (a URI fragment's percent sign, RFC 3986)."""
    return "#" + "".join("/" + token.replace("~", "~0").replace("/", "~1").replace("%", "%25") for token in tokens)


def canonical_ref(ref: str) -> str:
    """One spelling of a local ``$ref`` (``#/$defs/a%20b`` and ``#/$defs/a b`` are the same pointer)."""
    return ref_text(ref_tokens(ref))


def resolve_ref(root, ref: str):
    """The schema a local ``$ref`` points at inside ``root`` (the whole schema: JSON Schema 2020-12 reads
    ``#`` against the document, nested ``$defs`` included); :class:`SchemaError` where it points at nothing."""
    tokens, target = ref_tokens(ref), root
    for depth, token in enumerate(tokens):
        if isinstance(target, dict) and token in target:
            target = target[token]
        elif isinstance(target, list) and _ARRAY_INDEX.fullmatch(token) and int(token) < len(target):
            target = target[int(token)]
        elif depth <= 1 and len(tokens) > 1 and tokens[0] in ("$defs", "definitions"):
            raise SchemaError(f"$ref {ref!r} points at no definition", f"add {tokens[1]!r} under {tokens[0]!r}")
        else:
            where = ref_text(tokens[:depth])
            raise SchemaError(f"$ref {ref!r} points at nothing: {where!r} holds no {token!r}",
                              "point the $ref at a schema inside this one")
    return target


def hoist_refs(schema: dict, prefix: str, definitions: dict) -> dict:
    """``schema`` (a whole schema, such as a tool's parameters) made ready to nest inside another whose
    ``$defs`` is ``definitions``: a copy whose every local ``$ref`` is ``#/$defs/KEY``, each schema such a ref
    reaches added to ``definitions`` under a key of its own: ``PREFIX.NAME`` for ``#/$defs/NAME``,
    ``PREFIX:NAME`` for ``#/definitions/NAME`` (two tables, as compile_schema reads them) and ``PREFIX#POINTER``
    for any other pointer (``PREFIX#`` for ``#``, the schema itself: nested, ``#`` would mean the outer one).
    Refs are read as :func:`resolve_ref` reads them; one that is not local is left for compile_schema to refuse
    by name. Definitions no ref reaches are left out; a ``$ref`` inside a const or enum value is data."""
    keys: dict = {}  # tokens -> key in definitions
    waiting: list = []

    def key(ref: str) -> str:
        tokens = ref_tokens(ref)
        if tokens not in keys:
            resolve_ref(schema, ref)  # points at something
            if len(tokens) == 2 and tokens[0] in ("$defs", "definitions"):
                keys[tokens] = f"{prefix}{'.' if tokens[0] == '$defs' else ':'}{tokens[1]}"
            else:
                keys[tokens] = f"{prefix}{ref_text(tokens)}"
            waiting.append((tokens, ref))
        return keys[tokens]

    def rename(node):
        if isinstance(node, dict):
            node.pop("$defs", None)  # reached through the refs, moved into definitions
            node.pop("definitions", None)
            ref = node.get("$ref")
            if isinstance(ref, str) and ref.startswith("#"):
                node["$ref"] = ref_text(("$defs", key(ref)))
            for name, value in node.items():
                if name == "properties" and isinstance(value, dict):  # names (maybe "const") -> schemas
                    for subschema in value.values():
                        rename(subschema)
                elif name not in SCHEMA_DATA:
                    rename(value)
        elif isinstance(node, list):
            for value in node:
                rename(value)

    hoisted = copy.deepcopy(schema)
    rename(hoisted)
    while waiting:
        tokens, ref = waiting.pop()
        target = copy.deepcopy(resolve_ref(schema, ref))
        rename(target)
        definitions[keys[tokens]] = target
    return hoisted


# Keywords that only narrow the values a schema allows (JSON Schema 2020-12 core, section 10 applicators, and
# validation, sections 6-8; draft-07's ``dependencies``) and that the constraint here cannot follow. A tool's
# parameters are read without them (:func:`lenient_schema`); llama.cpp's json-schema-to-grammar (common/
# json-schema-to-grammar.cpp, ``visit``) reads none of them either, so it ignores them wherever it meets them.
NARROWING_ONLY = ("not", "if", "then", "else", "propertyNames", "dependentRequired", "dependentSchemas",
                  "dependencies", "minProperties", "maxProperties", "unevaluatedProperties", "unevaluatedItems",
                  "contains", "minContains", "maxContains", "contentEncoding", "contentMediaType", "contentSchema")
# Annotations of other vocabularies that tool schemas carry (OpenAPI's ``x-`` extensions, VS Code's
# ``markdownDescription`` ...): unknown keywords, which JSON Schema 2020-12 (core, section 6.5) collects as
# annotations and which constrain nothing; a tool's parameters are read without them.
EDITOR_ANNOTATIONS = ("markdownDescription", "markdownEnumDescriptions", "enumDescriptions", "deprecationMessage",
                      "errorMessage")
MAX_DROPPED_NAMED = 20  # entries lenient_schema names of what it dropped; then "and N more"
MAX_DROPPED_CHARS = 240  # each cut to its start and end past this (a path hundreds of levels down)
# JSON Schema 2020-12 core keywords that name a schema or list the vocabularies a meta-schema uses (sections 8.1.2,
# 8.2.2), with draft 2019-09's ``$recursiveAnchor`` and draft-04's ``id`` (its ``$id``, which compile_schema reads as
# an annotation): they constrain no value, and a tool's parameters are read without them. ``$dynamicRef`` (section
# 8.2.3.2; 2019-09's ``$recursiveRef``) does constrain, but only through the dynamic scope, which the constraint does
# not follow: it is dropped with a word (DYNAMIC_REFS), so the schema beside it admits more.
NAMING_ONLY = ("$anchor", "$dynamicAnchor", "$vocabulary", "$recursiveAnchor", "id")
DYNAMIC_REFS = ("$dynamicRef", "$recursiveRef")
# a schema (items: or a draft-07 tuple's list; prefixItems: one schema, every item's, as _Compiler._array reads it)
_SUBSCHEMA = ("items", "additionalProperties", "additionalItems", "prefixItems")
_SUBSCHEMA_LISTS = ("items", "prefixItems", "anyOf", "oneOf", "allOf")
_SUBSCHEMA_MAPS = ("properties", "$defs", "definitions")


def openapi_nullable(schema: dict) -> dict:
    """One schema's OpenAPI 3.0 ``"nullable"`` (Schema Object: "A true value adds "null" to the allowed types
    specified by the type keyword, only if type is explicitly defined within the same Schema Object") read as JSON
    Schema: ``{"type": "string", "nullable": true}`` is ``{"type": ["string", "null"]}``, and beside an ``enum``,
    ``null`` is added to the enum too (so that ``null`` is admitted there as the writer of ``Optional[Literal]``
    means; OpenAPI 3.0.3 keeps the enum's say, so this only widens); beside no ``type`` and no ``enum`` it admits
    null beside ``anyOf`` / ``oneOf`` / ``allOf`` (:func:`_nullable_branches`), and elsewhere adds nothing
    and is left out. ``false`` is left out; a ``nullable`` that is not a boolean is kept, for
    :func:`compile_schema` to refuse by name. Returns ``schema`` itself where it has no boolean ``nullable``, else
    a new dict. Not recursive: :func:`lenient_schema` applies it to each schema it walks (FastAPI's and Gemini's
    OpenAPI-style tool parameters carry it); edgesdk/serve/ollama.py reads Ollama's ``format`` the same way."""
    nullable = schema.get("nullable")
    if not isinstance(nullable, bool):
        return schema
    out = {key: value for key, value in schema.items() if key != "nullable"}
    if not nullable:
        return out
    kind, enum = out.get("type"), out.get("enum")
    if isinstance(kind, str) and kind != "null":
        out["type"] = [kind, "null"]
    elif isinstance(kind, list) and "null" not in kind:
        out["type"] = [*kind, "null"]
    if isinstance(enum, list) and None not in enum:
        out["enum"] = [*enum, None]
    if kind is None and enum is None:
        return _nullable_branches(out)
    return out


NULL_SCHEMA = {"type": "null"}


def _nullable_branches(schema: dict) -> dict:
    """An untyped ``"nullable": true`` beside ``anyOf`` / ``oneOf`` (``nullable`` already left out of ``schema``) as
    the writer means it: null admitted beside the branches. voluptuous-openapi (Home Assistant's tools and
    ``format``) writes ``vol.Any(None, A, B)`` as ``{"anyOf": [A, B], "nullable": true}``; OpenAPI 3.0.3 gives
    ``nullable`` no say without a ``type``, so it would refuse the null it was written to admit. This only widens
    what the schema admits: a branch ``{"type": "null"}`` is added. Beside an ``allOf`` (OpenAPI 3.0's nullable
    reference, ``{"allOf": [{"$ref": ...}], "nullable": true}``) the schema becomes an anyOf of itself and null.
    Elsewhere the schema is returned as it is: an untyped schema without branches admits null already, and a
    ``$ref`` is not wrapped (the schema is rewritten in
    place where :func:`lenient_schema` keeps its ``$ref`` to point at a copy)."""
    for key in ("anyOf", "oneOf"):
        branches = schema.get(key)
        if isinstance(branches, list):
            if NULL_SCHEMA not in branches:
                return {**schema, key: [*branches, dict(NULL_SCHEMA)]}
            return schema
    if isinstance(schema.get("allOf"), list) and "$ref" not in schema:
        # OpenAPI 3.0's nullable reference ({"allOf": [{"$ref": ...}], "nullable": true}: a Reference Object takes no
        # siblings, so springdoc, drf-spectacular and OpenAI's spec wrap the $ref in an allOf to mark it nullable):
        # null, or a value of the allOf; $defs stay where the schema's refs point
        tables = {key: schema[key] for key in ("$defs", "definitions") if key in schema}
        inner = {key: value for key, value in schema.items() if key not in tables}
        return {"anyOf": [inner, dict(NULL_SCHEMA)], **tables}
    return schema


def draft04_exclusive(schema: dict) -> dict:
    """One schema's draft-04 boolean ``exclusiveMinimum`` / ``exclusiveMaximum`` (draft-04 validation, section
    5.1.2-5.1.3: ``true`` makes ``minimum`` / ``maximum`` strict, ``false`` or absent leaves it inclusive) in
    2020-12's numeric form (validation, section 6.2.3-6.2.5), which says the same: ``{"minimum": 0,
    "exclusiveMinimum": true}`` is ``{"exclusiveMinimum": 0}``, and a ``false`` is left out. A ``true`` without
    its bound is kept, for :func:`compile_schema` to refuse by name (draft-04's meta-schema requires the bound).
    Returns ``schema`` itself where there is nothing to translate, else a new dict."""
    out = schema
    for strict, bound in (("exclusiveMinimum", "minimum"), ("exclusiveMaximum", "maximum")):
        flag = out.get(strict)
        value = out.get(bound)
        if flag is False:
            out = {key: each for key, each in out.items() if key != strict}
        elif flag is True and isinstance(value, (int, float)) and not isinstance(value, bool):
            out = {key: each for key, each in out.items() if key != bound}
            out[strict] = value
    return out


def lenient_schema(schema) -> tuple[object, tuple[str, ...]]:
    """``schema`` without the keywords that only narrow its values and that the constraint cannot follow, and
    what was dropped (``"$.properties.tags.propertyNames"``, one entry each): :data:`NARROWING_ONLY`,
    ``patternProperties`` (its schemas joined to ``additionalProperties``: a key of a pattern is then any key
    with a value of one of them, or of ``additionalProperties``), a ``pattern`` the pattern compiler refuses
    (a lookahead, ...; llama.cpp's converter skips such syntax with a warning, ``_visit_pattern``), a
    ``format`` not followed here (json_pattern.FORMATS, ...), beside a ``pattern`` or of a type the schema's ``type``
    leaves out (:func:`_format_fits_type`), a ``$dynamicRef`` or
    ``$recursiveRef`` (:data:`DYNAMIC_REFS`), a ``uniqueItems`` whose items the constraint cannot keep unique
    (objects, arrays, strings with a pattern, format or maxLength, items beside ``prefixItems``: zod's
    ``z.set(z.object(...))``, pydantic's ``set[Annotated[str, Field(max_length=8)]]``; :func:`_check_unique`
    follows it over scalar items, also where they are reached through a ``$ref``, and those are kept). The schema
    that is left admits every value ``schema`` admits, and more: a constraint built from it never blocks a valid
    value.

    Without a word, it also leaves out what constrains nothing (other vocabularies' annotations, ``x-`` keywords,
    :data:`NAMING_ONLY`'s ``$anchor`` / ``$dynamicAnchor`` / ``$vocabulary`` / draft-04's ``id`` ...) and reads
    the older dialects' keywords that tool schemas carry as what they mean (OpenAPI 3.0's ``nullable``, :func:`openapi_nullable`; draft-04's
    boolean ``exclusiveMinimum`` / ``exclusiveMaximum``, :func:`draft04_exclusive`), rather than refusing the tool.

    Used for a tool's parameters (edgesdk/serve/tools.py), which come from MCP servers and SDKs (zod-to-json-schema
    writes ``propertyNames`` and ``not: {}``) and are followed leniently, as llama-server's tool grammar
    (json-schema-to-grammar, which ignores these keywords) and Ollama (which builds no grammar from them) take
    them. A schema the user wrote as the answer's format (``response_format``, ``json_schema``, Ollama's
    ``format``) is compiled as written, so such a keyword there is refused by name. ``schema`` itself is
    returned where nothing is dropped; const, enum, default and examples are data and are left alone. A local
    ``$ref`` into a part dropped (zod-to-json-schema's ``#/properties/a/propertyNames`` for a schema it meets again)
    is pointed at a copy of that part put under ``$defs`` (once per part, however its refs spell it).

    At most :data:`MAX_DROPPED_NAMED` entries are named, each cut to :data:`MAX_DROPPED_CHARS` characters, then
    one ``"and N more"``: the list is logged and kept per tool (edgesdk/serve/tools.py), and a request of one
    megabyte with thousands of ``not`` deep in a schema made it some hundred megabytes. A schema nested deeper
    than the walk's recursion reaches is a :class:`SchemaError`, as :func:`compile_schema` refuses it."""
    try:
        return _lenient_schema(schema)
    except RecursionError:
        raise _too_deep() from None


def _lenient_schema(schema) -> tuple[object, tuple[str, ...]]:
    dropped: list[str] = []
    unnamed = 0  # entries past MAX_DROPPED_NAMED

    def drop(entry: str) -> None:
        nonlocal unnamed
        if len(dropped) >= MAX_DROPPED_NAMED:
            unnamed += 1
        elif len(entry) > MAX_DROPPED_CHARS:  # its path's start and its end, which names the keyword
            half = (MAX_DROPPED_CHARS - 3) // 2
            dropped.append(f"{entry[:half]}...{entry[-half:]}")
        else:
            dropped.append(entry)

    annotations: list[str] = []  # EDITOR_ANNOTATIONS, x- and NAMING_ONLY keywords left out, which need no word
    rewritten = False  # a nullable or a draft-04 exclusive bound read as 2020-12 writes it
    refs: list[tuple[dict, str]] = []  # (a schema of the result, its $ref's path), checked once the result is whole
    uniques: list[tuple[dict, str]] = []  # (a schema of the result with uniqueItems true, its path), the same

    def visit(node, path: str):
        nonlocal rewritten
        if not isinstance(node, dict):
            return node
        out: dict = {}
        for keyword, value in node.items():
            if keyword in NARROWING_ONLY or keyword == "patternProperties" or keyword in DYNAMIC_REFS:
                drop(f"{path}.{keyword}")
            elif keyword.startswith("x-") or keyword in EDITOR_ANNOTATIONS or keyword in NAMING_ONLY and (
                    keyword != "id" or isinstance(value, str)):  # draft-04's id is a URI; a schema there is a mistake
                annotations.append(keyword)  # another vocabulary's annotation: nothing to follow, nothing lost
            elif keyword in _SUBSCHEMA_MAPS and isinstance(value, dict):
                out[keyword] = {name: visit(each, f"{path}.{keyword}.{name}") for name, each in value.items()}
            elif keyword in _SUBSCHEMA_LISTS and isinstance(value, list):
                out[keyword] = [visit(each, f"{path}.{keyword}[{i}]") for i, each in enumerate(value)]
            elif keyword in _SUBSCHEMA:
                out[keyword] = visit(value, f"{path}.{keyword}")
            else:
                out[keyword] = value
                if keyword == "$ref" and isinstance(value, str) and value.startswith("#"):
                    refs.append((out, path))
        patterns = node.get("patternProperties")
        extra = out.get("additionalProperties", "properties" not in out)
        if isinstance(patterns, dict) and patterns and extra is not True and extra != {}:
            # a key matching a pattern takes a value of that pattern's schema (2020-12 core, section 10.3.2.2),
            # which additionalProperties (false, or absent beside properties) would refuse: any key not listed may
            # have a value of any of them, or of additionalProperties
            options = ([] if extra is False else [extra]) + [visit(each, f"{path}.patternProperties.{name}")
                                                             for name, each in patterns.items()]
            out["additionalProperties"] = options[0] if len(options) == 1 else {"anyOf": options}
        pattern = out.get("pattern")
        if isinstance(pattern, str):
            try:
                string_matcher(pattern)
            except (PatternError, RecursionError) as exc:
                del out["pattern"]
                drop(f"{path}.pattern ({getattr(exc, 'problem', 'nested too deeply')})")
        name = out.get("format")
        if isinstance(name, str) and (name not in ANY_STRING_FORMATS and (
                isinstance(out.get("pattern"), str) or name not in NUMBER_FORMATS and _format_pattern(name) is None)
                or not _format_fits_type(name, out.get("type"))):
            # a format followed nowhere here, one beside a pattern (a string of both), or one of a type the schema's
            # type leaves out (protobuf's JSON int64, {"type": "string", "format": "int64"}, which compile_schema
            # refuses by name; a password format on an integer, which any string has but no number)
            del out["format"]
            drop(f"{path}.format {json.dumps(name)[:60]}")
        read = draft04_exclusive(openapi_nullable(out))
        if read is not out:  # in place: refs holds this dict, whose $ref may yet be pointed at a copy
            rewritten = True
            out.clear()
            out.update(read)
        if out.get("uniqueItems") is True:
            uniques.append((out, path))
        return out

    lenient = visit(schema, "$")
    if dropped or annotations or rewritten:
        _point_refs_at_copies(schema, lenient, refs, visit)
    compiler = _Compiler(lenient, unique=False) if uniques else None
    for array, path in uniques:  # judged on the whole result, whose $ref now point where the compiler reads them
        refused = _unique_refused(compiler, array)
        if refused is not None:
            del array["uniqueItems"]
            drop(f"{path}.uniqueItems ({refused})")
    if not dropped and not annotations and not rewritten:
        return schema, ()
    return lenient, (*dropped, f"and {unnamed:,} more") if unnamed else tuple(dropped)


def _format_fits_type(name: str, kinds) -> bool:
    """The followed ``format`` ``name`` belongs to a type that ``kinds`` (a schema's ``type``) names: a number's
    (NUMBER_FORMATS) beside ``number`` or ``integer``, a string's beside ``string``. True where ``kinds`` is no
    type name or list of them (absent: the format implies the type, see :func:`_implied_kind`)."""
    listed = [kinds] if isinstance(kinds, str) else kinds
    if not isinstance(listed, list):
        return True
    return "number" in listed or "integer" in listed if name in NUMBER_FORMATS else "string" in listed


def _point_refs_at_copies(schema, lenient, refs: list, visit) -> None:
    """Point each local ``$ref`` of ``lenient`` (``refs``: (its schema, its path)) that no longer resolves there
    (it points into a part dropped) at a copy of its target in ``schema``, read by ``visit`` and put under
    ``lenient``'s ``$defs``."""
    moved: dict = {}  # a ref (canonical_ref) that points into a dropped part -> the ref to its copy under $defs
    while refs and isinstance(lenient, dict) and isinstance(lenient.get("$defs", {}), dict):
        out, path = refs.pop()
        ref = out["$ref"]
        try:
            resolve_ref(lenient, ref)
            continue
        except SchemaError:
            pass
        try:
            target = resolve_ref(schema, ref)
            canonical = canonical_ref(ref)  # one copy per part: "#/properties/%61/not" and "#/properties/a/not" were
            # a copy each, so thousands of spellings of one ref copied one large part thousands of times
        except SchemaError:
            continue  # it points at nothing in the schema either: compile_schema refuses it by name
        if canonical not in moved:
            definitions = lenient.setdefault("$defs", {})
            key = f"lenient{len(moved)}"
            while key in definitions:
                key += "_"
            moved[canonical] = ref_text(("$defs", key))
            definitions[key] = visit(target, f"{path} ($ref {ref})")
        out["$ref"] = moved[canonical]


class _Compiler:
    def __init__(self, root: dict, unique: bool = True):
        self.root = root
        self.follows_unique = unique  # False: uniqueItems read as absent (lenient_schema's check of its items)
        self.definitions: dict = {}
        self.pending: dict = {}  # refs seen, compiled after the tree (so recursion needs no look-ahead)
        self.unique: list = []  # (array node, path) with uniqueItems true, checked once the definitions are in
        self.intersecting: dict = {}  # an intersection's schema (as JSON) being compiled -> its definition's name
        self.recursive: set = set()  # those names met again inside themselves
        self.names: set = set()  # every name given to an intersection

    def lookup(self, ref: str) -> dict | bool:
        return resolve_ref(self.root, ref)

    def is_false(self, schema) -> bool:
        """``schema`` is the schema false (JSON Schema 2020-12 core, section 4.3.2), or a ``$ref`` with only
        annotations beside it that points at false (through other such refs): either is left out where a value may
        be left out (an anyOf / oneOf option, a prefixItems position, items, additionalProperties), as
        ``{"$defs": {"Never": false}}`` and ``{"$ref": "#/$defs/Never"}`` write it. A ref that points at nothing
        is not false here; :meth:`node` refuses it by name."""
        seen: set = set()
        while isinstance(schema, dict) and isinstance(schema.get("$ref"), str) and all(
                keyword in ANNOTATIONS or keyword in ("$ref", "$defs", "definitions") for keyword in schema):
            ref = schema["$ref"]
            if ref in seen:
                return False
            seen.add(ref)
            try:
                schema = self.lookup(ref)
            except SchemaError:
                return False
        return schema is False

    def define_pending(self) -> None:
        """Compile the definitions that the refs met so far point at (a definition may refer to others not yet
        seen)."""
        while len(self.definitions) < len(self.pending):
            ref = next(ref for ref in self.pending if ref not in self.definitions)
            self.definitions[ref] = self.node(self.lookup(ref), ref)

    def node(self, schema, path: str) -> SchemaNode:
        if schema is True or schema == {}:
            return SchemaNode("any")
        if schema is False:  # valid JSON Schema (2020-12 core, section 4.3.2); left out where it is a property, an
            # anyOf / oneOf option or a position (_object, _combined, _array), so met here where a value must be
            raise SchemaError(f"{path} is the schema false, which no value satisfies, where a value must be written",
                              "give it a schema, or drop it and any $ref that points at it")
        if not isinstance(schema, dict):
            raise SchemaError(f"{path}: a schema must be an object or true, got {json.dumps(schema)[:60]}",
                              "fix the schema")
        if "$ref" in schema:
            ref = schema["$ref"]
            if not isinstance(ref, str):
                raise SchemaError(f"{path}.$ref must be a string, got {ref!r}", "fix the schema")
            if any(keyword not in ANNOTATIONS and keyword not in ("$ref", "$defs", "definitions") for keyword in schema):
                # JSON Schema 2020-12 core, section 8.2.3.1: $ref is an applicator beside its siblings, each applying
                # to the same instance, as an allOf of the referenced schema and them (draft-07 ignored them)
                return self._intersected_node(schema, path)
            self.lookup(ref)
            ref = canonical_ref(ref)  # "#/$defs/a%20b" and "#/$defs/a b" are one definition
            self.pending.setdefault(ref, None)
            return SchemaNode("ref", ref=ref)
        if _intersected(schema):
            return self._intersected_node(schema, path)
        if "const" in schema or "enum" in schema:
            return self._literal(schema, path)
        for combiner in ("anyOf", "oneOf", "allOf"):
            if combiner in schema:
                return self._combined(schema, combiner, path)
        kinds = schema.get("type")
        if kinds is None:  # read as llama.cpp's converter reads them (visit: properties / additionalProperties,
            # items / prefixItems without a type)
            if any(keyword in schema for keyword in OBJECT_KEYWORDS):
                kinds = "object"
            elif "items" in schema or "prefixItems" in schema:
                kinds = "array"
            else:
                kinds = _implied_kind(schema, path)
                if kinds is None:
                    self._refuse(schema, path, {"$defs", "definitions"})
                    return SchemaNode("any")
        kinds = _kinds(kinds, path)
        allowed = {"type", "$defs", "definitions"}.union(*(TYPE_KEYWORDS[k] for k in kinds))
        self._refuse(schema, path, allowed)
        if "format" in schema and "string" not in kinds and not (isinstance(schema["format"], str)
                                                               and schema["format"] in NUMBER_FORMATS):
            raise SchemaError(f"{path}.format {json.dumps(schema['format'], default=repr)[:60]} is not supported on "
                              f"{' / '.join(kinds)} (supported: {', '.join(NUMBER_FORMATS)}, OpenAPI's)",
                              "drop it, or express it with minimum / maximum")
        nodes = [self._typed(schema, kind, path) for kind in kinds]
        return nodes[0] if len(nodes) == 1 else SchemaNode("choice", options=tuple(nodes))

    def _intersected_node(self, schema: dict, path: str) -> SchemaNode:
        """The node of an intersection (an allOf, a combiner or a $ref beside other keywords): the node of the one
        schema :meth:`_intersection` merges it into. Its $refs are inlined, so a recursive definition holding such
        an intersection of itself (``"next": {"anyOf": [{"$ref": "#/$defs/Node"}, {"type": "null"}], "type":
        [...]}``) would be inlined again at every level, without end (a RecursionError); met again inside itself,
        the same intersection is a ref to a definition of its own (named by the path where it was first met).
        JSON Schema allows such recursion; llama.cpp's converter makes a rule of each $ref, so it recurses too."""
        key = json.dumps(schema, sort_keys=True, default=repr)  # its refs are pointers into the root: no context
        if key in self.intersecting:
            name = self.intersecting[key]
            self.recursive.add(name)
            self.pending.setdefault(name, None)
            return SchemaNode("ref", ref=name)
        name = f"{path} (intersection)"
        while name in self.names:
            name = f"{path} (intersection {len(self.names)})"
        self.names.add(name)
        self.intersecting[key] = name
        try:
            node = self._options_node(self._merged_ways([(path, schema, frozenset())], path), path)
        finally:
            del self.intersecting[key]
        if name in self.recursive:
            self.definitions[name] = node
        return node

    def _options_node(self, merged: list, path: str) -> SchemaNode:
        """The node of an intersection's result (``(schema, way)`` per option, see :meth:`_merged_ways`), its options
        that admit no value left out: ``{"anyOf": [{"maximum": 3}, {"minimum": 10}], "minimum": 5}`` is the integers
        from 10 (its first option, maximum 3 with minimum 5, is empty), where the whole schema was refused as "no
        integer lies within its bounds". An option is dropped only where it has no value itself (a required
        property, not an optional one or an item, see :meth:`_inner`) and the merge made that: a schema of its way
        that has no value alone is the author's contradiction, refused as a plain schema's is. :class:`_Empty`
        where none is left."""
        if len(merged) == 1:
            return self.node(merged[0][0], path)
        nodes, empty = [], None
        for i, (option, way) in enumerate(merged):
            try:
                nodes.append(self.node(option, f"{path}.anyOf[{i}]"))
            except _Empty as exc:
                self._refuse_empty_alone(way)
                empty = empty or exc
        if not nodes:
            raise empty
        return nodes[0] if len(nodes) == 1 else SchemaNode("choice", options=tuple(nodes))

    def _refuse_empty_alone(self, way: list) -> None:
        """Raise the :class:`SchemaError` of a schema of ``way`` (``(where, keywords, refs)``) that has no value
        alone: its contradiction is the author's, not one the merge made."""
        for where, keywords, _ in way:
            try:
                self.node(dict(keywords), where)
            except _Empty as exc:
                raise SchemaError(exc.problem, exc.fix) from exc
            except SchemaError:  # a keyword read only beside the others (a type's keywords without it): not empty
                continue

    def _inner(self, schema, path: str) -> SchemaNode:
        """The node of a schema inside another whose values do not need one of it (an optional property, an item,
        additionalProperties: ``{}`` and ``[]`` are still values): where it has none, the schema is refused by name,
        never dropped as an option whose contradiction the merge made (:meth:`_options_node`)."""
        try:
            return self.node(schema, path)
        except _Empty as exc:
            raise SchemaError(exc.problem, exc.fix) from exc

    def _literal(self, schema: dict, path: str) -> SchemaNode:
        """``enum`` / ``const``: the values an instance may be, those of the ``type`` beside them only (an
        instance must satisfy every keyword: JSON Schema 2020-12 validation, sections 6.1.1-6.1.3)."""
        enum = schema.get("enum")
        if "enum" in schema and (not isinstance(enum, list) or not enum):
            raise SchemaError(f"{path}.enum must be a non-empty array, got {json.dumps(enum, default=repr)[:60]}",
                              "fix the schema")
        literal = "const" if "const" in schema else "enum"
        where = f"{path}.const" if "const" in schema else f"{path}.enum"
        texts = dict.fromkeys(_json_text(value, where) for value in ([schema["const"]] if "const" in schema
                                                                     else enum))
        if "const" in schema and "enum" in schema:  # compared as instances (1 equals 1.0, keys in any order)
            listed = {_instance_key(value) for value in enum}
            texts = {text: None for text in texts if _instance_key(json.loads(text)) in listed}
        if "type" in schema:
            kinds = _kinds(schema["type"], path)
            texts = {text: None for text in texts if any(_of_type(json.loads(text), kind) for kind in kinds)}
        beside = [keyword for keyword in schema if keyword not in {"const", "enum", "type", "$defs", "definitions"}
                  and keyword not in ANNOTATIONS and keyword not in LITERAL_FILTERS]
        if beside and texts:  # items, properties ... beside the values: supported alone, not as a filter of an enum
            # (checked once the type has filtered them: an option that a type beside an anyOf leaves no value, such
            # as {"const": null} under {"type": "object", "properties": ...}, is empty and dropped, not refused)
            raise SchemaError(f"{path}: keyword {beside[0]!r} beside {literal} is not supported by the JSON schema "
                              f"constraint here (it writes the {literal}'s values and does not filter them by "
                              f"{beside[0]!r})", f"keep only the {literal} values that satisfy {beside[0]!r} and drop "
                              "it, or check the answer yourself")
        filters = {keyword: value for keyword, value in schema.items() if keyword in LITERAL_FILTERS}
        if filters:
            satisfies = self._literal_filter(filters, path)
            texts = {text: None for text in texts if satisfies(json.loads(text))}
        if not texts:
            also = (["in its enum"] if "const" in schema and "enum" in schema else []) + \
                   ([f"of its type {schema['type']!r}"] if "type" in schema else []) + \
                   ([f"within its {', '.join(f'{k} {json.dumps(v, default=repr)[:40]}' for k, v in filters.items())}"]
                    if filters else [])
            raise _Empty(f"{path}: no value of its {'const' if 'const' in schema else 'enum'} is also "
                         f"{' and '.join(also)}, so no answer could follow it",
                         "make its const, enum and type agree" + (f" with {', '.join(filters)}" if filters else ""))
        return SchemaNode("literal", literals=tuple(texts))

    def _literal_filter(self, filters: dict, path: str):
        """Whether an enum / const value also satisfies the string and number keywords beside it (JSON Schema
        2020-12 validation, section 6: each applies to values of its type only, so ``maxLength`` passes a number):
        a string's ``minLength`` / ``maxLength`` (code points), ``format`` (followed as :meth:`_string` follows
        it) and ``pattern`` (read over every character of the value, as a validator reads it: a quote, a
        backslash or a control character included, which the answer writes escaped, so ``{"enum": ["a\\"b"],
        "pattern": "^a.b$"}`` keeps its value; both, where both are given), a number's bounds (and
        OpenAPI's int32 / int64) and ``multipleOf``, compared exactly as the decimals written. OpenAPI-derived tool
        schemas write them so (Stripe's ``{"type": "string", "enum": [...], "maxLength": 5000}``), and llama.cpp's
        converter writes the enum's values and ignores them; such a schema was refused."""
        text_keywords = {k: v for k, v in filters.items() if k in TYPE_KEYWORDS["string"] and k != "pattern"
                         and not (k == "format" and isinstance(v, str) and v in NUMBER_FORMATS)}
        string = self._string(text_keywords, path) if text_keywords else None
        # the pattern is read over every character a value holds: a value with a quote, a backslash or a control
        # character (written escaped in the answer) that matches it is one (the string constraint's own matcher,
        # over what the answer writes unescaped, left such values out, or refused a pattern that needs one)
        matcher = None
        if "pattern" in filters:
            pattern = filters["pattern"]
            if not isinstance(pattern, str):
                raise SchemaError(f"{path}.pattern: a pattern must be a string (an ECMA-262 regular expression), "
                                  f"got {json.dumps(pattern, default=repr)[:60]}", "write the pattern as a string")
            try:
                matcher = string_matcher(pattern, every=True)
            except (PatternError, RecursionError) as exc:
                raise SchemaError(f"{path}.pattern: {getattr(exc, 'problem', 'nested too deeply')}",
                                  getattr(exc, "fix", None) or "simplify it") from exc
        bounds = _bounds(filters, path)
        _multiple(filters, path, "integer")  # a factor that is a number greater than 0, or refused by name
        factor = _exact(filters["multipleOf"]) if "multipleOf" in filters else None

        def satisfies(value) -> bool:
            if isinstance(value, str):
                for content in (string and string.content, matcher):
                    if content is not None:
                        state = content.feed(content.start(), value.encode())
                        if state is None or not content.accepts(state):
                            return False
                return string is None or string.min_length <= len(value) and (string.max_length is None
                                                                              or len(value) <= string.max_length)
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                number = _exact(value)
                for name, bound in bounds:
                    bound = _exact(bound)
                    if not {"minimum": number >= bound, "exclusiveMinimum": number > bound,
                            "maximum": number <= bound, "exclusiveMaximum": number < bound}[name]:
                        return False
                return factor is None or (number / factor).denominator == 1
            return True

        return satisfies

    def _combined(self, schema: dict, combiner: str, path: str) -> SchemaNode:
        options = schema[combiner]
        if not isinstance(options, list) or not options:
            raise SchemaError(f"{path}.{combiner} must be a non-empty array of schemas", "fix the schema")
        self._refuse(schema, path, {combiner, "$defs", "definitions"} | ({"discriminator"} if combiner != "allOf"
                                                                          else set()))
        # an option false (2020-12 core, section 4.3.2: no value) adds nothing to an anyOf / oneOf: left out
        kept = [(i, option) for i, option in enumerate(options) if combiner == "allOf" or not self.is_false(option)]
        if not kept:
            raise SchemaError(f"{path}.{combiner}: every option is the schema false, so no value satisfies it",
                              f"give the {combiner} an option that is a schema")
        nodes = tuple(self.node(option, f"{path}.{combiner}[{i}]") for i, option in kept)
        return nodes[0] if len(nodes) == 1 else SchemaNode("choice", options=nodes)

    # ------------------------------------------------------------------ allOf: an intersection of schemas
    def _intersection(self, components: list, path: str) -> dict:
        """One schema whose instances are those of every component (``(where, schema, refs)``; ``refs``: the
        definitions inlined on the way to it): ``allOf`` (JSON Schema 2020-12 core, section 10.2.1.1), and the
        keywords beside an ``anyOf`` / ``oneOf``, which apply to the same instance. ``$ref`` components are
        inlined and nested ``allOf`` flattened, as llama.cpp's converter does (``_visit_all_of``); an ``anyOf`` /
        ``oneOf`` component is distributed (allOf[X, anyOf[A, B]] is anyOf[allOf[X, A], allOf[X, B]]), where
        llama.cpp makes its options' properties optional ones of one object, which lets through an instance
        with none of them. The components' keywords are merged by :meth:`_merge`; an option whose intersection
        has no value is dropped, and where none is left :class:`_Empty` says why."""
        merged = [result for result, _ in self._merged_ways(components, path)]
        return merged[0] if len(merged) == 1 else {"anyOf": merged}

    def _merged_ways(self, components: list, path: str) -> list[tuple[dict, list]]:
        """:meth:`_intersection`'s options, each ``(merged schema, way)``: the way its components (``(where,
        keywords, refs)``) that were merged into it."""
        ways: list = [[]]
        for where, schema, refs in components:
            ways = _conjoin(ways, self._dnf(schema, where, refs), path)
        merged, empty = [], None
        for way in ways:
            try:
                result = self._merge(way, path)
            except _Empty as exc:
                empty = empty or exc
                continue
            if all(not _same(result, other) for other, _ in merged):
                merged.append((result, way))
        if not merged:
            raise empty
        return merged

    def _dnf(self, schema, where: str, refs: frozenset) -> list:
        """``schema`` as the options (anyOf) of conjunctions (allOf) of schemas with no ``$ref``, ``allOf``,
        ``anyOf`` or ``oneOf`` of their own: a list of lists of ``(where, keywords, refs)``."""
        if schema is True or schema == {}:
            return [[]]
        if schema is False:
            raise _Empty(f"{where} is false, which no value satisfies", "drop it or give it a schema")
        if not isinstance(schema, dict):
            raise SchemaError(f"{where}: a schema must be an object or true, got {json.dumps(schema)[:60]}",
                              "fix the schema")
        rest = {keyword: value for keyword, value in schema.items()
                if keyword not in ANNOTATIONS and keyword not in ("$defs", "definitions", "discriminator")}
        ways: list = [[]]
        if "$ref" in rest:
            ref = rest.pop("$ref")
            if not isinstance(ref, str):
                raise SchemaError(f"{where}.$ref must be a string, got {ref!r}", "fix the schema")
            target, ref = self.lookup(ref), canonical_ref(ref)
            if ref in refs:
                raise SchemaError(f"{where}: $ref {ref!r} is intersected (allOf) with another schema inside its own "
                                  "definition; such a recursive intersection is not supported",
                                  "write the recursive definition without allOf")
            ways = _conjoin(ways, self._dnf(target, f"{where} ($ref {ref})", refs | {ref}), where)
        combined = {combiner: rest.pop(combiner) for combiner in ("allOf", "anyOf", "oneOf") if combiner in rest}
        for combiner, options in combined.items():
            if not isinstance(options, list) or not options:
                raise SchemaError(f"{where}.{combiner} must be a non-empty array of schemas", "fix the schema")
        for i, option in enumerate(combined.get("allOf", ())):
            ways = _conjoin(ways, self._dnf(option, f"{where}.allOf[{i}]", refs), where)
        if rest:  # the schema's own keywords: after its $ref's and allOf's properties, before its options'
            ways = _conjoin(ways, [[(where, rest, refs)]], where)
        for combiner, options in combined.items():
            if combiner == "allOf":
                continue
            alternatives, empty = [], None
            for i, option in enumerate(options):  # oneOf is followed as anyOf, as elsewhere here
                try:
                    alternatives += self._dnf(option, f"{where}.{combiner}[{i}]", refs)
                except _Empty as exc:
                    empty = empty or exc
            if not alternatives:
                raise empty
            ways = _conjoin(ways, alternatives, where)
        return ways

    def _merge(self, way: list, path: str) -> dict:
        """The keywords of the schemas in ``way`` (``(where, keywords, refs)``, none with a ``$ref`` or a
        combiner) as one schema that an instance satisfies exactly when it satisfies each of them: the tighter
        of two bounds, the common types (an integer is a number), the common ``enum`` / ``const`` values, the
        union of ``properties`` and of ``required``, a property given by several of them (or by one and
        another's ``additionalProperties``) the intersection of their schemas. Keywords that cannot be
        merged (two different patterns, formats or prefixItems) are refused by name."""
        if not way:
            return {}
        if len(way) == 1:
            return dict(way[0][1])
        count, refs = len(way), frozenset().union(*(each[2] for each in way))
        merged: dict = {}
        given: dict = {}  # keyword -> where its merged value was first given
        # the type is settled first: the keywords of a type it leaves out constrain nothing, so two of them that
        # have no value in common (a property of two types) do not empty a null option
        typed = [(where, keywords["type"]) for where, keywords, _ in way if "type" in keywords]
        for where, value in typed:
            merged["type"] = value if "type" not in merged else self._meet("type", (given["type"], merged["type"]),
                                                                              (where, value), path, count, refs)
            given.setdefault("type", where)
        others = _other_type_keywords(merged, path)
        for where, keywords, _ in way:
            for keyword, value in keywords.items():
                if keyword in OBJECT_KEYWORDS or keyword in ("const", "enum", "type") or keyword in others:
                    continue
                if keyword not in merged:
                    merged[keyword], given[keyword] = value, where
                elif not _same(merged[keyword], value):
                    merged[keyword] = self._meet(keyword, (given[keyword], merged[keyword]), (where, value), path,
                                                 count, refs)
        tuples = [where for where, keywords, _ in way if "prefixItems" in keywords]
        items = [where for where, keywords, _ in way if "items" in keywords and "prefixItems" not in keywords]
        if tuples and items and "items" not in others:  # the other's items apply to the tuple's positions too, which prefixItems does not say
            raise SchemaError(f"{path}: {tuples[0]} gives prefixItems and {items[0]} items for every position; "
                              "an intersection of the two is not supported",
                              f"give the items' schema in {tuples[0]}'s prefixItems and items")
        literals = _common_literals(way, path, count)
        if literals is not None:
            merged["enum"] = literals
        if "properties" not in others and any(keyword in keywords for _, keywords, _ in way
                                              for keyword in OBJECT_KEYWORDS):
            self._merge_object(way, merged, path, count, refs)
        return _without_other_types(merged, path)

    def _meet(self, keyword: str, first: tuple, second: tuple, path: str, count: int, refs: frozenset):
        """The value of ``keyword`` that two schemas giving it (``(where, value)`` each) leave together."""
        (where_a, a), (where_b, b) = first, second
        if keyword == "type":
            kinds = _common_kinds(_kinds(a, where_a), _kinds(b, where_b))
            if not kinds:
                raise _Empty(f"{path}: an allOf of {count} schemas with no value in common: {where_a} has type "
                             f"{a!r} and {where_b} type {b!r}", "make the schemas' types agree")
            return kinds[0] if len(kinds) == 1 else kinds
        if keyword in COUNT_KEYWORDS:  # 2.0 is the count 2; a null upper count is no bound
            counts = [count for count in (_count({keyword: a}, keyword, where_a), _count({keyword: b}, keyword,
                                                                                          where_b))
                      if count is not None]
            return None if not counts else max(counts) if keyword in LOWER_BOUNDS else min(counts)
        if keyword in LOWER_BOUNDS or keyword in UPPER_BOUNDS:
            for where, value in first, second:
                _bound({keyword: value}, keyword, where)
            return max(a, b) if keyword in LOWER_BOUNDS else min(a, b)
        if keyword == "uniqueItems" and isinstance(a, bool) and isinstance(b, bool):
            return a or b
        if keyword == "multipleOf":
            for where, value in first, second:
                _multiple({keyword: value}, where, "integer")  # a number greater than 0
            if isinstance(a, int) and isinstance(b, int):
                return math.lcm(a, b)
            ratio = Fraction(Decimal(repr(a))) / Fraction(Decimal(repr(b)))
            if ratio.denominator == 1 or ratio.numerator == 1:  # one is a multiple of the other: it holds
                return a if ratio.denominator == 1 else b
        if keyword == "items":
            if a is False or b is False:
                return False
            try:
                return self._intersection([(f"{where_a}.items", a, refs), (f"{where_b}.items", b, refs)],
                                          f"{path}.items")
            except _Empty:  # no item can be written: only the items before them (prefixItems) may come
                return False
        what = {"pattern": "a string of both patterns", "format": "a string of both formats",
                "multipleOf": "a multiple of both that is not one of the two",
                "prefixItems": "an intersection of two tuples"}.get(keyword, "their intersection")
        raise SchemaError(f"{path}: {where_a} and {where_b} both give {keyword!r}, as "
                          f"{json.dumps(a, default=repr)[:60]} and {json.dumps(b, default=repr)[:60]}; "
                          f"{what} is not supported",
                          f"give {keyword!r} in one of them only, or make the two the same")

    def _merge_object(self, way: list, merged: dict, path: str, count: int, refs: frozenset) -> None:
        """``properties``, ``required`` and ``additionalProperties`` of the schemas in ``way``, into ``merged``.
        A property's value must satisfy every schema that lists it and the ``additionalProperties`` of every
        one that does not (JSON Schema 2020-12 core, section 10.3.2.3); a property that one of them forbids
        (``additionalProperties: false`` without it) is left out, or has no value if it is required. Keys
        beyond the properties are written only where each schema that says so allows them."""
        given: dict = {}  # name -> [(where, schema)] of the schemas that list it
        required: dict = {}  # name -> where it is required (first)
        for where, keywords, _ in way:
            listed = keywords.get("properties", {})
            if not isinstance(listed, dict):
                raise SchemaError(f"{where}.properties must be an object of property schemas, got "
                                  f"{json.dumps(listed, default=repr)[:60]}", "fix the schema")
            names = keywords.get("required", [])
            if not isinstance(names, list) or not all(isinstance(name, str) for name in names):
                raise SchemaError(f"{where}.required must be an array of property names, got "
                                  f"{json.dumps(names, default=repr)[:60]}", "fix the schema")
            for name, value in listed.items():
                given.setdefault(name, []).append((f"{where}.properties.{name}", value))
            for name in names:
                required.setdefault(name, where)
        others = [(where, keywords["additionalProperties"], keywords.get("properties", {}))
                  for where, keywords, _ in way if "additionalProperties" in keywords]
        properties = {}
        for name, schemas in given.items():
            for where, extra, listed in others:
                if name in listed or extra is True or extra == {}:
                    continue
                if extra is False:
                    if name in required:
                        raise _Empty(f"{path}: an allOf of {count} schemas with no value in common: "
                                     f"{required[name]} requires {name!r}, which {where} does not list and its "
                                     "additionalProperties false forbids", f"list {name!r} in {where}'s properties")
                    break
                schemas = schemas + [(f"{where}.additionalProperties", extra)]
            else:
                distinct = []
                for where, value in schemas:
                    if value is not True and value != {} and all(not _same(value, seen) for _, seen in distinct):
                        distinct.append((where, value))
                if len(distinct) < 2:
                    properties[name] = distinct[0][1] if distinct else {}
                    continue
                try:
                    properties[name] = self._intersection([(where, value, refs) for where, value in distinct],
                                                          f"{path}.properties.{name}")
                except _Empty:
                    if name in required:
                        raise
                    properties[name] = False  # never written, and no further key of another schema may take it
        merged["properties"] = properties
        if required:
            merged["required"] = list(required)
        extras = [extra for _, extra, _ in others if extra is not True and extra != {}]
        if not others:
            return
        if not extras:
            merged["additionalProperties"] = True
        elif any(extra is False for extra in extras) or len(extras) == 1:
            merged["additionalProperties"] = False if any(extra is False for extra in extras) else extras[0]
        else:
            try:
                merged["additionalProperties"] = self._intersection(
                    [(f"{where}.additionalProperties", extra, refs) for where, extra, _ in others
                     if extra is not True and extra != {}], f"{path}.additionalProperties")
            except _Empty:
                merged["additionalProperties"] = False

    def _typed(self, schema: dict, kind: str, path: str) -> SchemaNode:
        if kind == "boolean":
            return SchemaNode("literal", literals=(b"true", b"false"))
        if kind == "null":
            return SchemaNode("literal", literals=(b"null",))
        if kind == "array":
            return self._array(schema, path)
        if kind == "object":
            return self._object(schema, path)
        if kind == "string":
            return self._string(schema, path)
        if kind == "integer":
            return self._integer(schema, path)
        return self._number(schema, path)

    @staticmethod
    def _string(schema: dict, path: str) -> SchemaNode:
        given, kinds = schema.get("format"), schema.get("type")
        numbers_beside = isinstance(kinds, list) and ("integer" in kinds or "number" in kinds)
        if isinstance(given, str) and (given in ANY_STRING_FORMATS or given in NUMBER_FORMATS and numbers_beside):
            # any string has it: nothing to follow (a number's format, beside a type list such as ["integer",
            # "string"], constrains only numbers: JSON Schema 2020-12 validation, section 7.1; on a string alone,
            # protobuf's JSON form of an int64 as decimal digits, it is not followed, so refused by name as before)
            schema = {keyword: value for keyword, value in schema.items() if keyword != "format"}
        low, high = _count(schema, "minLength", path), _count(schema, "maxLength", path)
        if high is not None and high < low:
            raise _Empty(f"{path}: maxLength {high} is below minLength {low}", "fix the schema")
        if "pattern" in schema and "format" in schema:
            raise SchemaError(f"{path}: pattern and format together are not supported (a string of both)",
                              "keep one of them and check the other yourself")
        pattern = schema.get("pattern")
        if "pattern" in schema and not isinstance(pattern, str):
            raise SchemaError(f"{path}.pattern: a pattern must be a string (an ECMA-262 regular expression), got "
                              f"{json.dumps(pattern, default=repr)[:60]}", "write the pattern as a string")
        if "format" in schema:
            pattern = _format_pattern(schema["format"])
            if pattern is None:
                raise SchemaError(f"{path}.format {json.dumps(schema['format'], default=repr)[:60]} is not supported "
                                  f"(supported: {', '.join((*FORMATS, *ANY_STRING_FORMATS))}, uuid1 ... uuid8)",
                                  "drop it, or write a pattern for it")
            implied = FORMAT_MAX_LENGTH.get(schema["format"])
            high = implied if high is None or implied is not None and implied < high else high
        try:
            content = None if pattern is None else string_matcher(pattern)
        except (PatternError, RecursionError) as exc:
            where = "format" if "format" in schema else "pattern"
            raise SchemaError(f"{path}.{where}: {getattr(exc, 'problem', 'nested too deeply')}",
                              getattr(exc, "fix", None) or "simplify it") from exc
        lengths = None
        if content is not None and (low > 0 or high is not None):
            where = f"format {schema['format']!r}" if "format" in schema else f"pattern {pattern!r}"
            if low > MAX_MIN_LENGTH:
                raise SchemaError(f"{path}: minLength {low} beside its {where} is past the {MAX_MIN_LENGTH:,} characters "
                                  "followed there (llama.cpp's grammar refuses any minLength past 2,000)",
                                  f"lower minLength to at most {MAX_MIN_LENGTH:,}, or drop the "
                                  f"{'format' if 'format' in schema else 'pattern'} and check it yourself")
            lengths = pattern_lengths(pattern, low, high)
            if not lengths.fits(content.start(), 0):
                within = f"minLength {low}" + ("" if high is None else f" and maxLength {high}")
                raise _Empty(f"{path}: no string of its {where} has a length within {within}",
                             "fix the bounds or the pattern")
        return SchemaNode("string", min_length=low, max_length=high, content=content, lengths=lengths)

    @staticmethod
    def _number(schema: dict, path: str) -> SchemaNode:
        """A number's bounds as the least and greatest multiple of 10**-16 (its finest step, in those units)
        that every bound given leaves (JSON Schema 2020-12 validation, section 6.2), read both as the
        decimals they are and as the doubles that a validator parsing JSON compares (see the module's
        docstring)."""
        lows, highs = [-LARGEST], [LARGEST]
        for name, value in _bounds(schema, path):
            lower, strict = name in ("minimum", "exclusiveMinimum"), name.startswith("exclusive")
            decimal = Fraction(value) if isinstance(value, int) else Fraction(Decimal(repr(value)))
            (lows if lower else highs).extend((_step_bound(decimal, lower, strict),
                                               _double_bound(Fraction(value), lower, strict)))
        multiple = _multiple(schema, path, "number")
        if len(lows) == len(highs) == 1 and multiple is None:
            return SchemaNode("number")
        low, high = max(lows), min(highs)
        if not _has_multiple(low, high, multiple):
            raise _Empty(f"{path}: no number of at most {NUMBER_DIGITS} digits before and after the point "
                         f"lies within its bounds ({_bounds_text(schema)})"
                         + (f" and is a multiple of {schema['multipleOf']}" if multiple else ""),
                         "fix the bounds")
        return SchemaNode("number", minimum=low, maximum=high, multiple=multiple)

    @staticmethod
    def _integer(schema: dict, path: str) -> SchemaNode:
        """The integers the bounds leave (JSON Schema 2020-12 validation, section 6.2: every bound given applies;
        a fractional bound keeps the integers on its side)."""
        lows, highs = [], []
        for name, value in _bounds(schema, path):
            if name == "minimum":
                lows.append(math.ceil(value))
            elif name == "exclusiveMinimum":
                lows.append(math.floor(value) + 1)
            elif name == "maximum":
                highs.append(math.floor(value))
            else:
                highs.append(math.ceil(value) - 1)
        low, high = max(lows, default=None), min(highs, default=None)
        multiple = _multiple(schema, path, "integer")
        if low is not None and high is not None and not _has_multiple(low, high, multiple):
            raise _Empty(f"{path}: no integer lies within its bounds "
                         f"({_bounds_text(schema)})"
                         + (f" and is a multiple of {schema['multipleOf']}" if multiple else ""),
                         "fix the bounds")
        return SchemaNode("integer", minimum=low, maximum=high, multiple=multiple)

    def _array(self, schema: dict, path: str) -> SchemaNode:
        low, high = _count(schema, "minItems", path), _count(schema, "maxItems", path)
        if high is not None and high < low:
            raise _Empty(f"{path}: maxItems {high} is below minItems {low}", "fix the schema")
        prefix = schema.get("prefixItems", [])
        after = schema.get("items", True)
        if isinstance(prefix, dict) and "items" not in schema:
            # one schema where 2020-12 asks for an array of them (validation, section 10.3.1.1): every item's, as
            # llama.cpp's converter reads it (visit: ``items`` or else ``prefixItems``; its test "string array",
            # {"type": "array", "prefixItems": {"type": "string"}}, is an array of strings)
            prefix, after = [], prefix
        elif not isinstance(prefix, list):
            shown = json.dumps(prefix, default=repr)[:60]
            if isinstance(prefix, dict):  # beside items: llama.cpp ignores it, which would drop what it asks for
                raise SchemaError(f"{path}.prefixItems is one schema ({shown}) beside items; it must be an array "
                                  "of schemas, one per position (JSON Schema 2020-12 validation, section 10.3.1.1)",
                                  'write the positions as "prefixItems": [{...}, ...], or move the schema for every '
                                  'item into "items"')
            raise SchemaError(f"{path}.prefixItems must be an array of schemas, one per position, got {shown}",
                              'write it as "prefixItems": [{"type": "string"}, ...], or give the schema of every '
                              'item as "items"')
        where = "prefixItems"
        if isinstance(after, list):  # draft 2019-09 / draft-07's tuple, as pydantic v1 and zod-to-json-schema write
            if "prefixItems" in schema:  # it: items' positions, then additionalItems (llama.cpp takes it too)
                raise SchemaError(f"{path}: prefixItems beside an array items (draft 2019-09's tuple form) is not "
                                  "supported", 'write the tuple once: "prefixItems": [...] and "items": the later '
                                  "items' schema")
            prefix, after, where = after, schema.get("additionalItems", True), "items"
        # (additionalItems beside no array items constrains nothing: draft 2019-09 core, section 9.3.1.2)
        if self.is_false(after):
            after = False
        ended = next((i for i, each in enumerate(prefix) if self.is_false(each)), None)
        if ended is not None:  # a position of the schema false has no item, so the array ends before it
            prefix, after = prefix[:ended], False
        prefix = tuple(self._inner(each, f"{path}.{where}[{i}]") for i, each in enumerate(prefix))
        unique = schema.get("uniqueItems", False) if self.follows_unique else False
        if not isinstance(unique, bool):
            raise SchemaError(f"{path}.uniqueItems must be true or false, got {json.dumps(unique, default=repr)[:60]}",
                              "fix the schema")
        if after is False:  # no items after the prefix (2020-12 validation, section 10.3.1.2)
            if low > len(prefix):
                later = "items" if where == "prefixItems" else "additionalItems"
                if ended is not None:
                    raise _Empty(f"{path}: minItems {low} asks for more items than the {len(prefix)} before "
                                 f"{where}[{ended}], the schema false, which no item satisfies",
                                 f"lower minItems or give {where}[{ended}] a schema")
                raise _Empty(f"{path}: minItems {low} asks for more items than its {len(prefix)} {where}, "
                             f"and {later} is false", f"lower minItems or give {later} a schema")
            high = len(prefix) if high is None else min(high, len(prefix))
            node = SchemaNode("array", prefix=prefix, items=None, min_items=low, max_items=high)
        else:
            items = self._inner(after, f"{path}.{'items' if where == 'prefixItems' else 'additionalItems'}")
            node = SchemaNode("array", prefix=prefix, items=items, min_items=low, max_items=high, unique=unique)
        if unique and _unique_beside_prefix(node):  # with items false too: its positions were left free to repeat
            raise SchemaError(f"{path}: uniqueItems beside {where} is not supported", "drop one of them")
        if node.unique:
            self.unique.append((node, path))
        return node

    def _object(self, schema: dict, path: str) -> SchemaNode:
        properties = schema.get("properties", {})
        required = schema.get("required", [])
        if not isinstance(properties, dict):
            raise SchemaError(f"{path}.properties must be an object of property schemas, got "
                              f"{json.dumps(properties, default=repr)[:60]}", "fix the schema")
        if not isinstance(required, list) or not all(isinstance(name, str) for name in required):
            raise SchemaError(f"{path}.required must be an array of property names, got "
                              f"{json.dumps(required, default=repr)[:60]}", "fix the schema")
        # An object with neither properties nor additionalProperties ({"type": "object"}) is any object, as JSON
        # Schema and llama.cpp's converter read it (visit: its "object" primitive); with properties, an absent
        # additionalProperties is read as false (see the module's docstring).
        extra = schema.get("additionalProperties", "properties" not in schema)
        if self.is_false(extra):
            extra = False
        unknown = [name for name in dict.fromkeys(required) if name not in properties]
        if unknown and extra is False and "additionalProperties" in schema:
            raise SchemaError(f"{path}.required names {unknown}, which are not among its properties and its "
                              "additionalProperties false forbids", "add them to properties or drop them from "
                              "required")
        forbidden = [name for name, value in properties.items() if self.is_false(value) and name in required]
        if forbidden:
            raise SchemaError(f"{path}.properties.{forbidden[0]} is the schema false, which no value satisfies, "
                              f"and {path}.required names it, so no object satisfies the schema",
                              f"drop {forbidden[0]!r} from required, or give it a schema")
        # a property false (2020-12 core, section 4.3.2) is never written: left out here, and still among the names
        # that a further key may not take
        # (a required property that has no value leaves the object none; an optional one is refused by name)
        listed = tuple((_json_text(name, f"{path}.properties")[1:-1],
                        (self.node if name in required else self._inner)(value, f"{path}.properties.{name}"),
                        name in required) for name, value in properties.items() if not self.is_false(value))
        if extra is False:
            # additionalProperties absent beside properties: no further keys are written, but a required key that
            # properties does not list is, with any value, as JSON Schema's default (true: 2020-12 core, section
            # 10.3.2.3) admits it; it was refused, so a tool whose required names a key its properties leave out
            # (llama.cpp's converter takes such a schema and leaves the key out) failed the whole request
            listed += tuple((_json_text(name, f"{path}.required")[1:-1], SchemaNode("any"), True) for name in unknown)
            return SchemaNode("object", properties=listed)
        additional = self._inner(extra, f"{path}.additionalProperties")
        # a required key that properties does not list: present, with a value of additionalProperties (JSON
        # Schema 2020-12 validation, section 6.5.3, and core, section 10.3.2.3)
        listed += tuple((_json_text(name, f"{path}.required")[1:-1], additional, True) for name in unknown)
        return SchemaNode("object", properties=listed, additional=additional,
                          names=frozenset(properties) | frozenset(unknown))

    @staticmethod
    def _refuse(schema: dict, path: str, allowed: set) -> None:
        for keyword in schema:
            if keyword not in allowed and keyword not in ANNOTATIONS:
                kinds = [kind for kind, keywords in TYPE_KEYWORDS.items() if keyword in keywords]
                if kinds and "type" in schema:  # supported, on values of another type than the schema's
                    raise SchemaError(f"{path}: keyword {keyword!r} constrains {' / '.join(kinds)} values only, and "
                                      f"its type is {json.dumps(schema['type'], default=repr)[:60]}, so it "
                                      "constrains nothing there", f"drop {keyword!r}, or add the type it is meant "
                                      f"for to type, e.g. \"type\": {json.dumps(_kinds(schema['type'], path) + kinds[:1])}")
                raise SchemaError(f"{path}: keyword {keyword!r} is not supported by the JSON schema constraint here",
                                  "drop it from the schema (supported: type, properties, required, "
                                  "additionalProperties, items, prefixItems, minItems, maxItems, minLength, "
                                  "maxLength, pattern, format, minimum, maximum, exclusiveMinimum, "
                                  "exclusiveMaximum, multipleOf, uniqueItems, enum, const, anyOf, oneOf, "
                                  "allOf, $ref to $defs) and check the "
                                  "answer yourself")


def _format_pattern(name) -> str | None:
    """The pattern a string of ``format`` ``name`` follows (None: a format not followed here)."""
    if not isinstance(name, str):
        return None
    version = VERSIONED_UUID.fullmatch(name)
    if version:
        return (rf"^[0-9a-fA-F]{{8}}-[0-9a-fA-F]{{4}}-{version[1]}[0-9a-fA-F]{{3}}-[89abAB][0-9a-fA-F]{{3}}-"
                r"[0-9a-fA-F]{12}$")
    return FORMATS.get(name)


def _implied_kind(schema: dict, path: str) -> str | None:
    """The type that the keywords of a schema with no ``type`` (and no object or array keyword) belong to: a
    string's (``pattern``, ``format`` of a string, ``minLength``, ``maxLength``), a number's (its bounds,
    ``multipleOf``, OpenAPI's number ``format``) or an array's counts; None for none. llama.cpp's converter
    (common/json-schema-to-grammar.cpp, visit) writes a string for a ``pattern`` or a string ``format`` without a
    type, and its ``resolves_to_string`` reads ``minLength`` / ``maxLength`` as a string's too; such keywords
    constrain only values of their type (JSON Schema 2020-12 validation, section 6), so a value of that type that
    satisfies them satisfies the schema. Keywords of two types without one are refused by name."""
    implied = {}
    for keyword in schema:
        if keyword == "format":
            name = schema[keyword]
            kind = None if not isinstance(name, str) else "number" if name in NUMBER_FORMATS else "string"
        else:
            kind = next((kind for kind in ("string", "number", "array") if keyword in TYPE_KEYWORDS[kind]), None)
        if kind is not None:
            implied.setdefault(kind, keyword)
    if len(implied) > 1:
        named = ", ".join(f"{keyword!r} ({kind})" for kind, keyword in implied.items())
        raise SchemaError(f"{path}: keywords of several types without a type: {named}",
                          f'give the schema a "type" (one of {", ".join(implied)}, or a list of them)')
    return next(iter(implied), None)


def _without_other_types(merged: dict, path: str) -> dict:
    """A merged schema without the keywords of types its ``type`` leaves out: each applies to values of its own type
    only (JSON Schema 2020-12 validation, section 6), so beside another type it constrains nothing. A keyword given
    beside an anyOf applies to every option (``{"anyOf": [{"type": "string"}, {"type": "null"}], "maxLength": 5}``),
    and the null option was refused as "keyword 'maxLength' is not supported"."""
    if "type" not in merged:
        return merged
    others = _other_type_keywords(merged, path)
    kinds = _kinds(merged["type"], path)
    name = merged.get("format")
    if isinstance(name, str) and ("string" not in kinds if name not in NUMBER_FORMATS
                                  else "number" not in kinds and "integer" not in kinds):
        others.add("format")  # a string's format beside numbers only, a number's beside strings only
    return {keyword: value for keyword, value in merged.items() if keyword not in others}


def _other_type_keywords(merged: dict, path: str) -> set:
    """The keywords of the types that a merged schema's ``type`` leaves out (none without a ``type``); ``format``,
    which a string and a number share, is told apart by its value (:func:`_without_other_types`)."""
    if "type" not in merged:
        return set()
    kinds = _kinds(merged["type"], path)
    return set().union(*TYPE_KEYWORDS.values()) - set().union(*(TYPE_KEYWORDS[kind] for kind in kinds))


def _intersected(schema: dict) -> bool:
    """``schema`` is an intersection: an ``allOf`` of several schemas, or a combiner beside other keywords
    that apply to the same instance (an ``allOf`` of one with only annotations beside it is that schema)."""
    combiners = [keyword for keyword in ("allOf", "anyOf", "oneOf") if keyword in schema]
    if not combiners:
        return False
    if len(combiners) > 1 or isinstance(schema.get("allOf"), list) and len(schema["allOf"]) > 1:
        return True
    return any(keyword not in ANNOTATIONS and keyword not in ("$defs", "definitions", "discriminator", *combiners)
               for keyword in schema)


def _conjoin(ways: list, options: list, path: str) -> list:
    """Every conjunction of one of ``ways`` with one of ``options`` (allOf distributed over anyOf)."""
    if len(ways) * len(options) > MAX_OPTIONS:
        raise SchemaError(f"{path}: its allOf with anyOf / oneOf spreads into {len(ways) * len(options)} "
                          f"options, more than the {MAX_OPTIONS} followed here",
                          "write the alternatives as one anyOf, or fewer of them")
    return [way + option for way in ways for option in options]


def _same(a, b) -> bool:
    """Two schemas or keyword values are the same JSON (``true`` is not ``1``)."""
    return json.dumps(a, sort_keys=True, default=repr) == json.dumps(b, sort_keys=True, default=repr)


def _common_kinds(a: list, b: list) -> list:
    """The types an instance of both type lists has (an integer is a number: JSON Schema 2020-12 validation,
    section 6.1.1)."""
    kinds = []
    for kind in a:
        if kind in b or kind == "integer" and "number" in b:
            kinds.append(kind)
        elif kind == "number" and "integer" in b:
            kinds.append("integer")
    return list(dict.fromkeys(kinds))


def _instance_key(value):
    """A JSON value as JSON Schema compares instances (2020-12 core, section 4.2.2: 1 equals 1.0, ``true``
    is no number, an object's keys in any order)."""
    if isinstance(value, bool) or value is None:
        return ("literal", value)
    if isinstance(value, (int, float)):
        return ("number", Fraction(value)) if _finite(value) else ("number", repr(value))
    if isinstance(value, list):
        return ("array", tuple(_instance_key(each) for each in value))
    if isinstance(value, dict):
        return ("object", frozenset((key, _instance_key(each)) for key, each in value.items()))
    return ("string", value)


def _common_literals(way: list, path: str, count: int) -> list | None:
    """The values the ``enum`` / ``const`` keywords of the schemas in ``way`` leave (None: none gives one)."""
    common, first = None, ""
    for where, keywords, _ in way:
        for keyword in ("enum", "const"):
            if keyword not in keywords:
                continue
            values = [keywords["const"]] if keyword == "const" else keywords["enum"]
            if not isinstance(values, list) or not values:
                raise SchemaError(f"{where}.enum must be a non-empty array, got "
                                  f"{json.dumps(values, default=repr)[:60]}", "fix the schema")
            if common is None:
                common, first = values, f"{where}.{keyword}"
                continue
            keys = {_instance_key(value) for value in values}
            common = [value for value in common if _instance_key(value) in keys]
            if not common:
                raise _Empty(f"{path}: an allOf of {count} schemas with no value in common: no value of {first} "
                             f"is in {where}.{keyword}", "make the schemas' enum and const values agree")
    return common


def _finite(value: int | float) -> bool:
    """A JSON number that is no NaN or infinity. A JSON integer is read by Python as an int of any size
    (RFC 8259 section 6 sets numbers no range; ``"minimum": 1e400`` written as its 401 digits is one), which
    ``math.isfinite`` cannot convert to a float: it raised OverflowError rather than take it."""
    return not isinstance(value, float) or math.isfinite(value)


def _count(schema: dict, name: str, path: str) -> int | None:
    """A string's or an array's count (COUNT_KEYWORDS: ``minLength``, ``maxItems``, ...) as an int: a non-negative
    integer, which JSON Schema reads as a number whose fraction is zero (2020-12 validation, section 6.1.1; its
    meta-schema's ``nonNegativeInteger``), so ``2.0``, as Python's json.dumps writes a float count, is 2. Absent, a
    lower count is 0 and an upper one None (no bound); a null upper count is no bound either."""
    lower = name in ("minLength", "minItems")
    value = schema.get(name, 0 if lower else None)
    if value is None and not lower:
        return None
    if isinstance(value, float) and value.is_integer() and value >= 0:
        return int(value)
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise SchemaError(f"{path}.{name} must be a non-negative integer, got {repr(value)[:60]}",
                          f"write {name} as a whole number of at least 0, or drop it")
    return value


def _bound(schema: dict, name: str, path: str) -> int | float:
    value = schema[name]
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not _finite(value):
        raise SchemaError(f"{path}.{name} must be a finite number, got {json.dumps(value, default=repr)[:60]}",
                          "fix the schema")
    return value


def _bounds(schema: dict, path: str) -> list[tuple[str, int | float]]:
    """The bounds of a number or integer: its bound keywords, and the range its OpenAPI ``format`` int32 or
    int64 names (NUMBER_FORMATS)."""
    bounds = [(name, _bound(schema, name, path)) for name in BOUND_KEYWORDS if name in schema]
    implied = NUMBER_FORMATS.get(schema.get("format")) if isinstance(schema.get("format"), str) else None
    return bounds + ([("minimum", implied[0]), ("maximum", implied[1])] if implied else [])


def _bounds_text(schema: dict) -> str:
    """The bounds a schema gives, as written, for an error message."""
    return ", ".join(f"{k} {schema[k]}" for k in (*BOUND_KEYWORDS, "format") if k in schema)


def _multiple(schema: dict, path: str, kind: str) -> int | None:
    """``multipleOf`` (JSON Schema 2020-12 validation, section 6.2.1: the value divided by it is an integer),
    read as the decimal it is written as, in the units of the node's bounds: an integer ``n`` is a multiple of
    ``p/q`` (lowest terms) exactly when ``p`` divides it; a number's values are counted in 10**-16, so its
    factor must be a short decimal (a power of ten, 0.01, 2.5) that is a whole number of those units."""
    if "multipleOf" not in schema:
        return None
    value = schema["multipleOf"]
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not _finite(value) or value <= 0:
        raise SchemaError(f"{path}.multipleOf must be a number greater than 0, got "
                          f"{json.dumps(value, default=repr)[:60]}", "fix the schema")
    decimal = Decimal(value) if isinstance(value, int) else Decimal(repr(value))
    factor = Fraction(decimal)
    if kind == "integer":
        return factor.numerator
    digits = decimal.normalize().as_tuple()
    if (factor * STEP).denominator != 1 or len(digits.digits) > MULTIPLE_DIGITS:
        raise SchemaError(f"{path}.multipleOf {value!r} is not supported on a number: only a decimal of at most "
                          f"{MULTIPLE_DIGITS} significant digits and {NUMBER_DIGITS} after the point (such as 0.01, "
                          "0.5 or 10) can be followed exactly", "write the factor as a short decimal, or use an "
                          "integer type")
    return int(factor * STEP)


def _exact(value: int | float) -> Fraction:
    """A JSON number as the decimal it is written as (a float by its shortest repr, as json.dumps writes it)."""
    return Fraction(value) if isinstance(value, int) else Fraction(Decimal(repr(value)))


def _has_multiple(low: int, high: int, multiple: int | None) -> bool:
    """Some integer in [low, high] is a multiple of ``multiple`` (None: any integer is)."""
    return low <= high if multiple is None else -(-low // multiple) * multiple <= high


def _step_bound(value: Fraction, lower: bool, strict: bool) -> int:
    """The least (``lower``) or greatest multiple of 10**-16, in those units, on the allowed side of ``value``."""
    scaled = value * STEP
    if lower:
        return math.floor(scaled) + 1 if strict else math.ceil(scaled)
    return math.ceil(scaled) - 1 if strict else math.floor(scaled)


def _even(double: float) -> bool:
    """The double's significand is even (IEEE 754 rounds a tie to it)."""
    return struct.unpack("<q", struct.pack("<d", double))[0] % 2 == 0


def _double_bound(value: Fraction, lower: bool, strict: bool) -> int:
    """The bound, in units of 10**-16, on the decimals whose nearest double (ties to even) lies on the allowed
    side of ``value``: a validator that parses the number as a double (Python's ``float``, pydantic,
    JavaScript) compares that double. Past 10**17 a bound leaves all or none of the writable numbers."""
    limit = Fraction(10 ** (NUMBER_DIGITS + 1))
    value = min(max(value, -limit), limit)
    towards = math.inf if lower else -math.inf
    edge = float(value)  # the nearest double; the first double on the allowed side is it or its neighbour
    if (Fraction(edge) < value if lower else Fraction(edge) > value) or (strict and Fraction(edge) == value):
        edge = math.nextafter(edge, towards)
    outside = math.nextafter(edge, -towards)
    middle = (Fraction(edge) + Fraction(outside)) / 2  # decimals beyond it read as ``edge`` or further in
    return _step_bound(middle, lower, strict=not _even(edge))


def _check_unique(node: SchemaNode, definitions: dict, path: str) -> None:
    """uniqueItems (JSON Schema 2020-12 validation, section 6.4.3) is followed for scalar items: enum / const /
    boolean / null values, integers, numbers and strings without a pattern, format or maxLength (which can
    always take one more character, so a string is never forced into a duplicate). Items are compared as
    JSON values (1 and 1.0 are equal, strings after unescaping). ``minItems`` beyond the distinct values the
    items can take is refused."""
    item = _resolve(node.items, definitions)
    what = _unique_items_refused(item)
    if what is None:
        room = _capacity(item)
        if room is not None and room < node.min_items:
            raise SchemaError(f"{path}: minItems {node.min_items} asks for more distinct items than its items "
                              f"allow ({room})", "lower minItems or widen the items' schema")
        return
    raise SchemaError(f"{path}: uniqueItems over {what} is not supported (only scalar items: enum values, "
                      "booleans, numbers, integers and strings without a pattern, format or maxLength)",
                      "drop uniqueItems and remove duplicates yourself, or make the items scalars")


def _unique_items_refused(item: SchemaNode) -> str | None:
    """What a unique array's ``item`` (its $ref resolved) is, where :func:`_check_unique` cannot keep such items
    unique ("objects or arrays", "strings with a pattern, format or maxLength", ...); None for scalar items."""
    if item.kind == "literal" and all(text[:1] not in (b"{", b"[") for text in item.literals) or \
            item.kind in ("integer", "number") or item.kind == "string" and item.content is None and \
            item.max_length is None:
        return None
    return {"string": "strings with a pattern, format or maxLength", "literal": "objects or arrays",
            "choice": "anyOf / oneOf / type lists", "any": "any value"}.get(item.kind, f"{item.kind}s")


def _unique_beside_prefix(node: SchemaNode) -> bool:
    """An array with prefixItems whose items could repeat one another: uniqueItems there is not followed (an
    array of at most one item, which prefixItems and ``items: false`` may leave, is unique already)."""
    return bool(node.prefix) and (node.items is not None or node.max_items > 1)


def _unique_refused(compiler: _Compiler, array: dict) -> str | None:
    """Why :func:`compile_schema` cannot keep the items of ``array`` (a schema inside ``compiler``'s root that has
    ``"uniqueItems": true``) unique: ``"over objects or arrays"``, ``"beside prefixItems"``, ... (see
    :func:`_check_unique`). None where it can, or where ``array`` is refused for another reason (compile_schema
    names that). Its arrays are those it compiles to: through a ``$ref`` (of the array or of its items), an
    ``allOf`` or a type list. ``compiler`` reads uniqueItems as absent (nested arrays' are judged on their own)
    and keeps the definitions it compiled for the next array; one that another's definition made fail is judged
    by a compiler of its own."""
    compiled = _compiled_array(compiler, array)
    if compiled is None:  # maybe a definition that only another array reached (one in $defs no $ref reaches)
        compiler = _Compiler(compiler.root, unique=False)
        compiled = _compiled_array(compiler, array)
    if compiled is None:
        return None
    for each in _alternatives(compiled, compiler.definitions):
        if each.kind != "array" or each.items is None and not _unique_beside_prefix(each):
            continue
        if _unique_beside_prefix(each):
            return "beside prefixItems"
        item = _resolve_acyclic(each.items, compiler.definitions)
        what = None if item is None else _unique_items_refused(item)
        if what is not None:
            return f"over {what}"
    return None


def _compiled_array(compiler: _Compiler, array: dict) -> SchemaNode | None:
    """``array`` compiled by ``compiler``, with the definitions it reaches (None: refused)."""
    try:
        node = compiler.node(array, "$")
        compiler.define_pending()
    except SchemaError:
        return None
    return node


def _resolve_acyclic(node: SchemaNode, definitions: dict) -> SchemaNode | None:
    """:func:`_resolve` before compile_schema has refused $ref cycles: None for one."""
    seen = set()
    while node.kind == "ref":
        if node.ref in seen:
            return None
        seen.add(node.ref)
        node = definitions[node.ref]
    return node


def _alternatives(node: SchemaNode, definitions: dict) -> list[SchemaNode]:
    """The nodes a value of ``node`` is a value of: its $ref resolved, its choice's options (a type list, an
    anyOf), each once."""
    found, waiting, seen = [], [node], set()
    while waiting:
        each = waiting.pop()
        if id(each) in seen:
            continue
        seen.add(id(each))
        if each.kind == "ref":
            waiting.append(definitions[each.ref])
        elif each.kind == "choice":
            waiting.extend(each.options)
        else:
            found.append(each)
    return found


def _capacity(item: SchemaNode) -> int | None:
    """How many distinct values a unique array's item can take (None: more than any array holds here)."""
    if item.kind == "literal":
        return len({_item_key(text) for text in item.literals})
    if item.kind in ("integer", "number") and item.minimum is not None and item.maximum is not None:
        step = item.multiple or 1
        return max(0, item.maximum // step - -(-item.minimum // step) + 1)
    return None


def _item_key(text: bytes) -> tuple:
    """A scalar JSON text as uniqueItems compares it: numbers by value (1 equals 1.0), strings unescaped."""
    value = json.loads(text)
    if isinstance(value, bool) or value is None:
        return ("literal", value)
    if isinstance(value, (int, float)):
        number = Decimal(text.decode())
        if number.is_zero():
            return ("number", Fraction(0))
        if abs(number.adjusted()) <= EXACT_EXPONENT:
            return ("number", Fraction(number))
        # an exponent's reach (1e9999999999999999, within llama.cpp's 16 exponent digits) has no Fraction
        # that fits in memory; equal numbers share their adjusted exponent, so they are compared here by
        # their digits with the trailing zeros dropped
        exact = Context(prec=max(1, len(number.as_tuple().digits)), Emax=MAX_EMAX, Emin=MIN_EMIN)
        return ("number", number.normalize(exact).as_tuple())
    return ("string", value)


def _unused_reachable(node: SchemaNode, text: bytes, used: frozenset) -> bool:
    """Some value of the bounded integer or number ``node`` that digits after ``text`` can make is not in
    ``used``: the multiples of its factor in the ranges its digits reach outnumber the used ones there."""
    sign, integral, fraction, _ = _NUMBER_PARTS.fullmatch(text).groups()
    negative = bool(sign)
    if node.kind == "number":
        low, high = _number_side(node, negative)
        scale = STEP
        reached = _number_magnitudes_reached(integral, fraction)
    else:
        low, high = _magnitudes(node, negative)
        longest = len(str(high)) if high is not None else max(NUMBER_DIGITS, len(str(low)))
        high = 10 ** longest - 1 if high is None else high
        scale = 1
        if not integral:
            reached = [(0, high)]
        elif integral == b"0":
            reached = [(0, 0)]
        else:
            start = int(integral)
            reached = [(start * 10 ** more, (start + 1) * 10 ** more - 1)
                       for more in range(longest - len(integral) + 1)]
    step = node.multiple or 1
    magnitudes = {abs(value) * scale for kind, value in used if kind == "number" and (value < 0) == negative
                  or kind == "number" and value == 0}
    for first, last in reached:
        first, last = max(first, low), min(last, high)
        if first > last:
            continue
        count = last // step - -(-first // step) + 1
        if count > sum(1 for value in magnitudes if first <= value <= last):
            return True
    return False


def _number_repeats(node: SchemaNode, text: bytes, rest: tuple) -> bool:
    """In a unique array (the frame on top of ``rest``), every value that digits after ``text``, the start of a
    number of ``node``, can make is an item written already: the answer would be left with no byte to write."""
    if not _unique_parent(rest):
        return False
    used = rest[-1][4]
    if _bounded(node):
        return not _unused_reachable(node, text, used)
    return _settled_key(node, text) in used


def _settled_key(node: SchemaNode, text: bytes) -> tuple | None:
    """The uniqueItems key of the one value that every way on from ``text``, the start of a number of the
    unbounded ``node``, writes (None: digits to come can still change the value), within llama.cpp's digit caps:
    a zero mantissa before an exponent (``0.0e``, every exponent leaves it zero) or at 16 fraction digits, 16
    exponent digits, an integer's ``0`` or 16 digits."""
    sign, integral, fraction, exponent = _NUMBER_PARTS.fullmatch(text).groups()
    zero = not (integral + (fraction or b"")).strip(b"0")
    if not integral:  # "-": any digit may come
        return None
    if exponent is not None:  # the mantissa is done
        return ("number", Fraction(0)) if zero else _item_key(text) if len(exponent) == NUMBER_DIGITS else None
    if fraction is not None:  # at the cap only an exponent follows, which moves a mantissa that is not zero
        return ("number", Fraction(0)) if zero and len(fraction) == NUMBER_DIGITS else None
    if node.kind == "integer" and (integral == b"0" or len(integral) == NUMBER_DIGITS):  # no digit may follow
        return _item_key(text)
    return None


def _with_used(rest: tuple, key: tuple) -> tuple | None:
    """``rest`` with the item ``key`` recorded in the unique array frame on top (None: a duplicate)."""
    frame = rest[-1]
    if key in frame[4]:
        return None
    return rest[:-1] + (frame[:4] + (frame[4] | {key},),)


def _unique_parent(rest: tuple) -> bool:
    return bool(rest) and rest[-1][0] == "array" and rest[-1][1].unique


def _not_a_container(node: SchemaNode, definitions: dict) -> str:
    """What ``node`` allows that the answer could not end at, the first such thing named ("": nothing): the
    answer stops at the byte that completes its value (runtime/generate.py), so that value must have a last byte.
    An object or array has its closing bracket, a string its closing quote, an enum / const value its last byte
    (where no other value the root allows goes on from it: :func:`_root_prefix`); a number may always take another
    digit, and so may any value. A bounded integer was listed as its values before (:func:`_listed_integers`). The
    root may be an anyOf / oneOf / type list of these."""
    return _open_ended(node, definitions, False)


def _open_ended(node: SchemaNode, definitions: dict, option: bool) -> str:
    """What ``node`` allows with no last byte (a number, any value), the first such thing named ("": nothing)."""
    node = _resolve(node, definitions)
    where = " (an option of its anyOf / oneOf / type list)" if option else ""
    if node.kind == "choice":
        return next((other for other in (_open_ended(each, definitions, True) for each in node.options)
                     if other), "")
    if node.kind == "any":
        return f"any value ({{}} or true){where}"
    if node.kind == "integer" and node.minimum is not None and node.maximum is not None:  # too many to list
        return (f"an integer from {node.minimum} to {node.maximum}{where}, {len(_range_values(node)):,} values, "
                f"more than the {ROOT_INTEGERS} a root integer may have")
    return "" if node.kind in ("object", "array", "string", "literal") else f"{node.kind!r}{where}"


def _range_values(node: SchemaNode) -> range:
    """The integers an integer node's bounds (both given) and multipleOf leave, in order."""
    step = node.multiple or 1
    return range(-(-node.minimum // step) * step, node.maximum + 1, step)


def _listed_integers(node: SchemaNode, definitions: dict) -> tuple[SchemaNode, dict[bytes, tuple[int, int]]]:
    """The root ``node`` with each integer it allows between a minimum and a maximum (it, or an option of its anyOf /
    oneOf / type list) listed as the enum values of its range, at most :data:`ROOT_INTEGERS` of them, as llama.cpp's
    converter takes an integer root (its grammar's digits end where the range's last value does). A root integer
    scanned as a number could never be complete (a digit may always come), so the answer did not end at its value;
    its values listed end at their last byte where none is the start of another (1 to 9, 5 to 12; not 1 to 12:
    :func:`_root_prefix`). Also, each listed value's text mapped to its range's bounds, which a refusal names."""
    ranges: dict[bytes, tuple[int, int]] = {}

    def listed(each: SchemaNode) -> SchemaNode:
        resolved = _resolve(each, definitions)
        if resolved.kind == "choice":  # ends: compile_schema refused cycles through choices
            options = tuple(listed(option) for option in resolved.options)
            changed = any(new is not old for new, old in zip(options, resolved.options, strict=True))
            return SchemaNode("choice", options=options) if changed else each
        if resolved.kind != "integer" or resolved.minimum is None or resolved.maximum is None or \
                len(_range_values(resolved)) > ROOT_INTEGERS:
            return each
        texts = tuple(str(value).encode() for value in _range_values(resolved))
        ranges.update(dict.fromkeys(texts, (resolved.minimum, resolved.maximum)))
        return SchemaNode("literal", literals=texts)

    return listed(node), ranges


def _root_prefix(node: SchemaNode, definitions: dict) -> tuple[bytes, bytes] | None:
    """Two values the root allows where the first is the start of the second (``1`` and ``12``), or None: the answer
    would stop at the first's last byte, so the second could never be written."""
    texts = sorted(set(_root_literals(node, definitions)))
    return next(((short, long) for short in texts for long in texts if long != short and long.startswith(short)),
                None)


def _prefix_refused(short: bytes, long: bytes, ranges: dict[bytes, tuple[int, int]]) -> RootError:
    """The refusal of a root whose values ``short`` and ``long`` are one the start of the other, worded for what the
    root is (an enum / const value, or an integer range: ``ranges`` maps each listed integer to its range), which is
    a kind of root the answer may have: the list of those kinds would not say what is wrong."""
    first, second = short.decode()[:60], long.decode()[:60]
    why = f"the answer ends at the byte that completes a value, so after {first} it could never go on to {second}"
    other = f"the value {first}, which {second} goes on from"
    bounds = ranges.get(short) or ranges.get(long)
    if bounds is None:
        return RootError(other, f"the schema's root is an enum / const value, and no enum / const value may be the "
                         f"start of another: {first} and {second} ({why})",
                         f"drop one of them, list the values as strings (a string ends at its closing quote), or "
                         f"wrap the value in an object: {WRAPPED}")
    low, high = bounds
    return RootError(other, f"the schema's root is an integer from {low} to {high}, and no value it allows may be "
                     f"the start of another: {first} and {second} ({why})",
                     "bound it to values of one length (such as 1 to 9 or 10 to 99), list the values as an enum of "
                     f"strings (a string ends at its closing quote), or wrap the value in an object: {WRAPPED}")


def _root_literals(node: SchemaNode, definitions: dict) -> list[bytes]:
    """The JSON texts of the enum / const values the root allows, through its anyOf / oneOf / type list."""
    node = _resolve(node, definitions)
    if node.kind == "choice":
        return [text for each in node.options for text in _root_literals(each, definitions)]
    return list(node.literals) if node.kind == "literal" else []


def _kinds(kinds, path: str) -> list[str]:
    """The types a ``type`` keyword names (a name or a list of them, each once)."""
    listed = [kinds] if isinstance(kinds, str) else kinds
    if not isinstance(listed, list) or not listed or any(not isinstance(k, str) or k not in TYPE_KEYWORDS
                                                         for k in listed) or len(set(listed)) < len(listed):
        raise SchemaError(f"{path}.type is {kinds!r}; expected one of {sorted(TYPE_KEYWORDS)} "
                          "or a list of them, each once", "fix the schema")
    return listed


def _of_type(value, kind: str) -> bool:
    """``value`` (read from JSON) is an instance of the JSON Schema type ``kind`` (an integer: a number
    whose fraction is zero, 2020-12 validation section 6.1.1)."""
    if kind == "integer":
        return (isinstance(value, int) and not isinstance(value, bool)) or (isinstance(value, float)
                                                                            and value.is_integer())
    if kind == "number":
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    types = {"string": str, "boolean": bool, "object": dict, "array": list, "null": type(None)}
    return isinstance(value, types[kind])


def _json_text(value, path: str) -> bytes:
    """The compact UTF-8 JSON text of ``value``, an enum value or a property name (RFC 8259 has no NaN or
    Infinity, and UTF-8 no lone UTF-16 surrogate, which a JSON escape such as \\ud800 may put in a string)."""
    try:
        return json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode()
    except ValueError as exc:  # UnicodeEncodeError is one
        try:
            shown = json.dumps(value)[:60]
        except ValueError:  # an integer past Python's limit on the digits it writes (4,300 by default)
            raise SchemaError(f"{path}: a value holds an integer longer than Python writes as text ({exc})",
                              "shorten that integer or drop the value that holds it") from exc
        raise SchemaError(f"{path}: {shown} has no JSON text ({exc})",
                          "NaN and Infinity are not JSON numbers and a lone UTF-16 surrogate (\\ud800-\\udfff "
                          "without its pair) is no character: drop or fix that value") from exc


def _refuse_cycles(root: SchemaNode, definitions: dict) -> None:
    """Refuse a ``$ref`` that comes back to itself before any byte is written (through other ``$ref``,
    ``anyOf``, ``oneOf`` or ``allOf``): no value ever starts that way, and following it would never end.
    Recursion through an object's property or an array's items is fine."""
    done: set[str] = set()

    def walk(node: SchemaNode, refs: tuple[str, ...]) -> None:
        if node.kind == "choice":
            for option in node.options:
                walk(option, refs)
        elif node.kind == "ref" and node.ref not in done:
            if node.ref in refs:
                cycle = " -> ".join(refs[refs.index(node.ref):] + (node.ref,))
                raise SchemaError(f"$ref {node.ref!r} refers to itself without ever reaching a value ({cycle})",
                                  "fix the schema's definitions: a recursion must go through an object's "
                                  "properties or an array's items")
            walk(definitions[node.ref], refs + (node.ref,))
            done.add(node.ref)

    walk(root, ())
    for ref in definitions:
        walk(SchemaNode("ref", ref=ref), ())


def _refuse_endless(definitions: dict) -> None:
    """Refuse a definition that has no finite value: one that always holds itself again (a required
    property or a non-empty array of it, on every way through it). The answer would nest it until
    max_tokens ran out, never valid, and in an anyOf or an optional property it is a way in with no
    way out."""
    ends = dict.fromkeys(definitions, False)  # grown to the least fixed point: definitions with a finite value

    def finite(node: SchemaNode) -> bool:
        if node.kind == "ref":
            return ends[node.ref]
        if node.kind == "choice":
            return any(finite(option) for option in node.options)
        if node.kind == "object":
            return all(finite(value) for _, value, required in node.properties if required)
        if node.kind == "array":
            return all(finite(each) for each in node.prefix[:node.min_items]) and (
                node.min_items <= len(node.prefix) or finite(node.items))
        return True  # any, literal (never empty), string, number, integer

    changed = True
    while changed:
        changed = False
        for ref, node in definitions.items():
            if not ends[ref] and finite(node):
                ends[ref] = changed = True
    endless = [ref for ref, ends_there in ends.items() if not ends_there]
    if endless:  # the root has a finite value unless one of the definitions (all reached from it) has none
        raise SchemaError(f"{', '.join(map(repr, endless))} {'has' if len(endless) == 1 else 'have'} no finite "
                          "value: every way through it holds it again (a required property or at least one item)",
                          "make the recursion optional: leave the property out of required, set minItems 0, or "
                          "add an anyOf option that ends it")


def _resolve(node: SchemaNode, definitions: dict) -> SchemaNode:
    while node.kind == "ref":  # ends: compile_schema refused cycles of $ref
        node = definitions[node.ref]
    return node


# ------------------------------------------------------------------------------------------ the parser
# A way through the schema is a stack of frames (tuples, the top last):
#   ("value", node)                 a value of ``node`` comes next (whitespace may come first)
#   ("literal", texts, position)    inside one of the literal ``texts``
#   ("scan", node, JsonState, seen) inside a string / number / integer / free-form value, scanned by JSON mode;
#                                   ``seen``: a string's characters so far, a number's bytes so far (None: free-form)
#   ("object", node, index, phase)  phase open | key | colon | after; ``index``: the next property that may come
#                                   (in colon: the one whose key was just written)
#   ("key", node, candidates, position)  inside a key; candidates: property indices still matching
#   ("array", node, count, phase, used)  phase open | value | after; ``used``: uniqueItems' keys of the items
#   ("fork", _Fork)                 only at the bottom: the frames below are any one of the fork's tails
# Ways whose top frames are the same and whose frames below differ (a union of objects that share their first keys,
# nested: each level doubles the stacks below) are kept as one way over a fork of those stacks (_shared_ways), a
# graph-structured stack, so the live ways grow with the schema's options, not with the nesting depth.


class _Parser:
    def __init__(self, compiled: CompiledSchema):
        self.definitions = compiled.definitions
        self._options: dict[int, tuple] = {}  # id(choice node) -> its options, as _choice_options finds them

    def _choice_options(self, node: SchemaNode) -> tuple:
        """A choice's options with nested choices and $refs followed and every literal among them merged
        into one, so that an anyOf of many consts is one way on, not one each (past MAX_WAYS the last
        ones were dropped: they could never be written)."""
        options = self._options.get(id(node))
        if options is None:
            found: list = []
            texts: dict = {}

            def visit(option: SchemaNode) -> None:
                option = _resolve(option, self.definitions)
                if option.kind == "choice":  # ends: compile_schema refused cycles through choices
                    for each in option.options:
                        visit(each)
                elif option.kind == "literal":
                    if not texts:
                        found.append(None)  # the merged literal's place
                    texts.update(dict.fromkeys(option.literals))
                elif option not in found:
                    found.append(option)

            visit(node)
            merged = SchemaNode("literal", literals=tuple(texts))
            options = self._options[id(node)] = tuple(merged if option is None else option for option in found)
        return options

    def start(self, node: SchemaNode, rest: tuple, byte: int) -> list[tuple]:
        """The ways after ``byte``, the first byte of a value of ``node`` (``rest``: the frames below)."""
        node = _resolve(node, self.definitions)
        if node.kind == "choice":
            return [way for option in self._choice_options(node) for way in self.start(option, rest, byte)]
        if node.kind == "literal":
            texts = node.literals
            if _unique_parent(rest):  # only values not written yet (then every way in ends in a new one)
                texts = tuple(text for text in texts if _item_key(text) not in rest[-1][4])
            return self.step(rest + (("literal", texts, 0),), byte) if texts else []
        if node.kind == "object":
            return [rest + (("object", node, 0, "open"),)] if byte == ord("{") else []
        if node.kind == "array":
            return [rest + (("array", node, 0, "open", frozenset()),)] if byte == ord("[") else []
        if (node.kind == "string" and byte != ord('"')) or (node.kind in ("number", "integer")
                                                           and byte not in _NUMBER_START):
            return []
        scanned = step(JsonState(VALUE, _INSIDE_ARRAY), byte, _digit_cap(node))
        if scanned is None:
            return []
        unique = _unique_parent(rest)
        seen = (0, node.content and node.content.start(), b"" if unique else None) if node.kind == "string" else \
            bytes((byte,)) if node.kind in ("number", "integer") else None
        if isinstance(seen, bytes) and (not _number_may_grow(node, seen) or _number_repeats(node, seen, rest)):
            return []
        return [rest] if _scanned_whole(scanned) else [rest + (("scan", node, scanned, seen),)]

    def step(self, frames: tuple, byte: int) -> list[tuple]:
        """The ways ``frames`` continue with ``byte`` (none: it cannot)."""
        if not frames:  # the answer is complete: only trailing whitespace
            return [frames] if byte in _WHITESPACE else []
        top, rest = frames[-1], frames[:-1]
        kind = top[0]
        if kind == "value":
            return [frames] if byte in _WHITESPACE else self.start(top[1], rest, byte)
        if kind == "literal":
            return self._literal(top, rest, byte)
        if kind == "scan":
            return self._scan(top, rest, byte)
        if kind == "key":
            return self._key(top, rest, byte)
        if kind == "fork":  # the value above has closed: each stack below goes on
            return [way for tail in top[1].tails for way in self.step(tail, byte)]
        if byte in _WHITESPACE:
            return [frames]
        return self._object(top, rest, byte) if kind == "object" else self._array(top, rest, byte)

    def _literal(self, top: tuple, rest: tuple, byte: int) -> list[tuple]:
        _, texts, position = top
        kept = [text for text in texts if text[position] == byte]
        done = next((text for text in kept if len(text) == position + 1), None)
        ended = rest if done is None or not _unique_parent(rest) else _with_used(rest, _item_key(done))
        ways = [ended] if done is not None and ended is not None else []
        longer = tuple(text for text in kept if len(text) > position + 1)
        return ways + ([rest + (("literal", longer, position + 1),)] if longer else [])

    def _scan(self, top: tuple, rest: tuple, byte: int) -> list[tuple]:
        _, node, state, seen = top
        if state.mode == NUMBER and state.stack == _INSIDE_ARRAY:
            following, may_end = _NUMBER_NEXT[state.detail]
            if byte not in following:  # the number ended before this byte, which belongs to the frame below
                if not may_end or seen is not None and not _number_whole(node, seen):
                    return []
                if seen is not None and _unique_parent(rest):
                    rest = _with_used(rest, _item_key(seen))
                return [] if rest is None else self.step(rest, byte)
            if (node.kind == "integer" and byte in b".eE") or (byte in b"eE" and _bounded(node)):
                return []
            if seen is not None:  # a number of the schema (a free-form value's numbers are JSON mode's)
                seen += bytes((byte,))
                if not _number_may_grow(node, seen) or _number_repeats(node, seen, rest):
                    return []
        elif node.kind == "object":  # a key not listed: it may not read as a listed one (it would be that)
            if state.mode == STRING and not state.detail[1] and byte == ord('"'):
                if seen is not None and json.loads(b'"' + seen + b'"') in node.names:
                    return []
            elif seen is not None:  # its bytes as written, while it may still read as a listed key
                seen += bytes((byte,))
                if len(seen) > _longest_key(node.names):
                    seen = None
        elif node.kind == "string" and state.mode == STRING:
            count, content, raw = seen
            between = not state.detail[1]  # no UTF-8 continuation byte pending
            if between and byte == ord('"'):
                if count < node.min_length or (content is not None and not GrammarMatcher.accepts(content)):
                    return []
                if raw is not None:  # an item of a unique array: a value not written yet
                    rest = _with_used(rest, ("string", json.loads(b'"' + raw + b'"')))
                    if rest is None:
                        return []
            else:
                if between:  # a character starts (an escape too; a \u surrogate pair's second half is not counted)
                    if node.max_length is not None and count >= node.max_length:
                        return []
                    count += 1
                if content is not None:  # a pattern's string is written without escapes: it reads what is written
                    content = None if byte == ord("\\") else node.content.step_byte(content, byte)
                    if content is None or (node.lengths is not None and not node.lengths.fits(content, count)):
                        return []
                seen = (count, content, None if raw is None else raw + bytes((byte,)))
        elif node.kind == "string" and seen[2] is not None:  # inside an escape of a unique array's item
            seen = seen[:2] + (seen[2] + bytes((byte,)),)
        scanned = step(state, byte, _digit_cap(node))
        if scanned is None:
            return []
        return [rest] if _scanned_whole(scanned) else [rest + (("scan", node, scanned, seen),)]

    def _key(self, top: tuple, rest: tuple, byte: int) -> list[tuple]:
        _, node, candidates, position = top
        ways, matching = [], []
        for index in candidates:
            key = node.properties[index][0]
            if position < len(key) and key[position] == byte:
                matching.append(index)
            elif position == len(key) and byte == ord('"'):
                ways.append(rest[:-1] + (("object", node, index, "colon"),))
        return ways + ([rest + (("key", node, tuple(matching), position + 1),)] if matching else [])

    def _object(self, top: tuple, rest: tuple, byte: int) -> list[tuple]:
        _, node, index, phase = top
        if phase == "colon":
            if byte != ord(":"):
                return []
            if index == len(node.properties):  # after a key of its own
                return [rest + (("object", node, index, "after"), ("value", self._target(node.additional)))]
            return [rest + (("object", node, index + 1, "after"), ("value", self._target(node.properties[index][1])))]
        if phase in ("open", "key") and byte == ord('"'):
            candidates = _key_candidates(node, index)
            ways = [rest + (top, ("key", node, candidates, 0))] if candidates else []
            if _more_keys(node, index):  # a key of its own: scanned as a string, the object node its schema
                key = step(JsonState(VALUE, _INSIDE_ARRAY), byte)
                ways.append(rest + (("object", node, len(node.properties), "colon"), ("scan", node, key, b"")))
            return ways
        if phase == "after" and byte == ord(","):
            return [rest + (("object", node, index, "key"),)] if _key_candidates(node, index) or \
                _more_keys(node, index) else []
        if phase in ("open", "after") and byte == ord("}"):
            return [rest] if not any(required for _, _, required in node.properties[index:]) else []
        return []

    def _target(self, node: SchemaNode) -> SchemaNode:
        """``node`` with its $refs followed: the ways into one definition from several places share their top."""
        return _resolve(node, self.definitions) if node.kind == "ref" else node

    def _array(self, top: tuple, rest: tuple, byte: int) -> list[tuple]:
        _, node, count, phase, used = top
        if phase == "after":
            if byte == ord(","):
                room = _capacity(_resolve(node.items, self.definitions)) if node.unique else None
                return [rest + (("array", node, count, "value", used),)] if (node.max_items is None or
                                                                             count < node.max_items) and \
                    (room is None or len(used) < room) else []
            return [rest] if byte == ord("]") and count >= node.min_items else []
        if phase == "open" and byte == ord("]"):
            return [rest] if node.min_items == 0 else []
        if node.max_items is not None and count >= node.max_items:
            return []
        item = node.prefix[count] if count < len(node.prefix) else node.items
        return self.start(item, rest + (("array", node, count + 1, "after", used),), byte)


def _key_candidates(node: SchemaNode, index: int) -> tuple[int, ...]:
    """Properties that may come next: from ``index`` up to the first required one (which none may skip)."""
    candidates = []
    for position in range(index, len(node.properties)):
        candidates.append(position)
        if node.properties[position][2]:
            break
    return tuple(candidates)


@lru_cache(maxsize=256)
def _longest_key(names: frozenset) -> int:
    """The most bytes a JSON string can take to write one of ``names``: 6 per UTF-16 code unit (\\uXXXX),
    more than a character takes unescaped (at most 4 UTF-8 bytes for 2 units)."""
    return 6 * max((len(name.encode("utf-16-le")) // 2 for name in names), default=0)


def _more_keys(node: SchemaNode, index: int) -> bool:
    """Keys not listed may come: the object takes them, and no required property is left to come first
    (they follow the listed properties, as llama.cpp's converter writes them)."""
    return node.additional is not None and not any(required for _, _, required in node.properties[index:])


def _spacing_after(spacing: int, byte: int) -> int | None:
    """Spacing between tokens after whitespace ``byte`` (None: not allowed), as llama.cpp's SPACE_RULE
    (common/json-schema-to-grammar.cpp: ``| " " | "\\n"{1,2} [ \\t]{0,20}``) allows it. ``spacing`` is 0 before
    any, ONE_SPACE after a single space, 1 + n after a newline and n spaces or tabs, SECOND_NEWLINE + n after two
    newlines and n spaces or tabs, NO_SPACE before the answer's value (none allowed)."""
    if spacing == 0:
        return ONE_SPACE if byte == ord(" ") else 1 if byte == ord("\n") else None
    if spacing == 1 and byte == ord("\n"):  # a blank line: the second newline comes before any indentation
        return SECOND_NEWLINE
    if byte in b" \t" and (1 <= spacing <= MAX_INDENT or SECOND_NEWLINE <= spacing < SECOND_NEWLINE + MAX_INDENT):
        return spacing + 1
    return None


def _magnitudes(node: SchemaNode, negative: bool) -> tuple[int, int | None]:
    """The range of absolute values an integer ``node`` allows on one side of zero (no ``-0``)."""
    if negative:
        return (1 if node.maximum is None else max(1, -node.maximum)), (None if node.minimum is None
                                                                        else -node.minimum)
    return (0 if node.minimum is None else max(0, node.minimum)), node.maximum


def _digit_cap(node: SchemaNode) -> int | None:
    """The digits JSON mode's automaton allows in each part of a number it scans for ``node``: none counted for a
    schema number (:func:`_number_may_grow` caps them, an integer with a long bound past 16), JSON mode's cap for a
    free-form value's numbers, as llama.cpp's ``value`` rule writes them."""
    return None if node.kind in ("number", "integer") else MAX_NUMBER_DIGITS


def _number_may_grow(node: SchemaNode, text: bytes) -> bool:
    """``text``, the start of a JSON number, can still become a value of ``node``: within llama.cpp's digit
    caps (NUMBER_DIGITS) and, for a bounded integer, with some digits to come putting it within the bounds."""
    sign, integral, fraction, exponent = _NUMBER_PARTS.fullmatch(text).groups()
    if fraction is not None and len(fraction) > NUMBER_DIGITS:
        return False
    if exponent is not None and (len(exponent) > NUMBER_DIGITS or exponent[:1] == b"0" and len(exponent) > 1):
        return False
    if not _bounded(node):
        return len(integral) <= NUMBER_DIGITS
    if node.kind == "number":
        return len(integral) <= NUMBER_DIGITS and _number_reaches(node, bool(sign), integral, fraction)
    low, high = _magnitudes(node, bool(sign))
    longest = len(str(high)) if high is not None else max(NUMBER_DIGITS, len(str(low)))
    if high is not None and low > high or len(integral) > longest:
        return False
    top = 10 ** longest - 1 if high is None else high
    if not integral:
        return _has_multiple(low, top, node.multiple)
    start = int(integral)
    if start == 0:
        return low == 0
    # the values that ``more`` further digits can make, [start * 10**more, (start + 1) * 10**more - 1], rise with
    # ``more``: fewer digits than ``low`` has stay below it, and once past ``top`` none come back, so only a few
    # counts are tried (a bound of 4,000 digits tried 4,000 counts of 4,000-digit products each byte, minutes a value)
    for more in range(max(0, len(str(low)) - len(integral)), longest - len(integral) + 1):
        scale = 10 ** more
        if start * scale > top:
            return False
        if _has_multiple(max(start * scale, low), min((start + 1) * scale - 1, top), node.multiple):
            return True
    return False


def _bounded(node: SchemaNode) -> bool:
    return node.kind in ("integer", "number") and (node.minimum is not None or node.maximum is not None
                                                    or node.multiple is not None)


def _number_reaches(node: SchemaNode, negative: bool, integral: bytes, fraction: bytes | None) -> bool:
    """Some digits to come make the number begun (its sign, integral digits and fraction digits so far,
    no exponent) a value of the bounded number ``node``: one of the ranges of magnitudes, in units of
    10**-16, that they can reach meets the magnitudes the bounds allow on the number's side of zero."""
    low, high = _number_side(node, negative)
    return any(_has_multiple(max(first, low), min(last, high), node.multiple)
               for first, last in _number_magnitudes_reached(integral, fraction))


def _number_side(node: SchemaNode, negative: bool) -> tuple[int, int]:
    """The magnitudes, in units of 10**-16, the bounded number ``node`` allows on one side of zero."""
    return (max(0, -node.maximum), -node.minimum) if negative else (max(0, node.minimum), node.maximum)


def _number_magnitudes_reached(integral: bytes, fraction: bytes | None) -> list[tuple[int, int]]:
    """The ranges of magnitudes, in units of 10**-16, that digits to come can make of a number begun with
    these integral and fraction digits (no exponent)."""
    if fraction is not None:  # the integral part is done; the fraction's digits so far fix the rest's range
        unit = 10 ** (NUMBER_DIGITS - len(fraction))
        start = int(integral) * STEP + int(fraction or b"0") * unit
        return [(start, start + unit - 1)]
    if not integral:
        return [(0, LARGEST)]
    if integral == b"0":
        return [(0, STEP - 1)]
    start = int(integral)  # ``more`` further integral digits, then any fraction
    return [(start * 10 ** more * STEP, (start + 1) * 10 ** more * STEP - 1)
            for more in range(NUMBER_DIGITS - len(integral) + 1)]


@lru_cache(maxsize=1024)
def _number_whole(node: SchemaNode, text: bytes) -> bool:
    """The number ``text`` is a value of ``node`` (its prefixes were checked by :func:`_number_may_grow`). Cached:
    each byte that may follow a number asks it again, and reading a bound's thousands of digits is no free step."""
    if not _bounded(node):
        return True
    if node.kind == "number":
        sign, integral, fraction, _ = _NUMBER_PARTS.fullmatch(text).groups()
        value = int(integral) * STEP + int((fraction or b"").ljust(NUMBER_DIGITS, b"0"))
        return node.minimum <= (-value if sign else value) <= node.maximum and _has_multiple(value, value,
                                                                                            node.multiple)
    value = int(text)
    return text != b"-0" and (node.minimum is None or value >= node.minimum) and (node.maximum is None
                                                                                  or value <= node.maximum) \
        and _has_multiple(value, value, node.multiple)


def _number_ends(top: tuple) -> bool:
    """``top`` scans a number that a whitespace byte would end (the byte is then spacing between tokens)."""
    return top[0] == "scan" and top[2].mode == NUMBER and top[2].stack == _INSIDE_ARRAY


def _scanned_whole(state: JsonState) -> bool:
    """The scanned value has closed (a string, a literal or a container inside a free-form value)."""
    return state.mode == AFTER_VALUE and state.stack == _INSIDE_ARRAY


def _schema_size(compiled: CompiledSchema) -> int:
    """How many nodes the compiled schema has. The cap on live parses is kept above it (``WAYS_PER_OPTION`` per
    node), for past the cap the last ways were dropped without a word. Each option of a choice (anyOf / oneOf / type
    list) is a node, and a live parse while the bytes written so far fit several of them: a union of objects keeps
    one per object after its ``{`` until a key or a const tells them apart; of tool calls to 70 tools
    (``edgesdk/serve/tools.py``, an anyOf of one object a tool), the last 6 could never be called, where llama.cpp's
    grammar keeps every alternative. Ways that share their top frames are one way (:func:`_shared_ways`), so the
    live ways are at most a few per node however deep the choices nest; a schema that spells out each level of a
    nested union (no $ref) has a node for each of its parses."""
    seen, stack = set(), [compiled.root, *compiled.definitions.values()]
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        stack.extend(node.options)
        stack.extend(value for _, value, _ in node.properties)
        stack.extend((node.additional, node.items, *node.prefix))
    return len(seen)


class _Fork:
    """The stacks below a way's top frames, any one of which it may be on (``tails``: frame tuples, each
    with no fork on top, in the order found). Hashed once, as a frozenset caches its hash: forks nest as deep as
    the schema, and a tuple would hash its whole depth each time."""

    __slots__ = ("tails", "_set", "_hash")

    def __init__(self, tails: tuple):
        self.tails = tails
        self._set = frozenset(tails)
        self._hash = hash(self._set)

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other) -> bool:
        return isinstance(other, _Fork) and (self is other or self._hash == other._hash and self._set == other._set)


def _top_length(frames: tuple) -> int:
    """How many frames on top of ``frames`` a parser step reads or rewrites: a literal, scan or key frame reads
    the frame below it too (a unique array's used items, the object whose key it is), the others none below; a
    value begun on a fork (its ``value`` frame stood on it) is a property's, whose object no step reads."""
    if not frames:
        return 0
    return 1 if frames[-1][0] in ("value", "object", "array") or len(frames) == 1 or frames[-2][0] == "fork" else 2


def _unforked(frames: tuple) -> tuple:
    """The ways ``frames`` stands for with no fork on top: a fork alone (the value above it closed) is its tails."""
    return frames[0][1].tails if len(frames) == 1 and frames[0][0] == "fork" else (frames,)


class _Forked(list):
    """Ways some of which stand on a fork (:func:`_shared_ways`): they are shared again after each byte, so that a
    way whose top frames closed down to its fork goes on as the fork's tails."""


def _shared_ways(following, limit: int) -> list[tuple[tuple, int]]:
    """The first ``limit`` of the ways (``following``: frames, spacing), those with the same top frames and spacing
    merged into one over a fork of the stacks below them, so that no two ways differ only below their tops (nested
    unions of objects that share their first keys multiplied them, and past the cap valid answers were refused)."""
    groups: dict = {}
    for frames, spacing in following:
        for way in _unforked(frames):
            split = len(way) - _top_length(way)
            groups.setdefault((way[split:], spacing), {})[way[:split]] = way
    ways, forked = [], False
    for (top, spacing), tails in groups.items():
        if len(tails) == 1:
            way = next(iter(tails.values()))
            forked = forked or bool(way) and way[0][0] == "fork"
            ways.append((way, spacing))
            continue
        below: dict = {}
        for tail in tails:
            below.update(dict.fromkeys(_unforked(tail)))
        ways.append(((("fork", _Fork(tuple(below))),) + top, spacing))
        forked = True
    return _Forked(ways[:limit]) if forked else ways[:limit]


class SchemaConstraint:
    """One answer's parser over the bytes of the tokens taken so far (a ``TokenConstraint``).

    The sampler asks :meth:`allows` token by token, most likely first. Where few tokens fit (after
    ``"age": `` only digits do), it may ask about most of the vocabulary; past SCAN_AFTER questions in
    one state, the whole allowed set is found at once by walking a byte trie of the vocabulary, which
    stops at a prefix's first refused byte (on SmolLM2's 49,152 tokens: 1 ms where 11 tokens fit,
    against 46 ms asking token by token)."""

    SCAN_AFTER = 16

    def __init__(self, token_bytes: list[bytes | None], compiled: CompiledSchema):
        self.token_bytes = token_bytes
        self.parser = _Parser(compiled)
        self.max_ways = max(MAX_WAYS, WAYS_PER_OPTION * _schema_size(compiled))
        # (frames, spacing state): no whitespace before the value, as llama.cpp's ``root ::= object`` allows none
        self.ways: list[tuple[tuple, int]] = [((("value", compiled.root),), NO_SPACE)]
        self._asked = 0
        self._allowed: set[int] | None = None

    def _feed(self, ways: list[tuple[tuple, int]], data: bytes) -> list[tuple[tuple, int]]:
        for byte in data:
            following: dict = {}
            for frames, spacing in ways:
                structural = byte in _WHITESPACE and (not frames or frames[-1][0] in ("value", "object", "array")
                                                      or _number_ends(frames[-1]))
                if structural:
                    spacing = _spacing_after(spacing, byte)
                    if spacing is None:
                        continue
                for way in self.parser.step(frames, byte):
                    following.setdefault(way, spacing if structural else 0)
            if type(ways) is _Forked or len(following) > SHARE_AFTER:
                ways = _shared_ways(following.items(), self.max_ways)
            else:
                ways = list(following.items())[:self.max_ways]
            if not ways:
                return []
        return ways

    def allows(self, token_id: int) -> bool:
        if self._allowed is not None:
            return token_id in self._allowed
        self._asked += 1
        if self._asked > self.SCAN_AFTER:
            self._allowed = self._allowed_tokens()
            return token_id in self._allowed
        data = self.token_bytes[token_id] if 0 <= token_id < len(self.token_bytes) else None
        return bool(data) and bool(self._feed(self.ways, data))

    def _allowed_tokens(self) -> set[int]:
        """Every token that continues the answer, by a walk of the vocabulary's byte trie."""
        return tokens_accepted(self.token_bytes, self.ways, lambda ways, byte: self._feed(ways, bytes((byte,))))

    def advance(self, token_id: int) -> None:
        ways = self._feed(self.ways, self.token_bytes[token_id] or b"")
        if not ways:
            raise ValueError(f"token {token_id} does not continue the answer the JSON schema allows")
        self.ways, self._asked, self._allowed = ways, 0, None

    @property
    def complete(self) -> bool:
        """The root value has closed."""
        return any(not frames for frames, _ in self.ways)
