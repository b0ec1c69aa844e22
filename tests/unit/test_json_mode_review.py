"""JSON mode (edgesdk/runtime/json_mode.py, the constrained Sampler in edgesdk/runtime/generate.py):
UTF-8 in strings as RFC 3629 defines it, exact sampling under a constraint, the token byte table of a
tokenizer, and serve's response_format."""

from __future__ import annotations

import pytest

from edgesdk.runtime.json_mode import DONE, JsonState, feed


def _string_value(content: bytes) -> JsonState | None:
    return feed(JsonState(), b'{"a":"' + content + b'"}')


def test_strings_take_exactly_the_utf8_that_python_decodes():
    """RFC 3629 section 4: no overlong forms (C0 80, E0 80 80, F0 80 80 80), no UTF-16 surrogates
    (ED A0 80), nothing past U+10FFFF (F4 90 80 80); every lead byte with every first continuation
    byte, the later ones at both ends of their range."""
    for lead in range(0x80, 0x100):
        for first in range(0x70, 0xD0):
            for rest in (b"", b"\x80", b"\xbf", b"\x80\x80", b"\xbf\xbf"):
                content = bytes([lead, first]) + rest
                try:
                    content.decode("utf-8")
                    valid = True
                except UnicodeDecodeError:
                    valid = False
                state = _string_value(content)
                assert (state is not None and state.mode == DONE) == valid, content


@pytest.mark.parametrize("content", [b"\xe0\x80\x80", b"\xe0\x9f\xbf", b"\xed\xa0\x80", b"\xed\xbf\xbf",
                                     b"\xf0\x80\x80\x80", b"\xf0\x8f\xbf\xbf", b"\xf4\x90\x80\x80"])
def test_overlong_surrogate_and_out_of_range_utf8_is_refused_at_its_first_continuation(content):
    assert feed(JsonState(), b'{"a":"' + content[:2]) is None
    assert feed(JsonState(), b'{"' + content[:2]) is None  # in a key too


@pytest.mark.parametrize("content", ["\u0800", "\ud7ff", "\ue000", "\U00010000", "\U0010ffff", "\u00e9"])
def test_the_edges_of_valid_utf8_are_taken(content):
    assert _string_value(content.encode()).mode == DONE


# ------------------------------------------------------------------------------ sampling under a constraint

def _frequencies(sampler, logits, allowed, draws):
    import numpy as np

    counts = np.zeros(logits.shape[0])
    for _ in range(draws):
        token = sampler(logits, allowed)
        assert allowed(token)
        counts[token] += 1
    return counts / draws


@pytest.mark.parametrize(("temperature", "top_p"), [(1.0, 1.0), (0.7, 0.999)])
def test_sampling_stays_exact_when_most_of_the_mass_is_refused(temperature, top_p):
    """Five accepted tokens under 300 refused ones of more mass (as for the answer's first token,
    where only "{" may come): the draws follow the temperature / top-p distribution restricted to
    the accepted tokens, not the most likely accepted token every time."""
    import numpy as np

    from edgesdk.runtime.generate import Sampler, SamplingConfig

    logits = np.full(305, 1.5, np.float32)
    accepted = [300, 301, 302, 303, 304]
    logits[accepted] = [1.0, 0.5, 0.0, -0.5, -1.0]
    sampler = Sampler(SamplingConfig(temperature=temperature, top_p=top_p, seed=7))
    seen = _frequencies(sampler, logits, lambda token: token in accepted, 1500)
    # llama.cpp's chain: top-p on the logits as they are, then the temperature over what it kept
    plain = np.exp(logits.astype(np.float64))
    plain /= plain.sum()
    order = np.argsort(-plain, kind="stable")
    nucleus = order[: int(np.searchsorted(np.cumsum(plain[order]), top_p)) + 1]
    probs = np.exp(logits.astype(np.float64) / temperature)
    expected = np.zeros_like(probs)
    kept = [token for token in accepted if token in set(nucleus.tolist())]
    assert kept  # the test's nucleus holds accepted tokens
    expected[kept] = probs[kept] / probs[kept].sum()
    assert np.abs(seen - expected).max() < 0.04, (seen[accepted], expected[accepted])


def test_constrained_sampling_is_reproducible_with_a_seed():
    import numpy as np

    from edgesdk.runtime.generate import Sampler, SamplingConfig

    logits = np.random.default_rng(0).normal(size=400).astype(np.float32)
    allowed = lambda token: token % 37 == 0  # noqa: E731

    def draws(seed):
        sampler = Sampler(SamplingConfig(temperature=1.0, top_p=0.9, seed=seed))
        return [sampler(logits, allowed) for _ in range(40)]

    assert draws(5) == draws(5)
    assert len(set(draws(5))) > 1


# ------------------------------------------------------------------------------------ serve's response_format

@pytest.mark.parametrize("parse", ["chat", "text"])
def test_a_json_object_format_with_a_schema_follows_the_schema(parse):
    """llama-server constrains {"type": "json_object", "schema": {...}} to the schema; so does this server
    (edgesdk/runtime/json_schema.py), and one it cannot follow is refused by name, never ignored."""
    from edgesdk.serve.api import ApiError, parse_chat_request, parse_text_request

    body = {"messages": [{"role": "user", "content": "hi"}]} if parse == "chat" else {"prompt": "hi"}
    parser = parse_chat_request if parse == "chat" else parse_text_request
    schema = {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}
    assert parser({**body, "response_format": {"type": "json_object", "schema": schema}}).json_schema is not None
    with pytest.raises(ApiError) as caught:
        parser({**body, "response_format": {"type": "json_object", "schema": {**schema, "minProperties": 1}}})
    assert (caught.value.status, caught.value.param) == (400, "response_format")
    assert "keyword 'minProperties'" in caught.value.message
    for honoured in ({"type": "json_object"}, {"type": "json_object", "schema": None}, {"type": "json_object", "schema": {}}):
        request = parser({**body, "response_format": honoured})
        assert request.json_object
        assert request.json_schema is None  # any object, as JSON mode gives
    assert not parser({**body, "response_format": {"type": "text"}}).json_object


# ------------------------------------------------------------------------------------- the token byte table

def _byte_level_tokenizer(added=(), special=()):
    """A byte-level BPE tokenizer with the 256 byte tokens and a few merges, plus added tokens."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    from edgesdk.runtime.json_mode import _byte_level_alphabet

    char = {byte: piece for piece, byte in _byte_level_alphabet().items()}
    vocab = {char[byte]: byte for byte in range(256)}
    merges = [('"', "}"), ("{", '"')]
    for left, right in merges:
        vocab[left + right] = len(vocab)
    tokenizer = Tokenizer(models.BPE(vocab, merges))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_tokens([AddedToken(content, special=False) for content in added])
    tokenizer.add_special_tokens([AddedToken(content, special=True) for content in special])
    return tokenizer


def test_an_end_of_turn_token_not_marked_special_is_never_taken_inside_the_object(tmp_path):
    """The ids that end generation stop the answer wherever they come; one the tokenizer does not
    mark special (Phi-3's <|end|>) read as text that a JSON string takes, so the answer stopped
    inside the object with finish_reason "stop"."""
    from edgesdk.runtime.json_mode import JsonConstraint
    from edgesdk.runtime.text import ChatTokenizer

    _byte_level_tokenizer(added=["<|end|>"], special=["<|endoftext|>"]).save(str(tmp_path / "tokenizer.json"))
    tokenizer = ChatTokenizer(tmp_path / "tokenizer.json", {"eos_token_ids": [258, 259]}, None)
    assert tokenizer.tokenizer.token_to_id("<|end|>") == 258
    table = tokenizer.token_bytes()
    assert table[258] is None
    assert table[259] is None
    assert table[ord("a")] == b"a"
    assert table[256] == b'"}'
    constraint = JsonConstraint(table)
    for token in b'{"a":"':
        constraint.advance(token)
    assert not constraint.allows(258)
    assert constraint.allows(ord("x"))


# ------------------------------------------------------------------------------------------- \u escapes

@pytest.mark.parametrize(("escapes", "taken"), [
    (b"\\u0041\\u00e9\\uFFFF\\ud7ff\\ue000", True),
    (b"\\ud83d\\ude00", True),  # a pair: U+1F600
    (b"\\uDBFF\\uDFFF", True),
    (b"\\ud83d", False),  # a high surrogate alone
    (b"\\ud83dx", False),
    (b"\\ud83d\\n", False),
    (b"\\ud83d\\u0041", False),
    (b"\\ud83d\\ud83d", False),
    (b"\\ude00", False),  # a low surrogate alone
    (b"a\\uDC00", False),
])
def test_surrogate_escapes_come_in_pairs(escapes, taken):
    """RFC 8259 section 8.2: a lone surrogate's meaning is unpredictable (serde_json refuses it, Python
    makes a string that cannot be encoded); JSON mode writes surrogates only as pairs."""
    import json

    state = _string_value(escapes)
    assert (state is not None and state.mode == DONE) == taken, escapes
    if taken:
        json.loads(b'"' + escapes + b'"').encode("utf-8")


def test_no_prefix_of_an_escape_leads_nowhere():
    """Every state the automaton reaches inside an escape has a byte that continues it (the sampler
    never takes a token after which no token fits)."""
    from edgesdk.runtime.json_mode import step

    frontier, seen = [feed(JsonState(), b'{"a":"\\')], set()
    while frontier:
        state = frontier.pop()
        if state in seen:
            continue
        seen.add(state)
        following = [step(state, byte) for byte in b'\\u"nxdDcC09aAfF']
        assert any(following), state
        frontier.extend(after for after in following if after is not None and after.mode != "string")
    assert len(seen) > 100
