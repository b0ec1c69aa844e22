"""The answer's text (edgesdk/runtime/text.py's StreamDecoder and ChatTokenizer.decode) leaves out the tokens
llama.cpp makes control tokens whatever tokenizer.json marks them, review 58.

llama.cpp's vocab loader makes the FIM tokens and the end-of-generation tokens it finds by their text control tokens
(Qwen2.5-Coder's ``<|fim_middle|>``, Phi-3's ``<|end|>``, marked ``"special": false`` in their tokenizer.json), and
``llama_token_to_piece`` without ``special`` writes nothing for a control token; the stream and ``decode`` skipped
only the tokens marked special, so such a token sampled in an answer printed its text here and nothing there."""

from __future__ import annotations

from pathlib import Path

import pytest

from edgesdk.runtime.text import ChatTokenizer, StreamDecoder, pieces_text

pytest.importorskip("transformers")

CONTROL = ["<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>", "<|end|>"]
TAGS = ["<think>", "</think>", "<tool_call>", "</tool_call>"]  # ordinary added tokens in llama.cpp too


@pytest.fixture(scope="module", params=["byte-level", "gemma", "llama2"])
def kind(request, tmp_path_factory):
    """A tiny tokenizer of each stream path (byte-level BPE, SentencePiece byte fallback as Gemma's and Llama 2's)
    with the FIM tokens, <|end|> and the reasoning and tool-call tags added as ordinary tokens (``"special":
    false``, as Qwen2.5-Coder's and Phi-3's tokenizer.json mark them)."""
    from tokenizers import AddedToken, Tokenizer

    from tests._utils import tiny

    make = {"byte-level": tiny.tiny_tokenizer, "gemma": tiny.tiny_gemma_tokenizer,
            "llama2": tiny.tiny_llama2_tokenizer}[request.param]
    folder: Path = tmp_path_factory.mktemp(request.param)
    make().save_pretrained(folder)
    inner = Tokenizer.from_file(str(folder / "tokenizer.json"))
    inner.add_tokens([AddedToken(text, special=False, normalized=False) for text in CONTROL + TAGS])
    inner.save(str(folder / "tokenizer.json"))
    return request.param, ChatTokenizer(folder / "tokenizer.json", {}, None)


def _word(name: str, tokenizer: ChatTokenizer) -> int:
    return tokenizer.token_id("Ġthe" if name == "byte-level" else "\u2581the")


def _streamed(tokenizer: ChatTokenizer, ids: list[int]) -> str:
    stream = StreamDecoder(tokenizer)
    return "".join(stream.push(token) for token in ids) + stream.flush()


def test_a_control_token_marked_not_special_prints_nothing(kind):
    name, tokenizer = kind
    the = _word(name, tokenizer)
    for text in CONTROL:
        token = tokenizer.token_id(text)
        assert token in tokenizer.control_ids()
        ids = [the, token, the]
        assert _streamed(tokenizer, ids) == " the the"
        assert tokenizer.decode(ids).strip() == "the the"  # SentencePiece's decoder drops the leading space


def test_the_stream_and_decode_give_the_same_text(kind):
    name, tokenizer = kind
    the = _word(name, tokenizer)
    ids = [the, tokenizer.token_id("<|fim_middle|>"), the, tokenizer.token_id("<think>"), the,
           tokenizer.token_id("<|fim_suffix|>")]
    assert _streamed(tokenizer, ids).lstrip() == tokenizer.decode(ids).lstrip() == "the the<think> the"


def test_reasoning_and_tool_call_tags_keep_their_text(kind):
    """<think> and <tool_call> are no control tokens in llama.cpp: the reasoning and tool-call parsers see them."""
    name, tokenizer = kind
    the = _word(name, tokenizer)
    for text in TAGS:
        token = tokenizer.token_id(text)
        assert token not in tokenizer.control_ids()
        assert text in _streamed(tokenizer, [the, token, the])
        assert text in tokenizer.decode([the, token, the])


def test_detokenize_still_writes_control_tokens(kind):
    """llama-server's ``POST /detokenize`` writes special tokens (``tokens_to_str`` with ``special``)."""
    name, tokenizer = kind
    the = _word(name, tokenizer)
    assert "<|fim_middle|>" in pieces_text(tokenizer, [the, tokenizer.token_id("<|fim_middle|>"), the])


def test_the_python_api_detokenize_leaves_control_tokens_out_unless_special(kind):
    """``Model.detokenize(special=False)`` (edgesdk/api.py ``_token_text``, llama-cpp-python's ``detokenize``) gives
    a control token marked not special no text, as ``llama_token_to_piece`` without ``special``; with ``special``
    its text."""
    from edgesdk.api import _token_text

    name, tokenizer = kind
    the = _word(name, tokenizer)
    token = tokenizer.token_id("<|fim_middle|>")
    plain = _token_text(tokenizer, (the, token, the), False, -1)
    assert plain.strip() == b"the the"
    assert b"<|fim_middle|>" in _token_text(tokenizer, (the, token, the), True, -1)
