"""GBNF grammars: llama.cpp's grammar language, read into rules of terminals and rule references.

The language is the one ``grammars/README.md`` of llama.cpp describes, so a ``.gbnf`` file written
for ``llama-cli --grammar-file`` or llama-server's ``grammar`` field works here unchanged:

* ``name ::= alternatives``; names are ASCII letters, digits and ``-`` (llama.cpp's ``is_word_char``:
  no ``_``); ``root`` is the start.
* Terminals are Unicode code points: ``"literal"`` strings, ``[a-z0-9_]`` classes (``[^...]``
  negated; ``[^]``, which llama.cpp reads as no symbol at all, is refused), ``.`` for any code point,
  with the escapes ``\\n \\r \\t \\\\ \\" \\[ \\] \\-`` (llama.cpp's ``parse_char``; no ``\\/``),
  ``\\xHH``, ``\\uHHHH`` and ``\\UHHHHHHHH``. A UTF-16 surrogate (U+D800-U+DFFF) is no character UTF-8
  can write, so a string that holds one, or a class that takes nothing else, is refused: no answer could match it.
* ``|`` alternatives, ``( ... )`` groups (nested up to 256 deep), and the repetitions ``*``, ``+``, ``?``, ``{m}``,
  ``{m,}``, ``{m,n}`` after a symbol (a literal repeats whole; a maximum past 10,000 is read as none, ``{m,}``, as
  llama.cpp reads one past 2,000, and a minimum past 10,000 is refused, as llama.cpp refuses one past 2,000).
* Tokens: ``<[id]>`` matches the token with that id, ``<text>`` the one token whose text that is,
  and ``!<...>`` any one token but it.
* ``#`` starts a comment. A rule ends at the end of its line, except inside parentheses, after
  ``::=`` and after ``|``. A line break inside a string or a class is one of its characters, as
  llama.cpp reads it (a grammar sent in JSON with ``"\\n"`` unescaped holds one).

Like llama.cpp's parser, repetitions become generated rules (``x*`` is ``R ::= x R |``, ``x{2,4}``
is ``x x (x (x)?)?``), a repetition of something whose own repetitions made n rules is refused where n times its
count reaches 2000 (MAX_REPETITION_THRESHOLD: ``(("a"{0,9}){0,99}){0,99}``, whose stacks multiply), a rule defined
twice keeps its last definition, and left recursion is refused
as llama.cpp refuses it: a rule that can reach itself first in an alternative, or after only rules
with an empty alternative (``expr ::= expr "+" term``; ``x*`` with ``x ::= | "a"``). A rule that
comes back to itself through rules that match the empty text only through other rules (``("a"?)*``)
is taken, as llama.cpp takes it, where its matcher finishes expanding it, and refused where that
expansion never ends (``a ::= b a "x" | "y"`` with ``b ::= "z"?``).
"""

from __future__ import annotations

from dataclasses import dataclass

from edgesdk.errors import EdgeSDKError

MAX_CODE_POINT = 0x10FFFF
SURROGATES = (0xD800, 0xDFFF)  # UTF-16 halves, which no UTF-8 text holds (RFC 3629 section 3)
# counts {m,n} followed exactly (each unit becomes a rule): a minimum past this is refused, a maximum past it read as
# none, {m,}, as llama.cpp reads a maximum past its MAX_REPETITION_THRESHOLD (src/llama-grammar.cpp, parse_sequence,
# since ggml-org/llama.cpp#26613: schemas write a large maxLength for "no limit", as char{0,524288})
MAX_REPETITION = 10_000
MAX_REPETITION_THRESHOLD = 2000  # llama.cpp's (src/llama-grammar.cpp)
# symbols the repetitions of one grammar may write out in all: a repetition copies what it repeats,
# so a repetition of a repetition ("a"{1000}{1000}) multiplies (llama.cpp bounds the product too)
MAX_REPEATED_SYMBOLS = 1_000_000
# parentheses inside parentheses: the parser reads each level by two nested Python calls, so far past this a
# grammar (valid for llama.cpp, whose parser recurses in C++) ended in a RecursionError rather than a GrammarError
MAX_GROUP_DEPTH = 256
# llama.cpp's MAX_REPETITION_THRESHOLD (src/llama-grammar.cpp, handle_repetitions): a repetition of something that
# holds repetitions of its own is refused where the rules that something made, times the new repetition's count,
# reach it ("number of rules that are going to be repeated multiplied by the new repetition exceeds sane
# defaults"). Each optional count of a nested repetition is a stack the matcher follows at once, so nested ones
# multiply: ((("x"{0,99}){0,99}){0,99}) was taken here and the matcher ran on without end (99**3 stacks).
MAX_NESTED_REPETITION_RULES = MAX_REPETITION_THRESHOLD
ESCAPES = {"n": "\n", "r": "\r", "t": "\t", "\\": "\\", '"': '"', "[": "[", "]": "]", "-": "-"}
HEX_ESCAPES = {"x": 2, "u": 4, "U": 8}

# Elements of a compiled alternative (tuples, for speed in the matcher):
CHAR = "c"  # (CHAR, ((lo, hi), ...), negated): one code point in (or, negated, outside) the ranges
REF = "r"  # (REF, rule index); while parsing, (REF, rule index, where it is written)
TOKEN = "t"  # (TOKEN, token id or its text, negated): one whole token


class GrammarError(EdgeSDKError):
    """A GBNF grammar that cannot be read or used; the message names the line and column."""


@dataclass(frozen=True)
class Grammar:
    """Rules as lists of alternatives (indices into ``alternatives``); ``root`` is the start rule."""

    alternatives: tuple[tuple[tuple, ...], ...]  # each a sequence of elements
    rules: tuple[tuple[int, ...], ...]  # rule index -> its alternatives' indices
    names: tuple[str, ...]  # rule index -> the name written (generated rules: "name/3")
    root: int

    @property
    def uses_tokens(self) -> bool:
        return any(element[0] == TOKEN for alternative in self.alternatives for element in alternative)


def parse_grammar(source: str) -> Grammar:
    """Read a GBNF grammar; :class:`GrammarError` names what is wrong, where, and the fix."""
    if not isinstance(source, str):
        raise GrammarError(f"a grammar must be text, got {type(source).__name__}", "pass the GBNF source as a string")
    builder = _Builder(source)
    builder.parse()
    return builder.finish()


class _Builder:
    def __init__(self, source: str):
        self.src = source
        self.names: list[str] = []
        self.index: dict[str, int] = {}
        self.bodies: dict[int, list[list[tuple]]] = {}  # rule -> alternatives (element lists)
        self.first_use: dict[int, int] = {}  # rule -> position of its first reference (for errors)
        self.repeated = 0  # symbols the repetitions have written out so far
        self.spanning: int | None = None  # where the first string or class that runs over a line end starts
        self.depth = 0  # the groups open around the symbol read now
        self.made = 0  # the rules made so far for groups and repetitions

    # ----------------------------------------------------------------------------------- errors

    def where(self, pos: int) -> str:
        """The line and column of ``pos``, counting a line end as llama.cpp's parser reads one (``parse_space``
        and ``parse_rule``): ``\\r\\n``, ``\\n`` or a lone ``\\r``."""
        before = self.src[:pos]
        line = before.count("\n") + before.count("\r") - before.count("\r\n") + 1
        column = pos - (max(before.rfind("\n"), before.rfind("\r")) + 1) + 1
        return f"line {line}, column {column}"

    def fail(self, pos: int, problem: str, fix: str) -> GrammarError:
        shown = self.src[pos:pos + 20].replace("\r", "\n").split("\n")[0]
        near = f" (at {shown!r})" if shown else " (at the end)" if pos >= len(self.src) else " (at the end of the line)"
        if self.spanning is not None and self.spanning < pos:  # a quote or ] left out reads on past its line
            fix += (f"; the string or class at {self.where(self.spanning)} runs over the end of its line: if it "
                    "should end there, close it there")
        return GrammarError(f"grammar {self.where(pos)}: {problem}{near}", fix)

    # ---------------------------------------------------------------------------------- symbols

    def rule_id(self, name: str, pos: int | None = None) -> int:
        if name not in self.index:
            self.index[name] = len(self.names)
            self.names.append(name)
        rule = self.index[name]
        if pos is not None:
            self.first_use.setdefault(rule, pos)
        return rule

    def generated(self, base: str, body: list[list[tuple]]) -> int:
        rule = self.rule_id(f"{base}/{len(self.names)}")  # "/" is in no written name
        self.bodies[rule] = body
        self.made += 1
        return rule

    # ---------------------------------------------------------------------------------- parsing

    def space(self, pos: int, newline_ok: bool) -> int:
        src = self.src
        while pos < len(src):
            char = src[pos]
            if char in " \t" or (newline_ok and char in "\r\n"):
                pos += 1
            elif char == "#":
                while pos < len(src) and src[pos] not in "\r\n":
                    pos += 1
            else:
                break
        return pos

    def name(self, pos: int) -> tuple[str, int]:
        end = pos
        while end < len(self.src) and (self.src[end].isascii() and (self.src[end].isalnum() or self.src[end] == "-")):
            end += 1
        if self.src.startswith("_", end):  # llama.cpp's parse_name stops there and the rule fails to parse
            written = end
            while written < len(self.src) and self.src[written].isascii() and (self.src[written].isalnum()
                                                                               or self.src[written] in "-_"):
                written += 1
            name = self.src[pos:written]
            raise self.fail(end, f"the rule name {name!r} has a '_'; rule names are letters, digits and '-' "
                            "(llama.cpp refuses the grammar too)", f"write it {name.replace('_', '-')!r}")
        if end == pos:
            raise self.fail(pos, "expected a rule name (letters, digits and '-')",
                            "start each rule with its name, as in: root ::= \"yes\" | \"no\"; a rule goes on over "
                            "the next line only inside parentheses or after a '|' that ends the line")
        return self.src[pos:end], end

    def parse(self) -> None:
        pos = self.space(0, True)
        while pos < len(self.src):
            name, pos = self.name(pos)
            pos = self.space(pos, False)
            if not self.src.startswith("::=", pos):
                raise self.fail(pos, f"expected '::=' after the rule name {name!r}",
                                f"write the rule as: {name} ::= ...")
            pos = self.space(pos + 3, True)
            rule = self.rule_id(name)
            alternatives, pos = self.alternatives(pos, name, nested=False)
            self.bodies[rule] = alternatives  # a later definition replaces an earlier one, as in llama.cpp
            if pos < len(self.src) and self.src[pos] not in "\r\n":
                raise self.fail(pos, f"unexpected {self.src[pos]!r} in the rule {name!r}",
                                "end the rule at the end of its line; a ')' needs its '(' and a '|' "
                                "alternatives on both sides")
            pos = self.space(pos, True)

    def alternatives(self, pos: int, name: str, nested: bool) -> tuple[list[list[tuple]], int]:
        sequence, pos = self.sequence(pos, name, nested, after="(" if nested else "::=")
        alternatives = [sequence]
        while pos < len(self.src) and self.src[pos] == "|":
            pos = self.space(pos + 1, True)
            sequence, pos = self.sequence(pos, name, nested, after="|")
            alternatives.append(sequence)
        return alternatives, pos

    def sequence(self, pos: int, name: str, nested: bool, after: str) -> tuple[list[tuple], int]:
        """The elements of one alternative of the rule ``name`` and the position after them; the alternative comes
        ``after`` the rule's ``::=``, a group's ``(`` or a ``|``."""
        src = self.src
        elements: list[tuple] = []
        last: int | None = None  # where the last symbol's elements start (what a repetition repeats)
        rules = 1  # llama.cpp's n_prev_rules: the rules the last symbol's group and repetitions made (at least 1)
        while pos < len(src):
            char = src[pos]
            start = len(elements)
            made = self.made
            if char == '"':
                pos = self.literal(pos + 1, elements)
            elif char == "[":
                pos = self.char_class(pos + 1, elements)
            elif char == ".":
                elements.append((CHAR, ((0, MAX_CODE_POINT),), False))
                pos += 1
            elif char == "<" or (char == "!" and src.startswith("!<", pos)):
                pos = self.token(pos, elements)
            elif char == "(":
                group_at = pos
                if self.depth >= MAX_GROUP_DEPTH:
                    raise self.fail(pos, f"groups are nested more than {MAX_GROUP_DEPTH} deep in the rule {name!r}",
                                    "write an inner group as a rule of its own (inner ::= ...) and use its name "
                                    "where the group was")
                self.depth += 1
                body, pos = self.alternatives(self.space(pos + 1, True), name, nested=True)
                self.depth -= 1
                if pos >= len(src) or src[pos] != ")":
                    raise self.fail(pos, "expected ')' to close the group", "close every '(' with a ')'")
                elements.append((REF, self.generated(name, body), group_at))
                pos += 1
                rules = self.made - made  # the group's rule and those made inside it
            elif char in "*+?{":
                if last is None:
                    raise self.fail(pos, f"{char!r} repeats nothing", "put the repetition after a symbol, as in [0-9]+")
                if last == len(elements):  # llama.cpp's handle_repetitions: "expecting preceding item to */+/?/{"
                    raise self.fail(pos, f"{char!r} repeats a symbol that writes nothing (the empty string \"\" or "
                                    "a repetition {0}), which llama.cpp refuses",
                                    "drop the symbol that writes nothing and its repetition")
                pos, rules = self.repetition(pos, name, elements, last, rules, nested)
                start = last  # a second repetition repeats the repeated symbol whole
            elif char.isascii() and (char.isalnum() or char in "-_"):
                reference, end = self.name(pos)
                if self.src.startswith("::=", self.space(end, False)):
                    raise self.fail(pos, f"the rule {reference!r} starts before the previous rule ended",
                                    _unended_rule_fix(name, nested, after))
                elements.append((REF, self.rule_id(reference, pos), pos))
                pos = end
            elif char in "|)\r\n":  # the end of an alternative, a group or the rule
                break
            else:
                raise self.fail(pos, f"unexpected {char!r} in the rule {name!r}", _unexpected_fix(char))
            if char not in "(*+?{":
                rules = 1
            last = start
            pos = self.space(pos, nested)
        return elements, pos

    def escaped(self, pos: int) -> tuple[str, int]:
        """The character at ``pos`` (just after a backslash) and the position after the escape."""
        if pos >= len(self.src):
            raise self.fail(pos - 1, "a backslash ends the grammar", "write \\\\ for a backslash")
        char = self.src[pos]
        if char in HEX_ESCAPES:
            digits = HEX_ESCAPES[char]
            text = self.src[pos + 1:pos + 1 + digits]
            if len(text) != digits or any(c not in "0123456789abcdefABCDEF" for c in text):
                raise self.fail(pos - 1, f"\\{char} needs {digits} hexadecimal digits",
                                f"write it as \\{char}{'0' * (digits - 1)}A")
            value = int(text, 16)
            if value > MAX_CODE_POINT:
                raise self.fail(pos - 1, f"\\{char}{text} is past the last Unicode code point U+10FFFF",
                                "use a code point up to \\U0010FFFF")
            return chr(value), pos + 1 + digits
        if char in ESCAPES:
            return ESCAPES[char], pos + 1
        raise self.fail(pos - 1, f"unknown escape \\{char}",
                        "the escapes are \\n \\r \\t \\\\ \\\" \\[ \\] \\- \\xHH \\uHHHH \\UHHHHHHHH")

    def literal(self, pos: int, elements: list[tuple]) -> int:
        start = pos - 1
        while True:
            if pos >= len(self.src):
                runs = " (it runs over the end of its line to the end of the grammar)" if self.spanning == start else ""
                raise self.fail(start, f"the string is not closed{runs}", 'end the string with "')
            char = self.src[pos]
            if char == '"':
                return pos + 1
            if char in "\r\n" and self.spanning is None:
                self.spanning = start
            at = pos
            if char == "\\":
                char, pos = self.escaped(pos + 1)
            else:
                pos += 1
            if SURROGATES[0] <= ord(char) <= SURROGATES[1]:
                raise self.fail(at, f"the string holds U+{ord(char):04X}, a UTF-16 surrogate, which no UTF-8 text "
                                "holds: no answer can ever write it, and decoding would stop there",
                                "write the character's own code point (\\U0001F600, not its surrogate pair "
                                "\\uD83D\\uDE00)")
            elements.append((CHAR, ((ord(char), ord(char)),), False))

    def class_char(self, pos: int, start: int) -> tuple[int, int]:
        if pos >= len(self.src):
            runs = " (it runs over the end of its line to the end of the grammar)" if self.spanning == start else ""
            raise self.fail(start, f"the character class is not closed{runs}", "end the class with ]")
        if self.src[pos] in "\r\n" and self.spanning is None:
            self.spanning = start
        if self.src[pos] == "\\":
            char, pos = self.escaped(pos + 1)
            return ord(char), pos
        return ord(self.src[pos]), pos + 1

    def char_class(self, pos: int, elements: list[tuple]) -> int:
        start = pos - 1
        negated = self.src.startswith("^", pos)
        pos += negated
        ranges: list[tuple[int, int]] = []
        while pos >= len(self.src) or self.src[pos] != "]":
            low, pos = self.class_char(pos, start)
            high = low
            if self.src.startswith("-", pos) and not self.src.startswith("-]", pos):
                high, pos = self.class_char(pos + 1, start)
                if high < low:
                    raise self.fail(start, f"the range {chr(low)!r}-{chr(high)!r} runs backwards",
                                    f"write it as {class_char_text(high)}-{class_char_text(low)}")
            ranges.append((low, high))
        if not ranges and not negated:
            raise self.fail(start, "the character class [] matches nothing", "list at least one character in it")
        if not ranges:  # llama.cpp's parser writes no element for it: the grammar reads on as if it were not there
            raise self.fail(start, "the character class [^] lists nothing to leave out (llama.cpp reads it as "
                            "nothing at all, not as one character)", "write . for any one character, or drop it")
        ranges = merge_ranges(ranges)
        if not _writable(ranges, negated):
            raise self.fail(start, "the character class takes no character UTF-8 can write (none, or only the "
                            "UTF-16 surrogates U+D800-U+DFFF): no answer can ever match it, and decoding would stop "
                            "there", "list characters outside U+D800-U+DFFF, which are no characters (. is any one "
                            "character)")
        elements.append((CHAR, tuple(ranges), negated))
        return pos + 1

    def token(self, pos: int, elements: list[tuple]) -> int:
        start = pos
        negated = self.src[pos] == "!"
        pos += 1 + negated
        end = self.src.find(">", pos)
        newline = min((i for i in (self.src.find("\n", pos), self.src.find("\r", pos)) if i >= 0), default=-1)
        if end < 0 or (0 <= newline < end) or end == pos:
            raise self.fail(start, "a token is written <[id]> or <text>", "close it with '>' on the same line")
        inner = self.src[pos:end]
        if inner.startswith("["):  # llama.cpp's parse_token: '<[' starts an id, which ']>' must end
            if not inner.endswith("]") or not whole_number(inner[1:-1]):
                raise self.fail(start, f"the token id in {self.src[start:end + 1]!r} is not a whole number between "
                                "'<[' and ']>' ('<[' starts a token id; llama.cpp refuses the grammar too)",
                                "write the id with digits only between '<[' and ']>', as in <[1000]>")
            elements.append((TOKEN, int(inner[1:-1]), negated))
        else:  # the token's text is written with its angle brackets, as llama.cpp reads it
            elements.append((TOKEN, f"<{inner}>", negated))
        return end + 1

    def repetition(self, pos: int, name: str, elements: list[tuple], last: int, rules: int,
                   nested: bool) -> tuple[int, int]:
        """Write the repetition at ``pos`` of ``elements[last:]``, a symbol whose group and repetitions made ``rules``
        rules: the position after it, and the rules the repeated symbol now stands for (llama.cpp's
        ``n_prev_rules``)."""
        start = pos
        unit = elements[last:]
        del elements[last:]
        char = self.src[pos]
        if char == "{":
            low, high, pos = self.bounds(pos, nested)
        else:
            low, high = {"*": (0, None), "+": (1, None), "?": (0, 1)}[char]
            pos += 1
        self.repeated += len(unit) * (low + (1 if high is None else high - low))
        if self.repeated > MAX_REPEATED_SYMBOLS:
            raise self.fail(start, f"the repetitions write out {self.repeated:,} symbols, past {MAX_REPEATED_SYMBOLS:,} "
                            "(a repetition copies what it repeats, so a repetition of a repetition multiplies)",
                            'put the inner repetition in parentheses, ("a"{100}){100} rather than "a"{100}{100}, '
                            "so it is written once, or use * or + for long runs")
        # llama.cpp's count (handle_repetitions): the largest count, else the smallest, else 1 (*, +, ?, {0})
        count = high if high else low or 1
        if rules > 1 and rules * count >= MAX_NESTED_REPETITION_RULES:  # one level alone keeps MAX_REPETITION
            written = self.src[start:pos]
            raise self.fail(start, f"the repetition {written} repeats something whose own repetitions made "
                            f"{rules:,} rules: {rules:,} x {count:,} = {rules * count:,}, past "
                            f"{MAX_NESTED_REPETITION_RULES:,}, which llama.cpp refuses (MAX_REPETITION_THRESHOLD: "
                            "nested optional repetitions multiply the stacks its matcher follows)",
                            "lower the counts of the nested repetitions, or use * or + for the inner or the outer "
                            "one, which make one rule whatever the count")
        elements.extend(unit * low)
        if high is None:  # R ::= unit R |
            rule = self.generated(name, [])
            self.bodies[rule] = [[*unit, (REF, rule, start)], []]
            elements.append((REF, rule, start))
        elif high > low:  # (unit (unit ...)?)? nested, so each count has one parse
            rule = None
            for _ in range(high - low):
                tail = [*unit] if rule is None else [*unit, (REF, rule, start)]
                rule = self.generated(name, [tail, []])
            elements.append((REF, rule, start))
        return pos, rules * count

    def bounds(self, pos: int, nested: bool) -> tuple[int, int | None, int]:
        """The counts of the ``{m}``, ``{m,}`` or ``{m,n}`` at ``pos`` and the position after its ``}``, read as
        llama.cpp's ``parse_sequence`` reads them: spaces and comments may come around the numbers and the comma, a
        line break only inside parentheses (elsewhere it ends the rule), and ``m`` is never left out."""
        start = pos
        fix = ("write {m}, {m,} or {m,n} with whole numbers m <= n ({0,n} for at most n); outside parentheses, "
               "on one line")
        low, pos = self.count(self.space(pos + 1, nested), start, fix)
        pos = self.space(pos, nested)
        if self.src.startswith("}", pos):
            high: int | None = low
        elif self.src.startswith(",", pos):
            pos = self.space(pos + 1, nested)
            high = None
            if pos < len(self.src) and whole_number(self.src[pos]):
                high, pos = self.count(pos, start, fix)
                pos = self.space(pos, nested)
            if not self.src.startswith("}", pos):
                raise self.fail(start, "a repetition count is not {m}, {m,} or {m,n}: expected '}' after its last "
                                "number", fix)
        else:
            raise self.fail(start, "a repetition count is not {m}, {m,} or {m,n}: expected ',' or '}' after its "
                            "first number", fix)
        if high is not None and high < low:
            raise self.fail(start, f"the repetition {{{low},{high}}} has its maximum below its minimum", fix)
        if low > MAX_REPETITION:
            raise self.fail(start, f"the repetition {self.src[start:pos + 1]} repeats at least {low} times, past the "
                            f"{MAX_REPETITION:,} followed here (llama.cpp refuses a minimum past its "
                            f"MAX_REPETITION_THRESHOLD, {MAX_REPETITION_THRESHOLD:,})",
                            'use + for a long run, or repeat a group of at most 1,999, as ("a"{1000}){20} for '
                            '"a"{20000}, which llama.cpp takes too')
        if high is not None and high > MAX_REPETITION:  # llama.cpp reads any maximum past its threshold so
            high = None
        return low, high, pos + 1

    def count(self, pos: int, start: int, fix: str) -> tuple[int, int]:
        """The whole number of ASCII digits at ``pos`` (llama.cpp's ``parse_int``) in the repetition count at
        ``start``, and the position after it."""
        end = pos
        while end < len(self.src) and whole_number(self.src[end]):
            end += 1
        if end == pos:
            raise self.fail(start, "a repetition count is not {m}, {m,} or {m,n}: expected a whole number "
                            "(llama.cpp refuses the grammar too)", fix)
        return int(self.src[pos:end]), end

    # ------------------------------------------------------------------------------------ finish

    def finish(self) -> Grammar:
        for rule, pos in sorted(self.first_use.items(), key=lambda item: item[1]):
            if rule not in self.bodies:
                raise self.fail(pos, f"the rule {self.names[rule]!r} is used but never defined",
                                f"define it: {self.names[rule]} ::= ...")
        if "root" not in self.index or self.index["root"] not in self.bodies:
            raise GrammarError("the grammar has no root rule", "name the rule the whole answer follows 'root': "
                               "root ::= ...")
        self.refuse_endless_expansion()
        alternatives: list[tuple[tuple, ...]] = []
        rules: list[tuple[int, ...]] = []
        for rule in range(len(self.names)):
            indices = []
            for body in self.bodies[rule]:
                indices.append(len(alternatives))
                # a reference keeps where it is written (its third item) only for the errors here
                alternatives.append(tuple(element[:2] if element[0] == REF else element for element in body))
            rules.append(tuple(indices))
        return Grammar(tuple(alternatives), tuple(rules), tuple(self.names), self.index["root"])

    # ------------------------------------------------------------------------- left recursion

    def refuse_endless_expansion(self) -> None:
        """Refuse what llama.cpp refuses as left recursion, and what its parser takes but its matcher
        never finishes expanding.

        llama.cpp's ``llama_grammar_detect_left_recursion`` (src/llama-grammar.cpp) counts as matching
        nothing only a rule with an empty alternative, and refuses a rule that can reach itself through
        references each first in its alternative or after such rules only: ``x*`` with
        ``x ::= | "a"`` is refused, ``("a"?)*`` is not (its group matches the empty text, but through
        the rule ``"a"?`` makes, not by an empty alternative of its own).

        Its matcher, ``llama_grammar_advance_stack``, expands a stack until a terminal is on top and
        skips a stack it has seen before in that expansion. A rule that comes back to itself without
        reading, through rules that match the empty text, is so expanded once where each reference on
        the way back is the last of its alternative (the next round gives the same stack), as in
        ``("a"?)*``; where something follows one of them, each round leaves it on the stack once more,
        the stacks never repeat, and llama.cpp runs out of memory. Such a rule is refused where the
        root can reach it (llama.cpp never expands a rule it cannot)."""
        rules = range(len(self.names))
        with_empty = {rule for rule in rules if any(not alternative for alternative in self.bodies[rule])}
        graph = self.leading(with_empty)
        component = _components(graph)
        for rule in rules:
            for target, pos, _ in graph[rule]:
                if component[target] == component[rule]:
                    raise self.left_recursion(rule, pos)
        graph = self.leading(self.nullable())
        component = _components(graph)
        for rule in sorted(self.reachable()):
            for target, pos, more in graph[rule]:
                if more and component[target] == component[rule]:
                    raise self.endless_expansion(rule, pos)

    def leading(self, empty: set[int]) -> list[list[tuple[int, int, bool]]]:
        """For each rule, the references that can come first in one of its alternatives (after only
        references to rules in ``empty``): the rule referenced, where, and whether more follows it."""
        graph = []
        for rule in range(len(self.names)):
            edges = []
            for alternative in self.bodies[rule]:
                for at, element in enumerate(alternative):
                    if element[0] != REF:
                        break
                    edges.append((element[1], element[2], at + 1 < len(alternative)))
                    if element[1] not in empty:
                        break
            graph.append(edges)
        return graph

    def nullable(self) -> set[int]:
        """Rules that can match the empty text, by an empty alternative or through other rules."""
        nullable: set[int] = set()
        pending: list[int] = []
        waiting: dict[int, list[list[int]]] = {}  # rule -> [references left, rule] of alternatives that use it
        for rule in range(len(self.names)):
            for alternative in self.bodies[rule]:
                if not alternative:
                    pending.append(rule)
                elif all(element[0] == REF for element in alternative):
                    counter = [len(alternative), rule]
                    for element in alternative:
                        waiting.setdefault(element[1], []).append(counter)
        while pending:
            rule = pending.pop()
            if rule in nullable:
                continue
            nullable.add(rule)
            for counter in waiting.get(rule, ()):
                counter[0] -= 1
                if counter[0] == 0:
                    pending.append(counter[1])
        return nullable

    def reachable(self) -> set[int]:
        root = self.index["root"]
        seen, pending = {root}, [root]
        while pending:
            for alternative in self.bodies[pending.pop()]:
                for element in alternative:
                    if element[0] == REF and element[1] not in seen:
                        seen.add(element[1])
                        pending.append(element[1])
        return seen

    def left_recursion(self, rule: int, pos: int) -> GrammarError:
        name = self.names[rule]
        if "/" in name:  # a rule made for a repetition: x* is R ::= x R |, left-recursive where x has an empty alternative
            return self.fail(pos, f"in the grammar's rule {name.split('/')[0]!r}, this repetition repeats something "
                             "with an empty alternative (as in (\"a\" | )* or x* with x ::= | \"a\"), which "
                             "llama.cpp refuses as left recursion: it could repeat forever without reading a character",
                             "make the repeated part read at least one character: (\"a\")* rather than "
                             "(\"a\" | )*, and x* with x ::= \"a\"")
        return self.fail(pos, f"the grammar's rule {name!r} is left-recursive: it can reach itself here before "
                         "reading a character (first in an alternative, or after only rules with an empty "
                         "alternative), which llama.cpp refuses",
                         f"rewrite it with a repetition: {name} ::= head (\"+\" head)* instead of "
                         f"{name} ::= {name} \"+\" head | head")

    def endless_expansion(self, rule: int, pos: int) -> GrammarError:
        name = self.names[rule].split("/")[0]
        return self.fail(pos, f"the grammar's rule {name!r} can come back to itself here without reading a "
                         "character (the rules before this point can match the empty text) and has more to read "
                         "after it, so expanding it never ends: each round leaves that rest to read once more "
                         "(llama.cpp's parser takes the grammar, as none of those rules has an empty alternative, "
                         "and its matcher runs out of memory on it)",
                         "make the rules before this point read at least one character, and write the case where "
                         "they read nothing without coming back: a ::= b a \"x\" | \"y\" with b ::= \"z\"? "
                         "is a ::= \"z\" a \"x\" | \"y\" \"x\"*")


def _unended_rule_fix(name: str, nested: bool, after: str) -> str:
    """How to end the rule ``name`` that went on into the next rule's line: inside parentheses a line break is space,
    and outside them the ``::=`` or ``|`` (``after``) that ends a line goes on to the next (so the next rule's name
    was read as a reference of this one)."""
    if nested:
        return f"end the previous rule, {name!r}, on its line: close its parentheses"
    if after == "::=":
        return (f"end the previous rule, {name!r}, on its line: write what it matches after its '::=' on the same "
                "line (\"\" for the empty text), as a '::=' that ends a line goes on to the next")
    return (f"end the previous rule, {name!r}, on its line: end none of its lines with a '|', which goes on to the "
            "next line (an empty alternative is written \"\")")


def _unexpected_fix(char: str) -> str:
    if char == "'":
        return "write strings in double quotes, as in: root ::= \"yes\" | \"no\""
    if char == "!":
        return "a negated token is written !<[id]> or !<text>"
    if char == "\\":
        written = "\\\\"
    elif char.isprintable():
        written = char
    else:
        written = _hex_escape(ord(char))
    return ("a rule is a sequence of \"strings\", [classes], ., rule names, (groups) and <tokens>, each "
            f"with * + ? or {{m,n}} after it; to match {char!r}, write it in a string: \"{written}\"")


def class_char_text(code_point: int) -> str:
    """``code_point`` as written inside a character class: escaped where it would be read otherwise (``\\ ] [``;
    ``-``, which between two characters makes a range, and ``^``, which first in a class negates it, as hex escapes:
    every llama.cpp version reads ``\\x2D``, older ones refuse ``\\-`` (the copy Ollama vendors, for one), and
    none reads ``\\^``) or is not printable."""
    char = chr(code_point)
    written = {"\n": "\\n", "\r": "\\r", "\t": "\\t", "-": "\\x2D", "^": "\\x5E"}.get(char)
    if written is not None:
        return written
    if char in "\\[]":
        return "\\" + char
    if char.isprintable():
        return char
    return _hex_escape(code_point)


def _hex_escape(code_point: int) -> str:
    """``code_point`` as the GBNF escape with exactly its digits: ``\\xHH``, ``\\uHHHH``, and past U+FFFF
    ``\\UHHHHHHHH`` (``\\u`` reads four digits, so ``\\uE0001`` is U+E000 and a ``1``)."""
    return f"\\x{code_point:02X}" if code_point < 0x100 else f"\\u{code_point:04X}" if code_point < 0x10000 \
        else f"\\U{code_point:08X}"


def whole_number(text: str) -> bool:
    """ASCII digits only: str.isdigit also takes digits int() refuses, such as superscripts ('²')."""
    return text.isascii() and text.isdigit()


def merge_ranges(ranges: list[tuple[int, int]]) -> list[tuple[int, int]]:
    merged: list[tuple[int, int]] = []
    for low, high in sorted(ranges):
        if merged and low <= merged[-1][1] + 1:
            merged[-1] = (merged[-1][0], max(merged[-1][1], high))
        else:
            merged.append((low, high))
    return merged


def _writable(ranges: list[tuple[int, int]], negated: bool) -> bool:
    """A class of the merged ``ranges`` (``negated``: the code points outside them) takes a code point that is not a
    UTF-16 surrogate, so some UTF-8 text matches it."""
    if negated:
        return merge_ranges([*ranges, SURROGATES]) != [(0, MAX_CODE_POINT)]
    return any(low < SURROGATES[0] or high > SURROGATES[1] for low, high in ranges)


def _components(graph: list[list[tuple]]) -> list[int]:
    """The strongly connected components of a graph of rules (Tarjan's, without recursion, so a long
    chain of rules is no deep Python recursion): rule -> its component's number."""
    count = len(graph)
    order, low, component = [-1] * count, [0] * count, [-1] * count
    on_stack = [False] * count
    stack: list[int] = []
    visited = found = 0
    for start in range(count):
        if order[start] >= 0:
            continue
        order[start] = low[start] = visited
        visited += 1
        stack.append(start)
        on_stack[start] = True
        work = [(start, 0)]
        while work:
            node, edge = work[-1]
            if edge < len(graph[node]):
                work[-1] = (node, edge + 1)
                target = graph[node][edge][0]
                if order[target] < 0:
                    order[target] = low[target] = visited
                    visited += 1
                    stack.append(target)
                    on_stack[target] = True
                    work.append((target, 0))
                elif on_stack[target]:
                    low[node] = min(low[node], order[target])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == order[node]:
                while True:
                    member = stack.pop()
                    on_stack[member] = False
                    component[member] = found
                    if member == node:
                        break
                found += 1
    return component
