"""Streaming detokenization (edgesdk/runtime/text.py's StreamDecoder) with real tokenizers of the three kinds the
bundles carry: byte-level BPE (SmolLM2's), SentencePiece with Llama 2's decoder (a Strip of the leading space) and
Gemma's. An answer's streamed text continues its prompt's text as llama.cpp's token pieces do."""

from __future__ import annotations

import pytest

from edgesdk.runtime.text import ChatTokenizer, StreamDecoder

pytest.importorskip("transformers")

TEXTS = ["The tower was built for the fair", "naïve café 東京 🙂 done", "🙂🙂 東京東京 end", "x\n\ny  two  spaces",
         "Ωmega ∑ 𝄞 clef and more"]


@pytest.fixture
def tokenizer(kind_tokenizer):
    return kind_tokenizer


def _stream(tokenizer: ChatTokenizer, ids: list[int]) -> list[str]:
    stream = StreamDecoder(tokenizer)
    return [stream.push(token) for token in ids] + [stream.flush()]


def test_an_answer_s_text_continues_its_prompt_s_at_every_split(tokenizer):
    """Llama 2's decoder strips the leading space of the text it decodes, and the answer was decoded on its own: after
    the prompt "The" the answer "▁tower▁was" streamed as "tower was", so prompt and answer read "Thetower was"
    (llama.cpp's pieces give " tower was"). Every split of a text at a character boundary now streams the rest of it,
    each piece a whole run of characters."""
    for text in TEXTS:
        ids = tokenizer.encode(text, add_special_tokens=False)
        whole = tokenizer.decode(ids)
        for split in range(1, len(ids)):
            prompt = tokenizer.decode(ids[:split])
            if prompt.endswith("\ufffd"):  # a prompt ends at a character boundary
                continue
            pieces = _stream(tokenizer, ids[split:])
            assert prompt + "".join(pieces) == whole, (text, split)
            assert not any("\ufffd" in piece for piece in pieces), (text, split, pieces)


def test_the_first_token_s_space_is_streamed(tokenizer):
    ids = tokenizer.encode("The tower", add_special_tokens=False)
    rest = ids[next(at for at in range(1, len(ids)) if tokenizer.decode(ids[:at]) == "The"):]
    assert "".join(_stream(tokenizer, rest)) == " tower"
