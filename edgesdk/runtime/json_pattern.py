"""A JSON schema string's ``pattern`` and ``format``, as a grammar over its characters.

``pattern`` is an ECMA-262 regular expression (JSON Schema 2020-12 validation, section 6.3.3) that
the string must contain a match of; ``^`` and ``$`` anchor it, as usual, at the ends of the pattern and of
each of its top-level ``|`` alternatives (``^$|^[0-9]{5}$``: empty or five digits; ``^a|b$``: starts with
``a`` or ends with ``b``). It is read into
character sets, sequences, alternatives and repetitions and written as GBNF, which
:class:`~edgesdk.runtime.grammar.GrammarMatcher` follows character by character while the JSON
string is written. llama.cpp's converter (common/json-schema-to-grammar.cpp, ``_visit_pattern``)
does the same for anchored patterns only; an unanchored side here reads as any text there.

The supported syntax: literal characters, ``.``, classes ``[...]`` / ``[^...]`` with ranges, the
escapes ``\\d \\D \\w \\W \\s \\S \\t \\n \\r \\f \\v \\0 \\xHH \\uHHHH`` (a UTF-16 surrogate pair of
them one character), ``\\u{H...}`` (the ``u`` flag's code point escape) and an escaped punctuation character,
groups ``(...)``, ``(?:...)`` and ``(?<name>...)``, ``|``, and ``? * + {n} {n,} {n,m}`` (lazy forms alike: they match the same strings).
Lookarounds, back-references and word boundaries are refused by name.

The answer writes the string's characters as they are, never as JSON escapes, so what the pattern
reads is what is written. Characters a JSON string cannot hold unescaped (``"``, ``\\``, control
characters) are therefore left out of every set; a part left with nothing to match is dropped
where it may be skipped, and a pattern that cannot do without one is refused. Every set left is
non-empty, so every way into the pattern can be finished.

``format`` takes ``date``, ``time``, ``date-time`` (RFC 3339 section 5.6, as JSON Schema 2020-12
section 7.3.1 names it; at most 9 digits of a second's fraction; a leap second at 23:59:60 UTC only, section
5.7; a date's day one its month has, February's 29th in leap years only, section 5.7; years from 0001, the
first that Python's ``date``, and so pydantic and the jsonschema package, read) and ``uuid`` (RFC 4122), each
written as a pattern here.
"""

from __future__ import annotations

from functools import lru_cache

from edgesdk.errors import EdgeSDKError
from edgesdk.runtime.gbnf import CHAR, MAX_REPETITION, GrammarError, merge_ranges, parse_grammar, whole_number
from edgesdk.runtime.grammar import GrammarMatcher

LAST_CODE_POINT = 0x10FFFF
# Characters a JSON string holds unescaped (RFC 8259 section 7), less the UTF-16 surrogates, which are no characters.
WRITABLE = ((0x20, 0x21), (0x23, 0x5B), (0x5D, 0xD7FF), (0xE000, LAST_CODE_POINT))
# Every character a string may hold (escaped or not): the code points less the UTF-16 surrogates, which UTF-8 cannot
# write (RFC 3629 section 3), so no grammar class takes one alone.
CHARACTERS = ((0, 0xD7FF), (0xE000, LAST_CODE_POINT))
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
# RFC 3339 section 5.7 and appendix D: a leap second (:60) comes only at the end of a UTC day, 23:59:60 UTC; the
# JSON Schema Test Suite (optional/format/time.json) takes "23:59:60Z" and refuses "22:59:60Z" and "23:58:60Z". It is
# written here in UTC only (Z, +00:00, -00:00), where the time as written is the UTC one (a time at another offset
# is a leap second only at the local time that offset makes of 23:59 UTC, 2,880 of them).
_FRACTION = r"(\.\d{1,9})?"
_TIME = (rf"(([01]\d|2[0-3]):[0-5]\d:[0-5]\d{_FRACTION}([Zz]|[+-]([01]\d|2[0-3]):[0-5]\d)"
         rf"|23:59:60{_FRACTION}([Zz]|[+-]00:00))")
# RFC 2673 / RFC 3986 section 3.2.2 dotted-quad: each octet 0-255, no leading zero (which Python's ipaddress,
# and so pydantic, refuses).
_OCTET = r"(25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)"
_IPV4 = rf"{_OCTET}(\.{_OCTET}){{3}}"
# RFC 4291 section 2.2, as RFC 3986 section 3.2.2's IPv6address writes it: eight groups, "::" for one or more
# groups of zeros, the last two groups as an IPv4 address.
_H16 = r"[0-9a-fA-F]{1,4}"
_LS32 = rf"({_H16}:{_H16}|{_IPV4})"
_IPV6 = "(" + "|".join((
    rf"({_H16}:){{6}}{_LS32}", rf"::({_H16}:){{5}}{_LS32}", rf"({_H16})?::({_H16}:){{4}}{_LS32}",
    rf"(({_H16}:){{0,1}}{_H16})?::({_H16}:){{3}}{_LS32}", rf"(({_H16}:){{0,2}}{_H16})?::({_H16}:){{2}}{_LS32}",
    rf"(({_H16}:){{0,3}}{_H16})?::{_H16}:{_LS32}", rf"(({_H16}:){{0,4}}{_H16})?::{_LS32}",
    rf"(({_H16}:){{0,5}}{_H16})?::{_H16}", rf"(({_H16}:){{0,6}}{_H16})?::")) + ")"
# RFC 1123 section 2.1: labels of letters, digits and inner hyphens, 1 to 63 characters (the whole name at most
# 253, FORMAT_MAX_LENGTH).
_LABEL = r"[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
_HOSTNAME = rf"{_LABEL}(\.{_LABEL})*"
# RFC 5321 section 4.1.2: a Dot-string local part (RFC 5322 atext) and a domain of RFC 1123 labels. A quoted
# local part and an address literal are left out (a quoted one needs a quote or a backslash, which the answer
# writes only escaped); what is written is a subset of what jsonschema's format checker takes (any string
# with an @) and of RFC 5322's addr-spec.
_ATEXT = r"[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]"
_EMAIL = rf"{_ATEXT}+(\.{_ATEXT}+)*@{_HOSTNAME}"
# RFC 3986: scheme ":" hier-part ["?" query] ["#" fragment]. A host is an IPv6 literal or a reg-name (which
# an IPv4 address also reads as); IPvFuture literals, which a WHATWG parser (pydantic's Url) refuses, are left
# out, and a port is at most 65535, the most such a parser takes.
_UNRESERVED = r"A-Za-z0-9._~\-"
_SUB_DELIMS = r"!$&'()*+,;="
_PCT = r"%[0-9A-Fa-f]{2}"
_PCHAR = rf"([{_UNRESERVED}{_SUB_DELIMS}:@]|{_PCT})"
_PORT = r"(\d{0,4}|[0-5]\d{4}|6[0-4]\d{3}|65[0-4]\d\d|655[0-2]\d|6553[0-5])"
_AUTHORITY = (rf"(([{_UNRESERVED}{_SUB_DELIMS}:]|{_PCT})*@)?"
              rf"(\[{_IPV6}\]|([{_UNRESERVED}{_SUB_DELIMS}]|{_PCT})*)"
              rf"(:{_PORT})?")
_URI = (rf"[A-Za-z][A-Za-z0-9+.\-]*:(//{_AUTHORITY}(/{_PCHAR}*)*|/({_PCHAR}+(/{_PCHAR}*)*)?|{_PCHAR}+(/{_PCHAR}*)*|)"
        rf"(\?({_PCHAR}|[/?])*)?(#({_PCHAR}|[/?])*)?")
# ISO 8601 durations as pydantic writes and reads them (timedelta: "P1DT2H", "-PT0.5S", "P2739726Y9D"): a sign,
# then years, months and days, then T and hours, minutes and seconds (a fraction on seconds only), at least one
# of them; or weeks alone, as RFC 3339 appendix A's dur-week writes them (JSON Schema 2020-12 section 7.3.1 names
# it: its test suite refuses "P1Y2W", weeks beside other units, which pydantic reads but never writes). The
# digits of each are capped so that no sum of them passes what pydantic reads (its 999,999,999 days, and 2**32
# seconds in the time part): at most 2,599,999 years, 9999 months, 9999 weeks, 9,999,999 days, 99,999 hours,
# 999,999 minutes and 99,999,999 seconds.
_SECONDS = r"\d{1,8}(\.\d{1,6})?S"
_DURATION_TIME = rf"T(\d{{1,5}}H(\d{{1,6}}M)?({_SECONDS})?|\d{{1,6}}M({_SECONDS})?|{_SECONDS})"
_DURATION_DATE = r"((\d{1,6}|[01]\d{6}|2[0-5]\d{5})Y(\d{1,4}M)?(\d{1,7}D)?|\d{1,4}M(\d{1,7}D)?|\d{1,7}D)"
_DURATION_WEEK = r"\d{1,4}W"
FORMATS = {
    "date": rf"^{_DATE}$",
    "time": rf"^{_TIME}$",
    "date-time": rf"^{_DATE}[Tt]{_TIME}$",
    "uuid": r"^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$",
    "ipv4": rf"^{_IPV4}$",
    "ipv6": rf"^{_IPV6}$",
    "hostname": rf"^{_HOSTNAME}$",
    "email": rf"^{_EMAIL}$",
    "uri": rf"^{_URI}$",
    "duration": rf"^-?P({_DURATION_DATE}({_DURATION_TIME})?|{_DURATION_TIME}|{_DURATION_WEEK})$",
}
# Lengths a format bounds that its pattern does not: RFC 1123 section 2.1 and RFC 1035 section 2.3.4 (253
# characters written without the final dot), RFC 5321 section 4.5.3.1.3 (a path of 256 octets with its < >).
FORMAT_MAX_LENGTH = {"hostname": 253, "email": 254}


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


def _writable(ranges, within=WRITABLE) -> tuple[tuple[int, int], ...]:
    """``ranges`` less what a JSON string cannot hold unescaped (``within``: less what is outside those ranges)."""
    return _complement(merge_ranges(_complement(ranges) + _complement(within)))


class _Reader:
    """Reads a pattern into a tree: ("set", ranges) | ("seq", items) | ("alt", options) | ("repeat", item, low, high)."""

    def __init__(self, pattern: str):
        self.src, self.pos = pattern, 0

    def fail(self, problem: str, fix: str, at: int | None = None) -> PatternError:
        """The error for the part of the pattern that starts at index ``at`` (the index read next where None)."""
        return PatternError(f"pattern {self.src!r}: {problem} (at character {self.pos if at is None else at})", fix)

    def peek(self, text: str = "") -> bool:
        return self.src.startswith(text, self.pos) if text else self.pos < len(self.src)

    def alternatives(self) -> tuple:
        options = [self.sequence()]
        while self.peek("|"):
            self.pos += 1
            options.append(self.sequence())
        return options[0] if len(options) == 1 else ("alt", tuple(options))

    def anchored_alternatives(self) -> list[tuple[tuple, bool, bool]]:
        """The pattern's top-level alternatives, each with whether ``^`` starts it and ``$`` ends it: in
        ECMA-262 ``^a|b$`` is a string that starts with ``a`` or one that ends with ``b``, and ``^$|^[0-9]{5}$``
        the empty string or five digits."""
        options = []
        while True:
            start = self.peek("^")
            self.pos += start
            tree = self.sequence(top=True)
            end = self.peek("$")
            self.pos += end
            options.append((tree, start, end))
            if not self.peek("|"):
                return options
            self.pos += 1

    def sequence(self, top: bool = False) -> tuple:
        items = []
        while self.peek() and not self.peek("|") and not self.peek(")"):
            if top and self.peek("$") and (self.pos + 1 == len(self.src) or self.src[self.pos + 1] == "|"):
                break  # the end anchor of a top-level alternative
            if not top and self.peek("$") and self.pos + 1 == len(self.src):  # "^(ab$"
                raise self.fail("a group is not closed", "end it with )")
            if self.peek("^") or self.peek("$"):
                raise self.fail(f"{self.src[self.pos]} inside the pattern (anchors are taken only at the ends of "
                                "the pattern and of its top-level | alternatives)",
                                "anchor the whole pattern or each of its alternatives: ^ first, $ last")
            items.append(self.quantified(self.atom()))
        return ("seq", tuple(items))

    def atom(self) -> tuple:
        start, char = self.pos, self.src[self.pos]
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
                    raise self.fail("a named group's name is not closed", "end the name with >", start)
                self.pos = end + 1
            elif self.peek("?=") or self.peek("?!") or self.peek("?<=") or self.peek("?<!"):
                raise self.fail("lookarounds ((?=, (?!, (?<=, (?<!) are not supported",
                                "write the pattern without them", start)
            elif self.peek("?"):  # Python's inline flags (?i) and named groups (?P<name>...), which pydantic passes on
                raise self.fail(f"the group {self.src[self.pos - 1:self.pos + 3]!r}... is not ECMA-262 syntax (its groups "
                                "are (...), (?:...) and (?<name>...); inline flags such as (?i) and Python's "
                                "(?P<name>...) are not)", "write the group as (?:...) or (?<name>...), and a letter "
                                "in either case as a class such as [Aa]", start)
            inner = self.alternatives()
            if not self.peek(")"):
                raise self.fail("a group is not closed", "end it with )", start)
            self.pos += 1
            return inner
        if char == "\\":
            return self.escape(in_class=False)
        if char in "*+?{":
            if char == "{" and not self._bounds_ahead(self.pos - 1):
                return ("set", ((ord(char), ord(char)),))
            raise self.fail(f"{char} repeats nothing", f"write \\{char} for the character itself", start)
        if char == ")":
            raise self.fail(f"an unmatched {char}", f"write \\{char} for the character itself", start)
        return ("set", ((ord(char), ord(char)),))  # "]" and "}" too (ECMA-262 Annex B.1.2, as browsers read them)

    def escape(self, in_class: bool) -> tuple:
        start = self.pos - 1  # the backslash, just read
        if not self.peek():
            raise self.fail("a backslash ends the pattern", "write \\\\ for a backslash", start)
        char = self.src[self.pos]
        self.pos += 1
        if char in CLASS_ESCAPES:
            ranges, negated = CLASS_ESCAPES[char]
            return ("set", _complement(ranges) if negated else ranges)
        if char in CHAR_ESCAPES:
            code = ord(CHAR_ESCAPES[char])
        elif char == "u" and self.peek("{"):
            code = self._braced_code_point()
        elif char in "xu":
            digits = 2 if char == "x" else 4
            text = self.src[self.pos:self.pos + digits]
            if len(text) != digits or any(c not in "0123456789abcdefABCDEF" for c in text):
                raise self.fail(f"\\{char} needs {digits} hexadecimal digits", f"write it as \\{char}{'0' * digits}", start)
            self.pos += digits
            code = self._surrogate_pair(int(text, 16)) if char == "u" else int(text, 16)
        elif char == "b" and in_class:
            code = 0x08
        elif char in "bB" or char.isdigit() or char in "kpPc":
            raise self.fail(f"\\{char} (word boundaries, back-references, named references, property and control "
                            "escapes) is not supported", "write the pattern without it", start)
        elif char in SYNTAX or not char.isalnum():
            code = ord(char)
        else:
            raise self.fail(f"unknown escape \\{char}", "drop the backslash or escape only syntax characters", start)
        return ("set", ((code, code),))

    def _braced_code_point(self) -> int:
        """The code point of a ``\\u{H...}`` escape, its ``\\u`` just read: ECMA-262's form with the ``u`` flag, which
        JSON Schema reads patterns with (``\\u{1F600}``, ``\\u{41}``), any number of hexadecimal digits up to 10FFFF."""
        end = self.src.find("}", self.pos)
        text = self.src[self.pos + 1:end] if end > 0 else ""
        if not text or any(c not in "0123456789abcdefABCDEF" for c in text) or int(text, 16) > LAST_CODE_POINT:
            raise self.fail(f"\\u{{...}} needs hexadecimal digits of a code point up to 10FFFF, got "
                            f"{self.src[self.pos - 2:end + 1 if end > 0 else len(self.src)]!r}",
                            "write it as \\u{1F600}, or \\uHHHH with four digits", self.pos - 2)
        self.pos = end + 1
        return int(text, 16)

    def _surrogate_pair(self, code: int) -> int:
        """``code`` (a ``\\uHHHH`` escape just read), joined with the ``\\uHHHH`` after it where the two are a UTF-16
        surrogate pair: ``\\uD83D\\uDE00`` is the one character U+1F600, as ECMA-262 reads it (with the ``u`` flag
        one code point, ``[\\uD83D\\uDE00-\\uD83D\\uDE4F]`` a range of them; without it the two code units that
        spell that character). Each half alone is no character a string holds, so the pattern was refused."""
        trail = self.src[self.pos + 2:self.pos + 6]
        if 0xD800 <= code <= 0xDBFF and self.peek("\\u") and len(trail) == 4 and all(
                c in "0123456789abcdefABCDEF" for c in trail) and 0xDC00 <= int(trail, 16) <= 0xDFFF:
            self.pos += 6
            return 0x10000 + ((code - 0xD800) << 10) + (int(trail, 16) - 0xDC00)
        return code

    def char_class(self) -> tuple:
        start = self.pos - 1  # the [, just read
        negated = self.peek("^")
        self.pos += negated
        ranges: list[tuple[int, int]] = []
        while not self.peek("]"):  # ECMA-262: [] matches nothing and [^] any character
            if not self.peek():
                raise self.fail("a character class is not closed", "end it with ]", start)
            low_at, low = self.pos, self.class_atom()
            if self.peek("-") and not self.peek("-]") and low is not None and len(low) == 1 and low[0][0] == low[0][1]:
                self.pos += 1
                if not self.peek():  # "[a-" ends the pattern
                    raise self.fail("a character class is not closed", "end it with ]", start)
                high = self.class_atom()
                if high is None or len(high) != 1 or high[0][0] != high[0][1]:
                    raise self.fail("a range in a class ends in a class escape", "list that escape apart", low_at)
                if high[0][0] < low[0][0]:
                    raise self.fail("a range in a class runs backwards", "write its ends the other way round", low_at)
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
                if max(low, high or 0) > MAX_REPETITION:  # the grammar's limit (llama.cpp's parser has one too)
                    raise self.fail(f"the count {max(low, high or 0)} in {self.src[self.pos:end + 1]} is past the "
                                    f"{MAX_REPETITION} repetitions followed here",
                                    "write * or + for a long run and bound the string's length with minLength / "
                                    "maxLength")
                self.pos = end + 1
                item = ("repeat", item, low, high)
            else:
                return item
            if self.peek("?"):  # a lazy quantifier matches the same strings
                self.pos += 1
            # ECMA-262 (22.2.1, Term :: Atom Quantifier) takes one quantifier, and its lazy "?", per atom: "a{2}{3}"
            # and "a???" are SyntaxErrors ("Nothing to repeat"), as they are for Python's re ("multiple repeat")
            if self.peek() and (self.src[self.pos] in "*+?" or self.peek("{") and self._bounds_ahead(self.pos)):
                raise self.fail("a quantifier follows a quantifier", "group the repeated part: (x+)*, (x{2}){3}")
        return item


def _class_text(ranges) -> str:
    return "[" + "".join(f"\\U{low:08X}" + (f"-\\U{high:08X}" if high > low else "") for low, high in ranges) + "]"


def _gbnf(node: tuple, within=WRITABLE) -> str | None:
    """The GBNF text of a pattern tree, its sets cut to the code points ``within`` (what a JSON string holds
    unescaped, or CHARACTERS: every character a string may hold); None where that leaves it nothing to match. A part
    with nothing to match is left out where it may be skipped (an option, a repetition of at least 0), so no way into
    the grammar is left without a way on."""
    kind = node[0]
    if kind == "set":
        ranges = _writable(node[1], within)
        return _class_text(ranges) if ranges else None
    if kind == "seq":
        parts = [_gbnf(item, within) for item in node[1]]
        return None if None in parts else " ".join(f"({part})" for part in parts) if parts else '""'
    if kind == "alt":
        options = [option for option in (_gbnf(each, within) for each in node[1]) if option is not None]
        return " | ".join(f"({option})" for option in options) if options else None
    _, item, low, high = node
    inner = _gbnf(item, within)
    if inner is None:
        return '""' if low == 0 else None
    if inner == '""':  # a repetition of the empty text is the empty text: ("")* is left-recursive GBNF, (?:)* is not
        return inner
    return f"({inner}){{{low},}}" if high is None else f"({inner}){{{low},{high}}}"


def pattern_grammar(pattern: str, every: bool = False) -> str:
    """GBNF whose ``root`` takes the strings that hold a match of ``pattern`` (ECMA-262, unanchored
    unless ``^`` / ``$`` say so), written without escapes (``every``: any string, as a validator reads it).

    Either way a set is cut to characters: a UTF-16 surrogate (``\\uD800`` alone) is no character UTF-8 can write,
    and the grammar refuses a class of surrogates only, so ``^a|\\uD800$`` is the pattern ``^a`` here, with or
    without ``every``."""
    if not isinstance(pattern, str):
        raise PatternError(f"a pattern must be a string, got {pattern!r}", "write the regular expression as a string")
    reader = _Reader(pattern)
    options = reader.anchored_alternatives()
    if reader.peek():
        raise reader.fail("an unmatched )", "write \\) for the character itself")
    within = CHARACTERS if every else WRITABLE
    anything = _class_text(within) + "*"
    written = []
    for tree, anchored_start, anchored_end in options:
        text = _gbnf(tree, within)
        if text is not None:  # an alternative left with nothing to match is dropped, as in an alternation
            parts = ([] if anchored_start else [anything]) + [f"({text})"] + ([] if anchored_end else [anything])
            written.append(" ".join(parts))
    if not written and every and all(_gbnf(tree, ((0, LAST_CODE_POINT),)) is None for tree, _, _ in options):
        raise PatternError(f"pattern {pattern!r} matches no string (an empty class [] that cannot be skipped)",
                           "drop the [] from the pattern, or make it optional with ?")
    if not written and every:
        raise PatternError(f"pattern {pattern!r} matches no string: it needs half of a UTF-16 surrogate pair "
                           "(\\uD800-\\uDFFF) alone, which is no character", "write the pair whole (\\uD83D\\uDE00 or "
                           "\\u{1F600}), or make the half optional with ?")
    if not written:
        raise PatternError(f"pattern {pattern!r} needs a character a JSON string holds only escaped (a quote, a "
                           "backslash or a control character), which the answer does not write, or one that is no "
                           "character (an empty class [], half of a UTF-16 surrogate pair \\uD800-\\uDFFF alone)",
                           "leave such characters out of the pattern, or make them optional")
    return "root ::= " + " | ".join(f"({each})" for each in written) + "\n"


@lru_cache(maxsize=64)
def string_matcher(pattern: str, every: bool = False) -> GrammarMatcher:
    """A matcher over a string's characters for ``pattern`` (one per pattern: its steps are cached): over the
    characters the answer writes unescaped, or (``every``) over every character, as a validator reads a string
    that holds a quote, a backslash or a control character (an enum value checked against the pattern beside it,
    json_schema's ``_Compiler._literal_filter``). A
    pattern whose grammar passes the grammar's limits (groups nested past its depth, repetitions of repetitions
    that write out too many symbols; llama.cpp's grammar parser refuses such grammars too, llama-grammar.cpp's
    MAX_REPETITION_THRESHOLD) is refused as a :class:`PatternError` that names the pattern, not the grammar
    written for it."""
    grammar = pattern_grammar(pattern, every)
    try:
        return GrammarMatcher(parse_grammar(grammar))
    except GrammarError as exc:
        problem = exc.problem.split(": ", 1)[-1]  # "grammar line 1, column N: ..." is the GBNF written here
        raise PatternError(f"pattern {pattern!r} is too large to follow: its grammar {problem}",
                           "simplify it: fewer nested groups, smaller counts {m,n}, or * / + with minLength / "
                           "maxLength") from exc


UNREACHABLE = float("inf")
# The most characters a pattern's minLength may ask for: PatternLengths.least walks one layer of states a character
# (a minLength of 10**9 walked 10**9 layers and kept an entry for each, stalling the request until memory ran out).
# The same limit as a count {m,n} in a pattern; llama.cpp's grammar refuses any minLength past 2,000.
MAX_MIN_LENGTH = MAX_REPETITION


class PatternLengths:
    """Which matcher states of a pattern can still be finished within a string's ``minLength`` /
    ``maxLength`` (JSON Schema 2020-12 validation, sections 6.3.1-6.3.2, counted in characters).

    The pattern grammar is regular: from a state, the characters fall into classes that lead to the same
    next state (the cells that the ranges on top of its stacks cut the code points into), so the states
    form a finite graph that is walked here one character at a time. :meth:`fits` says whether some
    completion's length lies within the bounds: the least completion of at least ``r`` more characters
    is found exactly (``r`` the characters ``minLength`` still asks for), layer by layer, and cached."""

    def __init__(self, matcher: GrammarMatcher, min_length: int, max_length: int | None):
        self.matcher, self.min_length, self.max_length = matcher, min_length, max_length
        self._next: dict = {}  # state -> ((low, high, state after a code point in [low, high]), ...)
        self._least: dict = {}  # (state, r) -> least completion length of at least r characters

    def _cells(self, state: tuple) -> tuple:
        """(first, last, representative) for each run of writable code points that the tops of the stacks
        treat alike."""
        cuts = {0, LAST_CODE_POINT + 1}
        for stack in state[0]:
            if stack:
                element = self.matcher.alternatives[stack[-1][0]][stack[-1][1]]
                if element[0] == CHAR:
                    for low, high in element[1]:
                        cuts.update((low, high + 1))
        bounds = sorted(cuts)
        cells = []
        for first, end in zip(bounds, bounds[1:], strict=False):
            for low, high in WRITABLE:
                if low <= end - 1 and first <= high:
                    cells.append((first, end - 1, max(first, low)))
                    break
        return tuple(cells)

    def successors(self, state: tuple) -> tuple:
        """The states after one whole character from ``state`` (a state between characters)."""
        found = self._next.get(state)
        if found is None:
            found = []
            for first, last, code in self._cells(state):
                after = self.matcher.feed(state, chr(code).encode())
                if after is not None:
                    found.append((first, last, after))
            found = self._next[state] = tuple(found)
        return found

    def least(self, state: tuple, at_least: int) -> float:
        """The fewest characters after ``state`` that finish the pattern, at least ``at_least`` of them."""
        key = (state, at_least)
        if key in self._least:
            return self._least[key]
        layers = [{state}]  # the states ``j`` characters on, for the lengths still to find
        for _ in range(at_least):
            layers.append({after for each in layers[-1] if (each, at_least - len(layers) + 1) not in self._least
                           for _, _, after in self.successors(each)})
        for depth in range(at_least, -1, -1):
            more = at_least - depth
            for each in layers[depth]:
                if (each, more) not in self._least:
                    self._least[(each, more)] = self._shortest(each) if more == 0 else \
                        1 + min((self._least[(after, more - 1)] for _, _, after in self.successors(each)),
                                default=UNREACHABLE)
        return self._least[key]

    def _shortest(self, state: tuple) -> float:
        """The fewest characters that finish the pattern from ``state`` (breadth first)."""
        frontier, seen, steps = [state], {state}, 0
        while frontier:
            if any(GrammarMatcher.accepts(each) for each in frontier):
                return steps
            frontier = [after for each in frontier for _, _, after in self.successors(each) if after not in seen
                        and not seen.add(after)]
            steps += 1
        return UNREACHABLE

    def fits(self, state: tuple, written: int) -> bool:
        """After ``written`` characters the pattern, in ``state``, can still end within the bounds. In a
        partial code point (a UTF-8 lead byte read, ``written`` counting it), some code point it can still
        become must lead to such a state."""
        if state[1] is not None:
            value, remaining, lowest, highest = state[1]
            shift = 6 * remaining
            low, high = max(value << shift, lowest), min((value << shift) | ((1 << shift) - 1), highest)
            whole = (frozenset(state[0]), None)
            for first, last, _ in self._cells(whole):
                for cell_low, cell_high in WRITABLE:
                    code = max(first, low, cell_low)
                    if code <= min(last, high, cell_high):
                        after = self.matcher.feed(state, chr(code).encode()[-remaining:])
                        if after is not None and self.fits(after, written):
                            return True
                        break
            return False
        more = self.least(state, max(0, self.min_length - written))
        return more != UNREACHABLE and (self.max_length is None or written + more <= self.max_length)


@lru_cache(maxsize=64)
def pattern_lengths(pattern: str, min_length: int, max_length: int | None) -> PatternLengths:
    """The length bounds of a string of ``pattern`` (one per pattern and bounds: its walks are cached)."""
    return PatternLengths(string_matcher(pattern), min_length, max_length)
