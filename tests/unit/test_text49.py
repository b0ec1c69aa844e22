"""Streaming detokenization of byte-fallback tokens (edgesdk/runtime/text.py's StreamDecoder) as llama.cpp hands out
token pieces: each token's bytes joined, and only the bytes that are not valid UTF-8 replaced by U+FFFD.

The tokenizers library's ByteFallback decoder (Llama 2's, TinyLlama's, Mistral's, Gemma's tokenizer.json) reads a
run of ``<0xNN>`` tokens as one and turns every byte of the run into U+FFFD where any of them is invalid: a stray
byte the model sampled took the byte-fallback characters after it with it (a Chinese answer from Llama 2, whose
characters are mostly byte tokens, became replacement characters, held back until the run ended), and an answer
cut mid-character by its token limit had the whole character before the cut replaced a second time."""

from __future__ import annotations

import pytest

from edgesdk.runtime.text import ChatTokenizer, StreamDecoder

pytest.importorskip("transformers")


@pytest.fixture(scope="module", params=["byte-level", "gemma", "llama2"])
def kind(request, tmp_path_factory):
    from tests._utils import tiny

    make = {"byte-level": tiny.tiny_tokenizer, "gemma": tiny.tiny_gemma_tokenizer,
            "llama2": tiny.tiny_llama2_tokenizer}[request.param]
    folder = tmp_path_factory.mktemp(request.param)
    make().save_pretrained(folder)
    return request.param, ChatTokenizer(folder / "tokenizer.json", {}, None)


def _byte_ids(kind: str, tokenizer: ChatTokenizer, data: bytes) -> list[int]:
    """The tokens of single bytes: ``<0xNN>`` (SentencePiece byte fallback) or the byte-level alphabet's."""
    if kind == "byte-level":
        from edgesdk.runtime.json_mode import _byte_level_alphabet

        char_of = {byte: char for char, byte in _byte_level_alphabet().items()}
        return [tokenizer.token_id(char_of[byte]) for byte in data]
    return [tokenizer.token_id(f"<0x{byte:02X}>") for byte in data]


def _word(kind: str, tokenizer: ChatTokenizer) -> int:
    return tokenizer.token_id("Ġthe" if kind == "byte-level" else "\u2581the")


def _stream(tokenizer: ChatTokenizer, ids: list[int]) -> list[str]:
    stream = StreamDecoder(tokenizer)
    return [stream.push(token) for token in ids] + [stream.flush()]


def test_a_stray_byte_takes_no_valid_character_after_it(kind):
    name, tokenizer = kind
    the = _word(name, tokenizer)
    ids = [the, *_byte_ids(name, tokenizer, b"\xd1" + "東京".encode()), the]
    assert None not in ids
    pieces = _stream(tokenizer, ids)
    assert "".join(pieces) == " the\ufffd東京 the"
    assert "京" in pieces  # each character as soon as its last byte came, not held back to the run's end


def test_an_answer_cut_mid_character_keeps_the_characters_before_it(kind):
    name, tokenizer = kind
    ids = _byte_ids(name, tokenizer, "東京".encode()[:-1])  # the token limit cut 京 after two of its bytes
    pieces = _stream(tokenizer, ids)
    assert pieces[2] == "東"
    assert "".join(pieces) == "東\ufffd"


def test_valid_byte_runs_stream_as_before(kind):
    name, tokenizer = kind
    text = "naïve 東京 🙂 x"
    ids = [_word(name, tokenizer), *_byte_ids(name, tokenizer, text.encode())]
    pieces = _stream(tokenizer, ids)
    assert "".join(pieces) == " the" + text
    assert not any("\ufffd" in piece for piece in pieces)


def test_detokenize_takes_no_valid_character_with_a_stray_byte(kind):
    """llama-server's ``POST /detokenize`` joins the pieces' bytes (``tokens_to_str``); Ollama's ``context`` is read
    back through the same text (edgesdk.serve.ollama), so a stray byte there lost the characters after it too."""
    from edgesdk.runtime.text import pieces_text

    name, tokenizer = kind
    ids = [_word(name, tokenizer), *_byte_ids(name, tokenizer, b"\xd1" + "東京".encode())]
    assert pieces_text(tokenizer, ids) == " the\ufffd東京"
