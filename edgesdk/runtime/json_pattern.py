"""A JSON schema string's ``pattern`` and ``format``, as a grammar over its characters.

``pattern`` is an ECMA-262 regular expression (JSON Schema 2020-12 validation, section 6.3.3) that
the string must contain a match of; ``^`` and ``$`` anchor it, as usual. It is read into
character sets, sequences, alternatives and repetitions and written as GBNF, which
:class:`~edgesdk.runtime.grammar.GrammarMatcher` follows character by character while the JSON
string is written. llama.cpp's converter (common/json-schema-to-grammar.cpp, ``_visit_pattern``)
does the same for anchored patterns only; an unanchored side here reads as any text there.

The supported syntax: literal characters, ``.``, classes ``[...]`` / ``[^...]`` with ranges, the
escapes ``\\d \\D \\w \\W \\s \\S \\t \\n \\r \\f \\v \\0 \\xHH \\uHHHH`` and an escaped punctuation
character, groups ``(...)``, ``(?:...)`` and ``(?<name>...)``, ``|``, and ``? * + {n} {n,} {n,m}``
(lazy forms alike: they match the same strings). Lookarounds, back-references and word boundaries
are refused by name.

The answer writes the string's characters as they are, never as JSON escapes, so what the pattern
reads is what is written. Characters a JSON string cannot hold unescaped (``"``, ``\\``, control
characters) are therefore left out of every set; a part left with nothing to match is dropped
where it may be skipped, and a pattern that cannot do without one is refused. Every set left is
non-empty, so every way into the pattern can be finished.

``format`` takes ``date``, ``time``, ``date-time`` (RFC 3339 section 5.6, as JSON Schema 2020-12
section 7.3.1 names it; at most 9 digits of a second's fraction; a date's day one its month has, February's
29th in leap years only, section 5.7; years from 0001, the first that Python's ``date``, and so pydantic
and the jsonschema package, read) and ``uuid`` (RFC 4122), each written as a pattern here.
"""

from __future__ import annotations

from functools import lru_cache

from edgesdk.errors import EdgeSDKError
from edgesdk.runtime.gbnf import merge_ranges, parse_grammar, whole_number
from edgesdk.runtime.grammar import GrammarMatcher

LAST_CODE_POINT = 0x10FFFF
# Characters a JSON string holds unescaped (RFC 8259 section 7), less the UTF-16 surrogates, which are no characters.
WRITABLE = ((0x20, 0x21), (0x23, 0x5B), (0x5D, 0xD7FF), (0xE000, LAST_CODE_POINT))
DIGIT = ((0x30, 0x39),)
WORD = ((0x30, 0x39), (0x41, 0x5A), (0x5F, 0x5F), (0x61, 0x7A))
# ECMA-262 WhiteSpace and LineTerminator (\s)
SPACE = ((0x09, 0x0D), (0x20, 0x20), (0xA0, 0xA0), (0x1680, 0x1680), (0x2000, 0x200A), (0x2028, 0x2029),
         (0x202F, 0x202F), (0x205F, 0x205F), (0x3000, 0x3000), (0xFEFF, 0xFEFF))
LINE_TERMINATORS = ((0x0A, 0x0A), (0x0D, 0x0D), (0x2028, 0x2029))
CLASS_ESCAPES = {"d": (DIGIT, False), "D": (DIGIT, True), "w": (WORD, False), "W": (WORD, True),
                 "s": (SPACE, False), "S": (SPACE, True)}
CHAR_ESCAPES = {"t": "\t", "n": "\n", "r": "\r", "f": "\f", "v": "\v", "0": "\0"}
SYNTAX = set("^$\\.*+?()[]{}|/-")

# RFC 3339 section 5.7: a day that its month has (February's 29th in leap years only, section 5.7's rule:
# divisible by 4, and by 400 where by 100); years from 0001, as Python's date (so pydantic) reads them.
_YEAR = r"(\d{3}[1-9]|\d\d[1-9]0|\d[1-9]00|[1-9]000)"
_LEAP_YEAR = r"(\d\d(0[48]|[2468][048]|[13579][26])|(0[48]|[2468][048]|[13579][26])00)"
_DATE = (rf"({_YEAR}-(0[1-9]|1[0-2])-(0[1-9]|1\d|2[0-8])|{_YEAR}-(0[13-9]|1[0-2])-(29|30)"
         rf"|{_YEAR}-(0[13578]|1[02])-31|{_LEAP_YEAR}-02-29)")
_TIME = r"([01]\d|2[0-3]):[0-5]\d:([0-5]\d|60)(\.\d{1,9})?([Zz]|[+-]([01]\d|2[0-3]):[0-5]\d)"
FORMATS = {
    "date": rf"^{_DATE}$",
    "time": rf"^{_TIME}$",
    "date-time": rf"^{_DATE}[Tt]{_TIME}$",
    "uuid": r"^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$",
}


class PatternError(EdgeSDKError):
    """A ``pattern`` this constraint cannot follow."""


def _complement(ranges) -> tuple[tuple[int, int], ...]:
    result, start = [], 0
    for low, high in merge_ranges(ranges):
        if low > start:
            result.append((start, low - 1))
        start = high + 1
    if start <= LAST_CODE_POINT:
        result.append((start, LAST_CODE_POINT))
    return tuple(result)


def _writable(ranges) -> tuple[tuple[int, int], ...]:
    """``ranges`` less what a JSON string cannot hold unescaped."""
    return _complement(merge_ranges(_complement(ranges) + _complement(WRITABLE)))


class _Reader:
    """Reads a pattern into a tree: ("set", ranges) | ("seq", items) | ("alt", options) | ("repeat", item, low, high)."""

    def __init__(self, pattern: str):
        self.src, self.pos = pattern, 0

    def fail(self, problem: str, fix: str) -> PatternError:
        return PatternError(f"pattern {self.src!r}: {problem} (at character {self.pos})", fix)

    def peek(self, text: str = "") -> bool:
        return self.src.startswith(text, self.pos) if text else self.pos < len(self.src)

    def alternatives(self) -> tuple:
        options = [self.sequence()]
        while self.peek("|"):
            self.pos += 1
            options.append(self.sequence())
        return options[0] if len(options) == 1 else ("alt", tuple(options))

    def sequence(self) -> tuple:
        items = []
        while self.peek() and not self.peek("|") and not self.peek(")"):
            if self.peek("^") or self.peek("$"):
                raise self.fail(f"{self.src[self.pos]} inside the pattern (anchors are taken at its ends only)",
                                "anchor the whole pattern: ^ first, $ last")
            items.append(self.quantified(self.atom()))
        return ("seq", tuple(items))

    def atom(self) -> tuple:
        char = self.src[self.pos]
        self.pos += 1
        if char == ".":
            return ("set", _complement(LINE_TERMINATORS))
        if char == "[":
            return self.char_class()
        if char == "(":
            if self.peek("?:"):
                self.pos += 2
            elif self.peek("?<") and not self.peek("?<=") and not self.peek("?<!"):
                end = self.src.find(">", self.pos)
                if end < 0:
                    raise self.fail("a named group's name is not closed", "end the name with >")
                self.pos = end + 1
            elif self.peek("?"):
                raise self.fail("lookarounds ((?=, (?!, (?<=, (?<!) are not supported",
                                "write the pattern without them")
            inner = self.alternatives()
            if not self.peek(")"):
                raise self.fail("a group is not closed", "end it with )")
            self.pos += 1
            return inner
        if char == "\\":
            return self.escape(in_class=False)
        if char in "*+?{":
            if char == "{" and not self._bounds_ahead(self.pos - 1):
                return ("set", ((ord(char), ord(char)),))
            raise self.fail(f"{char} repeats nothing", f"write \\{char} for the character itself")
        if char in ")]":
            raise self.fail(f"an unmatched {char}", f"write \\{char} for the character itself")
        return ("set", ((ord(char), ord(char)),))

    def escape(self, in_class: bool) -> tuple:
        if not self.peek():
            raise self.fail("a backslash ends the pattern", "write \\\\ for a backslash")
        char = self.src[self.pos]
        self.pos += 1
        if char in CLASS_ESCAPES:
            ranges, negated = CLASS_ESCAPES[char]
            return ("set", _complement(ranges) if negated else ranges)
        if char in CHAR_ESCAPES:
            code = ord(CHAR_ESCAPES[char])
        elif char in "xu":
            digits = 2 if char == "x" else 4
            text = self.src[self.pos:self.pos + digits]
            if len(text) != digits or any(c not in "0123456789abcdefABCDEF" for c in text):
                raise self.fail(f"\\{char} needs {digits} hexadecimal digits", f"write it as \\{char}{'0' * digits}")
            self.pos += digits
            code = int(text, 16)
        elif char == "b" and in_class:
            code = 0x08
        elif char in "bB" or char.isdigit() or char in "kpPc":
            raise self.fail(f"\\{char} (word boundaries, back-references, named references, property and control "
                            "escapes) is not supported", "write the pattern without it")
        elif char in SYNTAX or not char.isalnum():
            code = ord(char)
        else:
            raise self.fail(f"unknown escape \\{char}", "drop the backslash or escape only syntax characters")
        return ("set", ((code, code),))

    def char_class(self) -> tuple:
        negated = self.peek("^")
        self.pos += negated
        ranges: list[tuple[int, int]] = []
        while not self.peek("]"):  # ECMA-262: [] matches nothing and [^] any character
            if not self.peek():
                raise self.fail("a character class is not closed", "end it with ]")
            low = self.class_atom()
            if self.peek("-") and not self.peek("-]") and low is not None and len(low) == 1 and low[0][0] == low[0][1]:
                self.pos += 1
                high = self.class_atom()
                if high is None or len(high) != 1 or high[0][0] != high[0][1]:
                    raise self.fail("a range in a class ends in a class escape", "list that escape apart")
                if high[0][0] < low[0][0]:
                    raise self.fail("a range in a class runs backwards", "write its ends the other way round")
                ranges.append((low[0][0], high[0][0]))
            else:
                ranges.extend(low)
        self.pos += 1
        merged = merge_ranges(ranges)
        return ("set", _complement(merged) if negated else merged)

    def class_atom(self) -> tuple:
        char = self.src[self.pos]
        self.pos += 1
        if char == "\\":
            return self.escape(in_class=True)[1]
        return ((ord(char), ord(char)),)

    def _bounds_ahead(self, pos: int) -> bool:
        end = self.src.find("}", pos)
        body = self.src[pos + 1:end] if end > 0 else ""
        low, _, high = body.partition(",")
        return whole_number(low) and (not high or whole_number(high))

    def quantified(self, item: tuple) -> tuple:
        while self.peek():
            char = self.src[self.pos]
            if char in "*+?":
                self.pos += 1
                item = ("repeat", item, 1 if char == "+" else 0, None if char != "?" else 1)
            elif char == "{" and self._bounds_ahead(self.pos):
                end = self.src.index("}", self.pos)
                low_text, comma, high_text = self.src[self.pos + 1:end].partition(",")
                low, high = int(low_text), (int(high_text) if high_text else None) if comma else int(low_text)
                if high is not None and high < low:
                    raise self.fail(f"{{{low},{high}}} runs backwards", "write the smaller count first")
                self.pos = end + 1
                item = ("repeat", item, low, high)
            else:
                return item
            if self.peek("?"):  # a lazy quantifier matches the same strings
                self.pos += 1
            if self.peek() and self.src[self.pos] in "*+":
                raise self.fail("a quantifier follows a quantifier", "group the repeated part: (x+)*")
        return item


def _class_text(ranges) -> str:
    return "[" + "".join(f"\\U{low:08X}" + (f"-\\U{high:08X}" if high > low else "") for low, high in ranges) + "]"


def _gbnf(node: tuple) -> str | None:
    """The GBNF text of a pattern tree, its sets cut to what a JSON string holds unescaped; None where
    that leaves it nothing to match. A part with nothing to match is left out where it may be skipped
    (an option, a repetition of at least 0), so no way into the grammar is left without a way on."""
    kind = node[0]
    if kind == "set":
        ranges = _writable(node[1])
        return _class_text(ranges) if ranges else None
    if kind == "seq":
        parts = [_gbnf(item) for item in node[1]]
        return None if None in parts else " ".join(f"({part})" for part in parts) if parts else '""'
    if kind == "alt":
        options = [option for option in map(_gbnf, node[1]) if option is not None]
        return " | ".join(f"({option})" for option in options) if options else None
    _, item, low, high = node
    inner = _gbnf(item)
    if inner is None:
        return '""' if low == 0 else None
    return f"({inner}){{{low},}}" if high is None else f"({inner}){{{low},{high}}}"


def pattern_grammar(pattern: str) -> str:
    """GBNF whose ``root`` takes the strings that hold a match of ``pattern`` (ECMA-262, unanchored
    unless ``^`` / ``$`` say so)."""
    if not isinstance(pattern, str):
        raise PatternError(f"a pattern must be a string, got {pattern!r}", "write the regular expression as a string")
    body = pattern
    backslashes = len(body[:-1]) - len(body[:-1].rstrip("\\"))  # before a final $: odd escapes it
    anchored_start, anchored_end = body.startswith("^"), body.endswith("$") and backslashes % 2 == 0
    body = body[1 if anchored_start else 0:len(body) - 1 if anchored_end else len(body)]
    reader = _Reader(body)
    tree = reader.alternatives()
    if reader.peek():
        raise reader.fail("an unmatched )", "write \\) for the character itself")
    text = _gbnf(tree)
    if text is None:
        raise PatternError(f"pattern {pattern!r} needs a character a JSON string holds only escaped (a quote, a "
                           "backslash or a control character), which the answer does not write",
                           "leave such characters out of the pattern, or make them optional")
    anything = _class_text(WRITABLE) + "*"
    parts = ([] if anchored_start else [anything]) + [f"({text})"] + \
        ([] if anchored_end else [anything])
    return "root ::= " + " ".join(parts) + "\n"


@lru_cache(maxsize=64)
def string_matcher(pattern: str) -> GrammarMatcher:
    """A matcher over a string's characters for ``pattern`` (one per pattern: its steps are cached)."""
    return GrammarMatcher(parse_grammar(pattern_grammar(pattern)))
