"""Review 46 of the GBNF matcher (edgesdk/runtime/grammar.py) against a brute-force matcher: a text, or a text that
ends inside a UTF-8 sequence, is kept iff some parse of the grammar can go on from it (llama.cpp's
``llama_grammar_match_partial_char`` in src/llama-grammar.cpp keeps a partial code point while some code point
it can become is one the class takes), and a token is allowed iff its bytes keep a parse alive."""

from __future__ import annotations

import itertools
import random

import pytest

from edgesdk.runtime.gbnf import CHAR, GrammarError, parse_grammar
from edgesdk.runtime.grammar import GrammarConstraint, GrammarMatcher

RAN_OUT = -1  # the text ended where the parse still had a character to read


def _brute(grammar, points: list[int]) -> str:
    """"complete", "prefix" or "refused": the rules' end positions from each position, to a fixpoint (so rules
    that match the empty text through each other end), with RAN_OUT where a character terminal met the end."""
    size = len(points)
    ends = [[set() for _ in range(size + 1)] for _ in grammar.rules]

    def sequence(alternative, start: int) -> set[int]:
        current, out = {start}, set()
        for element in alternative:
            following = set()
            for at in current:
                if element[0] == CHAR:
                    if at == size:
                        out.add(RAN_OUT)
                    elif any(low <= points[at] <= high for low, high in element[1]) != element[2]:
                        following.add(at + 1)
                else:
                    for end in ends[element[1]][at]:
                        (out if end == RAN_OUT else following).add(end)
            current = following
        return out | current

    changed = True
    while changed:
        changed = False
        for rule, alternatives in enumerate(grammar.rules):
            for start in range(size + 1):
                found = set().union(*(sequence(grammar.alternatives[a], start) for a in alternatives))
                if not found <= ends[rule][start]:
                    ends[rule][start] |= found
                    changed = True
    result = ends[grammar.root][0]
    return "complete" if size in result else "prefix" if RAN_OUT in result else "refused"


def _code_points_starting(data: bytes) -> tuple[int, int]:
    """The lowest and highest code point (surrogates included) whose UTF-8 starts with the lead byte and
    continuation bytes ``data``."""
    length = 2 if data[0] < 0xE0 else 3 if data[0] < 0xF0 else 4
    value = data[0] & (0x7F >> length)
    for byte in data[1:]:
        value = (value << 6) | (byte & 0x3F)
    shift = 6 * (length - len(data))
    lowest, highest = {2: (0x80, 0x7FF), 3: (0x800, 0xFFFF), 4: (0x10000, 0x10FFFF)}[length]
    return max(value << shift, lowest), min((value << shift) | ((1 << shift) - 1), highest)


def _brute_bytes(grammar, data: bytes) -> str:
    """As :func:`_brute` for any bytes: those that are not UTF-8 are refused, and those that end inside a UTF-8
    sequence are kept iff some code point they can still become (never a surrogate) keeps the parse alive; the
    classes change their verdict only at their bounds, so those bounds inside the span are the code points to
    try."""
    for keep in range(len(data), max(len(data) - 4, -1), -1):  # the longest head that is whole UTF-8
        try:
            head = data[:keep].decode()
        except UnicodeDecodeError:
            continue
        tail = data[keep:]
        break
    else:
        return "refused"
    if not tail:
        return _brute(grammar, [ord(c) for c in head])
    if not 0xC2 <= tail[0] <= 0xF4 or any(not 0x80 <= byte <= 0xBF for byte in tail[1:]):
        return "refused"
    low, high = _code_points_starting(tail)
    tries = {low, high, 0xD7FF, 0xE000}
    for alternative in grammar.alternatives:
        for element in alternative:
            if element[0] == CHAR:
                for a, b in element[1]:
                    tries |= {a - 1, a, b, b + 1}
    tries = [p for p in tries if low <= p <= high and not 0xD800 <= p <= 0xDFFF]
    alive = any(_brute(grammar, [ord(c) for c in head] + [p]) != "refused" for p in tries)
    return "prefix" if alive else "refused"


def _verdict(matcher: GrammarMatcher, data: bytes) -> str:
    state = matcher.feed(matcher.start(), data)
    return "refused" if state is None else "complete" if matcher.accepts(state) else "prefix"


# ------------------------------------------------------------------ a lead byte no code point can follow

@pytest.mark.parametrize("source", [r"root ::= [\uD800-\uF8FF]", r"root ::= [^\x00-\uD7FF]", r"root ::= [\uDA00\uE000]",
                                    r'root ::= "a" [\uDB00-\uE000]'])
def test_a_lead_byte_whose_only_code_points_in_the_class_are_surrogates_is_refused(source):
    """After the lead byte ED a valid UTF-8 sequence is U+D000..U+D7FF (ED A0..BF would be a surrogate, which
    RFC 3629 refuses and so does this matcher). The matcher kept ED where the class took only surrogates of
    D000..DFFF: a token ending in ED was allowed, and then no byte at all could follow it."""
    grammar = parse_grammar(source)
    matcher = GrammarMatcher(grammar)
    prefix = b"a" if '"a"' in source else b""
    assert _brute_bytes(grammar, prefix + b"\xed") == "refused"
    assert _verdict(matcher, prefix + b"\xed") == "refused"
    assert _verdict(matcher, prefix + "\ue000".encode()[:1]) == ("prefix" if "E000" in source or "^" in source
                                                                 or "F8FF" in source else "refused")


def test_a_token_the_grammar_allows_always_leaves_a_token_or_the_end_to_take():
    """A token is allowed iff its bytes keep a parse alive: with a byte-level tokenizer (its token for the byte
    ED alone) the grammar below let ED be taken, after which the constraint allowed nothing, not even the end."""
    from edgesdk.runtime.json_mode import token_bytes_table
    from tests._utils.tiny import tiny_tokenizer

    tokenizer = tiny_tokenizer()
    table = token_bytes_table(tokenizer.backend_tokenizer, len(tokenizer))
    stops = {tokenizer.eos_token_id}
    grammar = parse_grammar(r"root ::= [^\x00-\uD7FF]")
    first = GrammarConstraint(table, grammar, stops)
    allowed = [token for token in range(len(table)) if first.allows(token)]
    assert allowed
    assert table.index(b"\xed") not in allowed
    for token in allowed:
        after = GrammarConstraint(table, grammar, stops)
        after.advance(token)
        assert after.accepts or any(after.allows(other) for other in range(len(table))), table[token]


# ------------------------------------------------------------------------- random grammars, brute force

ALPHABET = ["a", "b", "é", "\ud7ff", "\ue000", "東", "🙂"]
CLASS_PARTS = ["a-c", "é", "\\u00e0-\\u00ff", "\\uD000-\\uD7FF", "\\uD800-\\uF8FF", "\\uE000", "東", "\\U0001F600-\\U0001F64F"]


def _random_grammar(rng: random.Random) -> str:
    names = [f"r{index}" for index in range(rng.randint(1, 3))]

    def atom(depth: int) -> str:
        pick = rng.random()
        if pick < 0.3:
            return '"' + "".join(rng.choice(ALPHABET) for _ in range(rng.randint(1, 2))) + '"'
        if pick < 0.55:
            return "[" + "^" * (rng.random() < 0.4) + "".join(rng.sample(CLASS_PARTS, rng.randint(1, 3))) + "]"
        if pick < 0.6:
            return "."
        if pick < 0.75 and depth < 2:
            return "(" + " | ".join(sequence(depth + 1) for _ in range(rng.randint(1, 3))) + ")"
        return rng.choice(names)

    def symbol(depth: int) -> str:
        written, pick = atom(depth), rng.random()
        low = rng.randint(0, 2)
        return written + ("*" if pick < 0.15 else "+" if pick < 0.25 else "?" if pick < 0.35
                          else f"{{{low},{low + rng.randint(0, 2)}}}" if pick < 0.42 else "")

    def sequence(depth: int) -> str:
        return " ".join(symbol(depth) for _ in range(rng.randint(0 if depth else 1, 3))) or '""'

    rules = ["root ::= " + " | ".join(sequence(0) for _ in range(rng.randint(1, 3)))]
    rules += [f"{name} ::= " + " | ".join(sequence(0) for _ in range(rng.randint(1, 2))) for name in names]
    return "\n".join(rules)


def _grammars(count: int, seed: int):
    rng = random.Random(seed)
    made = 0
    while made < count:
        source = _random_grammar(rng)
        try:
            grammar = parse_grammar(source)
        except GrammarError:  # left recursion and the like: refused as llama.cpp refuses it
            continue
        made += 1
        yield source, grammar


def test_random_grammars_keep_a_text_or_a_cut_code_point_iff_a_brute_force_parse_goes_on():
    for source, grammar in _grammars(12, seed=46):
        matcher = GrammarMatcher(grammar)
        for length in range(3):
            for letters in itertools.product(ALPHABET[:5], repeat=length):
                text = "".join(letters).encode()
                assert _verdict(matcher, text) == _brute_bytes(grammar, text), (source, text)
                for last in ("é", "\ud7ff", "\ue000", "東", "🙂"):
                    for cut in range(1, len(last.encode())):
                        data = text + last.encode()[:cut]
                        assert (_verdict(matcher, data) != "refused") == (_brute_bytes(grammar, data) != "refused"), \
                            (source, data)


def test_random_grammars_allow_the_tokens_whose_bytes_a_brute_force_parse_goes_on_from():
    """With real tokenizers, asked one token at a time (the first questions) and through the vocabulary's trie
    (past them), along random walks of allowed tokens."""
    from edgesdk.runtime.json_mode import token_bytes_table
    from tests._utils.tiny import tiny_gemma_tokenizer, tiny_tokenizer

    rng = random.Random(7)
    tables = []
    for tokenizer in (tiny_tokenizer(), tiny_gemma_tokenizer()):
        tables.append((token_bytes_table(tokenizer.backend_tokenizer, len(tokenizer)), {tokenizer.eos_token_id}))
    for source, grammar in _grammars(6, seed=460):
        for table, stops in tables:
            constraint, taken = GrammarConstraint(table, grammar, stops), b""
            for _ in range(3):
                order = list(range(len(table)))
                rng.shuffle(order)
                verdicts = {data: _brute_bytes(grammar, taken + data) for data in set(table) if data}
                allowed = []
                for token in order:
                    # a token whose text starts with NUL is never taken under a grammar, as in llama.cpp
                    expected = (_brute_bytes(grammar, taken) == "complete" if token in stops
                                else bool(table[token]) and table[token][0] != 0 and verdicts[table[token]] != "refused")
                    assert constraint.allows(token) == expected, (source, taken, table[token])
                    if expected and token not in stops:
                        allowed.append(token)
                if not allowed:
                    break
                token = rng.choice(allowed)
                constraint.advance(token)
                taken += table[token]


# ------------------------------------------------------------------------------------ where an error is

@pytest.mark.parametrize("end", ["\n", "\r\n", "\r"])
def test_an_error_names_the_line_and_column_whatever_the_line_ends(end):
    """llama.cpp's parser ends a line at ``\\r\\n``, ``\\n`` or a lone ``\\r`` (``parse_space``, ``parse_rule``);
    a grammar written with lone ``\\r`` line ends parsed here, but its errors all named line 1 and a column
    counted from the top of the grammar."""
    source = end.join(['root ::= "a" x', "x ::= (", '  "b" |', "  y)", ""])
    with pytest.raises(GrammarError, match=r"line 4, column 3: the rule 'y' is used but never defined"):
        parse_grammar(source)
    with pytest.raises(GrammarError, match=r"line 3, column 10: unexpected '\)'"):
        parse_grammar(end.join(['root ::= "a"', "", 'x ::= "b")']))


# ------------------------------------------------------------------------------------ deeply nested groups

def test_groups_nested_past_the_limit_are_a_grammar_error_naming_where_not_a_recursion_error():
    """A group inside a group is read by a nested call; 500 levels ended in Python's RecursionError, which the
    server (it catches GrammarError) answered with a 500 and the CLI with a traceback. Up to the limit they are
    read and matched, past it refused where the limit is crossed."""
    from edgesdk.runtime.gbnf import MAX_GROUP_DEPTH

    deepest = "root ::= " + "(" * MAX_GROUP_DEPTH + '"a" | "b"' + ")" * MAX_GROUP_DEPTH
    matcher = GrammarMatcher(parse_grammar(deepest))
    assert _verdict(matcher, b"b") == "complete"
    for depth in (MAX_GROUP_DEPTH + 1, 5000):
        with pytest.raises(GrammarError, match=rf"line 1, column {10 + MAX_GROUP_DEPTH}: groups are nested more than "
                                               rf"{MAX_GROUP_DEPTH} deep in the rule 'root'"):
            parse_grammar("root ::= " + "(" * depth + '"a"' + ")" * depth)


# ------------------------------------------------------------------------------- ids past the tokenizer

def test_an_id_past_the_tokenizer_is_never_allowed_even_by_a_negated_token():
    """A model's output rows can outnumber its tokenizer's tokens (padding); such an id has no text, and llama.cpp's
    sampler (llama_grammar_apply_impl) refuses a token with an empty piece before any token terminal is tried.
    ``!<[5]>`` allowed one on the first questions (asked one by one) and refused it past them (the trie's walk):
    the answer depended on how many tokens the sampler had asked about before."""
    from edgesdk.runtime.json_mode import token_bytes_table
    from tests._utils.tiny import tiny_tokenizer

    tokenizer = tiny_tokenizer()
    table = token_bytes_table(tokenizer.backend_tokenizer, len(tokenizer))
    grammar = parse_grammar('root ::= !<[5]> "a"')
    padding = len(table) + 3
    first = GrammarConstraint(table, grammar, {tokenizer.eos_token_id})
    assert not first.allows(padding)
    with pytest.raises(ValueError, match=f"token {padding} does not continue the answer"):
        first.advance(padding)
    scanned = GrammarConstraint(table, grammar, {tokenizer.eos_token_id})
    for token in range(GrammarConstraint.SCAN_AFTER + 1):
        scanned.allows(token)
    assert not scanned.allows(padding)
    assert first.allows(7)
    assert scanned.allows(7)
    assert not first.allows(5)
    assert not scanned.allows(5)
