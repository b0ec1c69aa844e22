"""Streaming a byte-level BPE tokenizer's text (GPT-2 style: SmolLM2, Qwen, Llama 3) from each token's bytes
(edgesdk/runtime/text.py, StreamDecoder).

llama-server holds back only a multi-byte character cut off at the end of the text (``validate_utf8``); a byte that
can begin no character goes out at once as U+FFFD. The stream held back every window whose text ended in U+FFFD, so
a run of stray bytes (tokens for 0x80 or 0xFF) showed nothing until a valid character came and was decoded again
whole at every token (quadratic), and a real U+FFFD in the answer waited for the next token."""

from __future__ import annotations

import random

import pytest

from edgesdk.runtime.text import ChatTokenizer, StreamDecoder

pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def byte_level(tmp_path_factory):
    from tests._utils import tiny

    folder = tmp_path_factory.mktemp("byte-level")
    tiny.tiny_tokenizer().save_pretrained(folder)
    return ChatTokenizer(folder / "tokenizer.json", {}, None)


def _bytes(tokenizer: ChatTokenizer, data: bytes) -> list[int]:
    """The byte-level alphabet's one-byte tokens for ``data``."""
    from edgesdk.runtime.json_mode import _byte_level_alphabet

    char_of = {byte: char for char, byte in _byte_level_alphabet().items()}
    ids = [tokenizer.token_id(char_of[byte]) for byte in data]
    assert None not in ids
    return ids


def _stream(tokenizer: ChatTokenizer, ids: list[int]) -> list[str]:
    stream = StreamDecoder(tokenizer)
    return [stream.push(token) for token in ids] + [stream.flush()]


def test_stray_bytes_stream_at_once(byte_level):
    assert _stream(byte_level, _bytes(byte_level, b"\x80\xff\x80")) == ["\ufffd", "\ufffd", "\ufffd", ""]


def test_a_long_run_of_stray_bytes_keeps_the_window_short(byte_level):
    """Each token decodes the window since the last text handed out: it stays a token or two long."""
    stream = StreamDecoder(byte_level)
    pieces = [stream.push(token) for token in _bytes(byte_level, b"\x80" * 300)]
    assert pieces == ["\ufffd"] * 300
    assert len(stream.ids) - stream._prefix <= 2


def test_a_character_still_coming_is_held_back_after_a_stray_byte(byte_level):
    assert _stream(byte_level, _bytes(byte_level, b"\xff" + "中".encode())) == ["\ufffd", "", "", "中", ""]
    cut = _stream(byte_level, _bytes(byte_level, "中".encode()[:2]))  # cut by the token limit: U+FFFD at the end
    assert cut == ["", "", "\ufffd"]


def test_a_real_replacement_character_is_not_held_back(byte_level):
    ids = _bytes(byte_level, "a\ufffd".encode())
    assert _stream(byte_level, ids) == ["a", "", "", "\ufffd", ""]


def test_special_tokens_stay_out_of_the_text(byte_level):
    end = byte_level.token_id("<|im_end|>")
    ids = [*_bytes(byte_level, "東".encode()[:1]), end, *_bytes(byte_level, "東".encode()[1:]), end]
    pieces = _stream(byte_level, ids)
    assert "".join(pieces) == "東"
    assert pieces[3] == "東"


def test_valid_text_streams_as_the_tokenizer_decodes_it(byte_level):
    """Valid text: each piece whole, and the pieces joined are the tokenizer's one-shot decode."""
    rng = random.Random(7)
    alphabet = [*"ab x.,\n", "é", "中", "🙂", "👍🏽", "\u0301"]
    specials = [byte_level.token_id(text) for text in ("<|endoftext|>", "<|im_start|>", "<|im_end|>")]
    for _ in range(200):
        ids = byte_level.encode("".join(rng.choice(alphabet) for _ in range(rng.randint(1, 30))),
                                add_special_tokens=False)
        for _ in range(rng.randint(0, 2)):
            ids.insert(rng.randint(0, len(ids)), rng.choice(specials))
        pieces = _stream(byte_level, ids)
        assert "".join(pieces) == byte_level.decode(ids)
        assert not any("\ufffd" in piece for piece in pieces)


def test_random_tokens_join_to_the_one_shot_decode(byte_level):
    rng = random.Random(3)
    size = byte_level.tokenizer.get_vocab_size(with_added_tokens=True)
    for _ in range(200):
        ids = [rng.randrange(size) for _ in range(rng.randint(1, 25))]
        assert "".join(_stream(byte_level, ids)) == byte_level.decode(ids)
