"""JSON mode: answers constrained to one JSON object, as OpenAI's ``response_format: {"type": "json_object"}``.

A byte-level pushdown automaton follows the JSON grammar (RFC 8259) over the bytes of the tokens generated so far.
Before a token is taken, the sampler asks :meth:`JsonConstraint.allows`, which runs the token's bytes through a copy
of the automaton's state: a token that cannot continue a valid JSON text is never chosen (end-of-text included,
until the object is complete), and the answer ends as soon as the top-level object closes. The answer's first byte
is the object's ``{``, as in llama.cpp's JSON grammar (grammars/json.gbnf, ``root ::= object``, ``object ::= "{" ws
...``: whitespace only after a token), which Ollama's ``format: json`` uses; a JSON schema's answer starts at its
value the same way (json_schema.py). Strings must be valid UTF-8 (RFC 3629: no overlong forms, no UTF-16 surrogates,
nothing past U+10FFFF), and their ``\\u`` escapes write surrogates only as pairs (RFC 8259 section 8.2). Whitespace
runs outside strings are capped, so a model cannot stall in an endless run of spaces while staying valid. Numbers
are llama.cpp's JSON numbers (common/json-schema-to-grammar.cpp, ``number ::= "-"? integral-part ("." decimal-part)?
([eE] [-+]? integral-part)?``, which its ``json_object`` mode writes): at most 16 digits before the point, 16 after
it and 16 in the exponent, which has no leading zero, so a model cannot stall in digits either.

The answer is a complete object unless ``max_tokens`` or the context ends it first (OpenAI's JSON
mode has the same limit; the finish reason then says ``length``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from edgesdk.errors import EdgeSDKError

MAX_WHITESPACE_RUN = 32  # bytes of whitespace in a row outside strings (room for indented pretty-printing)
# digits in each part of a number (integral, fraction, exponent): llama.cpp's integral-part ::= [0] | [1-9] [0-9]{0,15}
# and decimal-part ::= [0-9]{1,16}
MAX_NUMBER_DIGITS = 16

_WHITESPACE = frozenset(b" \t\n\r")
_DIGITS = frozenset(b"0123456789")
_HEX = frozenset(b"0123456789abcdefABCDEF")
_ESCAPES = frozenset(b'"\\/bfnrt')
_LITERALS = {ord("t"): b"rue", ord("f"): b"alse", ord("n"): b"ull"}

# Modes of the automaton. The container stack holds "{" and "[" for the objects and arrays open.
TOP, VALUE, ARRAY_FIRST, KEY_OR_END, KEY, COLON, AFTER_VALUE = "top", "value", "array-first", "key-or-end", "key", \
    "colon", "after-value"
STRING, ESCAPE, UNICODE, LITERAL, NUMBER, DONE = "string", "escape", "unicode", "literal", "number", "done"
LOW_SURROGATE = "low-surrogate"  # after a \uD800-\uDBFF escape: the \u of its low surrogate must follow


@dataclass(frozen=True)
class JsonState:
    """Where the automaton is: ``mode``, the open containers, and the mode's detail (a string's kind,
    its pending UTF-8 continuation bytes and the range the next one must fall in, a literal's remaining
    bytes, a number's part and its digits so far)."""

    mode: str = TOP
    stack: tuple[str, ...] = ()
    detail: object = None
    whitespace: int = 0  # whitespace bytes in a row outside strings
    digits: int = 0  # digits so far in a number's part (its integral part, fraction or exponent)


_CONTINUATION = (0x80, 0xBF)  # a UTF-8 continuation byte
# RFC 3629 section 4: the first continuation byte after these lead bytes is narrower, which refuses
# overlong forms (E0 80..9F, F0 80..8F), UTF-16 surrogates (ED A0..BF) and code points past U+10FFFF (F4 90..BF).
_FIRST_CONTINUATION = {0xE0: (0xA0, 0xBF), 0xED: (0x80, 0x9F), 0xF0: (0x90, 0xBF), 0xF4: (0x80, 0x8F)}


def _in_string(stack: tuple[str, ...], kind: str) -> JsonState:
    """Inside a string (``kind``: "key" or "value"), no UTF-8 character pending."""
    return JsonState(STRING, stack, (kind, 0, *_CONTINUATION))


def _after_value(stack: tuple[str, ...]) -> JsonState:
    return JsonState(DONE if not stack else AFTER_VALUE, stack)


def _start_value(state: JsonState, byte: int) -> JsonState | None:
    """The first byte of a value (``state`` expects one)."""
    stack = state.stack
    if byte == ord("{"):
        return JsonState(KEY_OR_END, stack + ("{",))
    if byte == ord("["):
        return JsonState(ARRAY_FIRST, stack + ("[",))
    if byte == ord('"'):
        return _in_string(stack, "value")
    if byte in _LITERALS:
        return JsonState(LITERAL, stack, _LITERALS[byte])
    if byte == ord("-"):
        return JsonState(NUMBER, stack, "sign")
    if byte == ord("0"):
        return JsonState(NUMBER, stack, "zero", digits=1)
    if byte in _DIGITS:
        return JsonState(NUMBER, stack, "int", digits=1)
    return None


# A number's parts: which bytes continue it, and whether it may end there. An exponent is an integral part,
# as in llama.cpp's number rule: "0" alone or digits with no leading zero.
_NUMBER_NEXT = {
    "sign": ({**{d: "int" for d in _DIGITS}, ord("0"): "zero"}, False),
    "zero": ({ord("."): "point", ord("e"): "exp", ord("E"): "exp"}, True),
    "int": ({**{d: "int" for d in _DIGITS}, ord("."): "point", ord("e"): "exp", ord("E"): "exp"}, True),
    "point": ({d: "frac" for d in _DIGITS}, False),
    "frac": ({**{d: "frac" for d in _DIGITS}, ord("e"): "exp", ord("E"): "exp"}, True),
    "exp": ({**{d: "exp-digits" for d in _DIGITS}, ord("0"): "exp-zero", ord("+"): "exp-sign",
             ord("-"): "exp-sign"}, False),
    "exp-sign": ({**{d: "exp-digits" for d in _DIGITS}, ord("0"): "exp-zero"}, False),
    "exp-digits": ({d: "exp-digits" for d in _DIGITS}, True),
    "exp-zero": ({}, True),
}
_DIGIT_PARTS = frozenset({"zero", "int", "frac", "exp-digits", "exp-zero"})  # a part entered or grown by a digit


def _utf8_continuations(byte: int) -> int | None:
    """How many continuation bytes a lead byte announces (None: not a lead byte, RFC 3629)."""
    if byte < 0x80:
        return 0
    if 0xC2 <= byte <= 0xDF:
        return 1
    if 0xE0 <= byte <= 0xEF:
        return 2
    if 0xF0 <= byte <= 0xF4:
        return 3
    return None


def step(state: JsonState, byte: int, max_digits: int | None = MAX_NUMBER_DIGITS) -> JsonState | None:
    """The state after ``byte``, or None when no JSON text continues that way. ``max_digits`` caps the
    digits of each part of a number (JSON mode's :data:`MAX_NUMBER_DIGITS`; None: no cap, for a caller
    that bounds a number's digits itself, as a JSON Schema integer with a long bound has more)."""
    mode = state.mode
    if mode == STRING:
        kind, pending, low, high = state.detail
        if pending:
            return JsonState(STRING, state.stack, (kind, pending - 1, *_CONTINUATION)) if low <= byte <= high else None
        if byte == ord('"'):
            return JsonState(COLON, state.stack) if kind == "key" else _after_value(state.stack)
        if byte == ord("\\"):
            return JsonState(ESCAPE, state.stack, kind)
        if byte < 0x20:
            return None
        continuations = _utf8_continuations(byte)
        if continuations is None:
            return None
        return JsonState(STRING, state.stack, (kind, continuations, *_FIRST_CONTINUATION.get(byte, _CONTINUATION)))
    if mode == ESCAPE:
        if byte == ord("u"):
            return JsonState(UNICODE, state.stack, (state.detail, 4, 0, False))
        return _in_string(state.stack, state.detail) if byte in _ESCAPES else None
    if mode == LOW_SURROGATE:
        kind, expected = state.detail
        if byte != expected:
            return None
        if byte == ord("\\"):
            return JsonState(LOW_SURROGATE, state.stack, (kind, ord("u")))
        return JsonState(UNICODE, state.stack, (kind, 4, 0, True))
    if mode == UNICODE:
        return _unicode_digit(state, byte)
    if mode == LITERAL:
        rest = state.detail
        if byte != rest[0]:
            return None
        return _after_value(state.stack) if len(rest) == 1 else JsonState(LITERAL, state.stack, rest[1:])
    if mode == NUMBER:
        following, may_end = _NUMBER_NEXT[state.detail]
        if byte in following:  # a digit counts towards its part's cap; another byte starts a part with none yet
            part = following[byte]
            if part not in _DIGIT_PARTS:
                return JsonState(NUMBER, state.stack, part)
            digits = state.digits + 1 if part == state.detail else 1
            return None if max_digits is not None and digits > max_digits else \
                JsonState(NUMBER, state.stack, part, 0, digits)
        return step(_after_value(state.stack), byte, max_digits) if may_end else None  # the byte after the number
    if mode == TOP:  # the answer's first byte opens its object, as llama.cpp's ``root ::= object``: no space before it
        return JsonState(KEY_OR_END, ("{",)) if byte == ord("{") else None
    if byte in _WHITESPACE:  # between tokens of the grammar
        return None if state.whitespace >= MAX_WHITESPACE_RUN else \
            JsonState(mode, state.stack, state.detail, state.whitespace + 1)
    if mode == DONE:
        return None
    if mode == VALUE:
        return _start_value(state, byte)
    if mode == ARRAY_FIRST:
        return _after_value(state.stack[:-1]) if byte == ord("]") else _start_value(state, byte)
    if mode in (KEY_OR_END, KEY):
        if byte == ord('"'):
            return _in_string(state.stack, "key")
        return _after_value(state.stack[:-1]) if byte == ord("}") and mode == KEY_OR_END else None
    if mode == COLON:
        return JsonState(VALUE, state.stack) if byte == ord(":") else None
    # AFTER_VALUE inside a container
    container = state.stack[-1]
    if byte == ord(","):
        return JsonState(KEY if container == "{" else VALUE, state.stack)
    if byte == ord("}" if container == "{" else "]"):
        return _after_value(state.stack[:-1])
    return None


def _unicode_digit(state: JsonState, byte: int) -> JsonState | None:
    """A hex digit of a \\u escape. UTF-16 surrogates come in pairs (a \\uD800-\\uDBFF escape, then a
    \\uDC00-\\uDFFF one): RFC 8259 section 8.2 leaves a lone one's meaning unpredictable, and parsers
    such as Rust's serde_json refuse it. Checked digit by digit, so no prefix leads nowhere."""
    kind, left, value, low = state.detail
    if byte not in _HEX:
        return None
    value = value * 16 + int(chr(byte), 16)
    if left == 4 and low and value != 0xD:
        return None
    if left == 3 and low != (0xDC <= value <= 0xDF):  # a low surrogate where one must (and only there)
        return None
    if left > 1:
        return JsonState(UNICODE, state.stack, (kind, left - 1, value, low))
    if 0xD800 <= value <= 0xDBFF:
        return JsonState(LOW_SURROGATE, state.stack, (kind, ord("\\")))
    return _in_string(state.stack, kind)


def feed(state: JsonState, data: bytes, max_digits: int | None = MAX_NUMBER_DIGITS) -> JsonState | None:
    """The state after all of ``data``, or None at its first byte that no JSON text allows (numbers capped
    at ``max_digits`` digits a part, see :func:`step`)."""
    for byte in data:
        state = step(state, byte, max_digits)
        if state is None:
            return None
    return state


# ---------------------------------------------------------------------------------------- token bytes

def _byte_level_alphabet() -> dict[str, int]:
    """GPT-2's byte-to-unicode table, reversed: the character a byte-level BPE token uses for each byte."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars, extra = {}, 0
    for byte in range(256):
        if byte in printable:
            chars[chr(byte)] = byte
        else:
            chars[chr(256 + extra)] = byte
            extra += 1
    return chars


def token_bytes_table(tokenizer, vocab_size: int) -> list[bytes | None]:
    """Each token id's bytes (None for special tokens, such as end-of-text, and ids past the tokenizer).

    ``tokenizer`` is a ``tokenizers.Tokenizer`` with a byte-level decoder (GPT-2, SmolLM2, Qwen2) or a
    SentencePiece-style one (``▁`` for spaces, ``<0xNN>`` byte fallback: Llama 2, TinyLlama)."""
    spec = json.loads(tokenizer.to_str())
    decoder = spec.get("decoder") or {}
    kinds = {decoder.get("type")} | {part.get("type") for part in decoder.get("decoders", [])}
    special = {token["id"] for token in spec.get("added_tokens", []) if token.get("special")}
    if "ByteLevel" in kinds:
        alphabet = _byte_level_alphabet()

        def to_bytes(piece: str) -> bytes | None:
            try:
                return bytes(alphabet[char] for char in piece)
            except KeyError:  # an added token written as plain text
                return piece.encode("utf-8")
    elif "ByteFallback" in kinds or "Metaspace" in kinds or "Replace" in kinds:
        def to_bytes(piece: str) -> bytes | None:
            if len(piece) == 6 and piece.startswith("<0x") and piece.endswith(">"):
                return bytes([int(piece[3:5], 16)])
            return piece.replace("\u2581", " ").encode("utf-8")
    else:
        # the table serves every constrained answer (JSON mode, a JSON schema or tools, a GBNF grammar), so the
        # message names them all, not only the JSON mode a --grammar or json_schema request never asked for
        raise EdgeSDKError(f"constrained answers (JSON mode, a JSON schema or tools, a GBNF grammar) cannot read this "
                           f"bundle's tokens as bytes (tokenizer decoder {sorted(map(str, kinds))})",
                           "they need a byte-level (GPT-2, SmolLM2, Qwen2) or SentencePiece (Llama 2) tokenizer; leave "
                           "response_format, tools and grammar (--json, --json-schema, --grammar) out for this bundle")
    table: list[bytes | None] = []
    for token_id in range(vocab_size):
        piece = tokenizer.id_to_token(token_id)
        table.append(None if piece is None or token_id in special else to_bytes(piece))
    return table


class JsonConstraint:
    """One answer's automaton over the bytes of the tokens taken so far."""

    def __init__(self, token_bytes: list[bytes | None]):
        self.token_bytes = token_bytes
        self.state = JsonState()

    def _bytes(self, token_id: int) -> bytes | None:
        """The token's bytes; None for a special token and an id outside the table (never a negative index)."""
        return self.token_bytes[token_id] if 0 <= token_id < len(self.token_bytes) else None

    def allows(self, token_id: int) -> bool:
        data = self._bytes(token_id)
        return bool(data) and feed(self.state, data) is not None

    def advance(self, token_id: int) -> None:
        """Take ``token_id``: only a token :meth:`allows` (one with bytes that continue the JSON text)."""
        data = self._bytes(token_id)
        state = feed(self.state, data) if data else None
        if state is None:
            raise ValueError(f"token {token_id} does not continue the JSON answer")
        self.state = state

    @property
    def complete(self) -> bool:
        """The top-level object has closed."""
        return self.state.mode == DONE
