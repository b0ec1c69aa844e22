"""A second reading of the late serve and runtime changes.

Streaming a SentencePiece byte-fallback tokenizer's bytes (edgesdk/runtime/text.py, StreamDecoder): a byte that can
begin no character goes out as U+FFFD at once, as llama-server's ``validate_utf8`` holds back only a multi-byte
character cut off at the end of the text; held back, a run of them was decoded again whole at every token."""

from __future__ import annotations

import pytest

from edgesdk.runtime.text import ChatTokenizer, StreamDecoder

pytest.importorskip("transformers")


@pytest.fixture(scope="module", params=["gemma", "llama2"])
def byte_fallback(request, tmp_path_factory):
    from tests._utils import tiny

    make = {"gemma": tiny.tiny_gemma_tokenizer, "llama2": tiny.tiny_llama2_tokenizer}[request.param]
    folder = tmp_path_factory.mktemp(request.param)
    make().save_pretrained(folder)
    return ChatTokenizer(folder / "tokenizer.json", {}, None)


def _bytes(tokenizer: ChatTokenizer, data: bytes) -> list[int]:
    ids = [tokenizer.token_id(f"<0x{byte:02X}>") for byte in data]
    assert None not in ids
    return ids


def test_stray_bytes_stream_at_once(byte_fallback):
    stream = StreamDecoder(byte_fallback)
    pieces = [stream.push(token) for token in _bytes(byte_fallback, b"\x80\xff\x80")]
    assert pieces == ["\ufffd", "\ufffd", "\ufffd"]
    assert stream.flush() == ""


def test_a_long_run_of_stray_bytes_keeps_the_window_short(byte_fallback):
    """Each token decodes the window since the last text handed out: it stays a token or two long."""
    stream = StreamDecoder(byte_fallback)
    pieces = [stream.push(token) for token in _bytes(byte_fallback, b"\x80" * 200)]
    assert "".join(pieces) == "\ufffd" * 200
    assert len(stream.ids) - stream._prefix <= 2


def test_a_character_still_coming_is_held_back_after_a_stray_byte(byte_fallback):
    stream = StreamDecoder(byte_fallback)
    pieces = [stream.push(token) for token in _bytes(byte_fallback, b"\xff" + "中".encode())]
    assert pieces == ["\ufffd", "", "", "中"]
    cut = StreamDecoder(byte_fallback)  # a character cut by the token limit: U+FFFD once the answer ends
    assert [cut.push(token) for token in _bytes(byte_fallback, "中".encode()[:2])] == ["", ""]
    assert cut.flush() == "\ufffd"
