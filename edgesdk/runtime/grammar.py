"""A GBNF grammar as a token constraint: which tokens may come next, and when the answer may end.

The matcher is llama.cpp's (``src/llama-grammar.cpp``): a set of pushdown stacks, each a path
through the rules whose top is the next terminal to read. A code point pops every stack whose top
accepts it and expands rule references until terminals are on top again; the set is deduplicated,
so an ambiguous grammar keeps one stack per distinct position. Tokens are read byte by byte: a
token that ends inside a UTF-8 sequence leaves a partial code point, kept only while some stack
could read a code point that starts with those bytes (overlong forms and surrogates never can).

As in llama.cpp, the end-of-text tokens are allowed only where the grammar accepts (a stack is
empty), and once no stack can read anything more the answer is complete. Token terminals
(``<[id]>``, ``<text>``, ``!<...>``) match a whole token; a special token (``<|im_end|>``) is taken
only through one of them.
"""

from __future__ import annotations

from collections.abc import Callable

from edgesdk.runtime.gbnf import CHAR, REF, SURROGATES, TOKEN, Grammar, GrammarError
from edgesdk.runtime.vocab_trie import tokens_accepted

# UTF-8 lead bytes: (continuation bytes, value bits of the lead, lowest and highest code point of that length)
_LEADS = {**{byte: (1, byte & 0x1F, 0x80, 0x7FF) for byte in range(0xC2, 0xE0)},
          **{byte: (2, byte & 0x0F, 0x800, 0xFFFF) for byte in range(0xE0, 0xF0)},
          **{byte: (3, byte & 0x07, 0x10000, 0x10FFFF) for byte in range(0xF0, 0xF5)}}
MAX_CACHED_STEPS = 200_000  # (state, byte) transitions remembered per constraint
# stacks one walk may visit: nested optional repetitions multiply them (r1 ::= r0{0,10}, r2 ::= r1{0,10}, ... through
# rule names, which gbnf's MAX_NESTED_REPETITION_RULES does not see, as llama.cpp's check does not: six levels were a
# million stacks and 20 s before the first token, seven a server held for minutes and gigabytes). A repetition of a
# rule that may match nothing, w{0,10000} (gbnf.MAX_REPETITION), visits about 30,000
MAX_WALK_STACKS = 100_000


def _char_matches(element: tuple, code_point: int) -> bool:
    inside = any(low <= code_point <= high for low, high in element[1])
    return inside != element[2]


def _char_may_match(element: tuple, low: int, high: int) -> bool:
    """Some code point in [low, high] matches the class."""
    if not element[2]:
        return any(a <= high and low <= b for a, b in element[1])
    point = low  # negated: look for a point the (merged, sorted) ranges leave out
    for a, b in element[1]:
        if b < point:
            continue
        if a > point:
            break
        point = b + 1
    return point <= high


class GrammarMatcher:
    """The stacks of a grammar; states are ``(frozenset of stacks, partial code point or None)``.

    A stack is a tuple of ``(alternative, position)`` pairs, its top last; the empty stack means the
    grammar has matched the whole text. A partial code point is ``(value so far, bytes to come,
    lowest, highest)``."""

    def __init__(self, grammar: Grammar, token_id_of: Callable[[str], int | None] | None = None):
        self.grammar = _resolved(grammar, token_id_of)
        self.alternatives = self.grammar.alternatives
        self._expanded: dict[tuple, frozenset] = {}
        self._steps: dict[tuple, tuple | None] = {}

    def start(self) -> tuple:
        stacks = set()
        for index in self.grammar.rules[self.grammar.root]:
            stacks |= self._expand(((index, 0),) if self.alternatives[index] else ())
        return frozenset(stacks), None

    def _expand(self, stack: tuple) -> frozenset:
        """The stacks ``stack`` stands for with a terminal (or nothing) on top (cached)."""
        cached = self._expanded.get(stack)
        if cached is not None:
            return cached
        result = self._walk((stack,), cached=True)
        if len(self._expanded) < MAX_CACHED_STEPS:
            self._expanded[stack] = result
        return result

    def _walk(self, starts, cached: bool) -> frozenset:
        """The stacks ``starts`` stand for with a terminal (or nothing) on top, found in one walk.

        Walked with a list of pending stacks and one set of those seen, as llama.cpp's
        ``llama_grammar_advance_stack`` does, so a long run of rules that may match nothing
        (``w w w ...`` with ``w ::= "x"?``, ``("x"?){0,3000}``) is not a Python recursion as deep as the
        run, and the stacks several starts share are walked once: after an ``x`` of ``"x"? "x"? ...``
        each of the n live stacks pops to a position from which the rest of the run is reachable, and
        one walk over the run costs n where a walk per stack cost n each. Cached expansions are used
        only by a walk from one stack: adding a cached set per start would cost its size again."""
        found: set = set()
        seen: set = set()
        pending = list(starts)
        while pending:
            current = pending.pop()
            if current in seen:
                continue
            seen.add(current)
            if len(seen) > MAX_WALK_STACKS:
                raise GrammarError(f"the grammar holds more than {MAX_WALK_STACKS:,} parses at once here (nested "
                                   "optional repetitions multiply them: each count of each level is one)",
                                   "lower the counts of the nested repetitions, or use * or + for the inner ones")
            known = self._expanded.get(current) if cached else None
            if known is not None:
                found |= known
                continue
            if not current:
                found.add(())
                continue
            index, position = current[-1]
            element = self.alternatives[index][position]
            if element[0] != REF:
                found.add(current)
                continue
            rest = current[:-1]
            if position + 1 < len(self.alternatives[index]):
                rest = (*rest, (index, position + 1))
            for alternative in self.grammar.rules[element[1]]:
                pending.append((*rest, (alternative, 0)) if self.alternatives[alternative] else rest)
        return frozenset(found)

    @staticmethod
    def _rest(stack: tuple, alternatives) -> tuple:
        """``stack`` with its top terminal read, before expansion."""
        index, position = stack[-1]
        rest = stack[:-1]
        if position + 1 < len(alternatives[index]):
            rest = (*rest, (index, position + 1))
        return rest

    def _popped(self, stack: tuple) -> frozenset:
        """``stack`` after its top terminal has been read."""
        return self._expand(self._rest(stack, self.alternatives))

    def _read(self, stacks: frozenset, code_point: int) -> frozenset:
        """The stacks after ``code_point``: those whose top takes it, popped and expanded in one walk."""
        rests = set()
        for stack in stacks:
            if stack:
                element = self.alternatives[stack[-1][0]][stack[-1][1]]
                if element[0] == CHAR and _char_matches(element, code_point):
                    rests.add(self._rest(stack, self.alternatives))
        if len(rests) <= 1:
            return self._expand(rests.pop()) if rests else frozenset()
        return self._walk(rests, cached=False)

    def step_byte(self, state: tuple, byte: int) -> tuple | None:
        """The state after one byte, or None where no stack can read it."""
        key = (state, byte)
        if key in self._steps:
            return self._steps[key]
        result = self._step_byte(state, byte)
        if len(self._steps) >= MAX_CACHED_STEPS:
            self._steps.clear()
        self._steps[key] = result
        return result

    def _step_byte(self, state: tuple, byte: int) -> tuple | None:
        stacks, partial = state
        if partial is None:
            if byte < 0x80:
                after = self._read(stacks, byte)
                return (after, None) if after else None
            if byte not in _LEADS:
                return None
            remaining, value, lowest, highest = _LEADS[byte]
        else:
            if not 0x80 <= byte <= 0xBF:
                return None
            value, remaining, lowest, highest = partial
            value, remaining = (value << 6) | (byte & 0x3F), remaining - 1
            if remaining == 0:
                if not lowest <= value <= highest or SURROGATES[0] <= value <= SURROGATES[1]:
                    return None
                after = self._read(stacks, value)
                return (after, None) if after else None
        shift = 6 * remaining
        low, high = max(value << shift, lowest), min((value << shift) | ((1 << shift) - 1), highest)
        # the code points the bytes so far can still become, less the surrogates UTF-8 never writes (RFC 3629
        # section 3): after the lead byte ED they are D000-DFFF, of which only D000-D7FF can be written
        spans = [(a, b) for a, b in ((low, min(high, SURROGATES[0] - 1)), (max(low, SURROGATES[1] + 1), high))
                 if a <= b]
        live = frozenset(stack for stack in stacks if stack and self._top(stack)[0] == CHAR
                         and any(_char_may_match(self._top(stack), a, b) for a, b in spans))
        return (live, (value, remaining, lowest, highest)) if live else None

    def _top(self, stack: tuple) -> tuple:
        return self.alternatives[stack[-1][0]][stack[-1][1]]

    def feed(self, state: tuple, data: bytes) -> tuple | None:
        for byte in data:
            state = self.step_byte(state, byte)
            if state is None:
                return None
        return state

    def step_token(self, state: tuple, token_id: int, data: bytes | None) -> tuple | None:
        """The state after a whole token: its bytes read by the character terminals, and the token
        by the token terminals on top of the stacks."""
        stacks, partial = state
        after = self.feed(state, data) if data else None
        if partial is not None:
            return after
        matched: set = set()
        for stack in stacks:
            if stack:
                element = self._top(stack)
                if element[0] == TOKEN and (element[1] == token_id) != element[2]:
                    matched |= self._popped(stack)
        if not matched:
            return after
        if after is not None:
            if after[1] is not None:  # a byte-level path stopped inside a code point; keep the whole tokens'
                return frozenset(matched), None
            matched |= after[0]
        return frozenset(matched), None

    def token_tops(self, state: tuple) -> tuple[set[int], set[int]]:
        """The token ids token terminals on top take, and those negated ones refuse."""
        wanted, refused = set(), set()
        if state[1] is None:
            for stack in state[0]:
                if stack and self._top(stack)[0] == TOKEN:
                    element = self._top(stack)
                    (refused if element[2] else wanted).add(element[1])
        return wanted, refused

    @staticmethod
    def accepts(state: tuple) -> bool:
        return state[1] is None and () in state[0]

    @staticmethod
    def finished(state: tuple) -> bool:
        return state[1] is None and state[0] == frozenset({()})


def _resolved(grammar: Grammar, token_id_of: Callable[[str], int | None] | None) -> Grammar:
    """``grammar`` with each ``<text>`` token terminal replaced by its token id."""
    if not grammar.uses_tokens:
        return grammar
    alternatives = []
    for alternative in grammar.alternatives:
        elements = []
        for element in alternative:
            if element[0] == TOKEN and isinstance(element[1], str):
                token_id = token_id_of(element[1]) if token_id_of is not None else None
                if token_id is None:
                    raise GrammarError(f"the grammar's token {'!' * element[2]}{element[1]} is not one token of this "
                                       "model's vocabulary", _unknown_token_fix(element[1], element[2]))
                element = (TOKEN, token_id, element[2])
            elements.append(element)
        alternatives.append(tuple(elements))
    return Grammar(tuple(alternatives), grammar.rules, grammar.names, grammar.root)


def _unknown_token_fix(text: str, negated: bool) -> str:
    """How to write the token terminal ``<text>`` (``negated``: ``!<text>``) that names no one token: a string matches
    the text itself, which is no fix for "any token but it"."""
    if negated:
        return "name the token to leave out by its id (!<[1000]>)"
    return f"write the text as a string (\"{text}\") or name the token by its id (<[1000]>)"


class GrammarConstraint:
    """One answer's grammar state (a ``TokenConstraint`` of :func:`~edgesdk.runtime.generate.generate`).

    ``stop_ids`` are the tokens that end generation: they are allowed only where the grammar accepts.
    A token whose text is empty or starts with a NUL byte (a byte-level vocabulary's token for byte 0, SentencePiece's
    ``<0x00>``) is never allowed, whatever the grammar (``.``, ``[^\\n]``, ``<[id]>``, ``!<[id]>``): llama.cpp's grammar
    sampler sets such a token to -inf before it reads the grammar (src/llama-grammar.cpp ``llama_grammar_apply_impl``:
    ``piece.empty() || piece[0] == 0``), so a grammar never writes a NUL into the answer there.
    The sampler asks :meth:`allows` token by token, most likely first; past SCAN_AFTER questions in
    one state the whole allowed set is found by one walk of the vocabulary's byte trie (a state that
    rejects a prefix rejects every token under it)."""

    SCAN_AFTER = 16

    def __init__(self, token_bytes: list[bytes | None], grammar: Grammar, stop_ids: set[int],
                 token_id_of: Callable[[str], int | None] | None = None):
        self.token_bytes = token_bytes
        self.matcher = GrammarMatcher(grammar, token_id_of)
        for alternative in self.matcher.grammar.alternatives:
            for element in alternative:
                if element[0] == TOKEN and not 0 <= element[1] < len(token_bytes):
                    raise GrammarError(f"the grammar's token <[{element[1]}]> is past this model's vocabulary "
                                       f"(ids 0 to {len(token_bytes) - 1})",
                                       "name a token of this model by its id, or write its text as <text>")
        self.stop_ids = set(stop_ids)
        self.state = self.matcher.start()
        self._asked = 0
        self._allowed: set[int] | None = None
        self._refused_tokens: set[int] = set()  # negated token terminals on top: any token but these
        self._ended = False

    def _bytes(self, token_id: int) -> bytes | None:
        return self.token_bytes[token_id] if 0 <= token_id < len(self.token_bytes) else None

    def _has_text(self, token_id: int) -> bool:
        """``token_id`` has a piece llama.cpp's grammar sampler reads: an id of the tokenizer (one past it, a model's
        padding row, has none) whose bytes are not empty and do not start with NUL. A special token (None here) has
        its text as its piece there, so a token terminal still takes it."""
        if not 0 <= token_id < len(self.token_bytes):
            return False
        data = self.token_bytes[token_id]
        return data is None or (len(data) > 0 and data[0] != 0)

    def allows(self, token_id: int) -> bool:
        if token_id in self.stop_ids:
            return self.matcher.accepts(self.state)
        if not self._has_text(token_id):  # llama.cpp's grammar sampler refuses a token with an empty piece or one
            return False  # that starts with NUL before any rule is read, <[id]> and !<[id]> too
        if self._allowed is not None:
            return token_id in self._allowed or self._any_token_but(token_id)
        self._asked += 1
        if self._asked > self.SCAN_AFTER:
            self._allowed = self._allowed_tokens()
            return token_id in self._allowed or self._any_token_but(token_id)
        return self.matcher.step_token(self.state, token_id, self._bytes(token_id)) is not None

    def _any_token_but(self, token_id: int) -> bool:
        refused = self._refused_tokens
        return bool(refused) and (len(refused) > 1 or token_id not in refused) and self._has_text(token_id)

    def _allowed_tokens(self) -> set[int]:
        """Every ordinary token the state takes, by a walk of the vocabulary's byte trie, and the
        tokens the token terminals on top take."""
        allowed = tokens_accepted(self.token_bytes, self.state, self.matcher.step_byte)  # states are non-empty tuples
        if self.matcher.step_byte(self.state, 0) is not None:  # the trie's tokens that start with NUL are not taken
            allowed = {token for token in allowed if self.token_bytes[token][0] != 0}
        wanted, self._refused_tokens = self.matcher.token_tops(self.state)
        allowed.update(token for token in wanted if self._has_text(token))
        return allowed - self.stop_ids

    def advance(self, token_id: int) -> None:
        if token_id in self.stop_ids:
            if not self.matcher.accepts(self.state):
                raise ValueError(f"token {token_id} ends the answer where the grammar does not accept it")
            self._ended = True
            return
        state = self.matcher.step_token(self.state, token_id, self._bytes(token_id)) \
            if self._has_text(token_id) else None
        if state is None:
            raise ValueError(f"token {token_id} does not continue the answer the grammar allows")
        self.state, self._asked, self._allowed, self._refused_tokens = state, 0, None, set()

    @property
    def accepts(self) -> bool:
        """The text so far is a whole answer (an end-of-text token may come now)."""
        return self.matcher.accepts(self.state)

    @property
    def complete(self) -> bool:
        """Nothing more can follow: the grammar has matched and no rule reads on."""
        return self._ended or self.matcher.finished(self.state)
