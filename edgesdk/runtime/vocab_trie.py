"""A byte trie of a vocabulary: constraints (JSON schema, GBNF grammars) walk it to find every token
a state accepts at once, leaving a whole subtree behind at its prefix's first refused byte."""

from __future__ import annotations

from collections.abc import Callable

_TRIES: dict[int, tuple[list, dict]] = {}  # id(token table) -> (the table, kept alive so the id stays its own; trie)


def vocabulary_trie(token_bytes: list[bytes | None]) -> dict:
    """Nested dicts byte -> child; the key None lists the token ids whose bytes end at that node."""
    cached = _TRIES.get(id(token_bytes))
    if cached is not None and cached[0] is token_bytes:
        return cached[1]
    root: dict = {}
    for token_id, data in enumerate(token_bytes):
        if not data:
            continue
        node = root
        for byte in data:
            node = node.setdefault(byte, {})
        node.setdefault(None, []).append(token_id)
    if len(_TRIES) >= 4:  # a server holds one tokenizer; tests hold a few
        _TRIES.pop(next(iter(_TRIES)))
    _TRIES[id(token_bytes)] = (token_bytes, root)
    return root


def tokens_accepted(token_bytes: list[bytes | None], state, step: Callable[[object, int], object]) -> set[int]:
    """Every token whose bytes ``step`` takes from ``state`` one by one; ``step(state, byte)`` returns
    the next state, or a false value (None, an empty list) where the byte is refused."""
    accepted: set[int] = set()
    pending = [(vocabulary_trie(token_bytes), state)]
    while pending:
        node, state = pending.pop()
        for byte, child in node.items():
            if byte is None:
                continue
            after = step(state, byte)
            if after:
                accepted.update(child.get(None, ()))
                pending.append((child, after))
    return accepted
